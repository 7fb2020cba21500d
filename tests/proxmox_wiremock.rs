//! Exact-request tests of the Proxmox client against wiremock: paths, query strings, form bodies, auth
//! headers, CSRF, re-login, retries and error mapping.

use std::time::Duration;

use omni_infra_provider_proxmox::config::ProviderConfig;
use omni_infra_provider_proxmox::proxmox::client::{Params, UploadContent};
use omni_infra_provider_proxmox::proxmox::types::{
    NodeName, NodeResource, NodeStorage, Upid, VmId,
};
use omni_infra_provider_proxmox::proxmox::{ProxmoxClient, ProxmoxError, RetryPolicy};
use serde_json::json;
use wiremock::matchers::{
    body_string, header, header_exists, method, path, query_param, query_param_is_missing,
};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

const UPID: &str = "UPID:pve1:0000ABCD:00012345:65A1B2C3:qmclone:9000:omni@pve!provider:";

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        attempts: 3,
        initial_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    }
}

fn token_client(server: &MockServer) -> ProxmoxClient {
    let yaml = format!(
        "proxmox:\n  url: {}\n  tokenID: omni@pve!provider\n  tokenSecret: s3cr3t-token\n  insecureHTTP: true\n",
        server.uri()
    );
    let c = ProviderConfig::parse(&yaml).unwrap();
    ProxmoxClient::with_retry(&c.proxmox, fast_retry()).unwrap()
}

fn password_client(server: &MockServer) -> ProxmoxClient {
    let yaml = format!(
        "proxmox:\n  url: {}/api2/json\n  username: root\n  password: pw-123\n  realm: pam\n  insecureHTTP: true\n",
        server.uri()
    );
    let c = ProviderConfig::parse(&yaml).unwrap();
    ProxmoxClient::with_retry(&c.proxmox, fast_retry()).unwrap()
}

fn data(v: serde_json::Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({ "data": v }))
}

fn pve1() -> NodeName {
    NodeName::new("pve1").unwrap()
}

async fn mount_login(server: &MockServer, expected_logins: u64) {
    Mock::given(method("POST"))
        .and(path("/api2/json/access/ticket"))
        .and(body_string("username=root%40pam&password=pw-123"))
        .respond_with(data(json!({"ticket": "PVE:root@pam:TICKET", "CSRFPreventionToken": "CSRF-1", "username": "root@pam"})))
        .expect(expected_logins)
        .mount(server)
        .await;
}

#[tokio::test]
async fn token_auth_header_and_lenient_numbers() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api2/json/nodes"))
        .and(header("Authorization", "PVEAPIToken=omni@pve!provider=s3cr3t-token"))
        .respond_with(data(json!([
            {"node": "pve1", "status": "online", "mem": "2147483648", "maxmem": 8589934592u64, "cpu": "0.5", "maxcpu": 4},
            {"node": "pve2", "status": "offline"}
        ])))
        .expect(1)
        .mount(&server)
        .await;
    let nodes: Vec<NodeResource> = token_client(&server)
        .get(&["nodes"], Params::new())
        .await
        .unwrap();
    assert_eq!(nodes[0].mem, Some(2_147_483_648));
    assert_eq!(nodes[0].cpu, Some(0.5));
    assert_eq!(nodes[1].maxmem, None);
}

#[tokio::test]
async fn ticket_cookie_on_reads_and_csrf_on_writes() {
    let server = MockServer::start().await;
    mount_login(&server, 1).await;
    Mock::given(method("GET"))
        .and(path("/api2/json/nodes/pve1/storage"))
        .and(query_param("content", "images"))
        .and(query_param("enabled", "1"))
        .and(header("Cookie", "PVEAuthCookie=PVE:root@pam:TICKET"))
        .respond_with(data(json!([{"storage": "local-lvm", "type": "lvmthin", "content": "images,rootdir", "active": 1, "avail": "1000"}])))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/api2/json/nodes/pve1/qemu/105/config"))
        .and(header("Cookie", "PVEAuthCookie=PVE:root@pam:TICKET"))
        .and(header("CSRFPreventionToken", "CSRF-1"))
        .and(body_string("cores=4&memory=4096"))
        .respond_with(data(json!(null)))
        .expect(1)
        .mount(&server)
        .await;
    let pve = password_client(&server);
    let filter = Params::new().with("content", "images").with("enabled", 1);
    let storages: Vec<NodeStorage> = pve
        .get(&["nodes", "pve1", "storage"], filter)
        .await
        .unwrap();
    assert_eq!(storages[0].avail, Some(1000));
    assert!(storages[0].holds("images"));
    pve.vm(&pve1(), VmId::new(105).unwrap())
        .update_config(vec![
            ("cores".into(), "4".into()),
            ("memory".into(), "4096".into()),
        ])
        .await
        .unwrap();
}

#[tokio::test]
async fn relogin_once_after_401() {
    let server = MockServer::start().await;
    mount_login(&server, 2).await;
    Mock::given(method("GET"))
        .and(path("/api2/json/version"))
        .respond_with(ResponseTemplate::new(401).set_body_json(
            json!({"data": null, "message": "permission denied - invalid PVE ticket"}),
        ))
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api2/json/version"))
        .respond_with(data(json!({"version": "9.0.10", "release": "9.0"})))
        .expect(1)
        .mount(&server)
        .await;
    let v = password_client(&server).version().await.unwrap();
    assert_eq!(v.version, "9.0.10");
}

#[tokio::test]
async fn a_second_401_is_an_error_not_a_loop() {
    let server = MockServer::start().await;
    mount_login(&server, 2).await;
    Mock::given(method("GET"))
        .and(path("/api2/json/version"))
        .respond_with(ResponseTemplate::new(401))
        .expect(2)
        .mount(&server)
        .await;
    let err = password_client(&server).version().await.unwrap_err();
    assert!(matches!(err, ProxmoxError::Unauthorized { .. }), "{err:?}");
    assert!(!err.to_string().contains("pw-123"));
}

#[tokio::test]
async fn clone_create_delete_send_exact_requests() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api2/json/nodes/pve1/qemu/9000/clone"))
        .and(body_string(
            "newid=105&name=req-abc&target=pve2&full=1&storage=shared-nfs&pool=omni",
        ))
        .respond_with(data(json!(UPID)))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api2/json/nodes/pve2/qemu"))
        .and(body_string(
            "vmid=106&name=req-def&net0=virtio%2Cbridge%3Dvmbr0%2Ctag%3D10",
        ))
        .respond_with(data(json!(UPID)))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .and(path("/api2/json/nodes/pve2/qemu/106"))
        .and(query_param("purge", "1"))
        .and(query_param("destroy-unreferenced-disks", "1"))
        .respond_with(data(json!(UPID)))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .and(path(
            "/api2/json/nodes/pve2/storage/local/content/local:iso%2Fomni-seed-req-def.iso",
        ))
        .respond_with(data(json!(null)))
        .expect(1)
        .mount(&server)
        .await;
    let pve = token_client(&server);
    let pve2 = NodeName::new("pve2").unwrap();
    let upid = pve
        .vm(&pve1(), VmId::new(9000).unwrap())
        .clone_with(
            Params::new()
                .with("newid", 105)
                .with("name", "req-abc")
                .with("target", &pve2)
                .with("full", 1)
                .with("storage", "shared-nfs")
                .with("pool", "omni")
                .0,
        )
        .await
        .unwrap();
    assert_eq!(upid, Upid::parse(UPID).unwrap());
    pve.vm(&pve2, VmId::new(106).unwrap())
        .create(vec![
            ("name".into(), "req-def".into()),
            ("net0".into(), "virtio,bridge=vmbr0,tag=10".into()),
        ])
        .await
        .unwrap();
    pve.vm(&pve2, VmId::new(106).unwrap())
        .delete(true)
        .await
        .unwrap();
    assert_eq!(
        pve.delete_volume(&pve2, "local", "local:iso/omni-seed-req-def.iso")
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn reads_retry_503_then_succeed() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api2/json/cluster/nextid"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api2/json/cluster/nextid"))
        .respond_with(data(json!("107")))
        .expect(1)
        .mount(&server)
        .await;
    assert_eq!(token_client(&server).next_vmid().await.unwrap().get(), 107);
}

#[tokio::test]
async fn no_retry_on_400_nor_of_a_post_that_may_have_taken_effect() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api2/json/nodes/pve1/qemu/105/config"))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({"data": null, "message": "Parameter verification failed.\n", "errors": {"vmid": "invalid format"}})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api2/json/nodes/pve1/qemu/105/status/start"))
        .respond_with(ResponseTemplate::new(503))
        .expect(1)
        .mount(&server)
        .await;
    let pve = token_client(&server);
    let err = pve
        .vm(&pve1(), VmId::new(105).unwrap())
        .config()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("vmid: invalid format"), "{err}");
    let err = pve
        .vm(&pve1(), VmId::new(105).unwrap())
        .start()
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
}

#[tokio::test]
async fn error_kinds() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api2/json/nodes/pve1/qemu/999/status/current"))
        .respond_with(ResponseTemplate::new(500).set_body_json(json!({"data": null, "message": "Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist\n"})))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api2/json/nodes/pve1/qemu/998/status/current"))
        .respond_with(ResponseTemplate::new(403).set_body_json(
            json!({"data": null, "message": "Permission check failed (/vms/998, VM.Audit)\n"}),
        ))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api2/json/nodes/pve1/qemu"))
        .respond_with(ResponseTemplate::new(500).set_body_json(
            json!({"data": null, "message": "VM 105 already exists on node 'pve2'\n"}),
        ))
        .mount(&server)
        .await;
    let pve = token_client(&server);
    let status = |vmid| ["nodes", "pve1", "qemu", vmid, "status", "current"];
    let e = pve
        .get::<serde_json::Value>(&status("999"), Params::new())
        .await
        .unwrap_err();
    assert!(e.is_not_found(), "{e:?}");
    let e = pve
        .get::<serde_json::Value>(&status("998"), Params::new())
        .await
        .unwrap_err();
    assert!(matches!(e, ProxmoxError::PermissionDenied { .. }), "{e:?}");
    assert!(e.to_string().contains("VM.Audit"));
    let e = pve
        .vm(&pve1(), VmId::new(105).unwrap())
        .create(vec![])
        .await
        .unwrap_err();
    assert!(e.is_vmid_taken(), "{e:?}");
}

#[tokio::test]
async fn task_wait_polls_until_done_and_tolerates_an_invisible_task() {
    let server = MockServer::start().await;
    let status_path = format!("/api2/json/nodes/pve1/tasks/{UPID}/status");
    Mock::given(method("GET"))
        .and(path(status_path.clone()))
        .respond_with(ResponseTemplate::new(500).set_body_json(
            json!({"data": null, "message": format!("unable to parse worker upid '{UPID}'\n")}),
        ))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(status_path.clone()))
        .respond_with(data(json!({"status": "running", "type": "qmclone"})))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(status_path))
        .respond_with(data(json!({"status": "stopped", "exitstatus": "OK"})))
        .mount(&server)
        .await;
    let pve = token_client(&server);
    pve.wait_for_task(&Upid::parse(UPID).unwrap(), Duration::from_secs(10))
        .await
        .unwrap();
    let polls = server.received_requests().await.unwrap().len();
    assert_eq!(polls, 4, "invisible, running, running, stopped");
}

#[tokio::test]
async fn failed_task_carries_its_log_tail_and_a_slow_one_times_out() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(format!("/api2/json/nodes/pve1/tasks/{UPID}/status")))
        .respond_with(data(
            json!({"status": "stopped", "exitstatus": "clone failed: no space"}),
        ))
        .mount(&server)
        .await;
    let lines: Vec<_> = (1..=12)
        .map(|n| json!({"n": n, "t": format!("line {n}")}))
        .collect();
    Mock::given(method("GET"))
        .and(path(format!("/api2/json/nodes/pve1/tasks/{UPID}/log")))
        .respond_with(data(json!(lines)))
        .mount(&server)
        .await;
    let slow = "UPID:pve1:0000ABCD:00012345:65A1B2C3:qmstart:105:root@pam:";
    Mock::given(method("GET"))
        .and(path(format!("/api2/json/nodes/pve1/tasks/{slow}/status")))
        .respond_with(data(json!({"status": "running"})))
        .mount(&server)
        .await;
    let pve = token_client(&server);
    let err = pve
        .wait_for_task(&Upid::parse(UPID).unwrap(), Duration::from_secs(5))
        .await
        .unwrap_err();
    match &err {
        ProxmoxError::TaskFailed {
            log_tail,
            exit_status,
            ..
        } => {
            assert_eq!(exit_status, "clone failed: no space");
            assert_eq!(log_tail.first().map(String::as_str), Some("line 5"));
            assert_eq!(log_tail.last().map(String::as_str), Some("line 12"));
        }
        other => panic!("{other:?}"),
    }
    let err = pve
        .wait_for_task(&Upid::parse(slow).unwrap(), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, ProxmoxError::TaskTimeout { .. }), "{err:?}");
}

#[tokio::test]
async fn upload_is_multipart_with_csrf() {
    let server = MockServer::start().await;
    mount_login(&server, 1).await;
    Mock::given(method("POST"))
        .and(path("/api2/json/nodes/pve1/storage/local/upload"))
        .and(header("CSRFPreventionToken", "CSRF-1"))
        .and(header_exists("content-length"))
        .and(|req: &Request| {
            let ct = req
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let body = String::from_utf8_lossy(&req.body);
            ct.starts_with("multipart/form-data")
                && body.contains("name=\"content\"\r\n\r\niso")
                && body.contains("filename=\"seed.iso\"")
                && body.contains("ISO-BYTES")
        })
        .respond_with(data(json!(UPID)))
        .expect(1)
        .mount(&server)
        .await;
    password_client(&server)
        .upload_file(
            &pve1(),
            "local",
            "iso",
            "seed.iso",
            UploadContent::Bytes(b"ISO-BYTES".to_vec()),
        )
        .await
        .unwrap();
}

// pve-manager PVE/API2/Tasks.pm, read_task_status: a task whose status file is not written yet is a
// parameter error on `upid` ("no such task"): 400 "Parameter verification failed." with the reason only
// in `errors.upid`.
#[tokio::test]
async fn a_task_not_yet_visible_is_a_400_with_the_reason_in_errors_upid() {
    let server = MockServer::start().await;
    let status_path = format!("/api2/json/nodes/pve1/tasks/{UPID}/status");
    Mock::given(method("GET"))
        .and(path(status_path.clone()))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({
            "data": null,
            "message": "Parameter verification failed.\n",
            "errors": {"upid": "no such task\n"}
        })))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(status_path))
        .respond_with(data(json!({"status": "stopped", "exitstatus": "OK"})))
        .mount(&server)
        .await;
    token_client(&server)
        .wait_for_task(&Upid::parse(UPID).unwrap(), Duration::from_secs(10))
        .await
        .unwrap();
}

// pve-common src/PVE/Tools.pm, lock_file_full/run_with_timeout: another worker holding the guest's lock
// past the wait ends the call with 500 "can't lock file '…' - got timeout" before anything changed.
// Sending it again is safe even for a create; the step must not fail for it.
#[tokio::test]
async fn a_lock_timeout_is_retried_even_for_a_create() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api2/json/nodes/pve1/qemu"))
        .respond_with(ResponseTemplate::new(500).set_body_json(json!({
            "data": null,
            "message": "can't lock file '/var/lock/qemu-server/lock-105.conf' - got timeout\n"
        })))
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api2/json/nodes/pve1/qemu"))
        .respond_with(data(json!(UPID)))
        .expect(1)
        .mount(&server)
        .await;
    let upid = token_client(&server)
        .vm(&pve1(), VmId::new(105).unwrap())
        .create(vec![])
        .await
        .unwrap();
    assert_eq!(upid.as_str(), UPID);
}

// PVE 8 before pve-http-server's fix #6503 answered errors with `{"data":null}` and the text only in the
// status line. The body is then no message: the error must carry the reason phrase, never the body.
#[tokio::test]
async fn a_json_body_without_message_is_not_the_error_text() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api2/json/pools"))
        .respond_with(ResponseTemplate::new(500).set_body_json(json!({"data": null})))
        .mount(&server)
        .await;
    let e = token_client(&server)
        .ensure_pool("set", "c")
        .await
        .unwrap_err();
    assert!(!e.to_string().contains("data"), "{e}");
    assert!(e.to_string().contains("Internal Server Error"), "{e}");
}

// pve-access-control src/PVE/API2/AccessControl.pm, create_ticket: a user with a second factor gets a
// half ticket and `NeedTFA: 1`; it is good for the TFA challenge only. Say so instead of failing later.
#[tokio::test]
async fn a_tfa_user_is_told_to_use_a_token() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api2/json/access/ticket"))
        .respond_with(data(json!({
            "ticket": "PVE:!tfa!abc", "CSRFPreventionToken": "c", "username": "root@pam", "NeedTFA": 1
        })))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api2/json/nodes"))
        .respond_with(ResponseTemplate::new(401))
        .mount(&server)
        .await;
    let e = password_client(&server)
        .get::<Vec<NodeResource>>(&["nodes"], Params::new())
        .await
        .unwrap_err();
    assert!(matches!(e, ProxmoxError::Unauthorized { .. }), "{e:?}");
    assert!(e.to_string().contains("two-factor"), "{e}");
    assert!(e.to_string().contains("token"), "{e}");
}

/// HA calls as pve-ha-manager takes them: src/PVE/API2/HA/Resources.pm (`create` refuses a defined
/// sid, `update` takes the settings with the sid in the path, `delete` purges by default and refuses `purge` before 5.0.7, so it is never sent) and
/// src/PVE/API2/HA/Rules.pm (rules listed with the file's digest; `update_rule` needs the `type`).
#[tokio::test]
async fn ha_resources_and_rules_exact_requests() {
    use omni_infra_provider_proxmox::proxmox::{client::Params, ha::HaRule};
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api2/json/cluster/ha/resources"))
        .and(body_string("sid=vm%3A104&state=started&max_relocate=2"))
        .respond_with(ResponseTemplate::new(500).set_body_json(
            json!({"data": null, "message": "resource ID 'vm:104' already defined\n"}),
        ))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/api2/json/cluster/ha/resources/vm:104"))
        .and(body_string("state=started&max_relocate=2"))
        .respond_with(data(json!(null)))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .and(path("/api2/json/cluster/ha/resources/vm:104"))
        .and(query_param_is_missing("purge"))
        .respond_with(data(json!(null)))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api2/json/cluster/ha/rules"))
        .respond_with(data(
            json!([{"rule": "omni-cp-raff", "type": "resource-affinity",
            "affinity": "negative", "resources": "vm:101,vm:102", "digest": "abc", "order": 1,
            "errors": {"resources": "rule is ineffective"}}]),
        ))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api2/json/cluster/ha/rules"))
        .and(body_string("rule=omni-cp-naff&type=node-affinity&resources=vm%3A104&comment=kept&nodes=pve1%2Cpve2&strict=1"))
        .respond_with(data(json!(null)))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/api2/json/cluster/ha/rules/omni-cp-raff"))
        .and(body_string(
            "type=resource-affinity&resources=vm%3A101%2Cvm%3A102%2Cvm%3A104&digest=abc",
        ))
        .respond_with(data(json!(null)))
        .expect(1)
        .mount(&server)
        .await;
    let c = token_client(&server);
    let vmid = VmId::new(104).unwrap();
    let settings = Params::new()
        .with("state", "started")
        .with("max_relocate", 2);
    c.add_ha_resource(vmid, settings).await.unwrap();
    c.remove_ha_resource(vmid).await.unwrap();
    let rules = c.ha_rules().await.unwrap();
    assert_eq!(rules[0].resource_list(), ["vm:101", "vm:102"]);
    let naff = HaRule {
        rule: "omni-cp-naff".into(),
        kind: "node-affinity".into(),
        nodes: Some("pve1,pve2".into()),
        strict: true,
        comment: Some("kept".into()),
        ..HaRule::default()
    };
    c.create_ha_rule(&naff, &["vm:104".into()]).await.unwrap();
    let joined = ["vm:101", "vm:102", "vm:104"].map(String::from);
    c.set_ha_rule_resources(&rules[0], &joined).await.unwrap();
}

/// Placing or tearing down many machines at once, each reads the cluster listing. Readers that ask
/// while a listing is on its way share the next one (never one sent before they asked): twenty at
/// once cost two listings, not twenty; one asking later reads its own.
#[tokio::test]
async fn concurrent_cluster_listings_are_shared_and_never_older_than_the_ask() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api2/json/cluster/resources"))
        .respond_with(
            data(json!([{"id": "node/pve1", "type": "node", "node": "pve1", "status": "online"}]))
                .set_delay(Duration::from_millis(200)),
        )
        .mount(&server)
        .await;
    let pve = token_client(&server);
    let all = (0..20).map(|_| pve.cluster_listing());
    let listings = futures_util::future::join_all(all).await;
    assert!(
        listings
            .iter()
            .all(|l| l.as_ref().is_ok_and(|l| l.len() == 1))
    );
    let sent = server.received_requests().await.unwrap().len();
    assert!(sent <= 2, "{sent} listings for 20 readers at once");
    pve.cluster_listing().await.unwrap();
    let later = server.received_requests().await.unwrap().len();
    assert_eq!(later, sent + 1, "a later reader reads a listing of its own");
}

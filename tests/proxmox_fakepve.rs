//! End-to-end tests of the Proxmox client and the `cluster` command against fakepve (real HTTPS, a
//! schema-validating fake of the Proxmox VE 9 API).

use std::time::Duration;

use omni_infra_provider_proxmox::proxmox::client::{Params, UploadContent};
use omni_infra_provider_proxmox::proxmox::types::{
    ClusterResource, NodeName, NodeResource, NodeState, NodeStorage, VmId,
};
use omni_infra_provider_proxmox::proxmox::{ProxmoxClient, ProxmoxError};
use serde_json::json;
use testkit::fakepve::{FakePve, Login, Trust, three_node_scenario};

const TASK_TIMEOUT: Duration = Duration::from_secs(30);

fn node(n: &str) -> NodeName {
    NodeName::new(n).unwrap()
}

fn vmid(n: u32) -> VmId {
    VmId::new(n).unwrap()
}

fn client(fake: &FakePve, login: Login, trust: Trust) -> ProxmoxClient {
    ProxmoxClient::new(&fake.settings(login, trust)).unwrap()
}

#[tokio::test]
async fn nodes_and_cluster_resources() {
    let fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake, Login::Token, Trust::CaFile);
    let version = pve.version().await.unwrap();
    assert!(version.version.starts_with('9'), "{version:?}");

    let nodes: Vec<NodeResource> = pve.get(&["nodes"], Params::new()).await.unwrap();
    let names: Vec<_> = nodes.iter().map(|n| n.node.to_string()).collect();
    assert_eq!(names, ["pve1", "pve2", "pve3"]);
    assert!(
        nodes
            .iter()
            .all(|n| n.status == NodeState::Online && n.maxmem.is_some())
    );

    let resources = pve.cluster_listing().await.unwrap();
    let template = resources
        .iter()
        .find_map(|r| match r {
            ClusterResource::Vm(vm) if vm.vmid == vmid(9000) => Some(vm),
            _ => None,
        })
        .expect("template in resources");
    assert!(template.template);
    assert_eq!(template.node.as_str(), "pve1");
    assert!(resources.iter().any(
        |r| matches!(r, ClusterResource::Storage(s) if s.storage == "shared-nfs" && s.shared)
    ));

    let path = ["cluster", "resources"];
    let only_nodes: Vec<ClusterResource> = pve
        .get(&path, Params::new().with("type", "node"))
        .await
        .unwrap();
    assert_eq!(only_nodes.len(), 3);
    assert!(
        only_nodes
            .iter()
            .all(|r| matches!(r, ClusterResource::Node(_)))
    );

    let next = pve.next_vmid().await.unwrap();
    assert!(next.get() >= 101 && next != vmid(9000), "{next}");

    let images = pve
        .get::<Vec<NodeStorage>>(
            &["nodes", "pve2", "storage"],
            Params::new().with("content", "images").with("enabled", 1),
        )
        .await
        .unwrap();
    let names: Vec<_> = images.iter().map(|s| s.storage.as_str()).collect();
    assert!(
        names.contains(&"local-lvm") && names.contains(&"shared-nfs"),
        "{names:?}"
    );
    assert!(
        !names.contains(&"local"),
        "local holds no VM images: {names:?}"
    );
    assert!(images.iter().all(|s| s.avail.is_some()));
}

/// The whole life of a VM with tasks that take real (scaled) time, so task polling is exercised.
#[tokio::test]
async fn clone_configure_start_delete_with_real_task_polling() {
    let mut fake = FakePve::start(three_node_scenario(), 0.01);
    let pve = client(&fake, Login::Token, Trust::CaFile);
    // qemu-server src/PVE/API2/Qemu.pm `clone_vm`: a clone to another node needs every drive of the
    // source on shared storage (the scenario's template 9000 is on node-local local-lvm).
    fake.control(
        json!({"op": "add_vm", "vmid": 9100, "name": "talos-shared", "node": "pve1",
        "template": true,
        "config": {"memory": 2048, "cores": 2, "agent": "1", "scsihw": "virtio-scsi-single",
                   "scsi0": "shared-nfs:9100/base-9100-disk-0.qcow2,size=8G",
                   "net0": "virtio=BC:24:11:00:00:05,bridge=vmbr0"}}),
    );
    let new = pve.next_vmid().await.unwrap();

    let clone = pve
        .vm(&node("pve1"), vmid(9100))
        .clone_with(
            Params::new()
                .with("newid", new)
                .with("name", "talos-cp-1")
                .with("target", "pve2")
                .with("full", 1)
                // Proxmox clones across nodes only onto shared storage.
                .with("storage", "shared-nfs")
                .0,
        )
        .await
        .unwrap();
    assert_eq!(
        clone.node().as_str(),
        "pve1",
        "a clone task runs on the source node"
    );
    assert_eq!(clone.task_type(), "qmclone");
    pve.wait_for_task(&clone, TASK_TIMEOUT).await.unwrap();
    let vm = fake.vm(new.get());
    assert_eq!(vm["node"], json!("pve2"), "{vm}");
    assert_eq!(vm["name"], json!("talos-cp-1"));

    pve.vm(&node("pve2"), new)
        .update_config(vec![
            ("cores".into(), "4".into()),
            ("memory".into(), "4096".into()),
            ("tags".into(), "omni;talos".into()),
        ])
        .await
        .unwrap();
    let task = pve
        .vm(&node("pve2"), new)
        .update_config_async(vec![("description".into(), "made by a test".into())])
        .await
        .unwrap();
    pve.wait_for_task(&task, TASK_TIMEOUT).await.unwrap();
    let config = pve.vm(&node("pve2"), new).config().await.unwrap();
    assert_eq!(config.get("cores").as_deref(), Some("4"));
    assert_eq!(config.get("memory").as_deref(), Some("4096"));
    assert_eq!(config.get("description").as_deref(), Some("made by a test"));
    assert!(config.get("digest").is_some());

    if let Some(task) = pve
        .vm(&node("pve2"), new)
        .resize_disk("scsi0", "20G")
        .await
        .unwrap()
    {
        pve.wait_for_task(&task, TASK_TIMEOUT).await.unwrap();
    }

    let start = pve.vm(&node("pve2"), new).start().await.unwrap();
    pve.wait_for_task(&start, TASK_TIMEOUT).await.unwrap();
    let path = [
        "nodes",
        "pve2",
        "qemu",
        &new.to_string(),
        "status",
        "current",
    ];
    let status: serde_json::Value = pve.get(&path, Params::new()).await.unwrap();
    assert_eq!(status["status"], "running");

    let interfaces = pve
        .vm(&node("pve2"), new)
        .agent_network_interfaces()
        .await
        .unwrap();
    assert!(
        interfaces
            .result
            .iter()
            .flat_map(|i| &i.ip_addresses)
            .any(|a| a.ip_address.starts_with("10.99.")),
        "{interfaces:?}"
    );

    // Proxmox refuses to destroy a running VM: the error says so.
    let refused = pve.vm(&node("pve2"), new).delete(true).await;
    match refused {
        Err(e) => assert!(e.to_string().contains("running"), "{e}"),
        Ok(task) => {
            let e = pve.wait_for_task(&task, TASK_TIMEOUT).await.unwrap_err();
            assert!(e.to_string().contains("running"), "{e}");
        }
    }

    let stop = pve.vm(&node("pve2"), new).stop().await.unwrap();
    pve.wait_for_task(&stop, TASK_TIMEOUT).await.unwrap();
    let destroy = pve.vm(&node("pve2"), new).delete(true).await.unwrap();
    pve.wait_for_task(&destroy, TASK_TIMEOUT).await.unwrap();
    assert!(fake.vm(new.get()).is_null());
    let requests = fake.requests();
    let polls = requests
        .iter()
        .filter(|(_, p)| p.ends_with("/status") && p.contains("/tasks/"))
        .count();
    assert!(polls >= 6, "tasks that take time are polled: {polls} polls");
}

#[tokio::test]
async fn missing_vm_and_failed_task_errors_say_what_happened() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake, Login::Token, Trust::CaFile);

    let missing = pve
        .vm(&node("pve1"), vmid(4242))
        .config()
        .await
        .unwrap_err();
    assert!(missing.is_not_found(), "{missing:?}");
    assert!(missing.to_string().contains("4242"), "{missing}");

    let unknown_node = pve.node_storages(&node("pve7")).await.unwrap_err();
    assert!(unknown_node.is_not_found(), "{unknown_node:?}");

    // A bad parameter: Proxmox's per-field error comes through.
    let bad = pve
        .vm(&node("pve2"), vmid(100))
        .update_config(vec![("cores".into(), "0".into())])
        .await
        .unwrap_err();
    match &bad {
        ProxmoxError::Api {
            status: 400,
            field_errors,
            ..
        } => {
            assert!(field_errors.contains_key("cores"), "{bad}")
        }
        other => panic!("expected a 400 with field errors, got {other:?}"),
    }

    // Starting a template fails inside the task: the error carries the task log.
    let task = pve.vm(&node("pve1"), vmid(9000)).start().await;
    let err = match task {
        Ok(upid) => pve.wait_for_task(&upid, TASK_TIMEOUT).await.unwrap_err(),
        Err(e) => e,
    };
    assert!(err.to_string().to_lowercase().contains("template"), "{err}");

    // A start that fails inside the worker comes back as a failed task with its log tail.
    fake.control(
        json!({"op": "fail", "method": "POST", "suffix": "/nodes/pve2/qemu/100/status/start",
                        "error": "qemu_exited_code", "times": 1}),
    );
    let upid = pve.vm(&node("pve2"), vmid(100)).start().await.unwrap();
    let err = pve.wait_for_task(&upid, TASK_TIMEOUT).await.unwrap_err();
    match &err {
        ProxmoxError::TaskFailed {
            exit_status,
            log_tail,
            upid,
            ..
        } => {
            assert_eq!(upid.node().as_str(), "pve2");
            assert!(exit_status.contains("QEMU exited with code 1"), "{err}");
            assert!(
                log_tail.iter().any(|l| l.contains("TASK ERROR")),
                "{log_tail:?}"
            );
        }
        other => panic!("expected a failed task, got {other:?}"),
    }
}

#[tokio::test]
async fn offline_node_is_transient_and_cluster_still_lists_it() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    fake.control(json!({"op": "set_node_offline", "node": "pve3"}));
    let pve = ProxmoxClient::with_retry(
        &fake.settings(Login::Token, Trust::CaFile),
        omni_infra_provider_proxmox::proxmox::RetryPolicy {
            attempts: 2,
            initial_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
        },
    )
    .unwrap();
    let err = pve.node_storages(&node("pve3")).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(err.to_string().contains("No route to host"), "{err}");

    let report = omni_infra_provider_proxmox::cli::cluster::gather(&pve, &Default::default())
        .await
        .unwrap();
    let pve3 = report
        .nodes
        .iter()
        .find(|n| n.node.node.as_str() == "pve3")
        .unwrap();
    assert_eq!(pve3.node.status, NodeState::Offline);
    assert!(pve3.storages.is_none());
}

#[tokio::test]
async fn password_login_relogs_after_the_ticket_is_revoked() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake, Login::Password, Trust::CaFile);
    pve.get::<serde_json::Value>(&["nodes"], Params::new())
        .await
        .unwrap();
    fake.control(json!({"op": "revoke_tickets"}));
    // A write needs the CSRF token of the new session too.
    pve.vm(&node("pve2"), vmid(100))
        .update_config(vec![("description".into(), "x".into())])
        .await
        .unwrap();
    let logins = fake.count("POST", "/access/ticket");
    assert_eq!(logins, 2, "one login at start, one after the revocation");
}

#[tokio::test]
async fn wrong_credentials_are_a_clear_error() {
    let fake = FakePve::start(three_node_scenario(), 0.0);
    let yaml = fake
        .config_yaml(Login::Token, Trust::CaFile)
        .replace(testkit::fakepve::TOKEN_SECRET, "wrong");
    let settings = omni_infra_provider_proxmox::config::ProviderConfig::parse(&yaml)
        .unwrap()
        .proxmox;
    let err = ProxmoxClient::new(&settings)
        .unwrap()
        .version()
        .await
        .unwrap_err();
    assert!(matches!(err, ProxmoxError::Unauthorized { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("tokenSecret") && !text.contains("wrong"),
        "{text}"
    );
}

#[tokio::test]
async fn tls_is_verified_unless_told_otherwise() {
    let fake = FakePve::start(three_node_scenario(), 0.0);
    // Public roots only: fakepve's private CA is not trusted.
    let yaml = fake
        .config_yaml(Login::Token, Trust::CaFile)
        .lines()
        .filter(|l| !l.contains("caFile"))
        .collect::<Vec<_>>()
        .join("\n");
    let settings = omni_infra_provider_proxmox::config::ProviderConfig::parse(&yaml)
        .unwrap()
        .proxmox;
    let err = ProxmoxClient::new(&settings)
        .unwrap()
        .version()
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );

    client(&fake, Login::Token, Trust::InsecureSkipVerify)
        .version()
        .await
        .unwrap();
    client(&fake, Login::Password, Trust::InsecureSkipVerify)
        .version()
        .await
        .unwrap();
}

#[tokio::test]
async fn iso_upload_and_download() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake, Login::Password, Trust::CaFile);
    let upload = pve
        .upload_file(
            &node("pve1"),
            "local",
            "iso",
            "seed-test.iso",
            UploadContent::Bytes(vec![7u8; 4096]),
        )
        .await
        .unwrap();
    pve.wait_for_task(&upload, TASK_TIMEOUT).await.unwrap();
    let download = pve
        .download_url(
            &node("pve1"),
            "local",
            "iso",
            "talos-abc.iso",
            "https://factory.talos.dev/image/abc/v1.11.0/nocloud-amd64.iso",
        )
        .await
        .unwrap();
    pve.wait_for_task(&download, TASK_TIMEOUT).await.unwrap();
    let content = pve
        .storage_content(&node("pve1"), "local", Some("iso"))
        .await
        .unwrap();
    let ids: Vec<_> = content.iter().map(|v| v.volid.as_str()).collect();
    assert!(ids.contains(&"local:iso/seed-test.iso"), "{ids:?}");
    assert!(ids.contains(&"local:iso/talos-abc.iso"), "{ids:?}");

    if let Some(task) = pve
        .delete_volume(&node("pve1"), "local", "local:iso/seed-test.iso")
        .await
        .unwrap()
    {
        pve.wait_for_task(&task, TASK_TIMEOUT).await.unwrap();
    }
    let volumes = fake.control(json!({"op": "storage_volumes", "storage": "local"}));
    assert!(!volumes.to_string().contains("seed-test"), "{volumes}");
}

fn cluster_command(config: &std::path::Path, output: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_omni-infra-provider-proxmox"))
        .args(["cluster", "--config-file"])
        .arg(config)
        .args(["--output", output])
        .output()
        .unwrap()
}

#[test]
fn cluster_command_shows_the_cluster_with_every_auth_and_trust_mode() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    fake.control(json!({"op": "set_node_offline", "node": "pve3"}));
    for (login, trust) in [
        (Login::Token, Trust::CaFile),
        (Login::Password, Trust::CaFile),
        (Login::Token, Trust::InsecureSkipVerify),
        (Login::Password, Trust::InsecureSkipVerify),
    ] {
        let out = cluster_command(&fake.write_config(login, trust), "json");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{login:?}/{trust:?}: {stderr}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let nodes = report["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0]["name"], json!("pve1"));
        assert_eq!(nodes[0]["status"], json!("online"));
        assert_eq!(nodes[2]["status"], json!("offline"));
        assert!(nodes[2]["storages"].is_null());
        let pve1_storages = nodes[0]["storages"].as_array().unwrap();
        let lvm = pve1_storages
            .iter()
            .find(|s| s["name"] == json!("local-lvm"))
            .unwrap();
        assert_eq!(lvm["holds_vm_disks"], json!(true));
        let local = pve1_storages
            .iter()
            .find(|s| s["name"] == json!("local"))
            .unwrap();
        assert_eq!(local["holds_vm_disks"], json!(false));
        assert_eq!(local["holds_iso"], json!(true));
        assert_eq!(nodes[1]["running_vms"], json!(1));
        assert_eq!(
            report["templates"],
            json!([{"vmid": 9000, "name": "talos-template", "node": "pve1"}])
        );
        if matches!(trust, Trust::InsecureSkipVerify) {
            assert!(
                stderr.contains("insecureSkipVerify"),
                "a warning is logged: {stderr}"
            );
        }
    }

    let out = cluster_command(&fake.write_config(Login::Token, Trust::CaFile), "table");
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("pve3  offline"), "{table}");
    assert!(table.contains("talos-template"), "{table}");
    assert!(table.contains("shared-nfs"), "{table}");
}

/// `cluster` shows quorum and membership beside the topology: pve-manager PVE/API2/Cluster.pm
/// `get_status` (a `cluster` entry with `quorate`, a `node` entry per member with `online`); without
/// quorum pve-cluster src/PVE/Cluster.pm `check_cfs_quorum` refuses every change, and the table
/// says so.
#[test]
fn cluster_command_shows_quorum_and_membership() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    fake.control(json!({"op": "set_node_offline", "node": "pve3"}));
    let config = fake.write_config(Login::Token, Trust::CaFile);
    let out = cluster_command(&config, "json");
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let health = &report["cluster_health"];
    assert_eq!(health["quorate"], json!(true), "{report}");
    assert_eq!(
        health["members"],
        json!([{"name": "pve1", "online": true}, {"name": "pve2", "online": true},
               {"name": "pve3", "online": false}])
    );
    fake.control(json!({"op": "quorum", "quorate": false}));
    let out = cluster_command(&config, "table");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("NO QUORUM, 2 of 3 members online (pve1, pve2)"),
        "{table}"
    );
}

#[test]
fn cluster_command_reports_bad_config_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(
        &path,
        "proxmox:\n  url: https://pve:8006\n  tokenId: a@b!c\n",
    )
    .unwrap();
    let out = cluster_command(&path, "table");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("did you mean `tokenID`"), "{stderr}");
}

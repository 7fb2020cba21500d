//! The Proxmox client against behaviours of real PVE that fakepve alone is kinder about, emulated by
//! our launcher: PVE 8's error text only in the HTTP reason phrase, download-url refusing an existing
//! file, and VMIDs when the token cannot see every guest and the datacenter narrows the next-id range.

use std::time::Duration;

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::MACHINE_REQUEST_STATUS;
use omni_infra_provider_proxmox::proxmox::types::{NodeName, VmId};
use omni_infra_provider_proxmox::proxmox::{ProxmoxClient, ProxmoxError};
use serde_json::json;
use testkit::fakepve::{FakePve, Login, TOKEN_ID, Trust, readme_role, three_node_scenario};
use testkit::harness::Harness;

const TASK_TIMEOUT: Duration = Duration::from_secs(30);
/// One small machine on pve2, no waiting for an address.
const ON_PVE2: &str = "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve2\nip_discovery_timeout: 0\n";

fn client(fake: &FakePve) -> ProxmoxClient {
    ProxmoxClient::new(&fake.settings(Login::Token, Trust::CaFile)).unwrap()
}

fn pve1() -> NodeName {
    NodeName::new("pve1").unwrap()
}

// pve-http-server src/PVE/APIServer/Formatter/Standard.pm: only since "fix #6503" (January 2025) does
// the JSON body of an error carry `message`; before, PVE 8 answered `{"data":null}` and put the text in
// the HTTP status line (AnyEvent.pm builds the response with the message as reason phrase).
#[tokio::test]
async fn old_pve8_errors_are_read_from_the_reason_phrase() {
    let mut scenario = three_node_scenario();
    scenario["old_pve8_errors"] = json!(true);
    let fake = FakePve::start(scenario, 0.0);
    let pve = client(&fake);
    // pve-manager PVE/API2/Pool.pm, create_pool: "pool '…' already exists" (500): a provider restart
    // meets the set's pool again and must take it as there.
    pve.ensure_pool("old-pve8", "set").await.unwrap();
    pve.ensure_pool("old-pve8", "set").await.unwrap();

    // A missing VM is NotFound (500 "Configuration file … does not exist"), and the message says so.
    let err = pve
        .vm(&pve1(), VmId::new(4242).unwrap())
        .config()
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert!(!err.to_string().contains("\"data\""), "{err}");
}

// pve-common src/PVE/Tools.pm, download_file_from_url: without a checksum an existing destination is
// refused ("refusing to override existing file"), which ends the download task with an error.
#[tokio::test]
async fn download_url_refusing_an_existing_file_means_it_is_present() {
    let fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let url = "https://factory.talos.dev/image/abc/v1.11.0/nocloud-amd64.iso";
    let node = pve1();
    let download = || pve.download_url(&node, "local", "iso", "talos-abc.iso", url);
    let first = download().await.unwrap();
    pve.wait_for_task(&first, TASK_TIMEOUT).await.unwrap();
    let again = download().await.unwrap();
    let err = pve.wait_for_task(&again, TASK_TIMEOUT).await.unwrap_err();
    assert!(
        matches!(err, ProxmoxError::TaskFailed { .. }) && err.is_file_already_present(),
        "{err}"
    );
}

// pve-manager PVE/API2/Cluster.pm: `resources` lists only guests the token has VM.Audit on, and
// `nextid` picks from datacenter.cfg's next-id range (default 100 up to one million) among all guests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vmids_come_from_nextid_past_hidden_guests_and_inside_the_range() {
    let mut scenario = three_node_scenario();
    scenario["next_id"] = json!([5000, 6000]);
    let guests = scenario["guests"].as_array_mut().unwrap();
    for vmid in 5000..5004 {
        guests.push(json!({"vmid": vmid, "name": format!("hidden-{vmid}"), "node": "pve3"}));
    }
    // Everything on `/` but VM.Audit, which the token has only on the set's pool: the guests above
    // (and 100, 9000) are invisible to it, as on a cluster shared between teams.
    let mut privs = readme_role();
    privs.retain(|p| p != "VM.Audit");
    scenario["acl"] = json!({ TOKEN_ID: [["/", privs], ["/pool/ids", ["VM.Audit"]]] });
    let mut h = Harness::start_with(scenario, "").await;
    h.request("ids-1", "ids", ON_PVE2);
    h.wait_stage("ids-1", Stage::Provisioned).await;
    let vms = h.vms_named("ids-1");
    assert_eq!(vms.len(), 1, "{vms:?}");
    assert_eq!(vms[0]["vmid"], json!(5004), "{vms:?}");
    let refused_creates = h.pve.count("POST", "/qemu");
    assert_eq!(refused_creates, 1, "one create, no VMID guessed wrong");
    h.stop_controller().await;
}

// A token that sees every guest (VM.Audit on /vms) and may read the datacenter's options (Sys.Audit on
// /) chooses VMIDs from the listing it reads anyway: pve-access-control RPCEnvironment.pm
// `get_effective_permissions` says what it holds on `/vms` and `/`, pve-manager PVE/API2/Cluster.pm
// `get_options` gives datacenter.cfg's `next-id` only with Sys.Audit, and `nextid` is the lowest free
// VMID of that range. A VMID taken behind the listing's back is refused by the create itself
// (pve-guest-common AbstractConfig.pm `create_and_lock_config` -> pve-cluster Cluster.pm
// `check_vmid_unused`, "VM <id> already exists on node …"), before anything is made: the provider
// chooses another and asks nextid for a while.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vmids_come_from_the_listing_when_the_token_sees_every_guest() {
    let mut scenario = three_node_scenario();
    scenario["next_id"] = json!([5000, 6000]);
    let guests = scenario["guests"].as_array_mut().unwrap();
    for vmid in [5000, 5001, 5003] {
        guests.push(json!({"vmid": vmid, "name": format!("other-{vmid}"), "node": "pve3"}));
    }
    scenario["acl"] = json!({ TOKEN_ID: [["/", readme_role()]] });
    let mut h = Harness::start_with(scenario, "").await;
    h.request("ids-a", "ids", ON_PVE2);
    h.wait_stage("ids-a", Stage::Provisioned).await;
    let vms = h.vms_named("ids-a");
    assert_eq!(vms.len(), 1, "{vms:?}");
    assert_eq!(
        vms[0]["vmid"],
        json!(5002),
        "the lowest free VMID of the range"
    );
    assert_eq!(
        h.pve.count("GET", "/cluster/nextid"),
        0,
        "no VMID asked for"
    );
    assert_eq!(h.pve.count("POST", "/qemu"), 1);

    // Another client takes the next VMID between our listing and our create.
    h.pve
        .control(json!({"op": "race_vmid", "suffix": "/qemu", "node": "pve1"}));
    h.request("ids-b", "ids", ON_PVE2);
    h.wait_stage("ids-b", Stage::Provisioned).await;
    let vms = h.vms_named("ids-b");
    assert_eq!(vms.len(), 1, "{vms:?}");
    assert_eq!(vms[0]["vmid"], json!(5005), "5004 went to the other client");
    assert_eq!(h.pve.count("POST", "/qemu"), 3, "one create refused");
    assert_eq!(h.machine_state("ids-b").spec.vmid, 5005);

    // Something the listing did not show made a guest: VMIDs are asked of Proxmox for a while.
    let asked = h.pve.count("GET", "/cluster/nextid");
    h.request("ids-c", "ids", ON_PVE2);
    h.wait_stage("ids-c", Stage::Provisioned).await;
    assert_eq!(h.vms_named("ids-c")[0]["vmid"], json!(5006));
    assert!(h.pve.count("GET", "/cluster/nextid") > asked);
    h.stop_controller().await;
}

// Without Sys.Audit on / the options answer leaves `next-id` out (pve-manager `get_options`), as if no
// range were set: the provider must not take that for the default range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sys_audit_vmids_come_from_nextid_inside_the_range() {
    let mut scenario = three_node_scenario();
    scenario["next_id"] = json!([7000, 8000]);
    let mut privs = readme_role();
    privs.retain(|p| p != "Sys.Audit");
    scenario["acl"] = json!({ TOKEN_ID: [["/", privs]] });
    let mut h = Harness::start_with(scenario, "").await;
    h.request("ids-d", "ids", ON_PVE2);
    h.wait_stage("ids-d", Stage::Provisioned).await;
    assert_eq!(h.vms_named("ids-d")[0]["vmid"], json!(7000));
    assert_eq!(h.pve.count("GET", "/cluster/nextid"), 1);
    h.stop_controller().await;
}

// pve-manager PVE/API2/Pool.pm: `DELETE /pools?poolid=` (delete_pool) came with nested pools in PVE 8.1;
// 8.0 has only `DELETE /pools/{poolid}` and answers the other with 501 "Method … not implemented"
// (pve-http-server AnyEvent.pm, rest_handler).
#[tokio::test]
async fn pools_are_deleted_on_pve_8_0_too() {
    let mut scenario = three_node_scenario();
    scenario["pve_version"] = json!("8.0.4");
    let mut fake = FakePve::start(scenario, 0.0);
    let pve = client(&fake);
    pve.ensure_pool("old-set", "set").await.unwrap();
    assert!(pve.delete_pool_if_empty("old-set").await.unwrap());
    let pools = fake.control(json!({"op": "pools"}));
    assert!(pools.get("old-set").is_none(), "{pools}");
}

// The listing said the Talos ISO was missing, but it was there when download-url ran (another provider
// or a lost answer of our own): pve-common Tools.pm download_file_from_url refuses to overwrite it, and
// the image step must take that as the ISO being present, not fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_overwrite_of_the_talos_iso_counts_as_present() {
    let mut h = Harness::start("").await;
    h.request("iso-1", "isos", ON_PVE2);
    h.wait_stage("iso-1", Stage::Provisioned).await;
    let talos = talos_isos(&mut h);
    assert_eq!(talos.len(), 1, "{talos:?}");
    h.pve
        .control(json!({"op": "unlist_volume", "volid": talos[0]}));
    // A fresh process: the one that just saw the ISO would not list the storage again so soon.
    h.stop_controller().await;
    h.start_controller();
    h.request("iso-2", "isos", ON_PVE2);
    h.wait_stage("iso-2", Stage::Provisioned).await;
    let downloads = h.pve.count("POST", "/download-url");
    assert_eq!(
        downloads, 2,
        "the second request tried, was refused, and went on"
    );
    h.stop_controller().await;
}

/// The Talos ISO seen in its storage is not listed again for every VM. When it is deleted by hand
/// meanwhile, the next create that names it fails inside its task (qemu-server Qemu.pm
/// `create_disks` activates an existing volume, pve-storage Plugin.pm `activate_volume`: "volume
/// '<volid>' does not exist"), and so does the start of a VM made before (QemuServer.pm
/// `vm_start_nolock` activates every volume of the config, CD-ROMs included). Either way the provider
/// downloads it again under its name and tries again, without a failed status in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_talos_iso_deleted_after_it_was_seen_is_put_back_by_the_next_create_or_start() {
    let mut h = Harness::start("").await;
    h.request("seen-1", "seen", ON_PVE2);
    h.wait_stage("seen-1", Stage::Provisioned).await;
    h.request("seen-2", "seen", ON_PVE2);
    h.wait_stage("seen-2", Stage::Provisioned).await;
    let listings = h.pve.count("GET", "/storage/local/content");
    assert_eq!(listings, 1, "the ISO storage listed for the first VM only");
    let talos = talos_isos(&mut h);
    assert_eq!(talos.len(), 1, "{talos:?}");

    // Deleted before a create names it.
    h.pve
        .control(json!({"op": "delete_volume", "volid": talos[0]}));
    h.request("seen-3", "seen", ON_PVE2);
    h.wait_stage("seen-3", Stage::Provisioned).await;
    assert_eq!(talos_isos(&mut h), talos, "put back under its name");
    assert_eq!(h.pve.count("POST", "/download-url"), 2);
    assert_eq!(h.pve.count("POST", "/qemu"), 4, "one create refused");

    // Deleted between a create and its start: the start is held back while it goes.
    h.pve.control(
        json!({"op": "late_apply", "method": "POST", "suffix": "/status/start", "secs": 1.0}),
    );
    h.request("seen-4", "seen", ON_PVE2);
    let held = tokio::time::timeout(Duration::from_secs(30), async {
        while h.pve.control(json!({"op": "late_held"})) == json!([]) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(held.is_ok(), "the start was held");
    h.pve
        .control(json!({"op": "delete_volume", "volid": talos[0]}));
    h.wait_stage("seen-4", Stage::Provisioned).await;
    assert_eq!(talos_isos(&mut h), talos);
    assert_eq!(h.pve.count("POST", "/download-url"), 3);
    assert_eq!(
        h.pve.count("POST", "/status/start"),
        5,
        "one start refused for the missing ISO"
    );
    let vms = h.vms_named("seen-4");
    assert_eq!(vms[0]["status"], json!("running"), "{vms:?}");
    let status = h.omni.state.get(&MACHINE_REQUEST_STATUS, "seen-4").unwrap();
    assert!(status.spec.error.is_empty(), "{status:?}");
    h.stop_controller().await;
}

/// The Talos ISOs (not the seeds) in pve2's `local` storage, as volume IDs.
fn talos_isos(h: &mut Harness) -> Vec<String> {
    let volumes = h
        .pve
        .control(json!({"op": "storage_volumes", "storage": "local"}));
    volumes
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .filter(|v| v.starts_with("iso/") && !v.contains("omni-seed"))
        .map(|v| format!("local:{v}"))
        .collect()
}

/// A scenario with a plain-LVM storage `thick` and a template on it on pve3, and sized nodes.
fn clone_scenario() -> serde_json::Value {
    let mut scenario = three_node_scenario();
    scenario["nodes"] = json!([
        {"name": "pve1", "maxcpu": 2, "maxmem": 4294967296u64},
        {"name": "pve2"},
        {"name": "pve3"}
    ]);
    scenario["storages"]["thick"] =
        json!({"type": "lvm", "content": "images", "active": 1, "vgname": "pve"});
    scenario["guests"].as_array_mut().unwrap().extend([
        json!({"vmid": 9005, "name": "talos-thick", "node": "pve3", "template": true,
               "config": {"memory": 2048, "cores": 2, "scsi0": "thick:base-9005-disk-0,size=8G"}}),
        json!({"vmid": 120, "name": "wide", "node": "pve1",
               "config": {"memory": 1024, "cores": 4, "sockets": 2}}),
        json!({"vmid": 121, "name": "pinned-vcpus", "node": "pve2",
               "config": {"memory": 1024, "cores": 4, "vcpus": 3}}),
    ]);
    scenario
}

fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// qemu-server src/PVE/API2/Qemu.pm `clone_vm`: `$check_storage_access_clone` marks the source as
// not shared when any drive is on non-shared storage, and `$load_and_check` then dies "can't clone
// VM to node '<target>' (VM uses local storage)" whatever the target storage. For a linked clone
// (`full` = 0) every disk must have the storage's 'clone' feature (pve-storage
// `volume_has_feature`; LVMPlugin.pm has none): "Linked clone feature is not supported for …".
// The placement rule (`rules::placement::clone`) is written from the same source; these pin the
// fake to it, so the end-to-end tests cannot pass on a fake kinder than Proxmox.
#[tokio::test]
async fn clones_are_refused_where_proxmox_refuses_them() {
    let fake = FakePve::start(clone_scenario(), 0.0);
    let pve = client(&fake);
    let err = pve
        .vm(&pve1(), VmId::new(9000).unwrap())
        .clone_with(params(&[
            ("newid", "200"),
            ("target", "pve2"),
            ("full", "1"),
            ("storage", "shared-nfs"),
        ]))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("can't clone VM to node 'pve2' (VM uses local storage)"),
        "{err}"
    );
    let err = pve
        .vm(&NodeName::new("pve3").unwrap(), VmId::new(9005).unwrap())
        .clone_with(params(&[("newid", "201"), ("full", "0")]))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("Linked clone feature is not supported for 'thick:base-9005-disk-0' (scsi0)"),
        "{err}"
    );
    // A linked clone of a template on lvmthin on its own node works.
    let task = pve
        .vm(&pve1(), VmId::new(9000).unwrap())
        .clone_with(params(&[
            ("newid", "202"),
            ("full", "0"),
            ("name", "linked"),
        ]))
        .await
        .unwrap();
    pve.wait_for_task(&task, TASK_TIMEOUT).await.unwrap();
}

// pve-manager PVE/API2Tools.pm `extract_node_stats`/`extract_vm_stats`: `maxcpu` is what pvestatd
// broadcast, for a node its CPU count, for a VM qemu-server src/PVE/QemuServer.pm `vmstatus` `cpus`
// (sockets × cores capped at the host's CPUs; `vcpus` when set). Placement counts vCPUs from these.
#[tokio::test]
async fn the_listing_counts_vcpus_as_proxmox_does() {
    let fake = FakePve::start(clone_scenario(), 0.0);
    let pve = client(&fake);
    let resources = pve.cluster_listing().await.unwrap();
    use omni_infra_provider_proxmox::model::{ClusterSnapshot, NodeSnapshot};
    let cluster = ClusterSnapshot::from_resources(&resources);
    let pve1 = cluster.node("pve1").unwrap();
    assert_eq!((pve1.cpus, pve1.memory_max), (2, 4294967296));
    let vm = |node: &NodeSnapshot, name: &str| {
        node.vms
            .iter()
            .find(|v| v.name.as_deref() == Some(name))
            .unwrap()
            .maxcpu
    };
    assert_eq!(vm(pve1, "wide"), Some(2));
    let pve2 = cluster.node("pve2").unwrap();
    assert_eq!(pve2.cpus, 4);
    assert_eq!(vm(pve2, "pinned-vcpus"), Some(3));
}

/// The launcher judges every request by the official API schema of the release it emulates
/// (tests/pve-api, from pve-docs `api-viewer/apidata.js`), as pveproxy does: pve-manager
/// PVE/HTTPServer.pm `rest_handler` answers a method the release lacks with 501; pve-common
/// src/PVE/RESTHandler.pm `handle` runs src/PVE/JSONSchema.pm `validate`, which gathers every error
/// by parameter into one 400 "Parameter verification failed." (`check_object`: unknown properties
/// under `additionalProperties 0`, missing ones; `check_prop`: type, pattern, range, enumeration;
/// `parse_property_string`: a property string's unknown sub-key or sub-key type, "invalid format").
/// pve-ha-manager src/PVE/API2/HA/Resources.pm `delete`: `purge` came with 5.0.7, so PVE 8.4 refuses it.
#[tokio::test]
async fn the_launcher_refuses_what_the_emulated_release_refuses() {
    let mut scenario = three_node_scenario();
    scenario["pve_version"] = json!("8.4.1");
    let pve8 = FakePve::start(scenario, 0.0);
    let refused = |answer: &(u16, serde_json::Value), field: &str, says: &str| {
        assert_eq!(answer.0, 400, "{answer:?}");
        assert_eq!(
            answer.1["message"],
            json!("Parameter verification failed.\n"),
            "{answer:?}"
        );
        let text = answer.1["errors"][field].as_str().unwrap_or_default();
        assert!(text.contains(says), "{field}: {answer:?}");
    };
    let purge = pve8
        .raw("DELETE", "/cluster/ha/resources/vm:100", &[("purge", "1")])
        .await;
    refused(
        &purge,
        "purge",
        "property is not defined in schema and the schema does not allow additional properties",
    );
    let rules = pve8.raw("GET", "/cluster/ha/rules", &[]).await;
    assert_eq!(rules.0, 501, "{rules:?}");
    let failback = pve8
        .raw(
            "POST",
            "/cluster/ha/resources",
            &[("sid", "vm:100"), ("failback", "1")],
        )
        .await;
    refused(&failback, "failback", "property is not defined in schema");
    let create = pve8
        .raw(
            "POST",
            "/nodes/pve1/qemu",
            &[
                ("vmid", "100"),
                ("net0", "virtio,bridge=vmbr0,colour=blue"),
                ("cores", "0"),
                ("ostype", "talos"),
                ("scsi0", "local-lvm:10,iothread=maybe"),
            ],
        )
        .await;
    refused(
        &create,
        "net0",
        "invalid key in comma-separated list property: colour",
    );
    refused(&create, "cores", "value must have a minimum value of 1");
    refused(
        &create,
        "ostype",
        "does not have a value in the enumeration",
    );
    refused(&create, "scsi0", "iothread");
    let missing = pve8.raw("POST", "/pools", &[]).await;
    refused(
        &missing,
        "poolid",
        "property is missing and it is not optional",
    );

    // PVE 9 knows `purge` (and its default, 1, is what a teardown wants).
    let pve9 = FakePve::start(three_node_scenario(), 0.0);
    let purge = pve9
        .raw("DELETE", "/cluster/ha/resources/vm:100", &[("purge", "1")])
        .await;
    assert_ne!(purge.0, 400, "{purge:?}");
}

/// A cluster that lost quorum refuses every write: pve-cluster src/PVE/Cluster.pm
/// `check_cfs_quorum` ("cluster not ready - no quorum?", what qemu-server's create, start and clone
/// check first) and `$cfs_lock` ("cfs-lock '<id>' error: no quorum!", the set's pool). The request
/// waits on the cluster (provisioning, not FAILED, the slow retry) with Proxmox's words in the
/// error, nothing is made, and it goes on once quorum is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_quorum_is_waited_for_not_failed() {
    let mut h = Harness::start("").await;
    h.pve.control(json!({"op": "quorum", "quorate": false}));
    h.request("quorum-0", "quorum", ON_PVE2);
    let waiting = h
        .omni
        .state
        .wait_for(Duration::from_secs(30), |s| {
            s.get(&MACHINE_REQUEST_STATUS, "quorum-0")
                .is_some_and(|st| st.spec.error.contains("no quorum"))
        })
        .await;
    assert!(waiting, "{:?}", h.status("quorum-0"));
    let status = h.status("quorum-0").unwrap();
    assert_eq!(status.spec.stage(), Stage::Provisioning, "{status:?}");
    assert!(status.spec.status.contains("for the cluster"), "{status:?}");
    assert!(h.vms_named("quorum-0").is_empty());

    h.pve.control(json!({"op": "quorum", "quorate": true}));
    h.stop_controller().await;
    h.start_controller();
    h.wait_stage("quorum-0", Stage::Provisioned).await;
    h.stop_controller().await;
}

//! Deprovision against fakepve (real HTTPS, a schema-validating fake of the Proxmox VE 9 API): VMs are
//! made the way the pipeline makes them (`vm_config::render` + one create, seed ISO uploaded), then
//! torn down through every case issue 5 lists.

mod lifecycle;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use omni_infra_provider_proxmox::cli::orphans;
use omni_infra_provider_proxmox::controller::error_policy::{ErrorKind, deprovision_kind};
use omni_infra_provider_proxmox::pipeline::deprovision::{
    DeprovisionOptions, DeprovisionOutcome, DeprovisionTarget, deprovision_reporting,
};
use omni_infra_provider_proxmox::proxmox::ProxmoxClient;
use omni_infra_provider_proxmox::proxmox::client::UploadContent;
use omni_infra_provider_proxmox::proxmox::property::{IsoVolume, StorageId};
use omni_infra_provider_proxmox::proxmox::types::{ClusterResource, NodeName, VmId};
use omni_infra_provider_proxmox::rules::cloud_init::seed_iso_file_name;
use omni_infra_provider_proxmox::rules::provider_data::ConfigLayers;
use omni_infra_provider_proxmox::rules::vm_config::{self, VmIdentity, VmTarget};
use serde_json::{Value, json};
use testkit::fakepve::{FakePve, Login, Trust, three_node_scenario};

const TASK_TIMEOUT: Duration = Duration::from_secs(30);
const PROVIDER: &str = "proxmox";
/// Measured: listing, config (the recorded SMBIOS UUID is checked), shutdown + 1 poll, destroy + 1
/// poll, seed ISO delete.
const RUNNING_VM_REQUESTS: u64 = 7;

fn node(n: &str) -> NodeName {
    NodeName::new(n).unwrap()
}

fn vmid(n: u32) -> VmId {
    VmId::new(n).unwrap()
}

fn client(fake: &FakePve) -> ProxmoxClient {
    ProxmoxClient::new(&fake.settings(Login::Token, Trust::CaFile)).unwrap()
}

/// Collects the progress lines a deprovision reports.
#[derive(Default)]
struct Progress(Mutex<Vec<String>>);

impl Progress {
    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// Whether the controller retries `err` by itself: the error policy's word on it.
fn retried_alone(
    err: &omni_infra_provider_proxmox::pipeline::deprovision::DeprovisionError,
) -> bool {
    deprovision_kind(err) != ErrorKind::NeedsHuman
}

async fn run(
    pve: &ProxmoxClient,
    target: &DeprovisionTarget,
) -> (
    Result<
        DeprovisionOutcome,
        omni_infra_provider_proxmox::pipeline::deprovision::DeprovisionError,
    >,
    Vec<String>,
) {
    let progress = Progress::default();
    let report = |line: &str| progress.0.lock().unwrap().push(line.to_owned());
    let result = deprovision_reporting(pve, target, &DeprovisionOptions::default(), &report)
        .await
        .map(|d| d.outcome);
    (result, progress.lines())
}

async fn upload_iso(pve: &ProxmoxClient, on: &str, file: &str) {
    let upid = pve
        .upload_file(
            &node(on),
            "local",
            "iso",
            file,
            UploadContent::Bytes(vec![7u8; 2048]),
        )
        .await
        .unwrap();
    pve.wait_for_task(&upid, TASK_TIMEOUT).await.unwrap();
}

/// Creates and starts a VM for `request_id` exactly as the pipeline does (boot mode `iso`).
async fn provision(
    pve: &ProxmoxClient,
    request_id: &str,
    id: u32,
    on: &str,
    start: bool,
) -> DeprovisionTarget {
    upload_iso(pve, on, "talos.iso").await;
    let seed_file = seed_iso_file_name(request_id);
    upload_iso(pve, on, &seed_file).await;
    let data = ConfigLayers::default().resolve("cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\nadditional_disks: [{disk_size: 2, storage_selector: 'true'}]\n", None)
        .unwrap();
    let identity = VmIdentity {
        request_id,
        set_id: Some("workers"),
        provider_id: PROVIDER,
    };
    let uuid = uuid::Uuid::new_v4();
    let seed_volume = format!("local:iso/{seed_file}");
    let target = VmTarget {
        vmid: id,
        storage: StorageId::new("local-lvm").unwrap(),
        additional_disk_storages: vec![StorageId::new("local-lvm").unwrap()],
        smbios_uuid: uuid,
        boot_iso: Some(IsoVolume::parse("local:iso/talos.iso").unwrap()),
        boot_image: None,
        seed_iso: IsoVolume::parse(&seed_volume).unwrap(),
        macs: Vec::new(),
    };
    let params: Vec<(String, String)> = vm_config::render(&data, &identity, &target)
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k != "vmid")
        .collect();
    let upid = pve.vm(&node(on), vmid(id)).create(params).await.unwrap();
    pve.wait_for_task(&upid, TASK_TIMEOUT).await.unwrap();
    if start {
        let upid = pve.vm(&node(on), vmid(id)).start().await.unwrap();
        pve.wait_for_task(&upid, TASK_TIMEOUT).await.unwrap();
    }
    DeprovisionTarget {
        request_id: request_id.to_owned(),
        provider_id: PROVIDER.to_owned(),
        vmid: Some(vmid(id)),
        recorded_node: Some(node(on)),
        smbios_uuid: Some(uuid.to_string()),
        seed_iso_volume: IsoVolume::parse(&seed_volume).ok(),
        set_pool: None,
    }
}

fn volumes(fake: &mut FakePve, storage: &str) -> Vec<String> {
    serde_json::from_value(fake.control(json!({"op": "storage_volumes", "storage": storage})))
        .unwrap()
}

fn disks_of(fake: &mut FakePve, id: u32) -> Vec<String> {
    volumes(fake, "local-lvm")
        .into_iter()
        .filter(|v| v.contains(&format!("vm-{id}-")))
        .collect()
}

fn has_volume(fake: &mut FakePve, storage: &str, needle: &str) -> bool {
    volumes(fake, storage).iter().any(|v| v.contains(needle))
}

#[tokio::test]
async fn running_vm_is_shut_down_and_destroyed_with_disks_and_seed_in_seven_requests() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let target = provision(&pve, "req-run", 120, "pve2", true).await;
    assert_eq!(fake.vm(120)["status"], json!("running"));
    assert_eq!(disks_of(&mut fake, 120).len(), 2, "boot + extra disk");
    assert!(has_volume(&mut fake, "local", "omni-seed-req-run.iso"));

    fake.control(json!({"op": "reset_requests"}));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = sent.clone();
    pve.set_observer(std::sync::Arc::new(move |_, _, _| {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }));
    let (result, progress) = run(&pve, &target).await;
    let used = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        result.unwrap(),
        DeprovisionOutcome::Deleted {
            node: node("pve2"),
            vmid: vmid(120)
        }
    );
    let seen = fake.requests();
    println!("deprovision of a running VM: {used} Proxmox requests: {seen:?}");
    assert!(
        used <= RUNNING_VM_REQUESTS,
        "{used} requests (target ≤ {RUNNING_VM_REQUESTS}): {seen:?}"
    );
    assert_eq!(
        seen.len() as u64,
        used,
        "client count matches what fakepve saw"
    );
    let listing = seen
        .iter()
        .filter(|(_, p)| p.ends_with("/cluster/resources"))
        .count();
    assert_eq!(listing, 1, "one listing, whatever the node count: {seen:?}");
    assert_eq!(
        seen.iter().filter(|(_, p)| p.ends_with("/config")).count(),
        1,
        "the config read once, for the recorded SMBIOS UUID a copy of the VM cannot carry: {seen:?}"
    );
    assert!(
        seen.iter()
            .any(|(m, p)| m == "POST" && p.ends_with("/nodes/pve2/qemu/120/status/shutdown")),
        "graceful shutdown first: {seen:?}"
    );

    assert_eq!(fake.vm(120), Value::Null);
    assert!(disks_of(&mut fake, 120).is_empty());
    assert!(!has_volume(&mut fake, "local", "omni-seed-req-run.iso"));
    assert!(
        has_volume(&mut fake, "local", "talos.iso"),
        "boot ISO is shared, kept"
    );
    assert!(
        progress
            .iter()
            .any(|l| l.contains("shutting down VM 120 on pve2")),
        "{progress:?}"
    );
    assert!(
        progress
            .iter()
            .any(|l| l.contains("destroying VM 120 on pve2")),
        "{progress:?}"
    );

    // Running it again (a retry after a crash) finds nothing and succeeds.
    let (again, _) = run(&pve, &target).await;
    assert_eq!(again.unwrap(), DeprovisionOutcome::AlreadyGone);
}

#[tokio::test]
async fn stopped_vm_skips_the_shutdown() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let target = provision(&pve, "req-stopped", 121, "pve1", false).await;
    fake.control(json!({"op": "reset_requests"}));
    let (result, _) = run(&pve, &target).await;
    assert!(matches!(
        result.unwrap(),
        DeprovisionOutcome::Deleted { .. }
    ));
    let seen = fake.requests();
    assert!(
        !seen.iter().any(|(_, p)| p.contains("/status/")),
        "{seen:?}"
    );
    assert_eq!(
        seen.len(),
        5,
        "listing, config, destroy, poll, seed delete: {seen:?}"
    );
}

#[tokio::test]
async fn migrated_vm_is_deleted_where_it_is_now() {
    // Tasks take (scaled) time here, so the waits really poll.
    let mut fake = FakePve::start(three_node_scenario(), 0.01);
    let pve = client(&fake);
    let target = provision(&pve, "req-moved", 122, "pve1", true).await;
    fake.control(json!({"op": "migrate", "vmid": 122, "target": "pve3"}));
    assert_eq!(fake.vm(122)["node"], json!("pve3"));
    fake.control(json!({"op": "reset_requests"}));

    let (result, progress) = run(&pve, &target).await;
    assert_eq!(
        result.unwrap(),
        DeprovisionOutcome::Deleted {
            node: node("pve3"),
            vmid: vmid(122)
        }
    );
    assert_eq!(fake.vm(122), Value::Null);
    assert!(disks_of(&mut fake, 122).is_empty());
    assert!(!has_volume(&mut fake, "local", "omni-seed-req-moved.iso"));
    assert!(
        progress.iter().any(|l| l.contains("on pve3")),
        "{progress:?}"
    );
    let seen = fake.requests();
    assert!(
        !seen
            .iter()
            .any(|(m, p)| m != "GET" && p.starts_with("/api2/json/nodes/pve1/qemu")),
        "nothing destructive sent to the old node: {seen:?}"
    );
}

#[tokio::test]
async fn reused_vmid_is_left_alone() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let target = provision(&pve, "req-reused", 123, "pve1", true).await;
    // Our VM was deleted by hand and someone else's VM got its VMID.
    fake.control(json!({"op": "remove_vm", "vmid": 123}));
    fake.control(
        json!({"op": "add_vm", "vmid": 123, "name": "database", "node": "pve2",
                        "status": "running", "config": {"memory": 1024, "cores": 1}}),
    );
    fake.control(json!({"op": "reset_requests"}));

    let (result, _) = run(&pve, &target).await;
    match result.unwrap() {
        DeprovisionOutcome::NotOurs { vmid: id, reason } => {
            assert_eq!(id, vmid(123));
            assert!(reason.contains("database"), "{reason}");
        }
        other => panic!("expected NotOurs, got {other:?}"),
    }
    let theirs = fake.vm(123);
    assert_eq!(theirs["name"], json!("database"));
    assert_eq!(theirs["status"], json!("running"));
    let seen = fake.requests();
    assert!(
        !seen
            .iter()
            .any(|(m, p)| m != "GET" && p.contains("/qemu/123")),
        "nothing sent to their VM: {seen:?}"
    );
    // Ours is gone, so its seed ISO goes too.
    assert!(!has_volume(&mut fake, "local", "omni-seed-req-reused.iso"));
}

#[tokio::test]
async fn reused_vmid_with_our_name_but_another_uuid_is_left_alone() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let mut target = provision(&pve, "req-uuid", 124, "pve1", false).await;
    // Same name, no request tag (so the config is read), a marker, but another SMBIOS UUID: a copy.
    let config = fake.vm(124)["config"].clone();
    fake.control(json!({"op": "remove_vm", "vmid": 124}));
    fake.control(
        json!({"op": "add_vm", "vmid": 124, "name": "req-uuid", "node": "pve1",
        "config": {"description": config["description"], "tags": "omni-provider.proxmox",
                   "smbios1": "uuid=00000000-0000-0000-0000-000000000001"}}),
    );
    target.seed_iso_volume = None;
    let (result, _) = run(&pve, &target).await;
    assert!(
        matches!(result.unwrap(), DeprovisionOutcome::NotOurs { ref reason, .. } if reason.contains("SMBIOS")),
    );
    assert_ne!(fake.vm(124), Value::Null);
}

#[tokio::test]
async fn vm_deleted_by_hand_is_already_gone() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let target = provision(&pve, "req-hand", 125, "pve3", true).await;
    fake.control(json!({"op": "remove_vm", "vmid": 125}));
    let (result, _) = run(&pve, &target).await;
    assert_eq!(result.unwrap(), DeprovisionOutcome::AlreadyGone);
    assert!(!has_volume(&mut fake, "local", "omni-seed-req-hand.iso"));
}

#[tokio::test]
async fn nothing_recorded_and_crash_before_recording() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let never = DeprovisionTarget {
        request_id: "req-never".into(),
        provider_id: PROVIDER.into(),
        vmid: None,
        recorded_node: None,
        smbios_uuid: None,
        seed_iso_volume: None,
        set_pool: None,
    };
    let (result, _) = run(&pve, &never).await;
    assert_eq!(result.unwrap(), DeprovisionOutcome::NothingRecorded);

    // A crash between create and recording the VMID: found by its identity and deleted.
    let mut made = provision(&pve, "req-crash", 126, "pve2", true).await;
    made.vmid = None;
    made.recorded_node = None;
    let (result, _) = run(&pve, &made).await;
    assert_eq!(
        result.unwrap(),
        DeprovisionOutcome::Deleted {
            node: node("pve2"),
            vmid: vmid(126)
        }
    );
    assert_eq!(fake.vm(126), Value::Null);

    // Two VMs claiming the same identity: refuse to guess.
    for id in [127, 128] {
        fake.control(
            json!({"op": "add_vm", "vmid": id, "name": "req-twice", "node": "pve1",
            "config": {"tags": "omni-provider.proxmox;omni-request.req-twice"}}),
        );
    }
    let twice = DeprovisionTarget {
        request_id: "req-twice".into(),
        ..never
    };
    let (result, _) = run(&pve, &twice).await;
    let err = result.unwrap_err();
    assert!(!retried_alone(&err));
    assert!(err.to_string().contains("127, 128"), "{err}");
    assert_ne!(fake.vm(127), Value::Null);
    assert_ne!(fake.vm(128), Value::Null);
}

#[tokio::test]
async fn official_provider_vm_is_deleted_through_its_recorded_vmid() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    // As the Go provider makes them: name = request ID, machine-request.<set> tag, no marker.
    fake.control(
        json!({"op": "add_vm", "vmid": 130, "name": "req-go", "node": "pve2",
        "status": "running",
        "config": {"tags": "machine-request.workers", "memory": 2048, "cores": 2,
                   "smbios1": "uuid=6f1c3b9e-2a4d-4e8f-9c0b-1d2e3f4a5b6c"}}),
    );
    let go_state = DeprovisionTarget {
        request_id: "req-go".into(),
        provider_id: PROVIDER.into(),
        vmid: Some(vmid(130)),
        recorded_node: Some(node("pve2")),
        smbios_uuid: Some("6f1c3b9e-2a4d-4e8f-9c0b-1d2e3f4a5b6c".into()),
        seed_iso_volume: None,
        set_pool: None,
    };
    // Without the recorded VMID it is not found (no provider tag) and not touched.
    let unrecorded = DeprovisionTarget {
        vmid: None,
        ..go_state.clone()
    };
    let (result, _) = run(&pve, &unrecorded).await;
    assert_eq!(result.unwrap(), DeprovisionOutcome::NothingRecorded);
    assert_ne!(fake.vm(130), Value::Null);

    let (result, _) = run(&pve, &go_state).await;
    assert_eq!(
        result.unwrap(),
        DeprovisionOutcome::Deleted {
            node: node("pve2"),
            vmid: vmid(130)
        }
    );
    assert_eq!(fake.vm(130), Value::Null);
}

#[tokio::test]
async fn offline_node_is_a_transient_error_until_it_is_back() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let target = provision(&pve, "req-offline", 131, "pve3", true).await;
    fake.control(json!({"op": "set_node_offline", "node": "pve3"}));

    let (result, _) = run(&pve, &target).await;
    let err = result.unwrap_err();
    assert!(retried_alone(&err), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("pve3") && text.contains("131") && text.contains("may still exist"),
        "{text}"
    );
    assert_ne!(fake.vm(131), Value::Null, "nothing deleted");
    assert!(has_volume(&mut fake, "local", "omni-seed-req-offline.iso"));

    fake.control(json!({"op": "set_node_offline", "node": "pve3", "offline": false}));
    let (result, _) = run(&pve, &target).await;
    assert_eq!(
        result.unwrap(),
        DeprovisionOutcome::Deleted {
            node: node("pve3"),
            vmid: vmid(131)
        }
    );
    assert_eq!(fake.vm(131), Value::Null);
    assert!(!has_volume(&mut fake, "local", "omni-seed-req-offline.iso"));
}

#[tokio::test]
async fn failed_destroy_task_reports_its_log_then_succeeds_on_retry() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let target = provision(&pve, "req-fail", 132, "pve1", true).await;
    fake.control(
        json!({"op": "fail", "method": "DELETE", "suffix": "/nodes/pve1/qemu/132",
                        "error": "failed_remove_config_file", "times": 1}),
    );

    let (result, _) = run(&pve, &target).await;
    let err = result.unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("cannot destroy VM 132 on pve1")
            && text.contains("failed to remove config file")
            && text.contains("task log"),
        "{text}"
    );
    assert_ne!(fake.vm(132), Value::Null);

    let (result, _) = run(&pve, &target).await;
    assert_eq!(
        result.unwrap(),
        DeprovisionOutcome::Deleted {
            node: node("pve1"),
            vmid: vmid(132)
        }
    );
    assert_eq!(fake.vm(132), Value::Null);
    assert!(disks_of(&mut fake, 132).is_empty());
}

/// Another provider instance (another provider ID) shares the storage: its VM uses its seed ISO,
/// whose name says nothing of the provider. Attached to a VM, the ISO is in use, whoever made it:
/// never listed, never deleted.
#[tokio::test]
async fn a_seed_iso_attached_to_another_instances_vm_is_no_orphan() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    upload_iso(&pve, "pve3", &seed_iso_file_name("req-theirs")).await;
    fake.control(
        json!({"op": "add_vm", "vmid": 150, "name": "req-theirs", "node": "pve3",
        "status": "running", "config": {"name": "req-theirs", "memory": 1024,
        "tags": "omni-provider.other;omni-request.req-theirs",
        "ide3": "local:iso/omni-seed-req-theirs.iso,media=cdrom"}}),
    );
    let found = orphans::scan(&pve, PROVIDER, &BTreeSet::new())
        .await
        .unwrap();
    assert!(found.vms.is_empty(), "{found:?}");
    assert!(found.seed_isos.is_empty(), "{found:?}");
    let report = orphans::delete(&pve, PROVIDER, &found, &|_| {}).await;
    assert!(report.failures.is_empty(), "{report:?}");
    assert!(has_volume(&mut fake, "local", "omni-seed-req-theirs.iso"));
}

#[tokio::test]
async fn orphans_are_listed_and_deleted_and_live_ones_kept() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let live = provision(&pve, "req-live", 140, "pve1", true).await;
    let dead = provision(&pve, "req-dead", 141, "pve2", true).await;
    // A seed left behind by a VM that is gone.
    upload_iso(&pve, "pve3", &seed_iso_file_name("req-gone")).await;
    let live_requests: BTreeSet<String> = [live.request_id.clone()].into();

    let found = orphans::scan(&pve, PROVIDER, &live_requests).await.unwrap();
    let vm_ids: Vec<u32> = found.vms.iter().map(|v| v.vmid.get()).collect();
    assert_eq!(vm_ids, [141], "{found:?}");
    assert_eq!(
        found.vms[0].seed_isos,
        [dead.seed_iso_volume.as_ref().unwrap().to_string()]
    );
    // fakepve's `local` is one store seen from every node; on real PVE each node has its own.
    let isos: BTreeSet<&str> = found.seed_isos.iter().map(|i| i.volume.as_str()).collect();
    assert_eq!(
        isos,
        ["local:iso/omni-seed-req-gone.iso"].into(),
        "{found:?}"
    );

    let report = orphans::delete(&pve, PROVIDER, &found, &|_| {}).await;
    assert!(report.failures.is_empty(), "{report:?}");
    assert_eq!(fake.vm(141), Value::Null);
    assert!(!has_volume(&mut fake, "local", "omni-seed-req-dead.iso"));
    assert!(!has_volume(&mut fake, "local", "omni-seed-req-gone.iso"));
    // The live request's VM and seed are untouched.
    assert_eq!(fake.vm(140)["status"], json!("running"));
    assert!(has_volume(&mut fake, "local", "omni-seed-req-live.iso"));

    let after = orphans::scan(&pve, PROVIDER, &live_requests).await.unwrap();
    assert!(
        after.vms.is_empty() && after.seed_isos.is_empty(),
        "{after:?}"
    );
}

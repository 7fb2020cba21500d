//! Template- and CPU-aware placement end to end: the in-memory Omni over real gRPC, fakepve over real
//! HTTPS (its clone refusals and vCPU counts are qemu-server's, see `tests/pve_conformance.rs`), the
//! real controller, and the `cluster` and `validate` commands against the same fake.

use std::collections::BTreeMap;

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::MACHINE_REQUEST_STATUS;
use serde_json::{Value, json};
use testkit::cli;
use testkit::fakepve::{FakePve, three_node_scenario};
use testkit::harness::{Harness, WAIT};

/// Unpinned clones of the scenario's template 9000 (on pve1, its disk on local-lvm).
const CLONE: &str = "cores: 2\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'true'\nboot: clone\ntemplate: talos-template\nip_discovery_timeout: 0\n";

/// The node of each request's VM, counted.
fn per_node(h: &mut Harness, ids: &[String]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for id in ids {
        let vms = h.vms_named(id);
        assert_eq!(vms.len(), 1, "{id}: {vms:?}");
        *out.entry(vms[0]["node"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    out
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Proxmox clones a template to another node only when all its drives are on shared storage
/// (qemu-server src/PVE/API2/Qemu.pm `clone_vm`, "VM uses local storage"): with the only template on
/// pve1's local-lvm, every unpinned request goes to pve1 and provisions, instead of failing on
/// whichever node placement liked best.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_template_sends_every_clone_to_its_node() {
    let mut h = Harness::start("").await;
    let ids = ids("local-tmpl", 3);
    for id in &ids {
        h.request(id, "local-tmpl", CLONE);
    }
    for id in &ids {
        h.wait_stage(id, Stage::Provisioned).await;
    }
    assert_eq!(per_node(&mut h, &ids), BTreeMap::from([("pve1".into(), 3)]));
    assert_eq!(h.machine_state(&ids[0]).spec.template_vmid, 9000);
    h.stop_controller().await;
}

/// A template wholly on shared storage reaches every node; the other nodes clone onto a shared
/// storage the selector takes (a full clone to another node needs a shared target storage:
/// "can't clone to non-shared storage"), its own node onto the first selected one. The set
/// spreads 1/1/1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_template_spreads_one_per_node() {
    let mut h = Harness::start("").await;
    h.pve.control(
        json!({"op": "add_vm", "vmid": 9010, "name": "talos-shared", "node": "pve1",
        "template": true,
        "config": {"memory": 2048, "cores": 2, "agent": "1", "scsihw": "virtio-scsi-single",
                   "scsi0": "shared-nfs:9010/base-9010-disk-0.qcow2,size=8G",
                   "boot": "order=scsi0;net0",
                   "net0": "virtio=BC:24:11:00:00:10,bridge=vmbr0"}}),
    );
    let ids = ids("shared-tmpl", 3);
    let class = CLONE.replace("talos-template", "talos-shared");
    for id in &ids {
        h.request(id, "shared-tmpl", &class);
    }
    for id in &ids {
        h.wait_stage(id, Stage::Provisioned).await;
    }
    assert_eq!(
        per_node(&mut h, &ids),
        BTreeMap::from([("pve1".into(), 1), ("pve2".into(), 1), ("pve3".into(), 1)])
    );
    for id in &ids {
        let vm = h.vms_named(id).remove(0);
        let disk = vm["config"]["scsi0"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if vm["node"] != json!("pve1") {
            assert!(disk.starts_with("shared-nfs:"), "{id}: {disk}");
        }
    }
    h.stop_controller().await;
}

/// A pinned node no clone reaches is the user's mistake: FAILED with placement's reason (the same
/// words `validate` and the placement log use), and nothing written to Proxmox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_node_that_cannot_clone_fails_before_any_write() {
    let mut h = Harness::start("").await;
    h.request("pinned-far", "far", &format!("{CLONE}node: pve2\n"));
    let status = h.wait_stage("pinned-far", Stage::Failed).await;
    let error = status.spec.error;
    assert!(
        error.contains(
            "node \"pve2\" from provider data cannot take this VM: no copy of template talos-template on pve2; its disks are on local-lvm (local to pve1: scsi0)"
        ),
        "{error}"
    );
    let writes: Vec<(String, String)> = h
        .pve
        .requests()
        .into_iter()
        .filter(|(m, _)| m != "GET")
        .collect();
    assert!(
        writes.is_empty(),
        "nothing is written to Proxmox: {writes:?}"
    );
    assert!(h.vms_named("pinned-far").is_empty());
    h.stop_controller().await;
}

/// `clone_mode: linked`: the clone call carries `full=0` and no `storage` (qemu-server refuses
/// "parameter 'storage' not allowed for linked clones"), and the VM provisions on the template's
/// node and storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_clone_provisions_on_the_templates_storage() {
    let mut h = Harness::start("").await;
    h.request(
        "linked-1",
        "linked",
        &format!("{CLONE}clone_mode: linked\n"),
    );
    h.wait_stage("linked-1", Stage::Provisioned).await;
    let vm = h.vms_named("linked-1").remove(0);
    assert_eq!(vm["node"], json!("pve1"));
    let disk = vm["config"]["scsi0"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(disk.starts_with("local-lvm:"), "{disk}");
    assert_eq!(h.machine_state("linked-1").spec.storage, "local-lvm");
    h.stop_controller().await;
}

/// Linked clones need the storage's clone feature (pve-storage `volume_has_feature`; plain LVM has
/// none): a template on LVM is refused up front, naming the drive, the storage and its type, with
/// no clone attempted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_clone_on_plain_lvm_is_refused_up_front() {
    let mut scenario = three_node_scenario();
    scenario["storages"]["thick"] =
        json!({"type": "lvm", "content": "images", "active": 1, "vgname": "pve"});
    scenario["guests"].as_array_mut().unwrap().push(
        json!({"vmid": 9005, "name": "talos-thick", "node": "pve1", "template": true,
               "config": {"memory": 2048, "cores": 2, "scsi0": "thick:base-9005-disk-0,size=8G"}}),
    );
    let mut h = Harness::start_with(scenario, "").await;
    h.request(
        "linked-thick",
        "linked",
        &format!("{CLONE}clone_mode: linked\n").replace("talos-template", "talos-thick"),
    );
    let status = h.wait_stage("linked-thick", Stage::Failed).await;
    let error = status.spec.error;
    assert!(
        error.contains("scsi0 of template talos-thick is on thick (lvm), which cannot hold linked clones; use `clone_mode: full`"),
        "{error}"
    );
    assert_eq!(h.pve.count("POST", "/clone"), 0, "no clone attempted");
    h.stop_controller().await;
}

/// vCPUs given to VMs (the listing's `maxcpu`, plus placements in flight) are counted against the
/// node's CPUs × `placement.cpuOvercommit`: with 1.0, pve1 (2 CPUs) takes one 2-vCPU VM, pve2 (4
/// CPUs, a 4-vCPU VM on it) none, pve3 (4 CPUs) two; a fourth request waits, saying why per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_overcommit_keeps_a_full_node_out() {
    let mut scenario = three_node_scenario();
    scenario["nodes"] = json!([{"name": "pve1", "maxcpu": 2}, {"name": "pve2"}, {"name": "pve3"}]);
    scenario["guests"][1]["config"]["cores"] = json!(4);
    let mut h = Harness::start_with(scenario, "placement:\n  cpuOvercommit: 1.0\n").await;
    let class = "cores: 2\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'name == \"local-lvm\"'\nip_discovery_timeout: 0\n";
    let ids = ids("cpu", 3);
    for id in &ids {
        h.request(id, "cpu", class);
    }
    for id in &ids {
        h.wait_stage(id, Stage::Provisioned).await;
    }
    assert_eq!(
        per_node(&mut h, &ids),
        BTreeMap::from([("pve1".into(), 1), ("pve3".into(), 2)])
    );
    h.request("cpu-3", "cpu", class);
    let waiting = h
        .omni
        .state
        .wait_for(WAIT, |s| {
            s.get(&MACHINE_REQUEST_STATUS, "cpu-3").is_some_and(|st| {
                st.spec
                    .error
                    .contains("pve2: 4 vCPUs given to VMs, 2 more would pass the limit of 4 (4 CPUs × cpuOvercommit 1)")
            })
        })
        .await;
    let status = h.status("cpu-3");
    assert!(waiting, "{status:?}");
    let status = status.unwrap();
    assert_eq!(
        status.spec.stage,
        Stage::Provisioning as i32,
        "waited for, not failed"
    );
    assert!(h.vms_named("cpu-3").is_empty());
    h.stop_controller().await;
}

/// `cluster` shows per node the vCPUs and memory given to VMs against the limits placement counts
/// with (the config's `placement:`), and `validate` renders the same verdicts: the nodes a clone
/// cannot reach are warnings for an unpinned class and a problem when pinned; a node past the
/// vCPU limit is left out under `cores`.
#[test]
fn cluster_and_validate_show_placements_verdicts() {
    let mut scenario = three_node_scenario();
    scenario["nodes"] = json!([{"name": "pve1", "maxcpu": 2}, {"name": "pve2"}, {"name": "pve3"}]);
    scenario["guests"][1]["config"]["cores"] = json!(4);
    let fake = FakePve::start(scenario, 0.0);
    let config = fake.config_file("placement:\n  cpuOvercommit: 1.5\n");
    let (ok, out) = cli(&["cluster", "--output", "json"], &config, "");
    assert!(ok, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let node = |n: usize| &report["nodes"][n];
    assert_eq!(report["cpu_overcommit"], json!(1.5));
    assert_eq!(
        (&node(0)["vcpus_allocated"], &node(0)["vcpus_limit"]),
        (&json!(0), &json!(3))
    );
    assert_eq!(
        (&node(1)["vcpus_allocated"], &node(1)["vcpus_limit"]),
        (&json!(4), &json!(6))
    );
    assert_eq!(node(1)["memory_allocated"], json!(1024u64 * 1024 * 1024));
    assert_eq!(node(1)["memory_limit"], json!(8u64 * 1024 * 1024 * 1024));
    let (ok, table) = cli(&["cluster"], &config, "");
    assert!(ok, "{table}");
    assert!(table.contains("VCPUS GIVEN / LIMIT"), "{table}");
    assert!(table.contains("4 / 6"), "{table}");

    // Unpinned clone of the local template: pve2 and pve3 are left out, with the reason; fine.
    let clone = "cores: 2\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'true'\nboot: clone\ntemplate: talos-template\n";
    let (ok, out) = cli(&["validate", "-"], &config, clone);
    assert!(ok, "{out}");
    let warn = out
        .lines()
        .find(|l| l.starts_with("warn") && l.contains("template") && l.contains("pve2"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        warn.contains("placement leaves pve2 out: no copy of template talos-template on pve2; its disks are on local-lvm (local to pve1: scsi0)"),
        "{warn}"
    );
    // Pinned to pve3: the same reason, as a problem.
    let (ok, out) = cli(&["validate", "-"], &config, &format!("{clone}node: pve3\n"));
    assert!(!ok, "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("FAIL")
            && l.contains("pve3")
            && l.contains("no copy of template talos-template on pve3")),
        "{out}"
    );
    // 4 vCPUs: pve1 (2 CPUs × 1.5 = 3) and pve2 (4 given, limit 6) are left out under `cores`.
    let wide = "cores: 4\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'true'\n";
    let (ok, out) = cli(&["validate", "-"], &config, wide);
    assert!(ok, "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("warn")
            && l.contains("cores")
            && l.contains("pve2")
            && l.contains("4 vCPUs given to VMs, 4 more would pass the limit of 6 (4 CPUs × cpuOvercommit 1.5)")),
        "{out}"
    );
}

//! Teardown end to end: Omni tears a MachineRequest down, the real controller deletes the VM where it
//! is now, only if it is ours, and releases the request, whatever state things are in.

use std::time::Duration;

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::{
    MACHINE_REQUEST, MACHINE_REQUEST_STATUS, provider_machine,
};
use serde_json::{Value, json};
use testkit::harness::{Harness, PROVIDER, WAIT};

const PINNED_PVE2: &str = "cores: 2\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve2\nip_discovery_timeout: 0\n";

/// What the teardown tests do to a harness.
trait TeardownSteps {
    /// Provisions `id` pinned to pve2 and returns its VMID.
    async fn provisioned(&mut self, id: &str) -> u64;
    /// Omni starts tearing the request down.
    fn tear_down(&self, id: &str);
    fn vm(&mut self, vmid: u64) -> Value;
    fn volumes(&mut self, storage: &str) -> String;
}

impl TeardownSteps for Harness {
    async fn provisioned(&mut self, id: &str) -> u64 {
        self.request(id, "teardown", PINNED_PVE2);
        self.wait_stage(id, Stage::Provisioned).await;
        let vms = self.vms_named(id);
        assert_eq!(vms.len(), 1);
        vms[0]["vmid"].as_u64().unwrap()
    }

    fn tear_down(&self, id: &str) {
        assert!(self.omni.state.teardown(&MACHINE_REQUEST, id));
    }

    fn vm(&mut self, vmid: u64) -> Value {
        self.pve.vm(vmid as u32)
    }

    fn volumes(&mut self, storage: &str) -> String {
        self.pve
            .control(json!({"op": "storage_volumes", "storage": storage}))
            .to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_deletes_vm_disks_and_seed_and_releases_the_request() {
    let mut h = Harness::start("").await;
    let vmid = h.provisioned("td-1").await;
    assert!(h.volumes("local").contains("omni-seed-td-1.iso"));
    assert!(h.volumes("local-lvm").contains(&format!("vm-{vmid}-disk")));
    h.tear_down("td-1");
    h.wait_released("td-1").await;
    assert!(h.vm(vmid).is_null(), "VM deleted");
    assert!(
        !h.volumes("local-lvm").contains(&format!("vm-{vmid}-disk")),
        "disks deleted"
    );
    assert!(
        !h.volumes("local").contains("omni-seed-td-1.iso"),
        "seed ISO deleted"
    );
    let requests = h.pve.requests();
    assert!(
        requests
            .iter()
            .any(|(m, p)| m == "POST" && p.ends_with(&format!("/qemu/{vmid}/status/shutdown"))),
        "graceful shutdown first: {requests:?}"
    );
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrated_vm_is_deleted_where_it_is_now() {
    let mut h = Harness::start("").await;
    let vmid = h.provisioned("td-migrated").await;
    h.pve
        .control(json!({"op": "migrate", "vmid": vmid, "target": "pve3"}));
    assert_eq!(h.vm(vmid)["node"], json!("pve3"));
    h.tear_down("td-migrated");
    h.wait_released("td-migrated").await;
    assert!(h.vm(vmid).is_null());
    let deletes: Vec<_> = h
        .pve
        .requests()
        .into_iter()
        .filter(|(m, p)| m == "DELETE" && p.contains(&format!("/qemu/{vmid}")))
        .collect();
    assert!(
        deletes.iter().all(|(_, p)| p.contains("/nodes/pve3/")),
        "{deletes:?}"
    );
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_vmid_is_left_alone_and_the_request_still_finishes() {
    let mut h = Harness::start("").await;
    let vmid = h.provisioned("td-reused").await;
    // Someone deletes our VM by hand and creates their own with the same VMID.
    h.pve.control(json!({"op": "remove_vm", "vmid": vmid}));
    h.pve.control(
        json!({"op": "add_vm", "vmid": vmid, "name": "important-database", "node": "pve2",
                         "status": "running", "config": {"memory": 8192, "tags": "prod"}}),
    );
    h.tear_down("td-reused");
    h.wait_released("td-reused").await;
    let theirs = h.vm(vmid);
    assert_eq!(theirs["name"], json!("important-database"));
    assert_eq!(theirs["status"], json!("running"), "not even shut down");
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_vm_never_created_vm_and_missing_state_all_finish() {
    let mut h = Harness::start("").await;
    // Deleted by hand.
    let vmid = h.provisioned("td-gone").await;
    h.pve.control(json!({"op": "remove_vm", "vmid": vmid}));
    h.tear_down("td-gone");
    h.wait_released("td-gone").await;

    // Never created: bad provider data stopped it before any VM.
    h.request("td-never", "teardown", "cores: 0\n");
    h.wait_stage("td-never", Stage::Failed).await;
    h.tear_down("td-never");
    h.wait_released("td-never").await;

    // The provider state resource is missing (the Go library hangs here forever).
    h.provisioned("td-nostate").await;
    assert!(
        h.omni
            .state
            .remove(&provider_machine(PROVIDER), "td-nostate")
    );
    h.tear_down("td-nostate");
    h.wait_released("td-nostate").await;
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_node_keeps_the_request_waiting_with_a_readable_error() {
    let mut h = Harness::start("").await;
    let vmid = h.provisioned("td-offline").await;
    h.pve
        .control(json!({"op": "set_node_offline", "node": "pve2"}));
    h.tear_down("td-offline");
    let shown = h
        .omni
        .state
        .wait_for(WAIT, |s| {
            s.get(&MACHINE_REQUEST_STATUS, "td-offline")
                .is_some_and(|st| st.spec.error.contains("pve2"))
        })
        .await;
    let status = h.status("td-offline");
    assert!(shown, "{status:?}");
    let error = status.unwrap().spec.error;
    assert!(
        error.contains("offline") || error.contains("No route"),
        "{error}"
    );
    assert!(
        h.omni.state.get(&MACHINE_REQUEST, "td-offline").is_some(),
        "still held"
    );
    assert!(
        !h.vm(vmid).is_null(),
        "never marked done while the VM may exist"
    );

    h.pve
        .control(json!({"op": "set_node_offline", "node": "pve2", "offline": false}));
    h.wait_released("td-offline").await;
    assert!(h.vm(vmid).is_null());
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_destroy_task_is_retried() {
    let mut h = Harness::start("").await;
    let vmid = h.provisioned("td-retry").await;
    h.pve.control(
        json!({"op": "fail", "method": "DELETE", "suffix": format!("/nodes/pve2/qemu/{vmid}"),
                         "error": "failed_remove_config_file", "times": 1}),
    );
    h.tear_down("td-retry");
    h.wait_released("td-retry").await;
    assert!(h.vm(vmid).is_null());
    let destroys = h.pve.count("DELETE", &format!("/qemu/{vmid}"));
    assert_eq!(destroys, 2, "one failed destroy, one retry");
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_left_without_its_request_is_cleaned_up_at_start() {
    let mut h = Harness::start("").await;
    let vmid = h.provisioned("td-dangling").await;
    h.stop_controller().await;
    // The request disappears while the provider is down (deleted by force).
    assert!(h.omni.state.remove(&MACHINE_REQUEST, "td-dangling"));
    h.start_controller();
    let cleaned = h
        .omni
        .state
        .wait_for(WAIT, |s| {
            s.get(&provider_machine(PROVIDER), "td-dangling").is_none()
        })
        .await;
    assert!(cleaned, "provider state torn down");
    h.wait_vm_deleted(vmid as u32, Duration::from_secs(10))
        .await;
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_set_pool_is_created_and_removed_with_its_last_machine() {
    let mut h = Harness::start("").await;
    let a = h.provisioned("pool-a").await;
    let b = h.provisioned("pool-b").await;
    assert_eq!(
        h.vm(a)["pool"],
        json!("teardown"),
        "VMs go to the set's pool, as upstream"
    );
    let pools = h.pve.control(json!({"op": "pools"}));
    assert_eq!(pools["teardown"], json!([a, b]));
    h.tear_down("pool-a");
    h.wait_released("pool-a").await;
    assert!(
        h.pve
            .control(json!({"op": "pools"}))
            .get("teardown")
            .is_some(),
        "pool-b still uses it"
    );
    assert_eq!(
        h.pve.count("DELETE", "/pools"),
        0,
        "not asked while a machine of the set stays: a refusal would be a 7th request"
    );
    h.tear_down("pool-b");
    h.wait_released("pool-b").await;
    assert_eq!(h.pve.count("DELETE", "/pools"), 1);
    assert!(
        h.pve
            .control(json!({"op": "pools"}))
            .get("teardown")
            .is_none(),
        "last machine gone, pool gone"
    );
    h.stop_controller().await;
}

/// Our VM gone by hand, and at its VMID a copy made by someone who may edit VM options: our name,
/// our tags, our description marker, but not the SMBIOS UUID the provider gave ours (recorded in the
/// provider state). The teardown reads the config and leaves the copy alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_our_vm_at_the_recorded_vmid_is_never_deleted() {
    let mut h = Harness::start("").await;
    let vmid = h.provisioned("copied-1").await;
    let ours = h.vm(vmid);
    let mut config = ours["config"].clone();
    assert!(config["smbios1"].as_str().unwrap().contains("uuid="));
    config["smbios1"] = json!("uuid=0e1b7d1c-0000-4000-8000-000000000001");
    h.pve.control(json!({"op": "remove_vm", "vmid": vmid}));
    h.pve.control(
        json!({"op": "add_vm", "vmid": vmid, "name": "copied-1", "node": "pve2",
        "status": "running", "config": config}),
    );
    h.tear_down("copied-1");
    h.wait_released("copied-1").await;
    let copy = h.vm(vmid);
    assert_eq!(copy["name"], json!("copied-1"), "the copy stays: {copy}");
    h.stop_controller().await;
}

/// A pool named like the set that someone else made (with its ACLs) takes the set's VMs, as the
/// create finds it existing, but is never deleted: only a pool whose comment says a provider made
/// it for a set is (the official provider deletes only such a pool, internal/pkg/provider/
/// provision.go `poolComment`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn someone_elses_pool_named_like_the_set_is_never_deleted() {
    let mut h = Harness::start("").await;
    let pve = omni_infra_provider_proxmox::proxmox::ProxmoxClient::new(&h.config.proxmox).unwrap();
    pve.ensure_pool("teardown", "team pool, ACLs for the ops group")
        .await
        .unwrap();
    let vmid = h.provisioned("pool-theirs").await;
    assert_eq!(h.vm(vmid)["pool"], json!("teardown"));
    h.tear_down("pool-theirs");
    h.wait_released("pool-theirs").await;
    assert_eq!(h.pve.count("DELETE", "/pools"), 0);
    assert!(
        h.pve
            .control(json!({"op": "pools"}))
            .get("teardown")
            .is_some(),
        "their pool stays"
    );
    h.stop_controller().await;
}

/// The seed ISO's delete whose answer is lost (a connection reset, a proxy's 502: the file may or may
/// not be gone) is sent again: a second delete of a file already deleted is answered "does not
/// exist" (pve-storage PVE/API2/Storage/Content.pm `delete` -> `PVE::Storage::vdisk_free`), which
/// counts as deleted. Without the second delete, the ISO would be left for `orphans`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_iso_delete_whose_answer_is_lost_is_sent_again() {
    let mut h = Harness::start("").await;
    h.provisioned("td-lost").await;
    h.pve.control(
        json!({"op": "lose_answer", "method": "DELETE", "suffix": "omni-seed-td-lost.iso", "times": 1}),
    );
    h.tear_down("td-lost");
    h.wait_released("td-lost").await;
    assert!(!h.volumes("local").contains("omni-seed-td-lost.iso"));
    assert_eq!(h.pve.count("DELETE", "omni-seed-td-lost.iso"), 2);
    let text = h.metrics.encode();
    assert!(
        !text.contains(r#"omni_proxmox_teardown_leftovers_total{kind="seed_iso"}"#),
        "{text}"
    );
    h.stop_controller().await;
}

/// pve-storage PVE/API2/Storage/Content.pm `delete` can keep failing (storage offline, a broken
/// mount, permissions). The VM is gone by then, so the teardown must finish: the request is
/// released, the leftover is counted in `omni_proxmox_teardown_leftovers_total{kind="seed_iso"}`,
/// and the `orphans` search (find_orphans) lists it since no live request will use it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_iso_that_cannot_be_deleted_does_not_hold_the_teardown() {
    let mut h = Harness::start("").await;
    let vmid = h.provisioned("td-seed").await;
    h.pve.control(
        json!({"op": "fail", "method": "DELETE", "suffix": "omni-seed-td-seed.iso",
                         "status": 500, "message": "storage 'local' is not online"}),
    );
    h.tear_down("td-seed");
    h.wait_released("td-seed").await;
    assert!(h.vm(vmid).is_null(), "VM deleted");
    assert!(
        h.volumes("local").contains("omni-seed-td-seed.iso"),
        "the seed ISO is left behind"
    );
    let text = h.metrics.encode();
    assert!(
        text.contains(r#"omni_proxmox_teardown_leftovers_total{kind="seed_iso"} 1"#),
        "{text}"
    );
    h.stop_controller().await;
}

/// The nasty case of a crash: a create sent just before the provider died, whose answer never
/// arrived, is applied by Proxmox later (qemu-server src/PVE/API2/Qemu.pm, `create_vm`, runs once the
/// API server has the request, whether or not the client still waits). The restarted provider made
/// the request's VM at the same VMID meanwhile; after that VM was deleted and the request released,
/// the late create makes it again, and unless someone looks for it, the VM, its disk and the set's
/// pool stay for ever. The topology loop looks for VMs of requests it released and deletes them,
/// with the usual ownership checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_a_late_create_makes_after_the_release_is_deleted() {
    use omni_infra_provider_proxmox::model::identity;
    let mut h = Harness::start("").await;
    let vmid = h.provisioned("td-late").await;
    // The provider restarts: the new process did not send the request's create itself, so it cannot
    // know that none is still on its way (the one that did send it would, and keeps no watch).
    h.run_topology(Duration::from_millis(200)).await;
    h.tear_down("td-late");
    h.wait_released("td-late").await;
    assert!(h.vm(vmid).is_null(), "VM deleted by the teardown");

    // The late create: the VM the provider's create call described, at the VMID it had chosen.
    let tags = format!(
        "{};{}",
        identity::provider_tag(PROVIDER),
        identity::request_tag("td-late").unwrap()
    );
    h.pve.control(
        json!({"op": "add_vm", "vmid": vmid, "name": "td-late", "node": "pve2",
        "config": {"memory": 2048, "tags": tags,
                   "description": identity::description_marker(PROVIDER, "td-late")}}),
    );
    h.wait_vm_deleted(vmid as u32, Duration::from_secs(20))
        .await;

    // A VM of someone else that happens to carry the name is not touched.
    h.pve.control(
        json!({"op": "add_vm", "vmid": 777, "name": "td-late", "node": "pve2",
        "config": {"memory": 1024}}),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!h.vm(777).is_null(), "a stranger's VM was deleted");
    h.stop_controller().await;
}

/// The set's last two machines torn down at once: each deprovision reads the listing before the other
/// VM is gone and sees it in the pool; if each left the pool to the other, the pool would stay for
/// ever. pve-manager PVE/API2/Pool.pm `delete_pool` refuses a pool that still has members, so
/// asking is safe whenever the other VMs seen in it are being torn down too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_set_pool_goes_when_its_last_machines_are_torn_down_at_once() {
    let mut h = Harness::start("").await;
    h.provisioned("pool-c").await;
    h.provisioned("pool-d").await;
    // Both teardowns read the listing before either VM is destroyed: the destroys wait for a
    // moment (Proxmox holds the first DELETE of each VM) while the other listing is read.
    for vm in h
        .vms_named("pool-c")
        .iter()
        .chain(h.vms_named("pool-d").iter())
    {
        let suffix = format!("/qemu/{}", vm["vmid"]);
        h.pve.control(
            json!({"op": "late_apply", "method": "DELETE", "suffix": suffix, "secs": 1.0}),
        );
    }
    h.tear_down("pool-c");
    h.tear_down("pool-d");
    h.wait_released("pool-c").await;
    h.wait_released("pool-d").await;
    assert!(
        h.pve
            .control(json!({"op": "pools"}))
            .get("teardown")
            .is_none(),
        "last machines gone, pool gone"
    );
    h.stop_controller().await;
}

/// A seed ISO delete that fails for a moment (a connection reset, a storage briefly offline) must not
/// leave the ISO for ever: the teardown goes on without it, by design, so the topology loop tries
/// again, for a while after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_iso_whose_delete_failed_once_is_deleted_later() {
    let mut h = Harness::start("").await;
    h.run_topology(Duration::from_millis(200)).await;
    h.provisioned("td-seed2").await;
    h.pve.control(
        json!({"op": "fail", "method": "DELETE", "suffix": "omni-seed-td-seed2.iso",
               "status": 500, "message": "storage 'local' is not online", "times": 2}),
    );
    h.tear_down("td-seed2");
    h.wait_released("td-seed2").await;
    testkit::until(
        Duration::from_secs(20),
        "the seed ISO to be deleted",
        || !h.volumes("local").contains("omni-seed-td-seed2.iso"),
    )
    .await;
    h.stop_controller().await;
}

/// Omni holds what a teardown hands it: its cleanup controller keeps a torn-down status until the
/// machine has left its cluster, and its config-patch controller keeps each patch request until the
/// patch is gone (siderolabs/omni `internal/backend/runtime/omni/controllers/omni/internal/cleanup`
/// `machine_request_cleanup.go`, `infra_provider_config_patch.go`). The teardown learns of each
/// release from its watch of our outputs and reads nothing twice, so machines with a topology
/// patch, torn down together while Omni drains each status for 2 s, cost 7 Omni calls each (the
/// patch request torn down and destroyed, the status torn down and destroyed, the provider state
/// destroyed, our finalizer removed from the request, read first), and none while the drains hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teardown_under_omni_drain_costs_few_omni_calls_per_machine() {
    use omni_infra_provider_proxmox::controller::topology;
    use omni_infra_provider_proxmox::omni::resources::CONFIG_PATCH_REQUEST;
    let mut h = Harness::start("").await;
    let ids: Vec<String> = (0..8).map(|i| format!("drain-{i}")).collect();
    for id in &ids {
        h.request(id, "drain", PINNED_PVE2);
    }
    for id in &ids {
        h.wait_stage(id, Stage::Provisioned).await;
    }
    topology::round(&h.context()).await.unwrap();
    for id in &ids {
        assert!(
            h.omni
                .state
                .list(&CONFIG_PATCH_REQUEST)
                .iter()
                .any(|p| { p.metadata.labels.get("omni.sidero.dev/machine-request") == Some(id) }),
            "{id} has its topology patch request"
        );
    }
    let drain = Duration::from_secs(2);
    h.omni.state.set_drain(drain);
    let before = h.omni.state.typed_calls();
    for id in &ids {
        h.tear_down(id);
    }
    let all_held = h
        .omni
        .state
        .wait_for(WAIT, |s| {
            ids.iter().all(|id| {
                s.get_raw(
                    &MACHINE_REQUEST_STATUS.namespace,
                    &MACHINE_REQUEST_STATUS.resource_type,
                    id,
                )
                .and_then(|r| r.metadata)
                .is_some_and(|m| m.phase == "tearingDown" && !m.finalizers.is_empty())
            })
        })
        .await;
    assert!(all_held, "every status held by Omni's cleanup controller");
    let held_from = h.omni.state.typed_calls();
    tokio::time::sleep(drain / 2).await;
    let while_held = calls_since(&h.omni.state.typed_calls(), &held_from);
    for id in &ids {
        h.wait_released(id).await;
    }
    // The reconcile that follows the request's deletion.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let by_kind = calls_since(&h.omni.state.typed_calls(), &before);
    let n = ids.len() as f64;
    let report: Vec<String> = by_kind
        .iter()
        .map(|((method, ty), c)| format!("{:.2} {method} {ty}", *c as f64 / n))
        .collect();
    let total: u64 = by_kind.values().sum();
    eprintln!("Omni calls per machine:\n{}", report.join("\n"));
    assert_eq!(
        while_held.values().sum::<u64>(),
        0,
        "no call while Omni holds every status: {while_held:?}"
    );
    assert!(
        total as f64 / n <= 5.0,
        "{:.2} Omni calls per machine:\n{}",
        total as f64 / n,
        report.join("\n")
    );
    h.stop_controller().await;
}

fn calls_since(
    now: &std::collections::BTreeMap<(String, String), u64>,
    before: &std::collections::BTreeMap<(String, String), u64>,
) -> std::collections::BTreeMap<(String, String), u64> {
    now.iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

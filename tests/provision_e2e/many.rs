//! Many requests at once: what each costs must not grow with how many there are.

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;

use crate::support::harness::Harness;

/// Twenty-four machines on one node, all worked on at once: they ask `/cluster/nextid` at the same
/// moment and get the same answer, the lowest free VMID. One takes it; each of the others must
/// check a VMID above it with Proxmox (`GET /cluster/nextid?vmid=`), and each must check a
/// different one. When they all checked the same one, one won and the rest checked the next,
/// up to n²/2 checks in all: these 24 machines made 93 VMID requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choosing_vmids_costs_the_same_however_many_requests_choose_at_once() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    h.stop_controller().await;
    h.concurrency = 32;
    h.start_controller();
    let class = "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve2\n";
    // The image first, so the others go together.
    h.request("many-first", "many", class);
    h.wait_stage("many-first", Stage::Provisioned).await;
    h.pve.control(serde_json::json!({"op": "reset_requests"}));
    let ids: Vec<String> = (0..24).map(|i| format!("many-{i:02}")).collect();
    for id in &ids {
        h.request(id, "many", class);
    }
    for id in &ids {
        h.wait_stage(id, Stage::Provisioned).await;
    }
    let asked = h.pve.count("GET", "/cluster/nextid");
    // nextid once each, and at most one check each.
    assert!(
        asked <= 2 * ids.len(),
        "{asked} VMID requests for {} machines",
        ids.len()
    );
}

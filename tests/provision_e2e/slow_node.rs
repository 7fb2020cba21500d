//! A slow Proxmox node slows only the machines on it.

use std::time::{Duration, Instant};

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::MACHINE_REQUEST_STATUS;
use serde_json::json;

use testkit::fakepve::three_node_scenario;
use testkit::harness::Harness;

fn pinned(node: &str) -> String {
    format!(
        "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'name == \"local-lvm\"'\nnode: {node}\n"
    )
}

/// pve1 answers every request about itself in 2 s. More machines are requested on it than the
/// controller works on at once (4 per node by default), then two on the other nodes: those must
/// not wait for pve1's. When the limit was one pool of 4 reconciles for all nodes, the pve1
/// machines held all of them (each waits on pve1 for ten answers of 2 s), and the others were
/// provisioned only after 20 s or more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_answering_slowly_does_not_hold_up_machines_on_other_nodes() {
    let mut scenario = three_node_scenario();
    // Time scale 1: fakepve's latencies and task durations are real seconds (at 0 they vanish).
    scenario["node_latency"] = json!({"pve1": 2.0});
    scenario["download_secs"] = json!(0.2);
    let h = Harness::start_scaled(scenario, 1.0, "").await;
    for i in 0..6 {
        h.request(&format!("on-slow-{i}"), "slow", &pinned("pve1"));
    }
    // Every reconcile for pve1 is now waiting on pve1.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    h.request("beside-pve2", "fast", &pinned("pve2"));
    h.request("beside-pve3", "fast", &pinned("pve3"));
    let done = h
        .omni
        .state
        .wait_for(Duration::from_secs(8), |s| {
            ["beside-pve2", "beside-pve3"].iter().all(|id| {
                s.get(&MACHINE_REQUEST_STATUS, id)
                    .is_some_and(|st| st.spec.stage == Stage::Provisioned as i32)
            })
        })
        .await;
    assert!(
        done,
        "machines on healthy nodes were held up by the slow node: after {:?}, {:?} / {:?}",
        started.elapsed(),
        h.status("beside-pve2").map(|s| s.spec.status),
        h.status("beside-pve3").map(|s| s.spec.status),
    );
    // The slow node's machines are still on their way: its answers are the slow part.
    assert!(
        h.status("on-slow-0")
            .is_none_or(|s| s.spec.stage != Stage::Provisioned as i32),
        "pve1 was not slow"
    );
}

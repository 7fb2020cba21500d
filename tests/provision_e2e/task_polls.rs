//! Waiting for Proxmox tasks costs polls in proportion to how badly the wait guesses their end.

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use serde_json::json;

use testkit::fakepve::three_node_scenario;
use testkit::harness::Harness;

const ON_PVE2: &str = "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve2\nip_discovery_timeout: 0\n";

/// Tasks that take time (an upload copied in 0.2 s, a create and a start in 0.4 s each, as a small
/// real node does them; pve-manager answers `GET /nodes/{node}/tasks/{upid}/status` with `running`
/// until the worker ends). Polled from 50 ms backing off, each costs five or six polls, every
/// machine again. Timed by what the same kind took on the node before, the second machine's three
/// tasks cost no more than three polls each, and the first poll comes near the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_a_kind_seen_before_are_polled_near_their_usual_end() {
    let mut scenario = three_node_scenario();
    scenario["download_secs"] = json!(0.2);
    scenario["task_secs"] = json!({"imgcopy": 0.2, "qmcreate": 0.4, "qmstart": 0.4});
    let mut h = Harness::start_scaled(scenario, 1.0, "").await;
    h.request("polls-1", "polls", ON_PVE2);
    h.wait_stage("polls-1", Stage::Provisioned).await;
    let first = h.pve.count("GET", "/status");
    h.pve.control(json!({"op": "reset_requests"}));
    h.request("polls-2", "polls", ON_PVE2);
    h.wait_stage("polls-2", Stage::Provisioned).await;
    let second = h.pve.count("GET", "/status");
    assert!(
        second <= 9,
        "{second} task polls for upload, create and start (first machine: {first})"
    );
    assert!(
        second < first,
        "{second} polls, not fewer than the first machine's {first}"
    );
    h.stop_controller().await;
}

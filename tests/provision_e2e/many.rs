//! Many requests at once: what each costs must not grow with how many there are.

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use serde_json::json;

use testkit::fakepve::{TOKEN_ID, readme_role, three_node_scenario};
use testkit::harness::Harness;

const CLASS: &str =
    "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve2\n";

/// Sixteen machines on one node, all worked on at once after a first one brought the image;
/// returns (VMID requests, creates) of the sixteen.
async fn burst(h: &mut Harness) -> (usize, usize) {
    h.stop_controller().await;
    h.concurrency = 32;
    h.start_controller();
    h.request("many-first", "many", CLASS);
    h.wait_stage("many-first", Stage::Provisioned).await;
    h.pve.control(json!({"op": "reset_requests"}));
    let ids: Vec<String> = (0..16).map(|i| format!("many-{i:02}")).collect();
    for id in &ids {
        h.request(id, "many", CLASS);
    }
    for id in &ids {
        h.wait_stage(id, Stage::Provisioned).await;
    }
    for id in &ids {
        assert_eq!(h.vms_named(id).len(), 1, "{id}");
    }
    (
        h.pve.count("GET", "/cluster/nextid"),
        h.pve.count("POST", "/qemu"),
    )
}

/// A token that sees every guest chooses from the listing: requests choosing at once step over each
/// other's VMIDs (and those just made) in this process, so none is refused and none asks Proxmox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vmids_chosen_at_once_from_the_listing_never_collide() {
    let mut h = Harness::start("").await;
    let (asked, creates) = burst(&mut h).await;
    assert_eq!(asked, 0, "no VMID requests");
    assert_eq!(creates, 16, "no create refused");
}

/// A token that cannot see every guest asks `/cluster/nextid`: requests asking at the same moment get
/// the same answer, the lowest free VMID. One takes it; each of the others must check a VMID above it
/// with Proxmox (`GET /cluster/nextid?vmid=`), and each must check a different one. When they all
/// checked the same one, one won and the rest checked the next, up to n²/2 checks in all (24
/// machines made 93 VMID requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choosing_vmids_by_nextid_costs_the_same_however_many_requests_choose_at_once() {
    let mut scenario = three_node_scenario();
    let mut privs = readme_role();
    privs.retain(|p| p != "VM.Audit");
    // VM.Audit only on the set's pool: the listing shows the set's VMs, not every guest.
    scenario["acl"] = json!({ TOKEN_ID: [["/", privs], ["/pool/many", ["VM.Audit"]]] });
    let mut h = Harness::start_with(scenario, "").await;
    let (asked, creates) = burst(&mut h).await;
    // nextid once each, and at most one check each.
    assert!(asked <= 2 * 16, "{asked} VMID requests for 16 machines");
    assert!(asked >= 16, "{asked}: every machine asked");
    assert_eq!(creates, 16);
}

/// Six new machines of one set at once, the image already on every node: the set's pool is made by
/// one `POST /pools` (pve-manager PVE/API2/Pool.pm `create_pool` refuses a second with "already
/// exists", a request wasted per machine), and the cluster is listed once for the burst, not once
/// per machine; in all at most 8.5 requests per machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_one_set_makes_its_pool_once_and_lists_the_cluster_once() {
    let mut h = Harness::start("").await;
    let spread = "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'name == \"local-lvm\"'\nip_discovery_timeout: 0\n";
    for node in ["pve1", "pve2", "pve3"] {
        let id = format!("warm-{node}");
        h.request(&id, "warm", &format!("{spread}node: {node}\n"));
        h.wait_stage(&id, Stage::Provisioned).await;
    }
    h.pve.control(json!({"op": "reset_requests"}));
    let ids: Vec<String> = (0..6).map(|i| format!("burst-{i}")).collect();
    for id in &ids {
        h.request(id, "burst", spread);
    }
    for id in &ids {
        h.wait_stage(id, Stage::Provisioned).await;
    }
    let requests = h.pve.requests();
    let pool_creates = h.pve.count("POST", "/pools");
    let listings = h.pve.count("GET", "/cluster/resources");
    eprintln!(
        "burst of 6: {} requests, {pool_creates} pool creates, {listings} listings: {requests:?}",
        requests.len()
    );
    assert_eq!(pool_creates, 1, "{requests:?}");
    assert_eq!(listings, 1, "{requests:?}");
    assert!(
        requests.len() * 2 <= 17 * ids.len(),
        "{} requests: {requests:?}",
        requests.len()
    );
    h.stop_controller().await;
}

//! Provisioning end to end: the in-memory Omni over real gRPC, fakepve over real HTTPS, and the real
//! controller with the real pipeline in between.

mod clone;
mod hostile;
mod many;
mod restart;
mod slow_node;
mod status;
mod task_polls;
mod waiting;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::{
    MACHINE_REQUEST_STATUS, label, provider_machine,
};
use serde_json::json;
use testkit::harness::Harness;

pub const PINNED_PVE2: &str = "cores: 2\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve2\ntags: [talos]\n";
pub const SPREAD: &str = "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'storageType == \"lvmthin\"'\nip_discovery_timeout: 0\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_class_lands_on_its_node_fully_configured_and_running() {
    let mut h = Harness::start("").await;
    h.request("workers-abc123", "workers", PINNED_PVE2);
    let status = h.wait_stage("workers-abc123", Stage::Provisioned).await;

    let vms = h.vms_named("workers-abc123");
    assert_eq!(vms.len(), 1, "{vms:?}");
    let vm = &vms[0];
    assert_eq!(vm["node"], json!("pve2"));
    assert_eq!(vm["status"], json!("running"));
    let config = &vm["config"];
    assert_eq!(config["cores"].to_string().trim_matches('"'), "2");
    assert_eq!(config["memory"].to_string().trim_matches('"'), "2048");
    let tags = config["tags"].as_str().unwrap();
    for tag in ["machine-request.workers", "omni-provider.proxmox", "talos"] {
        assert!(tags.contains(tag), "{tags}");
    }
    assert!(
        config["scsi0"].as_str().unwrap().starts_with("local-lvm:"),
        "{config}"
    );
    assert!(
        config["ide2"].as_str().unwrap().contains("media=cdrom"),
        "Talos ISO: {config}"
    );
    let seed = config["ide3"].as_str().unwrap();
    assert!(
        seed.contains("omni-seed-workers-abc123.iso"),
        "seed: {seed}"
    );
    let description = config["description"].as_str().unwrap();
    assert!(description.contains("workers-abc123") && description.contains("proxmox"));
    let smbios = config["smbios1"].as_str().unwrap();
    assert!(!status.spec.id.is_empty());
    assert!(
        smbios.contains(&status.spec.id),
        "status id {} vs {smbios}",
        status.spec.id
    );

    assert_eq!(
        status
            .metadata
            .labels
            .get(label::MACHINE_REQUEST_SET)
            .map(String::as_str),
        Some("workers")
    );
    let vmid = vm["vmid"].as_u64().unwrap().to_string();
    assert_eq!(status.metadata.labels.get(label::INFRA_ID), Some(&vmid));
    assert!(
        status.spec.status.contains("pve2"),
        "{}",
        status.spec.status
    );

    let state = h.machine_state("workers-abc123");
    assert_eq!(state.spec.node, "pve2");
    assert_eq!(state.spec.step, "discover_ip");
    assert!(
        state.spec.addresses.iter().any(|a| a.starts_with("10.99.")),
        "{:?}",
        state.spec.addresses
    );
    // The Talos ISO was downloaded once into ISO storage, and the seed uploaded beside it.
    let volumes = h
        .pve
        .control(json!({"op": "storage_volumes", "storage": "local"}));
    let isos: Vec<&str> = volumes
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(
        isos.iter()
            .filter(|v| v.starts_with("iso/") && !v.contains("omni-seed"))
            .count(),
        1,
        "{isos:?}"
    );
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_requests_of_one_set_spread_two_per_node() {
    let mut h = Harness::start("").await;
    for i in 0..6 {
        h.request(&format!("spread-{i}"), "spread", SPREAD);
    }
    for i in 0..6 {
        h.wait_stage(&format!("spread-{i}"), Stage::Provisioned)
            .await;
    }
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..6 {
        let vms = h.vms_named(&format!("spread-{i}"));
        assert_eq!(vms.len(), 1);
        *per_node
            .entry(vms[0]["node"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(
        per_node,
        BTreeMap::from([("pve1".into(), 2), ("pve2".into(), 2), ("pve3".into(), 2)])
    );
    // Concurrent requests for the same image downloaded it once per ISO storage.
    let downloads = h.pve.count("POST", "/download-url");
    assert!(
        downloads <= 3,
        "one download per node's local ISO storage at most: {downloads}"
    );
    h.stop_controller().await;
}

/// `ha.failback` exists only from Proxmox VE 9 (pve-ha-manager src/PVE/HA/Resources.pm, 5.0.2); PVE 8
/// answers the HA registration with 400 after the VM was made and started. Refused up front, naming
/// the key and the release, with nothing created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_failback_on_pve_8_fails_before_anything_is_created() {
    let mut scenario = testkit::fakepve::three_node_scenario();
    scenario["pve_version"] = json!("8.4.1");
    let mut h = Harness::start_with(scenario, "").await;
    h.request(
        "failback-8",
        "ha",
        "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\nha:\n  state: started\n  failback: true\n",
    );
    let status = h.wait_stage("failback-8", Stage::Failed).await;
    let error = status.spec.error;
    assert!(error.contains("ha.failback"), "{error}");
    assert!(error.contains("8.4.1"), "{error}");
    assert!(h.vms_named("failback-8").is_empty());
    let writes = h.pve.requests().iter().filter(|(m, _)| m != "GET").count();
    assert_eq!(writes, 0, "nothing is written to Proxmox");
    h.stop_controller().await;
}

/// Provider data precedence is the class, then the node's override under `nodes:`, then `defaults:`
/// (README). Placement must follow it like every later step: a class that sets `storage_selector`
/// outranks `nodes.pve1.storage_selector`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_class_storage_selector_outranks_a_node_override_in_placement() {
    let mut h =
        Harness::start("nodes:\n  pve1:\n    storage_selector: name == \"no-such-storage\"\n")
            .await;
    h.request(
        "outranked",
        "precedence",
        "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\n",
    );
    h.wait_stage("outranked", Stage::Provisioned).await;
    let vms = h.vms_named("outranked");
    assert_eq!(vms.len(), 1, "{vms:?}");
    let disk = vms[0]["config"]["scsi0"].as_str().unwrap_or_default();
    assert!(disk.starts_with("local-lvm:"), "{disk}");
    h.stop_controller().await;
}

/// A request with no VMID recorded cannot have a VM yet (ours is recorded before the create call, the
/// official provider records its own), so `create_vm` adopts from the listing placement read moments
/// before in the same reconcile: one `/cluster/resources` read per machine, not two. With a VMID
/// recorded (a restart after the create), the listing is read fresh to find that VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_machine_reads_the_cluster_listing_once() {
    let mut h = Harness::start("").await;
    h.request(
        "one-listing",
        "listing",
        "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nip_discovery_timeout: 0\n",
    );
    h.wait_stage("one-listing", Stage::Provisioned).await;
    assert_eq!(h.pve.count("GET", "/cluster/resources"), 1);
    h.stop_controller().await;
}

/// The set's pool deleted by hand after this process made it: pve-access-control
/// src/PVE/RPCEnvironment.pm `check_pool_exist` makes qemu-server's `create_vm` refuse the next VM
/// of the set with 403 "Permission check failed (pool '<pool>' does not exist)" before anything is
/// made. The process forgets the pool, makes it again and creates the VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_pool_deleted_by_hand_is_made_again() {
    let mut h = Harness::start("").await;
    h.request("gone-0", "gonepool", SPREAD);
    h.wait_stage("gone-0", Stage::Provisioned).await;
    let vmid = h.vms_named("gone-0")[0]["vmid"].to_string();
    let out = h
        .pve
        .raw(
            "PUT",
            "/pools",
            &[("poolid", "gonepool"), ("vms", &vmid), ("delete", "1")],
        )
        .await;
    assert_eq!(out.0, 200, "{out:?}");
    let out = h
        .pve
        .raw("DELETE", "/pools", &[("poolid", "gonepool")])
        .await;
    assert_eq!(out.0, 200, "{out:?}");

    h.request("gone-1", "gonepool", SPREAD);
    h.wait_stage("gone-1", Stage::Provisioned).await;
    let pools = h.pve.control(json!({"op": "pools"}));
    let vmid1 = h.vms_named("gone-1")[0]["vmid"].clone();
    assert_eq!(pools["gonepool"], json!([vmid1]), "{pools}");
    h.stop_controller().await;
}

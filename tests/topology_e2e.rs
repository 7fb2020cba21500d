//! Topology labels end to end: the provider writes each machine's Kubernetes zone (its Proxmox node)
//! and region (the Proxmox cluster name) as an Omni ConfigPatchRequest, follows the VM when it
//! migrates, and the patch goes with the request.
//!
//! What Omni does with the patch request is its ConfigPatchRequestController's
//! (internal/backend/runtime/omni/controllers/omni/infra_provider_config_patch.go): it needs the
//! `omni.sidero.dev/machine-request` label and copies the patch to the machine the request's status
//! names. The labels and the ID shape follow the Go library's `provision.Context.CreateConfigPatch`
//! (client/pkg/infra/provision/context.go).

use std::time::Duration;

use omni_infra_provider_proxmox::controller::topology::{self, Change, PATCH_PREFIX, patch_yaml};
use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::{CONFIG_PATCH_REQUEST, MACHINE_REQUEST, label};
use serde_json::json;
use testkit::fakepve::three_node_scenario;
use testkit::harness::{Harness, PROVIDER, WAIT};

const ROUND: Duration = Duration::from_millis(200);

fn class(node: &str, extra: &str) -> String {
    format!(
        "cores: 2\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'name == \"local-lvm\"'\nnode: {node}\nip_discovery_timeout: 0\n{extra}"
    )
}

/// What the topology tests read from a harness.
trait TopologyPatch {
    /// The data of the request's topology patch once it is `want` (None: once it is gone).
    async fn patch_becomes(&self, id: &str, want: Option<&str>) -> bool;
}

impl TopologyPatch for Harness {
    async fn patch_becomes(&self, id: &str, want: Option<&str>) -> bool {
        let patch_id = format!("{PATCH_PREFIX}{id}");
        self.omni
            .state
            .wait_for(WAIT, |s| {
                let patch = s.get(&CONFIG_PATCH_REQUEST, &patch_id);
                patch.map(|p| p.spec.data).as_deref() == want
            })
            .await
    }
}

#[tokio::test]
async fn zone_and_region_follow_the_vm_and_go_with_the_request() {
    let mut scenario = three_node_scenario();
    scenario["cluster_name"] = json!("homelab");
    let mut h = Harness::start_with(scenario, "").await;
    h.run_topology(ROUND).await;
    h.request("topo-1", "topology", &class("pve1", ""));
    h.wait_stage("topo-1", Stage::Provisioned).await;
    let on_pve1 = patch_yaml("pve1", Some("homelab"));
    assert!(
        h.patch_becomes("topo-1", Some(&on_pve1)).await,
        "patch with zone pve1 and region homelab"
    );
    let patch = h
        .omni
        .state
        .get(&CONFIG_PATCH_REQUEST, "100-topology-topo-1")
        .unwrap();
    let labels = &patch.metadata.labels;
    assert_eq!(
        labels.get(label::INFRA_PROVIDER_ID).map(String::as_str),
        Some(PROVIDER)
    );
    assert_eq!(
        labels.get(label::MACHINE_REQUEST).map(String::as_str),
        Some("topo-1")
    );

    // Migrated by hand (or by the HA manager): the zone follows within a round.
    let vmid = h.vms_named("topo-1")[0]["vmid"].as_u64().unwrap();
    h.pve
        .control(json!({"op": "migrate", "vmid": vmid, "target": "pve3"}));
    let on_pve3 = patch_yaml("pve3", Some("homelab"));
    assert!(
        h.patch_becomes("topo-1", Some(&on_pve3)).await,
        "zone updated to pve3"
    );

    // Torn down: the patch goes with the request (first, as the Go library does).
    assert!(h.omni.state.teardown(&MACHINE_REQUEST, "topo-1"));
    h.wait_released("topo-1").await;
    assert!(h.patch_becomes("topo-1", None).await, "patch removed");
}

#[tokio::test]
async fn labels_can_be_turned_off_and_a_standalone_node_has_no_region() {
    let mut scenario = three_node_scenario();
    scenario["standalone"] = json!(true);
    let mut h = Harness::start_with(scenario, "").await;
    h.run_topology(ROUND).await;
    h.request(
        "topo-off",
        "topology",
        &class("pve2", "topology_labels: false\n"),
    );
    h.request("topo-solo", "topology", &class("pve2", ""));
    h.wait_stage("topo-off", Stage::Provisioned).await;
    h.wait_stage("topo-solo", Stage::Provisioned).await;
    // pve-manager's /cluster/status has no cluster entry on a standalone node: zone only.
    assert!(
        h.patch_becomes("topo-solo", Some(&patch_yaml("pve2", None)))
            .await
    );
    // Several rounds later still nothing for the class that turned the labels off.
    tokio::time::sleep(ROUND * 5).await;
    assert!(
        h.omni
            .state
            .get(&CONFIG_PATCH_REQUEST, "100-topology-topo-off")
            .is_none()
    );

    // A request removed by force (no teardown ran): its patch request is not left behind.
    assert!(h.omni.state.remove(&MACHINE_REQUEST, "topo-solo"));
    assert!(
        h.patch_becomes("topo-solo", None).await,
        "leftover patch removed"
    );
}

/// pve-manager PVE/API2/Cluster.pm `get_status` checks `Sys.Audit` on `/`; a token with narrower ACLs
/// gets 403 there. The machines still get their zone, without the region, and the rounds go on.
#[tokio::test]
async fn without_sys_audit_on_root_the_zone_comes_alone() {
    let mut h = Harness::start("").await;
    h.pve.control(
        json!({"op": "fail", "method": "GET", "suffix": "/cluster/status",
        "status": 403, "message": "Permission check failed (/, Sys.Audit)"}),
    );
    h.run_topology(ROUND).await;
    h.request("topo-acl", "topology", &class("pve1", ""));
    h.wait_stage("topo-acl", Stage::Provisioned).await;
    assert!(
        h.patch_becomes("topo-acl", Some(&patch_yaml("pve1", None)))
            .await
    );
    let vmid = h.vms_named("topo-acl")[0]["vmid"].as_u64().unwrap();
    h.pve
        .control(json!({"op": "migrate", "vmid": vmid, "target": "pve2"}));
    assert!(
        h.patch_becomes("topo-acl", Some(&patch_yaml("pve2", None)))
            .await,
        "rounds still follow migrations"
    );
}

/// A round lists the requests, then writes the patches that changed; a teardown that begins in
/// between removes the request's patch, and the round's write must not make it again (Omni would
/// derive a ConfigPatch for a machine on its way out, and nothing would remove the request's patch).
#[tokio::test]
async fn a_round_older_than_a_teardown_does_not_write_the_patch_again() {
    let mut h = Harness::start("").await;
    h.request("topo-race", "topology", &class("pve1", ""));
    h.wait_stage("topo-race", Stage::Provisioned).await;
    let patch_id = format!("{PATCH_PREFIX}topo-race");
    let written = h
        .omni
        .state
        .wait_for(WAIT, |s| s.get(&CONFIG_PATCH_REQUEST, &patch_id).is_some())
        .await;
    assert!(
        written,
        "the patch is written when the machine is provisioned"
    );
    h.stop_controller().await;
    // The teardown began after the round's listing, and removed the patch.
    assert!(h.omni.state.teardown(&MACHINE_REQUEST, "topo-race"));
    assert!(h.omni.state.remove(&CONFIG_PATCH_REQUEST, &patch_id));
    // The round goes on with what it listed: the request live, its zone moved.
    let stale = Change::Write {
        request_id: "topo-race".into(),
        yaml: patch_yaml("pve2", None),
    };
    topology::apply(&h.context(), &stale).await.unwrap();
    assert!(
        h.omni.state.get(&CONFIG_PATCH_REQUEST, &patch_id).is_none(),
        "the patch was written again for a request being torn down"
    );
}

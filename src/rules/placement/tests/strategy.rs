//! How eligible nodes are ranked, and how reservations keep concurrent requests of one set apart.

use super::*;
use crate::rules::provider_data::PlacementStrategy;
use proptest::prelude::*;

#[test]
fn prefers_fewest_of_the_set_then_most_memory_then_name() {
    let sel = any_storage();
    let empty = BTreeMap::new();
    let tagged = |n: &str| listed_vm(n, "machine-request.workers", 0, 0);
    let mut a = node("pve1", 64);
    a.vms.push(tagged("w1"));
    let b = node("pve2", 16);
    let c = node("pve3", 32);
    let placed = pick(
        &[a.clone(), b.clone(), c.clone()],
        &request(&sel, &empty),
        &Reservations::default(),
    )
    .unwrap();
    assert_eq!(placed.node.as_str(), "pve3");
    assert!(
        placed
            .reason
            .to_string()
            .starts_with("automatically picked node")
    );
    let equal = [node("pveb", 8), node("pvea", 8)];
    assert_eq!(
        pick(&equal, &request(&sel, &empty), &Reservations::default())
            .unwrap()
            .node
            .as_str(),
        "pvea"
    );
    let binpack = with(&request(&sel, &empty), |d| {
        d.placement_strategy = PlacementStrategy::Binpack
    });
    assert_eq!(
        pick(
            &[a.clone(), b.clone(), c.clone()],
            &binpack,
            &Reservations::default()
        )
        .unwrap()
        .node
        .as_str(),
        "pve2"
    );
    let fewer = with(&request(&sel, &empty), |d| {
        d.placement_strategy = PlacementStrategy::FewerVms
    });
    assert_eq!(
        pick(&[a, b, c], &fewer, &Reservations::default())
            .unwrap()
            .node
            .as_str(),
        "pve3"
    );
}

#[test]
fn reservations_count_until_the_vm_appears() {
    let sel = any_storage();
    let empty = BTreeMap::new();
    let mut reservations = Reservations::default();
    reserve(
        &mut reservations,
        "other",
        &node_name("pve1"),
        Some("workers"),
        4096,
        2,
    );
    let nodes = [node("pve1", 64), node("pve2", 32)];
    assert_eq!(
        pick(&nodes, &request(&sel, &empty), &reservations)
            .unwrap()
            .node
            .as_str(),
        "pve2"
    );
    // Once the VM is visible with its tag, the reservation is not counted twice.
    let mut with_vm = nodes.clone();
    with_vm[0]
        .vms
        .push(listed_vm("other", "machine-request.workers", 0, 0));
    with_vm[1]
        .vms
        .push(listed_vm("x", "machine-request.workers", 0, 0));
    assert_eq!(
        pick(&with_vm, &request(&sel, &empty), &reservations)
            .unwrap()
            .node
            .as_str(),
        "pve1"
    );
    assert!(reservations.release("other").is_some());
    assert_eq!(reservations, Reservations::default());
}

proptest! {
    #[test]
    fn a_set_spreads_evenly_over_equal_nodes(nodes_n in 1usize..5, per_node in 1usize..4, memory in 2048u64..8192) {
        let sel = any_storage();
        let empty = BTreeMap::new();
        let nodes: Vec<NodeSnapshot> = (0..nodes_n).map(|i| node(&format!("pve{i}"), 256)).collect();
        let mut reservations = Reservations::default();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for r in 0..nodes_n * per_node {
            let id = format!("req-{r}");
            let req = PlacementRequest { request_id: &id, ..with(&request(&sel, &empty), |d| d.memory_mb = memory) };
            *counts.entry(place(&nodes, &req, &mut reservations)).or_default() += 1;
        }
        prop_assert_eq!(counts.len(), nodes_n);
        prop_assert!(counts.values().all(|c| *c == per_node), "{:?}", counts);
    }
}

#[test]
fn six_requests_of_one_set_spread_two_per_node() {
    let sel = any_storage();
    let empty = BTreeMap::new();
    let nodes = [node("pve1", 64), node("pve2", 64), node("pve3", 64)];
    let mut reservations = Reservations::default();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in 0..6 {
        let id = format!("req-{r}");
        let req = PlacementRequest {
            request_id: &id,
            ..request(&sel, &empty)
        };
        *counts
            .entry(place(&nodes, &req, &mut reservations))
            .or_default() += 1;
    }
    assert_eq!(counts.into_values().collect::<Vec<_>>(), vec![2, 2, 2]);
}

fn ha_settings(nodes: &[&str], strict: bool) -> crate::rules::provider_data::HaSettings {
    crate::rules::provider_data::HaSettings {
        node_affinity_nodes: nodes
            .iter()
            .map(|n| crate::proxmox::types::NodeName::parse(n).unwrap())
            .collect(),
        node_affinity_strict: strict,
        ..Default::default()
    }
}

#[test]
fn node_affinity_nodes_come_first_and_strict_ones_are_the_only_ones() {
    let sel = any_storage();
    let empty = BTreeMap::new();
    // pve1 has the most free memory, so without HA rules it would win.
    let nodes = [node("pve1", 128), node("pve2", 64), node("pve3", 32)];
    let loose = ha_settings(&["pve3"], false);
    let req = with(&request(&sel, &empty), |d| d.ha = Some(loose));
    assert_eq!(
        pick(&nodes, &req, &Reservations::default())
            .unwrap()
            .node
            .as_str(),
        "pve3"
    );
    // pve3 full: a non-strict rule lets the VM go elsewhere...
    let nodes_full = [node("pve1", 128), node("pve2", 64), node("pve3", 2)];
    assert_eq!(
        pick(&nodes_full, &req, &Reservations::default())
            .unwrap()
            .node
            .as_str(),
        "pve1"
    );
    // ...a strict one does not, and says why.
    let strict = ha_settings(&["pve3"], true);
    let req = with(&request(&sel, &empty), |d| d.ha = Some(strict));
    let err = pick(&nodes_full, &req, &Reservations::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("pve1: not in ha.node_affinity_nodes"),
        "{text}"
    );
}

#[test]
fn negative_resource_affinity_avoids_nodes_holding_the_set_whatever_the_strategy() {
    let sel = any_storage();
    let empty = BTreeMap::new();
    let spread = crate::rules::provider_data::HaSettings {
        resource_affinity: Some(crate::rules::provider_data::ResourceAffinity::Negative),
        ..Default::default()
    };
    let nodes = [node("pve1", 64), node("pve2", 64), node("pve3", 64)];
    let mut reservations = Reservations::default();
    let mut chosen = Vec::new();
    for r in 0..3 {
        let id = format!("req-{r}");
        // binpack alone would put all three on one node.
        let req = PlacementRequest {
            request_id: &id,
            ..with(&request(&sel, &empty), |d| {
                d.placement_strategy = PlacementStrategy::Binpack;
                d.ha = Some(spread.clone());
            })
        };
        chosen.push(place(&nodes, &req, &mut reservations));
    }
    chosen.sort();
    assert_eq!(chosen, ["pve1", "pve2", "pve3"]);
}

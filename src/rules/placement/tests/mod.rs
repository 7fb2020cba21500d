//! Placement against hand-built clusters: the per-node verdicts, the strategies, reservations.
//! Each file takes one concern; the cluster and request builders they share are here.

use std::collections::BTreeMap;

use super::*;
use crate::model::{ClusterSnapshot, GIB, NodeSnapshot, StorageSnapshot};
use crate::proxmox::property::{NodeName, StorageId};
use crate::rules::provider_data::keys::Keys;
use crate::rules::provider_data::{ConfigLayers, ProviderData};
use crate::rules::storage_selector::StorageSelector;

mod capacity;
mod pinned;
mod strategy;
mod template;
mod verdict;

/// Reserves `memory_mb` and `vcpus` on `node` for `request_id` of `set_id`.
fn reserve(
    reservations: &mut Reservations,
    request_id: &str,
    node: &NodeName,
    set_id: Option<&str>,
    memory_mb: u64,
    vcpus: u64,
) {
    let reservation = Reservation {
        node: node.clone(),
        set_id: set_id.map(str::to_string),
        memory_bytes: memory_mb * crate::model::MIB,
        vcpus,
    };
    reservations.reserve(request_id, reservation);
}

/// Places `request` and reserves what it asks for on the node chosen, as the pipeline does after a
/// pick; the node's name.
fn place(
    nodes: &[NodeSnapshot],
    request: &PlacementRequest<'_>,
    reservations: &mut Reservations,
) -> String {
    let placed = pick(nodes, request, reservations).unwrap();
    let (memory_mb, vcpus) = (request.data.memory_mb, request.data.vcpus());
    reserve(
        reservations,
        request.request_id,
        &placed.node,
        request.set_id,
        memory_mb,
        vcpus,
    );
    placed.node.to_string()
}

fn pick(
    nodes: &[NodeSnapshot],
    request: &PlacementRequest<'_>,
    reservations: &Reservations,
) -> Result<Placement, PlacementError> {
    super::pick(&cluster(nodes.to_vec()), request, reservations)
}

/// The cluster of `nodes`, sorted by name as a listing gives them.
fn cluster(mut nodes: Vec<NodeSnapshot>) -> ClusterSnapshot {
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    ClusterSnapshot { nodes }
}

fn node_name(name: &str) -> NodeName {
    NodeName::new(name).unwrap()
}

fn sid(name: &str) -> StorageId {
    StorageId::new(name).unwrap()
}

fn storage(name: &str, available_gib: u64) -> StorageSnapshot {
    StorageSnapshot {
        name: sid(name),
        storage_type: "lvmthin".into(),
        content: vec!["images".into(), "rootdir".into()],
        active: true,
        shared: false,
        available: available_gib * GIB,
    }
}

/// A VM as the listing shows it on a node.
fn listed_vm(name: &str, tags: &str, cpus: u64, memory: u64) -> crate::proxmox::types::VmResource {
    let vm = serde_json::json!({"vmid": 100, "node": "pve1", "name": name, "tags": tags,
        "maxcpu": cpus, "maxmem": memory});
    serde_json::from_value(vm).unwrap()
}

fn node(name: &str, free_gib: u64) -> NodeSnapshot {
    NodeSnapshot {
        name: node_name(name),
        online: true,
        memory_used: 0,
        memory_max: free_gib * GIB,
        cpus: 64,
        vms: vec![],
        storages: vec![
            StorageSnapshot {
                content: vec!["iso".into()],
                ..storage("local", 50)
            },
            storage("local-lvm", 100),
        ],
    }
}

/// A request of set `workers` for 2 vCPUs, 4096 MB and a 20 GB disk on the storage `selector`
/// picks.
fn request<'a>(
    selector: &StorageSelector,
    empty: &'a BTreeMap<String, StorageSelector>,
) -> PlacementRequest<'a> {
    let yaml = "cores: 2\nmemory: 4096\ndisk_size: 20\nstorage_selector: 'true'";
    let data = ConfigLayers::default().resolve(yaml, None).unwrap();
    let req = PlacementRequest {
        request_id: "req-1",
        data: Box::leak(Box::new(data)),
        node_selectors: empty,
        set_id: Some("workers"),
        limits: PlacementLimits::default(),
        clone: None,
    };
    selecting(&req, selector)
}

/// `req` with its storage chosen by `selector`.
fn selecting<'a>(req: &PlacementRequest<'a>, selector: &StorageSelector) -> PlacementRequest<'a> {
    let storage_selector = selector.clone();
    let data = ProviderData {
        storage_selector,
        ..req.data.clone()
    };
    PlacementRequest {
        data: Box::leak(Box::new(data)),
        ..req.clone()
    }
}

/// `req` with its provider data changed by `change` (leaked: a test's few requests live as long as
/// the test).
fn with<'a>(req: &PlacementRequest<'a>, change: impl FnOnce(&mut Keys)) -> PlacementRequest<'a> {
    let mut data = req.data.clone();
    change(&mut data.keys);
    PlacementRequest {
        data: Box::leak(Box::new(data)),
        ..req.clone()
    }
}

fn any_storage() -> StorageSelector {
    StorageSelector::new("true").unwrap()
}

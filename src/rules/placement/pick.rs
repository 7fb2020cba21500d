//! The decision for a request and the errors it ends in. A pinned node is the user's choice and is
//! checked only for what would certainly fail there; otherwise every node gets its verdict and the
//! strategy ranks the eligible ones. The errors say whether waiting may help, so the pipeline knows
//! whether to retry or to report a class someone must fix.
//!
//! Each strategy ranking the eligible nodes is a total order ending in the node name, so the
//! same cluster and reservations always give the same node, and the set's VMs (listed by their tag
//! or still in flight) are counted the same way the tag is written.

use super::capacity::cpus_fit;
use super::{HaPreference, LeftOut, PlacementRequest, Reservations, disk_verdict, node_verdict};
use crate::model::{ClusterSnapshot, GIB, NodeSnapshot, StorageSnapshot};
use crate::proxmox::property::{NodeName, StorageId};
use crate::rules::provider_data::PlacementStrategy;
use crate::rules::storage_selector::SelectorError;

/// The decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub node: NodeName,
    pub storage: StorageId,
    /// `boot: clone`: the VMID of the copy of the template to clone.
    pub template: Option<u32>,
    pub reason: PlacementReason,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlacementReason {
    /// `node` was set in the provider data.
    #[error("using configured node")]
    Pinned,
    /// Chosen among `candidates` eligible nodes.
    #[error("automatically picked node: {same_set_vms} VM(s) of the same set, {} GiB free memory, best of {candidates} eligible node(s){}", free_memory / GIB, rejected.iter().map(|(node, why)| format!("; {node} not eligible: {why}")).collect::<String>())]
    Automatic {
        same_set_vms: usize,
        free_memory: u64,
        candidates: usize,
        rejected: Vec<(String, LeftOut)>,
    },
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlacementError {
    #[error("node {node:?} from provider data does not exist; the cluster has: {}", existing.join(", "))]
    PinnedNodeMissing { node: String, existing: Vec<String> },
    #[error("node {node:?} from provider data is offline")]
    PinnedNodeOffline { node: String },
    /// The pinned node lacks CPUs, storage, or a copy of the template a clone can reach.
    #[error("node {node:?} from provider data {}: {reason}", match reason {
        LeftOut::TooFewCpus { .. } => "cannot run this VM",
        LeftOut::Clone(_) => "cannot take this VM",
        _ => "has no usable storage",
    })]
    PinnedNodeRefused { node: String, reason: LeftOut },
    #[error("no node can take this VM: {}", describe_rejections(.rejected))]
    NothingFits { rejected: Vec<(String, LeftOut)> },
    #[error(transparent)]
    Selector(#[from] SelectorError),
}

impl PlacementError {
    /// Whether the cluster may make room by itself (a node comes back, VMs go away, a storage fills
    /// less), as opposed to a class that names what does not exist or cannot match. The first is
    /// waited for; the second needs someone to change the class or the cluster.
    pub fn may_heal(&self) -> bool {
        match self {
            PlacementError::PinnedNodeOffline { .. } => true,
            PlacementError::PinnedNodeRefused { reason, .. } => reason.may_heal(),
            PlacementError::NothingFits { rejected } => {
                rejected.iter().any(|(_, why)| why.may_heal())
            }
            PlacementError::PinnedNodeMissing { .. } | PlacementError::Selector(_) => false,
        }
    }
}

fn describe_rejections(rejected: &[(String, LeftOut)]) -> String {
    if rejected.is_empty() {
        return "the cluster reports no nodes".to_string();
    }
    rejected
        .iter()
        .map(|(n, why)| format!("{n}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Picks the node and storage for a request (`docs/architecture.md`, step `pick_node`).
pub fn pick(
    cluster: &ClusterSnapshot,
    request: &PlacementRequest<'_>,
    reservations: &Reservations,
) -> Result<Placement, PlacementError> {
    // A pinned node is the user's choice: it must exist, be online, have as many CPUs as the VM
    // has vCPUs, have a storage, and (with `boot: clone`) be reachable by a clone of the template.
    // Free memory and the overcommit limits are not checked here (there is nowhere else to go,
    // and they change); `validate` reports a shortfall.
    if let Some(pinned) = &request.data.node {
        let node = pinned_node(cluster, pinned.as_str())?;
        let refused = |reason| PlacementError::PinnedNodeRefused {
            node: pinned.to_string(),
            reason,
        };
        cpus_fit(node, request).map_err(refused)?;
        let (storage, template) = disk_verdict(node, request)?.map_err(refused)?;
        return Ok(Placement {
            node: node.name.clone(),
            storage: storage.name,
            template,
            reason: PlacementReason::Pinned,
        });
    }
    let mut rejected = Vec::new();
    let mut candidates = Vec::new();
    for node in &cluster.nodes {
        match node_verdict(node, request, reservations)? {
            Ok(eligible) => candidates.push(eligible),
            Err(why) => rejected.push((node.name.to_string(), why)),
        }
    }
    let count = candidates.len();
    match best(candidates, request.data.placement_strategy) {
        Some(c) => Ok(Placement {
            node: c.node.name.clone(),
            storage: c.storage.name,
            template: c.template,
            reason: PlacementReason::Automatic {
                same_set_vms: c.same_set,
                free_memory: c.free_memory,
                candidates: count,
                rejected,
            },
        }),
        None => Err(PlacementError::NothingFits { rejected }),
    }
}

/// The pinned node, if it exists and is online; else [`PlacementError::PinnedNodeMissing`] or
/// [`PlacementError::PinnedNodeOffline`].
pub fn pinned_node<'c>(
    cluster: &'c ClusterSnapshot,
    pinned: &str,
) -> Result<&'c NodeSnapshot, PlacementError> {
    let Some(node) = cluster.node(pinned) else {
        let existing = cluster.node_names().into_iter().map(str::to_owned);
        return Err(PlacementError::PinnedNodeMissing {
            node: pinned.to_string(),
            existing: existing.collect(),
        });
    };
    if !node.online {
        return Err(PlacementError::PinnedNodeOffline {
            node: pinned.to_string(),
        });
    }
    Ok(node)
}

/// A node placement may choose: what it would get there, and what the strategies compare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eligible<'n> {
    pub node: &'n NodeSnapshot,
    pub storage: StorageSnapshot,
    /// `boot: clone`: the VMID of the copy of the template the clone comes from.
    pub template: Option<u32>,
    /// Free memory after the reservations of other requests.
    pub free_memory: u64,
    pub same_set: usize,
    pub total_vms: usize,
    /// What the set's HA rules make of the node; ranks before the strategy.
    pub ha_rank: (HaPreference, bool),
}

/// The best candidate by strategy among those the set's HA rules like best (a node-affinity rule's
/// nodes; for a resource-affinity rule, nodes without (negative) or with (positive) a VM of the set),
/// so the HA manager has no reason to move the VM once it runs; ties go to the node name, so the
/// choice is deterministic.
fn best(candidates: Vec<Eligible<'_>>, strategy: PlacementStrategy) -> Option<Eligible<'_>> {
    use std::cmp::Reverse;
    let top = candidates.iter().map(|c| c.ha_rank).min()?;
    let iter = candidates.into_iter().filter(|c| c.ha_rank == top);
    match strategy {
        PlacementStrategy::Spread => {
            iter.min_by_key(|c| (c.same_set, Reverse(c.free_memory), &c.node.name))
        }
        PlacementStrategy::FewerVms => {
            iter.min_by_key(|c| (c.total_vms, Reverse(c.free_memory), &c.node.name))
        }
        PlacementStrategy::RoundRobin => iter.min_by_key(|c| (c.same_set, &c.node.name)),
        PlacementStrategy::Binpack => iter.min_by_key(|c| (c.free_memory, &c.node.name)),
    }
}

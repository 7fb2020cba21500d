//! How eligible nodes are ranked. Each strategy is a total order ending in the node name, so the
//! same cluster and reservations always give the same node, and the set's VMs (listed by their tag
//! or still in flight) are counted the same way the tag is written.

use super::{HaPreference, PlacementRequest, Reservations};
use crate::model::identity::set_tag;
use crate::model::{NodeSnapshot, StorageSnapshot};
use crate::rules::provider_data::{PlacementStrategy, ResourceAffinity};

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

impl<'n> Eligible<'n> {
    pub(super) fn new(
        node: &'n NodeSnapshot,
        storage: StorageSnapshot,
        template: Option<u32>,
        free_memory: u64,
        request: &PlacementRequest<'_>,
        reservations: &Reservations,
    ) -> Self {
        let pending = || reservations.pending(node, request.request_id);
        let same_set = match request.set_id {
            Some(set) => {
                let tag = set_tag(set);
                node.vms.iter().filter(|vm| vm.has_tag(&tag)).count()
                    + pending()
                        .filter(|r| r.set_id.as_deref() == Some(set))
                        .count()
            }
            None => 0,
        };
        let against_affinity = match request.ha.and_then(|ha| ha.resource_affinity) {
            Some(ResourceAffinity::Negative) => same_set > 0,
            Some(ResourceAffinity::Positive) => same_set == 0,
            None => false,
        };
        Self {
            ha_rank: (request.ha_preference(&node.name), against_affinity),
            node,
            storage,
            template,
            same_set,
            total_vms: node.vms.len() + pending().count(),
            free_memory,
        }
    }
}

/// The best candidate by strategy among those the set's HA rules like best (a node-affinity rule's
/// nodes; for a resource-affinity rule, nodes without (negative) or with (positive) a VM of the set),
/// so the HA manager has no reason to move the VM once it runs; ties go to the node name, so the
/// choice is deterministic.
pub(super) fn best(
    candidates: Vec<Eligible<'_>>,
    strategy: PlacementStrategy,
) -> Option<Eligible<'_>> {
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

//! How eligible nodes are ranked. Each strategy is a total order ending in the node name, so the
//! same cluster and reservations always give the same node, and the set's VMs (listed by their tag
//! or still in flight) are counted the same way the tag is written.

use super::{Eligible, HaPreference, PlacementRequest, Reservations};
use crate::model::NodeSnapshot;
use crate::model::identity::set_tag;
use crate::proxmox::property::StorageId;
use crate::rules::provider_data::{PlacementStrategy, ResourceAffinity};

/// An eligible node with what the strategies compare.
pub(super) struct Candidate<'a> {
    pub(super) node: &'a NodeSnapshot,
    pub(super) storage: StorageId,
    pub(super) template: Option<u32>,
    pub(super) same_set: usize,
    pub(super) total_vms: usize,
    pub(super) free_memory: u64,
    /// What the set's HA rules make of the node; ranks before the strategy.
    pub(super) ha_rank: (HaPreference, bool),
}

impl<'a> Candidate<'a> {
    pub(super) fn new(
        node: &'a NodeSnapshot,
        eligible: Eligible,
        request: &PlacementRequest<'_>,
        reservations: &Reservations,
    ) -> Self {
        let pending = || reservations.pending(node, request.request_id);
        let same_set = match request.set_id {
            Some(set) => {
                let tag = set_tag(set);
                node.vms
                    .iter()
                    .filter(|vm| vm.tags.iter().any(|t| t.eq_ignore_ascii_case(&tag)))
                    .count()
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
            storage: eligible.storage.name,
            template: eligible.template,
            same_set,
            total_vms: node.vms.len() + pending().count(),
            free_memory: eligible.free_memory,
        }
    }
}

/// The best candidate by strategy among those the set's HA rules like best (a node-affinity rule's
/// nodes; for a resource-affinity rule, nodes without (negative) or with (positive) a VM of the set),
/// so the HA manager has no reason to move the VM once it runs; ties go to the node name, so the
/// choice is deterministic.
pub(super) fn best(
    candidates: Vec<Candidate<'_>>,
    strategy: PlacementStrategy,
) -> Option<Candidate<'_>> {
    use std::cmp::Reverse;
    let top = candidates.iter().map(|c| c.ha_rank).min()?;
    let iter = candidates.into_iter().filter(|c| c.ha_rank == top);
    match strategy {
        PlacementStrategy::Spread => iter.min_by(|a, b| {
            (a.same_set, Reverse(a.free_memory), &a.node.name).cmp(&(
                b.same_set,
                Reverse(b.free_memory),
                &b.node.name,
            ))
        }),
        PlacementStrategy::FewerVms => iter.min_by(|a, b| {
            (a.total_vms, Reverse(a.free_memory), &a.node.name).cmp(&(
                b.total_vms,
                Reverse(b.free_memory),
                &b.node.name,
            ))
        }),
        PlacementStrategy::RoundRobin => {
            iter.min_by(|a, b| (a.same_set, &a.node.name).cmp(&(b.same_set, &b.node.name)))
        }
        PlacementStrategy::Binpack => {
            iter.min_by(|a, b| (a.free_memory, &a.node.name).cmp(&(b.free_memory, &b.node.name)))
        }
    }
}

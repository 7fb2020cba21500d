//! Which node a new VM goes to, and why every other node was left out.
//!
//! Pure: the caller reads the cluster once ([`crate::model::ClusterSnapshot`]), passes it in, and
//! gets a decision with its reasons. [`node_verdict`] is the rule for one node; [`pick`] applies it
//! to every node and ranks the eligible ones by strategy; `validate` renders the same verdicts for
//! people. Concurrent requests of one machine set would all see the same snapshot and pile onto one
//! node, so decisions also count the in-flight [`Reservations`] that earlier decisions made until
//! their VMs show up in the snapshot.
//!
//! A node is eligible when it is allowed and online, has the memory free, stays within the config's
//! [`PlacementLimits`] for vCPUs and memory given to VMs, and has a storage for the disks; with
//! `boot: clone` the storage must also be one a clone of the template can reach ([`clone`]).

mod capacity;
pub mod clone;
mod pick;
mod verdict;

use std::collections::BTreeMap;

use crate::model::MIB;
use crate::proxmox::property::NodeName;
use crate::rules::provider_data::ProviderData;
use crate::rules::storage_selector::StorageSelector;

pub use capacity::Allocation;
pub use capacity::{PlacementLimits, Reservation, Reservations, allocation, capacity_fit};
pub use clone::{CloneRefusal, CloneSource, clone_verdict};
pub use pick::{Eligible, Placement, PlacementError, PlacementReason, pick, pinned_node};
pub use verdict::{LeftOut, boot_disk_storage, disk_verdict, node_verdict};

/// What the request needs: the class's provider data (sizes, selector, pinned and allowed nodes,
/// strategy, HA rules) and what the request and the config add.
#[derive(Debug, Clone)]
pub struct PlacementRequest<'a> {
    pub request_id: &'a str,
    pub data: &'a ProviderData,
    /// Per-node selectors from the config's `nodes:` overrides.
    pub node_selectors: &'a BTreeMap<String, StorageSelector>,
    pub set_id: Option<&'a str>,
    /// The config's `placement:` limits.
    pub limits: PlacementLimits,
    /// `boot: clone`: the template and every copy of it; `None` for an ISO boot.
    pub clone: Option<&'a CloneSource>,
}

/// How the set's node-affinity rule sees a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HaPreference {
    /// In the rule's nodes, or there is no such rule.
    Preferred,
    /// Outside a non-strict rule's nodes: used when no preferred node fits.
    Tolerated,
    /// Outside a strict rule's nodes.
    Forbidden,
}

impl PlacementRequest<'_> {
    /// Whether placement looks at `node` at all: the pinned node only, else the allowed ones.
    pub fn considers(&self, node: &NodeName) -> bool {
        match &self.data.node {
            Some(pinned) => node == pinned,
            None => self.allowed(node) && self.ha_preference(node) != HaPreference::Forbidden,
        }
    }

    /// What `ha.node_affinity_nodes` says of `node`: the set's HA rules say where its VMs should
    /// run, and placement puts them there first, so the HA manager does not move a VM right after
    /// it starts.
    pub fn ha_preference(&self, node: &NodeName) -> HaPreference {
        match &self.data.ha {
            Some(ha)
                if !ha.node_affinity_nodes.is_empty() && !ha.node_affinity_nodes.contains(node) =>
            {
                if ha.node_affinity_strict {
                    HaPreference::Forbidden
                } else {
                    HaPreference::Tolerated
                }
            }
            _ => HaPreference::Preferred,
        }
    }

    fn allowed(&self, node: &NodeName) -> bool {
        self.data.allowed_nodes.is_empty() || self.data.allowed_nodes.contains(node)
    }

    fn selector_for(&self, node: &NodeName) -> &StorageSelector {
        self.node_selectors
            .get(node.as_str())
            .unwrap_or(&self.data.storage_selector)
    }

    pub fn memory_bytes(&self) -> u64 {
        self.data.memory_mb.saturating_mul(MIB)
    }
}

#[cfg(test)]
mod tests;

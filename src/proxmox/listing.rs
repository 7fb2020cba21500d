//! One `/cluster/resources` answer, as every reader of the cluster asks it: its VMs, templates,
//! containers, nodes and storages.

use std::sync::Arc;
use std::time::Instant;

use super::types::{
    ClusterResource, NodeName, NodeResource, NodeState, StorageResource, VmId, VmResource,
};

/// The resources of one kind in a listing.
macro_rules! of_kind {
    ($listing:expr, $kind:path) => {
        $listing.iter().filter_map(|r| match r {
            $kind(resource) => Some(resource),
            _ => None,
        })
    };
}

/// A `/cluster/resources` listing and when its request was sent. It shares the listing with every
/// other request in flight rather than copying it: a thousand requests at once must not each keep
/// a thousand-guest listing while they wait.
#[derive(Debug, Clone)]
pub struct Listing {
    resources: Arc<Vec<ClusterResource>>,
    pub read_at: Instant,
}

impl std::ops::Deref for Listing {
    type Target = [ClusterResource];
    fn deref(&self) -> &[ClusterResource] {
        &self.resources
    }
}

impl Listing {
    /// The listing whose request was sent at `read_at`.
    pub fn read(resources: Vec<ClusterResource>, read_at: Instant) -> Self {
        let resources = Arc::new(resources);
        Self { resources, read_at }
    }

    /// Every QEMU guest, templates included.
    pub fn vms(&self) -> impl Iterator<Item = &VmResource> + Clone {
        of_kind!(self, ClusterResource::Vm)
    }

    /// The VMs that are not templates: the ones that run and count against a node.
    pub fn guests(&self) -> impl Iterator<Item = &VmResource> + Clone {
        self.vms().filter(|vm| !vm.template)
    }

    pub fn templates(&self) -> impl Iterator<Item = &VmResource> + Clone {
        self.vms().filter(|vm| vm.template)
    }

    pub fn containers(&self) -> impl Iterator<Item = &VmResource> + Clone {
        of_kind!(self, ClusterResource::Container)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &NodeResource> + Clone {
        of_kind!(self, ClusterResource::Node)
    }

    pub fn storages(&self) -> impl Iterator<Item = &StorageResource> + Clone {
        of_kind!(self, ClusterResource::Storage)
    }

    pub fn vm(&self, vmid: VmId) -> Option<&VmResource> {
        self.vms().find(|vm| vm.vmid == vmid)
    }

    /// The guests (not templates) carrying `tag`, in any case.
    pub fn tagged<'a>(&'a self, tag: &'a str) -> impl Iterator<Item = &'a VmResource> {
        self.guests().filter(move |vm| vm.has_tag(tag))
    }

    /// `None` when the node is not in the cluster (any more).
    pub fn node_state(&self, node: &NodeName) -> Option<NodeState> {
        self.nodes().find(|n| n.node == *node).map(|n| n.status)
    }

    pub fn node_online(&self, node: &NodeName) -> bool {
        self.node_state(node) == Some(NodeState::Online)
    }
}

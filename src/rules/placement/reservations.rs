//! Requests decided but not yet listed. Concurrent requests of one machine set all see the same
//! snapshot; without these, they would all pile onto the node that looked best.

use std::collections::BTreeMap;

use crate::model::{MIB, NodeSnapshot};
use crate::proxmox::property::NodeName;

/// In-flight placements: decided but not yet visible as VMs in the snapshot. Keyed by request ID so
/// reserving twice is harmless and releasing is exact.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reservations {
    by_request: BTreeMap<String, Reservation>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub node: NodeName,
    pub set_id: Option<String>,
    pub memory_bytes: u64,
    pub vcpus: u64,
}

impl Reservations {
    pub fn reserve(
        &mut self,
        request_id: &str,
        node: &NodeName,
        set_id: Option<&str>,
        memory_mb: u64,
        vcpus: u64,
    ) {
        self.by_request.insert(
            request_id.to_string(),
            Reservation {
                node: node.clone(),
                set_id: set_id.map(str::to_string),
                memory_bytes: memory_mb.saturating_mul(MIB),
                vcpus,
            },
        );
    }

    pub fn release(&mut self, request_id: &str) -> Option<Reservation> {
        self.by_request.remove(request_id)
    }

    /// The requests of `set` holding a reservation, but `except`.
    pub fn in_set(&self, set: &str, except: &str) -> Vec<String> {
        self.by_request
            .iter()
            .filter(|(id, r)| id.as_str() != except && r.set_id.as_deref() == Some(set))
            .map(|(id, _)| id.clone())
            .collect()
    }

    pub fn get(&self, request_id: &str) -> Option<&Reservation> {
        self.by_request.get(request_id)
    }

    /// Reservations on `node` whose VM is not in the snapshot yet (once it is, the tag counts it).
    pub(super) fn pending<'a>(
        &'a self,
        node: &'a NodeSnapshot,
        except: &'a str,
    ) -> impl Iterator<Item = &'a Reservation> + 'a {
        self.by_request
            .iter()
            .filter(move |(id, r)| {
                r.node == node.name
                    && id.as_str() != except
                    && !node.vms.iter().any(|vm| vm.name.as_ref() == Some(*id))
            })
            .map(|(_, r)| r)
    }
}

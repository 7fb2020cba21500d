//! How much a node may still take. Free memory alone lets a node fill up with stopped VMs that all
//! start later (by a person, by HA, by Omni), so placement also counts what every VM on the node
//! was given, and the requests still in flight, against the config's overcommit limits; `validate`
//! and `cluster` show the same figures, so they come from here.
//!
//! Requests decided but not yet listed count as [`Reservations`]: concurrent requests of one machine
//! set all see the same snapshot, and without these they would all pile onto the node that looked
//! best.

use std::collections::BTreeMap;

use super::{LeftOut, PlacementRequest};
use crate::model::NodeSnapshot;
use crate::proxmox::property::NodeName;
use crate::proxmox::types::VmResource;

/// How far placement may commit a node (the config's `placement:`): vCPUs given to VMs up to the
/// node's CPUs times `cpu_overcommit`, memory given to VMs up to its memory times
/// `memory_overcommit`. Every VM on the node counts, running or stopped: a stopped VM may be
/// started at any moment (by a person, by HA, by Omni).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlacementLimits {
    pub cpu_overcommit: f64,
    pub memory_overcommit: f64,
}

impl Default for PlacementLimits {
    fn default() -> Self {
        Self {
            cpu_overcommit: 4.0,
            memory_overcommit: 1.0,
        }
    }
}

/// What a node has given to VMs (with the reservations of requests in flight) against what the
/// limits allow. A limit of `None`: the node reports no figure (offline, or no stats yet), so
/// there is nothing to count against.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Allocation {
    #[serde(rename = "vcpus_allocated")]
    pub cpus_allocated: u64,
    #[serde(rename = "vcpus_limit")]
    pub cpus_limit: Option<u64>,
    pub memory_allocated: u64,
    pub memory_limit: Option<u64>,
}

/// `node`'s allocation: its VMs (from the listing) plus the reservations not yet visible there,
/// except `except`'s own.
pub fn allocation(
    node: &NodeSnapshot,
    limits: &PlacementLimits,
    reservations: &Reservations,
    except: &str,
) -> Allocation {
    let pending: Vec<&Reservation> = reservations.pending(node, except).collect();
    let scaled = |total: u64, ratio: f64| {
        // Whole units: 4 CPUs × 1.5 allow 6 vCPUs, 8 GiB × 1.0 allow 8 GiB.
        (total > 0).then(|| (total as f64 * ratio).floor() as u64)
    };
    // Every VM on the node counts, running or stopped: a stopped VM may be started at any time.
    let vms = |given: fn(&VmResource) -> Option<u64>| node.vms.iter().filter_map(given);
    let cpus = vms(|vm| vm.maxcpu).chain(pending.iter().map(|r| r.vcpus));
    let memory = vms(|vm| vm.maxmem).chain(pending.iter().map(|r| r.memory_bytes));
    Allocation {
        cpus_allocated: cpus.fold(0, u64::saturating_add),
        cpus_limit: scaled(node.cpus, limits.cpu_overcommit),
        memory_allocated: memory.fold(0, u64::saturating_add),
        memory_limit: scaled(node.memory_max, limits.memory_overcommit),
    }
}

/// Whether `node` has room for the VM: memory free now (once other requests' reservations are
/// counted), then memory and vCPUs given to VMs against the [`PlacementLimits`]. `Ok` carries the
/// free memory; `Err` the first limit passed, with its numbers.
pub fn capacity_fit(
    node: &NodeSnapshot,
    request: &PlacementRequest<'_>,
    reservations: &Reservations,
) -> Result<u64, LeftOut> {
    let free_memory = reservations
        .pending(node, request.request_id)
        .map(|r| r.memory_bytes)
        .fold(
            node.memory_max.saturating_sub(node.memory_used),
            u64::saturating_sub,
        );
    if free_memory < request.memory_bytes() {
        return Err(LeftOut::MemoryShort {
            free_memory,
            needed_mb: request.data.memory_mb,
        });
    }
    let limits = &request.limits;
    let a = allocation(node, limits, reservations, request.request_id);
    if let Some(limit) = a.memory_limit
        && a.memory_allocated.saturating_add(request.memory_bytes()) > limit
    {
        return Err(LeftOut::MemoryCommitted {
            allocated: a.memory_allocated,
            needed_mb: request.data.memory_mb,
            limit,
            ratio: limits.memory_overcommit,
        });
    }
    cpus_fit(node, request)?;
    let needed = request.data.vcpus();
    if let Some(limit) = a.cpus_limit
        && a.cpus_allocated.saturating_add(needed) > limit
    {
        return Err(LeftOut::CpusCommitted {
            allocated: a.cpus_allocated,
            needed,
            cpus: node.cpus,
            limit,
            ratio: limits.cpu_overcommit,
        });
    }
    Ok(free_memory)
}

/// Whether the node has as many CPUs as the VM has vCPUs (a node that reports none is not judged).
pub(super) fn cpus_fit(node: &NodeSnapshot, request: &PlacementRequest<'_>) -> Result<(), LeftOut> {
    let vcpus = request.data.vcpus();
    if node.cpus > 0 && vcpus > node.cpus {
        return Err(LeftOut::TooFewCpus {
            vcpus,
            cpus: node.cpus,
        });
    }
    Ok(())
}

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
    pub fn reserve(&mut self, request_id: &str, reservation: Reservation) {
        self.by_request.insert(request_id.to_string(), reservation);
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

/// What a reservation holds, for tests that look into the ledger.
#[cfg(test)]
impl Reservations {
    pub(crate) fn get(&self, request_id: &str) -> Option<&Reservation> {
        self.by_request.get(request_id)
    }
}

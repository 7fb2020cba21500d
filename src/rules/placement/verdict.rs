//! The rule for one node, and the reason when it fails. One rule serves placement, `validate` and
//! the health check, so a person reads the same reason, with the same numbers, that kept a VM off
//! the node.

use super::{
    CloneRefusal, Eligible, HaPreference, PlacementRequest, Reservations, capacity_fit,
    clone_verdict,
};
use crate::model::identity::set_tag;
use crate::model::{GIB, MIB, NodeSnapshot, StorageSnapshot};
use crate::rules::provider_data::ResourceAffinity;
use crate::rules::storage::{self, Rejection, StorageChoice, StorageNeed};
use crate::rules::storage_selector::SelectorError;

/// Why a node was left out, with the numbers behind it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LeftOut {
    #[error("not in allowed_nodes")]
    NotAllowed,
    /// `ha.node_affinity_strict`: the HA manager would stop the VM anywhere but these nodes.
    #[error("not in ha.node_affinity_nodes (ha.node_affinity_strict is set)")]
    OutsideHaNodes,
    #[error("offline")]
    Offline,
    #[error("{} MiB free memory, {needed_mb} MiB needed", free_memory / MIB)]
    MemoryShort { free_memory: u64, needed_mb: u64 },
    /// Memory given to VMs would pass the node's memory × `memoryOvercommit`.
    #[error("{} MiB of memory given to VMs, {needed_mb} MiB more would pass the limit of {} MiB (memory × memoryOvercommit {ratio})", allocated / MIB, limit / MIB)]
    MemoryCommitted {
        allocated: u64,
        needed_mb: u64,
        limit: u64,
        ratio: f64,
    },
    /// More vCPUs than the node has CPUs: qemu-server src/PVE/QemuServer.pm (`config_to_command`)
    /// refuses to start such a VM (`MAX <n> vcpus allowed per VM on this node`).
    #[error("{vcpus} vCPUs are more than its {cpus} CPUs (Proxmox will not start the VM there)")]
    TooFewCpus { vcpus: u64, cpus: u64 },
    /// vCPUs given to VMs would pass the node's CPUs × `cpuOvercommit`.
    #[error(
        "{allocated} vCPUs given to VMs, {needed} more would pass the limit of {limit} ({cpus} CPUs × cpuOvercommit {ratio})"
    )]
    CpusCommitted {
        allocated: u64,
        needed: u64,
        cpus: u64,
        limit: u64,
        ratio: f64,
    },
    /// `boot: clone`: no clone of the template can be made here (boxed: it is the largest reason).
    #[error("{0}")]
    Clone(Box<CloneRefusal>),
    /// `rejected`: every storage of the node with the reason it was passed over.
    #[error("{}", short_of_storage(*need_gb, selector, rejected))]
    NoStorage {
        need_gb: u64,
        selector: String,
        rejected: Vec<(String, Rejection)>,
    },
}

fn short_of_storage(need_gb: u64, selector: &str, rejected: &[(String, Rejection)]) -> String {
    let too_small: Vec<String> = rejected
        .iter()
        .filter_map(|(name, why)| match why {
            Rejection::TooSmall { available, .. } => {
                Some(format!("{name} has {} GiB free", available / GIB))
            }
            _ => None,
        })
        .collect();
    if too_small.is_empty() {
        format!("no active storage for VM images matches the storage selector `{selector}`")
    } else {
        format!(
            "not enough disk space for {need_gb} GiB ({})",
            too_small.join(", ")
        )
    }
}

impl LeftOut {
    /// Whether the node could take the VM later without anyone changing the class.
    pub fn may_heal(&self) -> bool {
        match self {
            LeftOut::NotAllowed | LeftOut::OutsideHaNodes | LeftOut::TooFewCpus { .. } => false,
            LeftOut::Offline
            | LeftOut::MemoryShort { .. }
            | LeftOut::MemoryCommitted { .. }
            | LeftOut::CpusCommitted { .. } => true,
            LeftOut::Clone(refusal) => refusal.may_heal(),
            LeftOut::NoStorage { rejected, .. } => rejected.iter().any(|(_, why)| why.may_heal()),
        }
    }
}

/// The storage the boot disk (with the additional disks) would get on `node`, with the node's own
/// selector from `nodes:` when it has one.
pub fn boot_disk_storage(node: &NodeSnapshot, request: &PlacementRequest<'_>) -> StorageChoice {
    storage::choose(
        node,
        &StorageNeed::boot_disk(
            request.selector_for(&node.name),
            request.data.total_disk_gb(),
        ),
    )
}

/// Where the disks go on `node` (and, for a clone, from which copy of the template), or why they
/// cannot; a selector that fails is a configuration error.
pub fn disk_verdict(
    node: &NodeSnapshot,
    request: &PlacementRequest<'_>,
) -> Result<Result<(StorageSnapshot, Option<u32>), LeftOut>, SelectorError> {
    let (selector, disk_gb) = (
        request.selector_for(&node.name),
        request.data.total_disk_gb(),
    );
    let verdict = match request.clone {
        Some(source) => clone_verdict(node, source, selector, disk_gb)
            .map(|(storage, template)| (storage, Some(template))),
        None => {
            let choice = boot_disk_storage(node, request);
            match choice.chosen {
                Some(storage) if choice.selector_error().is_none() => Ok((storage, None)),
                _ => Err(LeftOut::NoStorage {
                    need_gb: disk_gb,
                    selector: selector.to_string(),
                    rejected: choice.rejected,
                }),
            }
        }
    };
    // A selector that failed on a storage on the way: a configuration error, not a fact about the
    // node.
    let rejected = match &verdict {
        Err(LeftOut::NoStorage { rejected, .. }) => rejected,
        Err(LeftOut::Clone(refusal)) => match &**refusal {
            CloneRefusal::NoSharedTarget { rejected, .. } => rejected,
            CloneRefusal::LinkedStorage {
                why: Rejection::SelectorFailed(e),
                ..
            } => return Err(e.clone()),
            _ => return Ok(verdict),
        },
        _ => return Ok(verdict),
    };
    storage::selector_error(rejected)
        .cloned()
        .map_or(Ok(verdict), Err)
}

/// The rule for one node when placement chooses: allowed, online, enough memory and vCPUs
/// ([`capacity_fit`]), a storage that fits (reachable by a clone of the template), checked in that
/// order (the first failure is the reason).
pub fn node_verdict<'n>(
    node: &'n NodeSnapshot,
    request: &PlacementRequest<'_>,
    reservations: &Reservations,
) -> Result<Result<Eligible<'n>, LeftOut>, SelectorError> {
    if !request.allowed(&node.name) {
        return Ok(Err(LeftOut::NotAllowed));
    }
    if request.ha_preference(&node.name) == HaPreference::Forbidden {
        return Ok(Err(LeftOut::OutsideHaNodes));
    }
    if !node.online {
        return Ok(Err(LeftOut::Offline));
    }
    let free_memory = match capacity_fit(node, request, reservations) {
        Ok(free) => free,
        Err(short) => return Ok(Err(short)),
    };
    let (storage, template) = match disk_verdict(node, request)? {
        Ok(found) => found,
        Err(why) => return Ok(Err(why)),
    };
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
    let against_affinity = match request.data.ha.as_ref().and_then(|ha| ha.resource_affinity) {
        Some(ResourceAffinity::Negative) => same_set > 0,
        Some(ResourceAffinity::Positive) => same_set == 0,
        None => false,
    };
    Ok(Ok(Eligible {
        ha_rank: (request.ha_preference(&node.name), against_affinity),
        node,
        storage,
        template,
        same_set,
        total_vms: node.vms.len() + pending().count(),
        free_memory,
    }))
}

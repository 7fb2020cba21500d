//! The rule for one node, and the reason when it fails. One rule serves placement, `validate` and
//! the health check, so a person reads the same reason, with the same numbers, that kept a VM off
//! the node.

use super::{
    CloneRefusal, CloneVerdict, HaPreference, PlacementRequest, Reservations, capacity_fit,
    clone_verdict,
};
use crate::model::{GIB, MIB, NodeSnapshot, StorageSnapshot};
use crate::rules::storage::{self, Rejection, StorageChoice, StorageNeed};
use crate::rules::storage_selector::SelectorError;

/// A node placement may choose, with what it would get there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eligible {
    pub storage: StorageSnapshot,
    /// Free memory after the reservations of other requests.
    pub free_memory: u64,
    /// `boot: clone`: the VMID of the copy of the template the clone comes from.
    pub template: Option<u32>,
}

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
    #[error("{}", no_storage(*need_gb, selector, rejected))]
    NoStorage {
        need_gb: u64,
        selector: String,
        rejected: Vec<(String, Rejection)>,
    },
}

fn no_storage(need_gb: u64, selector: &str, rejected: &[(String, Rejection)]) -> String {
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

/// The verdict on one node.
pub type NodeVerdict = Result<Eligible, LeftOut>;

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
        &StorageNeed::boot_disk(request.selector_for(&node.name), request.disk_gb),
    )
}

/// Where the disks go on `node` (and, for a clone, from which copy of the template), or why they
/// cannot; a selector that fails is a configuration error.
pub fn disk_verdict(
    node: &NodeSnapshot,
    request: &PlacementRequest<'_>,
) -> Result<Result<(StorageSnapshot, Option<u32>), LeftOut>, SelectorError> {
    let no_storage = |choice: StorageChoice| -> Result<_, SelectorError> {
        if let Some(e) = choice.selector_error() {
            return Err(e.clone());
        }
        Ok(Err(LeftOut::NoStorage {
            need_gb: request.disk_gb,
            selector: request.selector_for(&node.name).to_string(),
            rejected: choice.rejected,
        }))
    };
    let Some(source) = request.clone else {
        let choice = boot_disk_storage(node, request);
        return match choice.chosen {
            Some(storage) if choice.selector_error().is_none() => Ok(Ok((storage, None))),
            _ => no_storage(choice),
        };
    };
    let selector = request.selector_for(&node.name);
    match clone_verdict(node, source, selector, request.disk_gb) {
        CloneVerdict::Clones(t) => Ok(Ok((t.storage, Some(t.template)))),
        CloneVerdict::NoStorage(choice) => no_storage(choice),
        CloneVerdict::Refused(CloneRefusal::LinkedStorage {
            why: Rejection::SelectorFailed(e),
            ..
        }) => Err(e),
        CloneVerdict::Refused(CloneRefusal::NoSharedTarget { rejected, .. })
            if rejected
                .iter()
                .any(|(_, why)| matches!(why, Rejection::SelectorFailed(_))) =>
        {
            no_storage(StorageChoice {
                chosen: None,
                rejected,
            })
        }
        CloneVerdict::Refused(refusal) => Ok(Err(LeftOut::Clone(Box::new(refusal)))),
    }
}

/// The rule for one node when placement chooses: allowed, online, enough memory and vCPUs
/// ([`capacity_fit`]), a storage that fits (reachable by a clone of the template), checked in that
/// order (the first failure is the reason).
pub fn node_verdict(
    node: &NodeSnapshot,
    request: &PlacementRequest<'_>,
    reservations: &Reservations,
) -> Result<NodeVerdict, SelectorError> {
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
    Ok(
        disk_verdict(node, request)?.map(|(storage, template)| Eligible {
            storage,
            free_memory,
            template,
        }),
    )
}

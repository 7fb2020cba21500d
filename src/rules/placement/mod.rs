//! Which node a new VM goes to, and why every other node was left out.
//!
//! Pure: the caller reads the cluster once ([`ClusterSnapshot`]), passes it in, and gets a decision
//! with its reasons. [`node_verdict`] is the rule for one node; [`pick`] applies it to every node and
//! ranks the eligible ones by strategy; `validate` renders the same verdicts for people. Concurrent
//! requests of one machine set would all see the same snapshot and pile onto one node, so decisions
//! also count the in-flight [`Reservations`] that earlier decisions made until their VMs show up in
//! the snapshot.
//!
//! A node is eligible when it is allowed and online, has the memory free, stays within the config's
//! [`PlacementLimits`] for vCPUs and memory given to VMs, and has a storage for the disks; with
//! `boot: clone` the storage must also be one a clone of the template can reach ([`clone`]).

pub mod clone;

use std::collections::BTreeMap;
use std::fmt;

use crate::model::{ClusterSnapshot, GIB, MIB, NodeSnapshot, StorageSnapshot};
use crate::pipeline::provider_data::PlacementStrategy;
use crate::pipeline::storage_selector::{SelectorError, StorageSelector};
use crate::rules::storage::{self, Rejection, StorageChoice, StorageNeed};

pub use clone::{CloneRefusal, CloneSource, CloneTarget, CloneVerdict, clone_verdict};

/// How far placement may commit a node (the config's `placement:`): vCPUs given to VMs up to the
/// node's CPUs times `cpu_overcommit`, memory given to VMs up to its memory times
/// `memory_overcommit`. Every VM on the node counts, running or stopped: a stopped VM may be
/// started at any moment (by a person, by HA, by Omni).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlacementLimits {
    pub cpu_overcommit: f64,
    pub memory_overcommit: f64,
}

impl PlacementLimits {
    pub const DEFAULT_CPU_OVERCOMMIT: f64 = 4.0;
    pub const DEFAULT_MEMORY_OVERCOMMIT: f64 = 1.0;
}

impl Default for PlacementLimits {
    fn default() -> Self {
        Self {
            cpu_overcommit: Self::DEFAULT_CPU_OVERCOMMIT,
            memory_overcommit: Self::DEFAULT_MEMORY_OVERCOMMIT,
        }
    }
}

/// What a node has given to VMs (with the reservations of requests in flight) against what the
/// limits allow. A limit of `None`: the node reports no figure (offline, or no stats yet), so
/// there is nothing to count against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allocation {
    pub cpus_allocated: u64,
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
    Allocation {
        cpus_allocated: pending
            .iter()
            .map(|r| r.vcpus)
            .fold(node.allocated_cpus(), u64::saturating_add),
        cpus_limit: scaled(node.cpus, limits.cpu_overcommit),
        memory_allocated: pending
            .iter()
            .map(|r| r.memory_bytes)
            .fold(node.allocated_memory(), u64::saturating_add),
        memory_limit: scaled(node.memory_max, limits.memory_overcommit),
    }
}

/// The tag the provider (and the official one) puts on every VM of a machine-request set.
pub fn set_tag(set_id: &str) -> String {
    format!("machine-request.{set_id}")
}

/// What the request needs.
#[derive(Debug, Clone)]
pub struct PlacementRequest<'a> {
    pub request_id: &'a str,
    pub memory_mb: u64,
    /// Boot disk plus additional disks.
    pub disk_gb: u64,
    pub selector: &'a StorageSelector,
    /// Per-node selectors from the config's `nodes:` overrides.
    pub node_selectors: &'a BTreeMap<String, StorageSelector>,
    pub pinned_node: Option<&'a str>,
    /// Empty means every node.
    pub allowed_nodes: &'a [String],
    pub set_id: Option<&'a str>,
    pub strategy: PlacementStrategy,
    /// vCPUs the VM gets (sockets × cores).
    pub vcpus: u64,
    /// The config's `placement:` limits.
    pub limits: PlacementLimits,
    /// `boot: clone`: the template and every copy of it; `None` for an ISO boot.
    pub clone: Option<&'a CloneSource>,
}

impl PlacementRequest<'_> {
    /// Whether placement looks at `node` at all: the pinned node only, else the allowed ones.
    pub fn considers(&self, node: &str) -> bool {
        match self.pinned_node {
            Some(pinned) => pinned == node,
            None => self.allowed(node),
        }
    }

    fn allowed(&self, node: &str) -> bool {
        self.allowed_nodes.is_empty() || self.allowed_nodes.iter().any(|a| a == node)
    }

    fn selector_for(&self, node: &str) -> &StorageSelector {
        self.node_selectors.get(node).unwrap_or(self.selector)
    }

    fn memory_bytes(&self) -> u64 {
        self.memory_mb.saturating_mul(MIB)
    }
}

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
#[derive(Debug, Clone, PartialEq)]
pub enum LeftOut {
    NotAllowed,
    Offline,
    MemoryShort {
        free_memory: u64,
        needed_mb: u64,
    },
    /// Memory given to VMs would pass the node's memory × `memoryOvercommit`.
    MemoryCommitted {
        allocated: u64,
        needed_mb: u64,
        limit: u64,
        ratio: f64,
    },
    /// More vCPUs than the node has CPUs: qemu-server src/PVE/QemuServer.pm (`config_to_command`)
    /// refuses to start such a VM ("MAX <n> vcpus allowed per VM on this node").
    TooFewCpus {
        vcpus: u64,
        cpus: u64,
    },
    /// vCPUs given to VMs would pass the node's CPUs × `cpuOvercommit`.
    CpusCommitted {
        allocated: u64,
        needed: u64,
        cpus: u64,
        limit: u64,
        ratio: f64,
    },
    /// `boot: clone`: no clone of the template can be made here (boxed: it is the largest reason).
    Clone(Box<CloneRefusal>),
    /// `rejected`: every storage of the node with the reason it was passed over.
    NoStorage {
        need_gb: u64,
        selector: String,
        rejected: Vec<(String, Rejection)>,
    },
}

impl fmt::Display for LeftOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeftOut::NotAllowed => f.write_str("not in allowed_nodes"),
            LeftOut::Offline => f.write_str("offline"),
            LeftOut::MemoryShort {
                free_memory,
                needed_mb,
            } => write!(
                f,
                "{} MiB free memory, {needed_mb} MiB needed",
                free_memory / MIB
            ),
            LeftOut::MemoryCommitted {
                allocated,
                needed_mb,
                limit,
                ratio,
            } => write!(
                f,
                "{} MiB of memory given to VMs, {needed_mb} MiB more would pass the limit of {} MiB (memory × memoryOvercommit {ratio})",
                allocated / MIB,
                limit / MIB
            ),
            LeftOut::CpusCommitted {
                allocated,
                needed,
                cpus,
                limit,
                ratio,
            } => write!(
                f,
                "{allocated} vCPUs given to VMs, {needed} more would pass the limit of {limit} ({cpus} CPUs × cpuOvercommit {ratio})"
            ),
            LeftOut::TooFewCpus { vcpus, cpus } => write!(
                f,
                "{vcpus} vCPUs are more than its {cpus} CPUs (Proxmox will not start the VM there)"
            ),
            LeftOut::Clone(refusal) => write!(f, "{refusal}"),
            LeftOut::NoStorage {
                need_gb,
                selector,
                rejected,
            } => {
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
                    write!(
                        f,
                        "no active storage for VM images matches the storage selector `{selector}`"
                    )
                } else {
                    write!(
                        f,
                        "not enough disk space for {need_gb} GiB ({})",
                        too_small.join(", ")
                    )
                }
            }
        }
    }
}

/// The verdict on one node.
pub type NodeVerdict = Result<Eligible, LeftOut>;

/// The decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub node: String,
    pub storage: String,
    /// `boot: clone`: the VMID of the copy of the template to clone.
    pub template: Option<u32>,
    pub reason: PlacementReason,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PlacementReason {
    /// `node` was set in the provider data.
    Pinned,
    /// Chosen among `candidates` eligible nodes.
    Automatic {
        same_set_vms: usize,
        free_memory: u64,
        candidates: usize,
        rejected: Vec<(String, LeftOut)>,
    },
}

impl fmt::Display for PlacementReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementReason::Pinned => f.write_str("using configured node"),
            PlacementReason::Automatic {
                same_set_vms,
                free_memory,
                candidates,
                rejected,
            } => {
                write!(
                    f,
                    "automatically picked node: {same_set_vms} VM(s) of the same set, {} GiB free memory, best of {candidates} eligible node(s)",
                    free_memory / GIB
                )?;
                for (node, why) in rejected {
                    write!(f, "; {node} not eligible: {why}")?;
                }
                Ok(())
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlacementError {
    #[error("node {node:?} from provider data does not exist; the cluster has: {}", existing.join(", "))]
    PinnedNodeMissing { node: String, existing: Vec<String> },
    #[error("node {node:?} from provider data is offline")]
    PinnedNodeOffline { node: String },
    #[error("node {node:?} from provider data has no usable storage: {reason}")]
    PinnedNodeNoStorage { node: String, reason: LeftOut },
    #[error("node {node:?} from provider data cannot run this VM: {reason}")]
    PinnedNodeTooSmall { node: String, reason: LeftOut },
    #[error("node {node:?} from provider data cannot take this VM: {reason}")]
    PinnedNodeCannotClone {
        node: String,
        reason: Box<CloneRefusal>,
    },
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
            PlacementError::PinnedNodeNoStorage { reason, .. } => reason.may_heal(),
            PlacementError::PinnedNodeCannotClone { reason, .. } => reason.may_heal(),
            PlacementError::PinnedNodeTooSmall { reason, .. } => reason.may_heal(),
            PlacementError::NothingFits { rejected } => {
                rejected.iter().any(|(_, why)| why.may_heal())
            }
            PlacementError::PinnedNodeMissing { .. } | PlacementError::Selector(_) => false,
        }
    }
}

impl LeftOut {
    /// Whether the node could take the VM later without anyone changing the class.
    pub fn may_heal(&self) -> bool {
        match self {
            LeftOut::NotAllowed | LeftOut::TooFewCpus { .. } => false,
            LeftOut::Offline
            | LeftOut::MemoryShort { .. }
            | LeftOut::MemoryCommitted { .. }
            | LeftOut::CpusCommitted { .. } => true,
            LeftOut::Clone(refusal) => refusal.may_heal(),
            LeftOut::NoStorage { rejected, .. } => rejected
                .iter()
                .any(|(_, why)| matches!(why, Rejection::Inactive | Rejection::TooSmall { .. })),
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

/// In-flight placements: decided but not yet visible as VMs in the snapshot. Keyed by request ID so
/// reserving twice is harmless and releasing is exact.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reservations {
    by_request: BTreeMap<String, Reservation>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub node: String,
    pub set_id: Option<String>,
    pub memory_bytes: u64,
    pub vcpus: u64,
}

impl Reservations {
    pub fn reserve(
        &mut self,
        request_id: &str,
        node: &str,
        set_id: Option<&str>,
        memory_mb: u64,
        vcpus: u64,
    ) {
        self.by_request.insert(
            request_id.to_string(),
            Reservation {
                node: node.to_string(),
                set_id: set_id.map(str::to_string),
                memory_bytes: memory_mb.saturating_mul(MIB),
                vcpus,
            },
        );
    }

    pub fn release(&mut self, request_id: &str) -> Option<Reservation> {
        self.by_request.remove(request_id)
    }

    pub fn get(&self, request_id: &str) -> Option<&Reservation> {
        self.by_request.get(request_id)
    }

    pub fn len(&self) -> usize {
        self.by_request.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_request.is_empty()
    }

    /// Reservations on `node` whose VM is not in the snapshot yet (once it is, the tag counts it).
    fn pending<'a>(
        &'a self,
        node: &'a NodeSnapshot,
        except: &'a str,
    ) -> impl Iterator<Item = &'a Reservation> + 'a {
        self.by_request
            .iter()
            .filter(move |(id, r)| {
                r.node == node.name
                    && id.as_str() != except
                    && !node.vms.iter().any(|vm| &vm.name == *id)
            })
            .map(|(_, r)| r)
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

/// Whether `node` has room for the VM: memory free now (once other requests' reservations are
/// counted), then memory and vCPUs given to VMs against the [`PlacementLimits`]. `Ok` carries the
/// free memory; `Err` the first limit passed, with its numbers.
pub fn capacity_fit(
    node: &NodeSnapshot,
    request: &PlacementRequest<'_>,
    reservations: &Reservations,
) -> Result<u64, LeftOut> {
    let reserved: u64 = reservations
        .pending(node, request.request_id)
        .map(|r| r.memory_bytes)
        .sum();
    let free_memory = node.free_memory().saturating_sub(reserved);
    if free_memory < request.memory_bytes() {
        return Err(LeftOut::MemoryShort {
            free_memory,
            needed_mb: request.memory_mb,
        });
    }
    let limits = &request.limits;
    let a = allocation(node, limits, reservations, request.request_id);
    if let Some(limit) = a.memory_limit
        && a.memory_allocated.saturating_add(request.memory_bytes()) > limit
    {
        return Err(LeftOut::MemoryCommitted {
            allocated: a.memory_allocated,
            needed_mb: request.memory_mb,
            limit,
            ratio: limits.memory_overcommit,
        });
    }
    if node.cpus > 0 && request.vcpus > node.cpus {
        return Err(LeftOut::TooFewCpus {
            vcpus: request.vcpus,
            cpus: node.cpus,
        });
    }
    let needed = request.vcpus;
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

struct Candidate<'a> {
    node: &'a NodeSnapshot,
    storage: String,
    template: Option<u32>,
    same_set: usize,
    total_vms: usize,
    free_memory: u64,
}

impl<'a> Candidate<'a> {
    fn new(
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
        Self {
            node,
            storage: eligible.storage.name,
            template: eligible.template,
            same_set,
            total_vms: node.vms.len() + pending().count(),
            free_memory: eligible.free_memory,
        }
    }
}

/// Picks the node and storage for a request (`docs/architecture.md`, step `pick_node`).
pub fn pick(
    cluster: &ClusterSnapshot,
    request: &PlacementRequest<'_>,
    reservations: &Reservations,
) -> Result<Placement, PlacementError> {
    if let Some(pinned) = request.pinned_node {
        return pick_pinned(cluster, request, pinned);
    }
    let mut rejected = Vec::new();
    let mut candidates = Vec::new();
    for node in &cluster.nodes {
        match node_verdict(node, request, reservations)? {
            Ok(eligible) => candidates.push(Candidate::new(node, eligible, request, reservations)),
            Err(why) => rejected.push((node.name.clone(), why)),
        }
    }
    let count = candidates.len();
    match best(candidates, request.strategy) {
        Some(c) => Ok(Placement {
            node: c.node.name.clone(),
            storage: c.storage,
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

/// A pinned node is the user's choice: it must exist, be online, have as many CPUs as the VM has
/// vCPUs, have a storage, and (with `boot: clone`) be reachable by a clone of the template. Free
/// memory and the overcommit limits are not checked here (there is nowhere else to go, and they
/// change); `validate` reports a shortfall.
fn pick_pinned(
    cluster: &ClusterSnapshot,
    request: &PlacementRequest<'_>,
    pinned: &str,
) -> Result<Placement, PlacementError> {
    let node = pinned_node(cluster, pinned)?;
    if node.cpus > 0 && request.vcpus > node.cpus {
        return Err(PlacementError::PinnedNodeTooSmall {
            node: pinned.to_string(),
            reason: LeftOut::TooFewCpus {
                vcpus: request.vcpus,
                cpus: node.cpus,
            },
        });
    }
    match disk_verdict(node, request)? {
        Ok((storage, template)) => Ok(Placement {
            node: node.name.clone(),
            storage: storage.name,
            template,
            reason: PlacementReason::Pinned,
        }),
        Err(LeftOut::Clone(reason)) => Err(PlacementError::PinnedNodeCannotClone {
            node: pinned.to_string(),
            reason,
        }),
        Err(reason) => Err(PlacementError::PinnedNodeNoStorage {
            node: pinned.to_string(),
            reason,
        }),
    }
}

/// The pinned node, if it exists and is online; else [`PlacementError::PinnedNodeMissing`] or
/// [`PlacementError::PinnedNodeOffline`].
pub fn pinned_node<'c>(
    cluster: &'c ClusterSnapshot,
    pinned: &str,
) -> Result<&'c NodeSnapshot, PlacementError> {
    let Some(node) = cluster.node(pinned) else {
        let mut existing: Vec<String> = cluster
            .node_names()
            .into_iter()
            .map(str::to_owned)
            .collect();
        existing.sort();
        return Err(PlacementError::PinnedNodeMissing {
            node: pinned.to_string(),
            existing,
        });
    };
    if !node.online {
        return Err(PlacementError::PinnedNodeOffline {
            node: pinned.to_string(),
        });
    }
    Ok(node)
}

/// The best candidate by strategy; ties go to the node name, so the choice is deterministic.
fn best(candidates: Vec<Candidate<'_>>, strategy: PlacementStrategy) -> Option<Candidate<'_>> {
    use std::cmp::Reverse;
    let iter = candidates.into_iter();
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

#[cfg(test)]
mod tests;

//! Which node a new VM goes to, and why every other node was left out.
//!
//! Pure: the caller reads the cluster once ([`ClusterSnapshot`]), passes it in, and gets a decision
//! with its reasons. [`node_verdict`] is the rule for one node; [`pick`] applies it to every node and
//! ranks the eligible ones by strategy; `validate` renders the same verdicts for people. Concurrent
//! requests of one machine set would all see the same snapshot and pile onto one node, so decisions
//! also count the in-flight [`Reservations`] that earlier decisions made until their VMs show up in
//! the snapshot.

use std::collections::BTreeMap;
use std::fmt;

use crate::model::{ClusterSnapshot, GIB, MIB, NodeSnapshot, StorageSnapshot};
use crate::pipeline::provider_data::PlacementStrategy;
use crate::pipeline::storage_selector::{SelectorError, StorageSelector};
use crate::rules::storage::{self, Rejection, StorageChoice, StorageNeed};

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
}

/// Why a node was left out, with the numbers behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeftOut {
    NotAllowed,
    Offline,
    MemoryShort {
        free_memory: u64,
        needed_mb: u64,
    },
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: String,
    pub storage: String,
    pub reason: PlacementReason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
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

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("node {node:?} from provider data does not exist; the cluster has: {}", existing.join(", "))]
    PinnedNodeMissing { node: String, existing: Vec<String> },
    #[error("node {node:?} from provider data is offline")]
    PinnedNodeOffline { node: String },
    #[error("node {node:?} from provider data has no usable storage: {reason}")]
    PinnedNodeNoStorage { node: String, reason: LeftOut },
    #[error("no node can take this VM: {}", describe_rejections(.rejected))]
    NothingFits { rejected: Vec<(String, LeftOut)> },
    #[error(transparent)]
    Selector(#[from] SelectorError),
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
}

impl Reservations {
    pub fn reserve(&mut self, request_id: &str, node: &str, set_id: Option<&str>, memory_mb: u64) {
        self.by_request.insert(
            request_id.to_string(),
            Reservation {
                node: node.to_string(),
                set_id: set_id.map(str::to_string),
                memory_bytes: memory_mb.saturating_mul(MIB),
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

/// Free memory on `node` once other requests' reservations are counted, or why it is too little.
pub fn memory_fit(
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
    Ok(free_memory)
}

/// The storage verdict as a node verdict; a selector that fails is a configuration error.
fn storage_verdict(
    node: &NodeSnapshot,
    request: &PlacementRequest<'_>,
) -> Result<Result<StorageSnapshot, LeftOut>, SelectorError> {
    let choice = boot_disk_storage(node, request);
    if let Some(e) = choice.selector_error() {
        return Err(e.clone());
    }
    Ok(match choice.chosen {
        Some(storage) => Ok(storage),
        None => Err(LeftOut::NoStorage {
            need_gb: request.disk_gb,
            selector: request.selector_for(&node.name).to_string(),
            rejected: choice.rejected,
        }),
    })
}

/// The rule for one node when placement chooses: allowed, online, enough memory, a storage that fits,
/// checked in that order (the first failure is the reason).
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
    let free_memory = match memory_fit(node, request, reservations) {
        Ok(free) => free,
        Err(short) => return Ok(Err(short)),
    };
    Ok(storage_verdict(node, request)?.map(|storage| Eligible {
        storage,
        free_memory,
    }))
}

struct Candidate<'a> {
    node: &'a NodeSnapshot,
    storage: String,
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

/// A pinned node is the user's choice: it must exist, be online and have a storage. Memory is not
/// checked here (there is nowhere else to go); `validate` reports a shortfall.
fn pick_pinned(
    cluster: &ClusterSnapshot,
    request: &PlacementRequest<'_>,
    pinned: &str,
) -> Result<Placement, PlacementError> {
    let node = pinned_node(cluster, pinned)?;
    match storage_verdict(node, request)? {
        Ok(storage) => Ok(Placement {
            node: node.name.clone(),
            storage: storage.name,
            reason: PlacementReason::Pinned,
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
mod tests {
    use super::*;
    use crate::model::VmSummary;
    use proptest::prelude::*;

    fn pick(
        nodes: &[NodeSnapshot],
        request: &PlacementRequest<'_>,
        reservations: &Reservations,
    ) -> Result<Placement, PlacementError> {
        super::pick(
            &ClusterSnapshot::from(nodes.to_vec()),
            request,
            reservations,
        )
    }

    fn storage(name: &str, available_gib: u64) -> StorageSnapshot {
        StorageSnapshot {
            name: name.into(),
            storage_type: "lvmthin".into(),
            content: vec!["images".into(), "rootdir".into()],
            enabled: true,
            active: true,
            shared: false,
            available: available_gib * GIB,
        }
    }

    fn node(name: &str, free_gib: u64) -> NodeSnapshot {
        NodeSnapshot {
            name: name.into(),
            online: true,
            memory_used: 0,
            memory_max: free_gib * GIB,
            vms: vec![],
            storages: vec![
                StorageSnapshot {
                    content: vec!["iso".into()],
                    ..storage("local", 50)
                },
                storage("local-lvm", 100),
            ],
        }
    }

    fn request<'a>(
        selector: &'a StorageSelector,
        empty: &'a BTreeMap<String, StorageSelector>,
    ) -> PlacementRequest<'a> {
        PlacementRequest {
            request_id: "req-1",
            memory_mb: 4096,
            disk_gb: 20,
            selector,
            node_selectors: empty,
            pinned_node: None,
            allowed_nodes: &[],
            set_id: Some("workers"),
            strategy: PlacementStrategy::Spread,
        }
    }

    fn any_storage() -> StorageSelector {
        StorageSelector::new("true").unwrap()
    }

    #[test]
    fn pinned_node_must_exist_be_online_and_have_storage() {
        let sel = any_storage();
        let empty = BTreeMap::new();
        let nodes = vec![
            node("pve1", 32),
            NodeSnapshot {
                online: false,
                ..node("pve2", 32)
            },
        ];
        let mut req = request(&sel, &empty);
        req.pinned_node = Some("pve9");
        let err = pick(&nodes, &req, &Reservations::default()).unwrap_err();
        assert_eq!(
            err,
            PlacementError::PinnedNodeMissing {
                node: "pve9".into(),
                existing: vec!["pve1".into(), "pve2".into()]
            }
        );
        assert!(err.to_string().contains("pve1, pve2"));
        req.pinned_node = Some("pve2");
        assert!(matches!(
            pick(&nodes, &req, &Reservations::default()),
            Err(PlacementError::PinnedNodeOffline { .. })
        ));
        req.pinned_node = Some("pve1");
        let placed = pick(&nodes, &req, &Reservations::default()).unwrap();
        assert_eq!(
            (
                placed.node.as_str(),
                placed.storage.as_str(),
                placed.reason.clone()
            ),
            ("pve1", "local-lvm", PlacementReason::Pinned)
        );
        let ceph = StorageSelector::new("name == \"ceph\"").unwrap();
        let req = PlacementRequest {
            selector: &ceph,
            ..req
        };
        let err = pick(&nodes, &req, &Reservations::default()).unwrap_err();
        assert!(matches!(err, PlacementError::PinnedNodeNoStorage { .. }));
        assert!(err.to_string().contains("name == \"ceph\""), "{err}");
    }

    #[test]
    fn prefers_fewest_of_the_set_then_most_memory_then_name() {
        let sel = any_storage();
        let empty = BTreeMap::new();
        let tagged = |n: &str| VmSummary {
            name: n.into(),
            tags: vec!["machine-request.workers".into()],
        };
        let mut a = node("pve1", 64);
        a.vms.push(tagged("w1"));
        let b = node("pve2", 16);
        let c = node("pve3", 32);
        let placed = pick(
            &[a.clone(), b.clone(), c.clone()],
            &request(&sel, &empty),
            &Reservations::default(),
        )
        .unwrap();
        assert_eq!(placed.node, "pve3");
        assert!(
            placed
                .reason
                .to_string()
                .starts_with("automatically picked node")
        );
        let equal = [node("pveb", 8), node("pvea", 8)];
        assert_eq!(
            pick(&equal, &request(&sel, &empty), &Reservations::default())
                .unwrap()
                .node,
            "pvea"
        );
        let mut binpack = request(&sel, &empty);
        binpack.strategy = PlacementStrategy::Binpack;
        assert_eq!(
            pick(
                &[a.clone(), b.clone(), c.clone()],
                &binpack,
                &Reservations::default()
            )
            .unwrap()
            .node,
            "pve2"
        );
        let mut fewer = request(&sel, &empty);
        fewer.strategy = PlacementStrategy::FewerVms;
        assert_eq!(
            pick(&[a, b, c], &fewer, &Reservations::default())
                .unwrap()
                .node,
            "pve3"
        );
    }

    #[test]
    fn rejects_nodes_that_do_not_fit_and_says_why() {
        let sel = StorageSelector::new("storageType == \"lvmthin\"").unwrap();
        let empty = BTreeMap::new();
        let mut small_disk = node("pve1", 64);
        small_disk.storages[1].available = 10 * GIB;
        let low_memory = node("pve2", 2);
        let offline = NodeSnapshot {
            online: false,
            ..node("pve3", 64)
        };
        let outside = node("pve4", 64);
        let allowed = vec!["pve1".to_string(), "pve2".to_string(), "pve3".to_string()];
        let mut req = request(&sel, &empty);
        req.allowed_nodes = &allowed;
        let err = pick(
            &[small_disk, low_memory, offline, outside],
            &req,
            &Reservations::default(),
        )
        .unwrap_err();
        let PlacementError::NothingFits { rejected } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(rejected.len(), 4);
        let text = err.to_string();
        assert!(
            text.contains("pve1: not enough disk space for 20 GiB (local-lvm has 10 GiB free)"),
            "{text}"
        );
        assert!(
            text.contains("pve2: 2048 MiB free memory, 4096 MiB needed"),
            "{text}"
        );
        assert!(
            text.contains("pve3: offline") && text.contains("pve4: not in allowed_nodes"),
            "{text}"
        );
        let err = pick(&[], &req, &Reservations::default()).unwrap_err();
        assert!(err.to_string().contains("no nodes"));
    }

    #[test]
    fn first_matching_storage_in_api_order_and_per_node_selectors() {
        let sel = any_storage();
        let mut n = node("pve1", 64);
        n.storages.push(storage("ceph", 500));
        n.storages.insert(
            1,
            StorageSnapshot {
                active: false,
                ..storage("dead", 500)
            },
        );
        let empty = BTreeMap::new();
        assert_eq!(
            pick(
                std::slice::from_ref(&n),
                &request(&sel, &empty),
                &Reservations::default()
            )
            .unwrap()
            .storage,
            "local-lvm"
        );
        let overrides = BTreeMap::from([(
            "pve1".to_string(),
            StorageSelector::new("name == \"ceph\"").unwrap(),
        )]);
        assert_eq!(
            pick(&[n], &request(&sel, &overrides), &Reservations::default())
                .unwrap()
                .storage,
            "ceph"
        );
    }

    #[test]
    fn selector_runtime_errors_are_configuration_errors() {
        let sel = StorageSelector::new("availableSpace - 1000000000000000u > 0u").unwrap();
        let empty = BTreeMap::new();
        assert!(matches!(
            pick(
                &[node("pve1", 64)],
                &request(&sel, &empty),
                &Reservations::default()
            ),
            Err(PlacementError::Selector(_))
        ));
    }

    #[test]
    fn reservations_count_until_the_vm_appears() {
        let sel = any_storage();
        let empty = BTreeMap::new();
        let mut reservations = Reservations::default();
        reservations.reserve("other", "pve1", Some("workers"), 4096);
        let nodes = [node("pve1", 64), node("pve2", 32)];
        assert_eq!(
            pick(&nodes, &request(&sel, &empty), &reservations)
                .unwrap()
                .node,
            "pve2"
        );
        // Once the VM is visible with its tag, the reservation is not counted twice.
        let mut with_vm = nodes.clone();
        with_vm[0].vms.push(VmSummary {
            name: "other".into(),
            tags: vec!["machine-request.workers".into()],
        });
        with_vm[1].vms.push(VmSummary {
            name: "x".into(),
            tags: vec!["machine-request.workers".into()],
        });
        assert_eq!(
            pick(&with_vm, &request(&sel, &empty), &reservations)
                .unwrap()
                .node,
            "pve1"
        );
        assert!(reservations.release("other").is_some());
        assert!(reservations.is_empty());
    }

    proptest! {
        #[test]
        fn a_set_spreads_evenly_over_equal_nodes(nodes_n in 1usize..5, per_node in 1usize..4, memory in 2048u64..8192) {
            let sel = any_storage();
            let empty = BTreeMap::new();
            let nodes: Vec<NodeSnapshot> = (0..nodes_n).map(|i| node(&format!("pve{i}"), 256)).collect();
            let mut reservations = Reservations::default();
            let mut counts: BTreeMap<String, usize> = BTreeMap::new();
            for r in 0..nodes_n * per_node {
                let id = format!("req-{r}");
                let req = PlacementRequest { request_id: &id, memory_mb: memory, ..request(&sel, &empty) };
                let placed = pick(&nodes, &req, &reservations).unwrap();
                reservations.reserve(&id, &placed.node, Some("workers"), memory);
                *counts.entry(placed.node).or_default() += 1;
            }
            prop_assert_eq!(counts.len(), nodes_n);
            prop_assert!(counts.values().all(|c| *c == per_node), "{:?}", counts);
        }

        #[test]
        fn never_picks_an_ineligible_node(
            specs in proptest::collection::vec((any::<bool>(), 0u64..64, 0u64..200, 0usize..4), 1..6),
            memory_mb in 2048u64..16384,
            disk_gb in 5u64..150,
        ) {
            let sel = any_storage();
            let empty = BTreeMap::new();
            let nodes: Vec<NodeSnapshot> = specs.iter().enumerate().map(|(i, (online, mem, disk, vms))| {
                let mut n = node(&format!("n{i}"), *mem);
                n.online = *online;
                n.storages[1].available = disk * GIB;
                n.vms = (0..*vms).map(|v| VmSummary { name: format!("vm{i}-{v}"), tags: vec![] }).collect();
                n
            }).collect();
            let req = PlacementRequest { memory_mb, disk_gb, ..request(&sel, &empty) };
            match pick(&nodes, &req, &Reservations::default()) {
                Ok(p) => {
                    let n = nodes.iter().find(|n| n.name == p.node).unwrap();
                    prop_assert!(n.online);
                    prop_assert!(n.memory_max - n.memory_used >= memory_mb * MIB);
                    prop_assert!(n.storages[1].available >= disk_gb * GIB);
                }
                Err(PlacementError::NothingFits { rejected }) => prop_assert_eq!(rejected.len(), nodes.len()),
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }
    }

    #[test]
    fn six_requests_of_one_set_spread_two_per_node() {
        let sel = any_storage();
        let empty = BTreeMap::new();
        let nodes = [node("pve1", 64), node("pve2", 64), node("pve3", 64)];
        let mut reservations = Reservations::default();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for r in 0..6 {
            let id = format!("req-{r}");
            let req = PlacementRequest {
                request_id: &id,
                ..request(&sel, &empty)
            };
            let placed = pick(&nodes, &req, &reservations).unwrap();
            reservations.reserve(&id, &placed.node, Some("workers"), 4096);
            *counts.entry(placed.node).or_default() += 1;
        }
        assert_eq!(counts.into_values().collect::<Vec<_>>(), vec![2, 2, 2]);
    }
}

//! The provider data against the cluster as a whole: which nodes placement would consider, the
//! template and which nodes a clone of it reaches, and whether the memory and vCPUs fit somewhere.

use std::collections::BTreeMap;

use super::layers::Layers;
use super::report::{Finding, Outcome, list_or_none};
use crate::model::{ClusterSnapshot, Listing, MIB, NodeSnapshot};
use crate::proxmox::cluster::ClusterHealth;
use crate::proxmox::ha::HaRule;
use crate::proxmox::network::ResourceMapping;
use crate::rules::placement::{
    self, CloneRefusal, CloneSource, LeftOut, PlacementError, PlacementLimits, PlacementRequest,
};
use crate::rules::provider_data::{BootMode, ProviderData, ProviderDataSchema, release_problems};
use crate::rules::storage_selector::StorageSelector;

/// The cluster as the checks see it.
#[derive(Debug, Clone, Default)]
pub struct ClusterFacts {
    /// One `/cluster/resources` read: nodes, guests (templates), storages per node.
    pub resources: Listing,
    /// Bridge (and SDN VNet) names per node that was asked; `Err` says why a node could not be asked.
    /// Nodes missing here are not checked.
    pub bridges: BTreeMap<String, Result<Vec<String>, String>>,
    /// `None`: not read (not needed); `Some(Err)`: could not be read.
    pub pci_mappings: Option<Result<Vec<ResourceMapping>, String>>,
    pub usb_mappings: Option<Result<Vec<ResourceMapping>, String>>,
    /// `GET /version`'s `version` ("8.4.1"), read when a key needs a minimum release (`ha.failback`);
    /// `None`: not read.
    pub pve_version: Option<Result<String, String>>,
    /// `boot: clone`: every copy of the template with where its drives are (`None`: not a clone;
    /// `Some(Err)`: not found, or a copy could not be read).
    pub clone_source: Option<Result<CloneSource, String>>,
    /// The config's `placement:` limits, which placement's verdicts count against.
    pub placement: PlacementLimits,
    /// `GET /cluster/ha/rules`, read when the class puts its VMs in HA rules (`None`: not read;
    /// `Some(Err)`: could not be read).
    pub ha_rules: Option<Result<Vec<HaRule>, String>>,
    /// Quorum and membership (`GET /cluster/status`; `None`: not read).
    pub health: Option<Result<ClusterHealth, String>>,
}

/// The data checked on a node is already resolved with that node's `nodes:` override, so placement
/// gets no per-node selectors on top.
static NO_OVERRIDES: BTreeMap<String, StorageSelector> = BTreeMap::new();

/// The request placement would get for `data` (a class has no request ID or set yet); `allowed` are
/// `data`'s allowed nodes.
pub(crate) fn class_request<'a>(
    data: &'a ProviderData,
    allowed: &'a [String],
    limits: PlacementLimits,
    clone: Option<&'a CloneSource>,
) -> PlacementRequest<'a> {
    PlacementRequest {
        request_id: "",
        memory_mb: data.memory_mb,
        disk_gb: data.total_disk_gb(),
        selector: &data.storage_selector,
        node_selectors: &NO_OVERRIDES,
        pinned_node: data.node.as_ref().map(|n| n.as_str()),
        allowed_nodes: allowed,
        set_id: None,
        strategy: data.placement_strategy,
        vcpus: data.vcpus(),
        limits,
        clone,
        ha: data.ha.as_ref(),
    }
}

fn allowed_names(data: &ProviderData) -> Vec<String> {
    data.allowed_nodes.iter().map(|n| n.to_string()).collect()
}

/// The nodes placement could choose for `data`. A pinned node that does not exist yields nothing
/// (reported by [`super::checks::check_cluster`]).
pub fn candidate_nodes<'c>(
    data: &ProviderData,
    cluster: &'c ClusterSnapshot,
) -> Vec<&'c NodeSnapshot> {
    let allowed = allowed_names(data);
    let request = class_request(data, &allowed, PlacementLimits::default(), None);
    let considered = cluster.nodes.iter().filter(|n| request.considers(&n.name));
    considered.collect()
}

/// Everything one check of the cluster works from.
pub(crate) struct ClusterCheck<'a> {
    pub schema: &'a ProviderDataSchema,
    pub layers: &'a Layers<'a>,
    pub data: &'a ProviderData,
    pub view: &'a ClusterFacts,
    pub cluster: ClusterSnapshot,
    allowed: Vec<String>,
    /// "pve1, pve2", or "none".
    existing: String,
}

impl<'a> ClusterCheck<'a> {
    pub(crate) fn new(
        schema: &'a ProviderDataSchema,
        layers: &'a Layers<'a>,
        data: &'a ProviderData,
        view: &'a ClusterFacts,
    ) -> Self {
        let cluster = ClusterSnapshot::from_resources(&view.resources);
        Self {
            existing: list_or_none(&cluster.node_names()),
            allowed: allowed_names(data),
            schema,
            layers,
            data,
            view,
            cluster,
        }
    }

    /// The findings about the cluster as a whole that need no node's verdicts.
    pub(crate) fn cluster_findings(&self) -> Vec<Finding> {
        let mut out = release_findings(self.data, self.view);
        out.extend(health_finding(self.view));
        self.ha_rule_findings(&mut out);
        self.clone_disk_findings(&mut out);
        self.placement_findings(&mut out);
        self.template(&mut out);
        out
    }
}

impl ClusterCheck<'_> {
    /// The request placement would get for `data` (resolved on some node, or not).
    pub(crate) fn request<'a>(&'a self, data: &'a ProviderData) -> PlacementRequest<'a> {
        let clone = self
            .view
            .clone_source
            .as_ref()
            .and_then(|c| c.as_ref().ok());
        class_request(data, &self.allowed, self.view.placement, clone)
    }

    /// `key` as the user must change it ([`Layers::key`]), for the class as a whole.
    fn key(&self, key: &str) -> String {
        self.layers.key(key, None)
    }
}

/// Quorum and membership: without quorum Proxmox refuses every change (pve-cluster
/// src/PVE/Cluster.pm `check_cfs_quorum`), so nothing of the class can be made until it is back.
fn health_finding(view: &ClusterFacts) -> Option<Finding> {
    let key = "cluster.quorum";
    Some(match view.health.as_ref()? {
        Ok(h) if h.can_write() => Outcome::Pass.finding(key, h.summary()),
        Ok(h) => Outcome::Problem.finding(key, h.summary()),
        Err(why) => Outcome::Skipped.finding(
            key,
            format!("cannot read the cluster's quorum and membership: {why}"),
        ),
    })
}

/// Keys the cluster's Proxmox VE release must support.
fn release_findings(data: &ProviderData, view: &ClusterFacts) -> Vec<Finding> {
    match &view.pve_version {
        Some(Ok(version)) => Outcome::Problem
            .findings(release_problems(data, version))
            .collect(),
        Some(Err(why)) => {
            let key = match data.boot {
                BootMode::Image => "boot",
                _ => "ha.failback",
            };
            let message = format!(
                "cannot read the Proxmox VE version to check that the cluster supports it: {why}"
            );
            vec![Outcome::Skipped.finding(key, message)]
        }
        None => Vec::new(),
    }
}

impl ClusterCheck<'_> {
    /// Boot mode `clone`: an additional disk whose slot a copy of the template fills would never be
    /// made ([`crate::rules::vm_config::additional_disk_clash`]).
    fn clone_disk_findings(&self, out: &mut Vec<Finding>) {
        let Some(Ok(source)) = &self.view.clone_source else {
            return;
        };
        for template in &source.templates {
            let slots: Vec<&str> = template.drives.iter().map(|d| d.slot.as_str()).collect();
            if let Some((i, slot)) =
                crate::rules::vm_config::additional_disk_clash(self.data, &slots)
            {
                out.push(Outcome::Problem.finding(
                    format!("{}[{i}]", self.key("additional_disks")),
                    format!(
                        "goes to {slot}, which template {} (VM {} on {}) already fills: the clone keeps the template's drive there and this disk would never be made",
                        source.wanted, template.vmid, template.node
                    ),
                ));
                return;
            }
        }
    }

    /// The HA rules the class puts its VMs in, against the cluster's rules: shapes Proxmox calls
    /// infeasible whatever the set's size ([`crate::rules::ha::check_join`] for a VM of a set that
    /// has none yet), so every VM of the class would fail its join after being made and started.
    fn ha_rule_findings(&self, out: &mut Vec<Finding>) {
        let (Some(ha), Some(Ok(rules))) = (&self.data.ha, &self.view.ha_rules) else {
            return;
        };
        let membership = crate::rules::ha::HaMembership {
            settings: ha,
            set: Some("(this set)"),
            sid: "",
            set_members: &[],
            cluster_nodes: self.cluster.nodes.len(),
            comment: "",
        };
        if let Err(why) = crate::rules::ha::check_join(&membership, rules) {
            out.push(Outcome::Problem.finding(self.key("ha"), why));
        }
    }

    /// Which nodes could be chosen: the pinned node's verdict, or the allowed nodes and which of them
    /// placement would leave out for being offline.
    fn placement_findings(&self, out: &mut Vec<Finding>) {
        let data = self.data;
        let existing = &self.existing;
        let missing = |key: String, node: &dyn std::fmt::Display, why: &str| {
            let message =
                format!("node \"{node}\" does not exist{why}; the cluster has: {existing}");
            Outcome::Problem.finding(key, message)
        };
        if let Some(pinned) = &data.node {
            let key = self.key("node");
            out.push(match placement::pinned_node(&self.cluster, pinned.as_str()) {
                Ok(n) => Outcome::Pass.finding(key, "exists and is online").on(n.name.as_str()),
                Err(PlacementError::PinnedNodeOffline { node }) => Outcome::Problem.finding(
                    key,
                    format!(
                        "node \"{pinned}\" is offline: nothing can be created until it is back (or pin another node: {existing})"
                    ),
                ).on(node),
                Err(_) => missing(key, pinned, ""),
            });
        } else {
            for (i, allowed) in data.allowed_nodes.iter().enumerate() {
                if self.cluster.node(allowed.as_str()).is_none() {
                    out.push(missing(
                        format!("{}[{i}]", self.key("allowed_nodes")),
                        allowed,
                        "",
                    ));
                }
            }
        }
        // pve-ha-manager src/PVE/API2/HA/Rules.pm `assert_valid_nodes_param`: a rule naming a node that
        // does not exist is refused ("cannot use non-existent node(s)").
        let ha_nodes = data.ha.iter().flat_map(|ha| ha.node_affinity_nodes.iter());
        for (i, ha_node) in ha_nodes.enumerate() {
            if self.cluster.node(ha_node.as_str()).is_none() {
                let key = format!("{}.node_affinity_nodes[{i}]", self.key("ha"));
                out.push(missing(
                    key,
                    ha_node,
                    " (Proxmox refuses an HA rule naming it)",
                ));
            }
        }
        for name in self.layers.nodes.keys() {
            if self.cluster.node(name).is_none() {
                out.push(Outcome::Warning.finding(
                    format!("nodes.{name}"),
                    format!(
                        "the provider config has overrides for node {name:?}, which is not in the cluster ({existing})"
                    ),
                ));
            }
        }
        if data.node.is_none() {
            self.offline_findings(out);
        }
    }

    /// Candidates placement leaves out for being offline ([`LeftOut::Offline`]) are worth a warning;
    /// no online candidate at all is a problem.
    fn offline_findings(&self, out: &mut Vec<Finding>) {
        let key = if self.data.allowed_nodes.is_empty() {
            "node".to_string()
        } else {
            self.key("allowed_nodes")
        };
        let candidates = candidate_nodes(self.data, &self.cluster);
        for node in candidates.iter().filter(|n| !n.online) {
            let message = format!(
                "node is {}: it will not be chosen until it is back; the online nodes are checked",
                LeftOut::Offline
            );
            out.push(
                Outcome::Warning
                    .finding(&key, message)
                    .on(node.name.as_str()),
            );
        }
        if !candidates.iter().any(|n| n.online) {
            out.push(Outcome::Problem.finding(
                key,
                format!(
                    "no online node can be chosen (cluster: {}); nothing can be created",
                    self.existing
                ),
            ));
        }
    }

    /// The template for the whole cluster: its copies, or why there are none.
    fn template(&self, out: &mut Vec<Finding>) {
        let Some(found) = &self.view.clone_source else {
            return;
        };
        let key = self.key("template");
        let source = match found {
            Ok(source) => source,
            Err(why) => return out.push(Outcome::Problem.finding(key, why)),
        };
        let copies: Vec<String> = source
            .templates
            .iter()
            .map(|t| {
                let name = t.name.as_deref().unwrap_or("unnamed");
                format!("{} ({name}) on {}", t.vmid, t.node)
            })
            .collect();
        if !copies.is_empty() {
            out.push(Outcome::Pass.finding(&key, format!("template {}", copies.join(", "))));
        }
        for node in &source.offline {
            out.push(Outcome::Warning.finding(&key, "a copy of the template is on this node, which is offline: it cannot be cloned until the node is back").on(node.as_str()));
        }
    }

    /// `boot: clone`: what each candidate node's clone would be, or why there is none. A pinned
    /// node that cannot take one is a problem; otherwise a node left out is a warning, and no node
    /// at all the problem.
    pub(crate) fn clone_findings(
        &self,
        verdicts: &[(&str, Result<String, CloneRefusal>)],
        out: &mut Vec<Finding>,
    ) {
        if verdicts.is_empty() {
            return;
        }
        let key = self.key("template");
        let pinned = self.data.node.is_some();
        for (node, verdict) in verdicts {
            out.push(
                match verdict {
                    Ok(how) => Outcome::Pass.finding(&key, how),
                    Err(why) if pinned => Outcome::Problem.finding(&key, why.to_string()),
                    Err(why) => Outcome::Warning
                        .finding(&key, format!("placement leaves {node} out: {why}")),
                }
                .on(*node),
            );
        }
        if !pinned && verdicts.iter().all(|(_, v)| v.is_err()) {
            out.push(Outcome::Problem.finding(
                key,
                "no candidate node can take a clone of the template (see the warnings per node); keep a copy of the template on a node, or put it and the selected storage on shared storage",
            ));
        }
    }

    /// Memory and vCPUs must fit somewhere: placement leaves out the nodes where they do not
    /// ([`placement::capacity_fit`]: free memory, then memory and vCPUs given to VMs against the
    /// config's `placement:` limits), so those are warnings and "nowhere" is the problem. A node
    /// left out for its vCPUs is reported under `cores`, for memory under `memory`.
    pub(crate) fn memory_findings(
        &self,
        fits: &[(String, Result<u64, LeftOut>)],
        out: &mut Vec<Finding>,
    ) {
        if fits.is_empty() || self.layers.is_stand_in("memory", None) {
            return;
        }
        let data = self.data;
        let fitting: Vec<&str> = fits
            .iter()
            .filter(|(_, fit)| fit.is_ok())
            .map(|(n, _)| n.as_str())
            .collect();
        let vcpus = self.request(data).vcpus;
        if fitting.is_empty() {
            let (key, message) = self.fits_nowhere(fits, vcpus);
            let finding = Outcome::Problem.finding(key, message);
            out.push(Finding {
                node: data.node.as_ref().map(|n| n.to_string()),
                ..finding
            });
            return;
        }
        let fit = format!(
            "{} MiB and {vcpus} vCPUs fit on {}",
            data.memory_mb,
            fitting.join(", ")
        );
        out.push(Outcome::Pass.finding(self.key("memory"), fit));
        for (node, fit) in fits {
            let Err(why) = fit else { continue };
            let message = match why {
                LeftOut::MemoryShort { free_memory, .. } => format!(
                    "only {} MiB free now, {} MiB needed: this node will be skipped",
                    free_memory / MIB,
                    data.memory_mb
                ),
                why => format!("{why}: this node will be skipped"),
            };
            out.push(
                Outcome::Warning
                    .finding(self.key_for(why), message)
                    .on(node),
            );
        }
    }

    /// The key a node's verdict is about: `cores` for too few CPUs, else `memory`.
    fn key_for(&self, why: &LeftOut) -> String {
        match why {
            LeftOut::CpusCommitted { .. } | LeftOut::TooFewCpus { .. } => self.key("cores"),
            _ => self.key("memory"),
        }
    }

    /// The problem when no candidate node fits the memory and vCPUs: its key and its words.
    fn fits_nowhere(
        &self,
        fits: &[(String, Result<u64, LeftOut>)],
        vcpus: u64,
    ) -> (String, String) {
        let memory_mb = self.data.memory_mb;
        let short = |fit: &Result<u64, LeftOut>| match fit {
            Err(LeftOut::MemoryShort { free_memory, .. }) => Some(*free_memory),
            _ => None,
        };
        // Every node short of memory, or the reasons as they come.
        let free: Option<Vec<String>> = (fits.iter())
            .map(|(n, fit)| Some(format!("{n} {} MiB", short(fit)? / MIB)))
            .collect();
        if let Some(free) = free {
            let free = free.join(", ");
            let message =
                format!("{memory_mb} MiB fits on no candidate node (free memory: {free})");
            return (self.key("memory"), message);
        }
        let left_out = fits
            .iter()
            .filter_map(|(n, fit)| Some((n, fit.as_ref().err()?)));
        let all: Vec<String> = left_out
            .clone()
            .map(|(n, why)| format!("{n}: {why}"))
            .collect();
        let key = (left_out.map(|(_, why)| self.key_for(why)).next())
            .unwrap_or_else(|| self.key("memory"));
        (
            key,
            format!(
                "{memory_mb} MiB and {vcpus} vCPUs fit on no candidate node ({}); raise the config's `placement:` limits, or make room",
                all.join("; ")
            ),
        )
    }
}

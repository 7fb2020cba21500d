//! The provider data against the cluster as a whole: which nodes placement would consider, the
//! template and which nodes a clone of it reaches, and whether the memory and vCPUs fit somewhere.

use std::collections::BTreeMap;

use super::layers::{Layers, Origin};
use super::report::{Finding, Outcome, list_or_none};
use crate::model::Listing;
use crate::model::{ClusterSnapshot, MIB};
use crate::proxmox::cluster::ClusterHealth;
use crate::proxmox::ha::HaRule;
use crate::proxmox::network::mapping::ResourceMapping;
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

/// What placement is asked for a class. The data checked on a node is already resolved with that
/// node's `nodes:` override, so no per-node selectors are passed on top.
pub(crate) struct ClassPlacement {
    allowed: Vec<String>,
    no_overrides: BTreeMap<String, StorageSelector>,
    limits: PlacementLimits,
    clone: Option<CloneSource>,
}

impl ClassPlacement {
    pub(crate) fn new(
        data: &ProviderData,
        limits: PlacementLimits,
        clone: Option<CloneSource>,
    ) -> Self {
        Self {
            allowed: data.allowed_nodes.iter().map(|n| n.to_string()).collect(),
            no_overrides: BTreeMap::new(),
            limits,
            clone,
        }
    }

    /// The request placement would get for `data` (a class has no request ID or set yet).
    pub(crate) fn request<'a>(&'a self, data: &'a ProviderData) -> PlacementRequest<'a> {
        PlacementRequest {
            request_id: "",
            memory_mb: data.memory_mb,
            disk_gb: data.total_disk_gb(),
            selector: &data.storage_selector,
            node_selectors: &self.no_overrides,
            pinned_node: data.node.as_ref().map(|n| n.as_str()),
            allowed_nodes: &self.allowed,
            set_id: None,
            strategy: data.placement_strategy,
            vcpus: data.vcpus(),
            limits: self.limits,
            clone: self.clone.as_ref(),
            ha: data.ha.as_ref(),
        }
    }
}

/// The nodes placement could choose for `data`, as (name, online). A pinned node that does not exist
/// yields nothing (reported by [`check_cluster`]).
pub fn candidate_nodes(data: &ProviderData, cluster: &ClusterSnapshot) -> Vec<(String, bool)> {
    let class = ClassPlacement::new(data, PlacementLimits::default(), None);
    let request = class.request(data);
    cluster
        .nodes
        .iter()
        .filter(|n| request.considers(&n.name))
        .map(|n| (n.name.to_string(), n.online))
        .collect()
}

/// Everything one check of the cluster works from.
pub(crate) struct ClusterCheck<'a> {
    pub schema: &'a ProviderDataSchema,
    /// The layers that resolve the data (with stand-ins when `defaults:` are checked).
    pub layers: &'a Layers<'a>,
    /// The layers as the user wrote them, for key paths.
    pub origin: Origin<'a, 'a>,
    pub data: &'a ProviderData,
    pub view: &'a ClusterFacts,
    pub cluster: ClusterSnapshot,
    pub class: ClassPlacement,
    /// "pve1, pve2", or "none".
    existing: String,
}

impl<'a> ClusterCheck<'a> {
    /// `layers` resolve the data; `written` are the layers as the user wrote them (they differ by
    /// the `stand_ins` when `defaults:` are checked), for key paths.
    pub(crate) fn new(
        schema: &'a ProviderDataSchema,
        layers: &'a Layers<'a>,
        origin: Origin<'a, 'a>,
        data: &'a ProviderData,
        view: &'a ClusterFacts,
    ) -> Self {
        let cluster = ClusterSnapshot::from_resources(&view.resources);
        let existing = list_or_none(&cluster.node_names());
        Self {
            schema,
            layers,
            origin,
            data,
            view,
            class: ClassPlacement::new(
                data,
                view.placement,
                view.clone_source.clone().and_then(Result::ok),
            ),
            cluster,
            existing,
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

/// Quorum and membership: without quorum Proxmox refuses every change (pve-cluster
/// src/PVE/Cluster.pm `check_cfs_quorum`), so nothing of the class can be made until it is back.
fn health_finding(view: &ClusterFacts) -> Option<Finding> {
    let finding = match view.health.as_ref()? {
        Ok(h) if h.can_write() => Finding::new(Outcome::Pass, "cluster.quorum", None, h.summary()),
        Ok(h) => Finding::new(Outcome::Problem, "cluster.quorum", None, h.summary()),
        Err(why) => Finding::new(
            Outcome::Skipped,
            "cluster.quorum",
            None,
            format!("cannot read the cluster's quorum and membership: {why}"),
        ),
    };
    Some(finding)
}

/// Keys the cluster's Proxmox VE release must support.
fn release_findings(data: &ProviderData, view: &ClusterFacts) -> Vec<Finding> {
    match &view.pve_version {
        Some(Ok(version)) => release_problems(data, version)
            .into_iter()
            .map(|p| Finding::new(Outcome::Problem, p.key, None, p.message))
            .collect(),
        Some(Err(why)) => vec![Finding::new(
            Outcome::Skipped,
            if data.boot == BootMode::Image {
                "boot"
            } else {
                "ha.failback"
            },
            None,
            format!(
                "cannot read the Proxmox VE version to check that the cluster supports it: {why}"
            ),
        )],
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
                out.push(Finding::new(
                    Outcome::Problem,
                    format!("{}[{i}]", self.origin.key("additional_disks", None)),
                    None,
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
            out.push(Finding::new(
                Outcome::Problem,
                self.origin.key("ha", None),
                None,
                why,
            ));
        }
    }

    /// Which nodes could be chosen: the pinned node's verdict, or the allowed nodes and which of them
    /// placement would leave out for being offline.
    fn placement_findings(&self, out: &mut Vec<Finding>) {
        let data = self.data;
        let existing = &self.existing;
        if let Some(pinned) = &data.node {
            let key = self.origin.key("node", None);
            out.push(match placement::pinned_node(&self.cluster, pinned.as_str()) {
                Ok(n) => Finding::new(
                    Outcome::Pass,
                    key,
                    Some(n.name.as_str()),
                    "exists and is online".into(),
                ),
                Err(PlacementError::PinnedNodeOffline { node }) => Finding::new(
                    Outcome::Problem,
                    key,
                    Some(&node),
                    format!(
                        "node \"{pinned}\" is offline: nothing can be created until it is back (or pin another node: {existing})"
                    ),
                ),
                Err(_) => Finding::new(
                    Outcome::Problem,
                    key,
                    None,
                    format!("node \"{pinned}\" does not exist; the cluster has: {existing}"),
                ),
            });
        } else {
            for (i, allowed) in data.allowed_nodes.iter().enumerate() {
                if self.cluster.node(allowed.as_str()).is_none() {
                    out.push(Finding::new(
                        Outcome::Problem,
                        format!("{}[{i}]", self.origin.key("allowed_nodes", None)),
                        None,
                        format!("node \"{allowed}\" does not exist; the cluster has: {existing}"),
                    ));
                }
            }
        }
        // pve-ha-manager src/PVE/API2/HA/Rules.pm `assert_valid_nodes_param`: a rule naming a node that
        // does not exist is refused ("cannot use non-existent node(s)").
        let ha_nodes = data.ha.iter().flat_map(|ha| ha.node_affinity_nodes.iter());
        for (i, ha_node) in ha_nodes.enumerate() {
            if self.cluster.node(ha_node.as_str()).is_none() {
                out.push(Finding::new(
                    Outcome::Problem,
                    format!("{}.node_affinity_nodes[{i}]", self.origin.key("ha", None)),
                    None,
                    format!(
                        "node \"{ha_node}\" does not exist (Proxmox refuses an HA rule naming it); the cluster has: {existing}"
                    ),
                ));
            }
        }
        for name in self.origin.layers.nodes.keys() {
            if self.cluster.node(name).is_none() {
                out.push(Finding::new(
                    Outcome::Warning,
                    format!("nodes.{name}"),
                    None,
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
            self.origin.key("allowed_nodes", None)
        };
        let candidates = candidate_nodes(self.data, &self.cluster);
        for (name, online) in &candidates {
            if !online {
                out.push(Finding::new(
                    Outcome::Warning,
                    key.clone(),
                    Some(name),
                    format!(
                        "node is {}: it will not be chosen until it is back; the online nodes are checked",
                        LeftOut::Offline
                    ),
                ));
            }
        }
        if !candidates.iter().any(|(_, online)| *online) {
            out.push(Finding::new(
                Outcome::Problem,
                key,
                None,
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
        let key = self.origin.key("template", None);
        match found {
            Ok(source) => {
                let copies: Vec<String> = source
                    .templates
                    .iter()
                    .map(|t| {
                        format!(
                            "{} ({}) on {}",
                            t.vmid,
                            t.name.as_deref().unwrap_or("unnamed"),
                            t.node
                        )
                    })
                    .collect();
                if !copies.is_empty() {
                    out.push(Finding::new(
                        Outcome::Pass,
                        key.clone(),
                        None,
                        format!("template {}", copies.join(", ")),
                    ));
                }
                for node in &source.offline {
                    out.push(Finding::new(
                        Outcome::Warning,
                        key.clone(),
                        Some(node),
                        "a copy of the template is on this node, which is offline: it cannot be cloned until the node is back".into(),
                    ));
                }
            }
            Err(why) => out.push(Finding::new(Outcome::Problem, key, None, why.clone())),
        }
    }

    /// Which nodes a clone of the template reaches, by placement's rule: a pinned node that cannot is
    /// a problem; otherwise a node left out is a warning, and no node at all the problem.
    /// `boot: clone`: what each candidate node's clone would be, or why there is none.
    pub(crate) fn clone_findings(
        &self,
        verdicts: &[(&str, &Result<String, CloneRefusal>)],
        out: &mut Vec<Finding>,
    ) {
        if verdicts.is_empty() {
            return;
        }
        let key = self.origin.key("template", None);
        let pinned = self.data.node.is_some();
        for (node, verdict) in verdicts {
            out.push(match verdict {
                Ok(how) => Finding::new(Outcome::Pass, key.clone(), Some(node), how.clone()),
                Err(why) if pinned => {
                    Finding::new(Outcome::Problem, key.clone(), Some(node), why.to_string())
                }
                Err(why) => Finding::new(
                    Outcome::Warning,
                    key.clone(),
                    Some(node),
                    format!("placement leaves {node} out: {why}"),
                ),
            });
        }
        if !pinned && verdicts.iter().all(|(_, v)| v.is_err()) {
            out.push(Finding::new(
                Outcome::Problem,
                key,
                None,
                "no candidate node can take a clone of the template (see the warnings per node); keep a copy of the template on a node, or put it and the selected storage on shared storage".into(),
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
        if fits.is_empty() || self.origin.is_stand_in("memory", None) {
            return;
        }
        let data = self.data;
        let fitting: Vec<&str> = fits
            .iter()
            .filter(|(_, fit)| fit.is_ok())
            .map(|(n, _)| n.as_str())
            .collect();
        let vcpus = self.class.request(data).vcpus;
        if fitting.is_empty() {
            let (key, message) = self.fits_nowhere(fits, vcpus);
            out.push(Finding::new(
                Outcome::Problem,
                key,
                data.node.as_ref().map(|n| n.as_str()),
                message,
            ));
            return;
        }
        out.push(Finding::new(
            Outcome::Pass,
            self.origin.key("memory", None),
            None,
            format!(
                "{} MiB and {vcpus} vCPUs fit on {}",
                data.memory_mb,
                fitting.join(", ")
            ),
        ));
        for (node, fit) in fits {
            let message = match fit {
                Ok(_) => continue,
                Err(LeftOut::MemoryShort { free_memory, .. }) => format!(
                    "only {} MiB free now, {} MiB needed: this node will be skipped",
                    free_memory / MIB,
                    data.memory_mb
                ),
                Err(why) => format!("{why}: this node will be skipped"),
            };
            let key = fit
                .as_ref()
                .err()
                .map(|why| self.key_for(why))
                .unwrap_or_default();
            out.push(Finding::new(Outcome::Warning, key, Some(node), message));
        }
    }

    /// The key a node's verdict is about: `cores` for too few CPUs, else `memory`.
    fn key_for(&self, why: &LeftOut) -> String {
        match why {
            LeftOut::CpusCommitted { .. } | LeftOut::TooFewCpus { .. } => {
                self.origin.key("cores", None)
            }
            _ => self.origin.key("memory", None),
        }
    }

    /// The problem when no candidate node fits the memory and vCPUs: its key and its words.
    fn fits_nowhere(
        &self,
        fits: &[(String, Result<u64, LeftOut>)],
        vcpus: u64,
    ) -> (String, String) {
        let data = self.data;
        let short: Vec<(&str, u64)> = fits
            .iter()
            .filter_map(|(n, fit)| match fit {
                Err(LeftOut::MemoryShort { free_memory, .. }) => Some((n.as_str(), *free_memory)),
                _ => None,
            })
            .collect();
        if short.len() == fits.len() {
            let all: Vec<String> = short
                .iter()
                .map(|(n, free)| format!("{n} {} MiB", free / MIB))
                .collect();
            return (
                self.origin.key("memory", None),
                format!(
                    "{} MiB fits on no candidate node (free memory: {})",
                    data.memory_mb,
                    all.join(", ")
                ),
            );
        }
        let all: Vec<String> = fits
            .iter()
            .filter_map(|(n, fit)| fit.as_ref().err().map(|why| format!("{n}: {why}")))
            .collect();
        let key = fits
            .iter()
            .find_map(|(_, fit)| fit.as_ref().err().map(|why| self.key_for(why)))
            .unwrap_or_else(|| self.origin.key("memory", None));
        (
            key,
            format!(
                "{} MiB and {vcpus} vCPUs fit on no candidate node ({}); raise the config's `placement:` limits, or make room",
                data.memory_mb,
                all.join("; ")
            ),
        )
    }
}

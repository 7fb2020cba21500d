//! The provider data against the cluster as a whole: which nodes placement would consider, the
//! template and which nodes a clone of it reaches, and whether the memory and vCPUs fit somewhere.

use std::collections::BTreeMap;

use super::{Finding, Layers, Outcome};
use crate::model::{ClusterSnapshot, MIB, NodeSnapshot};
use crate::proxmox::cluster::{ClusterHealth, ResourceMapping};
use crate::proxmox::ha::HaRule;
use crate::rules::placement::{
    self, CloneRefusal, CloneSource, LeftOut, PlacementError, PlacementLimits, PlacementRequest,
};
use crate::rules::provider_data::{BootMode, ProviderData, release_problems};
use crate::rules::storage_selector::StorageSelector;

/// The cluster as the checks see it.
#[derive(Debug, Clone, Default)]
pub struct ClusterFacts {
    /// One `/cluster/resources` read: the nodes with their storages and guests.
    pub cluster: ClusterSnapshot,
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
    /// `GET /cluster/ha/rules`, read when the class puts its VMs in HA rules (`None`: not read;
    /// `Some(Err)`: could not be read).
    pub ha_rules: Option<Result<Vec<HaRule>, String>>,
    /// Quorum and membership (`GET /cluster/status`; `None`: not read).
    pub health: Option<Result<ClusterHealth, String>>,
}

/// The data checked on a node is already resolved with that node's `nodes:` override, so placement
/// gets no per-node selectors on top.
static NO_OVERRIDES: BTreeMap<String, StorageSelector> = BTreeMap::new();

/// The request placement would get for `data` (a class has no request ID or set yet).
pub(crate) fn class_request<'a>(
    data: &'a ProviderData,
    limits: PlacementLimits,
    clone: Option<&'a CloneSource>,
) -> PlacementRequest<'a> {
    PlacementRequest {
        request_id: "",
        data,
        node_selectors: &NO_OVERRIDES,
        set_id: None,
        limits,
        clone,
    }
}

/// The nodes placement could choose for `data`. A pinned node that does not exist yields nothing
/// (reported by [`super::check_cluster`]).
pub fn candidate_nodes<'c>(
    data: &ProviderData,
    cluster: &'c ClusterSnapshot,
) -> Vec<&'c NodeSnapshot> {
    let request = class_request(data, PlacementLimits::default(), None);
    cluster
        .nodes
        .iter()
        .filter(|n| request.considers(&n.name))
        .collect()
}

/// Everything one check of the cluster works from.
pub(crate) struct ClusterCheck<'a> {
    pub layers: &'a Layers<'a>,
    pub data: &'a ProviderData,
    pub view: &'a ClusterFacts,
    /// "pve1, pve2", or "none".
    pub existing: String,
}

impl ClusterCheck<'_> {
    /// `key` as the user must change it ([`Layers::key`]), for the class as a whole.
    fn key(&self, key: &str) -> String {
        self.layers.key(key, None)
    }

    /// Quorum and membership: without quorum Proxmox refuses every change (pve-cluster
    /// src/PVE/Cluster.pm `check_cfs_quorum`), so nothing of the class can be made until it is back.
    pub(super) fn health_finding(&self) -> Option<Finding> {
        let (outcome, message) = match self.view.health.as_ref()? {
            // A standalone node needs no quorum.
            Ok(h) if h.quorate != Some(false) => (Outcome::Pass, h.summary()),
            Ok(h) => (Outcome::Problem, h.summary()),
            Err(why) => (
                Outcome::Skipped,
                format!("cannot read the cluster's quorum and membership: {why}"),
            ),
        };
        Some(outcome.finding("cluster.quorum", message))
    }

    /// Keys the cluster's Proxmox VE release must support.
    pub(super) fn release_findings(&self) -> Vec<Finding> {
        match &self.view.pve_version {
            Some(Ok(version)) => Outcome::Problem
                .findings(release_problems(self.data, version))
                .collect(),
            Some(Err(why)) => {
                let key = match self.data.boot {
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
    /// Boot mode `clone`: an additional disk whose slot a copy of the template fills would never be
    /// made ([`crate::rules::vm_config::additional_disk_clash`]).
    pub(super) fn clone_disk_findings(&self, out: &mut Vec<Finding>) {
        let Some(Ok(source)) = &self.view.clone_source else {
            return;
        };
        let clash = source.templates.iter().find_map(|t| {
            let slots: Vec<&str> = t.drives.iter().map(|d| d.slot.as_str()).collect();
            Some((
                t,
                crate::rules::vm_config::additional_disk_clash(self.data, &slots)?,
            ))
        });
        if let Some((template, (i, slot))) = clash {
            out.push(Outcome::Problem.finding(
                format!("{}[{i}]", self.key("additional_disks")),
                format!(
                    "goes to {slot}, which template {} (VM {} on {}) already fills: the clone keeps the template's drive there and this disk would never be made",
                    source.wanted, template.vmid, template.node
                ),
            ));
        }
    }

    /// The HA rules the class puts its VMs in, against the cluster's rules: shapes Proxmox calls
    /// infeasible whatever the set's size ([`crate::rules::ha::check_join`] for a VM of a set that
    /// has none yet), so every VM of the class would fail its join after being made and started.
    pub(super) fn ha_rule_findings(&self, out: &mut Vec<Finding>) {
        let (Some(ha), Some(Ok(rules))) = (&self.data.ha, &self.view.ha_rules) else {
            return;
        };
        let membership = crate::rules::ha::HaMembership {
            settings: ha,
            set: Some("(this set)"),
            sid: "",
            set_members: &[],
            cluster_nodes: self.view.cluster.nodes.len(),
            comment: "",
        };
        if let Err(why) = crate::rules::ha::check_join(&membership, rules) {
            out.push(Outcome::Problem.finding(self.key("ha"), why));
        }
    }

    /// Which nodes could be chosen: the pinned node's verdict, or the allowed nodes and which of them
    /// placement would leave out for being offline; every node the data or the config names must
    /// exist.
    pub(super) fn placement_findings(&self, out: &mut Vec<Finding>) {
        let (data, existing) = (self.data, &self.existing);
        let key = self.key("node");
        if let Some(pinned) = &data.node {
            match placement::pinned_node(&self.view.cluster, pinned.as_str()) {
                Ok(n) => out.push(
                    Outcome::Pass
                        .finding(&key, "exists and is online")
                        .on(n.name.as_str()),
                ),
                Err(PlacementError::PinnedNodeOffline { node }) => {
                    let message = format!(
                        "node \"{pinned}\" is offline: nothing can be created until it is back (or pin another node: {existing})"
                    );
                    out.push(Outcome::Problem.finding(&key, message).on(node));
                }
                // A missing node is reported below, with the other names.
                Err(_) => {}
            }
        }
        let pinned = data.node.iter().map(|n| (key.clone(), n, ""));
        let allowed = data.allowed_nodes.iter().filter(|_| data.node.is_none());
        let allowed = (allowed.enumerate())
            .map(|(i, n)| (format!("{}[{i}]", self.key("allowed_nodes")), n, ""));
        // pve-ha-manager src/PVE/API2/HA/Rules.pm `assert_valid_nodes_param`: a rule naming a node that
        // does not exist is refused ("cannot use non-existent node(s)").
        let ha_nodes = data.ha.iter().flat_map(|ha| ha.node_affinity_nodes.iter());
        let ha_nodes = ha_nodes.enumerate().map(|(i, n)| {
            let key = format!("{}.node_affinity_nodes[{i}]", self.key("ha"));
            (key, n, " (Proxmox refuses an HA rule naming it)")
        });
        for (key, node, why) in pinned.chain(allowed).chain(ha_nodes) {
            if self.view.cluster.node(node.as_str()).is_none() {
                let message =
                    format!("node \"{node}\" does not exist{why}; the cluster has: {existing}");
                out.push(Outcome::Problem.finding(key, message));
            }
        }
        for name in self.layers.config.nodes.keys() {
            if self.view.cluster.node(name).is_none() {
                let message = format!(
                    "the provider config has overrides for node {name:?}, which is not in the cluster ({existing})"
                );
                out.push(Outcome::Warning.finding(format!("nodes.{name}"), message));
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
        let candidates = candidate_nodes(self.data, &self.view.cluster);
        for node in candidates.iter().filter(|n| !n.online) {
            let message = format!(
                "node is {}: it will not be chosen until it is back; the online nodes are checked",
                LeftOut::Offline
            );
            let finding = Outcome::Warning.finding(&key, message);
            out.push(finding.on(node.name.as_str()));
        }
        if !candidates.iter().any(|n| n.online) {
            let message = format!(
                "no online node can be chosen (cluster: {}); nothing can be created",
                self.existing
            );
            out.push(Outcome::Problem.finding(key, message));
        }
    }

    /// The template for the whole cluster: its copies, or why there are none.
    pub(super) fn template(&self, out: &mut Vec<Finding>) {
        let key = self.key("template");
        let source = match &self.view.clone_source {
            None => return,
            Some(Err(why)) => return out.push(Outcome::Problem.finding(key, why)),
            Some(Ok(source)) => source,
        };
        let copies: Vec<String> = (source.templates.iter())
            .map(|t| (t, t.name.as_deref().unwrap_or("unnamed")))
            .map(|(t, name)| format!("{} ({name}) on {}", t.vmid, t.node))
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
            let (outcome, message) = match verdict {
                Ok(how) => (Outcome::Pass, how.clone()),
                Err(why) if pinned => (Outcome::Problem, why.to_string()),
                Err(why) => (
                    Outcome::Warning,
                    format!("placement leaves {node} out: {why}"),
                ),
            };
            out.push(outcome.finding(&key, message).on(*node));
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
        fitting: &[&str],
        left_out: &[(&str, LeftOut)],
        out: &mut Vec<Finding>,
    ) {
        if (fitting.is_empty() && left_out.is_empty()) || self.layers.is_stand_in("memory", None) {
            return;
        }
        let data = self.data;
        if fitting.is_empty() {
            let node = data.node.as_ref().map(|n| n.to_string());
            return out.push(Finding {
                node,
                ..self.fits_nowhere(left_out)
            });
        }
        let fit = format!(
            "{} MiB and {} vCPUs fit on {}",
            data.memory_mb,
            data.vcpus(),
            fitting.join(", ")
        );
        out.push(Outcome::Pass.finding(self.key("memory"), fit));
        for (node, why) in left_out {
            let message = match why {
                LeftOut::MemoryShort { free_memory, .. } => format!(
                    "only {} MiB free now, {} MiB needed",
                    free_memory / MIB,
                    data.memory_mb
                ),
                why => why.to_string(),
            };
            let message = format!("{message}: this node will be skipped");
            let finding = Outcome::Warning.finding(self.key_for(why), message);
            out.push(finding.on(*node));
        }
    }

    /// The key a node's verdict is about: `cores` for too few CPUs, else `memory`.
    fn key_for(&self, why: &LeftOut) -> String {
        match why {
            LeftOut::CpusCommitted { .. } | LeftOut::TooFewCpus { .. } => self.key("cores"),
            _ => self.key("memory"),
        }
    }

    /// The problem when every candidate node is left out for its memory or vCPUs.
    fn fits_nowhere(&self, left_out: &[(&str, LeftOut)]) -> Finding {
        let memory_mb = self.data.memory_mb;
        // Every node short of memory, or the reasons as they come.
        let free: Option<Vec<String>> = (left_out.iter())
            .map(|(n, why)| match why {
                LeftOut::MemoryShort { free_memory, .. } => {
                    Some(format!("{n} {} MiB", free_memory / MIB))
                }
                _ => None,
            })
            .collect();
        if let Some(free) = free {
            let message = format!(
                "{memory_mb} MiB fits on no candidate node (free memory: {})",
                free.join(", ")
            );
            return Outcome::Problem.finding(self.key("memory"), message);
        }
        let all: Vec<String> = (left_out.iter())
            .map(|(n, why)| format!("{n}: {why}"))
            .collect();
        let key =
            (left_out.first()).map_or_else(|| self.key("memory"), |(_, why)| self.key_for(why));
        let message = format!(
            "{memory_mb} MiB and {} vCPUs fit on no candidate node ({}); raise the config's `placement:` limits, or make room",
            self.data.vcpus(),
            all.join("; ")
        );
        Outcome::Problem.finding(key, message)
    }
}

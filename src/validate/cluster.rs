//! The provider data against the cluster as a whole: which nodes placement would consider, the
//! template, and whether the memory fits somewhere. Each node placement could choose is checked in
//! [`super::node`].

use std::collections::BTreeMap;

use super::layers::{Layers, Origin};
use super::node::check_node;
use super::report::{Finding, Outcome};
use crate::model::{ClusterSnapshot, MIB};
use crate::pipeline::prepare_image::choose_template;
use crate::pipeline::provider_data::{
    BootMode, ProviderData, ProviderDataSchema, release_problems,
};
use crate::pipeline::storage_selector::StorageSelector;
use crate::proxmox::network::mapping::ResourceMapping;
use crate::proxmox::types::{ClusterResource, NodeName};
use crate::rules::placement::{self, LeftOut, PlacementError, PlacementRequest};

/// The cluster as the checks see it.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// One `/cluster/resources` read: nodes, guests (templates), storages per node.
    pub resources: Vec<ClusterResource>,
    /// Bridge (and SDN VNet) names per node that was asked; `Err` says why a node could not be asked.
    /// Nodes missing here are not checked.
    pub bridges: BTreeMap<String, Result<Vec<String>, String>>,
    /// `None`: not read (not needed); `Some(Err)`: could not be read.
    pub pci_mappings: Option<Result<Vec<ResourceMapping>, String>>,
    pub usb_mappings: Option<Result<Vec<ResourceMapping>, String>>,
    /// `GET /version`'s `version` ("8.4.1"), read when a key needs a minimum release (`ha.failback`);
    /// `None`: not read.
    pub pve_version: Option<Result<String, String>>,
}

/// What placement is asked for a class. The data checked on a node is already resolved with that
/// node's `nodes:` override, so no per-node selectors are passed on top.
pub(crate) struct ClassPlacement {
    allowed: Vec<String>,
    no_overrides: BTreeMap<String, StorageSelector>,
}

impl ClassPlacement {
    pub(crate) fn new(data: &ProviderData) -> Self {
        Self {
            allowed: data.allowed_nodes.iter().map(|n| n.to_string()).collect(),
            no_overrides: BTreeMap::new(),
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
        }
    }
}

/// The nodes placement could choose for `data`, as (name, online). A pinned node that does not exist
/// yields nothing (reported by [`check_cluster`]).
pub fn candidate_nodes(data: &ProviderData, cluster: &ClusterSnapshot) -> Vec<(String, bool)> {
    let class = ClassPlacement::new(data);
    let request = class.request(data);
    cluster
        .nodes
        .iter()
        .filter(|n| request.considers(&n.name))
        .map(|n| (n.name.clone(), n.online))
        .collect()
}

/// Step 2, pure: `data` (the class resolved without a node override) against the cluster.
pub fn check_cluster(
    schema: &ProviderDataSchema,
    layers: &Layers<'_>,
    data: &ProviderData,
    view: &ClusterView,
) -> Vec<Finding> {
    check_cluster_inner(schema, layers, layers, data, view, &[])
}

/// Everything one check of the cluster works from.
pub(crate) struct ClusterCheck<'a> {
    pub schema: &'a ProviderDataSchema,
    /// The layers that resolve the data (with stand-ins when `defaults:` are checked).
    pub layers: &'a Layers<'a>,
    /// The layers as the user wrote them, for key paths.
    pub origin: Origin<'a, 'a>,
    pub data: &'a ProviderData,
    pub view: &'a ClusterView,
    pub cluster: ClusterSnapshot,
    pub class: ClassPlacement,
    /// "pve1, pve2", or "none".
    existing: String,
}

/// `layers` resolve the data; `written` are the layers as the user wrote them (they differ by the
/// `stand_ins` when `defaults:` are checked), for key paths.
pub(crate) fn check_cluster_inner(
    schema: &ProviderDataSchema,
    layers: &Layers<'_>,
    written: &Layers<'_>,
    data: &ProviderData,
    view: &ClusterView,
    stand_ins: &[&str],
) -> Vec<Finding> {
    let cluster = ClusterSnapshot::from_resources(&view.resources);
    let names = cluster.node_names();
    let existing = if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    };
    let check = ClusterCheck {
        schema,
        layers,
        origin: Origin {
            layers: written,
            stand_ins,
        },
        data,
        view,
        class: ClassPlacement::new(data),
        cluster,
        existing,
    };
    let mut out = release_findings(data, view);
    check.placement_findings(&mut out);
    let template = check.template(&mut out);
    let request = check.class.request(data);
    let mut memory = Vec::new();
    for node in check
        .cluster
        .nodes
        .iter()
        .filter(|n| n.online && request.considers(&n.name))
    {
        if let Some(fit) = check_node(&check, node, template.as_deref(), &mut out) {
            memory.push((node.name.clone(), fit));
        }
    }
    check.memory_findings(&memory, &mut out);
    out
}

/// Keys the cluster's Proxmox VE release must support.
fn release_findings(data: &ProviderData, view: &ClusterView) -> Vec<Finding> {
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
                    Some(&n.name),
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

    /// The template is one for the whole cluster: the node it is on, when it is found.
    fn template(&self, out: &mut Vec<Finding>) -> Option<String> {
        let (BootMode::Clone, Some(wanted)) = (self.data.boot, &self.data.template) else {
            return None;
        };
        let key = self.origin.key("template", None);
        let anchor = candidate_nodes(self.data, &self.cluster)
            .into_iter()
            .next()
            .and_then(|(n, _)| NodeName::new(n).ok())?;
        match choose_template(&self.view.resources, wanted, &anchor) {
            Ok(t) => {
                out.push(Finding::new(
                    Outcome::Pass,
                    key,
                    None,
                    format!(
                        "template {} ({}) is on {}",
                        t.vmid,
                        t.name.as_deref().unwrap_or("unnamed"),
                        t.node
                    ),
                ));
                Some(t.node.to_string())
            }
            Err(e) => {
                out.push(Finding::new(Outcome::Problem, key, None, e.to_string()));
                None
            }
        }
    }

    /// Memory must fit somewhere: placement leaves out the nodes where it does not
    /// ([`placement::memory_fit`]), so those are warnings and "nowhere" is the problem.
    fn memory_findings(&self, fits: &[(String, Result<u64, LeftOut>)], out: &mut Vec<Finding>) {
        if fits.is_empty() || self.origin.is_stand_in("memory", None) {
            return;
        }
        let data = self.data;
        let key = self.origin.key("memory", None);
        let free = |fit: &Result<u64, LeftOut>| match fit {
            Ok(free)
            | Err(LeftOut::MemoryShort {
                free_memory: free, ..
            }) => *free,
            Err(_) => 0,
        };
        let fitting: Vec<&str> = fits
            .iter()
            .filter(|(_, fit)| fit.is_ok())
            .map(|(n, _)| n.as_str())
            .collect();
        if fitting.is_empty() {
            let all: Vec<String> = fits
                .iter()
                .map(|(n, fit)| format!("{n} {} MiB", free(fit) / MIB))
                .collect();
            out.push(Finding::new(
                Outcome::Problem,
                key,
                data.node.as_ref().map(|n| n.as_str()),
                format!(
                    "{} MiB fits on no candidate node (free memory: {})",
                    data.memory_mb,
                    all.join(", ")
                ),
            ));
            return;
        }
        out.push(Finding::new(
            Outcome::Pass,
            key.clone(),
            None,
            format!("{} MiB fits on {}", data.memory_mb, fitting.join(", ")),
        ));
        for (node, fit) in fits.iter().filter(|(_, fit)| fit.is_err()) {
            out.push(Finding::new(
                Outcome::Warning,
                key.clone(),
                Some(node),
                format!(
                    "only {} MiB free now, {} MiB needed: this node will be skipped",
                    free(fit) / MIB,
                    data.memory_mb
                ),
            ));
        }
    }
}

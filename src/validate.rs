//! Checking a machine class's provider data (or the config's `defaults:`) before it is used.
//!
//! The official provider finds out that a storage selector matches nothing, a bridge is missing or a
//! template is not a template only when it creates a VM, on whichever node it picked, and then shows
//! "Provisioning" forever. Here the same data goes through the schema and the pipeline's rules, then
//! through the live cluster, node by node for every node placement could choose, and every finding is
//! reported with the key to change and the node it concerns.
//!
//! The decisions are pure ([`check_schema`], [`check_cluster`], [`check_defaults_against`]): they take
//! parsed data and a [`ClusterView`] and return findings, so they are tested without a network. The
//! reads ([`gather`]) are at the edge: one `/cluster/resources`, the bridges of the candidate nodes
//! (in parallel), and the PCI/USB resource mappings only when the data uses them. The `validate`
//! command and the provider's health check ([`check_defaults`]) share all of it.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::config::ProviderConfig;
use crate::pipeline::pick_node;
use crate::pipeline::placement::{NodeSnapshot, StorageSnapshot};
use crate::pipeline::prepare_image::choose_template;
use crate::pipeline::provider_data::{
    BootMode, ProviderData, ProviderDataSchema, ha_failback_problem,
};
use crate::pipeline::storage_selector::StorageSelector;
use crate::proxmox::network::mapping::ResourceMapping;
use crate::proxmox::network::{MappingKind, NetworkFilter};
use crate::proxmox::types::{ClusterResource, NodeName};
use crate::proxmox::{ProxmoxClient, ProxmoxError};

const GIB: u64 = 1024 * 1024 * 1024;
const MIB: u64 = 1024 * 1024;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Fine.
    Pass,
    /// Could not be checked (the cluster does not offer the data); says why.
    Skipped,
    /// Worth knowing, but provisioning can work (a candidate node is offline, ...).
    Warning,
    /// Provisioning would fail (or fail on some node): fix the key named.
    Problem,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Pass => "ok",
            Outcome::Skipped => "skip",
            Outcome::Warning => "warn",
            Outcome::Problem => "FAIL",
        }
    }
}

/// One result: which key, on which node, and what was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub outcome: Outcome,
    /// The key to change, with the layer it came from: `storage_selector`,
    /// `additional_disks[0].storage_selector`, `nodes.pve2.network_bridge`, `defaults.template`.
    pub key: String,
    /// The node the finding is about, when it is about one.
    pub node: Option<String>,
    pub message: String,
}

impl Finding {
    fn new(outcome: Outcome, key: impl Into<String>, node: Option<&str>, message: String) -> Self {
        Self {
            outcome,
            key: key.into(),
            node: node.map(str::to_owned),
            message,
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node {
            Some(node) => write!(f, "{} (on {node}): {}", self.key, self.message),
            None => write!(f, "{}: {}", self.key, self.message),
        }
    }
}

/// Everything found, in check order. `ok` is false when there is at least one problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub ok: bool,
    pub problems: usize,
    pub warnings: usize,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn new(findings: Vec<Finding>) -> Self {
        let count = |o| findings.iter().filter(|f| f.outcome == o).count();
        let problems = count(Outcome::Problem);
        Self {
            ok: problems == 0,
            problems,
            warnings: count(Outcome::Warning),
            findings,
        }
    }

    pub fn problems(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.outcome == Outcome::Problem)
    }

    /// The report for people: one line per finding, then a verdict.
    pub fn render_text(&self) -> String {
        let key_width = self
            .findings
            .iter()
            .map(|f| f.key.chars().count())
            .max()
            .unwrap_or(0);
        let node_width = self
            .findings
            .iter()
            .map(|f| f.node.as_deref().unwrap_or("-").chars().count())
            .max()
            .unwrap_or(0);
        let mut out = String::new();
        for f in &self.findings {
            let _ = writeln!(
                out,
                "{:<4}  {:<key_width$}  {:<node_width$}  {}",
                f.outcome.label(),
                f.key,
                f.node.as_deref().unwrap_or("-"),
                f.message
            );
        }
        out.push('\n');
        if self.ok {
            let _ = writeln!(out, "OK: no problems found ({} warning(s)).", self.warnings);
        } else {
            let _ = writeln!(
                out,
                "{} problem(s), {} warning(s): fix the keys marked FAIL before using this provider data.",
                self.problems, self.warnings
            );
        }
        out
    }
}

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

/// Where the provider data comes from: the class's YAML over the config's `nodes:` and `defaults:`.
#[derive(Debug, Clone, Copy)]
pub struct Layers<'a> {
    pub class_yaml: &'a str,
    pub defaults: &'a Map<String, Value>,
    pub nodes: &'a Map<String, Value>,
}

impl<'a> Layers<'a> {
    pub fn new(class_yaml: &'a str, config: &'a ProviderConfig) -> Self {
        Self {
            class_yaml,
            defaults: &config.defaults,
            nodes: &config.nodes,
        }
    }

    fn node_override(&self, node: &str) -> Option<&'a Map<String, Value>> {
        self.nodes.get(node).and_then(Value::as_object)
    }

    /// The provider data as it would be on `node` (its override applied), or the problems.
    fn resolve_on(
        &self,
        schema: &ProviderDataSchema,
        node: Option<&str>,
    ) -> Result<ProviderData, Vec<crate::pipeline::provider_data::Problem>> {
        let over = node.and_then(|n| self.node_override(n).map(|m| (n, m)));
        schema.resolve(self.class_yaml, over, self.defaults)
    }
}

/// Step 1, pure: the provider data against the schema and the pipeline's rules (and the config's
/// overrides). `Ok` carries the data as it is before any per-node override, for the cluster checks.
pub fn check_schema(
    schema: &ProviderDataSchema,
    layers: &Layers<'_>,
) -> (Vec<Finding>, Option<ProviderData>) {
    let overrides = schema.check_config_overrides(layers.defaults, layers.nodes);
    let mut findings: Vec<Finding> = overrides
        .problems
        .into_iter()
        .map(|p| Finding::new(Outcome::Problem, p.key, None, p.message))
        .chain(
            overrides
                .warnings
                .into_iter()
                .map(|p| Finding::new(Outcome::Warning, p.key, None, p.message)),
        )
        .collect();
    // The class's own warnings (those of `defaults:` and `nodes:` came with the overrides above),
    // also when the class fails: an ignored misspelling often explains a missing key.
    if let Ok(class) = ProviderDataSchema::class_map(layers.class_yaml) {
        findings.extend(
            schema
                .check_layer("", &Value::Object(class))
                .warnings
                .into_iter()
                .map(|w| Finding::new(Outcome::Warning, w.key, None, w.message)),
        );
    }
    match layers.resolve_on(schema, None) {
        Ok(data) => {
            if !findings.iter().any(|f| f.outcome == Outcome::Problem) {
                findings.push(Finding::new(
                    Outcome::Pass,
                    "provider_data",
                    None,
                    "matches the schema and the pipeline's rules".into(),
                ));
            }
            (findings, Some(data))
        }
        Err(problems) => {
            findings.extend(
                problems
                    .into_iter()
                    .map(|p| Finding::new(Outcome::Problem, p.key, None, p.message)),
            );
            findings.push(Finding::new(
                Outcome::Skipped,
                "cluster",
                None,
                "not checked against the cluster until the problems above are fixed".into(),
            ));
            (findings, None)
        }
    }
}

/// The nodes placement could choose for `data`, as (name, online). A pinned node that does not exist
/// yields nothing (reported by [`check_cluster`]).
pub fn candidate_nodes(data: &ProviderData, nodes: &[NodeSnapshot]) -> Vec<(String, bool)> {
    nodes
        .iter()
        .filter(|n| match &data.node {
            Some(pinned) => n.name == pinned.as_str(),
            None => {
                data.allowed_nodes.is_empty()
                    || data.allowed_nodes.iter().any(|a| a.as_str() == n.name)
            }
        })
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

/// `layers` resolve the data; `written` are the layers as the user wrote them (they differ by the
/// `stand_ins` when `defaults:` are checked), for key paths.
fn check_cluster_inner(
    schema: &ProviderDataSchema,
    layers: &Layers<'_>,
    written: &Layers<'_>,
    data: &ProviderData,
    view: &ClusterView,
    stand_ins: &[&str],
) -> Vec<Finding> {
    let nodes = pick_node::snapshot(&view.resources);
    let origin = Origin {
        layers: written,
        stand_ins,
    };
    let mut out = Vec::new();
    match &view.pve_version {
        Some(Ok(version)) => {
            if let Some(p) = ha_failback_problem(data, version) {
                out.push(Finding::new(Outcome::Problem, p.key, None, p.message));
            }
        }
        Some(Err(why)) => out.push(Finding::new(
            Outcome::Skipped,
            "ha.failback",
            None,
            format!(
                "cannot read the Proxmox VE version to check that the cluster supports it: {why}"
            ),
        )),
        None => {}
    }
    let existing: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let existing_text = if existing.is_empty() {
        "none".to_string()
    } else {
        existing.join(", ")
    };

    // Which nodes could be chosen.
    if let Some(pinned) = &data.node {
        let key = origin.key("node", None);
        match nodes.iter().find(|n| n.name == pinned.as_str()) {
            None => out.push(Finding::new(
                Outcome::Problem,
                key,
                None,
                format!("node \"{pinned}\" does not exist; the cluster has: {existing_text}"),
            )),
            Some(n) if !n.online => out.push(Finding::new(
                Outcome::Problem,
                key,
                Some(&n.name),
                format!(
                    "node \"{pinned}\" is offline: nothing can be created until it is back (or pin another node: {existing_text})"
                ),
            )),
            Some(n) => out.push(Finding::new(
                Outcome::Pass,
                key,
                Some(&n.name),
                "exists and is online".into(),
            )),
        }
    } else {
        for (i, allowed) in data.allowed_nodes.iter().enumerate() {
            if !existing.contains(&allowed.as_str()) {
                out.push(Finding::new(
                    Outcome::Problem,
                    format!("{}[{i}]", origin.key("allowed_nodes", None)),
                    None,
                    format!("node \"{allowed}\" does not exist; the cluster has: {existing_text}"),
                ));
            }
        }
    }
    for name in written.nodes.keys() {
        if !existing.contains(&name.as_str()) {
            out.push(Finding::new(
                Outcome::Warning,
                format!("nodes.{name}"),
                None,
                format!(
                    "the provider config has overrides for node {name:?}, which is not in the cluster ({existing_text})"
                ),
            ));
        }
    }
    let candidates = candidate_nodes(data, &nodes);
    let placement_key = if data.allowed_nodes.is_empty() {
        "node".to_string()
    } else {
        origin.key("allowed_nodes", None)
    };
    if data.node.is_none() {
        for (name, online) in &candidates {
            if !online {
                out.push(Finding::new(
                    Outcome::Warning,
                    placement_key.clone(),
                    Some(name),
                    "node is offline: it will not be chosen until it is back; the online nodes are checked".into(),
                ));
            }
        }
        if !candidates.iter().any(|(_, online)| *online) {
            out.push(Finding::new(
                Outcome::Problem,
                placement_key.clone(),
                None,
                format!(
                    "no online node can be chosen (cluster: {existing_text}); nothing can be created"
                ),
            ));
        }
    }

    // The template is one for the whole cluster.
    let template = match (data.boot, &data.template) {
        (BootMode::Clone, Some(wanted)) => {
            let key = origin.key("template", None);
            let anchor = candidates
                .first()
                .and_then(|(n, _)| NodeName::new(n.clone()).ok());
            match anchor
                .as_ref()
                .map(|node| choose_template(&view.resources, wanted, node))
            {
                Some(Ok(t)) => {
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
                Some(Err(e)) => {
                    out.push(Finding::new(Outcome::Problem, key, None, e.to_string()));
                    None
                }
                None => None,
            }
        }
        _ => None,
    };

    // Node by node.
    let mut memory_fit: Vec<(String, u64, bool)> = Vec::new();
    for node in nodes
        .iter()
        .filter(|n| n.online && candidates.iter().any(|(c, _)| c == &n.name))
    {
        let here =
            match layers.resolve_on(schema, Some(&node.name)) {
                Ok(d) => d,
                Err(problems) => {
                    out.extend(problems.into_iter().map(|p| {
                        Finding::new(Outcome::Problem, p.key, Some(&node.name), p.message)
                    }));
                    continue;
                }
            };
        let n = node.name.as_str();

        // Disks.
        let main = check_storage(
            node,
            Some(&here.storage_selector),
            here.total_disk_gb(),
            "images",
        );
        let main_storage = main.as_ref().ok().map(|s| s.name.clone());
        if !origin.is_stand_in("storage_selector", Some(n)) {
            let skipped_by_placement = data.node.is_none() && main.is_err();
            out.push(storage_finding(
                origin.key("storage_selector", Some(n)),
                n,
                Some(&here.storage_selector),
                here.total_disk_gb(),
                main,
                "VM disks",
            ));
            if skipped_by_placement && let Some(last) = out.last_mut() {
                last.message.push_str(&format!(
                    " (placement would skip {n}; fix the selector, add a `nodes.{n}.storage_selector` override, or leave {n} out of `allowed_nodes`)"
                ));
            }
        }
        for (i, disk) in here.additional_disks.iter().enumerate() {
            let result = check_storage(node, Some(&disk.storage_selector), disk.size_gb, "images");
            out.push(storage_finding(
                format!(
                    "{}[{i}].storage_selector",
                    origin.key("additional_disks", Some(n))
                ),
                n,
                Some(&disk.storage_selector),
                disk.size_gb,
                result,
                "VM disks",
            ));
        }

        // Boot image.
        match here.boot {
            BootMode::Iso if !origin.is_stand_in("iso_storage_selector", Some(n)) => {
                let selector = here.iso_storage_selector.as_ref();
                let result = check_storage(node, selector, 0, "iso");
                out.push(storage_finding(
                    origin.key("iso_storage_selector", Some(n)),
                    n,
                    selector,
                    0,
                    result,
                    "ISO images",
                ));
            }
            BootMode::Iso => {}
            BootMode::Clone => {
                if let (Some(template_node), Some(storage)) = (&template, &main_storage) {
                    let shared = node.storages.iter().any(|s| &s.name == storage && s.shared);
                    if template_node != n && !shared {
                        out.push(Finding::new(
                            Outcome::Problem,
                            origin.key("template", Some(n)),
                            Some(n),
                            format!(
                                "the template is on {template_node}, and Proxmox clones to another node only onto shared storage ({storage} is local to {n}); keep a copy of the template on {n}, limit the class with `node`/`allowed_nodes`, or select a shared storage with storage_selector"
                            ),
                        ));
                    }
                }
            }
        }

        // Networks.
        let mut wanted = vec![(
            origin.key("network_bridge", Some(n)),
            here.network_bridge.to_string(),
        )];
        for (i, nic) in here.additional_nics.iter().enumerate() {
            wanted.push((
                format!("{}[{i}].bridge", origin.key("additional_nics", Some(n))),
                nic.bridge.to_string(),
            ));
        }
        match view.bridges.get(n) {
            None => {}
            Some(Err(why)) => out.push(Finding::new(
                Outcome::Warning,
                origin.key("network_bridge", Some(n)),
                Some(n),
                format!("bridges not checked: {why}"),
            )),
            Some(Ok(bridges)) => {
                for (key, bridge) in wanted {
                    if origin.is_stand_in("network_bridge", Some(n))
                        && key.ends_with("network_bridge")
                    {
                        continue;
                    }
                    if bridges.iter().any(|b| b == &bridge) {
                        out.push(Finding::new(
                            Outcome::Pass,
                            key,
                            Some(n),
                            format!("bridge {bridge} exists"),
                        ));
                    } else {
                        out.push(Finding::new(
                            Outcome::Problem,
                            key,
                            Some(n),
                            format!(
                                "bridge {bridge:?} does not exist on {n}; its bridges: {}",
                                list_or_none(bridges)
                            ),
                        ));
                    }
                }
            }
        }

        // Passthrough devices.
        let pci: Vec<(String, String)> = here
            .pci_devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    format!("{}[{i}].mapping", origin.key("pci_devices", Some(n))),
                    d.mapping.to_string(),
                )
            })
            .collect();
        let usb: Vec<(String, String)> = here
            .usb_devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    format!("{}[{i}].mapping", origin.key("usb_devices", Some(n))),
                    d.mapping.to_string(),
                )
            })
            .collect();
        check_mappings(&mut out, n, "PCI", &pci, view.pci_mappings.as_ref());
        check_mappings(&mut out, n, "USB", &usb, view.usb_mappings.as_ref());

        let free = node.memory_max.saturating_sub(node.memory_used);
        memory_fit.push((
            node.name.clone(),
            free,
            free >= here.memory_mb.saturating_mul(MIB),
        ));
    }

    // Memory: it must fit somewhere (placement skips the nodes where it does not).
    if !memory_fit.is_empty() && !origin.is_stand_in("memory", None) {
        let key = origin.key("memory", None);
        let describe = |(n, free, _): &(String, u64, bool)| format!("{n} {} MiB", free / MIB);
        let fits: Vec<&(String, u64, bool)> = memory_fit.iter().filter(|f| f.2).collect();
        if fits.is_empty() {
            out.push(Finding::new(
                Outcome::Problem,
                key,
                data.node.as_ref().map(|n| n.as_str()),
                format!(
                    "{} MiB fits on no candidate node (free memory: {})",
                    data.memory_mb,
                    memory_fit
                        .iter()
                        .map(describe)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        } else {
            out.push(Finding::new(
                Outcome::Pass,
                key.clone(),
                None,
                format!(
                    "{} MiB fits on {}",
                    data.memory_mb,
                    fits.iter()
                        .map(|f| f.0.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
            for f in memory_fit.iter().filter(|f| !f.2) {
                out.push(Finding::new(
                    Outcome::Warning,
                    key.clone(),
                    Some(&f.0),
                    format!(
                        "only {} MiB free now, {} MiB needed: this node will be skipped",
                        f.1 / MIB,
                        data.memory_mb
                    ),
                ));
            }
        }
    }
    out
}

/// Which layer a key's value comes from, for the key path of a finding.
struct Origin<'a, 'b> {
    layers: &'b Layers<'a>,
    stand_ins: &'b [&'b str],
}

impl Origin<'_, '_> {
    fn class_has(&self, key: &str) -> bool {
        ProviderDataSchema::class_map(self.layers.class_yaml)
            .map(|m| m.contains_key(key))
            .unwrap_or(false)
    }

    /// `key` as the user must change it: in the class, under `nodes.<node>.`, or under `defaults.`.
    fn key(&self, key: &str, node: Option<&str>) -> String {
        if self.class_has(key) {
            return key.to_string();
        }
        if let Some(n) = node
            && self
                .layers
                .node_override(n)
                .is_some_and(|m| m.contains_key(key))
        {
            return format!("nodes.{n}.{key}");
        }
        if self.layers.defaults.contains_key(key) {
            return format!("defaults.{key}");
        }
        key.to_string()
    }

    /// True when the value is a stand-in (checking `defaults:`, the key is set nowhere real).
    fn is_stand_in(&self, key: &str, node: Option<&str>) -> bool {
        self.stand_ins.contains(&key)
            && !self.class_has(key)
            && !node
                .and_then(|n| self.layers.node_override(n))
                .is_some_and(|m| m.contains_key(key))
            && !self.layers.defaults.contains_key(key)
    }
}

/// Why each storage on the node was or was not chosen, and the one that would be.
struct StorageVerdicts {
    /// (storage, why not), in API order.
    rejected: Vec<(String, String)>,
}

/// The first storage (API order, as placement) that holds `content`, is active, matches (no selector:
/// any) and has `need_gb` free; else the reason for every storage on the node.
fn check_storage<'n>(
    node: &'n NodeSnapshot,
    selector: Option<&StorageSelector>,
    need_gb: u64,
    content: &str,
) -> Result<&'n StorageSnapshot, StorageVerdicts> {
    let need = need_gb.saturating_mul(GIB);
    let mut rejected = Vec::new();
    for s in &node.storages {
        let why = if !s.holds(content) {
            Some(format!(
                "does not hold {content} (content: {})",
                if s.content.is_empty() {
                    "none".to_string()
                } else {
                    s.content.join(",")
                }
            ))
        } else if !s.enabled || !s.active {
            Some("is not active".to_string())
        } else {
            let facts = s.facts(&node.name);
            match selector.map_or(Ok(true), |sel| sel.matches(&facts)) {
                Err(e) => Some(e.to_string()),
                Ok(false) => Some("not selected by the selector".to_string()),
                Ok(true) if s.available < need => Some(format!(
                    "selected, but only {} GiB free of {need_gb} GiB needed",
                    s.available / GIB
                )),
                Ok(true) => None,
            }
        };
        match why {
            None => return Ok(s),
            Some(why) => rejected.push((s.name.clone(), why)),
        }
    }
    Err(StorageVerdicts { rejected })
}

fn storage_finding(
    key: String,
    node: &str,
    selector: Option<&StorageSelector>,
    need_gb: u64,
    result: Result<&StorageSnapshot, StorageVerdicts>,
    what: &str,
) -> Finding {
    match result {
        Ok(s) => Finding::new(
            Outcome::Pass,
            key,
            Some(node),
            if need_gb > 0 {
                format!(
                    "{what} go to {} ({} GiB free, {need_gb} GiB needed)",
                    s.name,
                    s.available / GIB
                )
            } else {
                format!("{what} go to {}", s.name)
            },
        ),
        Err(v) => {
            let reasons = if v.rejected.is_empty() {
                "the node reports no storages".to_string()
            } else {
                v.rejected
                    .iter()
                    .map(|(s, why)| format!("{s}: {why}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            Finding::new(
                Outcome::Problem,
                key,
                Some(node),
                format!(
                    "{} active storage for {what} on {node}{}: {reasons}",
                    match selector {
                        Some(sel) => format!("`{}` matches no", sel.expression()),
                        None => "there is no".to_string(),
                    },
                    if need_gb > 0 {
                        format!(" with {need_gb} GiB free")
                    } else {
                        String::new()
                    }
                ),
            )
        }
    }
}

fn check_mappings(
    out: &mut Vec<Finding>,
    node: &str,
    kind: &str,
    wanted: &[(String, String)],
    known: Option<&Result<Vec<ResourceMapping>, String>>,
) {
    if wanted.is_empty() {
        return;
    }
    let Some(known) = known else {
        return;
    };
    for (key, id) in wanted {
        match known {
            Err(why) => out.push(Finding::new(
                Outcome::Skipped,
                key.clone(),
                Some(node),
                format!("{kind} resource mappings not checked: {why}"),
            )),
            Ok(list) => match list.iter().find(|m| &m.id == id) {
                None => out.push(Finding::new(
                    Outcome::Problem,
                    key.clone(),
                    Some(node),
                    format!(
                        "{kind} resource mapping {id:?} does not exist (Datacenter > Resource Mappings); existing: {}",
                        list_or_none(&list.iter().map(|m| m.id.clone()).collect::<Vec<_>>())
                    ),
                )),
                Some(m) if !m.nodes().iter().any(|n| n == node) => out.push(Finding::new(
                    Outcome::Problem,
                    key.clone(),
                    Some(node),
                    format!(
                        "{kind} resource mapping {id:?} has no device on {node} (it has: {})",
                        list_or_none(&m.nodes())
                    ),
                )),
                Some(_) => out.push(Finding::new(
                    Outcome::Pass,
                    key.clone(),
                    Some(node),
                    format!("{kind} resource mapping {id} has a device here"),
                )),
            },
        }
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

/// The config's `defaults:` (with its `nodes:` overrides) against the cluster, pure. `defaults` may
/// lack keys a machine class must have, so stand-ins fill them and checks of stand-ins are dropped:
/// only what is actually set is judged.
pub fn check_defaults_against(
    schema: &ProviderDataSchema,
    defaults: &Map<String, Value>,
    nodes: &Map<String, Value>,
    view: &ClusterView,
) -> Vec<Finding> {
    let (filled, stand_ins) = with_stand_ins(defaults);
    let layers = Layers {
        class_yaml: "{}",
        defaults: &filled,
        nodes,
    };
    let written = Layers {
        class_yaml: "{}",
        defaults,
        nodes,
    };
    let data = match layers.resolve_on(schema, None) {
        Ok(d) => d,
        Err(problems) => {
            return problems
                .into_iter()
                .map(|p| Finding::new(Outcome::Problem, p.key, None, p.message))
                .collect();
        }
    };
    check_cluster_inner(schema, &layers, &written, &data, view, &stand_ins)
}

/// Values that satisfy the schema for the keys a machine class must set, used when `defaults:` leaves
/// them out; findings about them are dropped.
fn required_stand_in(key: &str) -> Option<Value> {
    match key {
        "cores" => Some(json!(1)),
        "memory" => Some(json!(2048)),
        "disk_size" => Some(json!(5)),
        "storage_selector" => Some(json!("true")),
        _ => None,
    }
}

const REQUIRED: [&str; 4] = ["cores", "memory", "disk_size", "storage_selector"];

/// Keys whose built-in default a machine class usually relies on; checked for `defaults:` only when
/// set there (or in a node override).
const CHECKED_ONLY_WHEN_SET: [&str; 2] = ["network_bridge", "iso_storage_selector"];

fn with_stand_ins(defaults: &Map<String, Value>) -> (Map<String, Value>, Vec<&'static str>) {
    let mut filled = defaults.clone();
    let mut stand_ins: Vec<&'static str> = CHECKED_ONLY_WHEN_SET.to_vec();
    for key in REQUIRED {
        if let Some(value) = required_stand_in(key).filter(|_| !defaults.contains_key(key)) {
            filled.insert(key.to_string(), value);
            stand_ins.push(key);
        }
    }
    (filled, stand_ins)
}

/// Reads what the checks need for `data`: `/cluster/resources`, the bridges of every online candidate
/// node (in parallel), and the PCI/USB mappings when the data (or a node override) names devices.
pub async fn gather(
    pve: &ProxmoxClient,
    data: &ProviderData,
    config_nodes: &Map<String, Value>,
) -> Result<ClusterView, ProxmoxError> {
    let resources = pve.cluster_resources(None).await?;
    let nodes = pick_node::snapshot(&resources);
    let online: Vec<NodeName> = candidate_nodes(data, &nodes)
        .into_iter()
        .filter(|(_, online)| *online)
        .filter_map(|(n, _)| NodeName::new(n).ok())
        .collect();
    let answers = futures_util::future::join_all(
        online
            .iter()
            .map(|node| async move { (node.to_string(), bridges(pve, node).await) }),
    )
    .await;
    let uses = |key: &str, list_empty: bool| {
        !list_empty
            || config_nodes.values().any(|v| {
                v.get(key)
                    .is_some_and(|l| l.as_array().is_some_and(|a| !a.is_empty()))
            })
    };
    let pci_mappings = if uses("pci_devices", data.pci_devices.is_empty()) {
        Some(mappings(pve, MappingKind::Pci).await)
    } else {
        None
    };
    let usb_mappings = if uses("usb_devices", data.usb_devices.is_empty()) {
        Some(mappings(pve, MappingKind::Usb).await)
    } else {
        None
    };
    let pve_version = if needs_version(data) {
        Some(
            pve.version()
                .await
                .map(|v| v.version)
                .map_err(|e| e.to_string()),
        )
    } else {
        None
    };
    Ok(ClusterView {
        resources,
        bridges: answers.into_iter().collect(),
        pci_mappings,
        usb_mappings,
        pve_version,
    })
}

/// Bridges and SDN VNets of a node; Proxmox before 9.0 does not know `include_sdn` (a parameter error
/// on `type`), so that refusal falls back to plain bridges.
async fn bridges(pve: &ProxmoxClient, node: &NodeName) -> Result<Vec<String>, String> {
    let list = match pve
        .node_networks(node, Some(NetworkFilter::BridgesAndVnets))
        .await
    {
        Err(ProxmoxError::Api {
            status: 400,
            field_errors,
            ..
        }) if field_errors.contains_key("type") => {
            pve.node_networks(node, Some(NetworkFilter::AnyBridge))
                .await
        }
        other => other,
    }
    .map_err(|e| e.to_string())?;
    Ok(list
        .into_iter()
        .filter(|i| i.is_guest_bridge())
        .map(|i| i.iface)
        .collect())
}

async fn mappings(pve: &ProxmoxClient, kind: MappingKind) -> Result<Vec<ResourceMapping>, String> {
    pve.resource_mappings(kind).await.map_err(|e| e.to_string())
}

/// The whole check of one machine class's provider data: schema, then (if that passes) the cluster.
/// `Err` only when the cluster cannot be read.
pub async fn validate_class(
    pve: &ProxmoxClient,
    schema: &ProviderDataSchema,
    layers: &Layers<'_>,
) -> Result<Report, ProxmoxError> {
    let (mut findings, data) = check_schema(schema, layers);
    if let Some(data) = data {
        let view = gather(pve, &data, layers.nodes).await?;
        findings.extend(check_cluster(schema, layers, &data, &view));
    }
    Ok(Report::new(findings))
}

/// Whether `data` uses a key that only some Proxmox VE releases accept.
fn needs_version(data: &ProviderData) -> bool {
    data.ha.as_ref().is_some_and(|ha| ha.failback.is_some())
}

/// Before provisioning: a key the cluster's Proxmox VE release does not accept (`ha.failback` before
/// PVE 9), as a sentence; `None` when all is well or the version cannot be read (Proxmox then
/// answers for itself when the key is sent).
pub async fn release_problem(pve: &ProxmoxClient, data: &ProviderData) -> Option<String> {
    if !needs_version(data) {
        return None;
    }
    let version = match pve.version().await {
        Ok(v) => v.version,
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the Proxmox VE version");
            return None;
        }
    };
    ha_failback_problem(data, &version).map(|p| p.to_string())
}

/// The config file's own warnings (unknown keys, a token and a password both set), as findings to
/// show before the provider data's.
pub fn config_file_findings(config: &ProviderConfig) -> Vec<Finding> {
    config
        .warnings
        .iter()
        .map(|w| Finding::new(Outcome::Warning, "config", None, w.clone()))
        .collect()
}

/// The longest health text [`check_defaults`] returns; Omni shows it in one line.
const HEALTH_TEXT_MAX: usize = 480;

/// The config's `defaults:` and `nodes:` checked against the live cluster, for the provider's health
/// status: `None` when nothing is wrong (or nothing is set), else a short text naming the keys and
/// nodes to fix. Only problems count; warnings (an offline node) do not make the provider unhealthy.
pub async fn check_defaults(pve: &ProxmoxClient, config: &ProviderConfig) -> Option<String> {
    if config.defaults.is_empty() && config.nodes.is_empty() {
        return None;
    }
    let schema = match ProviderDataSchema::new() {
        Ok(s) => s.strict(config.strict),
        Err(e) => return Some(e.to_string()),
    };
    let (filled, _) = with_stand_ins(&config.defaults);
    let layers = Layers {
        class_yaml: "{}",
        defaults: &filled,
        nodes: &config.nodes,
    };
    let data = match layers.resolve_on(&schema, None) {
        Ok(d) => d,
        Err(problems) => {
            return Some(summarize(
                problems
                    .into_iter()
                    .map(|p| Finding::new(Outcome::Problem, p.key, None, p.message)),
            ));
        }
    };
    let view = match gather(pve, &data, &config.nodes).await {
        Ok(v) => v,
        Err(e) => {
            return Some(format!(
                "cannot check the config defaults against Proxmox: {e}"
            ));
        }
    };
    let findings = check_defaults_against(&schema, &config.defaults, &config.nodes, &view);
    let problems: Vec<Finding> = findings
        .into_iter()
        .filter(|f| f.outcome == Outcome::Problem)
        .collect();
    (!problems.is_empty()).then(|| summarize(problems.into_iter()))
}

/// `provider config: KEY (on NODE): MESSAGE; ... and N more`, cut to [`HEALTH_TEXT_MAX`].
fn summarize(problems: impl Iterator<Item = Finding>) -> String {
    let all: Vec<String> = problems.map(|f| f.to_string()).collect();
    let mut text = String::from("provider config: ");
    let mut shown = 0;
    for (i, p) in all.iter().enumerate() {
        let sep = if i == 0 { "" } else { "; " };
        if text.len() + sep.len() + p.len() > HEALTH_TEXT_MAX && shown > 0 {
            break;
        }
        text.push_str(sep);
        text.push_str(p);
        shown += 1;
    }
    if shown < all.len() {
        let _ = write!(text, "; and {} more (run `validate`)", all.len() - shown);
    }
    if text.len() > HEALTH_TEXT_MAX + 40 {
        let mut cut = HEALTH_TEXT_MAX;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pve1 (online, 6 GiB free, local-lvm + iso storage, vmbr0/vmbr1), pve2 (online, 1 GiB free,
    /// local-lvm only, vmbr0), pve3 offline; template 9000 on pve1, VM 100 on pve2.
    fn view() -> ClusterView {
        let resources: Vec<ClusterResource> = serde_json::from_value(json!([
            {"type":"node","node":"pve1","status":"online","mem":2147483648u64,"maxmem":8589934592u64},
            {"type":"node","node":"pve2","status":"online","mem":7516192768u64,"maxmem":8589934592u64},
            {"type":"node","node":"pve3","status":"offline"},
            {"type":"qemu","vmid":9000,"node":"pve1","name":"talos","template":1},
            {"type":"qemu","vmid":100,"node":"pve2","name":"web"},
            {"type":"storage","storage":"local","node":"pve1","content":"iso,backup","status":"available","disk":0,"maxdisk":107374182400u64,"plugintype":"dir"},
            {"type":"storage","storage":"local-lvm","node":"pve1","content":"images,rootdir","status":"available","disk":0,"maxdisk":107374182400u64,"plugintype":"lvmthin"},
            {"type":"storage","storage":"local-lvm","node":"pve2","content":"images,rootdir","status":"available","disk":0,"maxdisk":10737418240u64,"plugintype":"lvmthin"}
        ]))
        .unwrap();
        ClusterView {
            resources,
            bridges: [
                ("pve1".to_string(), Ok(vec!["vmbr0".into(), "vmbr1".into()])),
                ("pve2".to_string(), Ok(vec!["vmbr0".into()])),
            ]
            .into(),
            pci_mappings: None,
            usb_mappings: None,
            pve_version: None,
        }
    }

    fn run(class: &str, defaults: Value, nodes: Value) -> Report {
        let schema = ProviderDataSchema::new().unwrap();
        let defaults = defaults.as_object().unwrap().clone();
        let nodes = nodes.as_object().unwrap().clone();
        let layers = Layers {
            class_yaml: class,
            defaults: &defaults,
            nodes: &nodes,
        };
        let (mut findings, data) = check_schema(&schema, &layers);
        if let Some(data) = data {
            findings.extend(check_cluster(&schema, &layers, &data, &view()));
        }
        Report::new(findings)
    }

    fn problem<'a>(r: &'a Report, key: &str, node: Option<&str>) -> Option<&'a Finding> {
        r.problems()
            .find(|f| f.key == key && f.node.as_deref() == node)
    }

    const BASE: &str = "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: name == \"local-lvm\"\nnode: pve1\n";

    #[test]
    fn unknown_keys_are_warnings_with_a_suggestion_and_the_class_still_passes() {
        let r = run(
            &format!("{BASE}disk_sise: 5\n"),
            json!({"coers": 2}),
            json!({"pve1": {"network_bridg": "vmbr1"}}),
        );
        assert!(r.ok, "{}", r.render_text());
        let warned: Vec<(&str, &str)> = r
            .findings
            .iter()
            .filter(|f| f.outcome == Outcome::Warning)
            .map(|f| (f.key.as_str(), f.message.as_str()))
            .collect();
        assert_eq!(warned.len(), 3, "{warned:?}");
        for (key, hint) in [
            ("defaults.coers", "`cores`"),
            ("nodes.pve1.network_bridg", "`network_bridge`"),
            ("disk_sise", "`disk_size`"),
        ] {
            assert!(
                warned
                    .iter()
                    .any(|(k, m)| *k == key && m.contains(&format!("did you mean {hint}?"))),
                "{key}: {warned:?}"
            );
        }
        assert!(r.render_text().contains("warn"), "{}", r.render_text());
        let config = ProviderConfig::parse(
            "proxmox:\n  url: https://pve:8006\n  tokenID: a@pve!t\n  tokenSecret: s\n  urll: x\n",
        )
        .unwrap();
        let found = config_file_findings(&config);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].outcome, Outcome::Warning);
        assert!(
            found[0].message.contains("did you mean `url`?"),
            "{found:?}"
        );
    }

    /// pve-ha-manager src/PVE/HA/Resources.pm: `failback` exists on HA resources only from 5.0.2
    /// (PVE 9); PVE 8 answers 400, after the VM was already created and started. Refuse up front.
    #[test]
    fn ha_failback_is_a_problem_on_a_pve_8_cluster() {
        let schema = ProviderDataSchema::new().unwrap();
        let class = format!("{BASE}ha:\n  state: started\n  failback: true\n");
        let (empty, nodes) = (Map::new(), Map::new());
        let layers = Layers {
            class_yaml: &class,
            defaults: &empty,
            nodes: &nodes,
        };
        let (_, data) = check_schema(&schema, &layers);
        let data = data.unwrap();
        assert!(needs_version(&data));
        let on = |version: Option<Result<String, String>>| {
            let mut v = view();
            v.pve_version = version;
            Report::new(check_cluster(&schema, &layers, &data, &v))
        };
        let r = on(Some(Ok("8.4.1".into())));
        let f = problem(&r, "ha.failback", None).expect("a problem");
        assert!(
            f.message.contains("8.4.1") && f.message.contains("Proxmox VE 9"),
            "{f}"
        );
        assert!(problem(&on(Some(Ok("9.0.10".into()))), "ha.failback", None).is_none());
        let r = on(Some(Err("timeout".into())));
        assert!(
            r.findings
                .iter()
                .any(|f| f.key == "ha.failback" && f.outcome == Outcome::Skipped)
        );
    }

    /// Provisioning asks `GET /version` before anything is created, and only when `ha.failback` is
    /// set; on PVE 8 the request is refused naming the version instead of failing at HA registration.
    #[tokio::test]
    async fn release_problem_reads_the_version_only_for_failback() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/api2/json/version"))
            .respond_with(ResponseTemplate::new(200).set_body_json(
                json!({"data": {"version": "8.4.1", "release": "8.4", "repoid": "abc"}}),
            ))
            .expect(1)
            .mount(&server)
            .await;
        let config = ProviderConfig::parse(&format!(
            "proxmox:\n  url: {}\n  tokenID: a@pve!t\n  tokenSecret: s\n",
            server.uri()
        ))
        .unwrap();
        let pve = ProxmoxClient::new(&config.proxmox).unwrap();
        let schema = ProviderDataSchema::new().unwrap();
        let resolve = |yaml: String| schema.resolve(&yaml, None, &Map::new()).unwrap();
        let plain = resolve(format!("{BASE}ha:\n  state: started\n"));
        assert_eq!(release_problem(&pve, &plain).await, None);
        let failback = resolve(format!("{BASE}ha:\n  failback: false\n"));
        let problem = release_problem(&pve, &failback).await.expect("refused");
        assert!(
            problem.starts_with("ha.failback: needs Proxmox VE 9"),
            "{problem}"
        );
        assert!(problem.contains("8.4.1"), "{problem}");
    }

    #[test]
    fn strict_mode_fails_unknown_keys() {
        let schema = ProviderDataSchema::new().unwrap().strict(true);
        let class = format!("{BASE}disk_sise: 5\n");
        let (empty, nodes) = (Map::new(), Map::new());
        let layers = Layers {
            class_yaml: &class,
            defaults: &empty,
            nodes: &nodes,
        };
        let (findings, data) = check_schema(&schema, &layers);
        assert!(data.is_none());
        let r = Report::new(findings);
        assert!(
            problem(&r, "disk_sise", None).is_some(),
            "{}",
            r.render_text()
        );
    }

    #[test]
    fn a_good_pinned_class_passes() {
        let r = run(BASE, json!({}), json!({}));
        assert!(r.ok, "{}", r.render_text());
        assert_eq!(r.warnings, 0);
        assert!(r.render_text().contains("OK: no problems found"));
    }

    #[test]
    fn storage_reasons_are_given_per_storage() {
        let r = run(
            &BASE
                .replace("node: pve1\n", "node: pve2\n")
                .replace("disk_size: 5", "disk_size: 50"),
            json!({}),
            json!({}),
        );
        let f = problem(&r, "storage_selector", Some("pve2")).expect("too small on pve2");
        assert!(
            f.message
                .contains("local-lvm: selected, but only 10 GiB free of 50 GiB needed"),
            "{f}"
        );
        // No ISO storage on pve2 for boot mode iso.
        let f = problem(&r, "iso_storage_selector", Some("pve2")).expect("no ISO storage");
        assert!(
            f.message
                .starts_with("there is no active storage for ISO images on pve2"),
            "{f}"
        );
    }

    #[test]
    fn spread_checks_every_online_candidate_and_warns_for_offline_ones() {
        let class = BASE.replace("node: pve1\n", "");
        let r = run(&class, json!({}), json!({}));
        assert!(problem(&r, "iso_storage_selector", Some("pve2")).is_some());
        assert!(r.findings.iter().any(|f| f.outcome == Outcome::Warning
            && f.node.as_deref() == Some("pve3")
            && f.message.contains("offline")));
        // Limited to pve1: fine.
        let r = run(
            &format!("{class}allowed_nodes: [pve1]\n"),
            json!({}),
            json!({}),
        );
        assert!(r.ok, "{}", r.render_text());
    }

    #[test]
    fn memory_must_fit_somewhere_and_a_tight_node_is_a_warning() {
        let class = BASE.replace(
            "node: pve1\n",
            "allowed_nodes: [pve1, pve2]\niso_storage_selector: \"true\"\n",
        );
        let r = run(
            &class.replace("memory: 2048", "memory: 4096"),
            json!({}),
            json!({}),
        );
        assert!(problem(&r, "memory", None).is_none(), "{}", r.render_text());
        assert!(r.findings.iter().any(|f| f.outcome == Outcome::Warning
            && f.key == "memory"
            && f.node.as_deref() == Some("pve2")));
        let r = run(
            &class.replace("memory: 2048", "memory: 16384"),
            json!({}),
            json!({}),
        );
        let f = problem(&r, "memory", None).expect("fits nowhere");
        assert!(f.message.contains("pve1 6144 MiB, pve2 1024 MiB"), "{f}");
    }

    #[test]
    fn keys_name_the_layer_the_value_came_from() {
        let class = "cores: 1\nmemory: 2048\ndisk_size: 5\nnode: pve1\n";
        let r = run(
            class,
            json!({"storage_selector": "name == \"local-lvm\""}),
            json!({"pve1": {"network_bridge": "vmbr9"}, "pve7": {"cores": 2}}),
        );
        assert!(
            problem(&r, "nodes.pve1.network_bridge", Some("pve1")).is_some(),
            "{}",
            r.render_text()
        );
        assert!(
            r.findings
                .iter()
                .any(|f| f.key == "defaults.storage_selector" && f.outcome == Outcome::Pass)
        );
        assert!(
            r.findings
                .iter()
                .any(|f| f.key == "nodes.pve7" && f.outcome == Outcome::Warning)
        );
    }

    #[test]
    fn unknown_bridges_and_mappings_are_not_guessed() {
        let mut v = view();
        v.bridges
            .insert("pve1".into(), Err("permission denied".into()));
        v.pci_mappings = Some(Err("501 not implemented".into()));
        let schema = ProviderDataSchema::new().unwrap();
        let empty = Map::new();
        let class = format!("{BASE}pci_devices:\n  - mapping: gpu\n");
        let layers = Layers {
            class_yaml: &class,
            defaults: &empty,
            nodes: &empty,
        };
        let (_, data) = check_schema(&schema, &layers);
        let findings = check_cluster(&schema, &layers, &data.unwrap(), &v);
        let r = Report::new(findings);
        assert!(r.ok, "{}", r.render_text());
        assert!(
            r.findings
                .iter()
                .any(|f| f.outcome == Outcome::Warning && f.message.contains("permission denied"))
        );
        assert!(
            r.findings
                .iter()
                .any(|f| f.outcome == Outcome::Skipped && f.key == "pci_devices[0].mapping")
        );
    }

    #[test]
    fn defaults_are_judged_only_on_what_they_set() {
        let schema = ProviderDataSchema::new().unwrap();
        let empty = Map::new();
        let check = |defaults: Value| {
            check_defaults_against(&schema, defaults.as_object().unwrap(), &empty, &view())
                .into_iter()
                .filter(|f| f.outcome == Outcome::Problem)
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
        };
        // Nothing set that could be wrong: no ISO, bridge, memory or storage findings.
        assert_eq!(check(json!({"cores": 4})), Vec::<String>::new());
        let problems = check(json!({"storage_selector": "name == \"ceph\""}));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].starts_with("defaults.storage_selector (on pve1)"),
            "{problems:?}"
        );
        let problems = check(json!({"boot": "clone", "template": 4242}));
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("defaults.template: template 4242 not found")),
            "{problems:?}"
        );
    }

    #[test]
    fn health_text_is_short() {
        let many = (0..40).map(|i| {
            Finding::new(
                Outcome::Problem,
                format!("additional_disks[{i}].storage_selector"),
                Some("pve1"),
                "x".repeat(60),
            )
        });
        let text = summarize(many);
        assert!(text.len() < HEALTH_TEXT_MAX + 60, "{}", text.len());
        assert!(text.contains("more (run `validate`)"), "{text}");
    }
}

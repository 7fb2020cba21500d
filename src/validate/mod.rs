//! Checking a machine class's provider data (or the config's `defaults:`) before it is used.
//!
//! The official provider finds out that a storage selector matches nothing, a bridge is missing or a
//! template is not a template only when it creates a VM, on whichever node it picked, and then shows
//! "Provisioning" forever. Here the same data goes through the schema and the pipeline's rules, then
//! through the live cluster, node by node for every node placement could choose, and every finding is
//! reported with the key to change and the node it concerns.
//!
//! The decisions are pure ([`check_schema`], [`check_cluster`]): they take parsed data and
//! a [`cluster::ClusterFacts`] and return findings, so they are tested without a network. They
//! do not re-derive placement: which node is considered, whether memory fits and which storage takes
//! a disk or an ISO are the verdicts of [`crate::rules`], the same functions the pipeline acts on,
//! rendered here with the key to change. The reads ([`gather::gather`]) are at the edge: one
//! `/cluster/resources`, the bridges of the candidate nodes (in parallel), and the PCI/USB resource
//! mappings only when the data uses them. The `validate` command and the provider's health check
//! ([`check_defaults`]) share all of it.

mod cluster;
mod gather;
mod node;

pub use gather::{check_defaults, root_reach_warning, validate_class};

use std::collections::BTreeSet;
use std::fmt::{self, Write as _};
use std::net::IpAddr;

use serde::Serialize;
use serde_json::{Value, json};

use crate::config::ProviderConfig;
use crate::rules::ip_pool::{self, IpPool};
use crate::rules::provider_data::{ConfigLayers, Problem, ProviderData, class_map};
use cluster::{ClusterCheck, ClusterFacts, candidate_nodes};

/// Step 1, pure: the provider data against the schema and the pipeline's rules (and the config's
/// overrides). `Ok` carries the data as it is before any per-node override, for the cluster checks.
pub fn check_schema(layers: &Layers<'_>) -> (Vec<Finding>, Option<ProviderData>) {
    let overrides = layers.config.layers.check();
    let mut findings: Vec<Finding> = Outcome::Problem
        .findings(overrides.problems)
        .chain(Outcome::Warning.findings(overrides.warnings))
        .collect();
    // The class's own warnings (those of `defaults:` and `nodes:` came with the overrides above),
    // also when the class fails: an ignored misspelling often explains a missing key.
    if let Ok(class) = class_map(layers.class_yaml) {
        let check = layers.config.layers.check_class(&class);
        findings.extend(Outcome::Warning.findings(check.warnings));
    }
    match layers.resolve_on(None) {
        Ok(data) => {
            if !findings.iter().any(|f| f.outcome == Outcome::Problem) {
                let message = "matches the schema and the pipeline's rules";
                findings.push(Outcome::Pass.finding("provider_data", message));
            }
            (findings, Some(data))
        }
        Err(problems) => {
            findings.extend(Outcome::Problem.findings(problems));
            let message = "not checked against the cluster until the problems above are fixed";
            findings.push(Outcome::Skipped.finding("cluster", message));
            (findings, None)
        }
    }
}

/// Step 2, pure: `data` (the class resolved without a node override) against the cluster: the
/// findings about the cluster as a whole ([`cluster`]), then each node placement could choose
/// ([`node`]), then what the nodes' verdicts together say.
pub(crate) fn check_cluster(
    layers: &Layers<'_>,
    data: &ProviderData,
    view: &ClusterFacts,
) -> Vec<Finding> {
    let check = ClusterCheck {
        existing: list_or_none(&view.cluster.node_names()),
        layers,
        data,
        view,
    };
    // The cluster as a whole first, then each node, then what the nodes' verdicts say together.
    let mut out = check.release_findings();
    out.extend(check.health_finding());
    check.ha_rule_findings(&mut out);
    check.clone_disk_findings(&mut out);
    check.placement_findings(&mut out);
    check.template(&mut out);
    let (mut clones, mut fitting, mut left_out) = (Vec::new(), Vec::new(), Vec::new());
    for node in candidate_nodes(data, &view.cluster)
        .into_iter()
        .filter(|n| n.online)
    {
        if let Some((capacity, clone)) = node::check_node(&check, node, &mut out) {
            let name = node.name.as_str();
            clones.extend(clone.map(|c| (name, c)));
            match capacity {
                None => fitting.push(name),
                Some(why) => left_out.push((name, why)),
            }
        }
    }
    check.clone_findings(&clones, &mut out);
    check.memory_findings(&fitting, &left_out, &mut out);
    out
}

/// The static IP pools a class names (`ip_pool`, `additional_nics[].ip_pool`): each must exist in the
/// config file and have a free address.
///
/// `validate` reads Proxmox only, not Omni, so "free" counts what the cluster shows: the addresses the
/// guest agents of running VMs report (machines on the pool report theirs once booted). A machine
/// still provisioning holds its address in Omni only; the `pools` command counts those too.
///
/// Pure: one finding per NIC that names a pool, given the addresses in use.
pub fn check_pools(
    data: &ProviderData,
    pools: &[IpPool],
    in_use: &BTreeSet<IpAddr>,
) -> Vec<Finding> {
    ip_pool::wanted(data)
        .into_iter()
        .map(|(nic, name)| {
            let key = ip_pool::key_of(nic);
            let pool = match ip_pool::find(pools, &key, name) {
                Ok(p) => p,
                Err(p) => return Outcome::Problem.finding(p.key, p.message),
            };
            match ip_pool::allocate(pool, in_use) {
                Ok(next) => {
                    let (used, size) = ip_pool::usage(pool, in_use);
                    Outcome::Pass.finding(
                        key,
                        format!(
                            "pool {name} ({}): {} of {size} free, next {next} (counting addresses running VMs report; `pools` also counts machines still provisioning)",
                            pool.cidr,
                            size - used
                        ),
                    )
                }
                Err(full) => Outcome::Problem.finding(
                    key,
                    format!("{full}: widen its `range` in the config file or remove a machine on it"),
                ),
            }
        })
        .collect()
}

/// Where a value comes from: the class's YAML over the config's `nodes:` and `defaults:`, so each
/// finding names the key where the user must change it.
///
/// Where the provider data comes from: the class's YAML over the config's `nodes:` and `defaults:`;
/// the config's static IP pools, whose bridge and VLAN replace the NIC's, as provisioning does.
#[derive(Debug, Clone, Copy)]
pub struct Layers<'a> {
    pub class_yaml: &'a str,
    pub config: &'a ProviderConfig,
    /// The config's `defaults:` on their own, without a class: the keys a class must set that
    /// `defaults:` leave out get stand-ins ([`STAND_INS`]), and findings about stand-ins are dropped.
    stand_ins: bool,
}

/// A key and its stand-in value.
type StandIn = (&'static str, fn() -> Value);

/// Values that satisfy the schema for the keys a machine class must set, used when `defaults:` leaves
/// them out.
const STAND_INS: [StandIn; 4] = [
    ("cores", || json!(1)),
    ("memory", || json!(2048)),
    ("disk_size", || json!(5)),
    ("storage_selector", || json!("true")),
];

/// Keys whose built-in default a machine class usually relies on; checked for `defaults:` only when
/// set there (or in a node override).
const CHECKED_ONLY_WHEN_SET: [&str; 2] = ["network_bridge", "iso_storage_selector"];

impl<'a> Layers<'a> {
    pub fn new(class_yaml: &'a str, config: &'a ProviderConfig) -> Self {
        Self {
            class_yaml,
            config,
            stand_ins: false,
        }
    }

    /// The provider data as it would be on `node` (its override applied, and the NICs on their IP
    /// pools' networks: `ip_pool::apply_networks`, as provisioning resolves it), or the problems. A pool
    /// that does not exist is left to the pool findings, which name it once.
    pub(crate) fn resolve_on(&self, node: Option<&str>) -> Result<ProviderData, Vec<Problem>> {
        let mut filled = self.config.defaults.clone();
        for (key, value) in STAND_INS.iter().filter(|_| self.stand_ins) {
            filled.entry(*key).or_insert_with(value);
        }
        let config = ConfigLayers::read(&filled, &self.config.nodes, self.config.layers.strict);
        let mut data = config.resolve(self.class_yaml, node)?;
        let _unknown_pools = ip_pool::apply_networks(&mut data, &self.config.ip_pools);
        Ok(data)
    }

    /// `key` as the user must change it: in the class, under `nodes.<node>.`, or under `defaults.`.
    pub(crate) fn key(&self, key: &str, node: Option<&str>) -> String {
        let class = class_map(self.class_yaml).unwrap_or_default();
        self.config.layers.key_path(&class, key, node)
    }

    /// True when the value is a stand-in (checking `defaults:`, which have no class, the key is set
    /// in no layer).
    pub(crate) fn is_stand_in(&self, key: &str, node: Option<&str>) -> bool {
        let stand_in = CHECKED_ONLY_WHEN_SET.contains(&key) || STAND_INS.iter().any(|s| s.0 == key);
        self.stand_ins && stand_in && self.key(key, node) == key
    }
}

// What the checks found, and how it is shown to people and scripts.

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
    /// The word of the text report, in the order of the variants; four wide whatever the findings,
    /// so reports line up with each other.
    fn label(self) -> &'static str {
        ["ok  ", "skip", "warn", "FAIL"][self as usize]
    }

    /// A finding of this outcome about `key`, on no node in particular (see [`Finding::on`]).
    pub(crate) fn finding(self, key: impl Into<String>, message: impl Into<String>) -> Finding {
        Finding {
            outcome: self,
            key: key.into(),
            node: None,
            message: message.into(),
        }
    }

    /// The provider data's `problems` (or warnings) as findings of this outcome.
    pub(crate) fn findings(self, problems: Vec<Problem>) -> impl Iterator<Item = Finding> {
        problems
            .into_iter()
            .map(move |p| self.finding(p.key, p.message))
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
    /// The finding about `node`.
    pub(crate) fn on(self, node: impl Into<String>) -> Self {
        Self {
            node: Some(node.into()),
            ..self
        }
    }
}

/// `a, b, c`, or `none`.
pub(crate) fn list_or_none<S: std::borrow::Borrow<str>>(items: &[S]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
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

    /// The report for people: one line per finding, then a verdict.
    pub fn render_text(&self) -> String {
        let rows = self.findings.iter().map(|f| {
            let (label, node) = (f.outcome.label(), f.node.as_deref().unwrap_or("-"));
            vec![label.into(), f.key.clone(), node.into(), f.message.clone()]
        });
        let mut out = String::new();
        crate::table::render(&mut out, "", &[], rows);
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

#[cfg(test)]
mod tests;

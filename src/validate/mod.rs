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
mod layers;
mod node;
mod report;

pub use gather::{check_defaults, root_reach_warning, validate_class};
pub use layers::Layers;
pub use report::{Finding, Outcome, Report};

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::rules::ip_pool::{self, IpPool};
use crate::rules::provider_data::{ProviderData, class_map};
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
        existing: report::list_or_none(&view.cluster.node_names()),
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

#[cfg(test)]
mod tests;

//! Whether a new VM of a class can join the HA rules the class puts it in without Proxmox calling
//! the rule set infeasible. Every rule write is checked against the whole rule set (pve-ha-manager
//! src/PVE/API2/HA/Rules.pm `assert_feasibility`, src/PVE/HA/Rules.pm `check_feasibility`), and the
//! join happens after the VM was created and started: a shape Proxmox refuses would fail the join
//! on every retry. So placement asks first, before anything is made, and refuses naming the keys.
//!
//! The checks, from pve-ha-manager:
//! - src/PVE/HA/Rules/NodeAffinity.pm `check_single_resource_reference`: a resource is in at most
//!   one node-affinity rule;
//! - src/PVE/HA/Rules.pm `check_single_node_affinity_per_positive_resource_affinity_rule`: the
//!   resources of a positive resource-affinity rule are in at most one node-affinity rule between
//!   them;
//! - src/PVE/HA/Rules.pm `check_negative_resource_affinity_node_affinity_consistency`: the members
//!   of a negative rule that node-affinity rules place have at least as many nodes between those
//!   rules as there are such members.

use std::collections::BTreeSet;

use super::{HaMembership, node_affinity_rule, resource_affinity_rule};
use crate::proxmox::ha::HaRule;
use crate::rules::provider_data::ResourceAffinity;

/// The sid the checks give the VM not yet created.
const NEW: &str = "(new VM)";

/// A node-affinity rule as the new VM would see it: its name, nodes and members.
struct NodeRule<'a> {
    name: String,
    /// The provider-data key that puts the VM in it (`None` for someone else's rule).
    key: Option<String>,
    nodes: BTreeSet<&'a str>,
    members: BTreeSet<&'a str>,
}

/// A resource-affinity rule the new VM joins.
struct AffinityRule<'a> {
    name: String,
    key: String,
    negative: bool,
    members: BTreeSet<&'a str>,
}

/// `Err` with what Proxmox would refuse, naming the keys and what to change.
pub fn check_join(m: &HaMembership<'_>, rules: &[HaRule]) -> Result<(), String> {
    let node_rules = node_rules(m, rules);
    let mine: Vec<&NodeRule<'_>> = node_rules
        .iter()
        .filter(|r| r.members.contains(NEW))
        .collect();
    if mine.len() > 1 {
        let keys: Vec<String> = mine.iter().map(|r| describe(r)).collect();
        return Err(format!(
            "the VM would be in {} node-affinity rules ({}); Proxmox allows one per resource: keep \
             ha.node_affinity_nodes or the node-affinity rule in ha.rules, not both",
            mine.len(),
            keys.join(", ")
        ));
    }
    for rule in affinity_rules(m, rules) {
        let touching: Vec<&NodeRule<'_>> = node_rules
            .iter()
            .filter(|n| !n.members.is_disjoint(&rule.members))
            .collect();
        if !rule.negative && touching.len() > 1 {
            let names: Vec<String> = touching.iter().map(|r| describe(r)).collect();
            return Err(format!(
                "{} is a positive resource-affinity rule ({}) whose VMs would be in {} node-affinity \
                 rules ({}); Proxmox needs them in at most one: put the set's VMs under one \
                 node-affinity rule or drop the positive affinity",
                rule.key,
                rule.name,
                touching.len(),
                names.join(", ")
            ));
        }
        let located: BTreeSet<&str> = touching
            .iter()
            .flat_map(|n| n.members.intersection(&rule.members).copied())
            .collect();
        let allowed: BTreeSet<&str> = touching
            .iter()
            .flat_map(|n| n.nodes.iter().copied())
            .collect();
        if rule.negative && located.len() > allowed.len() {
            let names: Vec<String> = touching.iter().map(|r| describe(r)).collect();
            let nodes: Vec<&str> = allowed.into_iter().collect();
            return Err(format!(
                "{} keeps the set's VMs apart ({}), but {} limits them to {} node(s) ({}): a VM \
                 more than that cannot be kept apart, and Proxmox refuses the rule; add nodes to \
                 the node-affinity rule, or keep the set at {} machine(s)",
                rule.key,
                rule.name,
                names.join(", "),
                nodes.len(),
                nodes.join(", "),
                nodes.len()
            ));
        }
    }
    Ok(())
}

fn describe(rule: &NodeRule<'_>) -> String {
    match &rule.key {
        Some(key) => format!("{key}: {}", rule.name),
        None => rule.name.clone(),
    }
}

/// Every node-affinity rule in the cluster, with the new VM in those the class puts it in (the
/// set's own rule made from the class when it does not exist yet).
fn node_rules<'a>(m: &'a HaMembership<'a>, rules: &'a [HaRule]) -> Vec<NodeRule<'a>> {
    let set_rule = m
        .set
        .filter(|_| !m.settings.node_affinity_nodes.is_empty())
        .map(node_affinity_rule);
    let mut out: Vec<NodeRule<'a>> = rules
        .iter()
        .filter(|r| r.kind == "node-affinity")
        .map(|r| {
            let named = m.settings.rules.iter().position(|n| *n == r.rule);
            let ours = set_rule.as_deref() == Some(r.rule.as_str());
            let key = if ours {
                Some("ha.node_affinity_nodes".to_owned())
            } else {
                named.map(|i| format!("ha.rules[{i}]"))
            };
            let mut members: BTreeSet<&str> = r.resource_list().into_iter().collect();
            if key.is_some() {
                members.insert(NEW);
            }
            if ours {
                members.extend(m.set_members.iter().map(String::as_str));
            }
            NodeRule {
                name: r.rule.clone(),
                key,
                nodes: r.node_names().into_iter().collect(),
                members,
            }
        })
        .collect();
    if let Some(name) = set_rule
        && !out.iter().any(|r| r.name == name)
    {
        out.push(NodeRule {
            name,
            key: Some("ha.node_affinity_nodes".to_owned()),
            nodes: m
                .settings
                .node_affinity_nodes
                .iter()
                .map(|n| n.as_str())
                .collect(),
            members: std::iter::once(NEW)
                .chain(m.set_members.iter().map(String::as_str))
                .collect(),
        });
    }
    out
}

/// The resource-affinity rules the new VM joins, with their members once it and the set's other
/// VMs (`set_members`: HA-managed, made, or placed) have: the set's own (a negative one already as
/// large as the cluster takes no more, see [`super::plan_join`]) and those named in `ha.rules`.
fn affinity_rules<'a>(m: &'a HaMembership<'a>, rules: &'a [HaRule]) -> Vec<AffinityRule<'a>> {
    let mut out = Vec::new();
    if let (Some(set), Some(affinity)) = (m.set, m.settings.resource_affinity) {
        let name = resource_affinity_rule(set);
        let negative = affinity == ResourceAffinity::Negative;
        let existing: Option<BTreeSet<&str>> = rules
            .iter()
            .find(|r| r.rule == name)
            .map(|r| r.resource_list().into_iter().collect());
        let full = negative && existing.as_ref().map_or(0, BTreeSet::len) >= m.cluster_nodes;
        if !full {
            // The set's other VMs join too (those placed and not yet HA-managed included); a new
            // negative rule starts with as many as the cluster has nodes.
            let mut members: BTreeSet<&str> = existing.unwrap_or_default();
            let room = if negative {
                m.cluster_nodes.saturating_sub(1)
            } else {
                usize::MAX
            };
            let others: Vec<&str> = m
                .set_members
                .iter()
                .map(String::as_str)
                .filter(|s| !members.contains(s))
                .collect();
            let left = room.saturating_sub(members.len());
            members.extend(others.into_iter().take(left));
            members.insert(NEW);
            out.push(AffinityRule {
                name,
                key: "ha.spread/ha.resource_affinity".to_owned(),
                negative,
                members,
            });
        }
    }
    for (i, wanted) in m.settings.rules.iter().enumerate() {
        if let Some(rule) = rules
            .iter()
            .find(|r| r.rule == *wanted && r.kind == "resource-affinity")
        {
            let mut members: BTreeSet<&str> = rule.resource_list().into_iter().collect();
            members.insert(NEW);
            out.push(AffinityRule {
                name: rule.rule.clone(),
                key: format!("ha.rules[{i}]"),
                negative: rule.affinity.as_deref() == Some("negative"),
                members,
            });
        }
    }
    out
}

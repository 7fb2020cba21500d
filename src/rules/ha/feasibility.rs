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

use super::{HaMembership, RuleChange, node_affinity_rule, plan_join, resource_affinity_rule};
use crate::proxmox::ha::HaRule;

/// The sid the checks give the VM not yet created.
const NEW: &str = "vm:new";

/// `Err` with what Proxmox would refuse, naming the keys and what to change.
pub fn check_join(m: &HaMembership<'_>, rules: &[HaRule]) -> Result<(), String> {
    let after = joined(m, rules);
    let node_rules: Vec<&HaRule> = after.iter().filter(|r| r.kind == "node-affinity").collect();
    let describe = |r: &&HaRule| match key(m, r) {
        Some(key) => format!("{key}: {}", r.rule),
        None => r.rule.clone(),
    };
    let mine: Vec<&HaRule> = node_rules.iter().copied().filter(|r| r.has(NEW)).collect();
    if mine.len() > 1 {
        let keys: Vec<String> = mine.iter().map(describe).collect();
        return Err(format!(
            "the VM would be in {} node-affinity rules ({}); Proxmox allows one per resource: keep \
             ha.node_affinity_nodes or the node-affinity rule in ha.rules, not both",
            mine.len(),
            keys.join(", ")
        ));
    }
    let joins = after
        .iter()
        .filter(|r| r.kind == "resource-affinity" && r.has(NEW));
    for rule in joins {
        let members = rule.resource_list();
        let key = key(m, rule).unwrap_or_default();
        let touching: Vec<&HaRule> = node_rules
            .iter()
            .copied()
            .filter(|n| n.resource_list().iter().any(|s| members.contains(s)))
            .collect();
        let names: Vec<String> = touching.iter().map(describe).collect();
        let negative = rule.affinity.as_deref() == Some("negative");
        if !negative && touching.len() > 1 {
            return Err(format!(
                "{key} is a positive resource-affinity rule ({}) whose VMs would be in {} node-affinity \
                 rules ({}); Proxmox needs them in at most one: put the set's VMs under one \
                 node-affinity rule or drop the positive affinity",
                rule.rule,
                touching.len(),
                names.join(", ")
            ));
        }
        let located: BTreeSet<&str> = touching
            .iter()
            .flat_map(|n| n.resource_list())
            .filter(|s| members.contains(s))
            .collect();
        let allowed: BTreeSet<&str> = touching.iter().flat_map(|n| n.node_names()).collect();
        if negative && located.len() > allowed.len() {
            let nodes: Vec<&str> = allowed.into_iter().collect();
            return Err(format!(
                "{key} keeps the set's VMs apart ({}), but {} limits them to {} node(s) ({}): a VM \
                 more than that cannot be kept apart, and Proxmox refuses the rule; add nodes to \
                 the node-affinity rule, or keep the set at {} machine(s)",
                rule.rule,
                names.join(", "),
                nodes.len(),
                nodes.join(", "),
                nodes.len()
            ));
        }
    }
    Ok(())
}

/// The provider-data key that puts the VM in `rule`, `None` for a rule the class does not name.
fn key(m: &HaMembership<'_>, rule: &HaRule) -> Option<String> {
    let settings = m.settings;
    let own = |name: fn(&str) -> String, wanted: bool| {
        wanted && m.set.map(name).as_deref() == Some(rule.rule.as_str())
    };
    if own(node_affinity_rule, !settings.node_affinity_nodes.is_empty()) {
        return Some("ha.node_affinity_nodes".into());
    }
    if own(resource_affinity_rule, settings.resource_affinity.is_some()) {
        return Some("ha.spread/ha.resource_affinity".into());
    }
    let named = settings.rules.iter().position(|n| *n == rule.rule);
    named.map(|i| format!("ha.rules[{i}]"))
}

/// The cluster's rules once the new VM, then the set's other VMs (`set_members`: HA-managed, made
/// or placed), joined them as [`plan_join`] makes them join: the new VM every rule the class puts
/// it in that exists, the others the set's own rules (those named in `ha.rules` they join later,
/// each on its own). A plan refused (a rule of another kind under the set's rule name) leaves the
/// rules as they are: the join reports it.
fn joined(m: &HaMembership<'_>, rules: &[HaRule]) -> Vec<HaRule> {
    let mut named = m.settings.clone();
    named
        .rules
        .retain(|name| rules.iter().any(|r| r.rule == *name));
    let mut own_only = m.settings.clone();
    own_only.rules.clear();
    let others = m.set_members.iter().map(|s| (s.as_str(), &own_only));
    let mut after = rules.to_vec();
    for (sid, settings) in std::iter::once((NEW, &named)).chain(others) {
        let member = HaMembership {
            settings,
            sid,
            ..m.clone()
        };
        let changes = plan_join(&member, &after).map(|p| p.changes);
        // Each change made: the rule as it reads afterwards.
        for change in changes.unwrap_or_default() {
            let (RuleChange::Create { rule, resources } | RuleChange::Join { rule, resources }) =
                change;
            let resources = Some(resources.join(","));
            match after.iter_mut().find(|r| r.rule == rule.rule) {
                Some(found) => *found = HaRule { resources, ..rule },
                None => after.push(HaRule { resources, ..rule }),
            }
        }
    }
    after
}

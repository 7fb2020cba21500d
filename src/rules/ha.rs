//! The HA rules of a machine set: which rules a VM must be in, what to write so it is, and which
//! rules go when a VM leaves.
//!
//! The set's own rules are named after the set the way the official provider names them
//! (`omni-<set>-naff`, `omni-<set>-raff`), so either provider finds the other's rules after a
//! takeover, and a restart finds its own by name. Pure: the caller reads the rules (one
//! `GET /cluster/ha/rules`) and applies one change at a time, reading again in between, because every
//! change alters the digest the next one must carry.

use std::collections::BTreeSet;

mod feasibility;
pub use feasibility::check_join;

use crate::proxmox::ha::HaRule;
use crate::rules::provider_data::{HaSettings, ResourceAffinity};

/// The set's node-affinity rule.
pub fn node_affinity_rule(set: &str) -> String {
    rule_name(set, "naff")
}

/// The set's resource-affinity rule.
pub fn resource_affinity_rule(set: &str) -> String {
    rule_name(set, "raff")
}

/// Whether `rule` is named like a machine set's own rule (ours or the official provider's).
pub fn is_set_rule(rule: &str) -> bool {
    rule.starts_with("omni-") && (rule.ends_with("-naff") || rule.ends_with("-raff"))
}

/// `omni-<set>-<suffix>`, with every character a rule ID may not hold (pve-common JSONSchema.pm,
/// `pve-configid`: letters, digits, `-`, `_`) made a `-`, as the official provider does.
fn rule_name(set: &str, suffix: &str) -> String {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-');
    let set: String = set
        .chars()
        .map(|c| if allowed(c) { c } else { '-' })
        .collect();
    format!("omni-{set}-{suffix}")
}

/// What the VM needs to be in its rules, and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaMembership<'a> {
    pub settings: &'a HaSettings,
    /// The machine-request set; the set's own rules need one.
    pub set: Option<&'a str>,
    /// This VM's sid (`vm:<id>`).
    pub sid: &'a str,
    /// HA-managed VMs of the set, this one included or not: the members a new resource-affinity rule
    /// starts with.
    pub set_members: &'a [String],
    /// Nodes in the cluster: a negative resource-affinity rule can keep at most this many VMs apart.
    pub cluster_nodes: usize,
    /// Written on the rules the provider creates.
    pub comment: &'a str,
}

/// The next write that brings the VM into its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleChange {
    /// Create `rule` with `resources`.
    Create {
        rule: HaRule,
        resources: Vec<String>,
    },
    /// Set the rule's resources to `resources` (the rule as read carries the digest).
    Join {
        rule: HaRule,
        resources: Vec<String>,
    },
}

/// Why the VM cannot be put into a rule it should be in; a person must act.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HaRuleError {
    #[error(
        "HA rule {rule:?} named in ha.rules does not exist: create it in Proxmox (Datacenter > HA > Rules) or remove it from ha.rules"
    )]
    Missing { rule: String },
    #[error(
        "HA rule {rule:?} is a {found} rule, but the provider keeps a {wanted} rule under that name for the machine set: rename or delete that rule in Proxmox"
    )]
    WrongKind {
        rule: String,
        found: String,
        wanted: &'static str,
    },
}

/// The plan: the writes still needed (apply the first, read again, plan again), and what the
/// operator should know about rules left as they are.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JoinPlan {
    pub changes: Vec<RuleChange>,
    pub notes: Vec<String>,
}

/// Brings the VM into the set's node-affinity rule, the set's resource-affinity rule and every rule
/// named in `ha.rules`.
pub fn plan_join(m: &HaMembership<'_>, rules: &[HaRule]) -> Result<JoinPlan, HaRuleError> {
    let mut plan = JoinPlan::default();
    let find = |name: &str| rules.iter().find(|r| r.rule == name);
    // The set's own rule, when one of that name exists: it must be of the kind the set keeps.
    let own = |name: &str, wanted: &'static str| match find(name) {
        Some(rule) if rule.kind != wanted => Err(HaRuleError::WrongKind {
            rule: rule.rule.clone(),
            found: rule.kind.clone(),
            wanted,
        }),
        found => Ok(found),
    };
    if let Some(set) = m.set {
        if !m.settings.node_affinity_nodes.is_empty() {
            let name = node_affinity_rule(set);
            match own(&name, "node-affinity")? {
                Some(rule) => join_node_affinity(m, rule, &mut plan),
                None => {
                    let nodes = m.settings.node_affinity_nodes.iter().map(|n| n.as_str());
                    let rule = HaRule {
                        nodes: Some(nodes.collect::<Vec<_>>().join(",")),
                        strict: m.settings.node_affinity_strict,
                        ..new_rule(m, name, "node-affinity")
                    };
                    let resources = vec![m.sid.to_owned()];
                    plan.changes.push(RuleChange::Create { rule, resources });
                }
            }
        }
        if let Some(affinity) = m.settings.resource_affinity {
            let name = resource_affinity_rule(set);
            match own(&name, "resource-affinity")? {
                Some(rule) => join_resource_affinity(m, rule, affinity, &mut plan),
                None => create_resource_affinity(m, name, affinity, &mut plan),
            }
        }
    }
    for name in &m.settings.rules {
        let rule = find(name).ok_or_else(|| HaRuleError::Missing { rule: name.clone() })?;
        plan.changes.extend(join(rule, m.sid));
    }
    Ok(plan)
}

/// The write that adds `sid` to `rule`, unless it is in it already.
fn join(rule: &HaRule, sid: &str) -> Option<RuleChange> {
    let resources: BTreeSet<&str> = rule.resource_list().into_iter().chain([sid]).collect();
    let resources = resources.into_iter().map(str::to_owned).collect();
    let rule = rule.clone();
    (!rule.has(sid)).then_some(RuleChange::Join { rule, resources })
}

/// The rule is made once, by the set's first VM; a class edited since then does not rewrite it
/// (the nodes are the operator's to change in Proxmox, as with the official provider), but says so.
fn join_node_affinity(m: &HaMembership<'_>, rule: &HaRule, plan: &mut JoinPlan) {
    let wanted: BTreeSet<&str> = m
        .settings
        .node_affinity_nodes
        .iter()
        .map(|n| n.as_str())
        .collect();
    let found: BTreeSet<&str> = rule.node_names().into_iter().collect();
    if wanted != found {
        plan.notes.push(format!(
            "HA rule {} keeps the set on {}, the machine class says {}: the rule is made once, edit its nodes in Proxmox",
            rule.rule,
            found.into_iter().collect::<Vec<_>>().join(", "),
            wanted.into_iter().collect::<Vec<_>>().join(", "),
        ));
    }
    plan.changes.extend(join(rule, m.sid));
}

fn join_resource_affinity(
    m: &HaMembership<'_>,
    rule: &HaRule,
    affinity: ResourceAffinity,
    plan: &mut JoinPlan,
) {
    if rule.affinity.as_deref() != Some(affinity.as_str()) {
        plan.notes.push(format!(
            "HA rule {} has affinity {}, the machine class says {}: the rule is made once, edit it in Proxmox",
            rule.rule,
            rule.affinity.as_deref().unwrap_or("(none)"),
            affinity.as_str()
        ));
    }
    if rule.has(m.sid) {
        return;
    }
    // pve-ha-manager src/PVE/HA/Rules/ResourceAffinity.pm,
    // `check_negative_resource_affinity_resources_count`: a negative rule may not hold more
    // resources than the cluster has nodes.
    let n = m.cluster_nodes;
    if rule.affinity.as_deref() == Some("negative") && rule.resource_list().len() >= n {
        plan.notes.push(format!(
            "HA rule {} already keeps {n} VMs apart on the cluster's {n} nodes; {} is not added (Proxmox refuses a negative resource-affinity rule with more VMs than nodes)",
            rule.rule, m.sid
        ));
        return;
    }
    plan.changes.extend(join(rule, m.sid));
}

/// Proxmox refuses a resource-affinity rule with fewer than two resources (pve-ha-manager
/// src/PVE/HA/Rules/ResourceAffinity.pm, `check_resource_affinity_resources_count`), so the set's
/// first VM waits and the second creates the rule with both.
fn create_resource_affinity(
    m: &HaMembership<'_>,
    name: String,
    affinity: ResourceAffinity,
    plan: &mut JoinPlan,
) {
    let mut members: BTreeSet<&str> = m.set_members.iter().map(String::as_str).collect();
    members.remove(m.sid);
    let mut resources = vec![m.sid.to_owned()];
    let room = match affinity {
        ResourceAffinity::Negative => m.cluster_nodes.saturating_sub(1),
        ResourceAffinity::Positive => usize::MAX,
    };
    resources.extend(members.into_iter().take(room).map(str::to_owned));
    if resources.len() < 2 {
        plan.notes.push(format!(
            "HA rule {name} is made when a second VM of the set is HA-managed (Proxmox needs two)"
        ));
        return;
    }
    resources.sort();
    let rule = HaRule {
        affinity: Some(affinity.as_str().to_owned()),
        ..new_rule(m, name, "resource-affinity")
    };
    plan.changes.push(RuleChange::Create { rule, resources });
}

/// A rule the provider creates: named, of `kind`, with the membership's comment.
fn new_rule(m: &HaMembership<'_>, rule: String, kind: &str) -> HaRule {
    HaRule {
        rule,
        kind: kind.to_owned(),
        comment: Some(m.comment.to_owned()),
        ..HaRule::default()
    }
}

/// The sids a rule write was refused for as not HA-managed (pve-ha-manager
/// src/PVE/API2/HA/Rules.pm `assert_valid_resources_param`: "cannot use unmanaged resource(s)
/// vm:101, vm:102."). A rule keeps the sid of a VM deleted from the HA resources where the delete
/// does not purge (pve-ha-manager before 5.0.7, early PVE 9.0), and every later write of the whole
/// member list names it again: those sids are left out of the next write.
pub fn unmanaged_sids(message: &str) -> Vec<String> {
    let Some((_, rest)) = message.split_once("cannot use unmanaged resource(s) ") else {
        return Vec::new();
    };
    let list = rest.split(['.', '\n']).next().unwrap_or_default();
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The set's rules to delete before `sid` leaves the HA manager: the resource-affinity rule when
/// fewer than two live members would remain (Proxmox would keep it, flagged as ineffective), the
/// node-affinity rule when none would. `alive` says whether a sid's VM still exists; a rule that
/// names only deleted VMs goes too. Other rules are left to the purge, which takes `sid` out of them.
pub fn rules_to_delete(
    set: &str,
    sid: &str,
    rules: &[HaRule],
    alive: impl Fn(&str) -> bool,
) -> Vec<String> {
    let remaining = |rule: &HaRule| {
        rule.resource_list()
            .into_iter()
            .filter(|r| *r != sid && alive(r))
            .count()
    };
    let mut delete = Vec::new();
    for (name, kind, fewest) in [
        (resource_affinity_rule(set), "resource-affinity", 2),
        (node_affinity_rule(set), "node-affinity", 1),
    ] {
        if let Some(rule) = rules.iter().find(|r| r.rule == name && r.kind == kind)
            && remaining(rule) < fewest
        {
            delete.push(name);
        }
    }
    delete
}

#[cfg(test)]
mod tests;

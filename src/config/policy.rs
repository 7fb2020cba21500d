//! The `policy:` section, read into [`Policy`] (see there for what it means).

use serde_json::{Map, Value};

use super::{Found, kind};
use crate::rules::policy::Policy;

pub(super) const POLICY_KEYS: &[&str] = &[
    "bridges",
    "vlans",
    "pools",
    "templates",
    "mappings",
    "haRules",
];

pub(super) fn policy(root: &Map<String, Value>, found: &mut Found) -> Policy {
    let map = match root.get("policy") {
        None | Some(Value::Null) => return Policy::default(),
        Some(Value::Object(m)) => m,
        Some(other) => {
            found.problems.push(format!(
                "`policy` must be a mapping of allowed bridges, vlans, pools, templates, mappings and haRules, found {}",
                kind(other)
            ));
            return Policy::default();
        }
    };
    found.check_keys(map, POLICY_KEYS, "policy.");
    let mut names = |key: &str| names(map, key, &mut found.problems);
    Policy {
        bridges: names("bridges"),
        pools: names("pools"),
        templates: names("templates"),
        mappings: names("mappings"),
        ha_rules: names("haRules"),
        vlans: vlan_ranges(map, &mut found.problems),
    }
}

/// A list of names (numbers are taken as written: a template's VMID).
fn names(map: &Map<String, Value>, key: &str, problems: &mut Vec<String>) -> Option<Vec<String>> {
    let items = list(map, key, problems)?;
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::String(s) if !s.trim().is_empty() => out.push(s.trim().to_owned()),
            Value::Number(n) => out.push(n.to_string()),
            other => problems.push(format!(
                "`policy.{key}[{i}]` must be a name, found {}",
                kind(other)
            )),
        }
    }
    Some(out)
}

fn list<'a>(
    map: &'a Map<String, Value>,
    key: &str,
    problems: &mut Vec<String>,
) -> Option<&'a Vec<Value>> {
    match map.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(items),
        Some(other) => {
            problems.push(format!(
                "`policy.{key}` must be a list, found {}",
                kind(other)
            ));
            None
        }
    }
}

/// `vlans: [0, 100, 200-299]`: tags and inclusive ranges of tags, 0 for untagged.
fn vlan_ranges(map: &Map<String, Value>, problems: &mut Vec<String>) -> Option<Vec<(u16, u16)>> {
    let items = list(map, "vlans", problems)?;
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let text = match item {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.trim().to_owned(),
            other => {
                problems.push(format!(
                    "`policy.vlans[{i}]` must be a VLAN tag or a range such as 100-199, found {}",
                    kind(other)
                ));
                continue;
            }
        };
        let tag = |t: &str| t.trim().parse::<u16>().ok().filter(|v| *v <= 4094);
        let range = match text.split_once('-') {
            Some((lo, hi)) => tag(lo).zip(tag(hi)).filter(|(lo, hi)| lo <= hi),
            None => tag(&text).map(|t| (t, t)),
        };
        match range {
            Some(r) => out.push(r),
            None => problems.push(format!(
                "`policy.vlans[{i}]` {text:?} is not a VLAN tag (0-4094, 0 for untagged) or a range such as 100-199"
            )),
        }
    }
    Some(out)
}

//! The `policy:` section, read into [`Policy`] (see there for what it means).

use serde::Deserialize;
use serde_json::Value;

use super::read::{Expecting, kind, value_type};
use crate::rules::policy::Policy;

/// `policy:` as written: what machine classes may ask for, each list optional.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct PolicyFile {
    bridges: Option<Vec<Name>>,
    /// `vlans: [0, 100, 200-299]`: tags and inclusive ranges of tags, 0 for untagged.
    vlans: Option<Vec<VlanRange>>,
    pools: Option<Vec<Name>>,
    templates: Option<Vec<Name>>,
    mappings: Option<Vec<Name>>,
    ha_rules: Option<Vec<Name>>,
}

impl Expecting for PolicyFile {
    const EXPECTING: &'static str =
        "a mapping of allowed bridges, vlans, pools, templates, mappings and haRules";
}

impl From<PolicyFile> for Policy {
    fn from(p: PolicyFile) -> Self {
        let names = |list: Option<Vec<Name>>| list.map(|l| l.into_iter().map(|n| n.0).collect());
        Policy {
            bridges: names(p.bridges),
            vlans: p.vlans.map(|l| l.into_iter().map(|r| r.0).collect()),
            pools: names(p.pools),
            templates: names(p.templates),
            mappings: names(p.mappings),
            ha_rules: names(p.ha_rules),
        }
    }
}

value_type!(
    /// A name (a number is taken as written: a template's VMID).
    Name(String),
    |v| match v {
        Value::String(s) if !s.trim().is_empty() => Ok(s.trim().to_owned()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(format!(" must be a name, found {}", kind(&other))),
    }
);

value_type!(
    /// A VLAN tag or an inclusive range of them (`100-199`).
    VlanRange((u16, u16)),
    |v| {
        let text = match v {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.trim().to_owned(),
            other => {
                let found = kind(&other);
                return Err(format!(" must be a VLAN tag or a range such as 100-199, found {found}"));
            }
        };
        let tag = |t: &str| t.trim().parse::<u16>().ok().filter(|v| *v <= 4094);
        let range = match text.split_once('-') {
            Some((lo, hi)) => tag(lo).zip(tag(hi)).filter(|(lo, hi)| lo <= hi),
            None => tag(&text).map(|t| (t, t)),
        };
        range.ok_or_else(|| {
            format!(" {text:?} is not a VLAN tag (0-4094, 0 for untagged) or a range such as 100-199")
        })
    }
);

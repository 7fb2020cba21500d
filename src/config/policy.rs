//! The config file's `policy:`: what machine classes may ask for, for operators whose class authors
//! are not Proxmox administrators. Each list, when set, is all that is allowed of its kind; an unset
//! list leaves that kind to the token's ACLs (docs/security.md).
//!
//! ```yaml
//! policy:
//!   bridges: [vmbr0, vmbr1]
//!   vlans: [0, 100-199]        # 0: untagged
//!   pools: [omni]
//!   templates: [9000, talos-template]
//!   mappings: [gpu-a]          # PCI and USB resource mappings
//!   haRules: [spread-workers]
//! ```
//!
//! Checked where provider data is resolved for a request, so a class asking for more fails with
//! the key and the allowed values before anything is created.

use serde::Deserialize;
use serde_json::Value;

use super::read::{Expecting, kind, value_type};
use crate::rules::provider_data::{Problem, ProviderData};

/// What classes may ask for; `None` allows anything the token can.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    bridges: Option<Vec<Name>>,
    /// `vlans: [0, 100, 200-299]`: tags and inclusive ranges of tags, 0 for untagged.
    vlans: Option<Vec<VlanRange>>,
    pools: Option<Vec<Name>>,
    /// Template VMIDs or names, as the class may write them.
    templates: Option<Vec<Name>>,
    mappings: Option<Vec<Name>>,
    ha_rules: Option<Vec<Name>>,
}

impl Policy {
    /// What `data` asks for beyond the policy, by provider-data key.
    pub fn check(&self, data: &ProviderData) -> Vec<Problem> {
        let mut refused = Vec::new();
        let nics = data.additional_nics.iter().enumerate();
        let nic_bridges = nics
            .clone()
            .map(|(i, nic)| (format!("additional_nics[{i}].bridge"), nic.bridge.as_str()));
        let bridges = std::iter::once(("network_bridge".into(), data.network_bridge.as_str()));
        not_listed(
            &self.bridges,
            "bridge",
            bridges.chain(nic_bridges),
            &mut refused,
        );
        if let Some(allowed) = &self.vlans {
            let range = |VlanRange((lo, hi)): &VlanRange| match lo == hi {
                true => lo.to_string(),
                false => format!("{lo}-{hi}"),
            };
            let shown = allowed.iter().map(range).collect::<Vec<_>>().join(", ");
            let tags = nics.map(|(i, nic)| (format!("additional_nics[{i}].vlan"), nic.vlan));
            for (key, tag) in std::iter::once(("vlan".to_string(), data.vlan)).chain(tags) {
                let tag = tag.map_or(0, |v| v.get());
                if !allowed
                    .iter()
                    .any(|VlanRange((lo, hi))| (*lo..=*hi).contains(&tag))
                {
                    let what = match tag {
                        0 => "no VLAN (untagged)".to_string(),
                        _ => format!("VLAN {tag}"),
                    };
                    refused.push(refusal(key, what, shown.clone()));
                }
            }
        }
        let pool = data.pool.iter().map(|p| ("pool".into(), p.as_str()));
        not_listed(&self.pools, "pool", pool, &mut refused);
        if let (Some(pools), None) = (&self.pools, &data.pool) {
            let what = "no pool (the VM would go to a pool named after its machine-request set)";
            refused.push(refusal("pool".into(), what.into(), pools.join(", ")));
        }
        let template = data
            .template
            .iter()
            .map(|t| ("template".into(), t.to_string()));
        not_listed(&self.templates, "template", template, &mut refused);
        let pci = data.pci_devices.iter().enumerate();
        let pci = pci.map(|(i, d)| (format!("pci_devices[{i}]"), d.mapping.as_str()));
        let usb = data.usb_devices.iter().enumerate();
        let usb = usb.map(|(i, d)| (format!("usb_devices[{i}]"), d.mapping.as_str()));
        not_listed(&self.mappings, "mapping", pci.chain(usb), &mut refused);
        let rules = data.ha.iter().flat_map(|ha| ha.rules.iter().enumerate());
        let rules = rules.map(|(i, rule)| (format!("ha.rules[{i}]"), rule.as_str()));
        not_listed(&self.ha_rules, "HA rule", rules, &mut refused);
        refused
    }
}

impl Expecting for Policy {
    const EXPECTING: &'static str =
        "a mapping of allowed bridges, vlans, pools, templates, mappings and haRules";
}

/// Names join into the list of allowed values a refusal shows.
impl std::borrow::Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

value_type!(
    /// A name (a number is taken as written: a template's VMID).
    #[derive(Debug, Clone)]
    Name(String),
    |v| match v {
        Value::String(s) if !s.trim().is_empty() => Ok(s.trim().to_owned()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(format!(" must be a name, found {}", kind(&other))),
    }
);

value_type!(
    /// A VLAN tag or an inclusive range of them (`100-199`).
    #[derive(Debug, Clone)]
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

/// Each value `asked` for (under its key) that `allowed`, when set, does not list.
fn not_listed<S: AsRef<str>>(
    allowed: &Option<Vec<Name>>,
    what: &str,
    asked: impl IntoIterator<Item = (String, S)>,
    refused: &mut Vec<Problem>,
) {
    let Some(allowed) = allowed else { return };
    for (key, value) in asked {
        let value = value.as_ref();
        if !allowed.iter().any(|a| a.0 == value) {
            let what = format!("{what} {value:?}");
            refused.push(refusal(key, what, allowed.join(", ")));
        }
    }
}

fn refusal(key: String, what: String, allowed: String) -> Problem {
    Problem {
        key,
        message: format!(
            "{what} is not allowed by the provider's policy (allowed: {allowed}); ask the operator or choose an allowed one"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::provider_data::ConfigLayers;

    fn data(extra: &str) -> ProviderData {
        ConfigLayers::default()
            .resolve(
                &format!("cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\n{extra}"),
                None,
            )
            .unwrap()
    }

    fn keys(problems: &[Problem]) -> Vec<&str> {
        problems.iter().map(|p| p.key.as_str()).collect()
    }

    #[test]
    fn an_unset_policy_allows_anything() {
        let asked =
            data("network_bridge: vmbr7\nvlan: 42\npool: any\nboot: clone\ntemplate: 9000\n");
        assert!(Policy::default().check(&asked).is_empty());
    }

    #[test]
    fn each_kind_is_held_to_its_list_with_the_key_and_the_allowed_values() {
        let policy: Policy = serde_json::from_value(serde_json::json!({
            "bridges": ["vmbr0"],
            "vlans": [0, "100-199"],
            "pools": ["omni"],
            "templates": [9000, "talos"],
            "mappings": ["gpu-a"],
            "haRules": ["spread"],
        }))
        .unwrap();
        let fine = data(
            "network_bridge: vmbr0\nvlan: 150\npool: omni\nboot: clone\ntemplate: talos\npci_devices: [{mapping: gpu-a}]\nha:\n  rules: [spread]\n",
        );
        assert_eq!(policy.check(&fine), []);
        let greedy = data(
            "network_bridge: vmbr9\nvlan: 300\npool: other\nboot: clone\ntemplate: 9001\npci_devices: [{mapping: gpu-b}]\nadditional_nics: [{bridge: vmbr0, vlan: 7}]\nha:\n  rules: [spread, theirs]\n",
        );
        let refused = policy.check(&greedy);
        assert_eq!(
            keys(&refused),
            [
                "network_bridge",
                "vlan",
                "additional_nics[0].vlan",
                "pool",
                "template",
                "pci_devices[0]",
                "ha.rules[1]"
            ]
        );
        assert!(
            refused[1].message.contains("allowed: 0, 100-199"),
            "{}",
            refused[1]
        );
        let no_pool = data("");
        assert_eq!(keys(&policy.check(&no_pool)), ["pool"]);
    }
}

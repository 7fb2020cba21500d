//! Proxmox HA: the HA resource a VM becomes (`/cluster/ha/resources`) and the HA rules it is a member
//! of (`/cluster/ha/rules`, Proxmox VE 9).
//!
//! What the HA manager accepts, from pve-ha-manager src/PVE/API2/HA/Rules.pm and
//! src/PVE/HA/Config.pm:
//! - every rule change is checked against the whole rule set, so a rule that names an unmanaged
//!   resource, a resource-affinity rule with fewer than two resources, or a negative one with more
//!   resources than the cluster has nodes is refused;
//! - all rules live in one file and share one digest: a `PUT` carrying the digest it read fails with
//!   "detected modified configuration" when anything changed in between, so a concurrent edit is
//!   never lost;
//! - a `PUT` keeps every property it does not send (`SectionConfig::delete_from_config` removes only
//!   what `delete` names), but it must name the rule's `type` (the schema is per type);
//! - deleting an HA resource takes it out of every rule and deletes the rules left with no resource
//!   (`purge`, default 1, pve-ha-manager 5.0.7 and later, src/PVE/API2/HA/Resources.pm `delete`).
//!   The parameter is never sent: PVE 8 and 9.0 with an older pve-ha-manager refuse it as not in
//!   their schema (`additionalProperties 0`), and where it exists its default is what we want.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::client::Replay::{OnlyIfUnsent, Safe};
use super::client::{DELETE, POST, PUT, Params, ProxmoxClient};
use super::error::{ProxmoxError, Result};
use super::types::{VmId, lenient, split_list};

/// The HA manager's name for a VM.
pub fn vm_sid(vmid: VmId) -> String {
    format!("vm:{vmid}")
}

/// An HA rule as `GET /cluster/ha/rules` lists it, serialized as the `cluster` command's report
/// shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
pub struct HaRule {
    pub rule: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// Comma-separated sids, sorted (pve-ha-manager Rules.pm `encode_value`); written as a list.
    #[serde(serialize_with = "sid_list")]
    pub resources: Option<String>,
    /// Node-affinity rules: comma-separated `node[:priority]`.
    pub nodes: Option<String>,
    #[serde(default, deserialize_with = "lenient::bool")]
    pub strict: bool,
    /// Resource-affinity rules: `positive` or `negative`.
    pub affinity: Option<String>,
    /// The digest of the whole rules file, the same on every rule of one answer.
    #[serde(skip_serializing)]
    pub digest: Option<String>,
    /// Why the HA manager does not apply the rule, by property (`check_feasibility`), e.g.
    /// `{"resources": "rule is ineffective as there are less than two resources"}`; written as
    /// `problems`, in one line.
    #[serde(rename(serialize = "problems"), serialize_with = "problems")]
    pub errors: Option<Value>,
    /// Why the rule is there; the report leaves it out.
    #[serde(skip_serializing)]
    pub comment: Option<String>,
}

fn sid_list<S: serde::Serializer>(sids: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(split_list(sids.as_deref().unwrap_or_default()))
}

fn problems<S: serde::Serializer>(errors: &Option<Value>, s: S) -> Result<S::Ok, S::Error> {
    problems_line(errors).serialize(s)
}

/// A rule's errors in one line: `property: reason; …`.
pub fn problems_line(errors: &Option<Value>) -> Option<String> {
    errors.as_ref().map(|e| match e {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| format!("{k}: {}", v.as_str().map_or(v.to_string(), str::to_owned)))
            .collect::<Vec<_>>()
            .join("; "),
        other => other.to_string(),
    })
}

impl HaRule {
    pub fn resource_list(&self) -> Vec<&str> {
        split_list(self.resources.as_deref().unwrap_or_default())
    }

    /// The node names, without priorities.
    pub fn node_names(&self) -> Vec<&str> {
        split_list(self.nodes.as_deref().unwrap_or_default())
            .into_iter()
            .map(|n| n.split(':').next().unwrap_or(n))
            .collect()
    }

    pub fn has(&self, sid: &str) -> bool {
        self.resource_list().contains(&sid)
    }
}

impl ProxmoxClient {
    /// Registers the VM with the HA manager, with `settings` (`state`, `comment`, `max_restart`, …
    /// as `POST /cluster/ha/resources` names them). Already registered (a re-run, or an operator
    /// made it first) has the settings written over it, as the official provider does, so an
    /// edited `ha:` takes effect.
    pub async fn add_ha_resource(&self, vmid: VmId, settings: Params) -> Result<()> {
        let sid = vm_sid(vmid);
        let params = Params::new().with("sid", &sid).extend(settings.0.clone());
        let path = ["cluster", "ha", "resources"];
        match self.write(POST, &path, params, OnlyIfUnsent).await {
            // pve-ha-manager src/PVE/API2/HA/Resources.pm, `create`: "resource ID '<sid>' already
            // defined"; `update` takes the same settings but `sid` from the path.
            Err(ProxmoxError::Api { message, .. }) if message.contains("already defined") => {
                if settings.0.is_empty() {
                    return Ok(());
                }
                let path = ["cluster", "ha", "resources", &sid];
                self.write(PUT, &path, settings, Safe).await
            }
            other => other,
        }
    }

    /// Takes the VM out of the HA manager (`DELETE /cluster/ha/resources/vm:<id>`) and, where
    /// pve-ha-manager purges by default (5.0.7 and later), out of every HA rule, leaving the VM in
    /// whatever state it is. Not HA-managed (any more) is success.
    pub async fn remove_ha_resource(&self, vmid: VmId) -> Result<()> {
        let sid = vm_sid(vmid);
        let path = ["cluster", "ha", "resources", &sid];
        match self.write(DELETE, &path, Params::new(), OnlyIfUnsent).await {
            // pve-ha-manager src/PVE/API2/HA/Resources.pm, `delete`: "cannot delete service
            // '<sid>', not HA managed!"
            Err(ProxmoxError::Api { message, .. }) if message.contains("not HA managed") => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        }
    }

    /// `GET /cluster/ha/rules`: every rule, with the digest a change must carry.
    pub async fn ha_rules(&self) -> Result<Vec<HaRule>> {
        self.get(&["cluster", "ha", "rules"], Params::new()).await
    }

    /// `POST /cluster/ha/rules`: `rule` with `resources`. A rule of that name existing already fails
    /// (see [`ProxmoxError::is_ha_rule_defined`]).
    pub async fn create_ha_rule(&self, rule: &HaRule, resources: &[String]) -> Result<()> {
        let params = Params::new()
            .with("rule", &rule.rule)
            .with("type", &rule.kind)
            .with("resources", resources.join(","))
            .with_opt("comment", rule.comment.as_deref())
            .with_opt("nodes", rule.nodes.as_deref())
            .with_opt("strict", rule.nodes.as_ref().map(|_| u8::from(rule.strict)))
            .with_opt("affinity", rule.affinity.as_deref());
        let path = ["cluster", "ha", "rules"];
        self.write(POST, &path, params, OnlyIfUnsent).await
    }

    /// Sets a rule's resources (`PUT /cluster/ha/rules/<rule>`), only if the rules are still as they
    /// were when `rule` was read: otherwise Proxmox refuses (see
    /// [`ProxmoxError::is_ha_rules_changed`]) and the caller reads again.
    pub async fn set_ha_rule_resources(&self, rule: &HaRule, resources: &[String]) -> Result<()> {
        let params = Params::new()
            .with("type", rule.kind.as_str())
            .with("resources", resources.join(","))
            .with_opt("digest", rule.digest.as_deref());
        let path = ["cluster", "ha", "rules", &rule.rule];
        self.write(PUT, &path, params, OnlyIfUnsent).await
    }

    /// `DELETE /cluster/ha/rules/<rule>`; Proxmox answers success for a rule that is not there.
    pub async fn delete_ha_rule(&self, rule: &str) -> Result<()> {
        let path = ["cluster", "ha", "rules", rule];
        match self.write(DELETE, &path, Params::new(), OnlyIfUnsent).await {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        }
    }
}

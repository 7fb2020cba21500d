//! Provider data: the machine class's `provider_data` YAML, over the provider config's per-node
//! `nodes:` overrides and `defaults:`, validated and turned into a typed [`ProviderData`].
//!
//! The official provider ignores unknown keys and compiles the storage selector only when it creates
//! the VM, so mistakes surface late or never. Here every layer goes through the JSON schema (the same
//! one Omni shows for machine classes), then through semantic checks (selectors compile and yield a
//! bool, names are what Proxmox accepts, cross-field rules), and every problem is reported at once with
//! its key path and how to fix it. Unknown keys are the exception: a class that works with the
//! official provider must work here too, so they are warnings (with a "did you mean") carried in
//! [`ProviderData::warnings`], unless the config asks for `strict: true`.
//!
//! - `keys.rs`: every key, declared once as a field of a `#[derive(Deserialize, JsonSchema)]`
//!   struct; `values.rs`: how its values read (the choices, the validated newtypes); `schema.rs`
//!   generates from them the JSON schema, the README table and what the reader knows of each key.
//! - `layers.rs`: one layer read (the schema, then the keys typed, by `leave_out.rs`, which names
//!   every value serde refuses and every unknown key) with its findings, the layers of a request,
//!   and the config's `defaults:` / `nodes:` read once at load.
//! - `effective.rs`: the layers merged, rules between keys, defaults filled in: the typed
//!   [`ProviderData`].

mod effective;
pub mod keys;
mod layers;
mod leave_out;
pub mod schema;
mod values;

use serde_json::{Map, Value};

pub use effective::ProviderData;
pub use keys::{AdditionalDisk, HaSettings};
pub use layers::ConfigLayers;
pub use leave_out::read_leaving_out;
pub use values::{Bios, BootMode, CloneMode, PlacementStrategy, ResourceAffinity, TemplateRef};

/// Tag prefixes the provider sets itself; user tags may not use them (placement and ownership checks
/// count them).
pub const RESERVED_TAG_PREFIXES: &[&str] = &["machine-request.", "omni-provider.", "omni-request."];

/// One thing wrong with the provider data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct Problem {
    /// Where: `memory`, `additional_disks[1].disk_size`, `nodes.pve2.network_bridge`.
    pub key: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Formats a list of problems as one message, one per line.
pub fn describe(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(Problem::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// What checking one layer (or the config's overrides) found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerCheck {
    /// The layer cannot be used as it is.
    pub problems: Vec<Problem>,
    /// Ignored, but worth telling the user (unknown keys).
    pub warnings: Vec<Problem>,
}

/// Parses a machine class's provider-data YAML into a map, or explains why it is not one.
pub fn class_map(yaml: &str) -> Result<Map<String, Value>, Vec<Problem>> {
    let root = |message: String| {
        vec![Problem {
            key: "provider_data".into(),
            message,
        }]
    };
    match crate::yaml::from_str(yaml) {
        Ok(Value::Null) => Ok(Map::new()),
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(root(format!(
            "must be a mapping of keys to values, not {}",
            json_kind(&other)
        ))),
        Err(e) => Err(root(format!("is not valid YAML: {e}"))),
    }
}

/// A short name for a JSON value's type, for error messages.
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// `GET /version`'s `version` ("8.4.1") as (major, minor). A version that cannot be read is let
/// through by every check: Proxmox then says what it thinks.
fn release(pve_version: &str) -> Option<(u32, u32)> {
    let mut parts = pve_version.split('.').map(|p| p.trim().parse::<u32>());
    let major = parts.next()?.ok()?;
    Some((major, parts.next().and_then(Result::ok).unwrap_or(0)))
}

/// The first Proxmox VE major release whose HA resources have `failback` (pve-ha-manager 5.0.2, the
/// PVE 9 series; older clusters answer 400 to it), and HA rules (pve-ha-manager 5.0,
/// src/PVE/API2/HA/Rules.pm; Proxmox VE 8 has HA groups instead and answers 501 for
/// `/cluster/ha/rules`).
pub const HA_RULES_SINCE_PVE: u32 = 9;

/// `boot: image` downloads the disk image into `import` storage and creates the boot disk from it
/// with `import-from`: download-url takes `.qcow2` into `import` from libpve-storage-perl 8.3.6
/// (pve-storage src/PVE/API2/Storage/Status.pm `download_url`, `UPLOAD_IMPORT_EXT_RE_1`), which
/// Proxmox VE 8.4 is the first release to require (pve-manager debian/control).
pub const BOOT_IMAGE_SINCE_PVE: (u32, u32) = (8, 4);

/// Every key the cluster's Proxmox VE release does not accept: `ha.failback`; `ha.rules`,
/// `ha.node_affinity_nodes`, `ha.resource_affinity` or `ha.spread`, as one problem naming the keys
/// used (the official provider lets such a machine be created and then fails at its rule step;
/// refusing first leaves nothing behind); `boot: image`.
pub fn release_problems(data: &ProviderData, pve_version: &str) -> Vec<Problem> {
    let mut found = Vec::new();
    let Some(release) = release(pve_version) else {
        return found;
    };
    let mut problem = |key: &str, message| {
        found.push(Problem {
            key: key.into(),
            message,
        })
    };
    let old_ha = data.ha.as_ref().filter(|_| release.0 < HA_RULES_SINCE_PVE);
    if old_ha.is_some_and(|ha| ha.failback.is_some()) {
        problem(
            "ha.failback",
            format!(
                "needs Proxmox VE {HA_RULES_SINCE_PVE} or later; this cluster runs {pve_version}: remove `failback` (on PVE 8, set it on an HA group instead) or upgrade"
            ),
        );
    }
    if let Some(ha) = old_ha.filter(|ha| ha.uses_rules()) {
        let keys: Vec<&str> = [
            (!ha.rules.is_empty(), "rules"),
            (!ha.node_affinity_nodes.is_empty(), "node_affinity_nodes"),
            (ha.resource_affinity.is_some(), "resource_affinity/spread"),
        ]
        .into_iter()
        .filter_map(|(used, key)| used.then_some(key))
        .collect();
        problem(
            "ha",
            format!(
                "HA rules ({}) need Proxmox VE {HA_RULES_SINCE_PVE} or later; this cluster runs {pve_version}: remove them (on PVE 8, use an HA group) or upgrade",
                keys.join(", ")
            ),
        );
    }
    if data.boot == BootMode::Image && release < BOOT_IMAGE_SINCE_PVE {
        let (since_major, since_minor) = BOOT_IMAGE_SINCE_PVE;
        problem(
            "boot",
            format!(
                "`image` needs Proxmox VE {since_major}.{since_minor} or later (disk images downloaded into `import` storage); this cluster runs {pve_version}: use `boot: iso` or upgrade"
            ),
        );
    }
    found
}

/// Whether `data` uses a key [`release_problems`] checks, so the release must be known first: a
/// release older than every one they name finds each such key.
pub fn needs_release_check(data: &ProviderData) -> bool {
    !release_problems(data, "0").is_empty()
}

#[cfg(test)]
mod tests;

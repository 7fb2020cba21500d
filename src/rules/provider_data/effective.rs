//! The provider data that takes effect for one request: the layers merged, the required keys checked,
//! the rules between keys applied, and every default filled in: the typed [`ProviderData`] the
//! pipeline works from.

use std::ops::Deref;

use serde_json::Value;

use super::keys::{HaSettings, Keys};
use super::layers::{ConfigLayers, Layer, Stack};
use super::schema::required_keys;
use super::values::{BootMode, MachineType, ResourceAffinity};
use super::{LayerCheck, Problem, class_map};
use crate::did_you_mean;
use crate::proxmox::property::{DiskOptions, Hugepages, NodeName};
use crate::rules::storage_selector::StorageSelector;

impl ConfigLayers {
    /// The provider data for one request: the class YAML over `node`'s override (once the node is
    /// known) over `defaults:`, merged and checked; a problem is reported under the path of the
    /// layer its value came from.
    pub fn resolve(
        &self,
        class_yaml: &str,
        node: Option<&str>,
    ) -> Result<ProviderData, Vec<Problem>> {
        let class = Layer::read(Value::Object(class_map(class_yaml)?));
        let stack = &Stack::new(&class, self, node);
        let mut keys = stack.keys()?;
        let mut report = LayerCheck::default();
        stack.report(false, &mut report, self.strict);
        // The required keys no layer writes.
        let unknown = stack.unknown_keys();
        for (key, example) in required_keys().filter(|(k, _)| !stack.writes(k)) {
            // A misspelling of it is only a warning, so point at it here where it matters.
            let near_miss = unknown
                .iter()
                .find(|k| did_you_mean::suggest(k, &[key]).is_some())
                .map(|k| format!(" (`{k}` is set: did you mean `{key}`?)"))
                .unwrap_or_default();
            report.problem(
                key.to_string(),
                format!(
                    "is required: set it in the machine class (or under `defaults:` in the provider config){example}{near_miss}"
                ),
            );
        }
        stack.report(true, &mut report, self.strict);
        rules(&keys, stack, &mut report);
        // `spread: true` is the short way to ask for `resource_affinity: negative`.
        if let Some(ha) = &mut keys.ha
            && ha.spread == Some(true)
        {
            ha.resource_affinity = Some(ResourceAffinity::Negative);
        }
        // The required storage selector is missing or wrong only with its problem reported.
        match keys.storage_selector.clone() {
            Some(storage_selector) if report.problems.is_empty() => Ok(ProviderData {
                storage_selector,
                keys,
                warnings: report.warnings,
            }),
            // A mistyped key is often why the rest fails (its value was ignored): the keys ignored,
            // each with its "did you mean", are shown after what failed, unless a problem names
            // them already.
            _ => {
                let named = |key: &str| {
                    let quoted = format!("`{key}`");
                    report.problems.iter().any(|p| p.message.contains(&quoted))
                };
                let ignored: Vec<Problem> = report
                    .warnings
                    .into_iter()
                    .filter(|w| !named(&w.key))
                    .collect();
                Err(report.problems.into_iter().chain(ignored).collect())
            }
        }
    }
}

/// The rules between keys, on the merged keys.
fn rules(k: &Keys, stack: &Stack<'_>, report: &mut LayerCheck) {
    let mut f =
        |path: &str, message| report.problem(format!("{}{path}", stack.prefix_of(path)), message);
    let boot = k.boot;
    if boot == BootMode::Clone && k.template.is_none() {
        f("template", "is required with `boot: clone`: give the template's VMID or name, e.g. `template: 9000`".into());
    }
    if boot != BootMode::Clone && k.template.is_some() {
        f(
            "template",
            "is only used with `boot: clone`; add `boot: clone` or remove `template`".into(),
        );
    }
    if boot == BootMode::Iso && stack.writes("clone_mode") {
        f(
            "clone_mode",
            "is only used with `boot: clone`; add `boot: clone` and `template`, or remove `clone_mode`"
                .into(),
        );
    }
    let allowed = &k.allowed_nodes;
    if let Some(node) = &k.node
        && !allowed.is_empty()
        && !allowed.contains(node)
    {
        f(
            "node",
            format!(
                "{:?} is not in allowed_nodes ({}); add it there or pick another node",
                node.as_str(),
                allowed
                    .iter()
                    .map(NodeName::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    if k.hugepages.is_some() && k.balloon == Some(true) {
        f(
            "balloon",
            "cannot be true together with hugepages; set `balloon: false` or remove hugepages"
                .into(),
        );
    }
    if let Some(pages) = k.hugepages {
        hugepages_problems(pages, k, &mut f);
    }
    let pcie = k.pci_devices.iter().any(|p| p.pcie);
    if pcie && k.machine_type != Some(MachineType::Q35) {
        f(
            "machine_type",
            "must be q35 when a PCI device uses `pcie: true`".into(),
        );
    }
}

/// Proxmox accepts `hugepages` in any VM config but refuses to start the VM unless NUMA is on, and
/// backs each NUMA node (one per socket, the memory split evenly) with whole pages; a class that
/// breaks either rule would create a VM that never starts.
fn hugepages_problems(pages: Hugepages, k: &Keys, f: &mut impl FnMut(&str, String)) {
    if !k.numa {
        f(
            "numa",
            "must be true with hugepages: Proxmox refuses to start a VM that has hugepages without NUMA; set `numa: true` or remove hugepages".to_string(),
        );
    }
    let (page_mb, page_name) = match pages {
        Hugepages::TwoMb => (2, "2MB"),
        Hugepages::OneGb => (1024, "1GB"),
        // Proxmox picks 1GB pages when they divide the memory, else 2MB: even is the least it needs.
    };
    let (memory, sockets) = (k.memory_mb, u64::from(k.sockets.max(1)));
    // Memory is 0 when it is missing or wrong (its problem is reported).
    if memory > 0 && (memory % sockets != 0 || (memory / sockets) % page_mb != 0) {
        let step = page_mb * sockets;
        let suggestion = (memory / step).max(1) * step;
        f(
            "memory",
            format!(
                "{memory} MB split over {sockets} NUMA node(s) (one per socket) is not a whole number of {page_name} hugepages per node; use a multiple of {step} MB, e.g. `memory: {suggestion}`"
            ),
        );
    }
}

impl HaSettings {
    /// Whether the VM joins any HA rule: keys Proxmox VE 8 has no API for.
    pub fn uses_rules(&self) -> bool {
        !self.rules.is_empty()
            || !self.node_affinity_nodes.is_empty()
            || self.resource_affinity.is_some()
    }
}

/// Validated provider data: the merged [`Keys`] (read through `Deref`), and the required storage
/// selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderData {
    pub keys: Keys,
    pub storage_selector: StorageSelector,
    /// Keys that were ignored (unknown ones, each with a suggestion when one is close): not fatal, as
    /// with the official provider, but shown in the machine's status, the log and `validate`.
    pub warnings: Vec<Problem>,
}

impl Deref for ProviderData {
    type Target = Keys;

    fn deref(&self) -> &Keys {
        &self.keys
    }
}

impl ProviderData {
    /// The VM's vCPUs (cores per socket times sockets), as placement counts them against a node.
    pub fn vcpus(&self) -> u64 {
        u64::from(self.cores).saturating_mul(u64::from(self.sockets.max(1)))
    }

    /// Disk space the VM needs on its main storage: boot disk plus additional disks, in GB.
    pub fn total_disk_gb(&self) -> u64 {
        self.disk_size_gb.saturating_add(
            self.additional_disks
                .iter()
                .map(|d| d.size_gb)
                .fold(0, u64::saturating_add),
        )
    }

    /// The boot disk's options.
    pub fn disk(&self) -> DiskOptions {
        DiskOptions {
            ssd: self.disk_ssd,
            discard: self.disk_discard,
            iothread: self.disk_iothread,
            cache: self.disk_cache,
            aio: self.disk_aio,
        }
    }
}

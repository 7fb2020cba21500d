//! The provider data that takes effect for one request: the layers merged, the required keys checked,
//! the rules between keys applied, and every default filled in.

use super::data::{BootMode, MachineType, ProviderData};
use super::keys::{self, Place};
use super::layers::{Finding, Findings, Phase, Report, Settings, Stack};
use super::{DEFAULT_CPU_TYPE, DEFAULT_IP_DISCOVERY_TIMEOUT, DEFAULT_NETWORK_BRIDGE, Problem};
use crate::did_you_mean;
use crate::proxmox::property::{BridgeName, CpuType, DiskOptions, Hugepages, NodeName};

/// Merges the layers and checks the result; a problem is reported under the path of the layer its
/// value came from.
pub(super) fn resolve(stack: &Stack<'_>, strict: bool) -> Result<ProviderData, Vec<Problem>> {
    let settings = stack.settings();
    let mut report = Report::default();
    for (prefix, finding) in stack.findings(Phase::Schema) {
        report.add(prefix, finding, strict);
    }
    for finding in required(stack) {
        report.add("", &finding, strict);
    }
    for (prefix, finding) in stack.findings(Phase::Read) {
        report.add(prefix, finding, strict);
    }
    for finding in rules(&settings) {
        report.add(stack.prefix_of(&finding.path), &finding, strict);
    }
    match provider_data(settings) {
        Some(mut data) if report.problems.is_empty() => {
            data.warnings = report.warnings;
            Ok(data)
        }
        // A mistyped key is often why the rest fails (its value was ignored): the keys ignored, each
        // with its "did you mean", are shown after what failed, unless a problem names them already.
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

/// The required keys no layer writes.
fn required(stack: &Stack<'_>) -> Vec<Finding> {
    let unknown = stack.unknown_keys();
    let mut findings = Findings::new(Phase::Required);
    for key in keys::at(Place::Top).filter(|k| k.required && !stack.writes(k.name)) {
        // A misspelling of it is only a warning, so point at it here where it matters.
        let near_miss = unknown
            .iter()
            .find(|k| did_you_mean::suggest(k, &[key.name]).is_some())
            .map(|k| format!(" (`{k}` is set: did you mean `{}`?)", key.name))
            .unwrap_or_default();
        findings.push(
            key.name,
            format!(
                "is required: set it in the machine class (or under `defaults:` in the provider config){}{near_miss}",
                key.example
            ),
        );
    }
    findings.list
}

/// The rules between keys, on the merged settings.
fn rules(s: &Settings) -> Vec<Finding> {
    let mut f = Findings::new(Phase::Rules);
    let boot = s.boot.unwrap_or_default();
    if boot == BootMode::Clone && s.template.is_none() {
        f.push("template", "is required with `boot: clone`: give the template's VMID or name, e.g. `template: 9000`".into());
    }
    if boot != BootMode::Clone && s.template.is_some() {
        f.push(
            "template",
            "is only used with `boot: clone`; add `boot: clone` or remove `template`".into(),
        );
    }
    if boot == BootMode::Iso && s.clone_mode.is_some() {
        f.push(
            "clone_mode",
            "is only used with `boot: clone`; add `boot: clone` and `template`, or remove `clone_mode`"
                .into(),
        );
    }
    let allowed = s.allowed_nodes.as_deref().unwrap_or_default();
    if let Some(node) = &s.node
        && !allowed.is_empty()
        && !allowed.contains(node)
    {
        f.push(
            "node",
            format!(
                "{node:?} is not in allowed_nodes ({}); add it there or pick another node",
                join_names(allowed)
            ),
        );
    }
    if s.hugepages.is_some() && s.balloon == Some(true) {
        f.push(
            "balloon",
            "cannot be true together with hugepages; set `balloon: false` or remove hugepages"
                .into(),
        );
    }
    if let Some(pages) = s.hugepages {
        for (key, message) in hugepages_problems(pages, s.numa, s.memory, s.sockets.unwrap_or(1)) {
            f.push(key, message);
        }
    }
    let pcie = s.pci_devices.iter().flatten().any(|p| p.pcie);
    if pcie && s.machine_type != Some(MachineType::Q35) {
        f.push(
            "machine_type",
            "must be q35 when a PCI device uses `pcie: true`".into(),
        );
    }
    f.list
}

/// The merged settings with every default filled in; `None` when a required value is missing or
/// wrong (its problem is reported).
fn provider_data(s: Settings) -> Option<ProviderData> {
    Some(ProviderData {
        cores: s.cores?,
        sockets: s.sockets.unwrap_or(1),
        memory_mb: s.memory?,
        disk_size_gb: s.disk_size?,
        storage_selector: s.storage_selector?,
        node: s.node,
        placement_strategy: s.placement_strategy.unwrap_or_default(),
        network_bridge: s
            .network_bridge
            .or_else(|| BridgeName::new(DEFAULT_NETWORK_BRIDGE).ok())?,
        vlan: s.vlan.unwrap_or(None),
        network_firewall: s.network_firewall.unwrap_or(true),
        disk: DiskOptions {
            ssd: s.disk_ssd.unwrap_or(false),
            discard: s.disk_discard.unwrap_or(false),
            iothread: s.disk_iothread.unwrap_or(false),
            cache: s.disk_cache,
            aio: s.disk_aio,
        },
        cpu_type: s.cpu_type.or_else(|| CpuType::new(DEFAULT_CPU_TYPE).ok())?,
        machine_type: s.machine_type,
        bios: s.bios.unwrap_or_default(),
        vga: s.vga,
        numa: s.numa.unwrap_or(false),
        hugepages: s.hugepages,
        balloon: s.balloon,
        pool: s.pool,
        tags: s.tags.unwrap_or_default(),
        topology_labels: s.topology_labels.unwrap_or(true),
        ha: s.ha,
        additional_nics: s.additional_nics.unwrap_or_default(),
        usb_devices: s.usb_devices.unwrap_or_default(),
        pci_devices: s.pci_devices.unwrap_or_default(),
        additional_disks: s.additional_disks.unwrap_or_default(),
        boot: s.boot.unwrap_or_default(),
        template: s.template,
        clone_mode: s.clone_mode.unwrap_or_default(),
        allowed_nodes: s.allowed_nodes.unwrap_or_default(),
        iso_storage_selector: s.iso_storage_selector,
        ip_discovery_timeout: s
            .ip_discovery_timeout
            .unwrap_or(DEFAULT_IP_DISCOVERY_TIMEOUT),
        ip_pool: s.ip_pool,
        warnings: Vec::new(),
    })
}

/// Proxmox accepts `hugepages` in any VM config but refuses to start the VM unless NUMA is on, and
/// backs each NUMA node (one per socket, the memory split evenly) with whole pages; a class that
/// breaks either rule would create a VM that never starts.
pub(super) fn hugepages_problems(
    pages: Hugepages,
    numa: Option<bool>,
    memory_mb: Option<u64>,
    sockets: u32,
) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    if numa != Some(true) {
        problems.push((
            "numa",
            "must be true with hugepages: Proxmox refuses to start a VM that has hugepages without NUMA; set `numa: true` or remove hugepages".to_string(),
        ));
    }
    let (page_mb, page_name) = match pages {
        Hugepages::TwoMb => (2, "2MB"),
        Hugepages::OneGb => (1024, "1GB"),
        // Proxmox picks 1GB pages when they divide the memory, else 2MB: even is the least it needs.
        Hugepages::Any => (2, "2MB (the smallest `any` may choose)"),
    };
    let sockets = u64::from(sockets.max(1));
    if let Some(memory) = memory_mb {
        let per_node = memory / sockets;
        if memory % sockets != 0 || per_node % page_mb != 0 {
            let step = page_mb * sockets;
            let suggestion = (memory / step).max(1) * step;
            problems.push((
                "memory",
                format!(
                    "{memory} MB split over {sockets} NUMA node(s) (one per socket) is not a whole number of {page_name} hugepages per node; use a multiple of {step} MB, e.g. `memory: {suggestion}`"
                ),
            ));
        }
    }
    problems
}

fn join_names(names: &[NodeName]) -> String {
    names
        .iter()
        .map(NodeName::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

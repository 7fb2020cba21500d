//! The provider data that takes effect for one request: the layers merged, the required keys checked,
//! the rules between keys applied, and every default filled in.

use std::time::Duration;

use super::data::{AdditionalDisk, AdditionalNic, HaSettings, ProviderData};
use super::keys::{DiskKeys, HaKeys, Keys, NicKeys, PciKeys, UsbKeys};
use super::layers::{Finding, Findings, Phase, Stack};
use super::schema::required_keys;
use super::values::{BootMode, MachineType, ResourceAffinity, UpTo};
use super::{
    DEFAULT_CPU_TYPE, DEFAULT_IP_DISCOVERY_TIMEOUT, DEFAULT_NETWORK_BRIDGE, LayerCheck, Problem,
};
use crate::did_you_mean;
use crate::proxmox::property::{
    BridgeName, CpuType, DiskOptions, HostPci, Hugepages, NodeName, Usb,
};

/// Merges the layers and checks the result; a problem is reported under the path of the layer its
/// value came from.
pub(super) fn resolve(stack: &Stack<'_>, strict: bool) -> Result<ProviderData, Vec<Problem>> {
    let keys = stack.keys();
    let mut report = LayerCheck::default();
    for (prefix, finding) in stack.findings(Phase::Schema) {
        report.add(prefix, finding, strict);
    }
    for finding in required(stack) {
        report.add("", &finding, strict);
    }
    for (prefix, finding) in stack.findings(Phase::Read) {
        report.add(prefix, finding, strict);
    }
    for finding in rules(&keys) {
        report.add(stack.prefix_of(&finding.path), &finding, strict);
    }
    match provider_data(keys) {
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
    for (key, example) in required_keys().filter(|(k, _)| !stack.writes(k)) {
        // A misspelling of it is only a warning, so point at it here where it matters.
        let near_miss = unknown
            .iter()
            .find(|k| did_you_mean::suggest(k, &[key]).is_some())
            .map(|k| format!(" (`{k}` is set: did you mean `{key}`?)"))
            .unwrap_or_default();
        findings.push(
            key,
            format!(
                "is required: set it in the machine class (or under `defaults:` in the provider config){example}{near_miss}"
            ),
        );
    }
    findings.list
}

/// The rules between keys, on the merged keys.
fn rules(k: &Keys) -> Vec<Finding> {
    let mut f = Findings::new(Phase::Rules);
    let boot = k.boot.unwrap_or_default();
    if boot == BootMode::Clone && k.template.is_none() {
        f.push("template", "is required with `boot: clone`: give the template's VMID or name, e.g. `template: 9000`".into());
    }
    if boot != BootMode::Clone && k.template.is_some() {
        f.push(
            "template",
            "is only used with `boot: clone`; add `boot: clone` or remove `template`".into(),
        );
    }
    if boot == BootMode::Iso && k.clone_mode.is_some() {
        f.push(
            "clone_mode",
            "is only used with `boot: clone`; add `boot: clone` and `template`, or remove `clone_mode`"
                .into(),
        );
    }
    let allowed = k.allowed_nodes.clone().unwrap_or_default();
    if let Some(node) = &k.node
        && !allowed.is_empty()
        && !allowed.contains(node)
    {
        f.push(
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
        f.push(
            "balloon",
            "cannot be true together with hugepages; set `balloon: false` or remove hugepages"
                .into(),
        );
    }
    if let Some(pages) = k.hugepages {
        let sockets = k.sockets.map_or(1, UpTo::small);
        for (key, message) in hugepages_problems(pages, k.numa, k.memory.map(|m| m.0), sockets) {
            f.push(key, message);
        }
    }
    let pcie = k.pci_devices.iter().flatten().any(|p| p.pcie == Some(true));
    if pcie && k.machine_type != Some(MachineType::Q35) {
        f.push(
            "machine_type",
            "must be q35 when a PCI device uses `pcie: true`".into(),
        );
    }
    f.list
}

/// The merged keys with every default filled in; `None` when a required value is missing or wrong
/// (its problem is reported).
fn provider_data(k: Keys) -> Option<ProviderData> {
    let keys = k.clone();
    let network_bridge = match k.network_bridge {
        Some(bridge) => bridge,
        None => BridgeName::new(DEFAULT_NETWORK_BRIDGE).ok()?,
    };
    let cpu_type = match k.cpu_type {
        Some(cpu) => cpu,
        None => CpuType::new(DEFAULT_CPU_TYPE).ok()?,
    };
    Some(ProviderData {
        cores: k.cores?.small(),
        sockets: k.sockets.map_or(1, UpTo::small),
        memory_mb: k.memory?.0,
        disk_size_gb: k.disk_size?.0,
        storage_selector: k.storage_selector?,
        node: k.node,
        placement_strategy: k.placement_strategy.unwrap_or_default(),
        network_bridge,
        vlan: k.vlan.and_then(|v| v.0),
        network_firewall: k.network_firewall.unwrap_or(true),
        disk: DiskOptions {
            ssd: k.disk_ssd.unwrap_or(false),
            discard: k.disk_discard.unwrap_or(false),
            iothread: k.disk_iothread.unwrap_or(false),
            cache: k.disk_cache,
            aio: k.disk_aio,
        },
        cpu_type,
        machine_type: k.machine_type,
        bios: k.bios.unwrap_or_default(),
        vga: k.vga,
        numa: k.numa.unwrap_or(false),
        hugepages: k.hugepages,
        balloon: k.balloon,
        pool: k.pool,
        tags: k.tags.into_iter().flatten().map(|t| t.0).collect(),
        topology_labels: k.topology_labels.unwrap_or(true),
        ha: k.ha.map(ha),
        additional_nics: k
            .additional_nics
            .into_iter()
            .flatten()
            .filter_map(nic)
            .collect(),
        usb_devices: k
            .usb_devices
            .into_iter()
            .flatten()
            .filter_map(usb)
            .collect(),
        pci_devices: k
            .pci_devices
            .into_iter()
            .flatten()
            .filter_map(pci)
            .collect(),
        additional_disks: k
            .additional_disks
            .into_iter()
            .flatten()
            .filter_map(disk)
            .collect(),
        boot: k.boot.unwrap_or_default(),
        template: k.template,
        clone_mode: k.clone_mode.unwrap_or_default(),
        allowed_nodes: k.allowed_nodes.unwrap_or_default(),
        iso_storage_selector: k.iso_storage_selector,
        ip_discovery_timeout: k
            .ip_discovery_timeout
            .map_or(DEFAULT_IP_DISCOVERY_TIMEOUT, |t| Duration::from_secs(t.0)),
        ip_pool: k.ip_pool.map(|p| p.0),
        keys,
        warnings: Vec::new(),
    })
}

/// `spread: true` is the short way to ask for `resource_affinity: negative`.
fn ha(h: HaKeys) -> HaSettings {
    HaSettings {
        state: h.state.map(|s| s.as_str().to_string()),
        comment: h.comment,
        max_restart: h.max_restart.map(UpTo::small),
        max_relocate: h.max_relocate.map(UpTo::small),
        failback: h.failback,
        rules: h.rules.unwrap_or_default(),
        node_affinity_nodes: h.node_affinity_nodes.unwrap_or_default(),
        node_affinity_strict: h.node_affinity_strict.unwrap_or(false),
        resource_affinity: match h.spread {
            Some(true) => Some(ResourceAffinity::Negative),
            _ => h.resource_affinity,
        },
    }
}

fn nic(n: NicKeys) -> Option<AdditionalNic> {
    Some(AdditionalNic {
        bridge: n.bridge?,
        vlan: n.vlan.and_then(|v| v.0),
        firewall: n.firewall.unwrap_or(false),
        ip_pool: n.ip_pool.map(|p| p.0),
    })
}

fn usb(u: UsbKeys) -> Option<Usb> {
    Some(Usb {
        mapping: u.mapping?,
        usb3: u.usb3.unwrap_or(false),
    })
}

fn pci(p: PciKeys) -> Option<HostPci> {
    Some(HostPci {
        mapping: p.mapping?,
        mdev: p.mdev,
        pcie: p.pcie.unwrap_or(false),
        // Upstream only ever writes rombar=1 when true; unset or false leaves Proxmox's default.
        rombar: p.rombar.filter(|on| *on),
        primary_gpu: p.primary_gpu.unwrap_or(false),
    })
}

fn disk(d: DiskKeys) -> Option<AdditionalDisk> {
    Some(AdditionalDisk {
        size_gb: d.disk_size?.0,
        storage_selector: d.storage_selector?,
        options: DiskOptions {
            ssd: d.disk_ssd.unwrap_or(false),
            discard: d.disk_discard.unwrap_or(false),
            iothread: d.disk_iothread.unwrap_or(false),
            cache: d.disk_cache,
            aio: d.disk_aio,
        },
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

//! Reading one layer's keys into typed [`Settings`]: every value checked on its own (selectors
//! compile, names are what Proxmox accepts), each problem with its key path. Rules between keys wait
//! until the layers are merged (`effective.rs`). Names that end up in property strings are stored as
//! the validated newtypes of [`crate::proxmox::property`], so rendering them later cannot fail or
//! inject keys.

use std::time::Duration;

use serde_json::{Map, Value};

use super::data::{
    AdditionalDisk, AdditionalNic, Bios, BootMode, CloneMode, HaSettings, MachineType,
    PlacementStrategy, ResourceAffinity, TemplateRef,
};
use super::keys::{self, Place};
use super::layers::{Findings, Settings};
use super::{RESERVED_TAG_PREFIXES, json_kind};
use crate::proxmox::property::{
    BridgeName, CpuType, DiskAio, DiskCache, DiskOptions, HostPci, Hugepages, MappingId, MdevType,
    NodeName, PoolId, PropertyError, Tag, Usb, Vga, VlanTag,
};
use crate::rules::storage_selector::StorageSelector;

/// Reads every key of one layer.
pub(super) fn settings(map: &Map<String, Value>, findings: &mut Findings) -> Settings {
    let mut f = Fields::new(map, String::new(), findings, Place::Top);
    let mut s = Settings::default();
    machine(&mut f, &mut s);
    network_and_disk(&mut f, &mut s);
    s.tags = f.get("tags").map(|_| tags(&mut f));
    s.ha = f.get("ha").and_then(|v| ha(&mut f, v));
    s.additional_nics = f.get("additional_nics").map(|_| additional_nics(&mut f));
    s.usb_devices = f.get("usb_devices").map(|_| usb_devices(&mut f));
    s.pci_devices = f.get("pci_devices").map(|_| pci_devices(&mut f));
    s.additional_disks = f.get("additional_disks").map(|_| additional_disks(&mut f));
    s.boot = f.choice(
        "boot",
        &[
            ("iso", BootMode::Iso),
            ("clone", BootMode::Clone),
            ("image", BootMode::Image),
        ],
    );
    s.template = template(&mut f);
    s.clone_mode = f.choice(
        "clone_mode",
        &[("full", CloneMode::Full), ("linked", CloneMode::Linked)],
    );
    s.allowed_nodes = f
        .get("allowed_nodes")
        .map(|_| f.named_list("allowed_nodes", NodeName::parse));
    s.iso_storage_selector = f.selector("iso_storage_selector");
    s.ip_discovery_timeout = f
        .uint("ip_discovery_timeout", 7 * 24 * 3600)
        .map(Duration::from_secs);
    s.ip_pool = f.pool_name("ip_pool");
    s
}

/// CPU, memory, placement and firmware.
fn machine(f: &mut Fields<'_, '_>, s: &mut Settings) {
    s.cores = f
        .uint("cores", u64::from(u16::MAX))
        .and_then(|n| u32::try_from(n).ok());
    s.sockets = f.uint("sockets", 64).and_then(|n| u32::try_from(n).ok());
    s.memory = f.uint("memory", 64 * 1024 * 1024);
    s.disk_size = f.uint("disk_size", 1024 * 1024);
    s.storage_selector = f.selector("storage_selector");
    s.node = f.named("node", NodeName::parse);
    s.placement_strategy = f.choice(
        "placement_strategy",
        &[
            ("spread", PlacementStrategy::Spread),
            ("fewer-vms", PlacementStrategy::FewerVms),
            ("round-robin", PlacementStrategy::RoundRobin),
            ("binpack", PlacementStrategy::Binpack),
        ],
    );
}

/// The first NIC, the boot disk's options, and the rest of the VM's hardware.
fn network_and_disk(f: &mut Fields<'_, '_>, s: &mut Settings) {
    s.network_bridge = f.named("network_bridge", BridgeName::parse);
    s.vlan = f.vlan("vlan");
    s.network_firewall = f.bool("network_firewall");
    s.disk_ssd = f.bool("disk_ssd");
    s.disk_discard = f.bool("disk_discard");
    s.disk_iothread = f.bool("disk_iothread");
    s.disk_cache = f.choice("disk_cache", DISK_CACHE);
    s.disk_aio = f.choice("disk_aio", DISK_AIO);
    s.cpu_type = f.named("cpu_type", CpuType::parse);
    s.machine_type = f.choice(
        "machine_type",
        &[("q35", MachineType::Q35), ("i440fx", MachineType::I440fx)],
    );
    s.bios = f.choice("bios", &[("seabios", Bios::Seabios), ("ovmf", Bios::Ovmf)]);
    s.vga = f.named("vga", Vga::new);
    s.numa = f.bool("numa");
    s.topology_labels = f.bool("topology_labels");
    s.hugepages = f.choice(
        "hugepages",
        &[("2MB", Hugepages::TwoMb), ("1GB", Hugepages::OneGb)],
    );
    s.balloon = f.bool("balloon");
    s.pool = f.named("pool", PoolId::parse);
}

const DISK_CACHE: &[(&str, DiskCache)] = &[
    ("none", DiskCache::None),
    ("writethrough", DiskCache::Writethrough),
    ("writeback", DiskCache::Writeback),
    ("directsync", DiskCache::Directsync),
    ("unsafe", DiskCache::Unsafe),
];
const DISK_AIO: &[(&str, DiskAio)] = &[
    ("native", DiskAio::Native),
    ("threads", DiskAio::Threads),
    ("io_uring", DiskAio::IoUring),
];

fn tags(f: &mut Fields<'_, '_>) -> Vec<Tag> {
    let tags = f.named_list("tags", Tag::parse);
    for (i, tag) in f.list("tags").iter().enumerate() {
        let lowered = tag.as_str().unwrap_or_default().to_ascii_lowercase();
        if let Some(prefix) = RESERVED_TAG_PREFIXES
            .iter()
            .find(|p| lowered.starts_with(**p))
        {
            f.problem(
                &format!("tags[{i}]"),
                format!("tags starting with `{prefix}` are set by the provider itself; choose another tag"),
            );
        }
    }
    tags
}

/// `ha:`. `spread: true` is the short way to ask for `resource_affinity: negative`, so the two are
/// folded into one setting and a contradiction between them is refused.
fn ha(f: &mut Fields<'_, '_>, value: &Value) -> Option<HaSettings> {
    let Value::Object(map) = value else {
        f.problem("ha", format!("must be a mapping, not {}", json_kind(value)));
        return None;
    };
    let path = f.key("ha");
    let mut h = Fields::new(map, path, f.problems, Place::Ha);
    let state = h
        .choice(
            "state",
            &[
                ("started", "started"),
                ("stopped", "stopped"),
                ("disabled", "disabled"),
                ("ignored", "ignored"),
            ],
        )
        .map(str::to_string);
    let comment = h.string("comment").map(str::to_string);
    let max_restart = h
        .uint("max_restart", u64::from(u32::MAX))
        .and_then(|n| u32::try_from(n).ok());
    let max_relocate = h
        .uint("max_relocate", u64::from(u32::MAX))
        .and_then(|n| u32::try_from(n).ok());
    let failback = h.bool("failback");
    let rules = h.named_list("rules", ha_rule);
    let node_affinity_nodes = h.named_list("node_affinity_nodes", NodeName::parse);
    let node_affinity_strict = h.bool("node_affinity_strict").unwrap_or(false);
    let mut resource_affinity = h.choice(
        "resource_affinity",
        &[
            ("negative", ResourceAffinity::Negative),
            ("positive", ResourceAffinity::Positive),
        ],
    );
    if h.bool("spread") == Some(true) {
        if resource_affinity == Some(ResourceAffinity::Positive) {
            h.problem(
                "spread",
                "keeps the set's VMs on different nodes, but `resource_affinity: positive` keeps them together: remove one of the two".to_string(),
            );
        }
        resource_affinity = Some(ResourceAffinity::Negative);
    }
    Some(HaSettings {
        state,
        comment,
        max_restart,
        max_relocate,
        failback,
        rules,
        node_affinity_nodes,
        node_affinity_strict,
        resource_affinity,
    })
}

fn ha_rule(s: &str) -> Result<String, PropertyError> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
    if ok {
        Ok(s.to_string())
    } else {
        Err(PropertyError {
            what: "HA rule",
            value: s.to_string(),
            expected: "a letter or digit, then letters, digits, '-' or '_'",
        })
    }
}

fn additional_nics(f: &mut Fields<'_, '_>) -> Vec<AdditionalNic> {
    let mut nics = Vec::new();
    for (path, nic_map) in f.objects("additional_nics") {
        let mut n = Fields::new(nic_map, path, f.problems, Place::AdditionalNics);
        let bridge = n.named("bridge", BridgeName::parse);
        let vlan = n.vlan("vlan").unwrap_or(None);
        let firewall = n.bool("firewall").unwrap_or(false);
        let ip_pool = n.pool_name("ip_pool");
        if bridge.is_none() && n.get("bridge").is_none() {
            n.problem(
                "bridge",
                "is required: the bridge for this NIC, e.g. `bridge: vmbr1`".into(),
            );
        }
        if let Some(bridge) = bridge {
            nics.push(AdditionalNic {
                bridge,
                vlan,
                firewall,
                ip_pool,
            });
        }
    }
    if nics.len() > 31 {
        f.problem(
            "additional_nics",
            "at most 31 additional NICs fit (net1 to net31)".into(),
        );
    }
    nics
}

fn usb_devices(f: &mut Fields<'_, '_>) -> Vec<Usb> {
    let mut devices = Vec::new();
    for (path, usb_map) in f.objects("usb_devices") {
        let mut u = Fields::new(usb_map, path, f.problems, Place::UsbDevices);
        let mapping = u.named("mapping", MappingId::parse);
        if u.get("mapping").is_none() {
            u.problem("mapping", "is required: the USB resource mapping ID".into());
        }
        let usb3 = u.bool("usb3").unwrap_or(false);
        if let Some(mapping) = mapping {
            devices.push(Usb { mapping, usb3 });
        }
    }
    devices
}

fn pci_devices(f: &mut Fields<'_, '_>) -> Vec<HostPci> {
    let mut devices = Vec::new();
    for (path, pci_map) in f.objects("pci_devices") {
        let mut p = Fields::new(pci_map, path, f.problems, Place::PciDevices);
        let mapping = p.named("mapping", MappingId::parse);
        if p.get("mapping").is_none() {
            p.problem(
                "mapping",
                "is required: the PCI resource mapping ID, e.g. `mapping: nvidia-gpu-1`".into(),
            );
        }
        let mdev = p.named("mdev", MdevType::parse);
        let pcie = p.bool("pcie").unwrap_or(false);
        let primary_gpu = p.bool("primary_gpu").unwrap_or(false);
        // Upstream only ever writes rombar=1 when true; unset or false leaves Proxmox's default.
        let rombar = p.bool("rombar").filter(|on| *on);
        if let Some(mapping) = mapping {
            devices.push(HostPci {
                mapping,
                mdev,
                pcie,
                rombar,
                primary_gpu,
            });
        }
    }
    devices
}

fn additional_disks(f: &mut Fields<'_, '_>) -> Vec<AdditionalDisk> {
    let mut disks = Vec::new();
    for (path, disk_map) in f.objects("additional_disks") {
        let mut d = Fields::new(disk_map, path, f.problems, Place::AdditionalDisks);
        let size = d.uint("disk_size", 1024 * 1024);
        if size == Some(0) {
            d.problem("disk_size", "must be at least 1 (GB)".into());
        }
        let selector = d.selector("storage_selector");
        for key in keys::at(Place::AdditionalDisks).filter(|k| k.required) {
            if d.get(key.name).is_none() {
                d.problem(
                    key.name,
                    format!("is required for every additional disk{}", key.example),
                );
            }
        }
        let options = DiskOptions {
            ssd: d.bool("disk_ssd").unwrap_or(false),
            discard: d.bool("disk_discard").unwrap_or(false),
            iothread: d.bool("disk_iothread").unwrap_or(false),
            cache: d.choice("disk_cache", DISK_CACHE),
            aio: d.choice("disk_aio", DISK_AIO),
        };
        if let (Some(size_gb), Some(storage_selector)) = (size.filter(|s| *s > 0), selector) {
            disks.push(AdditionalDisk {
                size_gb,
                storage_selector,
                options,
            });
        }
    }
    disks
}

/// `template`: a VMID (number or numeric string) or a name.
fn template(f: &mut Fields<'_, '_>) -> Option<TemplateRef> {
    match f.get("template")? {
        Value::Number(n) => {
            match n
                .as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .filter(|id| (100..=999_999_999).contains(id))
            {
                Some(id) => Some(TemplateRef::VmId(id)),
                None => {
                    f.problem("template", format!("{n} is not a VMID (100 to 999999999); give the template's VMID or its name"));
                    None
                }
            }
        }
        Value::String(s) if s.trim().is_empty() => {
            f.problem(
                "template",
                "is empty: give the template's VMID or its name".into(),
            );
            None
        }
        Value::String(s) => match s.trim().parse::<u32>() {
            Ok(id) if (100..=999_999_999).contains(&id) => Some(TemplateRef::VmId(id)),
            _ => Some(TemplateRef::Name(s.clone())),
        },
        other => {
            f.problem(
                "template",
                format!("must be a VMID or a name, not {}", json_kind(other)),
            );
            None
        }
    }
}

/// Reads typed fields from one object of the document, recording problems with full key paths.
struct Fields<'a, 'p> {
    map: &'a Map<String, Value>,
    path: String,
    problems: &'p mut Findings,
}

impl<'a, 'p> Fields<'a, 'p> {
    pub fn new(
        map: &'a Map<String, Value>,
        path: String,
        problems: &'p mut Findings,
        place: Place,
    ) -> Self {
        let known = keys::names(place);
        for key in map.keys().filter(|k| !known.contains(&k.as_str())) {
            // An empty key (`"": 1`) is shown quoted, or the problem would name no key at all.
            let shown = if key.is_empty() { "\"\"" } else { key.as_str() };
            let at = if path.is_empty() {
                shown.to_string()
            } else {
                format!("{path}.{shown}")
            };
            problems.unknown_key(&at, key, &known);
        }
        Self {
            map,
            path,
            problems,
        }
    }

    fn key(&self, key: &str) -> String {
        if self.path.is_empty() {
            format!("{}{key}", self.path)
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn problem(&mut self, key: &str, message: String) {
        let at = self.key(key);
        self.problems.push(&at, message);
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn uint(&mut self, key: &str, max: u64) -> Option<u64> {
        let v = self.get(key)?;
        match v.as_u64() {
            Some(n) if n <= max => Some(n),
            Some(n) => {
                self.problem(key, format!("{n} is too large (at most {max})"));
                None
            }
            None => {
                self.problem(key, format!("must be a whole number, not {}", json_kind(v)));
                None
            }
        }
    }

    fn bool(&mut self, key: &str) -> Option<bool> {
        let v = self.get(key)?;
        match v.as_bool() {
            Some(b) => Some(b),
            None => {
                self.problem(key, format!("must be true or false, not {}", json_kind(v)));
                None
            }
        }
    }

    fn string(&mut self, key: &str) -> Option<&'a str> {
        let v = self.get(key)?;
        match v.as_str() {
            Some(s) => Some(s),
            None => {
                self.problem(key, format!("must be a string, not {}", json_kind(v)));
                None
            }
        }
    }

    /// The name of an IP pool: which pools exist is the config's to say (checked when the class is
    /// used with it), only an empty name is wrong on its own.
    fn pool_name(&mut self, key: &str) -> Option<String> {
        let s = self.string(key)?;
        if s.trim().is_empty() {
            self.problem(
                key,
                "is empty: name a pool of the config file's `ipPools:`, or remove the key for DHCP"
                    .into(),
            );
            return None;
        }
        Some(s.to_owned())
    }

    fn choice<T: Copy>(&mut self, key: &str, options: &[(&str, T)]) -> Option<T> {
        let s = self.string(key)?;
        match options.iter().find(|(name, _)| *name == s) {
            Some((_, v)) => Some(*v),
            None => {
                let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
                let hint = crate::did_you_mean::hint(s, &names);
                self.problem(
                    key,
                    format!("{s:?} is not one of {}{hint}", names.join(", ")),
                );
                None
            }
        }
    }

    fn named<T>(
        &mut self,
        key: &str,
        make: impl Fn(&str) -> Result<T, PropertyError>,
    ) -> Option<T> {
        let s = self.string(key)?;
        match make(s) {
            Ok(v) => Some(v),
            Err(e) => {
                self.problem(key, e.to_string());
                None
            }
        }
    }

    fn selector(&mut self, key: &str) -> Option<StorageSelector> {
        let s = self.string(key)?;
        match StorageSelector::new(s) {
            Ok(sel) => Some(sel),
            Err(e) => {
                self.problem(key, e.to_string());
                None
            }
        }
    }

    fn vlan(&mut self, key: &str) -> Option<Option<VlanTag>> {
        let n = self.uint(key, u64::MAX)?;
        match VlanTag::optional(n) {
            Ok(v) => Some(v),
            Err(e) => {
                self.problem(key, e.to_string());
                None
            }
        }
    }

    fn list(&mut self, key: &str) -> &'a [Value] {
        match self.get(key) {
            None => &[],
            Some(Value::Array(items)) => items,
            Some(other) => {
                self.problem(key, format!("must be a list, not {}", json_kind(other)));
                &[]
            }
        }
    }

    /// Each item of a list of strings, checked by `make`.
    fn named_list<T>(
        &mut self,
        key: &str,
        make: impl Fn(&str) -> Result<T, PropertyError>,
    ) -> Vec<T> {
        let items = self.list(key);
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let at = format!("{}[{i}]", self.key(key));
            match item.as_str().map(&make) {
                Some(Ok(v)) => out.push(v),
                Some(Err(e)) => self.problems.push(&at, e.to_string()),
                None => self
                    .problems
                    .push(&at, format!("must be a string, not {}", json_kind(item))),
            }
        }
        out
    }

    /// Each object of a list of objects, with its own key path.
    fn objects(&mut self, key: &str) -> Vec<(String, &'a Map<String, Value>)> {
        let items = self.list(key);
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let at = format!("{}[{i}]", self.key(key));
            match item {
                Value::Object(map) => out.push((at, map)),
                other => self
                    .problems
                    .push(&at, format!("must be a mapping, not {}", json_kind(other))),
            }
        }
        out
    }
}

//! Provider data: the machine class's `provider_data` YAML, merged with the provider config's
//! `defaults:` and per-node `nodes:` overrides, validated and turned into a typed [`ProviderData`].
//!
//! The official provider ignores unknown keys and compiles the storage selector only when it creates
//! the VM, so mistakes surface late or never. Here every layer goes through the JSON schema (the same
//! one Omni shows for machine classes), then through semantic checks (selectors compile and yield a
//! bool, names are what Proxmox accepts, cross-field rules), and every problem is reported at once with
//! its key path and how to fix it. Unknown keys are the exception: a class that works with the
//! official provider must work here too, so they are warnings (with a "did you mean") carried in
//! [`ProviderData::warnings`], unless the config asks for `strict: true`. Names that end up in property strings are stored as the validated
//! newtypes of [`crate::proxmox::property`], so rendering them later cannot fail or inject keys.

use std::fmt;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::did_you_mean;
use crate::pipeline::storage_selector::StorageSelector;
use crate::proxmox::property::{
    BridgeName, CpuType, DiskAio, DiskCache, DiskOptions, HostPci, Hugepages, MappingId, MdevType,
    NodeName, PoolId, PropertyError, Tag, Usb, Vga, VlanTag,
};

/// The JSON schema registered with Omni (shown for machine classes) and used for validation.
pub const SCHEMA_JSON: &str = include_str!("../../schema/provider-data.schema.json");

/// Default bridge of the first NIC, as upstream.
pub const DEFAULT_NETWORK_BRIDGE: &str = "vmbr0";
/// Default CPU model, as upstream.
pub const DEFAULT_CPU_TYPE: &str = "x86-64-v2-AES";
/// Default time to wait for the guest agent to report an address.
pub const DEFAULT_IP_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(300);

/// Tag prefixes the provider sets itself; user tags may not use them (placement and ownership checks
/// count them).
pub const RESERVED_TAG_PREFIXES: &[&str] = &["machine-request.", "omni-provider.", "omni-request."];

/// One thing wrong with the provider data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Where: `memory`, `additional_disks[1].disk_size`, `nodes.pve2.network_bridge`.
    pub key: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Formats a list of problems as one message, one per line.
pub fn describe(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(Problem::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlacementStrategy {
    #[default]
    Spread,
    FewerVms,
    RoundRobin,
    Binpack,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineType {
    Q35,
    I440fx,
}

impl MachineType {
    pub fn as_str(self) -> &'static str {
        match self {
            MachineType::Q35 => "q35",
            MachineType::I440fx => "pc",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Bios {
    #[default]
    Seabios,
    Ovmf,
}

impl Bios {
    pub fn as_str(self) -> &'static str {
        match self {
            Bios::Seabios => "seabios",
            Bios::Ovmf => "ovmf",
        }
    }
}

/// How the VM gets Talos.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BootMode {
    /// Boot the Image Factory nocloud ISO (upstream behaviour).
    #[default]
    Iso,
    /// Clone a template.
    Clone,
}

/// The template to clone: by VMID or by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateRef {
    VmId(u32),
    Name(String),
}

impl fmt::Display for TemplateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateRef::VmId(id) => write!(f, "{id}"),
            TemplateRef::Name(name) => f.write_str(name),
        }
    }
}

/// `ha:` (Proxmox HA resource), kept as given; HA registration reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HaSettings {
    pub state: Option<String>,
    pub comment: Option<String>,
    pub max_restart: Option<u32>,
    pub max_relocate: Option<u32>,
    pub failback: Option<bool>,
    pub rules: Vec<String>,
    pub node_affinity_nodes: Vec<NodeName>,
    pub node_affinity_strict: bool,
    pub resource_affinity: Option<String>,
}

/// `additional_nics[]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdditionalNic {
    pub bridge: BridgeName,
    pub vlan: Option<VlanTag>,
    /// Default false (upstream: storage networks usually bypass the firewall).
    pub firewall: bool,
}

/// `additional_disks[]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdditionalDisk {
    pub size_gb: u64,
    pub storage_selector: StorageSelector,
    pub options: DiskOptions,
}

/// Validated provider data with every default filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderData {
    pub cores: u32,
    pub sockets: u32,
    pub memory_mb: u64,
    pub disk_size_gb: u64,
    pub storage_selector: StorageSelector,
    pub node: Option<NodeName>,
    pub placement_strategy: PlacementStrategy,
    pub network_bridge: BridgeName,
    pub vlan: Option<VlanTag>,
    pub network_firewall: bool,
    pub disk: DiskOptions,
    pub cpu_type: CpuType,
    pub machine_type: Option<MachineType>,
    pub bios: Bios,
    pub vga: Option<Vga>,
    pub numa: bool,
    pub hugepages: Option<Hugepages>,
    /// `Some(false)` turns the balloon device off; `None` leaves Proxmox's default.
    pub balloon: Option<bool>,
    pub pool: Option<PoolId>,
    pub tags: Vec<Tag>,
    pub ha: Option<HaSettings>,
    pub additional_nics: Vec<AdditionalNic>,
    pub usb_devices: Vec<Usb>,
    pub pci_devices: Vec<HostPci>,
    pub additional_disks: Vec<AdditionalDisk>,
    pub boot: BootMode,
    pub template: Option<TemplateRef>,
    pub allowed_nodes: Vec<NodeName>,
    pub iso_storage_selector: Option<StorageSelector>,
    /// Zero turns IP discovery off.
    pub ip_discovery_timeout: Duration,
    /// Keys that were ignored (unknown ones, each with a suggestion when one is close): not fatal, as
    /// with the official provider, but shown in the machine's status, the log and `validate`.
    pub warnings: Vec<Problem>,
}

impl ProviderData {
    /// Disk space the VM needs on its main storage: boot disk plus additional disks, in GB.
    pub fn total_disk_gb(&self) -> u64 {
        self.disk_size_gb.saturating_add(
            self.additional_disks
                .iter()
                .map(|d| d.size_gb)
                .fold(0, u64::saturating_add),
        )
    }
}

const TOP_KEYS: &[&str] = &[
    "cores",
    "sockets",
    "memory",
    "disk_size",
    "storage_selector",
    "node",
    "placement_strategy",
    "network_bridge",
    "vlan",
    "network_firewall",
    "disk_ssd",
    "disk_discard",
    "disk_iothread",
    "disk_cache",
    "disk_aio",
    "cpu_type",
    "machine_type",
    "bios",
    "vga",
    "numa",
    "hugepages",
    "balloon",
    "pool",
    "tags",
    "ha",
    "additional_nics",
    "usb_devices",
    "pci_devices",
    "additional_disks",
    "boot",
    "template",
    "allowed_nodes",
    "iso_storage_selector",
    "ip_discovery_timeout",
];
const HA_KEYS: &[&str] = &[
    "state",
    "comment",
    "max_restart",
    "max_relocate",
    "failback",
    "rules",
    "node_affinity_nodes",
    "node_affinity_strict",
    "resource_affinity",
];
const NIC_KEYS: &[&str] = &["bridge", "vlan", "firewall"];
const USB_KEYS: &[&str] = &["mapping", "usb3"];
const PCI_KEYS: &[&str] = &["mapping", "mdev", "pcie", "primary_gpu", "rombar"];
const DISK_KEYS: &[&str] = &[
    "disk_size",
    "storage_selector",
    "disk_ssd",
    "disk_discard",
    "disk_iothread",
    "disk_cache",
    "disk_aio",
];
/// Keys that must be present after merging all layers.
const REQUIRED: &[&str] = &["cores", "memory", "disk_size", "storage_selector"];
/// Keys that decide placement, so a per-node override (applied after placement) cannot set them.
const NOT_PER_NODE: &[&str] = &["node", "allowed_nodes", "placement_strategy"];

/// The embedded schema could not be compiled (a bug caught by the tests).
#[derive(Debug, thiserror::Error)]
#[error("the provider-data JSON schema is invalid: {0}")]
pub struct SchemaError(String);

/// The compiled schema; build once at start-up and share.
pub struct ProviderDataSchema {
    validator: jsonschema::Validator,
    /// `strict: true` in the config: unknown keys are problems instead of warnings.
    strict: bool,
}

/// What checking one layer (or the config's overrides) found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerCheck {
    /// The layer cannot be used as it is.
    pub problems: Vec<Problem>,
    /// Ignored, but worth telling the user (unknown keys).
    pub warnings: Vec<Problem>,
}

impl fmt::Debug for ProviderDataSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProviderDataSchema")
    }
}

/// Merges the layers by top-level key: the machine class wins over the node override, which wins over
/// the config `defaults`. Nested values (`ha`, lists) are replaced whole, never merged.
pub fn merge_layers(
    class: &Map<String, Value>,
    node_override: Option<&Map<String, Value>>,
    defaults: &Map<String, Value>,
) -> Map<String, Value> {
    let mut merged = defaults.clone();
    if let Some(over) = node_override {
        for (k, v) in over {
            merged.insert(k.clone(), v.clone());
        }
    }
    for (k, v) in class {
        merged.insert(k.clone(), v.clone());
    }
    merged
}

impl ProviderDataSchema {
    pub fn new() -> Result<Self, SchemaError> {
        let schema: Value =
            serde_json::from_str(SCHEMA_JSON).map_err(|e| SchemaError(e.to_string()))?;
        let validator =
            jsonschema::validator_for(&schema).map_err(|e| SchemaError(e.to_string()))?;
        Ok(Self {
            validator,
            strict: false,
        })
    }

    /// With `true` (the config's `strict: true`), unknown keys are refused instead of ignored with a
    /// warning.
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
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

    /// The whole pipeline for one request: the class YAML, merged over the chosen node's override
    /// (`(node name, override)`, once the node is known) and the config defaults, validated and typed.
    /// A problem with a value that came from a lower layer is reported under that layer's key path
    /// (`nodes.pve2.network_bridge`, `defaults.cores`).
    pub fn resolve(
        &self,
        class_yaml: &str,
        node_override: Option<(&str, &Map<String, Value>)>,
        defaults: &Map<String, Value>,
    ) -> Result<ProviderData, Vec<Problem>> {
        let class = Self::class_map(class_yaml)?;
        let merged = merge_layers(&class, node_override.map(|(_, m)| m), defaults);
        // A finding about a value that came from a lower layer is reported under that layer's path.
        let locate = |mut p: Problem| {
            let top = p
                .key
                .split(['.', '['])
                .next()
                .unwrap_or_default()
                .to_string();
            if !class.contains_key(&top) {
                match node_override {
                    Some((node, over)) if over.contains_key(&top) => {
                        p.key = format!("nodes.{node}.{}", p.key)
                    }
                    _ if defaults.contains_key(&top) => p.key = format!("defaults.{}", p.key),
                    _ => {}
                }
            }
            p
        };
        match self.parse_merged(&merged) {
            Ok(mut data) => {
                data.warnings = std::mem::take(&mut data.warnings)
                    .into_iter()
                    .map(locate)
                    .collect();
                Ok(data)
            }
            Err(problems) => Err(problems.into_iter().map(locate).collect()),
        }
    }

    /// Validates and types an already merged map: schema, unknown keys, semantics, required keys.
    pub fn parse_merged(&self, merged: &Map<String, Value>) -> Result<ProviderData, Vec<Problem>> {
        let value = Value::Object(merged.clone());
        let mut problems = Problems::new(self.strict);
        self.schema_problems("", &value, &mut problems);
        for key in REQUIRED {
            if !merged.contains_key(*key) {
                // A misspelling of it is only a warning, so point at it here where it matters.
                let near_miss = merged
                    .keys()
                    .filter(|k| !TOP_KEYS.contains(&k.as_str()))
                    .find(|k| did_you_mean::suggest(k, &[key]).is_some())
                    .map(|k| format!(" (`{k}` is set: did you mean `{key}`?)"))
                    .unwrap_or_default();
                problems.push(
                    key,
                    format!(
                        "is required: set it in the machine class (or under `defaults:` in the provider config){}{near_miss}",
                        required_example(key)
                    ),
                );
            }
        }
        let data = extract(merged, "", &mut problems, true);
        match data {
            Some(mut data) if problems.errors.is_empty() => {
                data.warnings = problems.warnings;
                Ok(data)
            }
            _ => Err(problems.errors),
        }
    }

    /// Checks one layer on its own (no required keys): the machine class, `defaults`, or a node
    /// override. `prefix` is put before every key path (e.g. `nodes.pve2.`).
    pub fn check_layer(&self, prefix: &str, layer: &Value) -> LayerCheck {
        let mut problems = Problems::new(self.strict);
        match layer {
            Value::Null => {}
            Value::Object(map) => {
                self.schema_problems(prefix, layer, &mut problems);
                extract(map, prefix, &mut problems, false);
            }
            other => problems.push(
                prefix.trim_end_matches('.'),
                format!(
                    "must be a mapping of provider-data keys, not {}",
                    json_kind(other)
                ),
            ),
        }
        LayerCheck {
            problems: problems.errors,
            warnings: problems.warnings,
        }
    }

    /// The problems of the provider config's `defaults:` and `nodes:`, checked at load time (see
    /// [`Self::check_config_overrides`] for the warnings too).
    pub fn validate_config_overrides(
        &self,
        defaults: &Map<String, Value>,
        nodes: &Map<String, Value>,
    ) -> Vec<Problem> {
        self.check_config_overrides(defaults, nodes).problems
    }

    /// Checks the provider config's `defaults:` and `nodes:`: problems and warnings.
    pub fn check_config_overrides(
        &self,
        defaults: &Map<String, Value>,
        nodes: &Map<String, Value>,
    ) -> LayerCheck {
        let mut found = self.check_layer("defaults.", &Value::Object(defaults.clone()));
        for (node, layer) in nodes {
            let prefix = format!("nodes.{node}.");
            if let Err(e) = NodeName::new(node.clone()) {
                found.problems.push(Problem {
                    key: format!("nodes.{node}"),
                    message: e.to_string(),
                });
            }
            let layer_found = self.check_layer(&prefix, layer);
            found.problems.extend(layer_found.problems);
            found.warnings.extend(layer_found.warnings);
            if let Value::Object(map) = layer {
                for key in NOT_PER_NODE.iter().filter(|k| map.contains_key(**k)) {
                    found.problems.push(Problem {
                        key: format!("{prefix}{key}"),
                        message: "cannot be set per node: it decides which node is chosen; set it under `defaults:` or in the machine class".into(),
                    });
                }
            }
        }
        found
    }

    fn schema_problems(&self, prefix: &str, value: &Value, problems: &mut Problems) {
        for error in self.validator.iter_errors(value) {
            let mut key = pointer_to_key(error.instance_path().as_str());
            let message = error.to_string();
            if let jsonschema::error::ValidationErrorKind::Required { property } = error.kind() {
                let property = property.as_str().unwrap_or_default();
                key = if key.is_empty() {
                    property.to_string()
                } else {
                    format!("{key}.{property}")
                };
                problems.push(&format!("{prefix}{key}"), "is required here".to_string());
                continue;
            }
            let key = if key.is_empty() {
                prefix.trim_end_matches('.').to_string()
            } else {
                format!("{prefix}{key}")
            };
            problems.push(&key, message);
        }
    }
}

fn required_example(key: &str) -> &'static str {
    match key {
        "cores" => ", e.g. `cores: 2`",
        "memory" => ", e.g. `memory: 4096` (MB)",
        "disk_size" => ", e.g. `disk_size: 20` (GB)",
        "storage_selector" => ", e.g. `storage_selector: name == \"local-lvm\"`",
        _ => "",
    }
}

/// `/additional_disks/1/disk_size` → `additional_disks[1].disk_size`.
fn pointer_to_key(pointer: &str) -> String {
    let mut key = String::new();
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if !segment.is_empty() && segment.chars().all(|c| c.is_ascii_digit()) {
            key.push_str(&format!("[{segment}]"));
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(&segment);
        }
    }
    key
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Problems, one per key path at most (the schema and the typed reading would otherwise both
/// complain about a mistyped value), and warnings.
struct Problems {
    errors: Vec<Problem>,
    warnings: Vec<Problem>,
    /// Unknown keys are errors rather than warnings.
    strict: bool,
}

impl Problems {
    fn new(strict: bool) -> Self {
        Self {
            errors: Vec::new(),
            warnings: Vec::new(),
            strict,
        }
    }

    fn push(&mut self, key: &str, message: String) {
        if !self.errors.iter().any(|p| p.key == key) {
            self.errors.push(Problem {
                key: key.to_string(),
                message,
            });
        }
    }

    /// A key the provider does not know: ignored with a warning, as the official provider ignores it
    /// silently, or refused in strict mode.
    fn unknown_key(&mut self, at: &str, key: &str, known: &[&str]) {
        let hint = did_you_mean::hint(key, known);
        if self.strict {
            self.push(
                at,
                format!("is not a known key{hint} (refused because the provider config has `strict: true`)"),
            );
        } else {
            self.warnings.push(Problem {
                key: at.to_string(),
                message: format!("is not a known key and is ignored{hint}"),
            });
        }
    }
}

/// Reads typed fields from one object of the document, recording problems with full key paths.
struct Fields<'a, 'p> {
    map: &'a Map<String, Value>,
    path: String,
    problems: &'p mut Problems,
}

impl<'a, 'p> Fields<'a, 'p> {
    fn new(
        map: &'a Map<String, Value>,
        path: String,
        problems: &'p mut Problems,
        known: &[&str],
    ) -> Self {
        for key in map.keys().filter(|k| !known.contains(&k.as_str())) {
            let at = if path.is_empty() || path.ends_with('.') {
                format!("{path}{key}")
            } else {
                format!("{path}.{key}")
            };
            problems.unknown_key(&at, key, known);
        }
        Self {
            map,
            path,
            problems,
        }
    }

    fn key(&self, key: &str) -> String {
        if self.path.is_empty() || self.path.ends_with('.') {
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

    fn choice<T: Copy>(&mut self, key: &str, options: &[(&str, T)]) -> Option<T> {
        let s = self.string(key)?;
        match options.iter().find(|(name, _)| *name == s) {
            Some((_, v)) => Some(*v),
            None => {
                let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
                self.problem(key, format!("{s:?} is not one of {}", names.join(", ")));
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

fn disk_options(f: &mut Fields<'_, '_>) -> DiskOptions {
    const CACHE: &[(&str, DiskCache)] = &[
        ("none", DiskCache::None),
        ("writethrough", DiskCache::Writethrough),
        ("writeback", DiskCache::Writeback),
        ("directsync", DiskCache::Directsync),
        ("unsafe", DiskCache::Unsafe),
    ];
    const AIO: &[(&str, DiskAio)] = &[
        ("native", DiskAio::Native),
        ("threads", DiskAio::Threads),
        ("io_uring", DiskAio::IoUring),
    ];
    DiskOptions {
        ssd: f.bool("disk_ssd").unwrap_or(false),
        discard: f.bool("disk_discard").unwrap_or(false),
        iothread: f.bool("disk_iothread").unwrap_or(false),
        cache: f.choice("disk_cache", CACHE),
        aio: f.choice("disk_aio", AIO),
    }
}

/// Reads every key of one layer (or of the merged document when `complete`), returning the typed data
/// only when complete and nothing was wrong.
fn extract(
    map: &Map<String, Value>,
    prefix: &str,
    problems: &mut Problems,
    complete: bool,
) -> Option<ProviderData> {
    let mut f = Fields::new(map, prefix.to_string(), problems, TOP_KEYS);

    let cores = f
        .uint("cores", u64::from(u16::MAX))
        .and_then(|n| u32::try_from(n).ok());
    let sockets = f.uint("sockets", 64).and_then(|n| u32::try_from(n).ok());
    let memory_mb = f.uint("memory", 64 * 1024 * 1024);
    let disk_size_gb = f.uint("disk_size", 1024 * 1024);
    let storage_selector = f.selector("storage_selector");
    let node = f.named("node", NodeName::parse);
    let placement_strategy = f.choice(
        "placement_strategy",
        &[
            ("spread", PlacementStrategy::Spread),
            ("fewer-vms", PlacementStrategy::FewerVms),
            ("round-robin", PlacementStrategy::RoundRobin),
            ("binpack", PlacementStrategy::Binpack),
        ],
    );
    let network_bridge = f.named("network_bridge", BridgeName::parse);
    let vlan = f.vlan("vlan");
    let network_firewall = f.bool("network_firewall");
    let disk = disk_options(&mut f);
    let cpu_type = f.named("cpu_type", CpuType::parse);
    let machine_type = f.choice(
        "machine_type",
        &[("q35", MachineType::Q35), ("i440fx", MachineType::I440fx)],
    );
    let bios = f.choice("bios", &[("seabios", Bios::Seabios), ("ovmf", Bios::Ovmf)]);
    let vga = f.named("vga", Vga::new);
    let numa = f.bool("numa");
    let hugepages = f.choice(
        "hugepages",
        &[("2MB", Hugepages::TwoMb), ("1GB", Hugepages::OneGb)],
    );
    let balloon = f.bool("balloon");
    let pool = f.named("pool", PoolId::parse);
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

    let ha = f.get("ha").and_then(|v| match v {
        Value::Object(ha_map) => {
            let path = f.key("ha");
            let mut h = Fields::new(ha_map, path, f.problems, HA_KEYS);
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
            let rules = h.named_list("rules", |s| {
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
            });
            let node_affinity_nodes = h.named_list("node_affinity_nodes", NodeName::parse);
            let node_affinity_strict = h.bool("node_affinity_strict").unwrap_or(false);
            let resource_affinity = h
                .choice(
                    "resource_affinity",
                    &[("negative", "negative"), ("positive", "positive")],
                )
                .map(str::to_string);
            // Registering the HA resource is supported; managing HA rules is not yet. Refusing them
            // beats accepting them and silently doing nothing.
            let unsupported = "is not supported by this provider yet: create or edit the HA rule in Proxmox (Datacenter > HA > Rules) and remove this key";
            if !rules.is_empty() {
                h.problem("rules", unsupported.to_string());
            }
            if !node_affinity_nodes.is_empty() {
                h.problem("node_affinity_nodes", unsupported.to_string());
            }
            if resource_affinity.is_some() {
                h.problem("resource_affinity", unsupported.to_string());
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
        other => {
            f.problem("ha", format!("must be a mapping, not {}", json_kind(other)));
            None
        }
    });

    let mut additional_nics = Vec::new();
    for (path, nic_map) in f.objects("additional_nics") {
        let mut n = Fields::new(nic_map, path, f.problems, NIC_KEYS);
        let bridge = n.named("bridge", BridgeName::parse);
        let vlan = n.vlan("vlan").unwrap_or(None);
        let firewall = n.bool("firewall").unwrap_or(false);
        if bridge.is_none() && n.get("bridge").is_none() {
            n.problem(
                "bridge",
                "is required: the bridge for this NIC, e.g. `bridge: vmbr1`".into(),
            );
        }
        if let Some(bridge) = bridge {
            additional_nics.push(AdditionalNic {
                bridge,
                vlan,
                firewall,
            });
        }
    }
    if additional_nics.len() > 31 {
        f.problem(
            "additional_nics",
            "at most 31 additional NICs fit (net1 to net31)".into(),
        );
    }

    let mut usb_devices = Vec::new();
    for (path, usb_map) in f.objects("usb_devices") {
        let mut u = Fields::new(usb_map, path, f.problems, USB_KEYS);
        let mapping = u.named("mapping", MappingId::parse);
        if u.get("mapping").is_none() {
            u.problem("mapping", "is required: the USB resource mapping ID".into());
        }
        let usb3 = u.bool("usb3").unwrap_or(false);
        if let Some(mapping) = mapping {
            usb_devices.push(Usb { mapping, usb3 });
        }
    }

    let mut pci_devices = Vec::new();
    for (path, pci_map) in f.objects("pci_devices") {
        let mut p = Fields::new(pci_map, path, f.problems, PCI_KEYS);
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
            pci_devices.push(HostPci {
                mapping,
                mdev,
                pcie,
                rombar,
                primary_gpu,
            });
        }
    }

    let mut additional_disks = Vec::new();
    for (path, disk_map) in f.objects("additional_disks") {
        let mut d = Fields::new(disk_map, path, f.problems, DISK_KEYS);
        let size = d.uint("disk_size", 1024 * 1024);
        if size == Some(0) {
            d.problem("disk_size", "must be at least 1 (GB)".into());
        }
        let selector = d.selector("storage_selector");
        for key in ["disk_size", "storage_selector"] {
            if d.get(key).is_none() {
                d.problem(
                    key,
                    format!(
                        "is required for every additional disk{}",
                        required_example(key)
                    ),
                );
            }
        }
        let options = disk_options(&mut d);
        if let (Some(size_gb), Some(storage_selector)) = (size.filter(|s| *s > 0), selector) {
            additional_disks.push(AdditionalDisk {
                size_gb,
                storage_selector,
                options,
            });
        }
    }

    let boot = f.choice(
        "boot",
        &[("iso", BootMode::Iso), ("clone", BootMode::Clone)],
    );
    let template = match f.get("template") {
        None => None,
        Some(Value::Number(n)) => {
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
        Some(Value::String(s)) if s.trim().is_empty() => {
            f.problem(
                "template",
                "is empty: give the template's VMID or its name".into(),
            );
            None
        }
        Some(Value::String(s)) => match s.trim().parse::<u32>() {
            Ok(id) if (100..=999_999_999).contains(&id) => Some(TemplateRef::VmId(id)),
            _ => Some(TemplateRef::Name(s.clone())),
        },
        Some(other) => {
            f.problem(
                "template",
                format!("must be a VMID or a name, not {}", json_kind(other)),
            );
            None
        }
    };
    let allowed_nodes = f.named_list("allowed_nodes", NodeName::parse);
    let iso_storage_selector = f.selector("iso_storage_selector");
    let ip_discovery_timeout = f
        .uint("ip_discovery_timeout", 7 * 24 * 3600)
        .map(Duration::from_secs);

    if !complete {
        return None;
    }

    // Cross-field rules, on the merged document only.
    let boot = boot.unwrap_or_default();
    if boot == BootMode::Clone && f.get("template").is_none() {
        f.problem("template", "is required with `boot: clone`: give the template's VMID or name, e.g. `template: 9000`".into());
    }
    if boot == BootMode::Iso && f.get("template").is_some() {
        f.problem(
            "template",
            "is only used with `boot: clone`; add `boot: clone` or remove `template`".into(),
        );
    }
    if let Some(node) = &node
        && !allowed_nodes.is_empty()
        && !allowed_nodes.contains(node)
    {
        f.problem(
            "node",
            format!(
                "{node:?} is not in allowed_nodes ({}); add it there or pick another node",
                join_names(&allowed_nodes)
            ),
        );
    }
    if hugepages.is_some() && balloon == Some(true) {
        f.problem(
            "balloon",
            "cannot be true together with hugepages; set `balloon: false` or remove hugepages"
                .into(),
        );
    }
    if let Some(pages) = hugepages {
        for (key, message) in hugepages_problems(pages, numa, memory_mb, sockets.unwrap_or(1)) {
            f.problem(key, message);
        }
    }
    if pci_devices.iter().any(|p| p.pcie) && machine_type != Some(MachineType::Q35) {
        f.problem(
            "machine_type",
            "must be q35 when a PCI device uses `pcie: true`".into(),
        );
    }

    let data = ProviderData {
        cores: cores?,
        sockets: sockets.unwrap_or(1),
        memory_mb: memory_mb?,
        disk_size_gb: disk_size_gb?,
        storage_selector: storage_selector?,
        node,
        placement_strategy: placement_strategy.unwrap_or_default(),
        network_bridge: network_bridge.or_else(|| BridgeName::new(DEFAULT_NETWORK_BRIDGE).ok())?,
        vlan: vlan.unwrap_or(None),
        network_firewall: network_firewall.unwrap_or(true),
        disk,
        cpu_type: cpu_type.or_else(|| CpuType::new(DEFAULT_CPU_TYPE).ok())?,
        machine_type,
        bios: bios.unwrap_or_default(),
        vga,
        numa: numa.unwrap_or(false),
        hugepages,
        balloon,
        pool,
        tags,
        ha,
        additional_nics,
        usb_devices,
        pci_devices,
        additional_disks,
        boot,
        template,
        allowed_nodes,
        iso_storage_selector,
        ip_discovery_timeout: ip_discovery_timeout.unwrap_or(DEFAULT_IP_DISCOVERY_TIMEOUT),
        warnings: Vec::new(),
    };
    Some(data)
}

/// Proxmox accepts `hugepages` in any VM config but refuses to start the VM unless NUMA is on, and
/// backs each NUMA node (one per socket, the memory split evenly) with whole pages; a class that
/// breaks either rule would create a VM that never starts.
fn hugepages_problems(
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

/// The first Proxmox VE major release whose HA resources have `failback` (pve-ha-manager 5.0.2, the
/// PVE 9 series); older clusters answer 400 to it.
pub const HA_FAILBACK_SINCE_PVE: u32 = 9;

/// `ha.failback` on a cluster that does not know it, given `GET /version`'s `version` ("8.4.1"). A
/// version that cannot be read is let through: Proxmox then says what it thinks.
pub fn ha_failback_problem(data: &ProviderData, pve_version: &str) -> Option<Problem> {
    data.ha.as_ref()?.failback?;
    let major: u32 = pve_version.split('.').next()?.trim().parse().ok()?;
    (major < HA_FAILBACK_SINCE_PVE).then(|| Problem {
        key: "ha.failback".into(),
        message: format!(
            "needs Proxmox VE {HA_FAILBACK_SINCE_PVE} or later; this cluster runs {pve_version}: remove `failback` (on PVE 8, set it on an HA group instead) or upgrade"
        ),
    })
}

fn join_names(names: &[NodeName]) -> String {
    names
        .iter()
        .map(NodeName::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn schema() -> ProviderDataSchema {
        ProviderDataSchema::new().unwrap()
    }

    fn parse(yaml: &str) -> Result<ProviderData, Vec<Problem>> {
        schema().resolve(yaml, None, &Map::new())
    }

    fn parse_strict(yaml: &str) -> Result<ProviderData, Vec<Problem>> {
        schema().strict(true).resolve(yaml, None, &Map::new())
    }

    fn keys_of(problems: &[Problem]) -> Vec<&str> {
        problems.iter().map(|p| p.key.as_str()).collect()
    }

    const MINIMAL: &str =
        "cores: 2\nmemory: 4096\ndisk_size: 20\nstorage_selector: name == \"local-lvm\"\n";

    #[test]
    fn minimal_class_gets_upstream_defaults() {
        let data = parse(MINIMAL).unwrap();
        assert_eq!(
            (data.cores, data.sockets, data.memory_mb, data.disk_size_gb),
            (2, 1, 4096, 20)
        );
        assert_eq!(data.network_bridge.as_str(), "vmbr0");
        assert_eq!(data.cpu_type.as_str(), "x86-64-v2-AES");
        assert!(data.network_firewall);
        assert_eq!(data.vlan, None);
        assert_eq!(data.boot, BootMode::Iso);
        assert_eq!(data.placement_strategy, PlacementStrategy::Spread);
        assert_eq!(data.ip_discovery_timeout, Duration::from_secs(300));
        assert_eq!(data.bios, Bios::Seabios);
        assert_eq!(data.balloon, None);
        assert_eq!(data.total_disk_gb(), 20);
    }

    #[test]
    fn ha_rules_are_refused_not_ignored() {
        let problems = parse(
            "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\nha:\n  rules: [r1]\n  node_affinity_nodes: [pve1]\n  resource_affinity: negative\n",
        )
        .unwrap_err();
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            ["ha.rules", "ha.node_affinity_nodes", "ha.resource_affinity"]
        );
        assert!(problems[0].message.contains("not supported"));
    }

    #[test]
    fn every_key_is_accepted() {
        let yaml = r#"
cores: 4
sockets: 2
memory: 8192
disk_size: 40
storage_selector: name == "local-lvm"
node: pve2
placement_strategy: binpack
network_bridge: vmbr1
vlan: 20
network_firewall: false
disk_ssd: true
disk_discard: true
disk_iothread: true
disk_cache: writeback
disk_aio: io_uring
cpu_type: host
machine_type: q35
bios: ovmf
vga: serial0
numa: true
hugepages: 1GB
balloon: false
pool: omni
tags: [talos, prod]
ha:
  state: started
  comment: hi
  max_restart: 2
  max_relocate: 1
  failback: true
  node_affinity_strict: true
additional_nics:
  - bridge: vmbr2
    vlan: 30
    firewall: true
usb_devices:
  - mapping: rtl-sdr
    usb3: true
pci_devices:
  - mapping: nvidia-gpu-1
    mdev: nvidia-180
    pcie: true
    primary_gpu: true
    rombar: true
additional_disks:
  - disk_size: 100
    storage_selector: storageType == "zfspool"
    disk_ssd: true
    disk_cache: none
    disk_aio: native
boot: clone
template: 9000
allowed_nodes: [pve1, pve2]
iso_storage_selector: name == "local"
ip_discovery_timeout: 0
"#;
        let data = parse(yaml).unwrap();
        assert_eq!(data.node.as_ref().map(NodeName::as_str), Some("pve2"));
        assert_eq!(data.vlan.map(VlanTag::get), Some(20));
        assert!(!data.network_firewall);
        assert_eq!(data.disk.cache, Some(DiskCache::Writeback));
        assert_eq!(data.machine_type, Some(MachineType::Q35));
        assert_eq!(data.bios, Bios::Ovmf);
        assert_eq!(data.hugepages, Some(Hugepages::OneGb));
        assert_eq!(data.ha.as_ref().unwrap().max_restart, Some(2));
        assert_eq!(data.additional_nics[0].bridge.as_str(), "vmbr2");
        assert!(data.usb_devices[0].usb3);
        assert_eq!(data.pci_devices[0].rombar, Some(true));
        assert_eq!(data.additional_disks[0].size_gb, 100);
        assert_eq!(data.template, Some(TemplateRef::VmId(9000)));
        assert_eq!(data.ip_discovery_timeout, Duration::ZERO);
        assert_eq!(data.total_disk_gb(), 140);
        assert_eq!(data.placement_strategy, PlacementStrategy::Binpack);
    }

    #[test]
    fn schema_lists_every_key_the_parser_knows() {
        let schema: Value = serde_json::from_str(SCHEMA_JSON).unwrap();
        let props = schema["properties"].as_object().unwrap();
        let mut listed: Vec<&str> = props.keys().map(String::as_str).collect();
        let mut known = TOP_KEYS.to_vec();
        listed.sort_unstable();
        known.sort_unstable();
        assert_eq!(listed, known);
        for (key, sub) in props {
            assert!(sub["description"].is_string(), "{key} has no description");
        }
        let items = |k: &str| {
            props[k]["items"]["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(items("additional_nics").len(), NIC_KEYS.len());
        assert_eq!(items("usb_devices").len(), USB_KEYS.len());
        assert_eq!(items("pci_devices").len(), PCI_KEYS.len());
        assert_eq!(items("additional_disks").len(), DISK_KEYS.len());
        assert_eq!(
            props["ha"]["properties"].as_object().unwrap().len(),
            HA_KEYS.len()
        );
    }

    #[test]
    fn reports_every_problem_at_once() {
        let yaml = r#"
cores: 0
memory: 1024
disk_sise: 20
storage_selector: local-lvm
network_bridge: "vmbr0,firewall=0"
tags: ["ok", "bad;tag", "machine-request.x"]
additional_disks:
  - disk_size: 0
    storage_selector: name ==
  - storage_selector: "true"
    disk_cahce: none
pci_devices:
  - mapping: "gpu=1"
boot: clone
"#;
        // Strict, so the misspelled keys are problems too (by default they are warnings).
        let problems = parse_strict(yaml).unwrap_err();
        let keys = keys_of(&problems);
        for expected in [
            "cores",
            "memory",
            "disk_sise",
            "disk_size",
            "storage_selector",
            "network_bridge",
            "tags[1]",
            "tags[2]",
            "additional_disks[0].disk_size",
            "additional_disks[0].storage_selector",
            "additional_disks[1].disk_size",
            "additional_disks[1].disk_cahce",
            "pci_devices[0].mapping",
            "template",
        ] {
            assert!(
                keys.contains(&expected),
                "missing {expected} in {problems:#?}"
            );
        }
        let text = describe(&problems);
        assert!(text.contains("did you mean `disk_size`?"), "{text}");
        assert!(text.contains("did you mean `disk_cache`?"), "{text}");
        assert!(
            text.contains("name == \\\"local-lvm\\\"") || text.contains("name == \"local-lvm\""),
            "{text}"
        );
        // One problem per key.
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len(), "{problems:#?}");
    }

    #[test]
    fn type_mistakes_name_the_key() {
        let problems =
            parse("cores: '2'\nmemory: 4096\ndisk_size: 20\nstorage_selector: 'true'\nvlan: no\n")
                .unwrap_err();
        assert_eq!(keys_of(&problems), vec!["cores", "vlan"]);
        assert!(problems[0].message.contains("integer"), "{problems:?}");
    }

    #[test]
    fn not_a_mapping() {
        let problems = parse("- a\n- b\n").unwrap_err();
        assert_eq!(problems[0].key, "provider_data");
        let problems = parse("cores: [").unwrap_err();
        assert!(problems[0].message.contains("YAML"));
    }

    #[test]
    fn cross_field_rules() {
        let p = parse(&format!("{MINIMAL}template: base\n")).unwrap_err();
        assert_eq!(keys_of(&p), vec!["template"]);
        let p = parse(&format!("{MINIMAL}node: pve3\nallowed_nodes: [pve1]\n")).unwrap_err();
        assert_eq!(keys_of(&p), vec!["node"]);
        let data = parse(&format!("{MINIMAL}boot: clone\ntemplate: talos-template\n")).unwrap();
        assert_eq!(
            data.template,
            Some(TemplateRef::Name("talos-template".into()))
        );
        let data = parse(&format!("{MINIMAL}boot: clone\ntemplate: '9001'\n")).unwrap();
        assert_eq!(data.template, Some(TemplateRef::VmId(9001)));
        let p = parse(&format!(
            "{MINIMAL}pci_devices: [{{mapping: gpu1, pcie: true}}]\n"
        ))
        .unwrap_err();
        assert_eq!(keys_of(&p), vec!["machine_type"]);
    }

    #[test]
    fn layers_merge_with_the_right_precedence() {
        let defaults = json!({"cores": 1, "memory": 2048, "disk_size": 10, "storage_selector": "name == \"local-lvm\"", "network_bridge": "vmbr9"});
        let node = json!({"network_bridge": "vmbr5", "memory": 3072});
        let data = schema()
            .resolve(
                "memory: 8192\n",
                Some(("pve2", node.as_object().unwrap())),
                defaults.as_object().unwrap(),
            )
            .unwrap();
        assert_eq!(data.memory_mb, 8192);
        assert_eq!(data.network_bridge.as_str(), "vmbr5");
        assert_eq!(data.cores, 1);
        let data = schema()
            .resolve("", None, defaults.as_object().unwrap())
            .unwrap();
        assert_eq!(data.network_bridge.as_str(), "vmbr9");
        let problems = schema().resolve("", None, &Map::new()).unwrap_err();
        assert_eq!(
            keys_of(&problems),
            vec!["cores", "memory", "disk_size", "storage_selector"]
        );
        assert!(problems[3].message.contains("defaults"));
        let bad_node = json!({"network_bridge": "a,b"});
        let problems = schema()
            .resolve(
                MINIMAL,
                Some(("pve2", bad_node.as_object().unwrap())),
                &Map::new(),
            )
            .unwrap_err();
        assert_eq!(keys_of(&problems), vec!["nodes.pve2.network_bridge"]);
        let bad_default = json!({"cores": 0});
        let problems = schema()
            .resolve(
                "memory: 4096\ndisk_size: 5\nstorage_selector: 'true'\n",
                None,
                bad_default.as_object().unwrap(),
            )
            .unwrap_err();
        assert_eq!(keys_of(&problems), vec!["defaults.cores"]);
    }

    #[test]
    fn config_overrides_are_validated_at_load() {
        let defaults = json!({"coers": 2, "network_bridge": "bad bridge"});
        let nodes = json!({"pve2": {"node": "pve2", "storage_selector": "ceph"}, "pve3": "x", "bad_node!": {}});
        // Strict, so the misspelled key is a problem too (by default it is a warning).
        let problems = schema()
            .strict(true)
            .validate_config_overrides(defaults.as_object().unwrap(), nodes.as_object().unwrap());
        let keys = keys_of(&problems);
        for expected in [
            "defaults.coers",
            "defaults.network_bridge",
            "nodes.pve2.node",
            "nodes.pve2.storage_selector",
            "nodes.pve3",
            "nodes.bad_node!",
        ] {
            assert!(
                keys.contains(&expected),
                "missing {expected} in {problems:#?}"
            );
        }
        assert!(describe(&problems).contains("did you mean `cores`?"));
        assert!(
            schema()
                .validate_config_overrides(&Map::new(), &Map::new())
                .is_empty()
        );
    }

    /// The official provider reads provider data with a plain YAML unmarshal into its struct, so an
    /// unknown key is silently dropped (omni client/pkg/infra/provision/context.go,
    /// `UnmarshalProviderData`; its data/schema.json sets no `additionalProperties`). A class that
    /// works there must work here: unknown keys are warnings with a suggestion, errors only in strict
    /// mode.
    #[test]
    fn unknown_keys_are_warnings_unless_strict() {
        let yaml = format!(
            "{MINIMAL}disk_sise: 20\nha:\n  state: started\n  max_restrat: 2\nadditional_disks:\n  - disk_size: 10\n    storage_selector: 'true'\n    disk_cahce: none\nfuture_key: 1\n"
        );
        let data = parse(&yaml).unwrap();
        let keys = keys_of(&data.warnings);
        assert_eq!(
            keys,
            vec![
                "disk_sise",
                "future_key",
                "ha.max_restrat",
                "additional_disks[0].disk_cahce"
            ],
            "{:#?}",
            data.warnings
        );
        let text = describe(&data.warnings);
        assert!(
            text.contains("ignored (did you mean `disk_size`?)"),
            "{text}"
        );
        assert!(text.contains("did you mean `max_restart`?"), "{text}");
        assert!(text.contains("did you mean `disk_cache`?"), "{text}");
        assert_eq!(data.disk_size_gb, 20);
        assert!(parse(MINIMAL).unwrap().warnings.is_empty());
        // When the misspelled key was a required one, the problem points at it.
        let p =
            parse("cores: 2\nmemory: 4096\ndisk_sise: 20\nstorage_selector: 'true'\n").unwrap_err();
        assert_eq!(keys_of(&p), vec!["disk_size"]);
        assert!(
            p[0].message
                .contains("`disk_sise` is set: did you mean `disk_size`?"),
            "{p:?}"
        );

        let problems = parse_strict(&yaml).unwrap_err();
        assert_eq!(keys_of(&problems), keys);
        assert!(describe(&problems).contains("strict: true"));
    }

    #[test]
    fn unknown_keys_in_lower_layers_are_warnings_with_their_layer_path() {
        let defaults = json!({"coers": 2});
        let node = json!({"network_bridg": "vmbr1"});
        let data = schema()
            .resolve(
                MINIMAL,
                Some(("pve2", node.as_object().unwrap())),
                defaults.as_object().unwrap(),
            )
            .unwrap();
        assert_eq!(
            keys_of(&data.warnings),
            vec!["defaults.coers", "nodes.pve2.network_bridg"]
        );
        let found = schema().check_config_overrides(
            defaults.as_object().unwrap(),
            &json!({"pve2": node}).as_object().unwrap().clone(),
        );
        assert!(found.problems.is_empty(), "{found:?}");
        assert_eq!(
            keys_of(&found.warnings),
            vec!["defaults.coers", "nodes.pve2.network_bridg"]
        );
        assert!(describe(&found.warnings).contains("did you mean `cores`?"));
    }

    /// qemu-server src/PVE/QemuServer/Memory.pm, `config`: dies with "numa needs to be enabled to use
    /// hugepages" when hugepages is set without numa (at start, not when the config is written);
    /// without custom numaN entries it splits the memory evenly over one NUMA node per socket, and
    /// `hugepages_size` dies unless each node's share is a multiple of the page size (2 or 1024 MB).
    #[test]
    fn hugepages_need_numa_and_whole_pages_per_numa_node() {
        let p = parse(&format!("{MINIMAL}hugepages: 2MB\nballoon: false\n")).unwrap_err();
        assert_eq!(keys_of(&p), vec!["numa"]);
        assert!(p[0].message.contains("numa: true"), "{p:?}");

        let base = "cores: 2\ndisk_size: 20\nstorage_selector: 'true'\nballoon: false\n";
        let ok = parse(&format!(
            "{base}numa: true\nhugepages: 1GB\nsockets: 2\nmemory: 4096\n"
        ));
        assert!(ok.is_ok(), "{ok:?}");
        // 6144 MB over 4 sockets is 1536 MB per node: not whole 1GB pages.
        let p = parse(&format!(
            "{base}numa: true\nhugepages: 1GB\nsockets: 4\nmemory: 6144\n"
        ))
        .unwrap_err();
        assert_eq!(keys_of(&p), vec!["memory"]);
        assert!(p[0].message.contains("multiple of 4096 MB"), "{p:?}");
        assert!(p[0].message.contains("memory: 4096"), "{p:?}");
        // 4098 MB over 2 sockets is 2049 MB per node: not whole 2MB pages.
        let p = parse(&format!(
            "{base}numa: true\nhugepages: 2MB\nsockets: 2\nmemory: 4098\n"
        ))
        .unwrap_err();
        assert_eq!(keys_of(&p), vec!["memory"]);
        assert!(
            parse(&format!(
                "{base}numa: true\nhugepages: 2MB\nsockets: 2\nmemory: 4100\n"
            ))
            .is_ok()
        );
    }

    /// pve-ha-manager src/PVE/HA/Resources.pm: the `failback` property of an HA resource came with
    /// commit "resources: introduce failback property in ha resource config" (version 5.0.2, the
    /// trixie-based PVE 9 series); PVE 8 (4.0.x, bookworm) rejects the unknown parameter with a 400.
    #[test]
    fn ha_failback_is_refused_before_pve_9() {
        let with = parse(&format!(
            "{MINIMAL}ha:\n  state: started\n  failback: false\n"
        ))
        .unwrap();
        let p = ha_failback_problem(&with, "8.4.1").unwrap();
        assert_eq!(p.key, "ha.failback");
        assert!(
            p.message.contains("Proxmox VE 9") && p.message.contains("8.4.1"),
            "{p}"
        );
        assert_eq!(ha_failback_problem(&with, "9.0.10"), None);
        assert_eq!(ha_failback_problem(&with, "10.1"), None);
        assert_eq!(ha_failback_problem(&with, "garbage"), None);
        let without = parse(&format!("{MINIMAL}ha:\n  state: started\n")).unwrap();
        assert_eq!(ha_failback_problem(&without, "8.4.1"), None);
        assert_eq!(ha_failback_problem(&parse(MINIMAL).unwrap(), "7.4"), None);
    }

    #[test]
    fn pointer_paths_become_key_paths() {
        assert_eq!(
            pointer_to_key("/additional_disks/1/disk_size"),
            "additional_disks[1].disk_size"
        );
        assert_eq!(pointer_to_key(""), "");
        assert_eq!(pointer_to_key("/a~1b"), "a/b");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn arbitrary_yaml_never_panics(text in "\\PC{0,80}") {
            let _ = parse(&text);
        }

        #[test]
        fn arbitrary_values_never_panic_and_always_name_a_key(
            key in prop::sample::select(TOP_KEYS.to_vec()),
            value in prop_oneof![
                any::<i64>().prop_map(|n| json!(n)),
                "\\PC{0,12}".prop_map(|s| json!(s)),
                any::<bool>().prop_map(|b| json!(b)),
                Just(json!([1, "x", {"a": 1}])),
                Just(json!({"bridge": 1})),
            ],
        ) {
            let mut map: Map<String, Value> = serde_json::from_str(r#"{"cores":2,"memory":4096,"disk_size":20,"storage_selector":"true"}"#).unwrap();
            map.insert(key.to_string(), value);
            if let Err(problems) = schema().parse_merged(&map) {
                prop_assert!(!problems.is_empty());
                for p in &problems {
                    prop_assert!(!p.key.is_empty());
                    prop_assert!(!p.message.is_empty());
                }
            }
        }
    }
}

//! How the values of provider-data keys are read from YAML and what the schema says they are: the
//! choices (`boot`, `bios`, …) and the template reference as the pipeline uses them, and names
//! that end up in property strings read into the validated newtypes of
//! [`crate::proxmox::property`], so rendering them later cannot fail or inject keys; the schema's
//! bounds are set on the key's field (`keys.rs`).

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use serde_json::Value;

use super::{RESERVED_TAG_PREFIXES, json_kind};
use crate::proxmox::property::{
    BridgeName, CpuType, DiskAio, DiskCache, Hugepages, MappingId, MdevType, NodeName, PoolId, Tag,
    Vga, VlanTag, str_enum,
};
use crate::rules::storage_selector::StorageSelector;

str_enum! {
    #[derive(Default, JsonSchema)]
    PlacementStrategy {
        #[default]
        Spread = "spread",
        FewerVms = "fewer-vms",
        RoundRobin = "round-robin",
        Binpack = "binpack",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MachineType {
    Q35,
    I440fx,
}

impl MachineType {
    /// Proxmox's name of the machine type (`i440fx` is its `pc`).
    pub fn as_str(self) -> &'static str {
        match self {
            MachineType::Q35 => "q35",
            MachineType::I440fx => "pc",
        }
    }
}

str_enum! {
    #[derive(Default, JsonSchema)]
    Bios {
        #[default]
        Seabios = "seabios",
        Ovmf = "ovmf",
    }
}

str_enum! {
    /// How the VM gets Talos: boot the Image Factory nocloud ISO (upstream behaviour), clone a
    /// template, or boot from the Image Factory's nocloud disk image, imported as the boot disk
    /// (ours). `as_str` is also what the provider state records.
    #[derive(Default, JsonSchema)]
    BootMode {
        #[default]
        Iso = "iso",
        Clone = "clone",
        Image = "image",
    }
}

str_enum! {
    /// How a clone copies the template's disks (`clone_mode`). `Full`: a full copy onto the storage
    /// placement chose, which works on any storage, and across nodes when the template and that
    /// storage are shared. `Linked`: disks that share the template's base volumes, on the
    /// template's own storage: quick and small, but only on storage that supports it and never onto
    /// another storage.
    #[derive(Default, JsonSchema)]
    CloneMode {
        #[default]
        Full = "full",
        Linked = "linked",
    }
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

str_enum! {
    /// Proxmox's `affinity` of a resource-affinity rule (pve-ha-manager
    /// src/PVE/HA/Rules/ResourceAffinity.pm, `properties`): on different nodes, or on one node.
    #[derive(JsonSchema)]
    ResourceAffinity {
        Negative = "negative",
        Positive = "positive",
    }
}

str_enum! {
    /// `ha.state`: the HA resource's target state.
    #[derive(JsonSchema)]
    HaState {
        Started = "started",
        Stopped = "stopped",
        Disabled = "disabled",
        Ignored = "ignored",
    }
}

/// The schema of a type read from a string (serde's `try_from = "String"`, or [`from_text!`]):
/// a string, one of `$words` when it is a choice.
macro_rules! string_schema {
    ($($name:ty => $words:expr),* $(,)?) => {$(
        impl JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> Cow<'static, str> {
                "string".into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                let words: Vec<&str> = $words;
                match words.is_empty() {
                    true => json_schema!({"type": "string"}),
                    false => json_schema!({"type": "string", "enum": words}),
                }
            }
        }
    )*};
}

string_schema! {
    BridgeName => vec![],
    CpuType => vec![],
    MappingId => vec![],
    MdevType => vec![],
    NodeName => vec![],
    PoolId => vec![],
    StorageSelector => vec![],
    UserTag => vec![],
    Vga => Vga::TYPES.to_vec(),
    DiskCache => DiskCache::ALL.iter().map(|c| c.as_str()).collect(),
    DiskAio => DiskAio::ALL.iter().map(|a| a.as_str()).collect(),
    // Provider data names page sizes as upstream does, not as Proxmox does; `Any` is Proxmox's own
    // default, never asked for.
    Hugepages => vec!["2MB", "1GB"],
}

/// A type read from a string by its checking constructor `$make`.
macro_rules! from_text {
    ($($name:ty => $make:expr;)*) => {$(
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $make(String::deserialize(d)?.as_str()).map_err(D::Error::custom)
            }
        }
    )*};
}

from_text! {
    StorageSelector => StorageSelector::new;
    Hugepages => |text: &str| match text {
        "2MB" => Ok(Hugepages::TwoMb),
        "1GB" => Ok(Hugepages::OneGb),
        _ => Err(format!("{text:?} is not one of 2MB, 1GB")),
    };
    UserTag => user_tag;
}

/// A user's tag: valid for Proxmox, and not one of the prefixes placement and ownership checks count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserTag(pub Tag);

fn user_tag(text: &str) -> Result<UserTag, String> {
    let tag = Tag::parse(text).map_err(|e| e.to_string())?;
    let lowered = text.to_ascii_lowercase();
    match RESERVED_TAG_PREFIXES
        .iter()
        .find(|p| lowered.starts_with(**p))
    {
        Some(prefix) => Err(format!(
            "tags starting with `{prefix}` are set by the provider itself; choose another tag"
        )),
        None => Ok(UserTag(tag)),
    }
}

/// A whole number up to `MAX`: more would overflow what Proxmox or the provider computes with.
pub fn up_to<'de, const MAX: u32, D: Deserializer<'de>, T: From<u32>>(d: D) -> Result<T, D::Error> {
    let n = whole_number(d)?;
    match u32::try_from(n) {
        Ok(n) if n <= MAX => Ok(T::from(n)),
        _ => Err(D::Error::custom(format!(
            "{n} is too large (at most {MAX})"
        ))),
    }
}

/// Seconds.
pub fn seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    up_to::<{ 7 * 24 * 3600 }, D, u64>(d).map(Duration::from_secs)
}

/// How long to wait for the guest agent to report an address.
pub fn ip_discovery_timeout() -> Duration {
    Duration::from_secs(300)
}

/// Upstream's bridge of the first NIC.
pub fn vmbr0() -> BridgeName {
    BridgeName::known("vmbr0")
}

/// Upstream's CPU model.
pub fn x86_64_v2_aes() -> CpuType {
    CpuType::known("x86-64-v2-AES")
}

pub fn one() -> u32 {
    1
}

pub fn yes() -> bool {
    true
}

fn whole_number<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let value = Value::deserialize(d)?;
    value.as_u64().ok_or_else(|| {
        D::Error::custom(format!("must be a whole number, not {}", json_kind(&value)))
    })
}

/// A VLAN tag; 0 is untagged.
pub fn vlan<'de, D: Deserializer<'de>>(d: D) -> Result<Option<VlanTag>, D::Error> {
    VlanTag::optional(whole_number(d)?).map_err(D::Error::custom)
}

/// The name of an IP pool: which pools exist is the config's to say (checked when the class is
/// used with it), only an empty name is wrong on its own.
pub fn pool_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match String::deserialize(d)? {
        name if name.trim().is_empty() => Err(D::Error::custom(
            "is empty: name a pool of the config file's `ipPools:`, or remove the key for DHCP",
        )),
        name => Ok(Some(name)),
    }
}

/// A template's VMID (a number or a numeric string) or its name.
impl<'de> Deserialize<'de> for TemplateRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let vmid = |id: u64| {
            u32::try_from(id)
                .ok()
                .filter(|id| (100..=999_999_999).contains(id))
        };
        match Value::deserialize(d)? {
            Value::Number(n) => n
                .as_u64()
                .and_then(vmid)
                .map(TemplateRef::VmId)
                .ok_or_else(|| {
                    D::Error::custom(format!(
                        "{n} is not a VMID (100 to 999999999); give the template's VMID or its name"
                    ))
                }),
            Value::String(s) if s.trim().is_empty() => Err(D::Error::custom(
                "is empty: give the template's VMID or its name",
            )),
            Value::String(s) => Ok(match s.trim().parse().ok().and_then(vmid) {
                Some(id) => TemplateRef::VmId(id),
                None => TemplateRef::Name(s),
            }),
            other => Err(D::Error::custom(format!(
                "must be a VMID or a name, not {}",
                json_kind(&other)
            ))),
        }
    }
}

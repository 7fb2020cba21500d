//! The typed provider data the pipeline works from, every default filled in.

use std::time::Duration;

use super::Problem;
use super::keys::Keys;
use super::values::{
    Bios, BootMode, CloneMode, MachineType, PlacementStrategy, ResourceAffinity, TemplateRef,
};
use crate::proxmox::property::{
    BridgeName, CpuType, DiskOptions, HostPci, Hugepages, NodeName, PoolId, Tag, Usb, Vga, VlanTag,
};
use crate::rules::storage_selector::StorageSelector;

/// `ha:`: the HA resource's settings, and the HA rules the VM joins (Proxmox VE 9's
/// `/cluster/ha/rules`): named existing ones, and the machine set's own node- and
/// resource-affinity rules, which the provider keeps.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HaSettings {
    pub state: Option<String>,
    pub comment: Option<String>,
    pub max_restart: Option<u32>,
    pub max_relocate: Option<u32>,
    pub failback: Option<bool>,
    /// Existing rules (made by someone else) the VM is added to.
    pub rules: Vec<String>,
    /// The set's node-affinity rule: where its VMs run (empty: no such rule).
    pub node_affinity_nodes: Vec<NodeName>,
    pub node_affinity_strict: bool,
    /// The set's resource-affinity rule; `spread: true` is `negative`.
    pub resource_affinity: Option<ResourceAffinity>,
}

impl HaSettings {
    /// Whether the VM joins any HA rule: keys Proxmox VE 8 has no API for.
    pub fn uses_rules(&self) -> bool {
        !self.rules.is_empty()
            || !self.node_affinity_nodes.is_empty()
            || self.resource_affinity.is_some()
    }
}

/// `additional_nics[]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdditionalNic {
    pub bridge: BridgeName,
    pub vlan: Option<VlanTag>,
    /// Default false (upstream: storage networks usually bypass the firewall).
    pub firewall: bool,
    /// The config's IP pool this NIC takes a static address from (`None`: DHCP).
    pub ip_pool: Option<String>,
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
    /// Kubernetes topology labels (zone = Proxmox node, region = Proxmox cluster) through a config
    /// patch the provider keeps in step with where the VM runs.
    pub topology_labels: bool,
    pub ha: Option<HaSettings>,
    pub additional_nics: Vec<AdditionalNic>,
    pub usb_devices: Vec<Usb>,
    pub pci_devices: Vec<HostPci>,
    pub additional_disks: Vec<AdditionalDisk>,
    pub boot: BootMode,
    pub template: Option<TemplateRef>,
    /// Only used with `boot: clone`.
    pub clone_mode: CloneMode,
    pub allowed_nodes: Vec<NodeName>,
    pub iso_storage_selector: Option<StorageSelector>,
    /// Zero turns IP discovery off.
    pub ip_discovery_timeout: Duration,
    /// The config's IP pool the first NIC takes a static address from (`None`: DHCP).
    pub ip_pool: Option<String>,
    /// The keys that take effect, as written (each from the highest layer writing it): a key the
    /// pipeline reads as it is needs no field of its own (`data.keys.numa.unwrap_or(false)`).
    pub keys: Keys,
    /// Keys that were ignored (unknown ones, each with a suggestion when one is close): not fatal, as
    /// with the official provider, but shown in the machine's status, the log and `validate`.
    pub warnings: Vec<Problem>,
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
}

//! Every provider-data key, declared once: a field of [`Keys`] (or of a mapping inside it) with its
//! type, its limits, what Omni shows for it (the doc comment) and what the README says. The JSON
//! schema registered with Omni, validation, the known keys behind "is not a known key (did you mean
//! …)", the required keys, the keys a `nodes:` override may not set and the README's provider-data
//! table are all generated from these declarations (`schema.rs`).
//!
//! The upstream keys keep the official provider's names and meanings (its data/schema.json); ours
//! are marked `x-ours`. The `x-` extensions are the README's and the reader's; they are left out of
//! the schema Omni is given:
//! - `x-readme`: the README's "Meaning"; `x-default`: its "Default"; `x-type`: its "Type" where the
//!   schema's type says less (`CEL`);
//! - `x-required`: the key must be set once the layers are merged; the value is how to write it;
//! - `x-per-node: false`: the key decides which node is chosen, so a `nodes.<name>:` override (applied
//!   after placement) may not set it.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

use super::values::{
    Bios, BootMode, CloneMode, HaState, MachineType, PlacementStrategy, ResourceAffinity,
    TemplateRef, UserTag, ip_discovery_timeout, one, pool_name, seconds, up_to, vlan, vmbr0,
    x86_64_v2_aes, yes,
};
use crate::proxmox::property::{
    BridgeName, CpuType, DiskAio, DiskCache, HostPci, Hugepages, NodeName, PoolId, Usb, Vga,
    VlanTag,
};
use crate::rules::storage_selector::StorageSelector;

/// Provider data: one layer as written (the machine class, the config's `defaults:` or a
/// `nodes.<name>:` override) or the layers merged, every key optional and read with its default:
/// which keys a layer writes is told by its map, and the layers together must set the required ones.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Proxmox VE machine class", description = "")]
pub struct Keys {
    /// CPU cores per socket. Required (here or in the provider config's defaults).
    #[schemars(with = "u64", range(min = 1))]
    #[schemars(extend("x-readme" = "CPU cores per socket.", "x-required" = ", e.g. `cores: 2`"))]
    #[serde(default, deserialize_with = "up_to::<65_535, _, _>")]
    pub cores: u32,

    /// CPU sockets (default 1).
    #[schemars(with = "u64", range(min = 1), extend("x-readme" = "CPU sockets.", "x-default" = "1"))]
    #[serde(default = "one", deserialize_with = "up_to::<64, _, _>")]
    pub sockets: u32,

    /// Memory in MB (at least 2048). Required.
    #[schemars(with = "u64", range(min = 2048))]
    #[schemars(extend(
        "x-readme" = "Memory in MB (at least 2048).",
        "x-required" = ", e.g. `memory: 4096` (MB)"
    ))]
    #[serde(
        rename = "memory",
        default,
        deserialize_with = "up_to::<67_108_864, _, _>"
    )]
    pub memory_mb: u64,

    /// Size of the boot disk in GB (at least 5). Required. With boot: clone the template's disk is
    /// grown to this size.
    #[schemars(with = "u64", range(min = 5))]
    #[schemars(extend(
        "x-readme" = "Boot disk in GB (at least 5); with `boot: clone` the template's disk is grown to it.",
        "x-required" = ", e.g. `disk_size: 20` (GB)"
    ))]
    #[serde(
        rename = "disk_size",
        default,
        deserialize_with = "up_to::<1_048_576, _, _>"
    )]
    pub disk_size_gb: u64,

    /// CEL condition choosing the storage for the VM's disks, evaluated for each storage of the
    /// node in API order; the first match wins. Variables: name, node, storageType (strings) and
    /// availableSpace (bytes, uint). Example: name == "local-lvm". Required.
    #[schemars(length(max = 1024))]
    #[schemars(extend(
        "x-readme" = "Chooses the storage for the disks: evaluated for each storage of the node in API order, the first match wins. Variables `name`, `node`, `storageType` (strings), `availableSpace` (uint, bytes). Example: `name == \"local-lvm\"`, `storageType in [\"lvmthin\", \"zfspool\"] && availableSpace > 50u * 1024u * 1024u * 1024u`. Checked when the class is used: a bare name like `local-lvm` is refused with the expression to write instead. At most 1024 characters of comparisons, `&&`, `||`, `!`, arithmetic, `in [...]` over literals and `startsWith`, `endsWith`, `contains`, `matches`, `size`; macros such as `all` or `exists` are refused (see [docs/security.md](docs/security.md)).",
        "x-type" = "CEL",
        "x-required" = ", e.g. `storage_selector: name == \"local-lvm\"`"
    ))]
    pub storage_selector: Option<StorageSelector>,

    /// Put the VM on this Proxmox node. It must exist and be online. Leave unset to let the
    /// provider pick a node.
    #[schemars(extend(
        "x-readme" = "Put the VM on this node (must exist and be online).",
        "x-per-node" = false
    ))]
    pub node: Option<NodeName>,

    /// How a node is picked when 'node' is unset. 'spread' (default): fewest VMs of the same
    /// machine set, then most free memory. 'fewer-vms': fewest VMs overall. 'round-robin': fewest
    /// VMs of the same set, then node name. 'binpack': the node with the least free memory that
    /// still fits.
    #[schemars(extend(
        "x-readme" = "When `node` is unset: `spread` (fewest VMs of the same machine set, then most free memory), `fewer-vms`, `round-robin`, `binpack`.",
        "x-default" = "`spread`",
        "x-per-node" = false
    ))]
    #[serde(default)]
    pub placement_strategy: PlacementStrategy,

    /// Bridge for the first NIC (default vmbr0).
    #[schemars(extend("x-readme" = "Bridge of the first NIC.", "x-default" = "`vmbr0`"))]
    #[serde(default = "vmbr0")]
    pub network_bridge: BridgeName,

    /// VLAN tag for the first NIC; 0 (default) for untagged.
    #[schemars(with = "u64", range(min = 0, max = 4094))]
    #[schemars(extend("x-readme" = "VLAN tag of the first NIC.", "x-default" = "untagged"))]
    #[serde(default, deserialize_with = "vlan")]
    pub vlan: Option<VlanTag>,

    /// Enable the Proxmox firewall on the first NIC (default true).
    #[schemars(extend("x-readme" = "Proxmox firewall on the first NIC.", "x-default" = "true"))]
    #[serde(default = "yes")]
    pub network_firewall: bool,

    /// Present the boot disk as an SSD (ssd=1).
    #[schemars(extend("x-readme" = "Present the boot disk as an SSD (`ssd=1`)."))]
    #[serde(default)]
    pub disk_ssd: bool,

    /// Pass TRIM/discard through to the storage (discard=on).
    #[schemars(extend(
        "x-readme" = "Pass TRIM/discard of the boot disk through to the storage (`discard=on`)."
    ))]
    #[serde(default)]
    pub disk_discard: bool,

    /// Give the boot disk its own IO thread (iothread=1).
    #[schemars(extend("x-readme" = "Give the boot disk its own IO thread (`iothread=1`)."))]
    #[serde(default)]
    pub disk_iothread: bool,

    /// Cache mode of the boot disk (Proxmox default: none).
    #[schemars(extend("x-readme" = "Cache mode of the boot disk.", "x-default" = "Proxmox's"))]
    pub disk_cache: Option<DiskCache>,

    /// Asynchronous IO mode of the boot disk (Proxmox default: io_uring).
    #[schemars(extend(
        "x-readme" = "Asynchronous IO mode of the boot disk.",
        "x-default" = "Proxmox's"
    ))]
    pub disk_aio: Option<DiskAio>,

    /// CPU model (default x86-64-v2-AES). 'host' passes the host CPU through.
    #[schemars(extend(
        "x-readme" = "CPU model; `host` passes the host CPU through.",
        "x-default" = "`x86-64-v2-AES`"
    ))]
    #[serde(default = "x86_64_v2_aes")]
    pub cpu_type: CpuType,

    /// QEMU machine type. 'q35' for PCIe passthrough.
    #[schemars(extend("x-readme" = "`q35` or `i440fx`.", "x-default" = "Proxmox's"))]
    pub machine_type: Option<MachineType>,

    /// Firmware. 'ovmf' (UEFI) also creates a 4 MB EFI disk without pre-enrolled keys on the VM's
    /// storage. Default seabios.
    #[schemars(extend(
        "x-readme" = "`ovmf` also adds a 4 MB EFI disk without pre-enrolled keys.",
        "x-default" = "`seabios`"
    ))]
    #[serde(default)]
    pub bios: Bios,

    /// Display adapter, e.g. 'std', 'serial0' or 'none'.
    #[schemars(extend("x-readme" = "Display adapter."))]
    pub vga: Option<Vga>,

    /// Enable NUMA.
    #[schemars(extend("x-readme" = "NUMA."))]
    #[serde(default)]
    pub numa: bool,

    /// Back the VM's memory with hugepages of this size.
    #[schemars(extend(
        "x-readme" = "`2MB` or `1GB`. Needs `numa: true`, and `memory` split over the sockets (one NUMA node each) must be whole pages: Proxmox refuses to start the VM otherwise, so this is checked up front."
    ))]
    pub hugepages: Option<Hugepages>,

    /// Memory ballooning. Set false to turn the balloon device off (for passthrough or
    /// hugepages); unset leaves the Proxmox default.
    #[schemars(extend(
        "x-readme" = "`false` turns the balloon device off.",
        "x-default" = "Proxmox's"
    ))]
    pub balloon: Option<bool>,

    /// Proxmox resource pool for the VM.
    #[schemars(extend(
        "x-readme" = "Proxmox resource pool. Unset: a pool named after the machine-request set, created on demand and removed with the set's last machine (as upstream). A pool you name must exist.",
        "x-default" = "the set's ID"
    ))]
    pub pool: Option<PoolId>,

    /// Extra Proxmox tags for the VM (letters, digits, '_', '-', '+', '.'). The provider adds
    /// machine-request.<set> and omni-provider.<id> itself.
    #[schemars(inner(length(min = 1)))]
    #[schemars(extend(
        "x-readme" = "Extra tags; `machine-request.*`, `omni-provider.*` and `omni-request.*` are ours."
    ))]
    #[serde(default)]
    pub tags: Vec<UserTag>,

    /// Register the VM as a Proxmox HA resource and keep the machine set's HA rules (rules need
    /// Proxmox VE 9+).
    #[schemars(title = "High Availability")]
    #[schemars(extend(
        "x-readme" = "Register the VM with Proxmox HA after start: `state`, `comment`, `max_restart`, `max_relocate`, `failback`; and HA rules (Proxmox VE 9): `rules` (existing rules to join), `node_affinity_nodes` + `node_affinity_strict` (the set's node-affinity rule), `resource_affinity`, or `spread` as its short form for `negative` (the set's resource-affinity rule). See [HA](#high-availability). `failback` and the rules are refused before anything is created on an older cluster."
    ))]
    pub ha: Option<HaSettings>,

    /// More NICs (net1, net2, …).
    #[schemars(extend("x-readme" = "More NICs: `bridge`, `vlan`, `firewall`, `ip_pool`."))]
    #[serde(default)]
    pub additional_nics: Vec<AdditionalNic>,

    /// USB devices passed through by resource mapping (usb0, usb1, …).
    #[schemars(length(max = 15))]
    #[schemars(extend("x-readme" = "USB passthrough by resource mapping: `mapping`, `usb3`."))]
    #[serde(default)]
    pub usb_devices: Vec<Usb>,

    /// PCI devices passed through by resource mapping (hostpci0, hostpci1, …).
    #[schemars(length(max = 16))]
    #[schemars(extend(
        "x-readme" = "PCI passthrough by resource mapping: `mapping`, `mdev`, `pcie`, `primary_gpu`, `rombar`."
    ))]
    #[serde(default)]
    pub pci_devices: Vec<HostPci>,

    /// More disks (scsi1, scsi2, …).
    #[schemars(length(max = 30))]
    #[schemars(extend(
        "x-readme" = "More disks: `disk_size`, `storage_selector`, `disk_ssd`, `disk_discard`, `disk_iothread`, `disk_cache`, `disk_aio`."
    ))]
    #[serde(default)]
    pub additional_disks: Vec<AdditionalDisk>,

    /// Label the Kubernetes node with topology.kubernetes.io/zone (its Proxmox node, kept current
    /// when the VM migrates) and topology.kubernetes.io/region (the Proxmox cluster name), through
    /// a config patch. Default true.
    #[schemars(extend(
        "x-readme" = "Kubernetes node labels `topology.kubernetes.io/zone` = the Proxmox node (kept current when the VM migrates) and `topology.kubernetes.io/region` = the Proxmox cluster name, through an Omni config patch of the machine, which overrides the same labels in cluster and machine-set patches; `false` turns them off and keeps yours.",
        "x-default" = "`true`",
        "x-ours" = true
    ))]
    #[serde(default = "yes")]
    pub topology_labels: bool,

    /// How the VM gets Talos: 'iso' (default) boots the Image Factory nocloud ISO; 'clone' clones
    /// 'template'; 'image' creates the boot disk from the Image Factory nocloud disk image
    /// (Proxmox VE 8.4+, a storage with the 'import' content type).
    #[schemars(extend(
        "x-readme" = "`iso` boots the Image Factory nocloud ISO (as upstream); `clone` clones `template`; `image` creates the boot disk from the Image Factory's nocloud disk image, downloaded once into a storage with the `import` content type (Proxmox VE 8.4 and later): no installer run, no ISO attached.",
        "x-default" = "`iso`",
        "x-ours" = true
    ))]
    #[serde(default)]
    pub boot: BootMode,

    /// Template to clone when boot is 'clone': its VMID or its name.
    #[schemars(with = "Option<u64>", range(min = 100))]
    #[schemars(extend(
        "type" = ["integer", "string"],
        "minLength" = 1,
        "x-readme" = "the template to clone with `boot: clone`.",
        "x-type" = "VMID or name",
        "x-ours" = true
    ))]
    pub template: Option<TemplateRef>,

    /// With boot 'clone': 'full' (default) copies the template's disks onto the storage
    /// storage_selector chooses; 'linked' makes a linked clone that shares the template's disks on
    /// the template's own storage (which storage_selector must select; not on lvm or iSCSI
    /// storage).
    #[schemars(extend(
        "x-readme" = "with `boot: clone`: `full` copies the template's disks onto the selected storage; `linked` shares them on the template's own storage (which `storage_selector` must select; storage with linked-clone support, not `lvm` or iSCSI). See [Placement](#placement).",
        "x-default" = "`full`",
        "x-ours" = true,
        "x-per-node" = false
    ))]
    #[serde(default)]
    pub clone_mode: CloneMode,

    /// Nodes automatic placement may choose from (default: all).
    #[schemars(inner(length(min = 1)))]
    #[schemars(extend(
        "x-readme" = "nodes automatic placement may choose.",
        "x-default" = "all",
        "x-ours" = true,
        "x-per-node" = false
    ))]
    #[serde(default)]
    pub allowed_nodes: Vec<NodeName>,

    /// CEL condition choosing the storage for the Talos ISO and the seed ISO (same variables as
    /// storage_selector; default: the first storage that holds ISO images).
    #[schemars(length(max = 1024))]
    #[schemars(extend(
        "x-readme" = "storage for the Talos ISO and the seed ISO.",
        "x-type" = "CEL",
        "x-default" = "first ISO storage",
        "x-ours" = true
    ))]
    pub iso_storage_selector: Option<StorageSelector>,

    /// Seconds to wait for the guest agent to report an address after start (default 300); 0
    /// skips IP discovery.
    #[schemars(with = "u64", range(min = 0))]
    #[schemars(extend(
        "x-readme" = "seconds to wait for the guest agent to report an address; 0 skips the step.",
        "x-default" = "300",
        "x-ours" = true
    ))]
    #[serde(default = "ip_discovery_timeout", deserialize_with = "seconds")]
    pub ip_discovery_timeout: Duration,

    /// Name of a static IP pool from the provider config's ipPools: the first NIC gets the lowest
    /// free address of the pool, written into the NoCloud network-config with the pool's gateway
    /// and nameservers, instead of DHCP.
    #[schemars(with = "String", length(min = 1))]
    #[schemars(extend(
        "x-readme" = "a static IP pool of the config file's `ipPools:` for the first NIC: its lowest free address, allocated before the VM is created, written into the seed's network-config with the pool's gateway and nameservers (instead of DHCP), and released after the VM is destroyed. `additional_nics[].ip_pool` does the same for another NIC. See [IP pools](docs/ip-pools.md).",
        "x-default" = "DHCP",
        "x-ours" = true
    ))]
    #[serde(default, deserialize_with = "pool_name")]
    pub ip_pool: Option<String>,
}

/// `ha:`. `spread: true` is the short way to ask for `resource_affinity: negative`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(description = "")]
pub struct HaSettings {
    /// HA target state (default started).
    pub state: Option<HaState>,
    /// Comment on the HA resource.
    #[schemars(length(max = 4096))]
    pub comment: Option<String>,
    /// Restart attempts on the current node (Proxmox default 1).
    #[schemars(with = "u64", range(min = 0))]
    #[serde(default, deserialize_with = "up_to::<{ u32::MAX }, _, _>")]
    pub max_restart: Option<u32>,
    /// Relocation attempts after the restarts (Proxmox default 1).
    #[schemars(with = "u64", range(min = 0))]
    #[serde(default, deserialize_with = "up_to::<{ u32::MAX }, _, _>")]
    pub max_relocate: Option<u32>,
    /// Move the VM back to its preferred node when that node returns.
    pub failback: Option<bool>,
    /// Names of existing Proxmox HA rules (Proxmox VE 9+) the VM is added to once it is
    /// HA-managed.
    // An HA rule ID (pve-configid) is wholly checked by the schema's pattern and length.
    #[schemars(inner(length(max = 64), pattern("^[A-Za-z0-9][A-Za-z0-9_-]*$")))]
    #[serde(default)]
    pub rules: Vec<String>,
    /// Nodes of the machine set's node-affinity rule omni-<set>-naff (Proxmox VE 9+): HA keeps the
    /// set's VMs on these nodes, and placement prefers them. The rule is made once; edit its nodes
    /// in Proxmox.
    #[schemars(inner(length(max = 63), pattern("^[A-Za-z0-9][A-Za-z0-9-]*$")))]
    #[serde(default)]
    pub node_affinity_nodes: Vec<NodeName>,
    /// Make that node-affinity rule strict (default false): the VMs may run on the listed nodes
    /// only, and placement picks only among them.
    #[serde(default)]
    pub node_affinity_strict: bool,
    /// Resource-affinity rule omni-<set>-raff between the machine set's VMs (Proxmox VE 9+):
    /// 'negative' keeps them on different nodes, 'positive' on one node. Placement follows it too.
    pub resource_affinity: Option<ResourceAffinity>,
    /// Keep the machine set's VMs on different nodes (the same as resource_affinity: negative):
    /// what a highly available control plane needs (Proxmox VE 9+).
    pub spread: Option<bool>,
}

/// An item of `additional_nics:`. A required key is an `Option` all the same, so that each key of an
/// item can be read on its own; the schema says it is required.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(description = "")]
pub struct AdditionalNic {
    /// Bridge, e.g. vmbr1.
    #[schemars(required)]
    pub bridge: BridgeName,
    /// VLAN tag; 0 or unset for untagged.
    #[schemars(with = "u64", range(min = 0, max = 4094))]
    #[serde(default, deserialize_with = "vlan")]
    pub vlan: Option<VlanTag>,
    /// Enable the Proxmox firewall on this NIC (default false).
    #[serde(default)]
    pub firewall: bool,
    /// Name of a static IP pool from the provider config's ipPools for this NIC (default: DHCP).
    #[schemars(with = "String", length(min = 1))]
    #[serde(default, deserialize_with = "pool_name")]
    pub ip_pool: Option<String>,
}

/// An item of `additional_disks:`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(description = "")]
pub struct AdditionalDisk {
    /// Size in GB.
    #[schemars(with = "u64", required, range(min = 1))]
    #[serde(
        rename = "disk_size",
        deserialize_with = "up_to::<{ 1024 * 1024 }, _, _>"
    )]
    pub size_gb: u64,
    /// CEL condition choosing this disk's storage (same variables as storage_selector).
    #[schemars(required, length(max = 1024))]
    pub storage_selector: StorageSelector,
    /// Present as an SSD.
    #[serde(default)]
    pub disk_ssd: bool,
    /// Pass TRIM/discard through.
    #[serde(default)]
    pub disk_discard: bool,
    /// Own IO thread.
    #[serde(default)]
    pub disk_iothread: bool,
    /// Cache mode.
    pub disk_cache: Option<DiskCache>,
    /// Asynchronous IO mode.
    pub disk_aio: Option<DiskAio>,
}

//! Every provider-data key, declared once: its name, where it may be written, its type and limits,
//! what Omni shows for it and what the README says. The JSON schema registered with Omni, the list of
//! known keys behind "is not a known key (did you mean …)", the required keys, the keys a `nodes:`
//! override may not set, and the README's provider-data table are all read from [`TOP_LEVEL`] and
//! `NESTED` (see `schema.rs`).
//!
//! The upstream keys keep the official provider's names and meanings (its data/schema.json); ours are
//! marked [`Origin::Ours`].

use super::nested_keys::NESTED;

/// Where a key is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The top level of provider data: the machine class, `defaults:` and (see [`Key::per_node`])
    /// `nodes.<name>:`.
    Top,
    /// Inside `ha:`.
    Ha,
    /// Inside each item of `additional_nics[]`.
    AdditionalNics,
    /// Inside each item of `usb_devices[]`.
    UsbDevices,
    /// Inside each item of `pci_devices[]`.
    PciDevices,
    /// Inside each item of `additional_disks[]`.
    AdditionalDisks,
}

/// What a key holds, as the schema and the README name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Integer,
    Boolean,
    String,
    /// A CEL storage selector (a string to the schema).
    Cel,
    /// A template's VMID (a number or a numeric string) or its name.
    VmidOrName,
    /// A list of strings, each limited by [`Key::items`].
    Strings,
    /// A list of mappings whose keys are those of the given place.
    Objects(Place),
    /// A mapping whose keys are those of the given place.
    Mapping(Place),
}

/// Whose key it is: compatibility with the official provider is a feature, additions are marked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Upstream,
    Ours,
}

/// Limits on a string (or on each string of a list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Text {
    pub min_len: Option<u64>,
    pub max_len: Option<u64>,
    pub pattern: Option<&'static str>,
}

impl Text {
    pub const ANY: Text = Text {
        min_len: None,
        max_len: None,
        pattern: None,
    };
    pub(super) const NON_EMPTY: Text = Text {
        min_len: Some(1),
        ..Text::ANY
    };
    /// A CEL selector: bounded before its parser sees it.
    pub(super) const CEL: Text = Text {
        max_len: Some(crate::rules::storage_selector::MAX_LEN as u64),
        ..Text::ANY
    };
}

/// One provider-data key.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub name: &'static str,
    pub place: Place,
    pub kind: Kind,
    pub origin: Origin,
    /// What Omni shows for the key (the schema's `description`).
    pub description: &'static str,
    /// The README's "Meaning" (top-level keys only; nested keys are described in their parent's).
    pub doc: &'static str,
    /// The README's "Default" when not required ("" when there is none to name).
    pub default: &'static str,
    /// Top level: must be set once the layers are merged. Nested: in every item.
    pub required: bool,
    /// How to write it, shown when it is missing (", e.g. `cores: 2`").
    pub example: &'static str,
    /// May be set under `nodes.<name>:`. A key that decides which node is chosen may not: the node's
    /// override is applied after placement.
    pub per_node: bool,
    /// The only values a string may take.
    pub one_of: &'static [&'static str],
    pub min: Option<u64>,
    pub max: Option<u64>,
    pub text: Text,
    pub max_items: Option<u64>,
    /// Limits on each item of a [`Kind::Strings`] list.
    pub items: Text,
    /// The schema's `title` (shown by Omni as the section name).
    pub title: Option<&'static str>,
}

impl Key {
    pub(super) const BASE: Key = Key {
        name: "",
        place: Place::Top,
        kind: Kind::String,
        origin: Origin::Upstream,
        description: "",
        doc: "",
        default: "",
        required: false,
        example: "",
        per_node: true,
        one_of: &[],
        min: None,
        max: None,
        text: Text::ANY,
        max_items: None,
        items: Text::ANY,
        title: None,
    };

    /// The README's "Type" column.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            Kind::Integer => "integer",
            Kind::Boolean => "boolean",
            Kind::String => "string",
            Kind::Cel => "CEL",
            Kind::VmidOrName => "VMID or name",
            Kind::Strings | Kind::Objects(_) => "list",
            Kind::Mapping(_) => "mapping",
        }
    }

    /// The README's row for this key.
    pub fn readme_row(&self) -> String {
        let default = if self.required {
            "required"
        } else {
            self.default
        };
        let ours = match self.origin {
            Origin::Ours => "*ours*: ",
            Origin::Upstream => "",
        };
        format!(
            "| `{}` | {} | {default} | {ours}{} |",
            self.name,
            self.type_name(),
            self.doc
        )
        .replace("|  |", "| |")
    }
}

pub(super) const DISK_CACHES: &[&str] =
    &["none", "writethrough", "writeback", "directsync", "unsafe"];
pub(super) const DISK_AIOS: &[&str] = &["native", "threads", "io_uring"];
pub(super) const SELECTOR_EXAMPLE: &str = ", e.g. `storage_selector: name == \"local-lvm\"`";

/// Every top-level key in the order the README lists them (and unknown-key hints try them),
/// then the keys of each nested place.
pub const TOP_LEVEL: &[Key] = &[
    Key {
        name: "cores",
        kind: Kind::Integer,
        description: "CPU cores per socket. Required (here or in the provider config's defaults).",
        doc: "CPU cores per socket.",
        required: true,
        example: ", e.g. `cores: 2`",
        min: Some(1),
        ..Key::BASE
    },
    Key {
        name: "sockets",
        kind: Kind::Integer,
        description: "CPU sockets (default 1).",
        doc: "CPU sockets.",
        default: "1",
        min: Some(1),
        ..Key::BASE
    },
    Key {
        name: "memory",
        kind: Kind::Integer,
        description: "Memory in MB (at least 2048). Required.",
        doc: "Memory in MB (at least 2048).",
        required: true,
        example: ", e.g. `memory: 4096` (MB)",
        min: Some(2048),
        ..Key::BASE
    },
    Key {
        name: "disk_size",
        kind: Kind::Integer,
        description: "Size of the boot disk in GB (at least 5). Required. With boot: clone the template's disk is grown to this size.",
        doc: "Boot disk in GB (at least 5); with `boot: clone` the template's disk is grown to it.",
        required: true,
        example: ", e.g. `disk_size: 20` (GB)",
        min: Some(5),
        ..Key::BASE
    },
    Key {
        name: "storage_selector",
        kind: Kind::Cel,
        text: Text::CEL,
        description: "CEL condition choosing the storage for the VM's disks, evaluated for each storage of the node in API order; the first match wins. Variables: name, node, storageType (strings) and availableSpace (bytes, uint). Example: name == \"local-lvm\". Required.",
        doc: "Chooses the storage for the disks: evaluated for each storage of the node in API order, the first match wins. Variables `name`, `node`, `storageType` (strings), `availableSpace` (uint, bytes). Example: `name == \"local-lvm\"`, `storageType in [\"lvmthin\", \"zfspool\"] && availableSpace > 50u * 1024u * 1024u * 1024u`. Checked when the class is used: a bare name like `local-lvm` is refused with the expression to write instead. At most 1024 characters of comparisons, `&&`, `||`, `!`, arithmetic, `in [...]` over literals and `startsWith`, `endsWith`, `contains`, `matches`, `size`; macros such as `all` or `exists` are refused (see [docs/security.md](docs/security.md)).",
        required: true,
        example: SELECTOR_EXAMPLE,
        ..Key::BASE
    },
    Key {
        name: "node",
        description: "Put the VM on this Proxmox node. It must exist and be online. Leave unset to let the provider pick a node.",
        doc: "Put the VM on this node (must exist and be online).",
        per_node: false,
        ..Key::BASE
    },
    Key {
        name: "placement_strategy",
        description: "How a node is picked when 'node' is unset. 'spread' (default): fewest VMs of the same machine set, then most free memory. 'fewer-vms': fewest VMs overall. 'round-robin': fewest VMs of the same set, then node name. 'binpack': the node with the least free memory that still fits.",
        doc: "When `node` is unset: `spread` (fewest VMs of the same machine set, then most free memory), `fewer-vms`, `round-robin`, `binpack`.",
        default: "`spread`",
        per_node: false,
        one_of: &["spread", "fewer-vms", "round-robin", "binpack"],
        ..Key::BASE
    },
    Key {
        name: "network_bridge",
        description: "Bridge for the first NIC (default vmbr0).",
        doc: "Bridge of the first NIC.",
        default: "`vmbr0`",
        ..Key::BASE
    },
    Key {
        name: "vlan",
        kind: Kind::Integer,
        description: "VLAN tag for the first NIC; 0 (default) for untagged.",
        doc: "VLAN tag of the first NIC.",
        default: "untagged",
        min: Some(0),
        max: Some(4094),
        ..Key::BASE
    },
    Key {
        name: "network_firewall",
        kind: Kind::Boolean,
        description: "Enable the Proxmox firewall on the first NIC (default true).",
        doc: "Proxmox firewall on the first NIC.",
        default: "true",
        ..Key::BASE
    },
    Key {
        name: "disk_ssd",
        kind: Kind::Boolean,
        description: "Present the boot disk as an SSD (ssd=1).",
        doc: "Present the boot disk as an SSD (`ssd=1`).",
        ..Key::BASE
    },
    Key {
        name: "disk_discard",
        kind: Kind::Boolean,
        description: "Pass TRIM/discard through to the storage (discard=on).",
        doc: "Pass TRIM/discard of the boot disk through to the storage (`discard=on`).",
        ..Key::BASE
    },
    Key {
        name: "disk_iothread",
        kind: Kind::Boolean,
        description: "Give the boot disk its own IO thread (iothread=1).",
        doc: "Give the boot disk its own IO thread (`iothread=1`).",
        ..Key::BASE
    },
    Key {
        name: "disk_cache",
        description: "Cache mode of the boot disk (Proxmox default: none).",
        doc: "Cache mode of the boot disk.",
        default: "Proxmox's",
        one_of: DISK_CACHES,
        ..Key::BASE
    },
    Key {
        name: "disk_aio",
        description: "Asynchronous IO mode of the boot disk (Proxmox default: io_uring).",
        doc: "Asynchronous IO mode of the boot disk.",
        default: "Proxmox's",
        one_of: DISK_AIOS,
        ..Key::BASE
    },
    Key {
        name: "cpu_type",
        description: "CPU model (default x86-64-v2-AES). 'host' passes the host CPU through.",
        doc: "CPU model; `host` passes the host CPU through.",
        default: "`x86-64-v2-AES`",
        ..Key::BASE
    },
    Key {
        name: "machine_type",
        description: "QEMU machine type. 'q35' for PCIe passthrough.",
        doc: "`q35` or `i440fx`.",
        default: "Proxmox's",
        one_of: &["q35", "i440fx"],
        ..Key::BASE
    },
    Key {
        name: "bios",
        description: "Firmware. 'ovmf' (UEFI) also creates a 4 MB EFI disk without pre-enrolled keys on the VM's storage. Default seabios.",
        doc: "`ovmf` also adds a 4 MB EFI disk without pre-enrolled keys.",
        default: "`seabios`",
        one_of: &["seabios", "ovmf"],
        ..Key::BASE
    },
    Key {
        name: "vga",
        description: "Display adapter, e.g. 'std', 'serial0' or 'none'.",
        doc: "Display adapter.",
        one_of: crate::proxmox::property::Vga::TYPES,
        ..Key::BASE
    },
    Key {
        name: "numa",
        kind: Kind::Boolean,
        description: "Enable NUMA.",
        doc: "NUMA.",
        ..Key::BASE
    },
    Key {
        name: "hugepages",
        description: "Back the VM's memory with hugepages of this size.",
        doc: "`2MB` or `1GB`. Needs `numa: true`, and `memory` split over the sockets (one NUMA node each) must be whole pages: Proxmox refuses to start the VM otherwise, so this is checked up front.",
        one_of: &["2MB", "1GB"],
        ..Key::BASE
    },
    Key {
        name: "balloon",
        kind: Kind::Boolean,
        description: "Memory ballooning. Set false to turn the balloon device off (for passthrough or hugepages); unset leaves the Proxmox default.",
        doc: "`false` turns the balloon device off.",
        default: "Proxmox's",
        ..Key::BASE
    },
    Key {
        name: "pool",
        description: "Proxmox resource pool for the VM.",
        doc: "Proxmox resource pool. Unset: a pool named after the machine-request set, created on demand and removed with the set's last machine (as upstream). A pool you name must exist.",
        default: "the set's ID",
        ..Key::BASE
    },
    Key {
        name: "tags",
        kind: Kind::Strings,
        description: "Extra Proxmox tags for the VM (letters, digits, '_', '-', '+', '.'). The provider adds machine-request.<set> and omni-provider.<id> itself.",
        doc: "Extra tags; `machine-request.*`, `omni-provider.*` and `omni-request.*` are ours.",
        items: Text::NON_EMPTY,
        ..Key::BASE
    },
    Key {
        name: "ha",
        kind: Kind::Mapping(Place::Ha),
        title: Some("High Availability"),
        description: "Register the VM as a Proxmox HA resource and keep the machine set's HA rules (rules need Proxmox VE 9+).",
        doc: "Register the VM with Proxmox HA after start: `state`, `comment`, `max_restart`, `max_relocate`, `failback`; and HA rules (Proxmox VE 9): `rules` (existing rules to join), `node_affinity_nodes` + `node_affinity_strict` (the set's node-affinity rule), `resource_affinity`, or `spread` as its short form for `negative` (the set's resource-affinity rule). See [HA](#high-availability). `failback` and the rules are refused before anything is created on an older cluster.",
        ..Key::BASE
    },
    Key {
        name: "additional_nics",
        kind: Kind::Objects(Place::AdditionalNics),
        description: "More NICs (net1, net2, …).",
        doc: "More NICs: `bridge`, `vlan`, `firewall`, `ip_pool`.",
        ..Key::BASE
    },
    Key {
        name: "usb_devices",
        kind: Kind::Objects(Place::UsbDevices),
        description: "USB devices passed through by resource mapping (usb0, usb1, …).",
        doc: "USB passthrough by resource mapping: `mapping`, `usb3`.",
        max_items: Some(15),
        ..Key::BASE
    },
    Key {
        name: "pci_devices",
        kind: Kind::Objects(Place::PciDevices),
        description: "PCI devices passed through by resource mapping (hostpci0, hostpci1, …).",
        doc: "PCI passthrough by resource mapping: `mapping`, `mdev`, `pcie`, `primary_gpu`, `rombar`.",
        max_items: Some(16),
        ..Key::BASE
    },
    Key {
        name: "additional_disks",
        kind: Kind::Objects(Place::AdditionalDisks),
        description: "More disks (scsi1, scsi2, …).",
        doc: "More disks: `disk_size`, `storage_selector`, `disk_ssd`, `disk_discard`, `disk_iothread`, `disk_cache`, `disk_aio`.",
        max_items: Some(30),
        ..Key::BASE
    },
    Key {
        name: "topology_labels",
        kind: Kind::Boolean,
        origin: Origin::Ours,
        description: "Label the Kubernetes node with topology.kubernetes.io/zone (its Proxmox node, kept current when the VM migrates) and topology.kubernetes.io/region (the Proxmox cluster name), through a config patch. Default true.",
        doc: "Kubernetes node labels `topology.kubernetes.io/zone` = the Proxmox node (kept current when the VM migrates) and `topology.kubernetes.io/region` = the Proxmox cluster name, through an Omni config patch of the machine, which overrides the same labels in cluster and machine-set patches; `false` turns them off and keeps yours.",
        default: "`true`",
        ..Key::BASE
    },
    Key {
        name: "boot",
        origin: Origin::Ours,
        description: "How the VM gets Talos: 'iso' (default) boots the Image Factory nocloud ISO; 'clone' clones 'template'; 'image' creates the boot disk from the Image Factory nocloud disk image (Proxmox VE 8.4+, a storage with the 'import' content type).",
        doc: "`iso` boots the Image Factory nocloud ISO (as upstream); `clone` clones `template`; `image` creates the boot disk from the Image Factory's nocloud disk image, downloaded once into a storage with the `import` content type (Proxmox VE 8.4 and later): no installer run, no ISO attached.",
        default: "`iso`",
        one_of: &["iso", "clone", "image"],
        ..Key::BASE
    },
    Key {
        name: "template",
        kind: Kind::VmidOrName,
        origin: Origin::Ours,
        description: "Template to clone when boot is 'clone': its VMID or its name.",
        doc: "the template to clone with `boot: clone`.",
        min: Some(100),
        text: Text::NON_EMPTY,
        ..Key::BASE
    },
    Key {
        name: "clone_mode",
        origin: Origin::Ours,
        description: "With boot 'clone': 'full' (default) copies the template's disks onto the storage storage_selector chooses; 'linked' makes a linked clone that shares the template's disks on the template's own storage (which storage_selector must select; not on lvm or iSCSI storage).",
        doc: "with `boot: clone`: `full` copies the template's disks onto the selected storage; `linked` shares them on the template's own storage (which `storage_selector` must select; storage with linked-clone support, not `lvm` or iSCSI). See [Placement](#placement).",
        default: "`full`",
        per_node: false,
        one_of: &["full", "linked"],
        ..Key::BASE
    },
    Key {
        name: "allowed_nodes",
        kind: Kind::Strings,
        origin: Origin::Ours,
        description: "Nodes automatic placement may choose from (default: all).",
        doc: "nodes automatic placement may choose.",
        default: "all",
        per_node: false,
        items: Text::NON_EMPTY,
        ..Key::BASE
    },
    Key {
        name: "iso_storage_selector",
        kind: Kind::Cel,
        text: Text::CEL,
        origin: Origin::Ours,
        description: "CEL condition choosing the storage for the Talos ISO and the seed ISO (same variables as storage_selector; default: the first storage that holds ISO images).",
        doc: "storage for the Talos ISO and the seed ISO.",
        default: "first ISO storage",
        ..Key::BASE
    },
    Key {
        name: "ip_discovery_timeout",
        kind: Kind::Integer,
        origin: Origin::Ours,
        description: "Seconds to wait for the guest agent to report an address after start (default 300); 0 skips IP discovery.",
        doc: "seconds to wait for the guest agent to report an address; 0 skips the step.",
        default: "300",
        min: Some(0),
        ..Key::BASE
    },
    Key {
        name: "ip_pool",
        origin: Origin::Ours,
        description: "Name of a static IP pool from the provider config's ipPools: the first NIC gets the lowest free address of the pool, written into the NoCloud network-config with the pool's gateway and nameservers, instead of DHCP.",
        doc: "a static IP pool of the config file's `ipPools:` for the first NIC: its lowest free address, allocated before the VM is created, written into the seed's network-config with the pool's gateway and nameservers (instead of DHCP), and released after the VM is destroyed. `additional_nics[].ip_pool` does the same for another NIC. See [IP pools](docs/ip-pools.md).",
        default: "DHCP",
        text: Text::NON_EMPTY,
        ..Key::BASE
    },
];

/// The keys written at `place`, in declaration order.
pub fn at(place: Place) -> impl Iterator<Item = &'static Key> {
    TOP_LEVEL
        .iter()
        .chain(NESTED)
        .filter(move |k| k.place == place)
}

/// The names of the keys written at `place`: what an unknown key there is compared with.
pub fn names(place: Place) -> Vec<&'static str> {
    at(place).map(|k| k.name).collect()
}

/// The declaration of `name` at `place`.
pub fn get(place: Place, name: &str) -> Option<&'static Key> {
    at(place).find(|k| k.name == name)
}

/// Where in the reading order a top-level key comes (unknown keys last).
pub fn position(name: &str) -> usize {
    at(Place::Top)
        .position(|k| k.name == name)
        .unwrap_or(usize::MAX)
}

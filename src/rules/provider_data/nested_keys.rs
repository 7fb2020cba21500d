//! The keys written inside `ha:` and inside the items of the lists of mappings (`additional_nics[]`,
//! `usb_devices[]`, `pci_devices[]`, `additional_disks[]`), declared as [`super::keys::TOP_LEVEL`] is.

use super::keys::{DISK_AIOS, DISK_CACHES, Key, Kind, Place, SELECTOR_EXAMPLE, Text};

/// Every nested key, grouped by place, in the order unknown-key hints try them.
pub const NESTED: &[Key] = &[
    // ha:
    Key {
        name: "state",
        place: Place::Ha,
        description: "HA target state (default started).",
        one_of: &["started", "stopped", "disabled", "ignored"],
        ..Key::BASE
    },
    Key {
        name: "comment",
        place: Place::Ha,
        description: "Comment on the HA resource.",
        text: Text {
            max_len: Some(4096),
            ..Text::ANY
        },
        ..Key::BASE
    },
    Key {
        name: "max_restart",
        place: Place::Ha,
        kind: Kind::Integer,
        description: "Restart attempts on the current node (Proxmox default 1).",
        min: Some(0),
        ..Key::BASE
    },
    Key {
        name: "max_relocate",
        place: Place::Ha,
        kind: Kind::Integer,
        description: "Relocation attempts after the restarts (Proxmox default 1).",
        min: Some(0),
        ..Key::BASE
    },
    Key {
        name: "failback",
        place: Place::Ha,
        kind: Kind::Boolean,
        description: "Move the VM back to its preferred node when that node returns.",
        ..Key::BASE
    },
    Key {
        name: "rules",
        place: Place::Ha,
        kind: Kind::Strings,
        description: "Names of existing Proxmox HA rules (Proxmox VE 9+) the VM is added to once it is HA-managed.",
        items: Text {
            min_len: None,
            max_len: Some(64),
            pattern: Some("^[A-Za-z0-9][A-Za-z0-9_-]*$"),
        },
        ..Key::BASE
    },
    Key {
        name: "node_affinity_nodes",
        place: Place::Ha,
        kind: Kind::Strings,
        description: "Nodes of the machine set's node-affinity rule omni-<set>-naff (Proxmox VE 9+): HA keeps the set's VMs on these nodes, and placement prefers them. The rule is made once; edit its nodes in Proxmox.",
        items: Text {
            min_len: None,
            max_len: Some(63),
            pattern: Some("^[A-Za-z0-9][A-Za-z0-9-]*$"),
        },
        ..Key::BASE
    },
    Key {
        name: "node_affinity_strict",
        place: Place::Ha,
        kind: Kind::Boolean,
        description: "Make that node-affinity rule strict (default false): the VMs may run on the listed nodes only, and placement picks only among them.",
        ..Key::BASE
    },
    Key {
        name: "resource_affinity",
        place: Place::Ha,
        description: "Resource-affinity rule omni-<set>-raff between the machine set's VMs (Proxmox VE 9+): 'negative' keeps them on different nodes, 'positive' on one node. Placement follows it too.",
        one_of: &["negative", "positive"],
        ..Key::BASE
    },
    Key {
        name: "spread",
        place: Place::Ha,
        kind: Kind::Boolean,
        description: "Keep the machine set's VMs on different nodes (the same as resource_affinity: negative): what a highly available control plane needs (Proxmox VE 9+).",
        ..Key::BASE
    },
    // additional_nics[]:
    Key {
        name: "bridge",
        place: Place::AdditionalNics,
        description: "Bridge, e.g. vmbr1.",
        required: true,
        ..Key::BASE
    },
    Key {
        name: "vlan",
        place: Place::AdditionalNics,
        kind: Kind::Integer,
        description: "VLAN tag; 0 or unset for untagged.",
        min: Some(0),
        max: Some(4094),
        ..Key::BASE
    },
    Key {
        name: "firewall",
        place: Place::AdditionalNics,
        kind: Kind::Boolean,
        description: "Enable the Proxmox firewall on this NIC (default false).",
        ..Key::BASE
    },
    Key {
        name: "ip_pool",
        place: Place::AdditionalNics,
        origin: super::keys::Origin::Ours,
        description: "Name of a static IP pool from the provider config's ipPools for this NIC (default: DHCP).",
        text: Text::NON_EMPTY,
        ..Key::BASE
    },
    // usb_devices[]:
    Key {
        name: "mapping",
        place: Place::UsbDevices,
        description: "USB resource mapping ID.",
        required: true,
        text: Text::NON_EMPTY,
        ..Key::BASE
    },
    Key {
        name: "usb3",
        place: Place::UsbDevices,
        kind: Kind::Boolean,
        description: "Attach to the USB 3 controller.",
        ..Key::BASE
    },
    // pci_devices[]:
    Key {
        name: "mapping",
        place: Place::PciDevices,
        description: "PCI resource mapping ID, e.g. nvidia-gpu-1.",
        required: true,
        ..Key::BASE
    },
    Key {
        name: "mdev",
        place: Place::PciDevices,
        description: "Mediated device type, e.g. nvidia-180.",
        ..Key::BASE
    },
    Key {
        name: "pcie",
        place: Place::PciDevices,
        kind: Kind::Boolean,
        description: "Attach as PCIe (needs machine_type q35).",
        ..Key::BASE
    },
    Key {
        name: "primary_gpu",
        place: Place::PciDevices,
        kind: Kind::Boolean,
        description: "Use as the primary GPU (x-vga=1).",
        ..Key::BASE
    },
    Key {
        name: "rombar",
        place: Place::PciDevices,
        kind: Kind::Boolean,
        description: "Expose the device ROM (Proxmox default on).",
        ..Key::BASE
    },
    // additional_disks[]:
    Key {
        name: "disk_size",
        place: Place::AdditionalDisks,
        kind: Kind::Integer,
        description: "Size in GB.",
        required: true,
        example: ", e.g. `disk_size: 20` (GB)",
        min: Some(1),
        ..Key::BASE
    },
    Key {
        name: "storage_selector",
        place: Place::AdditionalDisks,
        kind: Kind::Cel,
        text: Text::CEL,
        description: "CEL condition choosing this disk's storage (same variables as storage_selector).",
        required: true,
        example: SELECTOR_EXAMPLE,
        ..Key::BASE
    },
    Key {
        name: "disk_ssd",
        place: Place::AdditionalDisks,
        kind: Kind::Boolean,
        description: "Present as an SSD.",
        ..Key::BASE
    },
    Key {
        name: "disk_discard",
        place: Place::AdditionalDisks,
        kind: Kind::Boolean,
        description: "Pass TRIM/discard through.",
        ..Key::BASE
    },
    Key {
        name: "disk_iothread",
        place: Place::AdditionalDisks,
        kind: Kind::Boolean,
        description: "Own IO thread.",
        ..Key::BASE
    },
    Key {
        name: "disk_cache",
        place: Place::AdditionalDisks,
        description: "Cache mode.",
        one_of: DISK_CACHES,
        ..Key::BASE
    },
    Key {
        name: "disk_aio",
        place: Place::AdditionalDisks,
        description: "Asynchronous IO mode.",
        one_of: DISK_AIOS,
        ..Key::BASE
    },
];

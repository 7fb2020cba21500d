//! A VM template as the clone rules need it: which node holds it, and where each of its drives
//! lives. The listing does not say where a template's disks are, so this is built from the
//! template's config (one read per template) together with the cluster snapshot (whether each of
//! those storages is shared, and of which type).

use super::cluster::ClusterSnapshot;
use super::vm::{BootDisk, cloud_init_drives, is_cdrom, is_drive_key};
use crate::proxmox::property::StorageId;
use crate::proxmox::types::{NodeName, VmConfig, VmResource};

/// One template, as a clone of it would see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateFacts {
    pub vmid: u32,
    pub name: Option<String>,
    pub node: NodeName,
    /// Every drive that refers to a storage volume (disks, CD-ROM images, cloud-init drives), in
    /// slot order.
    pub drives: Vec<TemplateDrive>,
    /// The storage of the disk the template boots from: where a linked clone's disks stay.
    pub boot_storage: Option<String>,
    /// The storages the listing shows on the template's node (those enabled there).
    pub node_storages: Vec<StorageId>,
}

/// A drive of a template that lives on a storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateDrive {
    /// `scsi0`, `ide2`, `efidisk0`, …
    pub slot: String,
    pub storage: String,
    /// As the listing says on the template's node; false when the storage is not listed there.
    pub shared: bool,
    /// The storage's plugin type (`lvmthin`, `nfs`, …), empty when not listed.
    pub storage_type: String,
    /// A disk a linked clone shares with the template. CD-ROM images are only referenced, and
    /// cloud-init drives and TPM state are always copied (qemu-server src/PVE/API2/Qemu.pm,
    /// `clone_vm`), so those need no linked-clone support from their storage.
    pub linked: bool,
}

impl TemplateFacts {
    /// The facts of template `vm` from its config.
    pub fn from_config(vm: &VmResource, config: &VmConfig, cluster: &ClusterSnapshot) -> Self {
        let node = cluster.node(vm.node.as_str());
        let cloud_init = cloud_init_drives(config);
        // In slot order: the config is a sorted map.
        let drives: Vec<TemplateDrive> = config
            .0
            .keys()
            .filter(|slot| is_drive_key(slot))
            .filter_map(|slot| {
                let value = config.get(slot)?;
                let volume = value.split(',').next()?.trim();
                let (storage, _) = volume.split_once(':')?;
                if storage.is_empty() || volume.starts_with('/') {
                    return None;
                }
                let cdrom = is_cdrom(&value);
                let listed = node.and_then(|n| n.storage(storage));
                Some(TemplateDrive {
                    slot: slot.clone(),
                    storage: storage.to_owned(),
                    shared: listed.is_some_and(|s| s.shared),
                    storage_type: listed.map(|s| s.storage_type.clone()).unwrap_or_default(),
                    linked: !cdrom && !cloud_init.contains(slot) && !slot.starts_with("tpmstate"),
                })
            })
            .collect();
        let boot_storage = BootDisk::of(config).and_then(|b| {
            b.volume()
                .split_once(':')
                .map(|(storage, _)| storage.to_owned())
        });
        Self {
            vmid: vm.vmid.get(),
            name: vm.name.clone(),
            node: vm.node.clone(),
            drives,
            boot_storage,
            node_storages: node
                .map(|n| n.storages.iter().map(|s| s.name.clone()).collect())
                .unwrap_or_default(),
        }
    }

    /// Whether every drive is on shared storage: Proxmox clones to another node only then.
    pub fn all_shared(&self) -> bool {
        self.drives.iter().all(|d| d.shared)
    }

    /// The storages of its drives that are not shared, each once, in slot order.
    pub fn local_storages(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for d in self.drives.iter().filter(|d| !d.shared) {
            if !out.contains(&d.storage.as_str()) {
                out.push(&d.storage);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxmox::types::ClusterResource;

    #[test]
    fn drives_with_their_storages_sharing_and_linked_role() {
        let resources: Vec<ClusterResource> = serde_json::from_value(serde_json::json!([
            {"type": "node", "node": "pve1", "status": "online"},
            {"type": "qemu", "vmid": 9000, "node": "pve1", "name": "talos", "template": 1},
            {"type": "storage", "storage": "local", "node": "pve1", "shared": 0, "plugintype": "dir"},
            {"type": "storage", "storage": "local-lvm", "node": "pve1", "shared": 0, "plugintype": "lvmthin"},
            {"type": "storage", "storage": "nfs", "node": "pve1", "shared": 1, "plugintype": "nfs"}
        ]))
        .unwrap();
        let cluster = ClusterSnapshot::from_resources(&resources);
        let ClusterResource::Vm(vm) = &resources[1] else {
            panic!("not a VM")
        };
        let config: VmConfig = serde_json::from_value(serde_json::json!({
            "scsi0": "nfs:9000/base-9000-disk-0.qcow2,size=8G",
            "ide2": "local:iso/talos.iso,media=cdrom",
            "ide0": "none,media=cdrom",
            "ide1": "local-lvm:vm-9000-cloudinit,media=cdrom",
            "efidisk0": "local-lvm:base-9000-disk-1,size=4M",
            "boot": "order=scsi0",
            "name": "talos"
        }))
        .unwrap();
        let t = TemplateFacts::from_config(vm, &config, &cluster);
        let seen: Vec<(&str, &str, bool, bool)> = t
            .drives
            .iter()
            .map(|d| (d.slot.as_str(), d.storage.as_str(), d.shared, d.linked))
            .collect();
        assert_eq!(
            seen,
            [
                ("efidisk0", "local-lvm", false, true),
                ("ide1", "local-lvm", false, false),
                ("ide2", "local", false, false),
                ("scsi0", "nfs", true, true),
            ]
        );
        assert_eq!(t.boot_storage.as_deref(), Some("nfs"));
        assert!(!t.all_shared());
        assert_eq!(t.local_storages(), ["local-lvm", "local"]);
    }
}

//! What a VM's configuration says, read back from Proxmox: which drive it boots from, which drives
//! are CD-ROMs or cloud-init drives. Placement reads it from templates, `configure_vm` from clones;
//! the rendering in `vm_config` writes the same keys.

use crate::proxmox::types::VmConfig;

/// The boot disk a clone inherited from its template: its slot (`scsi0`, `virtio0`, `sata0`, …) and
/// drive value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootDisk {
    pub slot: String,
    pub drive: String,
}

impl BootDisk {
    /// The volume part of the drive (`local-lvm:vm-104-disk-0`).
    pub fn volume(&self) -> &str {
        self.drive.split(',').next().unwrap_or(&self.drive)
    }

    /// Finds it in a config copied from a template: the first disk of `boot: order=…` that is not a
    /// CD-ROM, else the legacy `bootdisk`, else the first disk among scsi, virtio, sata and ide
    /// slots. A template made by hand may boot from `virtio0` or `sata0`; assuming `scsi0` would
    /// set a boot order without the disk and resize a disk that does not exist.
    pub fn of(config: &VmConfig) -> Option<BootDisk> {
        let disk = |slot: &str| {
            config
                .get(slot)
                .filter(|d| is_drive_key(slot) && !is_cdrom(d))
                .map(|drive| BootDisk {
                    slot: slot.to_owned(),
                    drive,
                })
        };
        let order = config.get("boot").and_then(|b| {
            b.split(',')
                .find_map(|p| p.trim().strip_prefix("order=").map(str::to_owned))
        });
        let mut ordered = order.iter().flat_map(|o| o.split(';'));
        let first_disk = || {
            let disks = config.0.keys().filter_map(|k| {
                let rank = ["scsi", "virtio", "sata", "ide"]
                    .iter()
                    .position(|p| k.starts_with(p))?;
                let n: u32 = k
                    .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                    .parse()
                    .ok()?;
                Some(((rank, n), disk(k)?))
            });
            disks.min_by_key(|(order, _)| *order).map(|(_, d)| d)
        };
        ordered
            .find_map(|slot| disk(slot.trim()))
            .or_else(|| config.get("bootdisk").and_then(|s| disk(&s)))
            .or_else(first_disk)
    }
}

pub fn is_cdrom(drive: &str) -> bool {
    let first = drive.split(',').next().unwrap_or(drive);
    first == "none" || first == "cdrom" || drive.split(',').any(|p| p.trim() == "media=cdrom")
}

/// Whether a config key is a disk or CD-ROM slot (`scsi0`, `virtio1`, `ide2`, `efidisk0`, …): the keys
/// qemu-server treats as drives (`foreach_volume`), also for a clone.
pub fn is_drive_key(key: &str) -> bool {
    const DRIVES: [&str; 6] = ["scsi", "virtio", "sata", "ide", "efidisk", "tpmstate"];
    is_numbered(key, &DRIVES)
}

/// Whether a config key is one of `kinds` followed by its slot number (`scsi0`, `net1`).
pub fn is_numbered(key: &str, kinds: &[&str]) -> bool {
    kinds.iter().any(|kind| {
        key.strip_prefix(kind)
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    })
}

/// Slots of cloud-init drives a clone inherited from its template. Proxmox regenerates such a drive
/// at every start as an ISO labelled `cidata` (NoCloud; qemu-server src/PVE/QemuServer/Cloudinit.pm
/// `commit_cloudinit_disk`), which would give Talos two `cidata` sources beside our seed: they
/// are deleted in the clone's config update. Recognised as qemu-server's `drive_is_cloudinit`
/// (src/PVE/QemuServer/Drive.pm) does: a volume named `cloudinit` or `vm-<id>-cloudinit`.
pub fn cloud_init_drives(config: &VmConfig) -> Vec<String> {
    let cloud_init = |drive: String| {
        let volume = drive.split(',').next().unwrap_or_default();
        let name = volume.rsplit([':', '/']).next().unwrap_or_default();
        let stem = ["raw", "qcow2", "vmdk"]
            .iter()
            .find_map(|ext| name.strip_suffix(&format!(".{ext}")))
            .unwrap_or(name);
        let vm = stem
            .strip_prefix("vm-")
            .and_then(|r| r.strip_suffix("-cloudinit"));
        let vm = vm.is_some_and(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()));
        volume.contains([':', '/']) && (stem == "cloudinit" || vm)
    };
    // In slot order: the config is a sorted map.
    let keys = config.0.keys();
    keys.filter(|k| is_drive_key(k) && config.get(k).is_some_and(cloud_init))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_disk_comes_from_the_templates_config() {
        let config =
            |json: serde_json::Value| -> VmConfig { serde_json::from_value(json).unwrap() };
        // qemu-server: `boot: order=` lists devices in boot order (CD-ROMs and NICs too); older
        // configs use `bootdisk`.
        let virtio = config(serde_json::json!({
            "ide2": "local:iso/talos.iso,media=cdrom",
            "virtio0": "local-lvm:vm-104-disk-0,size=8G",
            "scsi1": "local-lvm:vm-104-disk-1,size=2G",
            "boot": "order=ide2;virtio0;net0"
        }));
        let found = BootDisk::of(&virtio).unwrap();
        assert_eq!(found.slot, "virtio0");
        assert_eq!(found.volume(), "local-lvm:vm-104-disk-0");
        let legacy = config(serde_json::json!({
            "sata0": "local-lvm:vm-104-disk-0,size=8G", "bootdisk": "sata0"
        }));
        assert_eq!(BootDisk::of(&legacy).unwrap().slot, "sata0");
        let bare = config(serde_json::json!({
            "ide0": "local-lvm:vm-104-disk-1,size=8G",
            "ide2": "none,media=cdrom",
            "virtio1": "local-lvm:vm-104-disk-0,size=8G"
        }));
        assert_eq!(BootDisk::of(&bare).unwrap().slot, "virtio1");
    }

    #[test]
    fn a_templates_cloud_init_drive_is_found() {
        let config: VmConfig = serde_json::from_value(serde_json::json!({
            "ide0": "local-lvm:vm-104-cloudinit,media=cdrom",
            "ide1": "nfs:104/vm-104-cloudinit.qcow2,media=cdrom",
            "ide2": "local:iso/talos.iso,media=cdrom",
            "ide3": "local:iso/omni-seed-r.iso,media=cdrom",
            "scsi0": "local-lvm:vm-104-disk-0,size=8G",
            "description": "vm-1-cloudinit"
        }))
        .unwrap();
        assert_eq!(cloud_init_drives(&config), ["ide0", "ide1"]);
    }
}

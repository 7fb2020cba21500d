//! The VM's configuration as Proxmox parameters.
//!
//! Everything goes into one create (or one config update after a clone) so a VM costs one request
//! (see docs/performance.md). The VM is dressed in the identity `model::identity` reads back (name,
//! tags, description marker), so a restart can adopt a half-made VM and a deprovision never touches
//! someone else's.

use crate::model::identity;
use crate::model::identity::set_tag;
use crate::model::vm::{BootDisk, is_drive_key, is_numbered};
use crate::proxmox::property::{
    self, DiskOptions, HostPci, ImportVolume, IsoVolume, MacAddr, PropertyError, Slot, StorageId,
    Tag, Usb,
};
use crate::rules::provider_data::{Bios, BootMode, CloneMode, ProviderData};

/// Slot of the Talos ISO (boot mode `iso`).
pub const TALOS_CDROM: Slot = Slot::Ide(2);
/// Slot of the NoCloud seed ISO (found by its `cidata` label, so the slot does not matter to Talos).
pub const SEED_CDROM: Slot = Slot::Ide(3);

/// Who the VM is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmIdentity<'a> {
    pub request_id: &'a str,
    pub set_id: Option<&'a str>,
    pub provider_id: &'a str,
}

/// Where and with what the VM is made; all of it decided by earlier steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmTarget {
    pub vmid: u32,
    /// Storage for the boot disk (and the EFI disk).
    pub storage: StorageId,
    /// One storage per `additional_disks` entry, in order.
    pub additional_disk_storages: Vec<StorageId>,
    pub smbios_uuid: uuid::Uuid,
    /// The Talos ISO (boot mode `iso`).
    pub boot_iso: Option<IsoVolume>,
    /// The Talos disk image the boot disk is made from (boot mode `image`).
    pub boot_image: Option<ImportVolume>,
    pub seed_iso: IsoVolume,
    /// The MAC of each NIC (`net0` first), when the network config needs to know them (static
    /// addresses); empty: Proxmox chooses.
    pub macs: Vec<MacAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("cannot build the VM's tags: {0}")]
    Tag(#[from] PropertyError),
    #[error(
        "{expected} additional disk(s) are configured but {got} storage(s) were chosen for them"
    )]
    DiskStorageCount { expected: usize, got: usize },
    #[error("boot mode iso needs the Talos ISO volume")]
    MissingBootIso,
    #[error("boot mode image needs the Talos disk image volume")]
    MissingBootImage,
    #[error("too many {0} devices for Proxmox")]
    TooMany(&'static str),
}

fn tags(data: &ProviderData, identity: &VmIdentity<'_>) -> Result<String, RenderError> {
    let mut all = Vec::new();
    if let Some(set) = identity.set_id {
        all.push(Tag::new(set_tag(set))?);
    }
    all.push(Tag::new(identity::provider_tag(identity.provider_id))?);
    // Skipped, not an error, for an ID Proxmox would not take as a tag: the marker still identifies
    // the VM, only the one-listing ownership check is lost.
    all.extend(identity::request_tag(identity.request_id));
    all.extend(data.tags.iter().map(|t| t.0.clone()));
    Ok(property::tags(&all))
}

/// The key of the `i`th slot of a kind (`Slot::Net`, `Slot::Scsi`, …), if Proxmox has that many.
fn slot(kind: fn(u8) -> Slot, i: usize, what: &'static str) -> Result<String, RenderError> {
    let slot = u8::try_from(i).ok().map(kind).and_then(Slot::checked);
    slot.map(|s| s.to_string())
        .ok_or(RenderError::TooMany(what))
}

/// Settings shared by create and post-clone config: everything but the boot disk, the Talos ISO and
/// the things only a create takes (`vmid`, `name`, `pool`).
fn common(
    data: &ProviderData,
    identity: &VmIdentity<'_>,
    target: &VmTarget,
    out: &mut Vec<(String, String)>,
) -> Result<(), RenderError> {
    let marker = identity::description_marker(identity.provider_id, identity.request_id);
    // The SMBIOS UUID, which Talos reports as its machine UUID.
    let uuid = format!("uuid={}", target.smbios_uuid.hyphenated());
    let params = [
        ("description", Some(marker)),
        ("tags", Some(tags(data, identity)?)),
        ("ostype", Some("l26".into())),
        ("cores", Some(data.cores.to_string())),
        ("sockets", Some(data.sockets.to_string())),
        ("memory", Some(data.memory_mb.to_string())),
        ("balloon", (data.balloon == Some(false)).then(|| "0".into())),
        ("cpu", Some(data.cpu_type.to_string())),
        ("machine", data.machine_type.map(|m| m.as_str().into())),
        ("bios", Some(data.bios.as_str().into())),
        ("scsihw", Some("virtio-scsi-single".into())),
        ("agent", Some("enabled=1".into())),
        ("onboot", Some("1".into())),
        ("serial0", Some("socket".into())),
        ("vga", data.vga.as_ref().map(|v| v.to_string())),
        ("numa", data.numa.then(|| "1".into())),
        ("hugepages", data.hugepages.map(|h| h.render())),
        ("smbios1", Some(uuid)),
    ];
    for (key, value) in params {
        out.extend(value.map(|v| (key.to_owned(), v)));
    }
    devices(data, target, out)?;
    out.push((SEED_CDROM.to_string(), property::cdrom(&target.seed_iso)));
    Ok(())
}

/// The NICs, additional disks and passed-through devices, each in the next free slot of its kind.
fn devices(
    data: &ProviderData,
    target: &VmTarget,
    out: &mut Vec<(String, String)>,
) -> Result<(), RenderError> {
    let first = (&data.network_bridge, data.network_firewall, data.vlan);
    let more = data
        .additional_nics
        .iter()
        .map(|n| (&n.bridge, n.firewall, n.vlan));
    for (i, (bridge, firewall, vlan)) in std::iter::once(first).chain(more).enumerate() {
        out.push((
            slot(Slot::Net, i, "network")?,
            property::nic(bridge, firewall, vlan, target.macs.get(i).copied()),
        ));
    }
    if data.additional_disks.len() != target.additional_disk_storages.len() {
        return Err(RenderError::DiskStorageCount {
            expected: data.additional_disks.len(),
            got: target.additional_disk_storages.len(),
        });
    }
    for (i, (disk, storage)) in data
        .additional_disks
        .iter()
        .zip(&target.additional_disk_storages)
        .enumerate()
    {
        let options = DiskOptions {
            ssd: disk.disk_ssd,
            discard: disk.disk_discard,
            iothread: disk.disk_iothread,
            cache: disk.disk_cache,
            aio: disk.disk_aio,
        };
        let new = property::new_disk(storage, disk.size_gb, options);
        out.push((slot(Slot::Scsi, i + 1, "disk")?, new));
    }
    for (i, pci) in data.pci_devices.iter().enumerate() {
        out.push((slot(Slot::HostPci, i, "PCI")?, HostPci::render(pci)));
    }
    for (i, usb) in data.usb_devices.iter().enumerate() {
        out.push((slot(Slot::Usb, i, "USB")?, Usb::render(usb)));
    }
    Ok(())
}

/// Parameters for `POST /nodes/{node}/qemu` (boot mode `iso`).
pub fn render(
    data: &ProviderData,
    identity: &VmIdentity<'_>,
    target: &VmTarget,
) -> Result<Vec<(String, String)>, RenderError> {
    let mut out = vec![
        ("vmid".to_string(), target.vmid.to_string()),
        ("name".to_string(), identity.request_id.to_string()),
    ];
    out.extend(data.pool.iter().map(|p| ("pool".into(), p.to_string())));
    common(data, identity, target, &mut out)?;
    // `image`: the disk is the Talos disk image (grown to `disk_size` by configure_vm), nothing to
    // install; `iso`: an empty disk the ISO installs Talos onto.
    let (storage, options) = (&target.storage, data.disk());
    let (disk, talos_cdrom) = match data.boot {
        BootMode::Image => {
            let source = target
                .boot_image
                .as_ref()
                .ok_or(RenderError::MissingBootImage)?;
            (property::imported_disk(storage, source, options), None)
        }
        BootMode::Iso | BootMode::Clone => {
            let iso = target.boot_iso.clone().ok_or(RenderError::MissingBootIso)?;
            (
                property::new_disk(storage, data.disk_size_gb, options),
                Some(iso),
            )
        }
    };
    out.push(("scsi0".into(), disk));
    if data.bios == Bios::Ovmf {
        out.push(("efidisk0".into(), property::efi_disk(&target.storage)));
    }
    let order = match talos_cdrom {
        Some(iso) => {
            out.push((TALOS_CDROM.to_string(), property::cdrom(&iso)));
            // An empty disk fails over to the ISO; once Talos is installed the disk boots first.
            vec![Slot::Scsi(0), TALOS_CDROM, Slot::Net(0)]
        }
        None => vec![Slot::Scsi(0), Slot::Net(0)],
    };
    out.push(("boot".into(), property::boot_order(&order)));
    Ok(out)
}

/// Parameters for `POST /nodes/{node}/qemu/{vmid}/config` after cloning the template (boot mode
/// `clone`). The name and pool go with the clone call; the boot disk keeps the template's volume
/// (`cloned_boot_volume`, from the clone's config, gets the class's disk options when given) and is
/// grown to `disk_size` after the write. An EFI disk is expected to come with an OVMF template.
pub fn render_after_clone(
    data: &ProviderData,
    identity: &VmIdentity<'_>,
    target: &VmTarget,
    cloned_boot: Option<&BootDisk>,
) -> Result<Vec<(String, String)>, RenderError> {
    let mut out = Vec::new();
    common(data, identity, target, &mut out)?;
    let slot = cloned_boot.map_or("scsi0", |b| b.slot.as_str());
    if let Some(boot) = cloned_boot
        && data.disk() != DiskOptions::default()
        && let Ok(disk) = property::existing_disk(boot.volume(), data.disk())
    {
        out.push((boot.slot.clone(), disk));
    }
    out.push(("boot".into(), format!("order={slot};{}", Slot::Net(0))));
    Ok(out)
}

/// The first `additional_disks` entry whose slot (`scsi1`, `scsi2`, … in order) a template already
/// fills, as (index, slot), given the template's drive slots. After a clone the config update
/// names that slot with `<storage>:<size>`; the VM already has a drive there, so the update keeps
/// it ([`without_repeated_allocations`], which makes a replayed update safe) and the class's disk
/// is never made. Refused before the clone instead.
pub fn additional_disk_clash<'a>(
    data: &ProviderData,
    template_slots: &[&'a str],
) -> Option<(usize, &'a str)> {
    (0..data.additional_disks.len()).find_map(|i| {
        let wanted = Slot::Scsi(u8::try_from(i + 1).ok()?).to_string();
        template_slots
            .iter()
            .find(|s| **s == wanted)
            .map(|s| (i, *s))
    })
}

/// Whether a config value makes Proxmox allocate something new each time it is applied: a drive given
/// as `<storage>:<size in GiB>` (a new volume; qemu-server src/PVE/API2/Qemu.pm, `update_vm` →
/// `create_disks`), or a NIC without a MAC (PVE generates a random one). Such an update must never
/// be replayed blindly.
pub fn allocates(key: &str, value: &str) -> bool {
    let first = value.split(',').next().unwrap_or(value).trim();
    if is_numbered(key, &["net"]) {
        return !first.contains('=') && !value.contains("macaddr=");
    }
    if !is_drive_key(key) {
        return false;
    }
    first.split_once(':').is_some_and(|(storage, size)| {
        !storage.is_empty()
            && !size.is_empty()
            && size.chars().all(|c| c.is_ascii_digit() || c == '.')
    })
}

/// Makes a config update safe to apply a second time (a step retried after an answer that was lost
/// on the way back): a drive slot the VM already has keeps its volume instead of allocating another
/// one, and a NIC the VM already has keeps its MAC. Everything else is an absolute value and is
/// sent as is.
pub fn without_repeated_allocations(
    params: Vec<(String, String)>,
    current: &crate::proxmox::types::VmConfig,
) -> Vec<(String, String)> {
    params
        .into_iter()
        .filter_map(|(key, value)| {
            if !allocates(&key, &value) {
                return Some((key, value));
            }
            let Some(existing) = current.get(&key) else {
                // Nothing there yet: this is the first allocation.
                return Some((key, value));
            };
            if is_drive_key(&key) {
                // Already allocated by the first attempt: keep it.
                return None;
            }
            let Some((_, mac)) = existing.split(',').next().and_then(|m| m.split_once('=')) else {
                return Some((key, value));
            };
            let with_mac = match value.split_once(',') {
                Some((model, rest)) if !rest.is_empty() => format!("{model}={mac},{rest}"),
                Some((model, _)) => format!("{model}={mac}"),
                None => format!("{value}={mac}"),
            };
            Some((key, with_mac))
        })
        .collect()
}

/// Parameters for the clone call itself. A linked clone takes neither `storage` nor `format`
/// (qemu-server src/PVE/API2/Qemu.pm `clone_vm` refuses both with `full` = 0): its disks stay on the
/// template's storage, which placement recorded as `storage`.
pub fn clone_params(
    data: &ProviderData,
    identity: &VmIdentity<'_>,
    newid: u32,
    node: &str,
    storage: &StorageId,
    mode: CloneMode,
) -> Vec<(String, String)> {
    // The clone call takes no tags, but it takes a description: the marker goes on at clone time, so
    // a crash (or a clone task outliving our wait) before `configure_vm` leaves a VM we can still
    // prove is ours from its config.
    let full = u8::from(mode == CloneMode::Full);
    let mut out = vec![
        ("newid".to_string(), newid.to_string()),
        ("name".to_string(), identity.request_id.to_string()),
        (
            "description".to_string(),
            identity::description_marker(identity.provider_id, identity.request_id),
        ),
        ("target".to_string(), node.to_string()),
        ("full".to_string(), full.to_string()),
    ];
    if mode == CloneMode::Full {
        out.push(("storage".to_string(), storage.to_string()));
    }
    out.extend(data.pool.iter().map(|p| ("pool".into(), p.to_string())));
    out
}

#[cfg(test)]
mod tests;

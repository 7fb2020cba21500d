//! The VM's configuration as Proxmox parameters, and the identity that lets us find it again.
//!
//! Everything goes into one create (or one config update after a clone) so a VM costs one request
//! (see docs/performance.md). The identity is threefold so a restart can adopt a half-made VM and a deprovision
//! never touches someone else's: the name is the request ID, the tags carry the machine set and our
//! provider ID, and the description carries a marker naming both the request and the provider.
//!
//! The tags also carry the request itself (`omni-request.<id>`), so that a deprovision can tell a VM
//! is ours from one `/cluster/resources` listing (name + tags) without reading its config: that is
//! one request saved on every teardown. The description marker stays the authority whenever the
//! listing alone is not conclusive (VMs made before the request tag existed, renamed or retagged VMs).

use crate::pipeline::provider_data::{Bios, ProviderData};
use crate::proxmox::property::{
    self, Cdrom, DiskOptions, EfiDisk, ExistingDisk, HostPci, IsoVolume, MacAddr, NewDisk, Nic,
    PropertyError, Slot, Smbios1, StorageId, Tag, Usb,
};
use crate::proxmox::types::VmResource;
use crate::rules::placement::set_tag;

/// The tag marking every VM this provider made: `omni-provider.<provider id>`.
pub fn provider_tag(provider_id: &str) -> String {
    format!("omni-provider.{provider_id}")
}

/// Whether `tags` carry `wanted`. Proxmox lowercases tags by default (datacenter.cfg `tag-style`,
/// `case-sensitive` off), so a provider ID or request ID with capitals comes back lowercased: every
/// tag comparison of ours ignores case, and goes through here.
pub fn has_tag(tags: &[&str], wanted: &str) -> bool {
    tags.iter().any(|t| t.eq_ignore_ascii_case(wanted))
}

/// The one listing-level answer to "does this VM look like ours?", used by adoption (`create_vm`),
/// teardown (`deprovision`) and the `orphans` search alike: not a template, carrying our provider
/// tag (any case), and, when `request_id` is given, named after that request. A VM whose listing
/// entry has no name yet (pvestatd has not reported it) does not match here; callers that hold a
/// recorded VMID read its config instead (see [`ListingVerdict::NeedsConfig`]).
pub fn listed_as_ours(vm: &VmResource, request_id: Option<&str>, provider_id: &str) -> bool {
    !vm.template
        && has_tag(&vm.tag_list(), &provider_tag(provider_id))
        && request_id.is_none_or(|id| vm.name.as_deref() == Some(id))
}

/// The tag naming the request a VM was made for: `omni-request.<request id>`. `None` when the ID is not
/// a valid Proxmox tag (Omni's IDs always are; the VM then simply goes without it).
pub fn request_tag(request_id: &str) -> Option<String> {
    if request_id.is_empty() {
        return None;
    }
    Tag::new(format!("{REQUEST_TAG_PREFIX}{request_id}"))
        .ok()
        .map(|t| t.as_str().to_owned())
}

const REQUEST_TAG_PREFIX: &str = "omni-request.";

/// The request a VM's tags name (`omni-request.<id>`), if any.
pub fn tagged_request<'a>(tags: &[&'a str]) -> Option<&'a str> {
    tags.iter().find_map(|t| {
        t.get(..REQUEST_TAG_PREFIX.len())
            .filter(|p| p.eq_ignore_ascii_case(REQUEST_TAG_PREFIX))
            .map(|_| &t[REQUEST_TAG_PREFIX.len()..])
            .filter(|id| !id.is_empty())
    })
}

/// Slot of the Talos ISO (boot mode `iso`).
pub const TALOS_CDROM: Slot = Slot::Ide(2);
/// Slot of the NoCloud seed ISO (found by its `cidata` label, so the slot does not matter to Talos).
pub const SEED_CDROM: Slot = Slot::Ide(3);

const MARKER_HEADER: &str =
    "Managed by the Omni infrastructure provider for Proxmox VE. Do not edit the two lines below.";
const MARKER_PROVIDER: &str = "omni-provider-id";
const MARKER_REQUEST: &str = "omni-machine-request";

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
    pub seed_iso: IsoVolume,
    /// MAC of the first NIC, when the network config needs to know it (static addresses).
    pub mac: Option<MacAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("cannot build the VM's tags: {0}")]
    Tag(PropertyError),
    #[error(
        "{expected} additional disk(s) are configured but {got} storage(s) were chosen for them"
    )]
    DiskStorageCount { expected: usize, got: usize },
    #[error("boot mode iso needs the Talos ISO volume")]
    MissingBootIso,
    #[error("too many {0} devices for Proxmox")]
    TooMany(&'static str),
}

/// The description written on the VM: a sentence for people, then the machine-readable marker.
pub fn description_marker(identity: &VmIdentity<'_>) -> String {
    format!(
        "{MARKER_HEADER}\n{MARKER_PROVIDER}: {}\n{MARKER_REQUEST}: {}\n",
        identity.provider_id, identity.request_id
    )
}

/// The marker read back from a description (Proxmox returns it decoded).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Marker {
    pub provider_id: Option<String>,
    pub request_id: Option<String>,
}

pub fn parse_marker(description: &str) -> Marker {
    let mut marker = Marker::default();
    for line in description.lines() {
        if let Some((key, value)) = line.split_once(':') {
            let value = value.trim();
            match key.trim() {
                MARKER_PROVIDER if marker.provider_id.is_none() => {
                    marker.provider_id = Some(value.to_string())
                }
                MARKER_REQUEST if marker.request_id.is_none() => {
                    marker.request_id = Some(value.to_string())
                }
                _ => {}
            }
        }
    }
    marker
}

/// Whether a VM belongs to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Our marker names this request and provider, and the name matches.
    Ours,
    /// No marker, but named after the request and tagged with a machine-request set, as the official
    /// provider makes VMs: safe to delete when the provider state recorded this VMID, not to adopt.
    Legacy,
    NotOurs(String),
}

/// Decides ownership from what `/cluster/resources` and the VM config show.
pub fn check_ownership(
    name: &str,
    tags: &[String],
    description: &str,
    request_id: &str,
    provider_id: &str,
) -> Ownership {
    let marker = parse_marker(description);
    if marker.provider_id.is_some() || marker.request_id.is_some() {
        if marker.provider_id.as_deref() != Some(provider_id) {
            return Ownership::NotOurs(format!(
                "its description marker names provider {:?}, not {provider_id:?}",
                marker.provider_id.unwrap_or_default()
            ));
        }
        if marker.request_id.as_deref() != Some(request_id) {
            return Ownership::NotOurs(format!(
                "its description marker names request {:?}, not {request_id:?}",
                marker.request_id.unwrap_or_default()
            ));
        }
        if name != request_id {
            return Ownership::NotOurs(format!("it is named {name:?}, not {request_id:?}"));
        }
        return Ownership::Ours;
    }
    if name == request_id
        && tags
            .iter()
            .any(|t| t.to_ascii_lowercase().starts_with("machine-request."))
    {
        return Ownership::Legacy;
    }
    Ownership::NotOurs(format!(
        "it has no ownership marker and is named {name:?}, not {request_id:?}"
    ))
}

/// Whether the `/cluster/resources` listing alone proves the VM is ours: named after the request and
/// tagged with both our provider tag and the request tag. Anything less needs the config's marker.
pub fn owned_by_listing(
    name: Option<&str>,
    tags: &[&str],
    request_id: &str,
    provider_id: &str,
) -> bool {
    let Some(request) = request_tag(request_id) else {
        return false;
    };
    name == Some(request_id) && has_tag(tags, &provider_tag(provider_id)) && has_tag(tags, &request)
}

/// What the `/cluster/resources` listing (name + tags) says about a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListingVerdict {
    /// Named after the request, with our provider tag and the request tag: ours, no config read.
    Ours,
    /// Not named after the request: neither our marker nor the official provider's naming can make
    /// it ours, so no config read either.
    NotOurs(String),
    /// Named after the request but not tagged conclusively: the config's marker decides.
    NeedsConfig,
}

/// Ownership as far as the listing can decide it (see [`ListingVerdict`]).
pub fn listing_ownership(
    name: Option<&str>,
    tags: &[&str],
    request_id: &str,
    provider_id: &str,
) -> ListingVerdict {
    if owned_by_listing(name, tags, request_id, provider_id) {
        return ListingVerdict::Ours;
    }
    match name {
        Some(n) if n == request_id => ListingVerdict::NeedsConfig,
        Some(n) => ListingVerdict::NotOurs(format!("it is named {n:?}, not {request_id:?}")),
        // No name: pvestatd has not reported the VM yet (created seconds ago, or its node has been
        // away for minutes and its RRD entry expired). The listing cannot tell; the config can.
        None => ListingVerdict::NeedsConfig,
    }
}

/// The `uuid=` of an `smbios1` value (`uuid=…,serial=…`).
pub fn smbios_uuid(smbios1: &str) -> Option<&str> {
    smbios1
        .split(',')
        .find_map(|part| part.trim().strip_prefix("uuid="))
        .map(str::trim)
}

/// [`check_ownership`] plus the SMBIOS UUID, for when the config has been read: when the caller
/// recorded the UUID it gave the VM, a VM with a different (or no) UUID is not the one we made,
/// whatever its name and description say (a VM cloned from ours by hand carries our marker too).
pub fn check_ownership_with_uuid(
    name: &str,
    tags: &[String],
    description: &str,
    smbios1: Option<&str>,
    expected_uuid: Option<&str>,
    request_id: &str,
    provider_id: &str,
) -> Ownership {
    let verdict = check_ownership(name, tags, description, request_id, provider_id);
    let Some(expected) = expected_uuid.map(str::trim).filter(|u| !u.is_empty()) else {
        return verdict;
    };
    if matches!(verdict, Ownership::NotOurs(_)) {
        return verdict;
    }
    match smbios1.and_then(smbios_uuid) {
        Some(actual) if actual.eq_ignore_ascii_case(expected) => verdict,
        Some(actual) => Ownership::NotOurs(format!(
            "its SMBIOS UUID is {actual}, not the recorded {expected}"
        )),
        None => Ownership::NotOurs(format!(
            "it has no SMBIOS UUID, but {expected} was recorded"
        )),
    }
}

fn tags(data: &ProviderData, identity: &VmIdentity<'_>) -> Result<String, RenderError> {
    let mut all = Vec::new();
    if let Some(set) = identity.set_id {
        all.push(Tag::new(set_tag(set)).map_err(RenderError::Tag)?);
    }
    all.push(Tag::new(provider_tag(identity.provider_id)).map_err(RenderError::Tag)?);
    // Skipped, not an error, for an ID Proxmox would not take as a tag: the marker still identifies
    // the VM, only the one-listing ownership check is lost.
    if let Some(request) = request_tag(identity.request_id).and_then(|t| Tag::new(t).ok()) {
        all.push(request);
    }
    all.extend(data.tags.iter().cloned());
    Ok(property::tags(&all))
}

fn slot(s: Slot, what: &'static str) -> Result<String, RenderError> {
    s.checked()
        .map(|s| s.to_string())
        .ok_or(RenderError::TooMany(what))
}

fn index(i: usize, what: &'static str) -> Result<u8, RenderError> {
    u8::try_from(i).map_err(|_| RenderError::TooMany(what))
}

/// Settings shared by create and post-clone config: everything but the boot disk, the Talos ISO and
/// the things only a create takes (`vmid`, `name`, `pool`).
fn common(
    data: &ProviderData,
    identity: &VmIdentity<'_>,
    target: &VmTarget,
    out: &mut Vec<(String, String)>,
) -> Result<(), RenderError> {
    let mut push = |k: &str, v: String| out.push((k.to_string(), v));
    push("description", description_marker(identity));
    push("tags", tags(data, identity)?);
    push("ostype", "l26".into());
    push("cores", data.cores.to_string());
    push("sockets", data.sockets.to_string());
    push("memory", data.memory_mb.to_string());
    if data.balloon == Some(false) {
        push("balloon", "0".into());
    }
    push("cpu", property::cpu(&data.cpu_type));
    if let Some(machine) = data.machine_type {
        push("machine", machine.as_str().into());
    }
    push("bios", data.bios.as_str().into());
    push("scsihw", "virtio-scsi-single".into());
    push("agent", property::agent_enabled());
    push("onboot", "1".into());
    push("serial0", "socket".into());
    if let Some(vga) = data.vga {
        push("vga", vga.render().into());
    }
    if data.numa {
        push("numa", property::numa(true));
    }
    if let Some(h) = data.hugepages {
        push("hugepages", h.render().into());
    }
    push(
        "smbios1",
        Smbios1 {
            uuid: target.smbios_uuid,
        }
        .render(),
    );

    let net0 = Nic {
        bridge: data.network_bridge.clone(),
        firewall: data.network_firewall,
        vlan: data.vlan,
        mac: target.mac,
    };
    out.push(("net0".into(), net0.render()));
    for (i, nic) in data.additional_nics.iter().enumerate() {
        let nic = Nic {
            bridge: nic.bridge.clone(),
            firewall: nic.firewall,
            vlan: nic.vlan,
            mac: None,
        };
        out.push((
            slot(Slot::Net(index(i + 1, "network")?), "network")?,
            nic.render(),
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
        let new = NewDisk {
            storage: storage.clone(),
            size_gb: disk.size_gb,
            options: disk.options,
        };
        out.push((
            slot(Slot::Scsi(index(i + 1, "disk")?), "disk")?,
            new.render(),
        ));
    }
    for (i, pci) in data.pci_devices.iter().enumerate() {
        out.push((
            slot(Slot::HostPci(index(i, "PCI")?), "PCI")?,
            HostPci::render(pci),
        ));
    }
    for (i, usb) in data.usb_devices.iter().enumerate() {
        out.push((slot(Slot::Usb(index(i, "USB")?), "USB")?, Usb::render(usb)));
    }
    out.push((
        SEED_CDROM.to_string(),
        Cdrom::Iso(target.seed_iso.clone()).render(),
    ));
    Ok(())
}

/// Parameters for `POST /nodes/{node}/qemu` (boot mode `iso`).
pub fn render(
    data: &ProviderData,
    identity: &VmIdentity<'_>,
    target: &VmTarget,
) -> Result<Vec<(String, String)>, RenderError> {
    let boot_iso = target.boot_iso.clone().ok_or(RenderError::MissingBootIso)?;
    let mut out = vec![
        ("vmid".to_string(), target.vmid.to_string()),
        ("name".to_string(), identity.request_id.to_string()),
    ];
    if let Some(pool) = &data.pool {
        out.push(("pool".into(), pool.to_string()));
    }
    common(data, identity, target, &mut out)?;
    let boot_disk = NewDisk {
        storage: target.storage.clone(),
        size_gb: data.disk_size_gb,
        options: data.disk,
    };
    out.push(("scsi0".into(), boot_disk.render()));
    if data.bios == Bios::Ovmf {
        out.push((
            "efidisk0".into(),
            EfiDisk {
                storage: target.storage.clone(),
            }
            .render(),
        ));
    }
    out.push((TALOS_CDROM.to_string(), Cdrom::Iso(boot_iso).render()));
    // An empty disk fails over to the ISO; once Talos is installed the disk boots first.
    out.push((
        "boot".into(),
        property::boot_order(&[Slot::Scsi(0), TALOS_CDROM, Slot::Net(0)]),
    ));
    Ok(out)
}

/// Parameters for `POST /nodes/{node}/qemu/{vmid}/config` after cloning the template (boot mode
/// `clone`). The name and pool go with the clone call; the boot disk keeps the template's volume
/// (`cloned_boot_volume`, from the clone's config, gets the class's disk options when given) and is
/// grown with [`boot_disk_resize`]. An EFI disk is expected to come with an OVMF template.
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
        && data.disk != DiskOptions::default()
        && let Ok(disk) = ExistingDisk::new(boot.volume(), data.disk)
    {
        out.push((boot.slot.clone(), disk.render()));
    }
    out.push(("boot".into(), format!("order={slot};{}", Slot::Net(0))));
    Ok(out)
}

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
    pub fn of(config: &crate::proxmox::types::VmConfig) -> Option<BootDisk> {
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
        if let Some(found) = order
            .iter()
            .flat_map(|o| o.split(';'))
            .find_map(|slot| disk(slot.trim()))
        {
            return Some(found);
        }
        if let Some(found) = config.get("bootdisk").and_then(|s| disk(&s)) {
            return Some(found);
        }
        let mut slots: Vec<(usize, u32, &String)> = config
            .0
            .keys()
            .filter_map(|k| {
                let rank = ["scsi", "virtio", "sata", "ide"]
                    .iter()
                    .position(|p| k.starts_with(p))?;
                let n: u32 = k
                    .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                    .parse()
                    .ok()?;
                Some((rank, n, k))
            })
            .collect();
        slots.sort();
        slots.into_iter().find_map(|(_, _, k)| disk(k))
    }
}

fn is_cdrom(drive: &str) -> bool {
    let first = drive.split(',').next().unwrap_or(drive);
    first == "none" || first == "cdrom" || drive.split(',').any(|p| p.trim() == "media=cdrom")
}

/// Whether a config value makes Proxmox allocate something new each time it is applied: a drive given
/// as `<storage>:<size in GiB>` (a new volume; qemu-server src/PVE/API2/Qemu.pm, `update_vm` →
/// `create_disks`), or a NIC without a MAC (PVE generates a random one). Such an update must never
/// be replayed blindly.
pub fn allocates(key: &str, value: &str) -> bool {
    let first = value.split(',').next().unwrap_or(value).trim();
    if is_nic_key(key) {
        return !first.contains('=') && !value.contains("macaddr=");
    }
    if !is_drive_key(key) {
        return false;
    }
    match first.split_once(':') {
        Some((storage, size)) => {
            !storage.is_empty()
                && !size.is_empty()
                && size.chars().all(|c| c.is_ascii_digit() || c == '.')
        }
        None => false,
    }
}

fn is_nic_key(key: &str) -> bool {
    key.strip_prefix("net")
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

fn is_drive_key(key: &str) -> bool {
    ["scsi", "virtio", "sata", "ide", "efidisk", "tpmstate"]
        .iter()
        .any(|prefix| {
            key.strip_prefix(prefix)
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
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
            let mac = existing
                .split(',')
                .next()
                .and_then(|model| model.split_once('='))
                .map(|(_, mac)| mac.to_owned());
            match mac {
                Some(mac) => {
                    let (model, rest) = value.split_once(',').unwrap_or((value.as_str(), ""));
                    let with_mac = if rest.is_empty() {
                        format!("{model}={mac}")
                    } else {
                        format!("{model}={mac},{rest}")
                    };
                    Some((key, with_mac))
                }
                None => Some((key, value)),
            }
        })
        .collect()
}

/// Slots of cloud-init drives a clone inherited from its template. Proxmox regenerates such a drive
/// at every start as an ISO labelled `cidata` (NoCloud; qemu-server src/PVE/QemuServer/Cloudinit.pm
/// `commit_cloudinit_disk`), which would give Talos two `cidata` sources beside our seed: they
/// are deleted in the clone's config update. Recognised as qemu-server's `drive_is_cloudinit`
/// (src/PVE/QemuServer/Drive.pm) does: a volume named `cloudinit` or `vm-<id>-cloudinit`.
pub fn cloud_init_drives(config: &crate::proxmox::types::VmConfig) -> Vec<String> {
    let mut slots: Vec<String> = config
        .0
        .keys()
        .filter(|k| is_drive_key(k))
        .filter(|k| {
            config.get(k).is_some_and(|drive| {
                let volume = drive.split(',').next().unwrap_or_default();
                let name = volume.rsplit([':', '/']).next().unwrap_or_default();
                let stem = ["raw", "qcow2", "vmdk"]
                    .iter()
                    .find_map(|ext| name.strip_suffix(&format!(".{ext}")))
                    .unwrap_or(name);
                volume.contains([':', '/'])
                    && (stem == "cloudinit"
                        || stem
                            .strip_prefix("vm-")
                            .and_then(|rest| rest.strip_suffix("-cloudinit"))
                            .is_some_and(|id| {
                                !id.is_empty() && id.chars().all(|c| c.is_ascii_digit())
                            }))
            })
        })
        .cloned()
        .collect();
    slots.sort();
    slots
}

/// `PUT /nodes/{node}/qemu/{vmid}/resize` parameters growing the cloned boot disk (in `slot`) to
/// `disk_size`.
pub fn boot_disk_resize(data: &ProviderData, slot: &str) -> [(String, String); 2] {
    [
        ("disk".into(), slot.to_owned()),
        ("size".into(), format!("{}G", data.disk_size_gb)),
    ]
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
    mode: super::provider_data::CloneMode,
) -> Vec<(String, String)> {
    // The clone call takes no tags, but it takes a description: the marker goes on at clone time, so
    // a crash (or a clone task outliving our wait) before `configure_vm` leaves a VM we can still
    // prove is ours from its config.
    let mut out = vec![
        ("newid".to_string(), newid.to_string()),
        ("name".to_string(), identity.request_id.to_string()),
        ("description".to_string(), description_marker(identity)),
        ("target".to_string(), node.to_string()),
    ];
    match mode {
        super::provider_data::CloneMode::Full => {
            out.push(("full".to_string(), "1".to_string()));
            out.push(("storage".to_string(), storage.to_string()));
        }
        super::provider_data::CloneMode::Linked => out.push(("full".to_string(), "0".to_string())),
    }
    if let Some(pool) = &data.pool {
        out.push(("pool".into(), pool.to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::provider_data::ProviderDataSchema;
    use proptest::prelude::*;
    use serde_json::Map;

    fn data(extra: &str) -> ProviderData {
        let yaml =
            format!("cores: 2\nmemory: 4096\ndisk_size: 20\nstorage_selector: 'true'\n{extra}");
        ProviderDataSchema::new()
            .unwrap()
            .resolve(&yaml, None, &Map::new())
            .unwrap()
    }

    fn identity() -> VmIdentity<'static> {
        VmIdentity {
            request_id: "req-1",
            set_id: Some("workers"),
            provider_id: "proxmox",
        }
    }

    fn target(disks: usize) -> VmTarget {
        VmTarget {
            vmid: 104,
            storage: StorageId::new("local-lvm").unwrap(),
            additional_disk_storages: vec![StorageId::new("ceph").unwrap(); disks],
            smbios_uuid: uuid::Uuid::nil(),
            boot_iso: Some(IsoVolume::parse("local:iso/talos.iso").unwrap()),
            seed_iso: IsoVolume::parse("local:iso/omni-seed-req-1.iso").unwrap(),
            mac: None,
        }
    }

    fn get<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
        params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn minimal_create_request() {
        let params = render(&data(""), &identity(), &target(0)).unwrap();
        let expect = [
            ("vmid", "104"),
            ("name", "req-1"),
            (
                "tags",
                "machine-request.workers;omni-provider.proxmox;omni-request.req-1",
            ),
            ("cores", "2"),
            ("sockets", "1"),
            ("memory", "4096"),
            ("cpu", "x86-64-v2-AES"),
            ("bios", "seabios"),
            ("scsihw", "virtio-scsi-single"),
            ("scsi0", "local-lvm:20"),
            ("net0", "virtio,bridge=vmbr0,firewall=1"),
            ("agent", "enabled=1"),
            ("onboot", "1"),
            ("serial0", "socket"),
            ("ide2", "local:iso/talos.iso,media=cdrom"),
            ("ide3", "local:iso/omni-seed-req-1.iso,media=cdrom"),
            ("boot", "order=scsi0;ide2;net0"),
            ("smbios1", "uuid=00000000-0000-0000-0000-000000000000"),
        ];
        for (k, v) in expect {
            assert_eq!(get(&params, k), Some(v), "{k}");
        }
        for absent in [
            "balloon",
            "machine",
            "efidisk0",
            "pool",
            "numa",
            "hugepages",
            "vga",
            "net1",
            "scsi1",
        ] {
            assert_eq!(get(&params, absent), None, "{absent}");
        }
        let mut keys: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
        let n = keys.len();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), n, "duplicate keys");
        let marker = parse_marker(get(&params, "description").unwrap());
        assert_eq!(
            marker,
            Marker {
                provider_id: Some("proxmox".into()),
                request_id: Some("req-1".into())
            }
        );
    }

    #[test]
    fn full_create_request() {
        let d = data(
            "balloon: false\nmachine_type: q35\nbios: ovmf\nnuma: true\nhugepages: 2MB\nvga: serial0\npool: omni\ntags: [talos]\n\
             vlan: 7\nnetwork_firewall: false\ndisk_ssd: true\ndisk_discard: true\n\
             additional_nics: [{bridge: vmbr1, vlan: 9}]\nadditional_disks: [{disk_size: 50, storage_selector: 'true', disk_iothread: true}]\n\
             pci_devices: [{mapping: gpu1, pcie: true}]\nusb_devices: [{mapping: sdr, usb3: true}]\n",
        );
        let mut t = target(1);
        t.mac = Some(MacAddr::parse("BC:24:11:AA:BB:CC").unwrap());
        let params = render(&d, &identity(), &t).unwrap();
        for (k, v) in [
            ("balloon", "0"),
            ("machine", "q35"),
            ("bios", "ovmf"),
            ("efidisk0", "local-lvm:1,efitype=4m,pre-enrolled-keys=0"),
            ("numa", "1"),
            ("hugepages", "2"),
            ("vga", "serial0"),
            ("pool", "omni"),
            (
                "tags",
                "machine-request.workers;omni-provider.proxmox;omni-request.req-1;talos",
            ),
            (
                "net0",
                "virtio=BC:24:11:AA:BB:CC,bridge=vmbr0,firewall=0,tag=7",
            ),
            ("net1", "virtio,bridge=vmbr1,firewall=0,tag=9"),
            ("scsi0", "local-lvm:20,discard=on,ssd=1"),
            ("scsi1", "ceph:50,iothread=1"),
            ("hostpci0", "mapping=gpu1,pcie=1"),
            ("usb0", "mapping=sdr,usb3=1"),
        ] {
            assert_eq!(get(&params, k), Some(v), "{k}");
        }
        assert_eq!(
            render(&d, &identity(), &target(0)),
            Err(RenderError::DiskStorageCount {
                expected: 1,
                got: 0
            })
        );
        assert_eq!(
            render(
                &d,
                &identity(),
                &VmTarget {
                    boot_iso: None,
                    ..t
                }
            ),
            Err(RenderError::MissingBootIso)
        );
    }

    #[test]
    fn clone_variant() {
        let d = data("boot: clone\ntemplate: 9000\ndisk_ssd: true\npool: omni\n");
        let mut t = target(0);
        t.boot_iso = None;
        let boot = BootDisk {
            slot: "scsi0".into(),
            drive: "local-lvm:vm-104-disk-0,size=8G".into(),
        };
        let params = render_after_clone(&d, &identity(), &t, Some(&boot)).unwrap();
        assert_eq!(get(&params, "scsi0"), Some("local-lvm:vm-104-disk-0,ssd=1"));
        assert_eq!(get(&params, "boot"), Some("order=scsi0;net0"));
        for absent in ["vmid", "name", "pool", "ide2", "efidisk0"] {
            assert_eq!(get(&params, absent), None, "{absent}");
        }
        assert_eq!(
            get(&params, "ide3"),
            Some("local:iso/omni-seed-req-1.iso,media=cdrom")
        );
        assert_eq!(boot_disk_resize(&d, "scsi0")[1].1, "20G");
        use crate::pipeline::provider_data::CloneMode;
        let clone = clone_params(&d, &identity(), 104, "pve2", &t.storage, CloneMode::Full);
        assert_eq!(get(&clone, "pool"), Some("omni"));
        assert_eq!(get(&clone, "target"), Some("pve2"));
        assert_eq!(get(&clone, "full"), Some("1"));
        assert_eq!(get(&clone, "storage"), Some("local-lvm"));
        // qemu-server src/PVE/API2/Qemu.pm `clone_vm`: "parameter 'storage' not allowed for
        // linked clones".
        let linked = clone_params(&d, &identity(), 104, "pve2", &t.storage, CloneMode::Linked);
        assert_eq!(get(&linked, "full"), Some("0"));
        assert_eq!(get(&linked, "storage"), None);
    }

    #[test]
    fn ownership() {
        let description = description_marker(&identity());
        let tags = vec![
            "machine-request.workers".to_string(),
            provider_tag("proxmox"),
        ];
        assert_eq!(
            check_ownership("req-1", &tags, &description, "req-1", "proxmox"),
            Ownership::Ours
        );
        let other_req = check_ownership("req-1", &tags, &description, "req-2", "proxmox");
        assert!(matches!(other_req, Ownership::NotOurs(ref why) if why.contains("req-1")));
        assert!(matches!(
            check_ownership("req-1", &tags, &description, "req-1", "other"),
            Ownership::NotOurs(_)
        ));
        assert!(matches!(
            check_ownership("renamed", &tags, &description, "req-1", "proxmox"),
            Ownership::NotOurs(_)
        ));
        assert_eq!(
            check_ownership("req-1", &tags[..1], "", "req-1", "proxmox"),
            Ownership::Legacy
        );
        assert!(matches!(
            check_ownership("req-1", &[], "", "req-1", "proxmox"),
            Ownership::NotOurs(_)
        ));
        assert!(matches!(
            check_ownership("web", &[], "my web server", "req-1", "proxmox"),
            Ownership::NotOurs(_)
        ));
        // A user note above the marker does not break it.
        let edited = format!("note: keep this\n{description}");
        assert_eq!(
            check_ownership("req-1", &tags, &edited, "req-1", "proxmox"),
            Ownership::Ours
        );
    }

    #[test]
    fn request_tag_is_a_valid_tag_or_nothing() {
        assert_eq!(request_tag("req-1").as_deref(), Some("omni-request.req-1"));
        assert_eq!(request_tag("has space"), None);
        assert_eq!(request_tag(""), None);
        assert_eq!(request_tag("a;b"), None);
        assert_eq!(request_tag(&"x".repeat(200)), None);
        assert_eq!(
            tagged_request(&["talos", "omni-request.req-1"]),
            Some("req-1")
        );
        assert_eq!(tagged_request(&["OMNI-REQUEST.req-1"]), Some("req-1"));
        assert_eq!(tagged_request(&["omni-request."]), None);
        assert_eq!(tagged_request(&["omni-provider.proxmox"]), None);
        // A request ID that is not a tag renders without the tag and without an error.
        let id = VmIdentity {
            request_id: "odd id",
            set_id: None,
            provider_id: "proxmox",
        };
        let params = render(&data(""), &id, &target(0)).unwrap();
        assert_eq!(get(&params, "tags"), Some("omni-provider.proxmox"));
    }

    #[test]
    fn ownership_from_the_listing_alone() {
        let ours = [
            "machine-request.workers",
            "omni-provider.proxmox",
            "omni-request.req-1",
        ];
        assert!(owned_by_listing(Some("req-1"), &ours, "req-1", "proxmox"));
        // Proxmox may show tags in another case than we wrote them.
        let upper = ["OMNI-PROVIDER.proxmox", "Omni-Request.req-1"];
        assert!(owned_by_listing(Some("req-1"), &upper, "req-1", "proxmox"));
        // Anything missing: the listing is not enough, the config decides.
        assert!(!owned_by_listing(Some("req-2"), &ours, "req-1", "proxmox"));
        assert!(!owned_by_listing(None, &ours, "req-1", "proxmox"));
        assert!(!owned_by_listing(
            Some("req-1"),
            &ours[..2],
            "req-1",
            "proxmox"
        ));
        assert!(!owned_by_listing(Some("req-1"), &ours, "req-1", "other"));
        assert!(!owned_by_listing(
            Some("req-1"),
            &["omni-provider.proxmox", "omni-request.req-2"],
            "req-1",
            "proxmox"
        ));
        // An ID that cannot be a tag never matches through the listing.
        assert!(!owned_by_listing(
            Some("a b"),
            &["omni-provider.proxmox"],
            "a b",
            "proxmox"
        ));
    }

    #[test]
    fn listing_verdicts() {
        let ours = ["omni-provider.proxmox", "omni-request.req-1"];
        assert_eq!(
            listing_ownership(Some("req-1"), &ours, "req-1", "proxmox"),
            ListingVerdict::Ours
        );
        // Named after the request, but tags incomplete (older VM, official provider's VM): the
        // config decides.
        assert_eq!(
            listing_ownership(Some("req-1"), &ours[..1], "req-1", "proxmox"),
            ListingVerdict::NeedsConfig
        );
        assert_eq!(
            listing_ownership(Some("req-1"), &["machine-request.set"], "req-1", "proxmox"),
            ListingVerdict::NeedsConfig
        );
        // A reused VMID: another name, whatever the tags say.
        assert!(matches!(
            listing_ownership(Some("web-1"), &ours, "req-1", "proxmox"),
            ListingVerdict::NotOurs(ref why) if why.contains("web-1")
        ));
        // pve-manager PVE/API2/Cluster.pm, `resources`, fills a VM's entry through
        // PVE/API2Tools.pm `extract_vm_stats`, which takes name, status and template from the RRD
        // data pvestatd broadcasts; without it (a VM created seconds ago, a node offline for
        // minutes) the entry has only vmid/node/type, status "unknown", plus tags and lock from the
        // config. A missing name proves nothing: the config decides.
        assert_eq!(
            listing_ownership(None, &[], "req-1", "proxmox"),
            ListingVerdict::NeedsConfig
        );
        assert_eq!(
            listing_ownership(None, &ours, "req-1", "proxmox"),
            ListingVerdict::NeedsConfig
        );
    }

    #[test]
    fn the_boot_disk_comes_from_the_templates_config() {
        let config = |json: serde_json::Value| -> crate::proxmox::types::VmConfig {
            serde_json::from_value(json).unwrap()
        };
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
        let d = data("boot: clone\ntemplate: 9000\n");
        let mut t = target(0);
        t.boot_iso = None;
        let params = render_after_clone(&d, &identity(), &t, Some(&found)).unwrap();
        assert_eq!(get(&params, "boot"), Some("order=virtio0;net0"));
        assert_eq!(boot_disk_resize(&d, &found.slot)[0].1, "virtio0");
    }

    #[test]
    fn a_templates_cloud_init_drive_is_found() {
        let config: crate::proxmox::types::VmConfig = serde_json::from_value(serde_json::json!({
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

    #[test]
    fn a_config_update_never_allocates_twice() {
        // qemu-server src/PVE/API2/Qemu.pm `update_vm`: `<storage>:<GiB>` creates a new volume and a
        // NIC without MAC gets a fresh random one, at every call.
        assert!(allocates("scsi1", "local-lvm:2,iothread=1"));
        assert!(allocates("efidisk0", "local-lvm:1,efitype=4m"));
        assert!(!allocates("scsi1", "local-lvm:vm-104-disk-1,size=2G"));
        assert!(!allocates("ide3", "local:iso/omni-seed-r.iso,media=cdrom"));
        assert!(allocates("net0", "virtio,bridge=vmbr0"));
        assert!(!allocates("net0", "virtio=BC:24:11:00:00:01,bridge=vmbr0"));
        assert!(!allocates("cores", "2"));

        let current: crate::proxmox::types::VmConfig = serde_json::from_value(serde_json::json!({
            "scsi1": "local-lvm:vm-104-disk-1,size=2G",
            "net0": "virtio=BC:24:11:AA:BB:CC,bridge=vmbr0"
        }))
        .unwrap();
        let params = vec![
            ("cores".to_string(), "2".to_string()),
            ("scsi1".into(), "local-lvm:2,iothread=1".into()),
            ("scsi2".into(), "local-lvm:3".into()),
            ("net0".into(), "virtio,bridge=vmbr1,firewall=1".into()),
            ("net1".into(), "virtio,bridge=vmbr0".into()),
        ];
        let again = without_repeated_allocations(params, &current);
        assert_eq!(
            again,
            [
                ("cores".to_string(), "2".to_string()),
                ("scsi2".into(), "local-lvm:3".into()),
                (
                    "net0".into(),
                    "virtio=BC:24:11:AA:BB:CC,bridge=vmbr1,firewall=1".into()
                ),
                ("net1".into(), "virtio,bridge=vmbr0".into()),
            ]
        );
    }

    fn listed(json: serde_json::Value) -> VmResource {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn one_ownership_predicate_ignores_tag_case() {
        // PVE lowercases tags unless datacenter.cfg `tag-style` sets case-sensitive (pve-manager
        // and qemu-server store them through PVE::JSONSchema's tag list, lowercased by default):
        // a provider ID with capitals comes back lowercased.
        let vm = listed(serde_json::json!({
            "vmid": 104, "node": "pve1", "name": "Req-1",
            "tags": "omni-provider.my-proxmox;omni-request.req-1"
        }));
        assert!(listed_as_ours(&vm, Some("Req-1"), "My-Proxmox"));
        assert!(listed_as_ours(&vm, None, "MY-PROXMOX"));
        assert!(
            !listed_as_ours(&vm, Some("req-1"), "My-Proxmox"),
            "names are exact"
        );
        assert!(!listed_as_ours(&vm, None, "other"));
        let template = listed(serde_json::json!({
            "vmid": 9000, "node": "pve1", "name": "Req-1", "template": 1,
            "tags": "omni-provider.my-proxmox"
        }));
        assert!(!listed_as_ours(&template, None, "My-Proxmox"));
        assert!(owned_by_listing(
            Some("Req-1"),
            &["OMNI-PROVIDER.my-proxmox", "omni-request.req-1"],
            "Req-1",
            "My-Proxmox"
        ));
    }

    #[test]
    fn ownership_with_the_smbios_uuid() {
        let description = description_marker(&identity());
        let tags = vec![provider_tag("proxmox")];
        let uuid = "5c1f0a52-9d3e-4c1b-8f57-0d6f1f4a2b10";
        let smbios = format!("uuid={uuid},serial=x");
        let check = |smbios1: Option<&str>, expected: Option<&str>| {
            check_ownership_with_uuid(
                "req-1",
                &tags,
                &description,
                smbios1,
                expected,
                "req-1",
                "proxmox",
            )
        };
        assert_eq!(check(Some(&smbios), Some(uuid)), Ownership::Ours);
        assert_eq!(
            check(Some(&smbios), Some(&uuid.to_uppercase())),
            Ownership::Ours
        );
        // Nothing recorded: the marker alone decides.
        assert_eq!(check(None, None), Ownership::Ours);
        assert_eq!(check(Some(&smbios), Some("")), Ownership::Ours);
        let other = check(
            Some("uuid=00000000-0000-0000-0000-000000000001"),
            Some(uuid),
        );
        assert!(
            matches!(other, Ownership::NotOurs(ref why) if why.contains("SMBIOS")),
            "{other:?}"
        );
        assert!(matches!(check(None, Some(uuid)), Ownership::NotOurs(_)));
        // A legacy VM with the wrong UUID is not ours either.
        let legacy = check_ownership_with_uuid(
            "req-1",
            &["machine-request.set".to_string()],
            "",
            Some("uuid=00000000-0000-0000-0000-000000000001"),
            Some(uuid),
            "req-1",
            "proxmox",
        );
        assert!(matches!(legacy, Ownership::NotOurs(_)));
        let legacy_ok = check_ownership_with_uuid(
            "req-1",
            &["machine-request.set".to_string()],
            "",
            Some(&smbios),
            Some(uuid),
            "req-1",
            "proxmox",
        );
        assert_eq!(legacy_ok, Ownership::Legacy);
        // A foreign VM stays foreign whatever its UUID.
        assert!(matches!(
            check_ownership_with_uuid(
                "web",
                &[],
                "",
                Some(&smbios),
                Some(uuid),
                "req-1",
                "proxmox"
            ),
            Ownership::NotOurs(_)
        ));
        assert_eq!(smbios_uuid("serial=a, uuid=abc"), Some("abc"));
        assert_eq!(smbios_uuid("serial=a"), None);
    }

    proptest! {
        #[test]
        fn request_tags_are_tags_or_absent(request in "\\PC{0,60}") {
            if let Some(tag) = request_tag(&request) {
                prop_assert!(Tag::new(tag.clone()).is_ok());
                prop_assert_eq!(tagged_request(&[tag.as_str()]), Some(request.as_str()));
            }
        }

        #[test]
        fn marker_round_trips(request in "[a-z0-9][a-z0-9-]{0,40}", provider in "[a-z0-9][a-z0-9-]{0,20}") {
            let id = VmIdentity { request_id: &request, set_id: None, provider_id: &provider };
            let marker = parse_marker(&description_marker(&id));
            prop_assert_eq!(marker.request_id.as_deref(), Some(request.as_str()));
            prop_assert_eq!(marker.provider_id.as_deref(), Some(provider.as_str()));
            prop_assert_eq!(check_ownership(&request, &[], &description_marker(&id), &request, &provider), Ownership::Ours);
        }

        #[test]
        fn arbitrary_descriptions_never_panic(text in "\\PC{0,200}", name in "\\PC{0,20}") {
            let _ = check_ownership(&name, &[], &text, "req-1", "proxmox");
        }
    }
}

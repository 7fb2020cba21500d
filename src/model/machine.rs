//! What the provider state records about one machine, as typed values the steps work on.
//!
//! The saved form is the official provider's protobuf (`MachineSpec`), where "none" is an empty
//! string or a zero and VMIDs are `i32`; this is the one place that converts. Reading is lenient: a
//! value that does not parse (written by another version, or by the official provider in a shape we
//! do not know) reads as absent. Writing is conservative: a field the steps did not change is written
//! back exactly as it was read, so a value we could not parse is never lost, and the official
//! provider can take over from ours at any step with everything it wrote still there.

use std::net::IpAddr;

use crate::omni::proto::provider::{IpAllocation as RawIpAllocation, MachineSpec};
use crate::proxmox::property::{ImportVolume, IsoVolume, PoolId, StorageId};
use crate::proxmox::types::{NodeName, Upid, VmId};

/// The typed provider state of one machine. Every field is `None` (or empty) until a step records it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MachineState {
    /// SMBIOS UUID given to the VM (also the Talos machine UUID).
    pub uuid: Option<uuid::Uuid>,
    /// Image Factory schematic ID of the boot image.
    pub schematic: Option<String>,
    pub talos_version: Option<String>,
    /// Bare file name of the boot ISO (`<sha256>.iso`), as the official provider records it.
    pub iso_file: Option<String>,
    /// Node the VM was created on (it may have migrated since: always look it up).
    pub node: Option<NodeName>,
    pub iso_download_task: Option<Upid>,
    pub vm_create_task: Option<Upid>,
    pub vm_start_task: Option<Upid>,
    pub vmid: Option<VmId>,
    /// VMID chosen and recorded before the create call.
    pub reserved_vmid: Option<VmId>,
    /// The step last completed, by name (ours or the official provider's).
    pub step: Option<String>,
    pub seed_iso: Option<IsoVolume>,
    /// Addresses the guest agent reported.
    pub addresses: Vec<String>,
    /// Static addresses taken from the config's IP pools, one per NIC that names a pool; recorded
    /// before the VM exists, released when this state is destroyed after the VM is.
    pub ip_allocations: Vec<IpAllocation>,
    /// `iso` or `clone`.
    pub boot_mode: Option<String>,
    pub template_vmid: Option<VmId>,
    /// Storage of the boot disk.
    pub storage: Option<StorageId>,
    /// Last error shown to the user.
    pub last_error: Option<String>,
    pub request_set: Option<String>,
    /// When IP discovery began (Unix seconds), so its timeout survives restarts.
    pub ip_discovery_started: Option<i64>,
    /// The machine-request set's pool we put the VM in because the class named none.
    pub default_pool: Option<PoolId>,
    /// The pool the VM was put in, whichever (the official provider's field 12).
    pub pool: Option<PoolId>,
    pub boot_iso: Option<IsoVolume>,
    /// The Talos disk image in `import` storage the boot disk is made from (`boot: image`).
    pub boot_image: Option<ImportVolume>,
    /// Registered with Proxmox HA (the official provider's field 13).
    pub ha_registered: bool,
    /// The protobuf this state was read from: unchanged fields are written back from it verbatim.
    read_from: MachineSpec,
}

/// One NIC's static address from an IP pool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct IpAllocation {
    /// 0 for net0, n for `additional_nics[n-1]` (net n).
    pub nic: u8,
    pub pool: String,
    pub address: IpAddr,
}

/// The allocations that parse; one that does not (another version's shape) is dropped here and kept
/// in the raw state.
fn allocations(raw: &[RawIpAllocation]) -> Vec<IpAllocation> {
    raw.iter()
        .filter_map(|a| {
            Some(IpAllocation {
                nic: u8::try_from(a.nic).ok()?,
                pool: text(&a.pool)?,
                address: a.address.parse().ok()?,
            })
        })
        .collect()
}

fn allocations_raw(typed: &[IpAllocation]) -> Vec<RawIpAllocation> {
    typed
        .iter()
        .map(|a| RawIpAllocation {
            nic: u32::from(a.nic),
            pool: a.pool.clone(),
            address: a.address.to_string(),
        })
        .collect()
}

fn text(raw: &str) -> Option<String> {
    (!raw.is_empty()).then(|| raw.to_owned())
}

fn vmid(raw: i32) -> Option<VmId> {
    u32::try_from(raw).ok().and_then(|v| VmId::new(v).ok())
}

fn parsed<T, E>(raw: &str, parse: impl FnOnce(&str) -> Result<T, E>) -> Option<T> {
    if raw.is_empty() {
        return None;
    }
    parse(raw).ok()
}

fn vmid_raw(id: Option<VmId>) -> i32 {
    id.and_then(|v| i32::try_from(v.get()).ok()).unwrap_or(0)
}

fn text_raw<T: ToString>(value: &Option<T>) -> String {
    value.as_ref().map(T::to_string).unwrap_or_default()
}

/// Writes `now` into `raw` unless it equals what `raw` reads as (then `raw` stays byte for byte).
fn merge<T: PartialEq, R>(raw: &mut R, now: &T, read: impl Fn(&R) -> T, render: impl Fn(&T) -> R) {
    if read(raw) != *now {
        *raw = render(now);
    }
}

/// [`merge`] for a field saved as a string, read with `read`.
fn merge_str<T: PartialEq + ToString>(
    raw: &mut String,
    now: &Option<T>,
    read: impl Fn(&str) -> Option<T>,
) {
    merge(raw, now, |r| read(r), text_raw);
}

impl MachineState {
    /// Reads a saved state. Never fails: what does not parse reads as absent (and is kept on write).
    pub fn from_spec(spec: &MachineSpec) -> Self {
        Self {
            uuid: parsed(&spec.uuid, uuid::Uuid::parse_str),
            schematic: text(&spec.schematic),
            talos_version: text(&spec.talos_version),
            iso_file: text(&spec.volume_id),
            node: parsed(&spec.node, |r| NodeName::new(r)),
            iso_download_task: parsed(&spec.volume_upload_task, Upid::parse),
            vm_create_task: parsed(&spec.vm_create_task, Upid::parse),
            vm_start_task: parsed(&spec.vm_start_task, Upid::parse),
            vmid: vmid(spec.vmid),
            reserved_vmid: vmid(spec.reserved_vmid),
            step: text(&spec.step),
            seed_iso: parsed(&spec.seed_iso_volume, IsoVolume::parse),
            addresses: spec.addresses.clone(),
            ip_allocations: allocations(&spec.ip_allocations),
            boot_mode: text(&spec.boot_mode),
            template_vmid: vmid(spec.template_vmid),
            storage: parsed(&spec.storage, StorageId::parse),
            last_error: text(&spec.last_error),
            request_set: text(&spec.request_set),
            ip_discovery_started: (spec.ip_discovery_started > 0)
                .then_some(spec.ip_discovery_started),
            default_pool: parsed(&spec.default_pool, PoolId::parse),
            pool: parsed(&spec.pool, PoolId::parse),
            boot_iso: parsed(&spec.boot_iso_volume, IsoVolume::parse),
            boot_image: parsed(&spec.boot_image_volume, ImportVolume::parse),
            ha_registered: spec.ha_registered,
            read_from: spec.clone(),
        }
    }

    /// The state to save: what it was read from, with every field a step changed written over it.
    pub fn to_spec(&self) -> MachineSpec {
        let mut spec = self.read_from.clone();
        merge_str(&mut spec.uuid, &self.uuid, |r| {
            parsed(r, uuid::Uuid::parse_str)
        });
        merge_str(&mut spec.schematic, &self.schematic, text);
        merge_str(&mut spec.talos_version, &self.talos_version, text);
        merge_str(&mut spec.volume_id, &self.iso_file, text);
        merge_str(&mut spec.node, &self.node, |r| parsed(r, NodeName::parse));
        let task = |r: &str| parsed(r, Upid::parse);
        merge_str(&mut spec.volume_upload_task, &self.iso_download_task, task);
        merge_str(&mut spec.vm_create_task, &self.vm_create_task, task);
        merge_str(&mut spec.vm_start_task, &self.vm_start_task, task);
        let id = |r: &i32| vmid(*r);
        let id_raw = |v: &Option<VmId>| vmid_raw(*v);
        merge(&mut spec.vmid, &self.vmid, id, id_raw);
        merge(&mut spec.reserved_vmid, &self.reserved_vmid, id, id_raw);
        merge(&mut spec.template_vmid, &self.template_vmid, id, id_raw);
        merge_str(&mut spec.step, &self.step, text);
        let iso = |r: &str| parsed(r, IsoVolume::parse);
        merge_str(&mut spec.seed_iso_volume, &self.seed_iso, iso);
        merge_str(&mut spec.boot_iso_volume, &self.boot_iso, iso);
        let image = |r: &str| parsed(r, ImportVolume::parse);
        merge_str(&mut spec.boot_image_volume, &self.boot_image, image);
        spec.addresses.clone_from(&self.addresses);
        merge(
            &mut spec.ip_allocations,
            &self.ip_allocations,
            |r| allocations(r),
            |v| allocations_raw(v),
        );
        merge_str(&mut spec.boot_mode, &self.boot_mode, text);
        merge_str(&mut spec.storage, &self.storage, |r| {
            parsed(r, StorageId::parse)
        });
        merge_str(&mut spec.last_error, &self.last_error, text);
        merge_str(&mut spec.request_set, &self.request_set, text);
        merge(
            &mut spec.ip_discovery_started,
            &self.ip_discovery_started,
            |r| (*r > 0).then_some(*r),
            |v| v.unwrap_or(0),
        );
        let pool = |r: &str| parsed(r, PoolId::parse);
        merge_str(&mut spec.default_pool, &self.default_pool, pool);
        merge_str(&mut spec.pool, &self.pool, pool);
        spec.ha_registered = self.ha_registered;
        spec
    }

    /// The set pool of a VM the official provider made (its field 12, with nothing of ours recorded
    /// about the VM's creation: we write `reserved_vmid` before every create, and `default_pool` for
    /// the set pools we make). Removed like that provider removes it: empty, and carrying
    /// [`crate::model::identity::SET_POOL_COMMENT`].
    pub fn official_pool(&self) -> Option<&PoolId> {
        self.pool
            .as_ref()
            .filter(|_| self.default_pool.is_none() && self.reserved_vmid.is_none())
    }

    /// The static address recorded for NIC `nic`, if any.
    pub fn allocation(&self, nic: u8) -> Option<&IpAllocation> {
        self.ip_allocations.iter().find(|a| a.nic == nic)
    }

    /// The VMID the request recorded: its `vmid`, else the `reserved_vmid` written before the create.
    pub fn recorded_vmid(&self) -> Option<VmId> {
        self.vmid.or(self.reserved_vmid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn go_state() -> MachineSpec {
        // What the official provider records after its createVM step (fields 1–11 only).
        MachineSpec {
            uuid: "0b6d6a6e-6f2c-4c1e-9f60-2b8c1a1e4d3f".into(),
            schematic: "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba".into(),
            talos_version: "1.11.4".into(),
            volume_id: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08.iso"
                .into(),
            node: "pve2".into(),
            vm_create_task: "UPID:pve2:0000C0DE:00ABCDEF:6740F00D:qmcreate:104:root@pam:".into(),
            vmid: 104,
            ..MachineSpec::default()
        }
    }

    #[test]
    fn reads_the_official_providers_state_typed() {
        let state = MachineState::from_spec(&go_state());
        assert_eq!(state.node.as_ref().map(NodeName::as_str), Some("pve2"));
        assert_eq!(state.vmid.map(VmId::get), Some(104));
        assert_eq!(state.recorded_vmid().map(VmId::get), Some(104));
        assert_eq!(state.reserved_vmid, None);
        assert_eq!(
            state.vm_create_task.as_ref().map(Upid::task_type),
            Some("qmcreate")
        );
        assert!(state.uuid.is_some());
        assert_eq!(state.seed_iso, None);
    }

    #[test]
    fn an_unchanged_state_is_written_back_byte_for_byte() {
        let mut odd = go_state();
        // Values we cannot parse: kept as they were, never blanked.
        odd.vm_start_task = "not a upid".into();
        odd.node = "bad node name!".into();
        odd.vmid = -5;
        odd.storage = "bad storage!".into();
        let state = MachineState::from_spec(&odd);
        assert_eq!(state.node, None);
        assert_eq!(state.vmid, None);
        assert_eq!(state.to_spec(), odd);
    }

    #[test]
    fn changed_fields_are_written_and_cleared_ones_emptied() {
        let mut state = MachineState::from_spec(&go_state());
        state.vmid = None;
        state.vm_create_task = None;
        state.reserved_vmid = VmId::new(105).ok();
        state.seed_iso = IsoVolume::parse("local:iso/omni-seed-req-1.iso").ok();
        state.ip_discovery_started = Some(1_700_000_000);
        let spec = state.to_spec();
        assert_eq!(spec.vmid, 0);
        assert_eq!(spec.vm_create_task, "");
        assert_eq!(spec.reserved_vmid, 105);
        assert_eq!(spec.seed_iso_volume, "local:iso/omni-seed-req-1.iso");
        assert_eq!(spec.ip_discovery_started, 1_700_000_000);
        // Untouched fields unchanged.
        assert_eq!(spec.volume_id, go_state().volume_id);
        assert_eq!(spec.node, "pve2");
        // And it reads back the same.
        let again = MachineState::from_spec(&spec);
        assert_eq!(again.to_spec(), spec);
        assert_eq!(again.reserved_vmid, state.reserved_vmid);
    }

    #[test]
    fn ip_allocations_round_trip_and_odd_ones_are_kept() {
        let mut spec = go_state();
        spec.ip_allocations = vec![RawIpAllocation {
            nic: 0,
            pool: "talos-net".into(),
            address: "not an address".into(),
        }];
        let mut state = MachineState::from_spec(&spec);
        assert!(state.ip_allocations.is_empty());
        // Unchanged: written back as read.
        assert_eq!(state.to_spec(), spec);
        state.ip_allocations.push(IpAllocation {
            nic: 1,
            pool: "storage".into(),
            address: "fd00::10".parse().unwrap(),
        });
        let written = state.to_spec();
        assert_eq!(written.ip_allocations.len(), 1);
        assert_eq!(written.ip_allocations[0].address, "fd00::10");
        assert_eq!(written.ip_allocations[0].nic, 1);
        let again = MachineState::from_spec(&written);
        assert_eq!(again.ip_allocations, state.ip_allocations);
        assert_eq!(
            again.allocation(1).map(|a| a.pool.as_str()),
            Some("storage")
        );
        assert_eq!(again.to_spec(), written);
        // Other fields untouched.
        assert_eq!(written.node, "pve2");
    }

    #[test]
    fn a_fresh_state_saves_as_the_empty_protobuf() {
        assert_eq!(
            MachineState::from_spec(&MachineSpec::default()).to_spec(),
            MachineSpec::default()
        );
    }
}

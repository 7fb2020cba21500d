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

fn text(raw: &str) -> Option<String> {
    (!raw.is_empty()).then(|| raw.to_owned())
}

fn vmid(raw: &i32) -> Option<VmId> {
    u32::try_from(*raw).ok().and_then(|v| VmId::new(v).ok())
}

/// How a typed field is read where "none" is the empty string; one that does not parse is absent.
fn parsed<T, E>(parse: impl Fn(&str) -> Result<T, E>) -> impl Fn(&String) -> Option<T> {
    move |raw| (!raw.is_empty()).then(|| parse(raw).ok()).flatten()
}

/// How a typed field is saved where "none" is the empty string.
fn or_empty<T: ToString>(value: &Option<T>) -> String {
    value.as_ref().map(T::to_string).unwrap_or_default()
}

/// How a VMID is saved, "none" as zero.
fn or_zero(vmid: &Option<VmId>) -> i32 {
    vmid.and_then(|v| i32::try_from(v.get()).ok()).unwrap_or(0)
}

fn raw_allocations(allocations: &[IpAllocation]) -> Vec<RawIpAllocation> {
    allocations
        .iter()
        .map(|a| RawIpAllocation {
            nic: u32::from(a.nic),
            pool: a.pool.clone(),
            address: a.address.to_string(),
        })
        .collect()
}

/// Every typed field with the protobuf field it is saved in, how that reads and how it is written:
/// reading a state and writing it back go through this one list, which names every field. A field
/// is written only when it differs from what its protobuf field reads as, so an unchanged one stays
/// byte for byte.
macro_rules! saved_fields {
    ($($field:ident <- $raw:ident: $read:expr => $write:expr,)*) => {
        impl MachineState {
            /// Reads a saved state. Never fails: what does not parse reads as absent (and is kept
            /// on write).
            pub fn from_spec(spec: &MachineSpec) -> Self {
                Self { $($field: $read(&spec.$raw),)* read_from: spec.clone() }
            }

            /// The state to save: what it was read from, with every field a step changed written
            /// over it.
            pub fn to_spec(&self) -> MachineSpec {
                let mut spec = self.read_from.clone();
                $(if $read(&spec.$raw) != self.$field {
                    spec.$raw = $write(&self.$field);
                })*
                spec
            }
        }
    };
}

saved_fields! {
    uuid <- uuid: parsed(uuid::Uuid::parse_str) => or_empty,
    schematic <- schematic: text => or_empty,
    talos_version <- talos_version: text => or_empty,
    iso_file <- volume_id: text => or_empty,
    node <- node: parsed(NodeName::parse) => or_empty,
    iso_download_task <- volume_upload_task: parsed(Upid::parse) => or_empty,
    vm_create_task <- vm_create_task: parsed(Upid::parse) => or_empty,
    vm_start_task <- vm_start_task: parsed(Upid::parse) => or_empty,
    vmid <- vmid: vmid => or_zero,
    reserved_vmid <- reserved_vmid: vmid => or_zero,
    step <- step: text => or_empty,
    seed_iso <- seed_iso_volume: parsed(IsoVolume::parse) => or_empty,
    ip_allocations <- ip_allocations: allocations => raw_allocations,
    boot_mode <- boot_mode: text => or_empty,
    template_vmid <- template_vmid: vmid => or_zero,
    storage <- storage: parsed(StorageId::parse) => or_empty,
    last_error <- last_error: text => or_empty,
    request_set <- request_set: text => or_empty,
    ip_discovery_started <- ip_discovery_started: |r: &i64| (*r > 0).then_some(*r) => |v: &Option<i64>| v.unwrap_or(0),
    default_pool <- default_pool: parsed(PoolId::parse) => or_empty,
    pool <- pool: parsed(PoolId::parse) => or_empty,
    boot_iso <- boot_iso_volume: parsed(IsoVolume::parse) => or_empty,
    boot_image <- boot_image_volume: parsed(ImportVolume::parse) => or_empty,
    addresses <- addresses: Vec::clone => Vec::clone,
    ha_registered <- ha_registered: |r: &bool| *r => |v: &bool| *v,
}

impl MachineState {
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

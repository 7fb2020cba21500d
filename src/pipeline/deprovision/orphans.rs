//! What deprovisions left behind: VMs of ours whose request is gone, seed ISOs no VM uses.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::model::identity;
use crate::proxmox::property::IsoVolume;
use crate::proxmox::types::{NodeName, VmConfig, VmId, VmResource};
use crate::rules::cloud_init::seed_iso_file_name;

/// A VM with our provider tag whose MachineRequest no longer exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrphanVm {
    pub vmid: VmId,
    pub node: NodeName,
    pub name: Option<String>,
    /// The request it was made for (its request tag, else its name).
    pub request_id: Option<String>,
    pub status: Option<String>,
    /// Seed ISOs its config uses (deleted with it).
    pub seed_isos: Vec<String>,
}

/// A seed ISO no VM uses and no live request will use (what [`find_orphans`] is given are the ISO
/// volumes found in the storages, in the same shape).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrphanIso {
    pub volume: String,
    pub storage: String,
    /// A node that holds it (any node, for shared storage).
    pub node: NodeName,
    pub size: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Orphans {
    pub vms: Vec<OrphanVm>,
    pub seed_isos: Vec<OrphanIso>,
    /// What the search could not look at (offline nodes, unreadable storages): orphans there are
    /// not listed.
    pub problems: Vec<String>,
}

/// The ISO volumes a VM config uses (CD-ROM drives: `ide2: local:iso/x.iso,media=cdrom`).
pub fn iso_volumes_in(config: &VmConfig) -> Vec<String> {
    config
        .0
        .keys()
        .filter_map(|key| config.get(key))
        .filter_map(|value| {
            let volume = value.split(',').next()?.trim();
            IsoVolume::parse(volume).ok().map(|_| volume.to_owned())
        })
        .collect()
}

/// Whether a file name is one of our seed ISOs.
pub fn is_seed_iso(volume: &str) -> bool {
    IsoVolume::parse(volume).is_ok_and(|iso| iso.file.as_str().starts_with("omni-seed-"))
}

/// Decides what is orphaned: VMs with our provider tag whose request is not live, and seed ISOs that
/// no config in `used_isos` references, that no live request will use (a request being provisioned
/// uploads its seed before its VM exists) and that are not named after one of our VMs (whose config
/// may not have been readable; such a seed goes with its VM). `used_isos` maps VMIDs of every VM
/// read (ours and anyone else's: a seed attached anywhere is in use) to the ISO volumes their
/// configs use.
pub fn find_orphans<'a>(
    vms: impl Iterator<Item = &'a VmResource>,
    live_requests: &BTreeSet<String>,
    provider_id: &str,
    isos: &[OrphanIso],
    used_isos: &BTreeMap<VmId, Vec<String>>,
) -> Orphans {
    let mut orphans = Orphans::default();
    // Tags come back lowercased (PVE's default tag style), names do not: request IDs are compared
    // without case, and the name is preferred when it is the tagged request in another case.
    let live_lower: BTreeSet<String> = live_requests
        .iter()
        .map(|r| r.to_ascii_lowercase())
        .collect();
    // A live request's seed, or one named after a VM of ours, is not an orphan.
    let mut protected_seeds: BTreeSet<String> = live_requests
        .iter()
        .map(|r| seed_iso_file_name(r).to_ascii_lowercase())
        .collect();
    for vm in vms.filter(|vm| identity::made_by(vm, provider_id)) {
        let tags = vm.tag_list();
        let (tagged, name) = (identity::tagged_request(&tags), vm.name.as_deref());
        for named in [tagged, name].into_iter().flatten() {
            protected_seeds.insert(seed_iso_file_name(named).to_ascii_lowercase());
        }
        let request = match (tagged, name) {
            (Some(tagged), Some(name)) if tagged.eq_ignore_ascii_case(name) => Some(name),
            (tagged, name) => tagged.or(name),
        };
        let live = [request, name]
            .into_iter()
            .flatten()
            .any(|id| live_lower.contains(&id.to_ascii_lowercase()));
        if live {
            continue;
        }
        orphans.vms.push(OrphanVm {
            vmid: vm.vmid,
            node: vm.node.clone(),
            name: vm.name.clone(),
            request_id: request.map(str::to_owned),
            status: vm.status.clone(),
            seed_isos: used_isos
                .get(&vm.vmid)
                .map(|v| v.iter().filter(|v| is_seed_iso(v)).cloned().collect())
                .unwrap_or_default(),
        });
    }
    let used: BTreeSet<&str> = used_isos.values().flatten().map(String::as_str).collect();
    // A shared storage lists the same volume on every node; node-local ones are distinct files.
    let mut seen = BTreeSet::new();
    orphans.seed_isos = isos
        .iter()
        .filter(|found| {
            let volume = found.volume.as_str();
            let file = volume.rsplit('/').next().unwrap_or(volume);
            is_seed_iso(volume)
                && !used.contains(volume)
                && !protected_seeds.contains(&file.to_ascii_lowercase())
                && seen.insert((&found.node, volume))
        })
        .cloned()
        .collect();
    orphans
}

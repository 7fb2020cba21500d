//! Whether a clone of the class's template can be made on a node, from which copy of the template,
//! and onto which storage: the part of a node's verdict that `boot: clone` adds.
//!
//! What Proxmox allows, from qemu-server src/PVE/API2/Qemu.pm `clone_vm`:
//!
//! - A clone to another node (`target`) needs every drive of the template, CD-ROM images included,
//!   on shared storage (`$check_storage_access_clone` yields "VM uses local storage" otherwise), and
//!   a full clone's target `storage` must be shared too ("can't clone to non-shared storage") and
//!   enabled on the template's node as well as on the target (`storage_check_enabled` on both).
//! - A linked clone (`full` = 0, only from a template) takes no `storage`: its disks stay on the
//!   template's storage, each of which must support linked clones (`volume_has_feature` 'clone' on
//!   the base volume, see [`storage::links_clones`]).
//!
//! So a node is eligible when a copy of the template is on it, or when a copy elsewhere is wholly
//! on shared storage and (full) a shared storage is selected on the node, or (linked) the
//! template's storage is selected and usable there.

use super::LeftOut;
use crate::model::{NodeSnapshot, StorageSnapshot, TemplateFacts};
use crate::rules::provider_data::CloneMode;
use crate::rules::storage::{self, Rejection, StorageNeed};
use crate::rules::storage_selector::StorageSelector;

/// The template a class clones, with every copy of it the cluster has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneSource {
    /// As the class names it (`talos-1.11`, `9000`).
    pub wanted: String,
    pub mode: CloneMode,
    /// Every template matching `wanted` on an online node (one per node that keeps a copy, usually).
    pub templates: Vec<TemplateFacts>,
    /// Nodes with a copy that are offline: a clone runs on its template's node, so those copies
    /// cannot be cloned until their node is back.
    pub offline: Vec<String>,
}

/// Why a clone cannot be made on a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloneRefusal {
    /// No copy of the template on the node, and every copy elsewhere has drives on local storage.
    #[error(
        "no copy of template {template} on {node}{}",
        copies_elsewhere(elsewhere, offline)
    )]
    NoCopy {
        template: String,
        node: String,
        /// The copies on other nodes.
        elsewhere: Vec<TemplateFacts>,
        /// Nodes with a copy that are offline.
        offline: Vec<String>,
    },
    /// A copy on shared storage could be cloned here, but the selector picks no shared storage on
    /// the node. `rejected`: every storage with the reason it was passed over.
    #[error(
        "template {template} is elsewhere, so the clone needs a shared storage here, and `{selector}` selects none{}",
        reasons(rejected)
    )]
    NoSharedTarget {
        template: String,
        selector: String,
        rejected: Vec<(String, Rejection)>,
    },
    /// Linked: a disk of the template is on a storage type without linked clones.
    #[error(
        "clone_mode linked: {slot} of template {template} is on {storage} ({storage_type}), which cannot hold linked clones; use `clone_mode: full` or move the template to storage that can (e.g. lvmthin, zfspool, rbd, or qcow2 on a directory)"
    )]
    LinkedUnsupported {
        template: String,
        slot: String,
        storage: String,
        storage_type: String,
    },
    /// Linked: the template has no disk to share.
    #[error("clone_mode linked: template {template} has no disk to share; use `clone_mode: full`")]
    NoDisk { template: String },
    /// Linked: the clone stays on the template's storage, which does not take it on this node.
    #[error("clone_mode linked keeps the clone's disks on {storage}, the storage of template {template}, which {}", match why {
        Rejection::NotSelected => format!("`{selector}` does not select"),
        other => other.to_string(),
    })]
    LinkedStorage {
        template: String,
        storage: String,
        selector: String,
        why: Rejection,
    },
}

/// Where the copies elsewhere are, and why none can be cloned here.
fn copies_elsewhere(elsewhere: &[TemplateFacts], offline: &[String]) -> String {
    let mut out: String = elsewhere
        .iter()
        .map(|t| {
            let slots = t.drives.iter().filter(|d| !d.shared).map(|d| &*d.slot);
            format!(
                "; its disks are on {} (local to {}: {})",
                t.local_storages().join(", "),
                t.node,
                slots.collect::<Vec<_>>().join(", ")
            )
        })
        .chain(
            offline
                .iter()
                .map(|n| format!("; the copy on {n} is on an offline node")),
        )
        .collect();
    if !elsewhere.is_empty() {
        out.push_str(
            ", and Proxmox clones to another node only a template wholly on shared storage",
        );
    }
    out
}

fn reasons(rejected: &[(String, Rejection)]) -> String {
    if rejected.is_empty() {
        return String::new();
    }
    let reasons: Vec<String> = rejected
        .iter()
        .map(|(name, why)| format!("{name}: {why}"))
        .collect();
    format!(" ({})", reasons.join("; "))
}

impl CloneRefusal {
    /// Only a storage coming back (active again) heals by itself; the rest needs the class, the
    /// template or the cluster's storage changed.
    pub fn may_heal(&self) -> bool {
        match self {
            CloneRefusal::NoCopy { offline, .. } => !offline.is_empty(),
            CloneRefusal::LinkedStorage { why, .. } => why.may_heal(),
            CloneRefusal::NoSharedTarget { rejected, .. } => {
                rejected.iter().any(|(_, why)| why.may_heal())
            }
            CloneRefusal::LinkedUnsupported { .. } | CloneRefusal::NoDisk { .. } => false,
        }
    }
}

/// The rule for cloning `source` onto `node` with the boot disk's `selector` and `disk_gb`: the
/// storage and the VMID of the copy to clone, or why not (a copy is here, but the storage choice
/// failed as it would for any VM: [`LeftOut::NoStorage`]).
pub fn clone_verdict(
    node: &NodeSnapshot,
    source: &CloneSource,
    selector: &StorageSelector,
    disk_gb: u64,
) -> Result<(StorageSnapshot, u32), LeftOut> {
    let here = source.templates.iter().find(|t| t.node == node.name);
    let reachable = || {
        source
            .templates
            .iter()
            .find(|t| t.node != node.name && t.all_shared())
    };
    let Some(template) = here.or_else(reachable) else {
        return Err(refused(CloneRefusal::NoCopy {
            template: source.wanted.clone(),
            node: node.name.to_string(),
            elsewhere: source.templates.clone(),
            offline: source.offline.clone(),
        }));
    };
    match source.mode {
        CloneMode::Full => {
            let need = StorageNeed {
                shared_from: here
                    .is_none()
                    .then_some((template.node.as_str(), template.node_storages.as_slice())),
                ..StorageNeed::boot_disk(selector, disk_gb)
            };
            let choice = storage::choose(node, &need);
            match (choice.chosen, here) {
                (Some(storage), _) => Ok((storage, template.vmid)),
                (None, None) if storage::selector_error(&choice.rejected).is_none() => {
                    Err(refused(CloneRefusal::NoSharedTarget {
                        template: source.wanted.clone(),
                        selector: selector.to_string(),
                        rejected: choice.rejected,
                    }))
                }
                (None, _) => Err(LeftOut::NoStorage {
                    need_gb: disk_gb,
                    selector: selector.to_string(),
                    rejected: choice.rejected,
                }),
            }
        }
        CloneMode::Linked => linked(node, source, template, selector),
    }
}

fn refused(why: CloneRefusal) -> LeftOut {
    LeftOut::Clone(Box::new(why))
}

fn linked(
    node: &NodeSnapshot,
    source: &CloneSource,
    template: &TemplateFacts,
    selector: &StorageSelector,
) -> Result<(StorageSnapshot, u32), LeftOut> {
    let name = || source.wanted.clone();
    if let Some(d) = template
        .drives
        .iter()
        .find(|d| d.linked && !storage::links_clones(&d.storage_type))
    {
        return Err(refused(CloneRefusal::LinkedUnsupported {
            template: name(),
            slot: d.slot.clone(),
            storage: d.storage.clone(),
            storage_type: d.storage_type.clone(),
        }));
    }
    let Some(boot) = &template.boot_storage else {
        return Err(refused(CloneRefusal::NoDisk { template: name() }));
    };
    // Thin: a linked clone takes only what it writes, so no room is asked for up front.
    match storage::judge_named(node, boot, &StorageNeed::boot_disk(selector, 0)) {
        Ok(storage) => Ok((storage, template.vmid)),
        Err(why) => Err(refused(CloneRefusal::LinkedStorage {
            template: name(),
            storage: boot.clone(),
            selector: selector.to_string(),
            why,
        })),
    }
}

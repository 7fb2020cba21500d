//! Which storage of a node takes a boot disk, an additional disk or an ISO image: the first one, in
//! the API's order (as the official provider walks them), that holds the content, is active, is
//! selected and has room. Placement, the steps and `validate` all ask [`choose`], so they cannot
//! disagree about a storage.

use crate::model::{GIB, NodeSnapshot, StorageSnapshot};
use crate::proxmox::property::StorageId;
use crate::rules::storage_selector::{SelectorError, StorageSelector};

crate::proxmox::property::str_enum!(
    /// What a storage must be able to hold: the Proxmox content type.
    #[derive(Default)]
    Content {
        #[default]
        VmDisks = "images",
        IsoImages = "iso",
        /// Disk images to import (`boot: image`): pve-storage's `import` content type.
        DiskImages = "import",
    }
);

impl Content {
    /// For messages: "VM disks go to …".
    pub fn describe(self) -> &'static str {
        match self {
            Content::VmDisks => "VM disks",
            Content::IsoImages => "ISO images",
            Content::DiskImages => "disk images to import",
        }
    }
}

/// One thing to store. No selector means any storage that holds the content will do (ISO storage
/// without `iso_storage_selector`).
#[derive(Debug, Clone, Copy, Default)]
pub struct StorageNeed<'a> {
    pub content: Content,
    pub selector: Option<&'a StorageSelector>,
    pub size_gb: u64,
    /// A full clone from a template on another node: only shared storage will do (qemu-server
    /// src/PVE/API2/Qemu.pm `clone_vm` refuses a `target` node with a non-shared `storage`), and it
    /// must also be enabled on the template's node (`clone_vm` checks `storage_check_enabled` on the
    /// node it runs on, the template's, before the `target` node): (that node, its storages).
    pub shared_from: Option<(&'a str, &'a [StorageId])>,
}

impl<'a> StorageNeed<'a> {
    /// The boot disk together with the additional disks (placement wants all of them on one
    /// storage), or an additional disk with its own selector on the node placement picked.
    pub fn boot_disk(selector: &'a StorageSelector, size_gb: u64) -> Self {
        let selector = Some(selector);
        Self {
            selector,
            size_gb,
            ..Self::default()
        }
    }

    /// What a boot mode downloads (the Talos ISO, or the disk image) and the seed ISO; their size
    /// is not known up front, so room is not checked.
    pub fn download(content: Content, selector: Option<&'a StorageSelector>) -> Self {
        Self {
            content,
            selector,
            ..Self::default()
        }
    }
}

/// Why a storage was passed over.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("does not hold {} (content: {})", wanted.as_str(), if content.is_empty() { "none".to_string() } else { content.join(",") })]
    WrongContent {
        content: Vec<String>,
        wanted: Content,
    },
    #[error("is not active")]
    Inactive,
    #[error("not selected by the selector")]
    NotSelected,
    /// The selector failed on this storage: a configuration error, not a fact about the storage.
    #[error("{0}")]
    SelectorFailed(SelectorError),
    #[error("selected, but only {} GiB free of {needed_gb} GiB needed", available / GIB)]
    TooSmall { available: u64, needed_gb: u64 },
    /// Selected, but local to the node where shared storage is needed.
    #[error("selected, but not shared")]
    NotShared,
    /// Not available on the node at all (asked for by name).
    #[error("is not available on this node")]
    NotOnNode,
    /// Shared, but not enabled on the template's node, where a full clone to another node checks
    /// it too.
    #[error(
        "selected and shared, but not enabled on {node}, the template's node, where Proxmox checks a clone's target storage too (add {node} to the storage's nodes)"
    )]
    NotOnTemplateNode { node: String },
}

impl Rejection {
    /// Whether the storage may take the disk later without anyone changing it or the class.
    pub fn may_heal(&self) -> bool {
        matches!(self, Rejection::Inactive | Rejection::TooSmall { .. })
    }
}

/// The verdict on one node's storages: the chosen one (if any) and why each storage before it was
/// passed over, in API order. Storages after the chosen one were not looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageChoice {
    pub chosen: Option<StorageSnapshot>,
    pub rejected: Vec<(String, Rejection)>,
}

impl StorageChoice {
    /// A selector that failed on a storage before one was chosen. Callers that act on the choice
    /// treat it as a configuration error, so a broken selector is not hidden by a later storage.
    pub fn selector_error(&self) -> Option<&SelectorError> {
        selector_error(&self.rejected)
    }

    /// Storages that hold the content and are active (selected or not), in API order.
    pub fn usable(&self) -> impl Iterator<Item = &str> {
        self.rejected
            .iter()
            .filter(|(_, why)| !matches!(why, Rejection::WrongContent { .. } | Rejection::Inactive))
            .map(|(name, _)| name.as_str())
            .chain(self.chosen.iter().map(|s| s.name.as_str()))
    }
}

/// The first selector failure among `rejected`.
pub fn selector_error(rejected: &[(String, Rejection)]) -> Option<&SelectorError> {
    rejected.iter().find_map(|(_, why)| match why {
        Rejection::SelectorFailed(e) => Some(e),
        _ => None,
    })
}

/// The first storage on `node` that takes `need`, with the reason for every storage before it.
pub fn choose(node: &NodeSnapshot, need: &StorageNeed<'_>) -> StorageChoice {
    let mut rejected = Vec::new();
    let chosen = node
        .storages
        .iter()
        .find(|storage| match judge(node, storage, need) {
            Some(why) => {
                rejected.push((storage.name.to_string(), why));
                false
            }
            None => true,
        });
    StorageChoice {
        chosen: chosen.cloned(),
        rejected,
    }
}

fn judge(
    node: &NodeSnapshot,
    storage: &StorageSnapshot,
    need: &StorageNeed<'_>,
) -> Option<Rejection> {
    if !storage.holds(need.content.as_str()) {
        return Some(Rejection::WrongContent {
            content: storage.content.clone(),
            wanted: need.content,
        });
    }
    if !storage.active {
        return Some(Rejection::Inactive);
    }
    if let Some(selector) = need.selector {
        match selector.matches(storage, node.name.as_str()) {
            Err(e) => return Some(Rejection::SelectorFailed(e)),
            Ok(false) => return Some(Rejection::NotSelected),
            Ok(true) => {}
        }
    }
    if let Some((source, storages)) = need.shared_from {
        if !storage.shared {
            return Some(Rejection::NotShared);
        }
        if !storages.contains(&storage.name) {
            let node = source.to_owned();
            return Some(Rejection::NotOnTemplateNode { node });
        }
    }
    if storage.available < need.size_gb.saturating_mul(GIB) {
        return Some(Rejection::TooSmall {
            available: storage.available,
            needed_gb: need.size_gb,
        });
    }
    None
}

/// Whether the storage named `name` on `node` takes `need`, by the rule of [`choose`]: for a disk
/// that must go to one particular storage (a linked clone stays on its template's storage).
pub fn judge_named(
    node: &NodeSnapshot,
    name: &str,
    need: &StorageNeed<'_>,
) -> Result<StorageSnapshot, Rejection> {
    let storage = node.storage(name).ok_or(Rejection::NotOnNode)?;
    judge(node, storage, need).map_or_else(|| Ok(storage.clone()), Err)
}

/// Whether a storage of this plugin type can hold a linked clone of a template's disk. pve-storage
/// answers per plugin in `volume_has_feature(..., 'clone', ...)` for a template's base volume:
/// the file-based plugins (src/PVE/Storage/Plugin.pm: dir, NFS, CIFS, …, for raw, qcow2 and vmdk),
/// LvmThinPlugin.pm, ZFSPoolPlugin.pm, ZFSPlugin.pm, RBDPlugin.pm and BTRFSPlugin.pm can; plain LVM
/// (LVMPlugin.pm has `clone` commented out), iSCSI (ISCSIPlugin.pm, ISCSIDirectPlugin.pm: `copy`
/// only), PBS and ESXi cannot. A type we do not know (a third-party plugin) is given the benefit
/// of the doubt: Proxmox then answers for itself.
pub fn links_clones(storage_type: &str) -> bool {
    !matches!(
        storage_type,
        "lvm" | "iscsi" | "iscsidirect" | "pbs" | "esxi"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn storage(name: &str, content: &[&str], available_gib: u64) -> StorageSnapshot {
        StorageSnapshot {
            name: StorageId::new(name).unwrap(),
            storage_type: "lvmthin".into(),
            content: content.iter().map(|c| c.to_string()).collect(),
            active: true,
            shared: false,
            available: available_gib * GIB,
        }
    }

    fn node(storages: Vec<StorageSnapshot>) -> NodeSnapshot {
        NodeSnapshot {
            name: crate::proxmox::property::NodeName::new("pve1").unwrap(),
            online: true,
            memory_used: 0,
            memory_max: 8 * GIB,
            cpus: 0,
            vms: Vec::new(),
            storages,
        }
    }

    fn sel(expr: &str) -> StorageSelector {
        StorageSelector::new(expr).unwrap()
    }

    /// (case, storages, need, chosen, reasons of the storages before it)
    type Case<'a> = (
        &'a str,
        Vec<StorageSnapshot>,
        StorageNeed<'a>,
        Option<&'a str>,
        Vec<&'a str>,
    );

    #[test]
    fn first_storage_that_fits_in_api_order() {
        let any = sel("true");
        let lvm = sel("name == \"local-lvm\"");
        let ceph = sel("name == \"ceph\"");
        let broken = sel("availableSpace - 1000000000000000u > 0u");
        let dead = StorageSnapshot {
            active: false,
            ..storage("dead", &["images"], 500)
        };
        let standard = vec![
            storage("local", &["iso", "backup"], 50),
            dead.clone(),
            storage("local-lvm", &["images", "rootdir"], 100),
            storage("ceph", &["images"], 500),
        ];
        let nfs = sel("name == \"nfs\"");
        let cases: Vec<Case<'_>> = vec![
            (
                "boot disk skips ISO-only and inactive storages",
                standard.clone(),
                StorageNeed::boot_disk(&any, 20),
                Some("local-lvm"),
                vec![
                    "does not hold images (content: iso,backup)",
                    "is not active",
                ],
            ),
            (
                "a later storage the selector names",
                standard.clone(),
                StorageNeed::boot_disk(&ceph, 20),
                Some("ceph"),
                vec![
                    "does not hold images (content: iso,backup)",
                    "is not active",
                    "not selected by the selector",
                ],
            ),
            (
                "selected but too small",
                standard.clone(),
                StorageNeed::boot_disk(&lvm, 200),
                None,
                vec![
                    "does not hold images (content: iso,backup)",
                    "is not active",
                    "selected, but only 100 GiB free of 200 GiB needed",
                    "not selected by the selector",
                ],
            ),
            (
                "no storage matching",
                standard.clone(),
                StorageNeed::boot_disk(&nfs, 1),
                None,
                vec![
                    "does not hold images (content: iso,backup)",
                    "is not active",
                    "not selected by the selector",
                    "not selected by the selector",
                ],
            ),
            (
                "ISO without a selector takes the first ISO storage, whatever its room",
                standard.clone(),
                StorageNeed::download(Content::IsoImages, None),
                Some("local"),
                vec![],
            ),
            (
                "ISO with a selector that matches no ISO storage",
                standard.clone(),
                StorageNeed::download(Content::IsoImages, Some(&lvm)),
                None,
                vec![
                    "not selected by the selector",
                    "does not hold iso (content: images)",
                    "does not hold iso (content: images,rootdir)",
                    "does not hold iso (content: images)",
                ],
            ),
            (
                "a node without storages",
                vec![],
                StorageNeed::boot_disk(&any, 1),
                None,
                vec![],
            ),
        ];
        for (case, storages, need, chosen, reasons) in cases {
            let choice = choose(&node(storages), &need);
            assert_eq!(
                choice.chosen.as_ref().map(|s| s.name.as_str()),
                chosen,
                "{case}"
            );
            let got: Vec<String> = choice.rejected.iter().map(|(_, w)| w.to_string()).collect();
            assert_eq!(got, reasons, "{case}");
        }
        let failing = choose(&node(standard), &StorageNeed::boot_disk(&broken, 1));
        assert!(failing.chosen.is_none());
        assert!(failing.selector_error().is_some());
    }

    #[test]
    fn usable_lists_the_storages_a_selector_could_have_taken() {
        let n = node(vec![
            storage("local", &["iso"], 50),
            storage("data", &["images"], 5),
        ]);
        let iso = choose(
            &n,
            &StorageNeed::download(Content::IsoImages, Some(&sel("false"))),
        );
        assert_eq!(iso.usable().collect::<Vec<_>>(), ["local"]);
    }

    #[test]
    fn shared_only_and_named_storages() {
        let any = sel("true");
        let mut n = node(vec![storage("local-lvm", &["images"], 100)]);
        n.storages.push(StorageSnapshot {
            shared: true,
            ..storage("nfs", &["images"], 100)
        });
        let choice = choose(
            &n,
            &StorageNeed {
                shared_from: Some((
                    "pve2",
                    &[n.storages[0].name.clone(), n.storages[1].name.clone()],
                )),
                ..StorageNeed::boot_disk(&any, 10)
            },
        );
        assert_eq!(
            choice.chosen.map(|s| s.name.to_string()).as_deref(),
            Some("nfs")
        );
        assert_eq!(choice.rejected[0].1.to_string(), "selected, but not shared");
        let need = StorageNeed::boot_disk(&any, 0);
        assert!(judge_named(&n, "local-lvm", &need).is_ok());
        assert_eq!(judge_named(&n, "ceph", &need), Err(Rejection::NotOnNode));
        assert_eq!(
            judge_named(&n, "nfs", &StorageNeed::boot_disk(&sel("name == \"x\""), 0)),
            Err(Rejection::NotSelected)
        );
        assert!(links_clones("lvmthin") && links_clones("nfs") && links_clones("zfspool"));
        assert!(!links_clones("lvm") && !links_clones("iscsi"));
    }
}

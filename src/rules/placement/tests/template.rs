//! `boot: clone`: placement follows the copies of the template and what Proxmox can clone where.

use super::*;
use crate::model::TemplateFacts;
use crate::rules::placement;
use crate::rules::provider_data::CloneMode;

/// pve1 to pve3 with local-lvm (lvmthin, local), shared-nfs (nfs, shared) and on pve3 `thick`
/// (plain lvm).
fn clone_cluster() -> ClusterSnapshot {
    let shared = StorageSnapshot {
        name: sid("shared-nfs"),
        storage_type: "nfs".into(),
        shared: true,
        ..storage("shared-nfs", 500)
    };
    let thick = StorageSnapshot {
        storage_type: "lvm".into(),
        ..storage("thick", 500)
    };
    let mut nodes: Vec<NodeSnapshot> = ["pve1", "pve2", "pve3"]
        .iter()
        .map(|n| {
            let mut node = node(n, 64);
            node.storages.push(shared.clone());
            node
        })
        .collect();
    nodes[2].storages.push(thick);
    cluster(nodes)
}

/// A template `vmid` on `node` whose boot disk is on `storage` (as the cluster lists it there).
fn template_on(cluster: &ClusterSnapshot, vmid: u32, node: &str, storage: &str) -> TemplateFacts {
    let listed = cluster.node(node).and_then(|n| n.storage(storage));
    TemplateFacts {
        vmid,
        name: Some("talos-1.11".into()),
        node: node_name(node),
        drives: vec![crate::model::template::TemplateDrive {
            slot: "scsi0".into(),
            storage: storage.into(),
            shared: listed.is_some_and(|s| s.shared),
            storage_type: listed.map(|s| s.storage_type.clone()).unwrap_or_default(),
            linked: true,
        }],
        boot_storage: Some(storage.into()),
        node_storages: cluster
            .node(node)
            .map(|n| n.storages.iter().map(|s| s.name.clone()).collect())
            .unwrap_or_default(),
    }
}

fn source(mode: CloneMode, templates: Vec<TemplateFacts>) -> CloneSource {
    CloneSource {
        wanted: "talos-1.11".into(),
        mode,
        templates,
        offline: vec![],
    }
}

/// Template-aware placement: each case is (case, clone source, selector, pinned node, expected
/// verdict per node as placement says it). qemu-server src/PVE/API2/Qemu.pm `clone_vm` is the
/// source of the rules (see `clone.rs`).
#[test]
fn a_clone_goes_only_where_proxmox_can_make_it() {
    use crate::rules::provider_data::CloneMode::{Full, Linked};
    let cluster = clone_cluster();
    let local = template_on(&cluster, 9000, "pve1", "local-lvm");
    let shared = template_on(&cluster, 9001, "pve1", "shared-nfs");
    let thick = template_on(&cluster, 9002, "pve3", "thick");
    let local_copy = template_on(&cluster, 9003, "pve2", "local-lvm");
    let no_copy = "no copy of template talos-1.11 on pve2; its disks are on local-lvm (local to pve1: scsi0), and Proxmox clones to another node only a template wholly on shared storage";
    let no_copy3 = no_copy.replace("on pve2", "on pve3");
    let cases: Vec<(&str, CloneSource, &str, [&str; 3])> = vec![
        (
            "a local template: only its node",
            source(Full, vec![local.clone()]),
            "true",
            ["local-lvm from 9000", no_copy, &no_copy3],
        ),
        (
            "a copy on two nodes: each clones its own",
            source(Full, vec![local.clone(), local_copy.clone()]),
            "true",
            [
                "local-lvm from 9000",
                "local-lvm from 9003",
                "no copy of template talos-1.11 on pve3; its disks are on local-lvm (local to pve1: scsi0); its disks are on local-lvm (local to pve2: scsi0), and Proxmox clones to another node only a template wholly on shared storage",
            ],
        ),
        (
            "a shared template: other nodes clone onto a shared storage the selector takes",
            source(Full, vec![shared.clone()]),
            "true",
            [
                "local-lvm from 9001",
                "shared-nfs from 9001",
                "shared-nfs from 9001",
            ],
        ),
        (
            "a shared template, a selector of local storage only",
            source(Full, vec![shared.clone()]),
            "name == \"local-lvm\"",
            [
                "local-lvm from 9001",
                "template talos-1.11 is elsewhere, so the clone needs a shared storage here, and `name == \"local-lvm\"` selects none (local: does not hold images (content: iso); local-lvm: selected, but not shared; shared-nfs: not selected by the selector)",
                "template talos-1.11 is elsewhere, so the clone needs a shared storage here, and `name == \"local-lvm\"` selects none (local: does not hold images (content: iso); local-lvm: selected, but not shared; shared-nfs: not selected by the selector; thick: not selected by the selector)",
            ],
        ),
        (
            "linked: on the template's own storage, wherever the template reaches",
            source(Linked, vec![shared.clone()]),
            "true",
            [
                "shared-nfs from 9001",
                "shared-nfs from 9001",
                "shared-nfs from 9001",
            ],
        ),
        (
            "linked: the selector must take the template's storage",
            source(Linked, vec![local.clone()]),
            "name == \"ceph\"",
            [
                "clone_mode linked keeps the clone's disks on local-lvm, the storage of template talos-1.11, which `name == \"ceph\"` does not select",
                no_copy,
                &no_copy3,
            ],
        ),
        (
            "linked: not on plain LVM",
            source(Linked, vec![thick.clone()]),
            "true",
            [
                "no copy of template talos-1.11 on pve1; its disks are on thick (local to pve3: scsi0), and Proxmox clones to another node only a template wholly on shared storage",
                "no copy of template talos-1.11 on pve2; its disks are on thick (local to pve3: scsi0), and Proxmox clones to another node only a template wholly on shared storage",
                "clone_mode linked: scsi0 of template talos-1.11 is on thick (lvm), which cannot hold linked clones; use `clone_mode: full` or move the template to storage that can (e.g. lvmthin, zfspool, rbd, or qcow2 on a directory)",
            ],
        ),
    ];
    let empty = BTreeMap::new();
    for (case, src, selector, want) in cases {
        let sel = StorageSelector::new(selector).unwrap();
        let mut req = request(&sel, &empty);
        req.clone = Some(&src);
        let got: Vec<String> = cluster
            .nodes
            .iter()
            .map(
                |n| match node_verdict(n, &req, &Reservations::default()).unwrap() {
                    Ok(e) => format!("{} from {}", e.storage.name, e.template.unwrap_or(0)),
                    Err(why) => why.to_string(),
                },
            )
            .collect();
        assert_eq!(got, want, "{case}");
    }

    // Automatic placement: a local template sends every VM to its node, and says why not elsewhere.
    let src = source(Full, vec![local.clone()]);
    let sel = any_storage();
    let mut req = request(&sel, &empty);
    req.clone = Some(&src);
    let placed = placement::pick(&cluster, &req, &Reservations::default()).unwrap();
    assert_eq!(
        (placed.node.as_str(), placed.template),
        ("pve1", Some(9000))
    );
    assert!(
        placed
            .reason
            .to_string()
            .contains(&format!("pve2 not eligible: {no_copy}"))
    );
    // Pinned to a node that cannot clone: refused up front with the same reason, as a problem for a
    // person (nothing heals it).
    req = with(&req, |d| d.node = Some(node_name("pve2")));
    let err = placement::pick(&cluster, &req, &Reservations::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("node \"pve2\" from provider data cannot take this VM: {no_copy}")
    );
    assert!(!err.may_heal());
    // The template's node offline: said so, and waited for.
    let gone = CloneSource {
        templates: vec![],
        offline: vec!["pve1".into()],
        ..src.clone()
    };
    req.clone = Some(&gone);
    let err = placement::pick(&cluster, &req, &Reservations::default()).unwrap_err();
    assert!(
        err.to_string().contains(
            "no copy of template talos-1.11 on pve2; the copy on pve1 is on an offline node"
        ),
        "{err}"
    );
    assert!(err.may_heal());
}

/// qemu-server src/PVE/API2/Qemu.pm `clone_vm` checks a full clone's target `storage` with
/// `storage_check_enabled` on the node it runs on (the template's) before the `target` node: a
/// shared storage enabled on pve2 and pve3 only cannot take a clone of a template on pve1, though
/// the listing shows it on pve2.
#[test]
fn a_full_clone_to_another_node_needs_its_storage_on_the_template_node_too() {
    let mut cluster = clone_cluster();
    let ceph = StorageSnapshot {
        name: sid("ceph"),
        storage_type: "rbd".into(),
        shared: true,
        ..storage("ceph", 500)
    };
    for node in cluster
        .nodes
        .iter_mut()
        .filter(|n| n.name.as_str() != "pve1")
    {
        node.storages.push(ceph.clone());
    }
    let template = template_on(&cluster, 9001, "pve1", "shared-nfs");
    let src = source(CloneMode::Full, vec![template]);
    let sel = StorageSelector::new("name == \"ceph\"").unwrap();
    let empty = BTreeMap::new();
    let mut req = request(&sel, &empty);
    req.clone = Some(&src);
    let pve2 = cluster.node("pve2").unwrap();
    let why = node_verdict(pve2, &req, &Reservations::default())
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        why.contains("ceph: selected and shared, but not enabled on pve1, the template's node"),
        "{why}"
    );
    // Selected where the template's node has it too: cloned there.
    let sel = StorageSelector::new("name == \"shared-nfs\"").unwrap();
    let mut req = request(&sel, &empty);
    req.clone = Some(&src);
    let ok = node_verdict(pve2, &req, &Reservations::default())
        .unwrap()
        .unwrap();
    assert_eq!(ok.storage.name.as_str(), "shared-nfs");
}

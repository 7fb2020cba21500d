//! Placement against hand-built clusters: the per-node verdicts, the strategies, reservations.

use super::*;
use crate::model::{ClusterSnapshot, GIB, NodeSnapshot, StorageSnapshot, TemplateFacts, VmSummary};
use crate::pipeline::provider_data::CloneMode;
use proptest::prelude::*;

fn pick(
    nodes: &[NodeSnapshot],
    request: &PlacementRequest<'_>,
    reservations: &Reservations,
) -> Result<Placement, PlacementError> {
    super::pick(
        &ClusterSnapshot::from(nodes.to_vec()),
        request,
        reservations,
    )
}

fn storage(name: &str, available_gib: u64) -> StorageSnapshot {
    StorageSnapshot {
        name: name.into(),
        storage_type: "lvmthin".into(),
        content: vec!["images".into(), "rootdir".into()],
        enabled: true,
        active: true,
        shared: false,
        available: available_gib * GIB,
    }
}

fn node(name: &str, free_gib: u64) -> NodeSnapshot {
    NodeSnapshot {
        name: name.into(),
        online: true,
        memory_used: 0,
        memory_max: free_gib * GIB,
        cpus: 64,
        vms: vec![],
        storages: vec![
            StorageSnapshot {
                content: vec!["iso".into()],
                ..storage("local", 50)
            },
            storage("local-lvm", 100),
        ],
    }
}

fn request<'a>(
    selector: &'a StorageSelector,
    empty: &'a BTreeMap<String, StorageSelector>,
) -> PlacementRequest<'a> {
    PlacementRequest {
        request_id: "req-1",
        memory_mb: 4096,
        disk_gb: 20,
        selector,
        node_selectors: empty,
        pinned_node: None,
        allowed_nodes: &[],
        set_id: Some("workers"),
        strategy: PlacementStrategy::Spread,
        vcpus: 2,
        limits: PlacementLimits::default(),
        clone: None,
    }
}

fn any_storage() -> StorageSelector {
    StorageSelector::new("true").unwrap()
}

/// The rule for one node, as a table: (case, node, request changes, verdict as placement says it).
#[test]
fn node_verdicts_say_why_with_numbers() {
    let sel = any_storage();
    let ceph = StorageSelector::new("name == \"ceph\"").unwrap();
    let empty = BTreeMap::new();
    let allowed = vec!["pve1".to_string()];
    let mut reserved = Reservations::default();
    reserved.reserve("other", "pve1", None, 30 * 1024, 2);
    let small_disk = {
        let mut n = node("pve1", 64);
        n.storages[1].available = 10 * GIB;
        n
    };
    type Case<'a> = (
        &'a str,
        NodeSnapshot,
        PlacementRequest<'a>,
        &'a Reservations,
        &'a str,
    );
    let none = Reservations::default();
    let base = request(&sel, &empty);
    let cases: Vec<Case<'_>> = vec![
        (
            "fits",
            node("pve1", 64),
            base.clone(),
            &none,
            "eligible: local-lvm, 65536 MiB free",
        ),
        (
            "not allowed",
            node("pve2", 64),
            PlacementRequest {
                allowed_nodes: &allowed,
                ..base.clone()
            },
            &none,
            "not in allowed_nodes",
        ),
        (
            "offline",
            NodeSnapshot {
                online: false,
                ..node("pve1", 64)
            },
            base.clone(),
            &none,
            "offline",
        ),
        (
            "memory short",
            node("pve1", 2),
            base.clone(),
            &none,
            "2048 MiB free memory, 4096 MiB needed",
        ),
        (
            "memory short once another request's reservation counts",
            node("pve1", 32),
            base.clone(),
            &reserved,
            "2048 MiB free memory, 4096 MiB needed",
        ),
        (
            "no storage matching",
            node("pve1", 64),
            PlacementRequest {
                selector: &ceph,
                ..base.clone()
            },
            &none,
            "no active storage for VM images matches the storage selector `name == \"ceph\"`",
        ),
        (
            "disk too small",
            small_disk,
            base.clone(),
            &none,
            "not enough disk space for 20 GiB (local-lvm has 10 GiB free)",
        ),
    ];
    for (case, node, req, reservations, want) in cases {
        let got = match node_verdict(&node, &req, reservations).unwrap() {
            Ok(e) => format!(
                "eligible: {}, {} MiB free",
                e.storage.name,
                e.free_memory / MIB
            ),
            Err(why) => why.to_string(),
        };
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn a_pinned_node_is_used_even_when_its_memory_is_short() {
    let sel = any_storage();
    let empty = BTreeMap::new();
    let req = PlacementRequest {
        pinned_node: Some("pve1"),
        ..request(&sel, &empty)
    };
    let tight = node("pve1", 2);
    assert!(matches!(
        node_verdict(&tight, &req, &Reservations::default()).unwrap(),
        Err(LeftOut::MemoryShort { .. })
    ));
    let placed = pick(&[tight], &req, &Reservations::default()).unwrap();
    assert_eq!(placed.reason, PlacementReason::Pinned);
}

#[test]
fn pinned_node_must_exist_be_online_and_have_storage() {
    let sel = any_storage();
    let empty = BTreeMap::new();
    let nodes = vec![
        node("pve1", 32),
        NodeSnapshot {
            online: false,
            ..node("pve2", 32)
        },
    ];
    let mut req = request(&sel, &empty);
    req.pinned_node = Some("pve9");
    let err = pick(&nodes, &req, &Reservations::default()).unwrap_err();
    assert_eq!(
        err,
        PlacementError::PinnedNodeMissing {
            node: "pve9".into(),
            existing: vec!["pve1".into(), "pve2".into()]
        }
    );
    assert!(err.to_string().contains("pve1, pve2"));
    req.pinned_node = Some("pve2");
    assert!(matches!(
        pick(&nodes, &req, &Reservations::default()),
        Err(PlacementError::PinnedNodeOffline { .. })
    ));
    req.pinned_node = Some("pve1");
    let placed = pick(&nodes, &req, &Reservations::default()).unwrap();
    assert_eq!(
        (
            placed.node.as_str(),
            placed.storage.as_str(),
            placed.reason.clone()
        ),
        ("pve1", "local-lvm", PlacementReason::Pinned)
    );
    let ceph = StorageSelector::new("name == \"ceph\"").unwrap();
    let req = PlacementRequest {
        selector: &ceph,
        ..req
    };
    let err = pick(&nodes, &req, &Reservations::default()).unwrap_err();
    assert!(matches!(err, PlacementError::PinnedNodeNoStorage { .. }));
    assert!(err.to_string().contains("name == \"ceph\""), "{err}");
}

#[test]
fn prefers_fewest_of_the_set_then_most_memory_then_name() {
    let sel = any_storage();
    let empty = BTreeMap::new();
    let tagged = |n: &str| VmSummary {
        name: n.into(),
        tags: vec!["machine-request.workers".into()],
        ..Default::default()
    };
    let mut a = node("pve1", 64);
    a.vms.push(tagged("w1"));
    let b = node("pve2", 16);
    let c = node("pve3", 32);
    let placed = pick(
        &[a.clone(), b.clone(), c.clone()],
        &request(&sel, &empty),
        &Reservations::default(),
    )
    .unwrap();
    assert_eq!(placed.node, "pve3");
    assert!(
        placed
            .reason
            .to_string()
            .starts_with("automatically picked node")
    );
    let equal = [node("pveb", 8), node("pvea", 8)];
    assert_eq!(
        pick(&equal, &request(&sel, &empty), &Reservations::default())
            .unwrap()
            .node,
        "pvea"
    );
    let mut binpack = request(&sel, &empty);
    binpack.strategy = PlacementStrategy::Binpack;
    assert_eq!(
        pick(
            &[a.clone(), b.clone(), c.clone()],
            &binpack,
            &Reservations::default()
        )
        .unwrap()
        .node,
        "pve2"
    );
    let mut fewer = request(&sel, &empty);
    fewer.strategy = PlacementStrategy::FewerVms;
    assert_eq!(
        pick(&[a, b, c], &fewer, &Reservations::default())
            .unwrap()
            .node,
        "pve3"
    );
}

#[test]
fn rejects_nodes_that_do_not_fit_and_says_why() {
    let sel = StorageSelector::new("storageType == \"lvmthin\"").unwrap();
    let empty = BTreeMap::new();
    let mut small_disk = node("pve1", 64);
    small_disk.storages[1].available = 10 * GIB;
    let low_memory = node("pve2", 2);
    let offline = NodeSnapshot {
        online: false,
        ..node("pve3", 64)
    };
    let outside = node("pve4", 64);
    let allowed = vec!["pve1".to_string(), "pve2".to_string(), "pve3".to_string()];
    let mut req = request(&sel, &empty);
    req.allowed_nodes = &allowed;
    let err = pick(
        &[small_disk, low_memory, offline, outside],
        &req,
        &Reservations::default(),
    )
    .unwrap_err();
    let PlacementError::NothingFits { rejected } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(rejected.len(), 4);
    let text = err.to_string();
    assert!(
        text.contains("pve1: not enough disk space for 20 GiB (local-lvm has 10 GiB free)"),
        "{text}"
    );
    assert!(
        text.contains("pve2: 2048 MiB free memory, 4096 MiB needed"),
        "{text}"
    );
    assert!(
        text.contains("pve3: offline") && text.contains("pve4: not in allowed_nodes"),
        "{text}"
    );
    let err = pick(&[], &req, &Reservations::default()).unwrap_err();
    assert!(err.to_string().contains("no nodes"));
}

#[test]
fn first_matching_storage_in_api_order_and_per_node_selectors() {
    let sel = any_storage();
    let mut n = node("pve1", 64);
    n.storages.push(storage("ceph", 500));
    n.storages.insert(
        1,
        StorageSnapshot {
            active: false,
            ..storage("dead", 500)
        },
    );
    let empty = BTreeMap::new();
    assert_eq!(
        pick(
            std::slice::from_ref(&n),
            &request(&sel, &empty),
            &Reservations::default()
        )
        .unwrap()
        .storage,
        "local-lvm"
    );
    let overrides = BTreeMap::from([(
        "pve1".to_string(),
        StorageSelector::new("name == \"ceph\"").unwrap(),
    )]);
    assert_eq!(
        pick(&[n], &request(&sel, &overrides), &Reservations::default())
            .unwrap()
            .storage,
        "ceph"
    );
}

#[test]
fn selector_runtime_errors_are_configuration_errors() {
    let sel = StorageSelector::new("availableSpace - 1000000000000000u > 0u").unwrap();
    let empty = BTreeMap::new();
    assert!(matches!(
        pick(
            &[node("pve1", 64)],
            &request(&sel, &empty),
            &Reservations::default()
        ),
        Err(PlacementError::Selector(_))
    ));
}

#[test]
fn reservations_count_until_the_vm_appears() {
    let sel = any_storage();
    let empty = BTreeMap::new();
    let mut reservations = Reservations::default();
    reservations.reserve("other", "pve1", Some("workers"), 4096, 2);
    let nodes = [node("pve1", 64), node("pve2", 32)];
    assert_eq!(
        pick(&nodes, &request(&sel, &empty), &reservations)
            .unwrap()
            .node,
        "pve2"
    );
    // Once the VM is visible with its tag, the reservation is not counted twice.
    let mut with_vm = nodes.clone();
    with_vm[0].vms.push(VmSummary {
        name: "other".into(),
        tags: vec!["machine-request.workers".into()],
        ..Default::default()
    });
    with_vm[1].vms.push(VmSummary {
        name: "x".into(),
        tags: vec!["machine-request.workers".into()],
        ..Default::default()
    });
    assert_eq!(
        pick(&with_vm, &request(&sel, &empty), &reservations)
            .unwrap()
            .node,
        "pve1"
    );
    assert!(reservations.release("other").is_some());
    assert!(reservations.is_empty());
}

proptest! {
    #[test]
    fn a_set_spreads_evenly_over_equal_nodes(nodes_n in 1usize..5, per_node in 1usize..4, memory in 2048u64..8192) {
        let sel = any_storage();
        let empty = BTreeMap::new();
        let nodes: Vec<NodeSnapshot> = (0..nodes_n).map(|i| node(&format!("pve{i}"), 256)).collect();
        let mut reservations = Reservations::default();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for r in 0..nodes_n * per_node {
            let id = format!("req-{r}");
            let req = PlacementRequest { request_id: &id, memory_mb: memory, ..request(&sel, &empty) };
            let placed = pick(&nodes, &req, &reservations).unwrap();
            reservations.reserve(&id, &placed.node, Some("workers"), memory, 2);
            *counts.entry(placed.node).or_default() += 1;
        }
        prop_assert_eq!(counts.len(), nodes_n);
        prop_assert!(counts.values().all(|c| *c == per_node), "{:?}", counts);
    }

    #[test]
    fn never_picks_an_ineligible_node(
        specs in proptest::collection::vec((any::<bool>(), 0u64..64, 0u64..200, 0usize..4), 1..6),
        memory_mb in 2048u64..16384,
        disk_gb in 5u64..150,
    ) {
        let sel = any_storage();
        let empty = BTreeMap::new();
        let nodes: Vec<NodeSnapshot> = specs.iter().enumerate().map(|(i, (online, mem, disk, vms))| {
            let mut n = node(&format!("n{i}"), *mem);
            n.online = *online;
            n.storages[1].available = disk * GIB;
            n.vms = (0..*vms).map(|v| VmSummary { name: format!("vm{i}-{v}"), ..Default::default() }).collect();
            n
        }).collect();
        let req = PlacementRequest { memory_mb, disk_gb, ..request(&sel, &empty) };
        match pick(&nodes, &req, &Reservations::default()) {
            Ok(p) => {
                let n = nodes.iter().find(|n| n.name == p.node).unwrap();
                prop_assert!(n.online);
                prop_assert!(n.memory_max - n.memory_used >= memory_mb * MIB);
                prop_assert!(n.storages[1].available >= disk_gb * GIB);
            }
            Err(PlacementError::NothingFits { rejected }) => prop_assert_eq!(rejected.len(), nodes.len()),
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }
}

#[test]
fn six_requests_of_one_set_spread_two_per_node() {
    let sel = any_storage();
    let empty = BTreeMap::new();
    let nodes = [node("pve1", 64), node("pve2", 64), node("pve3", 64)];
    let mut reservations = Reservations::default();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in 0..6 {
        let id = format!("req-{r}");
        let req = PlacementRequest {
            request_id: &id,
            ..request(&sel, &empty)
        };
        let placed = pick(&nodes, &req, &reservations).unwrap();
        reservations.reserve(&id, &placed.node, Some("workers"), 4096, 2);
        *counts.entry(placed.node).or_default() += 1;
    }
    assert_eq!(counts.into_values().collect::<Vec<_>>(), vec![2, 2, 2]);
}

/// Room that may come back (a node offline, memory or space short) is waited for; a class that
/// names what is not there or cannot match needs someone to change it.
#[test]
fn placement_failures_say_whether_they_may_heal() {
    use super::{LeftOut, PlacementError};
    use crate::rules::storage::Rejection;
    let no_storage = |why: Rejection| LeftOut::NoStorage {
        need_gb: 10,
        selector: "true".into(),
        rejected: vec![("local-lvm".into(), why)],
    };
    let cases = [
        (
            PlacementError::PinnedNodeOffline {
                node: "pve1".into(),
            },
            true,
        ),
        (
            PlacementError::PinnedNodeMissing {
                node: "pve9".into(),
                existing: vec!["pve1".into()],
            },
            false,
        ),
        (
            PlacementError::NothingFits {
                rejected: vec![(
                    "pve1".into(),
                    LeftOut::MemoryShort {
                        free_memory: 1,
                        needed_mb: 4096,
                    },
                )],
            },
            true,
        ),
        (
            PlacementError::NothingFits {
                rejected: vec![("pve1".into(), LeftOut::NotAllowed)],
            },
            false,
        ),
        (
            PlacementError::NothingFits {
                rejected: vec![("pve1".into(), no_storage(Rejection::NotSelected))],
            },
            false,
        ),
        (
            PlacementError::PinnedNodeNoStorage {
                node: "pve1".into(),
                reason: no_storage(Rejection::TooSmall {
                    available: 0,
                    needed_gb: 10,
                }),
            },
            true,
        ),
    ];
    for (error, heals) in cases {
        assert_eq!(error.may_heal(), heals, "{error}");
    }
}

/// pve1 to pve3 with local-lvm (lvmthin, local), shared-nfs (nfs, shared) and on pve3 `thick`
/// (plain lvm).
fn clone_cluster() -> ClusterSnapshot {
    let shared = StorageSnapshot {
        name: "shared-nfs".into(),
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
    ClusterSnapshot::from(nodes)
}

/// A template `vmid` on `node` whose boot disk is on `storage` (as the cluster lists it there).
fn template_on(cluster: &ClusterSnapshot, vmid: u32, node: &str, storage: &str) -> TemplateFacts {
    let listed = cluster.node(node).and_then(|n| n.storage(storage));
    TemplateFacts {
        vmid,
        name: Some("talos-1.11".into()),
        node: node.into(),
        drives: vec![crate::model::TemplateDrive {
            slot: "scsi0".into(),
            storage: storage.into(),
            shared: listed.is_some_and(|s| s.shared),
            storage_type: listed.map(|s| s.storage_type.clone()).unwrap_or_default(),
            linked: true,
        }],
        boot_storage: Some(storage.into()),
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
    use crate::pipeline::provider_data::CloneMode::{Full, Linked};
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
    let placed = super::pick(&cluster, &req, &Reservations::default()).unwrap();
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
    req.pinned_node = Some("pve2");
    let err = super::pick(&cluster, &req, &Reservations::default()).unwrap_err();
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
    let err = super::pick(&cluster, &req, &Reservations::default()).unwrap_err();
    assert!(
        err.to_string().contains(
            "no copy of template talos-1.11 on pve2; the copy on pve1 is on an offline node"
        ),
        "{err}"
    );
    assert!(err.may_heal());
}

/// CPU- and memory-aware placement: vCPUs (`maxcpu`) and memory (`maxmem`) of every VM on the
/// node, plus reservations in flight, against the node's CPUs and memory times the overcommit.
#[test]
fn vcpus_and_memory_given_to_vms_keep_a_full_node_out() {
    let sel = any_storage();
    let empty = BTreeMap::new();
    let vm = |cpus: u64, memory_gib: u64| VmSummary {
        name: "vm".into(),
        cpus,
        memory: memory_gib * GIB,
        ..Default::default()
    };
    let mut full = node("pve1", 64);
    full.cpus = 4;
    full.vms = vec![vm(8, 4), vm(6, 4)];
    let mut roomy = node("pve2", 64);
    roomy.cpus = 4;
    let mut req = request(&sel, &empty);
    req.vcpus = 4;
    let nodes = vec![full.clone(), roomy.clone()];
    let placed = pick(&nodes, &req, &Reservations::default()).unwrap();
    assert_eq!(placed.node, "pve2");
    let PlacementReason::Automatic { rejected, .. } = &placed.reason else {
        panic!("automatic")
    };
    assert_eq!(
        rejected[0].1.to_string(),
        "14 vCPUs given to VMs, 4 more would pass the limit of 16 (4 CPUs × cpuOvercommit 4)"
    );
    // Within the limit exactly: 14 + 2 = 16.
    req.vcpus = 2;
    assert!(capacity_fit(&full, &req, &Reservations::default()).is_ok());
    // A reservation in flight counts until its VM is listed.
    let mut reserved = Reservations::default();
    reserved.reserve("other", "pve1", None, 2048, 2);
    assert!(matches!(
        capacity_fit(&full, &req, &reserved),
        Err(LeftOut::CpusCommitted { allocated: 16, .. })
    ));
    // More vCPUs than the node has CPUs never starts there (qemu-server `config_to_command`).
    req.vcpus = 8;
    assert_eq!(
        capacity_fit(&roomy, &req, &Reservations::default())
            .unwrap_err()
            .to_string(),
        "8 vCPUs are more than its 4 CPUs (Proxmox will not start the VM there)"
    );
    req.pinned_node = Some("pve2");
    let err = pick(&nodes, &req, &Reservations::default()).unwrap_err();
    assert!(
        matches!(err, PlacementError::PinnedNodeTooSmall { .. }) && !err.may_heal(),
        "{err}"
    );
    req.pinned_node = None;
    // A larger ratio lets more in.
    req.vcpus = 4;
    req.limits.cpu_overcommit = 5.0;
    assert!(capacity_fit(&full, &req, &Reservations::default()).is_ok());

    // Memory: 60 GiB given on a 64 GiB node (free memory itself is plenty), 8 GiB more is past
    // 64 × 1.0, but within 64 × 1.5.
    let mut committed = node("pve1", 64);
    committed.vms = vec![vm(1, 60)];
    req.memory_mb = 8192;
    assert_eq!(
        capacity_fit(&committed, &req, &Reservations::default())
            .unwrap_err()
            .to_string(),
        "61440 MiB of memory given to VMs, 8192 MiB more would pass the limit of 65536 MiB (memory × memoryOvercommit 1)"
    );
    req.limits.memory_overcommit = 1.5;
    assert!(capacity_fit(&committed, &req, &Reservations::default()).is_ok());
    // A node that reports no CPUs (no stats yet) is not judged on them.
    let mut unknown = node("pve1", 64);
    unknown.cpus = 0;
    unknown.vms = vec![vm(100, 1)];
    assert!(capacity_fit(&unknown, &req, &Reservations::default()).is_ok());
    let a = allocation(
        &full,
        &PlacementLimits::default(),
        &Reservations::default(),
        "",
    );
    assert_eq!((a.cpus_allocated, a.cpus_limit), (14, Some(16)));
    assert_eq!(
        (a.memory_allocated, a.memory_limit),
        (8 * GIB, Some(64 * GIB))
    );
}

//! The rule for one node and the reasons it gives, alone and as `pick` reports them.

use super::*;
use crate::model::MIB;
use proptest::prelude::*;

/// The rule for one node, as a table: (case, node, request changes, verdict as placement says it).
#[test]
fn node_verdicts_say_why_with_numbers() {
    let sel = any_storage();
    let ceph = StorageSelector::new("name == \"ceph\"").unwrap();
    let empty = BTreeMap::new();
    let allowed = vec![node_name("pve1")];
    let mut reserved = Reservations::default();
    reserve(
        &mut reserved,
        "other",
        &node_name("pve1"),
        None,
        30 * 1024,
        2,
    );
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
            with(&base, |d| d.allowed_nodes = allowed.clone()),
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
            selecting(&base, &ceph),
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
    let allowed = ["pve1", "pve2", "pve3"].map(node_name);
    let mut req = request(&sel, &empty);
    req = with(&req, |d| d.allowed_nodes = allowed.to_vec());
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
        .storage
        .as_str(),
        "local-lvm"
    );
    let overrides = BTreeMap::from([(
        "pve1".to_string(),
        StorageSelector::new("name == \"ceph\"").unwrap(),
    )]);
    assert_eq!(
        pick(&[n], &request(&sel, &overrides), &Reservations::default())
            .unwrap()
            .storage
            .as_str(),
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

proptest! {
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
            n.vms = (0..*vms).map(|v| listed_vm(&format!("vm{i}-{v}"), "", 0, 0)).collect();
            n
        }).collect();
        let req = with(&request(&sel, &empty), |d| { d.memory_mb = memory_mb; d.disk_size_gb = disk_gb; });
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
            PlacementError::PinnedNodeRefused {
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

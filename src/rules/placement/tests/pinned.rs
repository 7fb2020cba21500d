//! A node pinned in the provider data: used when it can run the VM, refused with a reason when not.

use super::*;

#[test]
fn a_pinned_node_is_used_even_when_its_memory_is_short() {
    let sel = any_storage();
    let empty = BTreeMap::new();
    let req = with(&request(&sel, &empty), |d| d.node = Some(node_name("pve1")));
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
    req = with(&req, |d| d.node = Some(node_name("pve9")));
    let err = pick(&nodes, &req, &Reservations::default()).unwrap_err();
    assert_eq!(
        err,
        PlacementError::PinnedNodeMissing {
            node: "pve9".into(),
            existing: vec!["pve1".into(), "pve2".into()]
        }
    );
    assert!(err.to_string().contains("pve1, pve2"));
    req = with(&req, |d| d.node = Some(node_name("pve2")));
    assert!(matches!(
        pick(&nodes, &req, &Reservations::default()),
        Err(PlacementError::PinnedNodeOffline { .. })
    ));
    req = with(&req, |d| d.node = Some(node_name("pve1")));
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
    let req = selecting(&req, &ceph);
    let err = pick(&nodes, &req, &Reservations::default()).unwrap_err();
    assert!(matches!(
        err,
        PlacementError::PinnedNodeRefused {
            reason: LeftOut::NoStorage { .. },
            ..
        }
    ));
    assert!(err.to_string().contains("name == \"ceph\""), "{err}");
}

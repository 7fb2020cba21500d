//! vCPUs and memory given to VMs against the overcommit limits.

use super::*;

/// CPU- and memory-aware placement: vCPUs (`maxcpu`) and memory (`maxmem`) of every VM on the
/// node, plus reservations in flight, against the node's CPUs and memory times the overcommit.
#[test]
fn vcpus_and_memory_given_to_vms_keep_a_full_node_out() {
    let sel = any_storage();
    let empty = BTreeMap::new();
    let vm = |cpus: u64, memory_gib: u64| listed_vm("vm", "", cpus, memory_gib * GIB);
    let mut full = node("pve1", 64);
    full.cpus = 4;
    full.vms = vec![vm(8, 4), vm(6, 4)];
    let mut roomy = node("pve2", 64);
    roomy.cpus = 4;
    let mut req = with(&request(&sel, &empty), |d| d.cores = 4);
    let nodes = vec![full.clone(), roomy.clone()];
    let placed = pick(&nodes, &req, &Reservations::default()).unwrap();
    assert_eq!(placed.node.as_str(), "pve2");
    let PlacementReason::Automatic { rejected, .. } = &placed.reason else {
        panic!("automatic")
    };
    assert_eq!(
        rejected[0].1.to_string(),
        "14 vCPUs given to VMs, 4 more would pass the limit of 16 (4 CPUs × cpuOvercommit 4)"
    );
    // Within the limit exactly: 14 + 2 = 16.
    req = with(&req, |d| d.cores = 2);
    assert!(capacity_fit(&full, &req, &Reservations::default()).is_ok());
    // A reservation in flight counts until its VM is listed.
    let mut reserved = Reservations::default();
    reserve(&mut reserved, "other", &node_name("pve1"), None, 2048, 2);
    assert!(matches!(
        capacity_fit(&full, &req, &reserved),
        Err(LeftOut::CpusCommitted { allocated: 16, .. })
    ));
    // More vCPUs than the node has CPUs never starts there (qemu-server `config_to_command`).
    req = with(&req, |d| d.cores = 8);
    assert_eq!(
        capacity_fit(&roomy, &req, &Reservations::default())
            .unwrap_err()
            .to_string(),
        "8 vCPUs are more than its 4 CPUs (Proxmox will not start the VM there)"
    );
    req = with(&req, |d| d.node = Some(node_name("pve2")));
    let err = pick(&nodes, &req, &Reservations::default()).unwrap_err();
    assert!(
        matches!(
            err,
            PlacementError::PinnedNodeRefused {
                reason: LeftOut::TooFewCpus { .. },
                ..
            }
        ) && !err.may_heal(),
        "{err}"
    );
    req = with(&req, |d| d.node = None);
    // A larger ratio lets more in.
    req = with(&req, |d| d.cores = 4);
    req.limits.cpu_overcommit = 5.0;
    assert!(capacity_fit(&full, &req, &Reservations::default()).is_ok());

    // Memory: 60 GiB given on a 64 GiB node (free memory itself is plenty), 8 GiB more is past
    // 64 × 1.0, but within 64 × 1.5.
    let mut committed = node("pve1", 64);
    committed.vms = vec![vm(1, 60)];
    req = with(&req, |d| d.memory_mb = 8192);
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

//! The VM lifecycle against what real Proxmox VE does (pvestatd's lag, create locks, offline storages,
//! the HA manager), each case pinned to the upstream code it follows.

use super::*;

/// pve-manager PVE/API2/Cluster.pm, `resources`: a VM's entry comes from PVE/API2Tools.pm
/// `extract_vm_stats`, which takes name, status and template from the RRD data that pvestatd
/// (PVE/Service/pvestatd.pm) broadcasts; only tags and lock are read from the config. A VM created a
/// few seconds ago, and every VM of a node offline for more than a few minutes, is listed with vmid,
/// node, status "unknown", tags, and no name. Such a VM must be identified from its config, never
/// declared "not ours" (which would leak it).
#[tokio::test]
async fn vm_listed_without_name_is_identified_from_its_config_and_deleted() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let target = provision(&pve, "req-nostats", 150, "pve2", true).await;
    fake.control(json!({"op": "listing_without_stats", "vmid": 150}));
    let listed = pve.cluster_listing().await.unwrap();
    let entry = listed.iter().find_map(|r| match r {
        ClusterResource::Vm(vm) if vm.vmid == vmid(150) => Some(vm),
        _ => None,
    });
    let entry = entry.expect("still listed");
    assert_eq!(entry.name, None, "the fake lists it as real PVE does");
    assert_eq!(entry.status.as_deref(), Some("unknown"));
    assert!(
        entry.tags.is_some(),
        "tags come from the config, not pvestatd"
    );

    let (result, _) = run(&pve, &target).await;
    assert_eq!(
        result.unwrap(),
        DeprovisionOutcome::Deleted {
            node: node("pve2"),
            vmid: vmid(150)
        }
    );
    assert_eq!(fake.vm(150), Value::Null, "not leaked");
    assert!(disks_of(&mut fake, 150).is_empty());
}

/// qemu-server src/PVE/API2/Qemu.pm `create_vm` writes a config holding only `lock: create`
/// (`create_and_lock_config`) before forking its worker, and the full config (name, tags, our
/// marker) only once every disk is allocated, which can take minutes. A teardown arriving meanwhile
/// (the request deleted while its create runs) sees a nameless, markerless VM at the recorded VMID:
/// it must wait for the create instead of calling the VM someone else's and leaving it behind.
#[tokio::test]
async fn a_vm_still_being_created_is_waited_for_not_left_behind() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let target = provision(&pve, "req-creating", 152, "pve1", false).await;
    let full = fake.vm(152)["config"].clone();
    fake.control(json!({"op": "set_vm", "vmid": 152, "config": {}, "lock": "create"}));
    fake.control(json!({"op": "listing_without_stats", "vmid": 152}));

    let (result, _) = run(&pve, &target).await;
    let err = result.unwrap_err();
    assert!(retried_alone(&err), "{err}");
    assert!(err.to_string().contains("create"), "{err}");
    assert_ne!(fake.vm(152), Value::Null, "left for the create to finish");

    // The worker writes the full config and drops the lock: now it is ours and goes.
    fake.control(json!({"op": "set_vm", "vmid": 152, "config": full, "lock": null}));
    let (result, _) = run(&pve, &target).await;
    assert_eq!(
        result.unwrap(),
        DeprovisionOutcome::Deleted {
            node: node("pve1"),
            vmid: vmid(152)
        }
    );
    assert_eq!(fake.vm(152), Value::Null);
}

/// The same listing for a node that has been offline for minutes: the VM cannot be identified, so
/// the teardown waits for the node (transient error) instead of calling the VM someone else's.
#[tokio::test]
async fn vm_listed_without_name_on_an_offline_node_is_waited_for() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let target = provision(&pve, "req-nostats-off", 151, "pve3", true).await;
    fake.control(json!({"op": "set_node_offline", "node": "pve3"}));
    fake.control(json!({"op": "listing_without_stats", "node": "pve3"}));

    let (result, _) = run(&pve, &target).await;
    let err = result.unwrap_err();
    assert!(retried_alone(&err), "{err}");
    assert!(err.to_string().contains("pve3"), "{err}");
    assert_ne!(fake.vm(151), Value::Null);

    fake.control(json!({"op": "set_node_offline", "node": "pve3", "offline": false}));
    let (result, _) = run(&pve, &target).await;
    assert!(
        matches!(result.unwrap(), DeprovisionOutcome::Deleted { .. }),
        "deleted once the node is back, even before pvestatd reports it"
    );
    assert_eq!(fake.vm(151), Value::Null);
}

/// pve-storage PVE/API2/Storage/Content.pm, `delete`: the volume free can fail (storage offline,
/// permission, a broken mount) as often as it is retried. The VM is gone by then: the deprovision
/// finishes, reports the seed ISO as left over, and the `orphans` search lists it.
#[tokio::test]
async fn failing_seed_iso_delete_does_not_hold_the_teardown() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let target = provision(&pve, "req-seedfail", 152, "pve1", true).await;
    fake.control(
        json!({"op": "fail", "method": "DELETE", "suffix": "omni-seed-req-seedfail.iso",
                        "status": 500, "message": "storage 'local' is not online"}),
    );

    let progress = |_: &str| {};
    let done = omni_infra_provider_proxmox::pipeline::deprovision::deprovision_reporting(
        &pve,
        &target,
        &DeprovisionOptions::default(),
        &progress,
    )
    .await
    .unwrap();
    assert_eq!(
        done.outcome,
        DeprovisionOutcome::Deleted {
            node: node("pve1"),
            vmid: vmid(152)
        }
    );
    let left = done.leftover_seed_iso.expect("the seed ISO is reported");
    assert!(
        left.to_string().contains("omni-seed-req-seedfail.iso")
            && left.to_string().contains("not online"),
        "{left}"
    );
    assert_eq!(fake.vm(152), Value::Null);
    assert!(has_volume(&mut fake, "local", "omni-seed-req-seedfail.iso"));
    // The plain entry point succeeds too: nothing for the controller to retry for ever.
    let (again, _) = run(&pve, &target).await;
    assert_eq!(again.unwrap(), DeprovisionOutcome::AlreadyGone);

    let found = orphans::scan(&pve, PROVIDER, &BTreeSet::new())
        .await
        .unwrap();
    // fakepve's `local` is one store seen from every node: the same volume, once per node.
    let isos: BTreeSet<&str> = found.seed_isos.iter().map(|i| i.volume.as_str()).collect();
    assert_eq!(
        isos,
        ["local:iso/omni-seed-req-seedfail.iso"].into(),
        "{found:?}"
    );
}

/// PVE lowercases tags by default (datacenter.cfg `tag-style`; qemu-server stores `tags` through
/// PVE::JSONSchema's `pve-tag-list`, and the GUI/API sort and lowercase them unless case-sensitive
/// is set): a provider ID with capitals is found back in lowercase. The orphan search and the
/// deprovision must still see these VMs as ours and their requests as live.
#[tokio::test]
async fn mixed_case_provider_and_request_ids_survive_lowercased_tags() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let mut target = provision(&pve, "req-x", 153, "pve1", false).await;
    // Rewrite the VM as a provider "Prox-A" would have made it for request "Req-X", with the tags
    // lowercased the way PVE stores them.
    let config = json!({
        "name": "Req-X",
        "tags": "omni-provider.prox-a;omni-request.req-x",
        "description": "Managed by the Omni infrastructure provider for Proxmox VE. Do not edit the two lines below.\nomni-provider-id: Prox-A\nomni-machine-request: Req-X"
    });
    let form: Vec<(String, String)> = config
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    pve.vm(&node("pve1"), vmid(153))
        .update_config(form)
        .await
        .unwrap();
    let live: BTreeSet<String> = ["Req-X".to_string()].into();
    let found = orphans::scan(&pve, "Prox-A", &live).await.unwrap();
    assert!(found.vms.is_empty(), "a live request's VM: {found:?}");
    let found = orphans::scan(&pve, "Prox-A", &BTreeSet::new())
        .await
        .unwrap();
    assert_eq!(found.vms.len(), 1, "{found:?}");
    assert_eq!(found.vms[0].request_id.as_deref(), Some("Req-X"));

    target.request_id = "Req-X".into();
    target.provider_id = "Prox-A".into();
    target.smbios_uuid = None;
    let (result, _) = run(&pve, &target).await;
    assert!(
        matches!(result.unwrap(), DeprovisionOutcome::Deleted { .. }),
        "ours despite the lowercased tags"
    );
    assert_eq!(fake.vm(153), Value::Null);
}

/// qemu-server src/PVE/API2/Qemu.pm: `vm_shutdown` of an HA-managed VM (PVE::HA::Config::
/// vm_is_ha_managed) only runs `ha-manager crm-command stop` in a `hastop` worker that ends at once,
/// and `destroy_vm` refuses a running VM ("VM <id> is running - destroy failed"). The VM must leave
/// HA first (pve-ha-manager src/PVE/API2/HA/Resources.pm `delete`), then be shut down, then destroyed,
/// in one deprovision.
#[tokio::test]
async fn ha_managed_vm_leaves_ha_then_is_shut_down_and_destroyed() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let target = provision(&pve, "req-ha", 154, "pve1", true).await;
    let started =
        omni_infra_provider_proxmox::proxmox::client::Params::new().with("state", "started");
    pve.add_ha_resource(vmid(154), started).await.unwrap();
    fake.control(json!({"op": "reset_requests"}));

    let (result, progress) = run(&pve, &target).await;
    assert_eq!(
        result.unwrap(),
        DeprovisionOutcome::Deleted {
            node: node("pve1"),
            vmid: vmid(154)
        },
        "{progress:?}"
    );
    assert_eq!(fake.vm(154), Value::Null);
    let seen = fake.requests();
    let at = |m: &str, suffix: &str| {
        seen.iter()
            .rposition(|(method, p)| method == m && p.ends_with(suffix))
            .unwrap_or_else(|| panic!("no {m} …{suffix}: {seen:?}"))
    };
    let removed = at("DELETE", "/cluster/ha/resources/vm:154");
    let shutdown = at("POST", "/qemu/154/status/shutdown");
    let destroyed = at("DELETE", "/nodes/pve1/qemu/154");
    assert!(removed < shutdown && shutdown < destroyed, "{seen:?}");
}

/// The listing's status is what pvestatd last reported (up to ~10 s old): a VM listed as stopped may
/// be running. qemu-server's `destroy_vm` then refuses ("VM <id> is running - destroy failed"): the
/// deprovision shuts it down and destroys it again instead of failing.
#[tokio::test]
async fn destroy_refused_as_running_shuts_down_and_retries() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let target = provision(&pve, "req-stale", 155, "pve2", true).await;
    // pvestatd has not reported the start yet: the listing still says "stopped".
    fake.control(json!({"op": "listing_status", "vmid": 155, "status": "stopped"}));
    let (result, _) = run(&pve, &target).await;
    assert_eq!(
        result.unwrap(),
        DeprovisionOutcome::Deleted {
            node: node("pve2"),
            vmid: vmid(155)
        }
    );
    assert_eq!(fake.vm(155), Value::Null);
}

/// qemu-server src/PVE/QemuServer.pm `destroy_vm` with `destroy-unreferenced-disks`: after freeing the
/// referenced disks it lists every image storage (PVE::Storage::vdisk_list), and an offline one
/// fails the task before the config is removed. An unrelated storage being down must not keep the
/// VM alive.
#[tokio::test]
async fn an_offline_image_storage_elsewhere_does_not_block_the_destroy() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let target = provision(&pve, "req-nfsdown", 156, "pve1", false).await;
    fake.control(json!({"op": "set_storage", "name": "shared-nfs", "options": {"active": 0}}));
    let (result, _) = run(&pve, &target).await;
    assert_eq!(
        result.unwrap(),
        DeprovisionOutcome::Deleted {
            node: node("pve1"),
            vmid: vmid(156)
        }
    );
    assert_eq!(fake.vm(156), Value::Null);
    assert!(
        disks_of(&mut fake, 156).is_empty(),
        "referenced disks freed"
    );
}

/// qemu-server src/PVE/API2/Qemu.pm `clone_vm` gives the clone a fresh SMBIOS UUID and takes no
/// tags: a clone left by a crash before `configure_vm` has our name and the marker given at clone
/// time, not our tags nor the UUID the state recorded. It is ours and must be deleted, not leaked.
#[tokio::test]
async fn an_unconfigured_clone_is_deleted() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    fake.control(
        json!({"op": "add_vm", "vmid": 157, "name": "req-clone", "node": "pve1",
        "config": {"memory": 2048, "smbios1": "uuid=11111111-2222-3333-4444-555555555555",
                   "description": "omni-provider-id: proxmox\nomni-machine-request: req-clone\n"}}),
    );
    let target = DeprovisionTarget {
        request_id: "req-clone".into(),
        provider_id: PROVIDER.into(),
        vmid: Some(vmid(157)),
        recorded_node: Some(node("pve1")),
        smbios_uuid: Some("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into()),
        seed_iso_volume: None,
        set_pool: None,
    };
    let (result, _) = run(&pve, &target).await;
    assert!(
        matches!(result.unwrap(), DeprovisionOutcome::Deleted { .. }),
        "ours by its marker"
    );
    assert_eq!(fake.vm(157), Value::Null);
}

/// qemu-server src/PVE/QemuServer.pm `destroy_vm` refuses a locked VM (`check_lock`) except for the
/// `suspended` lock of a VM hibernated to disk: such a VM is destroyed at once, while one under
/// `backup` is waited for (the backup ends, the lock goes).
#[tokio::test]
async fn a_hibernated_vm_is_destroyed_and_a_backup_is_waited_for() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    let hibernated = provision(&pve, "req-hibernated", 153, "pve1", false).await;
    fake.control(json!({"op": "set_vm", "vmid": 153, "lock": "suspended"}));
    let (result, _) = run(&pve, &hibernated).await;
    assert_eq!(
        result.unwrap(),
        DeprovisionOutcome::Deleted {
            node: node("pve1"),
            vmid: vmid(153)
        }
    );
    assert_eq!(fake.vm(153), Value::Null);

    let backed_up = provision(&pve, "req-backup", 154, "pve1", false).await;
    fake.control(json!({"op": "set_vm", "vmid": 154, "lock": "backup"}));
    let (result, _) = run(&pve, &backed_up).await;
    let err = result.unwrap_err();
    assert!(retried_alone(&err), "{err}");
    assert!(err.to_string().contains("locked (backup)"), "{err}");
    assert_ne!(fake.vm(154), Value::Null);
}

/// qemu-server PVE/API2/Qemu.pm, `vm_config`: `GET {vmid}/config` needs `VM.Audit` on
/// `/vms/{vmid}`, so a token without it cannot read a VM's config. Such a VM may use any seed ISO:
/// the search names that VM and lists no loose seed ISO, rather than offer one in use for deletion.
#[tokio::test]
async fn an_unreadable_vm_config_keeps_loose_seed_isos_off_the_list() {
    let mut fake = FakePve::start(three_node_scenario(), 0.0);
    let pve = client(&fake);
    provision(&pve, "req-kept", 161, "pve1", false).await;
    upload_iso(&pve, "pve1", &seed_iso_file_name("req-loose")).await;
    let live: BTreeSet<String> = ["req-kept".to_string()].into();
    let found = orphans::scan(&pve, PROVIDER, &live).await.unwrap();
    let isos: BTreeSet<&str> = found.seed_isos.iter().map(|i| i.volume.as_str()).collect();
    assert_eq!(
        isos,
        ["local:iso/omni-seed-req-loose.iso"].into(),
        "{found:?}"
    );
    assert!(found.problems.is_empty(), "{found:?}");

    fake.control(
        json!({"op": "fail", "method": "GET", "suffix": "/qemu/161/config",
                        "status": 403, "message": "Permission check failed (/vms/161, VM.Audit)"}),
    );
    let found = orphans::scan(&pve, PROVIDER, &live).await.unwrap();
    assert!(found.seed_isos.is_empty(), "{found:?}");
    let problems = found.problems.join("\n");
    assert!(
        problems.contains("cannot read the config of VM 161")
            && problems.contains("seed ISO(s) no readable VM uses were not listed"),
        "{problems}"
    );
}

//! Restarts and lost state: one VM per request whatever happens, HA registration after the start.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_between_steps_and_inside_create_vm_leaves_exactly_one_vm() {
    let mut h = Harness::start("").await;
    // 1. The controller stops while the create call keeps failing: the VMID is already recorded.
    h.pve.control(
        json!({"op": "fail", "method": "POST", "suffix": "/nodes/pve2/qemu",
                         "status": 503, "message": "proxy went away"}),
    );
    h.request("restart-1", "restart", PINNED_PVE2);
    h.wait_stage("restart-1", Stage::Failed).await;
    h.stop_controller().await;
    let state = h.machine_state("restart-1");
    assert_eq!(state.spec.step, "prepare_image", "stopped inside create_vm");
    let reserved = state.spec.reserved_vmid;
    assert!(
        reserved >= 100,
        "the VMID is recorded before the create call"
    );
    assert!(h.vms_named("restart-1").is_empty());

    // 2. While the provider is down, the create "happens" anyway (an answer lost on the way back):
    //    the VM exists with our name and tags. The new controller must adopt it, not make a second.
    h.pve.control(json!({"op": "clear_failures"}));
    let uuid = uuid::Uuid::parse_str(&state.spec.uuid).unwrap();
    h.pve.control(json!({"op": "add_vm", "vmid": reserved, "name": "restart-1", "node": "pve2",
        "config": {"tags": "machine-request.restart;omni-provider.proxmox", "memory": 2048, "cores": 2,
                   "agent": "enabled=1", "smbios1": format!("uuid={uuid}"),
                   "description": "omni-provider-id: proxmox\nomni-machine-request: restart-1\n"}}));
    h.start_controller();
    h.wait_stage("restart-1", Stage::Provisioned).await;
    let vms = h.vms_named("restart-1");
    assert_eq!(vms.len(), 1, "{vms:?}");
    assert_eq!(vms[0]["vmid"].as_i64(), Some(reserved as i64));

    // 3. A second request stopped between steps (start fails) resumes after a restart.
    h.pve.control(
        json!({"op": "fail", "method": "POST", "suffix": "/status/start",
                         "status": 500, "message": "not now"}),
    );
    h.request("restart-2", "restart", PINNED_PVE2);
    h.wait_stage("restart-2", Stage::Failed).await;
    h.stop_controller().await;
    assert_eq!(h.machine_state("restart-2").spec.step, "configure_vm");
    h.pve.control(json!({"op": "clear_failures"}));
    h.start_controller();
    h.wait_stage("restart-2", Stage::Provisioned).await;
    assert_eq!(h.vms_named("restart-2").len(), 1);
    let creates = h.pve.count("POST", "/nodes/pve2/qemu");
    assert!(creates <= 3, "no duplicate creates: {creates}");
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_settings_register_the_vm_with_the_ha_manager() {
    let mut h = Harness::start("").await;
    h.request(
        "ha-1",
        "ha",
        &format!("{PINNED_PVE2}ha:\n  state: started\n  max_restart: 2\n  comment: omni\n"),
    );
    h.wait_stage("ha-1", Stage::Provisioned).await;
    let registered = h
        .pve
        .requests()
        .iter()
        .any(|(m, p)| m == "POST" && p.ends_with("/cluster/ha/resources"));
    assert!(registered, "HA resource registered");
    h.stop_controller().await;
}

/// pve-manager PVE/API2/Cluster.pm `resources` (through PVE/API2Tools.pm `extract_vm_stats`) lists a
/// VM that pvestatd has not reported yet (created seconds ago) without name, template and with
/// status "unknown"; tags come from the config. A crash right after the create leaves exactly such
/// a VM at the recorded VMID: it must be identified from its config and adopted, never replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_vm_listed_without_name_is_adopted_not_replaced() {
    let mut h = Harness::start("").await;
    h.pve.control(
        json!({"op": "fail", "method": "POST", "suffix": "/nodes/pve2/qemu",
                         "status": 503, "message": "proxy went away"}),
    );
    h.request("nostats-1", "nostats", PINNED_PVE2);
    h.wait_stage("nostats-1", Stage::Failed).await;
    h.stop_controller().await;
    let state = h.machine_state("nostats-1");
    let reserved = state.spec.reserved_vmid;
    assert!(reserved >= 100);

    // The create went through after all, seconds before the restart: pvestatd has not seen it.
    h.pve.control(json!({"op": "clear_failures"}));
    let uuid = uuid::Uuid::parse_str(&state.spec.uuid).unwrap();
    h.pve.control(json!({"op": "add_vm", "vmid": reserved, "name": "nostats-1", "node": "pve2",
        "config": {"tags": "machine-request.nostats;omni-provider.proxmox;omni-request.nostats-1",
                   "memory": 2048, "cores": 2, "agent": "enabled=1", "smbios1": format!("uuid={uuid}"),
                   "description": "omni-provider-id: proxmox\nomni-machine-request: nostats-1\n"}}));
    h.pve
        .control(json!({"op": "listing_without_stats", "vmid": reserved}));
    h.start_controller();
    testkit::eventually(Duration::from_secs(30), "the VMID to be adopted", || {
        let vmid = h.machine_state("nostats-1").spec.vmid;
        async move { (vmid == reserved).then_some(()) }
    })
    .await;
    h.pve
        .control(json!({"op": "listing_without_stats", "vmid": reserved, "on": false}));
    h.wait_stage("nostats-1", Stage::Provisioned).await;
    let vms = h.vms_named("nostats-1");
    assert_eq!(vms.len(), 1, "{vms:?}");
    assert_eq!(vms[0]["vmid"].as_i64(), Some(reserved as i64));
    h.stop_controller().await;
}

/// The nasty case: a create sent before a crash, whose answer never came, is applied by Proxmox
/// just as the restarted provider creates the VM again at the VMID it recorded, so that create is
/// refused with "already exists" (qemu-server src/PVE/API2/Qemu.pm, `create_vm`: the config file is
/// there). The VM taking the VMID is this request's own: it is adopted, not replaced by a second VM
/// at another VMID, which would leave two VMs of one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_create_of_our_own_taking_the_vmid_is_adopted_not_duplicated() {
    use omni_infra_provider_proxmox::model::identity;
    let mut h = Harness::start("").await;
    let id = "late-own";
    let tags = format!(
        "{};{}",
        identity::provider_tag(testkit::harness::PROVIDER),
        identity::request_tag(id).unwrap()
    );
    h.pve.control(
        json!({"op": "race_vmid", "suffix": "/nodes/pve2/qemu", "node": "pve2",
        "name": id, "config": {"memory": 2048, "cores": 2, "tags": tags,
            "description": identity::description_marker(testkit::harness::PROVIDER, id),
            "smbios1": "from-request"}}),
    );
    h.request(
        id,
        "late",
        "cores: 2\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve2\nip_discovery_timeout: 0\n",
    );
    h.wait_stage(id, Stage::Provisioned).await;
    let vms = h.vms_named(id);
    assert_eq!(vms.len(), 1, "one VM, the late one adopted: {vms:?}");
    let state = h.machine_state(id);
    assert_eq!(state.spec.vmid as i64, vms[0]["vmid"].as_i64().unwrap());
    assert_eq!(
        h.pve.count("POST", "/nodes/pve2/qemu"),
        1,
        "no second create"
    );
    h.stop_controller().await;
}

/// A create sent before a crash can be applied by Proxmox seconds later (its answer never came), and
/// until then only the request's provider state shows its VMID (`reserved_vmid`, written before the
/// create). A restarted provider choosing VMIDs for other requests must step over it: when another
/// request took it, the first one would choose a second VMID and, once the late create landed, have
/// two VMs (one request's held create of 102, another request given 102 by the next process, the
/// first then making 103).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vmid_another_requests_state_records_is_never_chosen() {
    use omni_infra_provider_proxmox::omni::proto::provider::MachineSpec;
    use omni_infra_provider_proxmox::omni::resources::provision_controller_name;
    use testkit::harness::PROVIDER;
    let mut h = Harness::start("").await;
    h.stop_controller().await;
    // The first free VMID is 101 (the scenario has guests 100 and 9000). Request `held`'s state
    // records it; its class no longer resolves, so it never gets to create again in this test.
    assert!(h.pve.vm(101).is_null());
    h.request("held", "held", "cores: many\n");
    let client = h.omni.client(PROVIDER);
    client
        .state
        .modify(
            &provider_machine(PROVIDER),
            "held",
            &provision_controller_name(PROVIDER),
            None,
            |m| {
                m.spec = MachineSpec {
                    node: "pve2".into(),
                    reserved_vmid: 101,
                    step: "prepare_image".into(),
                    ..Default::default()
                };
            },
        )
        .await
        .unwrap();
    h.start_controller();
    h.request("other", "other", PINNED_PVE2);
    h.wait_stage("other", Stage::Provisioned).await;
    let vms = h.vms_named("other");
    assert_eq!(vms.len(), 1, "{vms:?}");
    assert_eq!(vms[0]["vmid"], json!(102), "101 is recorded by `held`");
    h.stop_controller().await;
}

//! Drop-in compatibility with the official Go provider (siderolabs/omni-infra-provider-proxmox) and
//! Omni's infra-provider library, end to end: state and annotations written the Go way are continued
//! by us, ours are what the Go code reads, ISO names match its names, and its config patches are
//! removed on teardown.

use std::collections::BTreeMap;

use omni_infra_provider_proxmox::model::identity::{SET_POOL_COMMENT, provider_tag, request_tag};
use omni_infra_provider_proxmox::omni::proto::provider::MachineSpec;
use omni_infra_provider_proxmox::omni::proto::specs::{
    ConfigPatchSpec, FeaturesConfigSpec, MachineRequestSpec, TalosVersionSpec,
    machine_request_status_spec::Stage,
};
use omni_infra_provider_proxmox::omni::resources::{
    CONFIG_PATCH_REQUEST, FEATURES_CONFIG, FEATURES_CONFIG_ID, MACHINE_REQUEST, TALOS_VERSION,
    annotation, label, provider_machine, provision_controller_name,
};
use omni_infra_provider_proxmox::pipeline::image_factory::resolve_factory;
use omni_infra_provider_proxmox::proxmox::ProxmoxClient;
use omni_infra_provider_proxmox::rules::schematic::{SchematicRequest, schematic_yaml};
use serde_json::json;
use sha2::{Digest, Sha256};
use testkit::fakepve::{Login, Trust};
use testkit::harness::{Harness, PROVIDER, WAIT};

const PINNED_PVE2: &str = "cores: 2\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve2\n";
/// Auto-provisioned requests carry the Talos version without a `v`.
const TALOS: &str = "1.11.4";
const FACTORY: &str = "https://factory.talos.dev";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The ISO file name the Go provider computes (omni-infra-provider-proxmox
/// internal/pkg/provider/provision.go, step uploadISO): hex SHA-256 of
/// `<factory>/image/<schematic>/<request's Talos version>/nocloud-amd64.iso`, plus `.iso`.
fn go_iso_name(schematic: &str, talos: &str) -> String {
    let url = format!("{FACTORY}/image/{schematic}/{talos}/nocloud-amd64.iso");
    format!("{}.iso", hex(&Sha256::digest(url.as_bytes())))
}

fn request(h: &Harness, id: &str, set: &str) {
    let spec = MachineRequestSpec {
        talos_version: TALOS.into(),
        extensions: vec!["siderolabs/iscsi-tools".into()],
        provider_data: PINNED_PVE2.into(),
        ..Default::default()
    };
    h.omni
        .state
        .create_machine_request(id, PROVIDER, set, &spec);
}

fn step_annotation(h: &Harness, id: &str) -> Option<String> {
    h.machine_state(id)
        .metadata
        .annotations
        .get(annotation::STEP)
        .cloned()
}

fn is_upid(s: &str) -> bool {
    s.starts_with("UPID:")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iso_file_name_equals_the_official_providers_for_a_version_without_v() {
    let mut h = Harness::start("").await;
    request(&h, "iso-1", "iso");
    h.wait_stage("iso-1", Stage::Provisioned).await;
    let state = h.machine_state("iso-1").spec;
    let expected = go_iso_name(&state.schematic, TALOS);
    // Field 3 holds the request's version as given, field 4 the bare file name (the Go formats).
    assert_eq!(state.talos_version, TALOS);
    assert_eq!(state.volume_id, expected);
    assert_eq!(state.boot_iso_volume, format!("local:iso/{expected}"));
    let volumes = h
        .pve
        .control(json!({"op": "storage_volumes", "storage": "local"}));
    assert!(
        volumes
            .as_array()
            .unwrap()
            .contains(&json!(format!("iso/{expected}"))),
        "the ISO the Go provider would have downloaded is the one in storage: {volumes}"
    );
    let vm = &h.vms_named("iso-1")[0];
    assert!(
        vm["config"]["ide2"].as_str().unwrap().contains(&expected),
        "{vm}"
    );
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_we_stop_the_go_provider_reads_its_own_step_names_and_fields() {
    let mut h = Harness::start("").await;
    // Omni's client/pkg/infra/controllers/provision.go, reconcileRunning: the annotation
    // infra.omni.sidero.dev/step names the step last run; on resume the library skips steps until
    // that name and runs it again; a name it does not know skips every step and marks the request
    // PROVISIONED. The Go provider's steps (internal/pkg/provider/provision.go) re-run safely only
    // with their fields: uploadISO reads volume_upload_task (6) or finds volume_id (4, a bare file
    // name in the node's ISO storage); syncVM reads vm_create_task (7); startVM reads vm_start_task (8).

    // 1. Stopped inside create_vm (the create call fails): Go re-runs syncVM, which creates the VM
    //    (none exists, no create task recorded).
    h.pve.control(
        json!({"op": "fail", "method": "POST", "suffix": "/nodes/pve2/qemu",
                         "status": 503, "message": "proxy went away"}),
    );
    request(&h, "stop-1", "stop");
    h.wait_stage("stop-1", Stage::Failed).await;
    h.stop_controller().await;
    let st = h.machine_state("stop-1").spec;
    assert_eq!(step_annotation(&h, "stop-1").as_deref(), Some("syncVM"));
    assert_eq!(st.vm_create_task, "");
    assert_eq!(st.vmid, 0);
    assert_eq!(st.node, "pve2");
    assert_eq!(st.talos_version, TALOS);
    assert_eq!(st.volume_id, go_iso_name(&st.schematic, TALOS));
    assert!(is_upid(&st.volume_upload_task), "{st:?}");
    h.pve.control(json!({"op": "clear_failures"}));

    // 2. Stopped inside start_vm (the start call fails): the VM exists and its create task is recorded,
    //    so Go's syncVM checks that task instead of creating a second VM.
    h.pve.control(
        json!({"op": "fail", "method": "POST", "suffix": "/status/start",
                         "status": 500, "message": "not now"}),
    );
    h.start_controller();
    h.wait_stage("stop-1", Stage::Failed).await;
    let failed_start = h
        .omni
        .state
        .wait_for(WAIT, |s| {
            s.get(&provider_machine(PROVIDER), "stop-1")
                .is_some_and(|m| m.spec.vmid != 0)
        })
        .await;
    assert!(failed_start);
    h.stop_controller().await;
    let st = h.machine_state("stop-1").spec;
    let vmid = h.vms_named("stop-1")[0]["vmid"].as_i64().unwrap();
    assert_eq!(i64::from(st.vmid), vmid);
    assert!(is_upid(&st.vm_create_task), "{st:?}");
    assert!(
        st.vm_create_task.contains(&format!(":{vmid}:")),
        "{}",
        st.vm_create_task
    );
    assert!(
        matches!(
            step_annotation(&h, "stop-1").as_deref(),
            Some("syncVM" | "startVM")
        ),
        "{:?}",
        step_annotation(&h, "stop-1")
    );
    h.pve.control(json!({"op": "clear_failures"}));

    // 3. Done: Go re-runs startVM, which only checks the recorded start task.
    h.start_controller();
    h.wait_stage("stop-1", Stage::Provisioned).await;
    h.stop_controller().await;
    let st = h.machine_state("stop-1").spec;
    assert_eq!(step_annotation(&h, "stop-1").as_deref(), Some("startVM"));
    assert!(is_upid(&st.vm_start_task), "{st:?}");
    assert!(!st.uuid.is_empty());
    assert!(!st.volume_id.contains(':'), "{}", st.volume_id);
    assert_eq!(h.vms_named("stop-1").len(), 1);
}

/// Writes provider state through the provider API as the Go library does (owner = its controller
/// name, the step annotation beside the spec).
async fn write_go_state(h: &Harness, id: &str, spec: MachineSpec, step: &str) {
    write_go_state_with(h, id, spec, step, &[]).await;
}

/// [`write_go_state`] with raw protobuf fields our MachineSpec does not define appended.
async fn write_go_state_with(
    h: &Harness,
    id: &str,
    spec: MachineSpec,
    step: &str,
    unknown_fields: &[u8],
) {
    let client = h.omni.client(PROVIDER);
    client
        .state
        .modify(
            &provider_machine(PROVIDER),
            id,
            &provision_controller_name(PROVIDER),
            None,
            |m| {
                m.spec = spec.clone();
                m.unknown_fields = unknown_fields.to_vec();
                m.metadata
                    .annotations
                    .insert(annotation::STEP.to_owned(), step.to_owned());
            },
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_continue_a_request_the_go_provider_left_after_creating_its_vm() {
    let mut h = Harness::start("").await;
    h.stop_controller().await;
    request(&h, "go-1", "goset");
    // The schematic Omni would return for this request (memstate: SHA-256 of the YAML).
    let yaml = schematic_yaml(&SchematicRequest {
        extensions: vec!["siderolabs/iscsi-tools".into()],
        ..Default::default()
    })
    .unwrap();
    let schematic = hex(&Sha256::digest(yaml.as_bytes()));
    let iso = go_iso_name(&schematic, TALOS);
    let uuid = uuid::Uuid::new_v4().to_string();
    // What the Go provider's syncVM leaves: a VM named after the request, tagged only with its set,
    // booting the ISO, no join config yet (its startVM would add it), create task and VMID recorded.
    h.pve.control(
        json!({"op": "add_vm", "vmid": 150, "name": "go-1", "node": "pve2",
        "config": {"tags": "machine-request.goset", "memory": 2048, "cores": 2,
                   "agent": "enabled=1", "smbios1": format!("uuid={uuid}"),
                   "ide2": format!("local:iso/{iso},media=cdrom"),
                   "scsi0": "local-lvm:vm-150-disk-0,size=10G"}}),
    );
    write_go_state(
        &h,
        "go-1",
        MachineSpec {
            uuid: uuid.clone(),
            schematic: schematic.clone(),
            talos_version: TALOS.into(),
            volume_id: iso.clone(),
            node: "pve2".into(),
            vm_create_task: "UPID:pve2:00001234:00005678:65000000:qmcreate:150:root@pam:".into(),
            vmid: 150,
            ..Default::default()
        },
        "syncVM",
    )
    .await;
    h.start_controller();
    h.wait_stage("go-1", Stage::Provisioned).await;
    let vms = h.vms_named("go-1");
    assert_eq!(vms.len(), 1, "no second VM: {vms:?}");
    let vm = &vms[0];
    assert_eq!(vm["vmid"], json!(150));
    assert_eq!(vm["status"], json!("running"));
    assert!(
        vm["config"]["ide3"]
            .as_str()
            .is_some_and(|s| s.contains("omni-seed-go-1.iso")),
        "the join config is attached: {vm}"
    );
    let st = h.machine_state("go-1").spec;
    assert_eq!(
        st.uuid, uuid,
        "the SMBIOS UUID the Go provider chose is kept"
    );
    assert_eq!(st.volume_id, iso);
    assert_eq!(step_annotation(&h, "go-1").as_deref(), Some("startVM"));
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_continue_a_request_the_go_provider_left_at_upload_iso() {
    let mut h = Harness::start("").await;
    // An ISO of the same image already downloaded (by us, with the Go name).
    request(&h, "first", "up");
    h.wait_stage("first", Stage::Provisioned).await;
    let first = h.machine_state("first").spec;
    h.stop_controller().await;
    request(&h, "go-2", "up");
    write_go_state(
        &h,
        "go-2",
        MachineSpec {
            schematic: first.schematic.clone(),
            talos_version: TALOS.into(),
            volume_id: first.volume_id.clone(),
            node: "pve2".into(),
            ..Default::default()
        },
        "uploadISO",
    )
    .await;
    h.pve.control(json!({"op": "reset_requests"}));
    h.start_controller();
    h.wait_stage("go-2", Stage::Provisioned).await;
    let downloads = h
        .pve
        .requests()
        .iter()
        .filter(|(m, p)| m == "POST" && p.contains("download-url"))
        .count();
    assert_eq!(downloads, 0, "the ISO the Go state names is reused");
    let vm = &h.vms_named("go-2")[0];
    assert!(
        vm["config"]["ide2"]
            .as_str()
            .unwrap()
            .contains(&first.volume_id),
        "{vm}"
    );
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_removes_the_config_patches_of_the_request() {
    let mut h = Harness::start("").await;
    request(&h, "patched", "patch");
    request(&h, "other", "patch");
    h.wait_stage("patched", Stage::Provisioned).await;
    h.wait_stage("other", Stage::Provisioned).await;
    // Omni's client/pkg/infra/provision/context.go, CreateConfigPatch: a ConfigPatchRequest in the
    // infra-provider namespace labelled with the provider ID and the request ID. The Go provider
    // named its hostname patch "000-hostname-%s" + request ID (provision.go, configureHostname, in its
    // releases from November 2025 to February 2026).
    let client = h.omni.client(PROVIDER);
    for id in ["patched", "other"] {
        client
            .state
            .modify(
                &CONFIG_PATCH_REQUEST,
                &format!("000-hostname-%s{id}"),
                &provision_controller_name(PROVIDER),
                None,
                |p| {
                    p.metadata
                        .labels
                        .insert(label::INFRA_PROVIDER_ID.into(), PROVIDER.into());
                    p.metadata
                        .labels
                        .insert(label::MACHINE_REQUEST.into(), id.into());
                    p.spec = ConfigPatchSpec {
                        data: format!("machine:\n  network:\n    hostname: {id}"),
                        ..Default::default()
                    };
                },
            )
            .await
            .unwrap();
    }
    // client/pkg/infra/controllers/provision.go, reconcileTearingDown: removePatches lists them by
    // those two labels and tears them down and destroys them before anything else.
    assert!(h.omni.state.teardown(&MACHINE_REQUEST, "patched"));
    h.wait_released("patched").await;
    assert!(
        h.omni
            .state
            .get(&CONFIG_PATCH_REQUEST, "000-hostname-%spatched")
            .is_none(),
        "the request's patch is removed"
    );
    assert!(
        h.omni
            .state
            .get(&CONFIG_PATCH_REQUEST, "000-hostname-%sother")
            .is_some(),
        "another request's patch stays"
    );
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_isos_come_from_the_factory_omni_publishes() {
    let mut h = Harness::start("").await;
    let client = h.omni.client(PROVIDER);
    // Without a features configuration, or with an empty factory URL in it: the flag.
    assert_eq!(resolve_factory(&client.state, FACTORY).await, FACTORY);
    let empty = FeaturesConfigSpec {
        image_factory_base_url: " ".into(),
    };
    h.omni.state.put(
        &FEATURES_CONFIG,
        FEATURES_CONFIG_ID,
        &empty,
        BTreeMap::new(),
    );
    assert_eq!(resolve_factory(&client.state, FACTORY).await, FACTORY);
    // Omni's internal/backend/runtime/omni/state_access.go, filterAccess: FeaturesConfigs need only a
    // valid signature, so an infra provider may read it; its image_factory_base_url (field 5 of
    // FeaturesConfigSpec, client/api/omni/specs/omni.proto) is the factory Omni creates schematics on.
    h.omni.state.put(
        &FEATURES_CONFIG,
        FEATURES_CONFIG_ID,
        &FeaturesConfigSpec {
            image_factory_base_url: "https://factory.internal.example/".into(),
        },
        BTreeMap::new(),
    );
    assert_eq!(
        resolve_factory(&client.state, FACTORY).await,
        "https://factory.internal.example"
    );
    h.stop_controller().await;
}

/// The set pool goes with the set's last machine whichever provider made it and whichever tears it
/// down. The official provider (internal/pkg/provider/provision.go) records the VM's pool in its field
/// 12 and, in `Deprovision` -> `cleanupPool`, deletes that pool only when it has no members and its
/// comment is exactly its `poolComment`; it creates set pools with that comment. So ours carry the same
/// comment and record field 12, and we delete a pool it recorded by the same rule, never a pool someone
/// else made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_pools_are_recorded_and_removed_as_the_official_provider_does() {
    let mut h = Harness::start("").await;
    let pve = ProxmoxClient::new(&h.pve.settings(Login::Token, Trust::CaFile)).unwrap();

    // Ours: field 12 names the set's pool, which carries the official provider's comment.
    request(&h, "pool-ours", "ourset");
    h.wait_stage("pool-ours", Stage::Provisioned).await;
    assert_eq!(h.machine_state("pool-ours").spec.pool, "ourset");
    assert_eq!(
        pve.pool_comment("ourset").await.unwrap().as_deref(),
        Some(SET_POOL_COMMENT)
    );

    // The official provider's VMs: one in a set pool it made, one in a pool a person made (the
    // class's `pool`), both recorded in field 12 only.
    h.stop_controller().await;
    pve.ensure_pool("goset", SET_POOL_COMMENT).await.unwrap();
    pve.ensure_pool("team-pool", "made by hand").await.unwrap();
    for (vmid, id, pool) in [(160, "pool-go-1", "goset"), (161, "pool-go-2", "team-pool")] {
        request(&h, id, "goset");
        let uuid = uuid::Uuid::new_v4().to_string();
        h.pve.control(
            json!({"op": "add_vm", "vmid": vmid, "name": id, "node": "pve2",
            "status": "running", "pool": pool,
            "config": {"tags": "machine-request.goset", "memory": 2048, "cores": 2,
                       "agent": "enabled=1", "smbios1": format!("uuid={uuid}"),
                       "scsi0": format!("local-lvm:vm-{vmid}-disk-0,size=10G")}}),
        );
        write_go_state(
            &h,
            id,
            MachineSpec {
                uuid,
                node: "pve2".into(),
                vmid,
                pool: pool.into(),
                vm_create_task: format!(
                    "UPID:pve2:00001234:00005678:65000000:qmcreate:{vmid}:root@pam:"
                ),
                vm_start_task: format!(
                    "UPID:pve2:00001234:00005679:65000000:qmstart:{vmid}:root@pam:"
                ),
                ..Default::default()
            },
            "startVM",
        )
        .await;
    }
    h.start_controller();
    for id in ["pool-ours", "pool-go-1", "pool-go-2"] {
        assert!(h.omni.state.teardown(&MACHINE_REQUEST, id));
    }
    for id in ["pool-ours", "pool-go-1", "pool-go-2"] {
        h.wait_released(id).await;
    }
    let pools = h.pve.control(json!({"op": "pools"}));
    assert!(pools.get("ourset").is_none(), "{pools}");
    assert!(
        pools.get("goset").is_none(),
        "the official provider's set pool went: {pools}"
    );
    assert_eq!(
        pools["team-pool"],
        json!([]),
        "a pool someone made stays, empty: {pools}"
    );
    h.stop_controller().await;
}

/// The newest official release runs `registerHA` and `syncHARules` after `startVM`
/// (siderolabs/omni-infra-provider-proxmox `internal/pkg/provider/provision.go`, `ProvisionSteps`) and
/// counts start attempts in field 14 of its state (`start_attempts`, `handleStoppedStartTask`). A
/// request it left after its last step resumes at our start step, with its running VM and without a
/// placement, and its field 14 is still there after our writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_continue_a_request_the_newest_official_release_left_after_its_ha_steps() {
    let mut h = Harness::start("").await;
    h.stop_controller().await;
    request(&h, "go-ha", "goset");
    let yaml = schematic_yaml(&SchematicRequest {
        extensions: vec!["siderolabs/iscsi-tools".into()],
        ..Default::default()
    })
    .unwrap();
    let schematic = hex(&Sha256::digest(yaml.as_bytes()));
    let iso = go_iso_name(&schematic, TALOS);
    let uuid = uuid::Uuid::new_v4().to_string();
    h.pve.control(
        json!({"op": "add_vm", "vmid": 151, "name": "go-ha", "node": "pve2", "status": "running",
        "config": {"tags": "machine-request.goset", "memory": 2048, "cores": 2,
                   "agent": "enabled=1", "smbios1": format!("uuid={uuid}"),
                   "ide2": format!("local:iso/{iso},media=cdrom"),
                   "scsi0": "local-lvm:vm-151-disk-0,size=10G"}}),
    );
    // start_attempts = 2 (field 14, varint).
    let start_attempts = [14 << 3, 2];
    write_go_state_with(
        &h,
        "go-ha",
        MachineSpec {
            uuid: uuid.clone(),
            schematic,
            talos_version: TALOS.into(),
            volume_id: iso,
            node: "pve2".into(),
            vm_create_task: "UPID:pve2:00001234:00005678:65000000:qmcreate:151:root@pam:".into(),
            vm_start_task: "UPID:pve2:00001235:00005679:65000001:qmstart:151:root@pam:".into(),
            vmid: 151,
            ..Default::default()
        },
        "syncHARules",
        &start_attempts,
    )
    .await;
    h.start_controller();
    h.wait_stage("go-ha", Stage::Provisioned).await;
    let vms = h.vms_named("go-ha");
    assert_eq!(vms.len(), 1, "no second VM: {vms:?}");
    assert_eq!(vms[0]["vmid"], json!(151));
    let before_start = ["pick_node", "prepare_image", "create_vm", "configure_vm"];
    for version in h.omni.state.history(&provider_machine(PROVIDER), "go-ha") {
        assert!(
            !before_start.contains(&version.spec.step.as_str()),
            "resumed at {:?}, before the start step",
            version.spec.step
        );
    }
    let state = h.machine_state("go-ha");
    assert_eq!(state.spec.uuid, uuid);
    assert_eq!(
        state.unknown_fields, start_attempts,
        "field 14 kept through our writes"
    );
    h.stop_controller().await;
}

/// A VM we adopted (found in the cluster, not created by this request's create call) has no create
/// task recorded, and the official provider's `syncVM` creates a VM whenever none is recorded: from
/// our first state write on, the step annotation never sends it there once a VMID is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_adopted_vm_the_official_provider_is_sent_to_its_start_step() {
    let mut h = Harness::start("").await;
    h.stop_controller().await;
    request(&h, "adopt-1", "adoptset");
    let uuid = uuid::Uuid::new_v4().to_string();
    let yaml = schematic_yaml(&SchematicRequest {
        extensions: vec!["siderolabs/iscsi-tools".into()],
        ..Default::default()
    })
    .unwrap();
    let iso = go_iso_name(&hex(&Sha256::digest(yaml.as_bytes())), TALOS);
    // The VM an earlier create of ours made (its answer lost): named after the request, with our
    // provider and request tags and the recorded SMBIOS UUID.
    let tags = format!(
        "machine-request.adoptset;{};{}",
        provider_tag(PROVIDER),
        request_tag("adopt-1").unwrap()
    );
    h.pve.control(
        json!({"op": "add_vm", "vmid": 152, "name": "adopt-1", "node": "pve2",
        "config": {"tags": tags, "memory": 2048, "cores": 2,
                   "agent": "enabled=1", "smbios1": format!("uuid={uuid}"),
                   "ide2": format!("local:iso/{iso},media=cdrom"),
                   "scsi0": "local-lvm:vm-152-disk-0,size=10G"}}),
    );
    write_go_state(
        &h,
        "adopt-1",
        MachineSpec {
            uuid: uuid.clone(),
            node: "pve2".into(),
            ..Default::default()
        },
        "pickNode",
    )
    .await;
    h.start_controller();
    h.wait_stage("adopt-1", Stage::Provisioned).await;
    assert_eq!(
        h.vms_named("adopt-1").len(),
        1,
        "adopted, not created again"
    );
    let history = h.omni.state.history(&provider_machine(PROVIDER), "adopt-1");
    for version in &history {
        let step = version.metadata.annotations.get(annotation::STEP);
        assert!(
            step.is_some(),
            "every version carries the step: {version:?}"
        );
        if version.spec.vmid != 0 && version.spec.vm_create_task.is_empty() {
            assert_eq!(
                step.map(String::as_str),
                Some("startVM"),
                "syncVM without a create task makes a second VM"
            );
        }
    }
    assert!(history.iter().any(|v| v.spec.vmid == 152));
    h.stop_controller().await;
}

/// The provider state's first version (its Create) already carries the step annotation: a takeover
/// right after it must not start the official provider from the top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_state_write_carries_the_step_annotation() {
    let h = Harness::start("").await;
    request(&h, "first-write", "fw");
    h.wait_stage("first-write", Stage::Provisioned).await;
    let history = h
        .omni
        .state
        .history(&provider_machine(PROVIDER), "first-write");
    let first = history.first().expect("the state was written");
    assert_eq!(first.metadata.version, "1");
    assert!(
        first.metadata.annotations.contains_key(annotation::STEP),
        "{:?}",
        first.metadata
    );
}

/// A Talos version Omni serves from its secondary factory names it in its `TalosVersions` resource
/// (siderolabs/omni `client/api/omni/specs/omni.proto`, TalosVersionSpec field 6), and Omni's
/// `CreateSchematicFromRaw` makes the schematic there (`client/pkg/imagefactory/clients.go`,
/// `ForTalosVersion`, reading the resource by the version without its `v`): the ISO comes from that
/// factory, not from the primary one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_talos_version_on_the_secondary_factory_downloads_from_it() {
    let h = Harness::start("").await;
    let secondary = "https://factory.secondary.example";
    h.omni.state.put(
        &TALOS_VERSION,
        TALOS,
        &TalosVersionSpec {
            version: TALOS.into(),
            image_factory_url: format!("{secondary}/"),
        },
        BTreeMap::new(),
    );
    request(&h, "second-factory", "sf");
    h.wait_stage("second-factory", Stage::Provisioned).await;
    let st = h.machine_state("second-factory").spec;
    let url = format!(
        "{secondary}/image/{}/{TALOS}/nocloud-amd64.iso",
        st.schematic
    );
    assert_eq!(
        st.volume_id,
        format!("{}.iso", hex(&Sha256::digest(url.as_bytes()))),
        "the ISO is named after its URL on the secondary factory"
    );
}

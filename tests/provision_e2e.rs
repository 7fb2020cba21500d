//! Provisioning end to end: the in-memory Omni over real gRPC, fakepve over real HTTPS, and the real
//! controller with the real pipeline in between.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::{
    Kind, MachineRequestStatus, ProviderMachine, label,
};
use serde_json::json;
use support::harness::Harness;

pub const PINNED_PVE2: &str = "cores: 2\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve2\ntags: [talos]\n";
pub const SPREAD: &str = "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'storageType == \"lvmthin\"'\nip_discovery_timeout: 0\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_class_lands_on_its_node_fully_configured_and_running() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    h.request("workers-abc123", "workers", PINNED_PVE2);
    let status = h.wait_stage("workers-abc123", Stage::Provisioned).await;

    let vms = h.vms_named("workers-abc123");
    assert_eq!(vms.len(), 1, "{vms:?}");
    let vm = &vms[0];
    assert_eq!(vm["node"], json!("pve2"));
    assert_eq!(vm["status"], json!("running"));
    let config = &vm["config"];
    assert_eq!(config["cores"].to_string().trim_matches('"'), "2");
    assert_eq!(config["memory"].to_string().trim_matches('"'), "2048");
    let tags = config["tags"].as_str().unwrap();
    for tag in ["machine-request.workers", "omni-provider.proxmox", "talos"] {
        assert!(tags.contains(tag), "{tags}");
    }
    assert!(
        config["scsi0"].as_str().unwrap().starts_with("local-lvm:"),
        "{config}"
    );
    assert!(
        config["ide2"].as_str().unwrap().contains("media=cdrom"),
        "Talos ISO: {config}"
    );
    let seed = config["ide3"].as_str().unwrap();
    assert!(
        seed.contains("omni-seed-workers-abc123.iso"),
        "seed: {seed}"
    );
    let description = config["description"].as_str().unwrap();
    assert!(description.contains("workers-abc123") && description.contains("proxmox"));
    let smbios = config["smbios1"].as_str().unwrap();
    assert!(!status.spec.id.is_empty());
    assert!(
        smbios.contains(&status.spec.id),
        "status id {} vs {smbios}",
        status.spec.id
    );

    assert_eq!(
        status
            .metadata
            .labels
            .get(label::MACHINE_REQUEST_SET)
            .map(String::as_str),
        Some("workers")
    );
    let vmid = vm["vmid"].as_u64().unwrap().to_string();
    assert_eq!(status.metadata.labels.get(label::INFRA_ID), Some(&vmid));
    assert!(
        status.spec.status.contains("pve2"),
        "{}",
        status.spec.status
    );

    let state = h.machine_state("workers-abc123");
    assert_eq!(state.spec.node, "pve2");
    assert_eq!(state.spec.step, "discover_ip");
    assert!(
        state.spec.addresses.iter().any(|a| a.starts_with("10.99.")),
        "{:?}",
        state.spec.addresses
    );
    // The Talos ISO was downloaded once into ISO storage, and the seed uploaded beside it.
    let volumes = h
        .pve
        .control(json!({"op": "storage_volumes", "storage": "local"}));
    let isos: Vec<&str> = volumes
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(
        isos.iter()
            .filter(|v| v.starts_with("iso/") && !v.contains("omni-seed"))
            .count(),
        1,
        "{isos:?}"
    );
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_requests_of_one_set_spread_two_per_node() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    for i in 0..6 {
        h.request(&format!("spread-{i}"), "spread", SPREAD);
    }
    for i in 0..6 {
        h.wait_stage(&format!("spread-{i}"), Stage::Provisioned)
            .await;
    }
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..6 {
        let vms = h.vms_named(&format!("spread-{i}"));
        assert_eq!(vms.len(), 1);
        *per_node
            .entry(vms[0]["node"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(
        per_node,
        BTreeMap::from([("pve1".into(), 2), ("pve2".into(), 2), ("pve3".into(), 2)])
    );
    // Concurrent requests for the same image downloaded it once per ISO storage.
    let downloads = h.pve.count("POST", "/download-url");
    assert!(
        downloads <= 3,
        "one download per node's local ISO storage at most: {downloads}"
    );
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clone_mode_clones_the_template_and_configures_it() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    h.request(
        "clone-1",
        "clones",
        "cores: 4\nmemory: 4096\ndisk_size: 16\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nboot: clone\ntemplate: 9000\n",
    );
    h.wait_stage("clone-1", Stage::Provisioned).await;
    let vms = h.vms_named("clone-1");
    assert_eq!(vms.len(), 1, "{vms:?}");
    let config = &vms[0]["config"];
    assert_eq!(vms[0]["node"], json!("pve1"));
    assert_eq!(config["cores"].to_string().trim_matches('"'), "4");
    assert!(
        config["ide3"]
            .as_str()
            .unwrap()
            .contains("omni-seed-clone-1.iso"),
        "{config}"
    );
    assert!(
        config.get("ide2").is_none() || !config["ide2"].as_str().unwrap_or("").contains("nocloud")
    );
    let state = h.machine_state("clone-1");
    assert_eq!(state.spec.template_vmid, 9000);
    assert_eq!(state.spec.boot_mode, "clone");
    let resized = h
        .pve
        .requests()
        .iter()
        .any(|(m, p)| m == "PUT" && p.ends_with(&format!("/qemu/{}/resize", vms[0]["vmid"])));
    assert!(resized, "the 8G template disk is grown to 16G");
    h.stop_controller().await;
}

/// Clone mode sets the class's additional disks in the config write after the clone (the clone
/// call itself copies only the template's drives). That write allocates (`<storage>:<GiB>`, which
/// qemu-server's `update_vm` turns into a new disk at every call), so when its answer is lost the
/// retry must not allocate a second disk: the VM ends with exactly one extra disk and no `unused`
/// leftover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clone_mode_adds_the_additional_disks_once() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    h.pve
        .control(json!({"op": "lose_answer", "method": "POST", "suffix": "/config", "times": 1}));
    h.request(
        "clone-disks",
        "clones",
        "cores: 2\nmemory: 2048\ndisk_size: 16\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nboot: clone\ntemplate: 9000\nadditional_disks: [{disk_size: 4, storage_selector: 'name == \"local-lvm\"'}]\n",
    );
    h.wait_stage("clone-disks", Stage::Provisioned).await;
    let vms = h.vms_named("clone-disks");
    assert_eq!(vms.len(), 1, "{vms:?}");
    let config = &vms[0]["config"];
    let extra = config["scsi1"].as_str().unwrap_or_default();
    assert!(
        extra.starts_with("local-lvm:") && extra.contains("size=4G"),
        "the additional disk is missing: {config}"
    );
    let keys: Vec<&String> = config.as_object().unwrap().keys().collect();
    assert!(
        !keys.iter().any(|k| k.starts_with("unused")),
        "a retried config write allocated again: {config}"
    );
    let vmid = vms[0]["vmid"].to_string();
    let writes = h
        .pve
        .requests()
        .iter()
        .filter(|(m, p)| m != "GET" && p.ends_with(&format!("/qemu/{vmid}/config")))
        .count();
    assert!(
        writes >= 2,
        "the lost answer led to a second config write ({writes})"
    );
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_provider_data_fails_with_every_problem_and_creates_nothing() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    let before = h
        .pve
        .control(json!({"op": "vms"}))
        .as_array()
        .unwrap()
        .len();
    h.request(
        "bad-1",
        "bad",
        "cores: 0\nmemory: 1024\ndisk_sise: 10\nstorage_selector: local-lvm\n",
    );
    let status = h.wait_stage("bad-1", Stage::Failed).await;
    let error = status.spec.error;
    for needle in [
        "cores",
        "memory",
        "disk_sise",
        "did you mean `disk_size`",
        "storage_selector",
        "name == \"local-lvm\"",
    ] {
        assert!(error.contains(needle), "missing {needle:?} in: {error}");
    }
    let after = h
        .pve
        .control(json!({"op": "vms"}))
        .as_array()
        .unwrap()
        .len();
    assert_eq!(before, after, "nothing was created");
    assert!(
        h.pve.requests().iter().all(|(m, _)| m == "GET"),
        "no write reached Proxmox"
    );
    h.stop_controller().await;
}

/// Every status text the request `id` shows, in order, until the returned task is aborted.
fn record_statuses(
    h: &Harness,
    id: &'static str,
) -> (
    Arc<std::sync::Mutex<Vec<String>>>,
    tokio::task::JoinHandle<()>,
) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let recorder = {
        let seen = seen.clone();
        let state = h.omni.state.clone();
        tokio::spawn(async move {
            loop {
                state
                    .wait_for(Duration::from_millis(200), |s| {
                        if let Some(st) = s.get(&MachineRequestStatus, id) {
                            let mut seen = seen.lock().unwrap();
                            if seen.last() != Some(&st.spec.status) {
                                seen.push(st.spec.status.clone());
                            }
                        }
                        false
                    })
                    .await;
            }
        })
    };
    (seen, recorder)
}

/// The official provider unmarshals provider data with a plain YAML unmarshal (omni
/// client/pkg/infra/provision/context.go, `UnmarshalProviderData`), so a class with a key it does not
/// know provisions there. It must here too, and the user sees in Omni what was ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_key_provisions_with_a_warning_in_the_status() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    let (seen, recorder) = record_statuses(&h, "warn-1");
    h.request("warn-1", "warn", &format!("{PINNED_PVE2}disk_sise: 10\n"));
    let status = h.wait_stage("warn-1", Stage::Provisioned).await;
    recorder.abort();
    assert!(status.spec.error.is_empty(), "{}", status.spec.error);
    let seen = seen.lock().unwrap().clone();
    let warning = "disk_sise: is not a known key and is ignored (did you mean `disk_size`?)";
    let running: Vec<&String> = seen
        .iter()
        .filter(|s| s.starts_with("Running step"))
        .collect();
    assert!(!running.is_empty(), "{seen:#?}");
    // The step stays readable in front; the warning follows it.
    for text in &running {
        assert!(text.contains(warning), "{text}");
    }
    assert!(
        running
            .iter()
            .any(|s| s.starts_with("Running step 3/6 create_vm: creating VM")),
        "{seen:#?}"
    );
    assert_eq!(h.vms_named("warn-1").len(), 1);
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_strict_an_unknown_key_fails_the_request() {
    let Some(mut h) = Harness::start("strict: true\n").await else {
        return;
    };
    h.request(
        "strict-1",
        "strict",
        &format!("{PINNED_PVE2}disk_sise: 10\n"),
    );
    let status = h.wait_stage("strict-1", Stage::Failed).await;
    for needle in ["disk_sise", "did you mean `disk_size`", "strict: true"] {
        assert!(
            status.spec.error.contains(needle),
            "missing {needle:?} in: {}",
            status.spec.error
        );
    }
    assert!(h.vms_named("strict-1").is_empty());
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_template_is_a_clear_error() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    h.request(
        "clone-missing",
        "clones",
        "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\nboot: clone\ntemplate: talos-v9\n",
    );
    let status = h.wait_stage("clone-missing", Stage::Failed).await;
    assert!(
        status.spec.error.contains("template talos-v9 not found")
            && status.spec.error.contains("9000 (talos-template)"),
        "{}",
        status.spec.error
    );
    assert!(h.vms_named("clone-missing").is_empty());
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_show_each_step_and_a_failure_stays_visible_until_it_heals() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    // Record every status text Omni sees.
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let recorder = {
        let seen = seen.clone();
        let state = h.omni.state.clone();
        tokio::spawn(async move {
            loop {
                state
                    .wait_for(Duration::from_millis(200), |s| {
                        if let Some(st) = s.get(&MachineRequestStatus, "steps-1") {
                            let mut seen = seen.lock().unwrap();
                            if seen.last() != Some(&st.spec.status) {
                                seen.push(st.spec.status.clone());
                            }
                        }
                        false
                    })
                    .await;
            }
        })
    };
    h.pve.control(
        json!({"op": "fail", "method": "POST", "suffix": "/status/start",
                         "status": 500, "message": "start refused by test", "times": 1}),
    );
    h.request("steps-1", "steps", PINNED_PVE2);
    let failed = h.wait_stage("steps-1", Stage::Failed).await;
    assert!(
        failed.spec.error.contains("start refused by test"),
        "{}",
        failed.spec.error
    );
    assert!(
        failed.spec.error.contains("starting VM"),
        "{}",
        failed.spec.error
    );
    h.wait_stage("steps-1", Stage::Provisioned).await;
    recorder.abort();
    let seen = seen.lock().unwrap().clone();
    for step in [
        "Running step 1/6 pick_node",
        "Running step 2/6 prepare_image",
        "Running step 3/6 create_vm",
        "Running step 4/6 configure_vm",
        "Running step 5/6 start_vm",
        "Running step 6/6 discover_ip",
    ] {
        assert!(
            seen.iter().any(|s| s.starts_with(step)),
            "{step} never shown: {seen:#?}"
        );
    }
    assert!(
        seen.iter()
            .any(|s| s.contains("creating VM") && s.contains("on pve2")),
        "{seen:#?}"
    );
    assert_eq!(h.vms_named("steps-1").len(), 1);
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_between_steps_and_inside_create_vm_leaves_exactly_one_vm() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
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
    let Some(mut h) = Harness::start("").await else {
        return;
    };
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
    let Some(mut h) = Harness::start("").await else {
        return;
    };
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
    support::eventually(Duration::from_secs(30), "the VMID to be adopted", || {
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

/// qemu-server src/PVE/API2/Qemu.pm `update_vm` (through PVE::QemuServer::Network's `parse_net`): a
/// NIC given without a MAC gets a new random one at every call (and `<storage>:<GiB>` allocates a new
/// disk). The clone's config update must keep what the clone already has, so that neither the
/// client's replay of a lost answer nor the step's retry changes the MAC (a new DHCP lease, a new
/// machine for anything keyed on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_configure_answer_keeps_the_clones_mac() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    // Stop right after the clone (the seed upload fails), to read the MAC the clone was given.
    h.pve.control(
        json!({"op": "fail", "method": "POST", "suffix": "/storage/local/upload",
                         "status": 500, "message": "not now"}),
    );
    h.pve
        .control(json!({"op": "lose_answer", "method": "PUT", "suffix": "/config", "times": 1}));
    h.request(
        "clone-lost",
        "clones",
        "cores: 2\nmemory: 2048\ndisk_size: 16\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nboot: clone\ntemplate: 9000\n",
    );
    h.wait_stage("clone-lost", Stage::Failed).await;
    let cloned = h.vms_named("clone-lost");
    assert_eq!(cloned.len(), 1, "{cloned:?}");
    let mac = |net0: &serde_json::Value| {
        net0.as_str()
            .and_then(|v| v.split(',').next())
            .and_then(|m| m.split_once('='))
            .map(|(_, mac)| mac.to_ascii_uppercase())
    };
    let cloned_mac = mac(&cloned[0]["config"]["net0"]).expect("the clone has a MAC");
    h.pve.control(json!({"op": "clear_failures"}));
    h.wait_stage("clone-lost", Stage::Provisioned).await;
    let vms = h.vms_named("clone-lost");
    assert_eq!(vms.len(), 1, "{vms:?}");
    assert_eq!(
        mac(&vms[0]["config"]["net0"]),
        Some(cloned_mac),
        "{:?}",
        vms[0]["config"]
    );
    h.stop_controller().await;
}

/// A template made by hand may boot from `virtio0` (qemu-server's `boot: order=` names the devices
/// in boot order; the clone copies it). Clone mode must keep that disk first in the boot order and
/// grow that disk, not a `scsi0` the VM does not have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_booting_from_virtio0_is_cloned_grown_and_booted_from_virtio0() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    h.pve.control(
        json!({"op": "add_vm", "vmid": 9001, "name": "talos-virtio", "node": "pve1",
        "template": true,
        "config": {"memory": 2048, "cores": 2, "agent": "1",
                   "virtio0": "local-lvm:base-9001-disk-0,size=8G",
                   "boot": "order=virtio0;net0",
                   "net0": "virtio=BC:24:11:00:00:02,bridge=vmbr0"}}),
    );
    h.request(
        "clone-virtio",
        "clones",
        "cores: 2\nmemory: 2048\ndisk_size: 16\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nboot: clone\ntemplate: 9001\n",
    );
    h.wait_stage("clone-virtio", Stage::Provisioned).await;
    let vms = h.vms_named("clone-virtio");
    assert_eq!(vms.len(), 1, "{vms:?}");
    let config = &vms[0]["config"];
    assert_eq!(config["boot"], json!("order=virtio0;net0"), "{config}");
    assert!(
        config["virtio0"]
            .as_str()
            .unwrap_or("")
            .contains("size=16G"),
        "{config}"
    );
    assert!(config.get("scsi0").is_none(), "{config}");
    h.stop_controller().await;
}

/// A template prepared for cloud-init carries its own cloud-init drive; qemu-server regenerates it at
/// every start as an ISO labelled `cidata` (src/PVE/QemuServer/Cloudinit.pm,
/// `commit_cloudinit_disk`), so the clone would offer Talos two NoCloud sources. The clone must keep
/// only our seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_templates_cloud_init_drive_is_removed_from_the_clone() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    h.pve.control(
        json!({"op": "add_vm", "vmid": 9002, "name": "talos-ci", "node": "pve1",
        "template": true,
        "config": {"memory": 2048, "cores": 2, "agent": "1", "scsihw": "virtio-scsi-single",
                   "scsi0": "local-lvm:base-9002-disk-0,size=8G",
                   "ide0": "local-lvm:vm-9002-cloudinit,media=cdrom",
                   "boot": "order=scsi0;net0",
                   "net0": "virtio=BC:24:11:00:00:03,bridge=vmbr0"}}),
    );
    h.request(
        "clone-ci",
        "clones",
        "cores: 2\nmemory: 2048\ndisk_size: 16\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nboot: clone\ntemplate: 9002\n",
    );
    h.wait_stage("clone-ci", Stage::Provisioned).await;
    let vms = h.vms_named("clone-ci");
    assert_eq!(vms.len(), 1, "{vms:?}");
    let config = vms[0]["config"].as_object().unwrap();
    let cloud_init: Vec<_> = config
        .iter()
        .filter(|(_, v)| v.as_str().is_some_and(|v| v.contains("cloudinit")))
        .collect();
    assert!(cloud_init.is_empty(), "{config:?}");
    assert!(
        config["ide3"]
            .as_str()
            .unwrap_or("")
            .contains("omni-seed-clone-ci.iso"),
        "{config:?}"
    );
    h.stop_controller().await;
}

/// qemu-server src/PVE/API2/Qemu.pm `clone_vm`: a clone to another node needs every drive of the
/// template on shared storage, its CD-ROM ISOs included (`$check_storage_access_clone`), not only the
/// target storage. A template whose ISO sits on node-local storage fails with a message naming that
/// drive, before any clone is attempted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_node_clone_checks_the_templates_drives_are_shared() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    h.pve.control(
        json!({"op": "add_vm", "vmid": 9003, "name": "talos-shared", "node": "pve1",
        "template": true,
        "config": {"memory": 2048, "cores": 2, "agent": "1", "scsihw": "virtio-scsi-single",
                   "scsi0": "shared-nfs:9003/base-9003-disk-0.qcow2,size=8G",
                   "ide2": "local:iso/talos.iso,media=cdrom",
                   "boot": "order=scsi0;net0",
                   "net0": "virtio=BC:24:11:00:00:04,bridge=vmbr0"}}),
    );
    h.request(
        "clone-far",
        "clones",
        "cores: 2\nmemory: 2048\ndisk_size: 16\nstorage_selector: 'name == \"shared-nfs\"'\nnode: pve2\nboot: clone\ntemplate: 9003\n",
    );
    let status = h.wait_stage("clone-far", Stage::Failed).await;
    let error = status.spec.error.clone();
    assert!(
        error.contains("ide2") && error.contains("shared storage"),
        "{error}"
    );
    let clones = h.pve.count("POST", "/qemu/9003/clone");
    assert_eq!(clones, 0, "refused before the clone call");
    assert!(h.vms_named("clone-far").is_empty());
    h.stop_controller().await;
}

/// qemu-server src/PVE/API2/Qemu.pm `clone_vm` takes a name and a description but no tags: until
/// `configure_vm` runs, a clone carries none of our tags. When the clone's answer is lost (or we
/// crash before recording the VMID), the retry must recognise the clone at the reserved VMID (its
/// name and the marker given at clone time) and adopt it, not clone a second VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_whose_answer_was_lost_is_adopted_not_cloned_again() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    h.pve.control(
        json!({"op": "lose_answer", "method": "POST", "suffix": "/qemu/9000/clone", "times": 1}),
    );
    h.request(
        "clone-again",
        "clones",
        "cores: 2\nmemory: 2048\ndisk_size: 16\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nboot: clone\ntemplate: 9000\n",
    );
    h.wait_stage("clone-again", Stage::Provisioned).await;
    let vms = h.vms_named("clone-again");
    assert_eq!(vms.len(), 1, "one clone, adopted: {vms:?}");
    let clones = h.pve.count("POST", "/qemu/9000/clone");
    assert_eq!(clones, 1);
    h.stop_controller().await;
}

/// Another client takes the VMID on another node between our `/cluster/nextid` and our clone.
/// qemu-server's `clone_vm` checks only the source node's config directory before it forks, so the
/// clone is accepted and its *task* fails when pmxcfs refuses the config file ("close (rename)
/// atomic file … failed: File exists"; pve-cluster src/pmxcfs/memdb.c, memdb_rename). That is a
/// taken VMID like "already exists": choose another, leave the other client's VM alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_onto_a_vmid_just_taken_on_another_node_chooses_another() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    h.pve
        .control(json!({"op": "race_vmid", "suffix": "/qemu/9000/clone", "node": "pve2"}));
    h.request(
        "clone-raced",
        "clones",
        "cores: 2\nmemory: 2048\ndisk_size: 16\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nboot: clone\ntemplate: 9000\n",
    );
    h.wait_stage("clone-raced", Stage::Provisioned).await;
    let vms = h.vms_named("clone-raced");
    assert_eq!(vms.len(), 1, "{vms:?}");
    let all = h.pve.control(json!({"op": "vms"}));
    let raced: Vec<&serde_json::Value> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|vm| vm["name"].as_str().unwrap_or("").starts_with("raced-"))
        .collect();
    assert_eq!(raced.len(), 1, "the race happened: {all}");
    assert_eq!(raced[0]["node"], json!("pve2"));
    assert_ne!(raced[0]["vmid"], vms[0]["vmid"]);
    let state = h.machine_state("clone-raced");
    assert_eq!(state.spec.vmid as i64, vms[0]["vmid"].as_i64().unwrap());
    let clones = h.pve.count("POST", "/qemu/9000/clone");
    assert_eq!(
        clones, 2,
        "one refused inside its task, one that made the VM"
    );
    // Recognised as a taken VMID within the step, not retried as a failed provision.
    let metrics = h.metrics.encode();
    assert!(
        !metrics.contains(r#"omni_proxmox_provisions_total{outcome="failure"}"#),
        "{metrics}"
    );
    h.stop_controller().await;
}

/// `ha.failback` exists only from Proxmox VE 9 (pve-ha-manager src/PVE/HA/Resources.pm, 5.0.2); PVE 8
/// answers the HA registration with 400 after the VM was made and started. Refused up front, naming
/// the key and the release, with nothing created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_failback_on_pve_8_fails_before_anything_is_created() {
    let mut scenario = support::fakepve::three_node_scenario();
    scenario["pve_version"] = json!("8.4.1");
    let Some(mut h) = Harness::start_with(scenario, "").await else {
        return;
    };
    h.request(
        "failback-8",
        "ha",
        "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\nha:\n  state: started\n  failback: true\n",
    );
    let status = h.wait_stage("failback-8", Stage::Failed).await;
    let error = status.spec.error;
    assert!(error.contains("ha.failback"), "{error}");
    assert!(error.contains("8.4.1"), "{error}");
    assert!(h.vms_named("failback-8").is_empty());
    let writes = h.pve.requests().iter().filter(|(m, _)| m != "GET").count();
    assert_eq!(writes, 0, "nothing is written to Proxmox");
    h.stop_controller().await;
}

/// Provider data precedence is the class, then the node's override under `nodes:`, then `defaults:`
/// (README). Placement must follow it like every later step: a class that sets `storage_selector`
/// outranks `nodes.pve1.storage_selector`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_class_storage_selector_outranks_a_node_override_in_placement() {
    let Some(mut h) =
        Harness::start("nodes:\n  pve1:\n    storage_selector: name == \"no-such-storage\"\n")
            .await
    else {
        return;
    };
    h.request(
        "outranked",
        "precedence",
        "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\n",
    );
    h.wait_stage("outranked", Stage::Provisioned).await;
    let vms = h.vms_named("outranked");
    assert_eq!(vms.len(), 1, "{vms:?}");
    let disk = vms[0]["config"]["scsi0"].as_str().unwrap_or_default();
    assert!(disk.starts_with("local-lvm:"), "{disk}");
    h.stop_controller().await;
}

/// A request with no VMID recorded cannot have a VM yet (ours is recorded before the create call, the
/// official provider records its own), so `create_vm` adopts from the listing placement read moments
/// before in the same reconcile: one `/cluster/resources` read per machine, not two. With a VMID
/// recorded (a restart after the create), the listing is read fresh to find that VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_machine_reads_the_cluster_listing_once() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    h.request(
        "one-listing",
        "listing",
        "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nip_discovery_timeout: 0\n",
    );
    h.wait_stage("one-listing", Stage::Provisioned).await;
    assert_eq!(h.pve.count("GET", "/cluster/resources"), 1);
    h.stop_controller().await;
}

/// Omni calls made between two snapshots of [`MemState::typed_calls`], `(method, type) -> count`.
fn calls_since(
    before: &BTreeMap<(String, String), u64>,
    after: &BTreeMap<(String, String), u64>,
) -> BTreeMap<(String, String), u64> {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Status and provider-state writes (Create and Update) among `calls`.
fn writes(calls: &BTreeMap<(String, String), u64>) -> (u64, u64) {
    let status_type = MachineRequestStatus.resource_type();
    let state_type = ProviderMachine::new(support::harness::PROVIDER).resource_type();
    let of = |ty: &str| -> u64 {
        calls
            .iter()
            .filter(|((method, t), _)| t == ty && (method == "Create" || method == "Update"))
            .map(|(_, n)| n)
            .sum()
    };
    (of(&status_type), of(&state_type))
}

/// One machine from its request to PROVISIONED (the image already on the node, its set's pool
/// made) writes its status and its provider state at most 12 times in all, and still shows every
/// step: each of the six appears in some version of the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_machine_costs_at_most_twelve_status_and_state_writes_and_shows_every_step() {
    let Some(mut h) = Harness::start("").await else {
        return;
    };
    // The first of the set downloads the image and makes the pool: two more lines, one more record.
    let before = h.omni.state.typed_calls();
    h.request("writes-0", "writes", PINNED_PVE2);
    h.wait_stage("writes-0", Stage::Provisioned).await;
    let first = calls_since(&before, &h.omni.state.typed_calls());
    let (status, state) = writes(&first);
    eprintln!("first machine: {status} status + {state} provider-state writes");
    assert!(status + state <= 15, "{first:#?}");

    let before = h.omni.state.typed_calls();
    h.request("writes-1", "writes", PINNED_PVE2);
    h.wait_stage("writes-1", Stage::Provisioned).await;
    let calls = calls_since(&before, &h.omni.state.typed_calls());
    let (status_writes, state_writes) = writes(&calls);
    eprintln!("Omni calls for one machine: {calls:#?}");
    let history: Vec<String> = h
        .omni
        .state
        .history(&MachineRequestStatus, "writes-1")
        .into_iter()
        .map(|s| s.spec.status)
        .collect();
    eprintln!("status history: {history:#?}");
    for step in [
        "Running step 1/6 pick_node",
        "Running step 2/6 prepare_image",
        "Running step 3/6 create_vm",
        "Running step 4/6 configure_vm",
        "Running step 5/6 start_vm",
        "Running step 6/6 discover_ip",
    ] {
        assert!(
            history.iter().any(|s| s.starts_with(step)),
            "{step} never shown: {history:#?}"
        );
    }
    assert!(
        status_writes + state_writes <= 12,
        "{status_writes} status writes + {state_writes} provider-state writes: {calls:#?}\nstatus history: {history:#?}"
    );
    // The VM is linked and labelled all the same.
    let status = h.status("writes-1").unwrap();
    assert!(!status.spec.id.is_empty());
    assert!(status.metadata.labels.contains_key(label::INFRA_ID));
    h.stop_controller().await;
}

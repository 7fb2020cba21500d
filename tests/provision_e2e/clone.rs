//! Boot mode `clone`: the template cloned, configured and grown once, whatever answers are lost.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clone_mode_clones_the_template_and_configures_it() {
    let mut h = Harness::start("").await;
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
    let boot_disk = config["scsi0"].as_str().unwrap_or_default();
    assert!(boot_disk.contains("size=16G"), "{boot_disk}");
    h.stop_controller().await;
}

/// Clone mode sets the class's additional disks in the config write after the clone (the clone
/// call itself copies only the template's drives). That write allocates (`<storage>:<GiB>`, which
/// qemu-server's `update_vm` turns into a new disk at every call), so when its answer is lost the
/// retry must not allocate a second disk: the VM ends with exactly one extra disk and no `unused`
/// leftover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clone_mode_adds_the_additional_disks_once() {
    let mut h = Harness::start("").await;
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

/// qemu-server src/PVE/API2/Qemu.pm `update_vm` (through PVE::QemuServer::Network's `parse_net`): a
/// NIC given without a MAC gets a new random one at every call (and `<storage>:<GiB>` allocates a new
/// disk). The clone's config update must keep what the clone already has, so that neither the
/// client's replay of a lost answer nor the step's retry changes the MAC (a new DHCP lease, a new
/// machine for anything keyed on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_configure_answer_keeps_the_clones_mac() {
    let mut h = Harness::start("").await;
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
    let mut h = Harness::start("").await;
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
    let mut h = Harness::start("").await;
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
    let mut h = Harness::start("").await;
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
    let mut h = Harness::start("").await;
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
    let mut h = Harness::start("").await;
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

/// A template with a data disk at `scsi1`: the clone has that drive, and the config write after the
/// clone names `scsi1` for the class's first additional disk. A slot the VM already has keeps its
/// volume (so that a replayed write allocates nothing twice), so the class's disk was silently
/// never made. qemu-server src/PVE/API2/Qemu.pm `clone_vm` copies every drive of the template;
/// `update_vm` allocates `<storage>:<GiB>` wherever it is given. Refused before the clone, naming
/// the entry, the slot and the template.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clone_mode_refuses_an_additional_disk_on_a_slot_the_template_fills() {
    let mut scenario = testkit::fakepve::three_node_scenario();
    scenario["guests"][0]["config"]["scsi1"] = json!("local-lvm:base-9000-disk-1,size=2G");
    let mut h = Harness::start_with(scenario, "").await;
    h.request(
        "clone-clash",
        "clones",
        "cores: 2\nmemory: 2048\ndisk_size: 16\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nboot: clone\ntemplate: 9000\nadditional_disks: [{disk_size: 4, storage_selector: 'name == \"local-lvm\"'}]\n",
    );
    let status = h.wait_stage("clone-clash", Stage::Failed).await;
    assert!(
        status.spec.error.contains(
            "additional_disks[0] goes to scsi1, which template 9000 (VM 9000 on pve1) already fills"
        ),
        "{}",
        status.spec.error
    );
    assert!(h.vms_named("clone-clash").is_empty(), "nothing cloned");
    h.stop_controller().await;
}

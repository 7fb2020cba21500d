//! `boot: image` end to end: the node downloads the Image Factory's nocloud disk image into `import`
//! storage once, each VM's boot disk is made from it with `import-from` and grown to `disk_size`, and
//! no Talos ISO is attached.
//!
//! Proxmox facts this follows (fakepve's launcher models them): pve-storage
//! src/PVE/API2/Storage/Status.pm `download_url` takes `import` content only for names ending in
//! `.ova|.qcow2|.raw|.vmdk` (the last three from libpve-storage-perl 8.3.6, i.e. Proxmox VE 8.4) and
//! decompresses nothing but ISOs; qemu-server src/PVE/API2/Qemu.pm takes `import-from` only on
//! `<storage>:0` and gives the disk the image's virtual size.

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use serde_json::{Value, json};
use testkit::fakepve::three_node_scenario;
use testkit::harness::Harness;

const IMAGE_CLASS: &str = "cores: 2\nmemory: 2048\ndisk_size: 20\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nboot: image\nip_discovery_timeout: 0\n";

fn with_import_storage(h: &mut Harness) {
    h.pve.control(json!({"op": "set_storage", "name": "local",
        "options": {"content": "iso,vztmpl,backup,import"}}));
}

fn volumes(h: &mut Harness, storage: &str) -> Vec<String> {
    serde_json::from_value(
        h.pve
            .control(json!({"op": "storage_volumes", "storage": storage})),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vms_boot_from_one_downloaded_disk_image_grown_and_without_an_iso() {
    let mut h = Harness::start("").await;
    with_import_storage(&mut h);
    h.request("img-1", "image", IMAGE_CLASS);
    h.request("img-2", "image", IMAGE_CLASS);
    h.wait_stage("img-1", Stage::Provisioned).await;
    h.wait_stage("img-2", Stage::Provisioned).await;

    let local = volumes(&mut h, "local");
    let images: Vec<&String> = local.iter().filter(|v| v.starts_with("import/")).collect();
    assert_eq!(images.len(), 1, "one download for both: {local:?}");
    assert!(images[0].ends_with(".qcow2"), "{images:?}");
    assert!(
        !local
            .iter()
            .any(|v| v.starts_with("iso/") && !v.contains("omni-seed")),
        "no Talos ISO downloaded: {local:?}"
    );
    let downloads = h
        .pve
        .requests()
        .iter()
        .filter(|(m, p)| m == "POST" && p.ends_with("/download-url"))
        .count();
    assert_eq!(downloads, 1);

    for id in ["img-1", "img-2"] {
        let vm = h.vms_named(id).pop().expect("one VM");
        let config = &vm["config"];
        let scsi0 = config["scsi0"].as_str().unwrap_or_default();
        assert!(scsi0.starts_with("local-lvm:vm-"), "{scsi0}");
        assert!(!scsi0.contains("import-from"), "{scsi0}");
        assert!(
            scsi0.contains("size=20G"),
            "grown from the image's 8 GiB: {scsi0}"
        );
        assert_eq!(config["ide2"], Value::Null, "no Talos ISO attached");
        let seed = config["ide3"].as_str().unwrap_or_default();
        assert!(seed.contains("omni-seed"), "the NoCloud seed stays: {seed}");
        assert_eq!(config["boot"], json!("order=scsi0;net0"));
        assert_eq!(vm["status"], json!("running"));
    }
    let state = h.machine_state("img-1");
    assert!(
        state.spec.boot_image_volume.starts_with("local:import/"),
        "{:?}",
        state.spec
    );
    h.stop_controller().await;
}

/// No storage on the node allows `import`: a readable failure that says what to enable, and no VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_import_storage_the_request_fails_saying_what_to_enable() {
    let mut h = Harness::start("").await;
    h.request("img-none", "image", IMAGE_CLASS);
    let status = h.wait_stage("img-none", Stage::Failed).await;
    let error = status.spec.error;
    assert!(error.contains("`import` content type"), "{error}");
    assert!(error.contains("pve1"), "{error}");
    assert!(h.vms_named("img-none").is_empty());
    h.stop_controller().await;
}

/// Before Proxmox VE 8.4 download-url takes no `.qcow2` into `import` storage: refused before anything
/// is written, naming the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_proxmox_8_3_boot_image_is_refused_before_anything_is_written() {
    let mut scenario = three_node_scenario();
    scenario["pve_version"] = json!("8.3.5");
    let mut h = Harness::start_with(scenario, "").await;
    with_import_storage(&mut h);
    h.request("img-old", "image", IMAGE_CLASS);
    let status = h.wait_stage("img-old", Stage::Failed).await;
    let error = status.spec.error;
    assert!(error.contains("8.4"), "{error}");
    assert!(error.contains("8.3.5"), "{error}");
    let writes = h.pve.requests().iter().filter(|(m, _)| m != "GET").count();
    assert_eq!(writes, 0, "nothing is written to Proxmox");
    h.stop_controller().await;
}

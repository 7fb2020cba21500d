use super::*;
use crate::rules::provider_data::ConfigLayers;

fn data(extra: &str) -> ProviderData {
    let yaml = format!("cores: 2\nmemory: 4096\ndisk_size: 20\nstorage_selector: 'true'\n{extra}");
    ConfigLayers::default().resolve(&yaml, None).unwrap()
}

fn identity() -> VmIdentity<'static> {
    VmIdentity {
        request_id: "req-1",
        set_id: Some("workers"),
        provider_id: "proxmox",
    }
}

fn target(disks: usize) -> VmTarget {
    VmTarget {
        vmid: 104,
        storage: StorageId::new("local-lvm").unwrap(),
        additional_disk_storages: vec![StorageId::new("ceph").unwrap(); disks],
        smbios_uuid: uuid::Uuid::nil(),
        boot_iso: Some(IsoVolume::parse("local:iso/talos.iso").unwrap()),
        boot_image: None,
        seed_iso: IsoVolume::parse("local:iso/omni-seed-req-1.iso").unwrap(),
        macs: Vec::new(),
    }
}

fn get<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[test]
fn minimal_create_request() {
    let params = render(&data(""), &identity(), &target(0)).unwrap();
    let expect = [
        ("vmid", "104"),
        ("name", "req-1"),
        (
            "tags",
            "machine-request.workers;omni-provider.proxmox;omni-request.req-1",
        ),
        ("cores", "2"),
        ("sockets", "1"),
        ("memory", "4096"),
        ("cpu", "x86-64-v2-AES"),
        ("bios", "seabios"),
        ("scsihw", "virtio-scsi-single"),
        ("scsi0", "local-lvm:20"),
        ("net0", "virtio,bridge=vmbr0,firewall=1"),
        ("agent", "enabled=1"),
        ("onboot", "1"),
        ("serial0", "socket"),
        ("ide2", "local:iso/talos.iso,media=cdrom"),
        ("ide3", "local:iso/omni-seed-req-1.iso,media=cdrom"),
        ("boot", "order=scsi0;ide2;net0"),
        ("smbios1", "uuid=00000000-0000-0000-0000-000000000000"),
    ];
    for (k, v) in expect {
        assert_eq!(get(&params, k), Some(v), "{k}");
    }
    for absent in [
        "balloon",
        "machine",
        "efidisk0",
        "pool",
        "numa",
        "hugepages",
        "vga",
        "net1",
        "scsi1",
    ] {
        assert_eq!(get(&params, absent), None, "{absent}");
    }
    let mut keys: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
    let n = keys.len();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), n, "duplicate keys");
    let description = get(&params, "description").unwrap();
    let marked = |key| identity::marked(description, key);
    assert_eq!(marked(identity::MARKER_PROVIDER), Some("proxmox"));
    assert_eq!(marked(identity::MARKER_REQUEST), Some("req-1"));
}

#[test]
fn full_create_request() {
    let d = data(
        "balloon: false\nmachine_type: q35\nbios: ovmf\nnuma: true\nhugepages: 2MB\nvga: serial0\npool: omni\ntags: [talos]\n\
         vlan: 7\nnetwork_firewall: false\ndisk_ssd: true\ndisk_discard: true\n\
         additional_nics: [{bridge: vmbr1, vlan: 9}]\nadditional_disks: [{disk_size: 50, storage_selector: 'true', disk_iothread: true}]\n\
         pci_devices: [{mapping: gpu1, pcie: true}]\nusb_devices: [{mapping: sdr, usb3: true}]\n",
    );
    let mut t = target(1);
    t.macs = vec![MacAddr([0xBC, 0x24, 0x11, 0xAA, 0xBB, 0xCC])];
    let params = render(&d, &identity(), &t).unwrap();
    for (k, v) in [
        ("balloon", "0"),
        ("machine", "q35"),
        ("bios", "ovmf"),
        ("efidisk0", "local-lvm:1,efitype=4m,pre-enrolled-keys=0"),
        ("numa", "1"),
        ("hugepages", "2"),
        ("vga", "serial0"),
        ("pool", "omni"),
        (
            "tags",
            "machine-request.workers;omni-provider.proxmox;omni-request.req-1;talos",
        ),
        (
            "net0",
            "virtio=BC:24:11:AA:BB:CC,bridge=vmbr0,firewall=0,tag=7",
        ),
        ("net1", "virtio,bridge=vmbr1,firewall=0,tag=9"),
        ("scsi0", "local-lvm:20,discard=on,ssd=1"),
        ("scsi1", "ceph:50,iothread=1"),
        ("hostpci0", "mapping=gpu1,pcie=1"),
        ("usb0", "mapping=sdr,usb3=1"),
    ] {
        assert_eq!(get(&params, k), Some(v), "{k}");
    }
    assert_eq!(
        render(&d, &identity(), &target(0)),
        Err(RenderError::DiskStorageCount {
            expected: 1,
            got: 0
        })
    );
    assert_eq!(
        render(
            &d,
            &identity(),
            &VmTarget {
                boot_iso: None,
                ..t
            }
        ),
        Err(RenderError::MissingBootIso)
    );
}

#[test]
fn clone_variant() {
    let d = data("boot: clone\ntemplate: 9000\ndisk_ssd: true\npool: omni\n");
    let mut t = target(0);
    t.boot_iso = None;
    let boot = BootDisk {
        slot: "scsi0".into(),
        drive: "local-lvm:vm-104-disk-0,size=8G".into(),
    };
    let params = render_after_clone(&d, &identity(), &t, Some(&boot)).unwrap();
    assert_eq!(get(&params, "scsi0"), Some("local-lvm:vm-104-disk-0,ssd=1"));
    assert_eq!(get(&params, "boot"), Some("order=scsi0;net0"));
    for absent in ["vmid", "name", "pool", "ide2", "efidisk0"] {
        assert_eq!(get(&params, absent), None, "{absent}");
    }
    assert_eq!(
        get(&params, "ide3"),
        Some("local:iso/omni-seed-req-1.iso,media=cdrom")
    );
    use crate::rules::provider_data::CloneMode;
    let clone = clone_params(&d, &identity(), 104, "pve2", &t.storage, CloneMode::Full);
    assert_eq!(get(&clone, "pool"), Some("omni"));
    assert_eq!(get(&clone, "target"), Some("pve2"));
    assert_eq!(get(&clone, "full"), Some("1"));
    assert_eq!(get(&clone, "storage"), Some("local-lvm"));
    // qemu-server src/PVE/API2/Qemu.pm `clone_vm`: "parameter 'storage' not allowed for
    // linked clones".
    let linked = clone_params(&d, &identity(), 104, "pve2", &t.storage, CloneMode::Linked);
    assert_eq!(get(&linked, "full"), Some("0"));
    assert_eq!(get(&linked, "storage"), None);
}

#[test]
fn a_request_id_that_is_not_a_tag_renders_without_the_request_tag() {
    // A request ID that is not a tag renders without the tag and without an error.
    let id = VmIdentity {
        request_id: "odd id",
        set_id: None,
        provider_id: "proxmox",
    };
    let params = render(&data(""), &id, &target(0)).unwrap();
    assert_eq!(get(&params, "tags"), Some("omni-provider.proxmox"));
}

#[test]
fn a_config_update_never_allocates_twice() {
    // qemu-server src/PVE/API2/Qemu.pm `update_vm`: `<storage>:<GiB>` creates a new volume and a
    // NIC without MAC gets a fresh random one, at every call.
    assert!(allocates("scsi1", "local-lvm:2,iothread=1"));
    assert!(allocates("efidisk0", "local-lvm:1,efitype=4m"));
    assert!(!allocates("scsi1", "local-lvm:vm-104-disk-1,size=2G"));
    assert!(!allocates("ide3", "local:iso/omni-seed-r.iso,media=cdrom"));
    assert!(allocates("net0", "virtio,bridge=vmbr0"));
    assert!(!allocates("net0", "virtio=BC:24:11:00:00:01,bridge=vmbr0"));
    assert!(!allocates("cores", "2"));

    let current: crate::proxmox::types::VmConfig = serde_json::from_value(serde_json::json!({
        "scsi1": "local-lvm:vm-104-disk-1,size=2G",
        "net0": "virtio=BC:24:11:AA:BB:CC,bridge=vmbr0"
    }))
    .unwrap();
    let params = vec![
        ("cores".to_string(), "2".to_string()),
        ("scsi1".into(), "local-lvm:2,iothread=1".into()),
        ("scsi2".into(), "local-lvm:3".into()),
        ("net0".into(), "virtio,bridge=vmbr1,firewall=1".into()),
        ("net1".into(), "virtio,bridge=vmbr0".into()),
    ];
    let again = without_repeated_allocations(params, &current);
    assert_eq!(
        again,
        [
            ("cores".to_string(), "2".to_string()),
            ("scsi2".into(), "local-lvm:3".into()),
            (
                "net0".into(),
                "virtio=BC:24:11:AA:BB:CC,bridge=vmbr1,firewall=1".into()
            ),
            ("net1".into(), "virtio,bridge=vmbr0".into()),
        ]
    );
}

#[test]
fn boot_image_makes_the_disk_from_the_image_with_no_iso_attached() {
    let d = data("boot: image\n");
    let image = ImportVolume::parse("local:import/abc.qcow2").unwrap();
    let t = VmTarget {
        boot_iso: None,
        boot_image: Some(image),
        ..target(0)
    };
    let params = render(&d, &identity(), &t).unwrap();
    // qemu-server `$check_drive_param`: size 0 is the only size `import-from` takes.
    assert!(
        get(&params, "scsi0")
            .unwrap()
            .starts_with("local-lvm:0,import-from=local:import/abc.qcow2")
    );
    assert_eq!(get(&params, &TALOS_CDROM.to_string()), None, "no ISO");
    assert!(
        get(&params, &SEED_CDROM.to_string()).is_some(),
        "the seed stays"
    );
    assert_eq!(get(&params, "boot"), Some("order=scsi0;net0"));
    let missing = VmTarget {
        boot_image: None,
        ..t
    };
    assert_eq!(
        render(&d, &identity(), &missing),
        Err(RenderError::MissingBootImage)
    );
}

#[test]
fn a_clone_boots_from_and_grows_the_templates_boot_disk() {
    let config: crate::proxmox::types::VmConfig = serde_json::from_value(serde_json::json!({
        "ide2": "local:iso/talos.iso,media=cdrom",
        "virtio0": "local-lvm:vm-104-disk-0,size=8G",
        "boot": "order=ide2;virtio0;net0"
    }))
    .unwrap();
    let found = crate::model::vm::BootDisk::of(&config).unwrap();
    let d = data("boot: clone\ntemplate: 9000\n");
    let mut t = target(0);
    t.boot_iso = None;
    let params = render_after_clone(&d, &identity(), &t, Some(&found)).unwrap();
    assert_eq!(get(&params, "boot"), Some("order=virtio0;net0"));
    assert_eq!(found.slot, "virtio0");
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => "[a-z][a-z0-9_.-]{0,8}[a-z0-9]",
            1 => "[a-zA-Z0-9_.+:=,; -]{1,12}",
            1 => prop::sample::select(vec![
                "vmbr0,firewall=0",
                "vmbr0\nnet1: x",
                "gpu=1",
                "a;b",
                "talos",
                "vmbr1",
                "nvidia-180",
                "x86-64-v2-AES",
                "pool/sub",
            ])
            .prop_map(str::to_string),
        ]
    }

    /// The keys each rendered property string may carry (the first item may be a bare value).
    fn allowed(key: &str) -> &'static [&'static str] {
        match key.trim_end_matches(|c: char| c.is_ascii_digit()) {
            "net" => &["<default>", "virtio", "bridge", "firewall", "tag"],
            "scsi" => &["<default>", "cache", "aio", "iothread", "discard", "ssd"],
            "ide" => &["<default>", "media"],
            "efidisk" => &["<default>", "efitype", "pre-enrolled-keys"],
            "hostpci" => &["mapping", "mdev", "pcie", "rombar", "x-vga"],
            "usb" => &["mapping", "usb3"],
            "smbios" => &["uuid"],
            "agent" => &["enabled"],
            "boot" => &["order"],
            _ => &[],
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever names a class gives (bridges, tags, CPU type, pool, mappings, mdev), once the
        /// provider data accepts them the rendered parameters carry no key, item or line the user
        /// wrote: every property string has only its own keys, no value has a newline.
        #[test]
        fn user_names_never_add_keys(
            bridge in name(), nic_bridge in name(), tag in name(), cpu in name(), pool in name(),
            mapping in name(), mdev in name(), usb in name(),
        ) {
            let q = |s: &str| serde_json::to_string(s).unwrap();
            let extra = format!(
                "network_bridge: {}\nadditional_nics: [{{bridge: {}}}]\ntags: [{}]\ncpu_type: {}\npool: {}\npci_devices: [{{mapping: {}, mdev: {}}}]\nusb_devices: [{{mapping: {}}}]\n",
                q(&bridge), q(&nic_bridge), q(&tag), q(&cpu), q(&pool), q(&mapping), q(&mdev), q(&usb),
            );
            let yaml = format!("cores: 2\nmemory: 4096\ndisk_size: 20\nstorage_selector: 'true'\n{extra}");
            let Ok(data) = ConfigLayers::default().resolve(&yaml, None) else {
                return Ok(());
            };
            let params = render(&data, &identity(), &target(0)).unwrap();
            for (key, value) in &params {
                // The description is ours (the ownership marker), multi-line by design.
                prop_assert!(key == "description" || !value.contains(['\n', '\r']), "{key}={value:?}");
                let allowed = allowed(key);
                if !allowed.is_empty() {
                    for part in value.split(',') {
                        let k = part.split_once('=').map_or("<default>", |(k, _)| k);
                        prop_assert!(allowed.contains(&k), "{key}={value:?}");
                    }
                }
            }
            let tags = get(&params, "tags").unwrap();
            prop_assert!(!tags.contains([',', '=', ' ']), "{tags:?}");
            prop_assert_eq!(get(&params, "cpu"), Some(cpu.as_str()));
            prop_assert!(!cpu.contains([',', '=', ';']));
        }
    }
}

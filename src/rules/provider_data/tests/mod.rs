//! The provider-data reading, layering and rules, and the key declarations they read from.

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::schema::{inner_keys, top_keys};
use super::values::MachineType;
use super::*;
use crate::proxmox::property::{DiskCache, Hugepages, NodeName, VlanTag};

fn parse(yaml: &str) -> Result<ProviderData, Vec<Problem>> {
    ConfigLayers::default().resolve(yaml, None)
}

fn parse_strict(yaml: &str) -> Result<ProviderData, Vec<Problem>> {
    let mut strict = ConfigLayers::default();
    strict.strict = true;
    strict.resolve(yaml, None)
}

/// The class YAML over one node's override (`(name, override)`) over `defaults`.
fn resolve(
    strict: bool,
    class_yaml: &str,
    node: Option<(&str, &Map<String, Value>)>,
    defaults: &Map<String, Value>,
) -> Result<ProviderData, Vec<Problem>> {
    let nodes = node.map(|(n, over)| Map::from_iter([(n.to_owned(), Value::Object(over.clone()))]));
    let layers = ConfigLayers::read(defaults, &nodes.unwrap_or_default(), strict);
    layers.resolve(class_yaml, node.map(|(n, _)| n))
}

fn keys_of(problems: &[Problem]) -> Vec<&str> {
    problems.iter().map(|p| p.key.as_str()).collect()
}

const MINIMAL: &str =
    "cores: 2\nmemory: 4096\ndisk_size: 20\nstorage_selector: name == \"local-lvm\"\n";

#[test]
fn a_failure_shows_the_ignored_keys_beside_the_errors() {
    // `memroy` is ignored with a warning; the class then fails for an unrelated value, and the
    // failure shows the warning too, because a typo is often the cause.
    let problems = parse(
        "cores: 2\nmemroy: 4096\nmemory: 0\ndisk_size: 20\nstorage_selector: name == \"local-lvm\"\n",
    )
    .unwrap_err();
    let text = describe(&problems);
    assert!(keys_of(&problems).contains(&"memory"), "{text}");
    assert!(text.contains("memroy"), "{text}");
    assert!(text.contains("did you mean `memory`?"), "{text}");
    assert_eq!(
        keys_of(&problems).last(),
        Some(&"memroy"),
        "the errors first, then the ignored keys: {text}"
    );
    // Without an error the warning stays a warning.
    let data = parse(&format!("{MINIMAL}memroy: 4096\n")).unwrap();
    assert_eq!(data.warnings.len(), 1);
}

#[test]
fn minimal_class_gets_upstream_defaults() {
    let data = parse(MINIMAL).unwrap();
    assert_eq!(
        (data.cores, data.sockets, data.memory_mb, data.disk_size_gb),
        (2, 1, 4096, 20)
    );
    assert_eq!(data.network_bridge.as_str(), "vmbr0");
    assert_eq!(data.cpu_type.as_str(), "x86-64-v2-AES");
    assert!(data.network_firewall);
    assert_eq!(data.vlan, None);
    assert_eq!(data.boot, BootMode::Iso);
    assert_eq!(data.placement_strategy, PlacementStrategy::Spread);
    assert_eq!(data.ip_discovery_timeout, Duration::from_secs(300));
    assert_eq!(data.bios, Bios::Seabios);
    assert_eq!(data.balloon, None);
    assert_eq!(data.total_disk_gb(), 20);
}

/// The official provider's HA rule keys are accepted with its meaning; `spread: true` is the short
/// form of `resource_affinity: negative`, and contradicting it is refused naming the key.
#[test]
fn ha_rule_keys_are_read_and_spread_is_negative_affinity() {
    let data = parse(
        "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\nha:\n  rules: [r1]\n  node_affinity_nodes: [pve1]\n  resource_affinity: positive\n",
    )
    .unwrap();
    let ha = data.ha.clone().unwrap();
    assert_eq!(ha.rules, ["r1"]);
    assert_eq!(ha.node_affinity_nodes[0].as_str(), "pve1");
    assert_eq!(ha.resource_affinity, Some(ResourceAffinity::Positive));
    assert!(ha.uses_rules());
    let spread = parse(
        "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\nha:\n  spread: true\n",
    )
    .unwrap();
    assert_eq!(
        spread.ha.clone().unwrap().resource_affinity,
        Some(ResourceAffinity::Negative)
    );
    let problems = parse(
        "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\nha:\n  spread: true\n  resource_affinity: positive\n",
    )
    .unwrap_err();
    assert_eq!(problems[0].key, "ha.spread");
    assert!(problems[0].message.contains("remove one of the two"));
}

#[test]
fn every_key_is_accepted() {
    let yaml = r#"
cores: 4
sockets: 2
memory: 8192
disk_size: 40
storage_selector: name == "local-lvm"
node: pve2
placement_strategy: binpack
network_bridge: vmbr1
vlan: 20
network_firewall: false
disk_ssd: true
disk_discard: true
disk_iothread: true
disk_cache: writeback
disk_aio: io_uring
cpu_type: host
machine_type: q35
bios: ovmf
vga: serial0
numa: true
hugepages: 1GB
balloon: false
pool: omni
tags: [talos, prod]
ha:
  state: started
  comment: hi
  max_restart: 2
  max_relocate: 1
  failback: true
  node_affinity_strict: true
additional_nics:
  - bridge: vmbr2
    vlan: 30
    firewall: true
usb_devices:
  - mapping: rtl-sdr
    usb3: true
pci_devices:
  - mapping: nvidia-gpu-1
    mdev: nvidia-180
    pcie: true
    primary_gpu: true
    rombar: true
additional_disks:
  - disk_size: 100
    storage_selector: storageType == "zfspool"
    disk_ssd: true
    disk_cache: none
    disk_aio: native
boot: clone
template: 9000
clone_mode: linked
allowed_nodes: [pve1, pve2]
iso_storage_selector: name == "local"
ip_discovery_timeout: 0
"#;
    let data = parse(yaml).unwrap();
    assert_eq!(data.node.as_ref().map(NodeName::as_str), Some("pve2"));
    assert_eq!(data.vlan.map(VlanTag::get), Some(20));
    assert!(!data.network_firewall);
    assert_eq!(data.disk_cache, Some(DiskCache::Writeback));
    assert_eq!(data.machine_type, Some(MachineType::Q35));
    assert_eq!(data.bios, Bios::Ovmf);
    assert_eq!(data.hugepages, Some(Hugepages::OneGb));
    assert_eq!(data.ha.as_ref().unwrap().max_restart, Some(2));
    assert_eq!(data.additional_nics[0].bridge.as_str(), "vmbr2");
    assert!(data.usb_devices[0].usb3);
    assert!(data.pci_devices[0].rombar);
    assert_eq!(data.additional_disks[0].size_gb, 100);
    assert_eq!(data.template, Some(TemplateRef::VmId(9000)));
    assert_eq!(data.clone_mode, CloneMode::Linked);
    assert_eq!(data.ip_discovery_timeout, Duration::ZERO);
    assert_eq!(data.total_disk_gb(), 140);
    assert_eq!(data.placement_strategy, PlacementStrategy::Binpack);
}

#[test]
fn schema_lists_every_key_the_parser_knows() {
    let schema: Value =
        serde_json::from_str(include_str!("../../../../schema/provider-data.schema.json")).unwrap();
    let props = schema["properties"].as_object().unwrap();
    let mut listed: Vec<&str> = props.keys().map(String::as_str).collect();
    let mut known = top_keys().to_vec();
    listed.sort_unstable();
    known.sort_unstable();
    assert_eq!(listed, known);
    for (key, sub) in props {
        assert!(sub["description"].is_string(), "{key} has no description");
    }
    let items = |k: &str| {
        props[k]["items"]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        items("additional_nics").len(),
        inner_keys("additional_nics").len()
    );
    assert_eq!(items("usb_devices").len(), inner_keys("usb_devices").len());
    assert_eq!(items("pci_devices").len(), inner_keys("pci_devices").len());
    assert_eq!(
        items("additional_disks").len(),
        inner_keys("additional_disks").len()
    );
    assert_eq!(
        props["ha"]["properties"].as_object().unwrap().len(),
        inner_keys("ha").len()
    );
}

#[test]
fn reports_every_problem_at_once() {
    let yaml = r#"
cores: 0
memory: 1024
disk_sise: 20
storage_selector: local-lvm
network_bridge: "vmbr0,firewall=0"
tags: ["ok", "bad;tag", "machine-request.x"]
additional_disks:
  - disk_size: 0
    storage_selector: name ==
  - storage_selector: "true"
    disk_cahce: none
pci_devices:
  - mapping: "gpu=1"
boot: clone
"#;
    // Strict, so the misspelled keys are problems too (by default they are warnings).
    let problems = parse_strict(yaml).unwrap_err();
    let keys = keys_of(&problems);
    for expected in [
        "cores",
        "memory",
        "disk_sise",
        "disk_size",
        "storage_selector",
        "network_bridge",
        "tags[1]",
        "tags[2]",
        "additional_disks[0].disk_size",
        "additional_disks[0].storage_selector",
        "additional_disks[1].disk_size",
        "additional_disks[1].disk_cahce",
        "pci_devices[0].mapping",
        "template",
    ] {
        assert!(
            keys.contains(&expected),
            "missing {expected} in {problems:#?}"
        );
    }
    let text = describe(&problems);
    assert!(text.contains("did you mean `disk_size`?"), "{text}");
    assert!(text.contains("did you mean `disk_cache`?"), "{text}");
    assert!(
        text.contains("name == \\\"local-lvm\\\"") || text.contains("name == \"local-lvm\""),
        "{text}"
    );
    // One problem per key.
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), keys.len(), "{problems:#?}");
}

#[test]
fn type_mistakes_name_the_key() {
    let problems =
        parse("cores: '2'\nmemory: 4096\ndisk_size: 20\nstorage_selector: 'true'\nvlan: no\n")
            .unwrap_err();
    assert_eq!(keys_of(&problems), vec!["cores", "vlan"]);
    assert!(problems[0].message.contains("integer"), "{problems:?}");
}

#[test]
fn not_a_mapping() {
    let problems = parse("- a\n- b\n").unwrap_err();
    assert_eq!(problems[0].key, "provider_data");
    let problems = parse("cores: [").unwrap_err();
    assert!(problems[0].message.contains("YAML"));
}

#[test]
fn cross_field_rules() {
    let p = parse(&format!("{MINIMAL}template: base\n")).unwrap_err();
    assert_eq!(keys_of(&p), vec!["template"]);
    let p = parse(&format!("{MINIMAL}node: pve3\nallowed_nodes: [pve1]\n")).unwrap_err();
    assert_eq!(keys_of(&p), vec!["node"]);
    assert_eq!(
        p[0].message,
        r#""pve3" is not in allowed_nodes (pve1); add it there or pick another node"#
    );
    let data = parse(&format!("{MINIMAL}boot: clone\ntemplate: talos-template\n")).unwrap();
    assert_eq!(
        data.template,
        Some(TemplateRef::Name("talos-template".into()))
    );
    let data = parse(&format!("{MINIMAL}boot: clone\ntemplate: '9001'\n")).unwrap();
    assert_eq!(data.template, Some(TemplateRef::VmId(9001)));
    assert_eq!(data.clone_mode, CloneMode::Full, "full unless asked");
    // clone_mode without a clone, and a value that is not one of the modes, each with the fix.
    let p = parse(&format!("{MINIMAL}clone_mode: linked\n")).unwrap_err();
    assert_eq!(keys_of(&p), vec!["clone_mode"]);
    assert!(p[0].message.contains("add `boot: clone`"), "{p:?}");
    let p = parse(&format!(
        "{MINIMAL}boot: clone\ntemplate: 9000\nclone_mode: linkd\nclone_mod: full\n"
    ))
    .unwrap_err();
    assert_eq!(
        keys_of(&p),
        vec!["clone_mode", "clone_mod"],
        "the ignored key follows"
    );
    assert!(
        p[0].message
            .contains("\"linkd\" is not one of full, linked (did you mean `linked`?)"),
        "{p:?}"
    );
    let warned = parse(&format!(
        "{MINIMAL}boot: clone\ntemplate: 9000\nclone_mod: full\n"
    ))
    .unwrap()
    .warnings;
    assert!(
        warned[0].message.contains("did you mean `clone_mode`"),
        "{warned:?}"
    );
    let p = parse(&format!(
        "{MINIMAL}pci_devices: [{{mapping: gpu1, pcie: true}}]\n"
    ))
    .unwrap_err();
    assert_eq!(keys_of(&p), vec!["machine_type"]);
}

#[test]
fn layers_merge_with_the_right_precedence() {
    let defaults = json!({"cores": 1, "memory": 2048, "disk_size": 10, "storage_selector": "name == \"local-lvm\"", "network_bridge": "vmbr9"});
    let node = json!({"network_bridge": "vmbr5", "memory": 3072});
    let data = resolve(
        false,
        "memory: 8192\n",
        Some(("pve2", node.as_object().unwrap())),
        defaults.as_object().unwrap(),
    )
    .unwrap();
    assert_eq!(data.memory_mb, 8192);
    assert_eq!(data.network_bridge.as_str(), "vmbr5");
    assert_eq!(data.cores, 1);
    let data = resolve(false, "", None, defaults.as_object().unwrap()).unwrap();
    assert_eq!(data.network_bridge.as_str(), "vmbr9");
    let problems = resolve(false, "", None, &Map::new()).unwrap_err();
    assert_eq!(
        keys_of(&problems),
        vec!["cores", "memory", "disk_size", "storage_selector"]
    );
    assert!(problems[3].message.contains("defaults"));
    let bad_node = json!({"network_bridge": "a,b"});
    let problems = resolve(
        false,
        MINIMAL,
        Some(("pve2", bad_node.as_object().unwrap())),
        &Map::new(),
    )
    .unwrap_err();
    assert_eq!(keys_of(&problems), vec!["nodes.pve2.network_bridge"]);
    let bad_default = json!({"cores": 0});
    let problems = resolve(
        false,
        "memory: 4096\ndisk_size: 5\nstorage_selector: 'true'\n",
        None,
        bad_default.as_object().unwrap(),
    )
    .unwrap_err();
    assert_eq!(keys_of(&problems), vec!["defaults.cores"]);
}

#[test]
fn config_overrides_are_validated_at_load() {
    let defaults = json!({"coers": 2, "network_bridge": "bad bridge"});
    let nodes =
        json!({"pve2": {"node": "pve2", "storage_selector": "ceph"}, "pve3": "x", "bad_node!": {}});
    // Strict, so the misspelled key is a problem too (by default it is a warning).
    let problems = ConfigLayers::read(
        defaults.as_object().unwrap(),
        nodes.as_object().unwrap(),
        true,
    )
    .check()
    .problems;
    let keys = keys_of(&problems);
    for expected in [
        "defaults.coers",
        "defaults.network_bridge",
        "nodes.pve2.node",
        "nodes.pve2.storage_selector",
        "nodes.pve3",
        "nodes.bad_node!",
    ] {
        assert!(
            keys.contains(&expected),
            "missing {expected} in {problems:#?}"
        );
    }
    assert!(describe(&problems).contains("did you mean `cores`?"));
    assert!(
        ConfigLayers::read(&Map::new(), &Map::new(), false)
            .check()
            .problems
            .is_empty()
    );
}

/// The official provider reads provider data with a plain YAML unmarshal into its struct, so an
/// unknown key is silently dropped (omni client/pkg/infra/provision/context.go,
/// `UnmarshalProviderData`; its data/schema.json sets no `additionalProperties`). A class that
/// works there must work here: unknown keys are warnings with a suggestion, errors only in strict
/// mode.
#[test]
fn unknown_keys_are_warnings_unless_strict() {
    let yaml = format!(
        "{MINIMAL}disk_sise: 20\nha:\n  state: started\n  max_restrat: 2\nadditional_disks:\n  - disk_size: 10\n    storage_selector: 'true'\n    disk_cahce: none\nfuture_key: 1\n"
    );
    let data = parse(&yaml).unwrap();
    let keys = keys_of(&data.warnings);
    assert_eq!(
        keys,
        vec![
            "disk_sise",
            "future_key",
            "ha.max_restrat",
            "additional_disks[0].disk_cahce"
        ],
        "{:#?}",
        data.warnings
    );
    let text = describe(&data.warnings);
    assert!(
        text.contains("ignored (did you mean `disk_size`?)"),
        "{text}"
    );
    assert!(text.contains("did you mean `max_restart`?"), "{text}");
    assert!(text.contains("did you mean `disk_cache`?"), "{text}");
    assert_eq!(data.disk_size_gb, 20);
    assert!(parse(MINIMAL).unwrap().warnings.is_empty());
    // When the misspelled key was a required one, the problem points at it.
    let p = parse("cores: 2\nmemory: 4096\ndisk_sise: 20\nstorage_selector: 'true'\n").unwrap_err();
    assert_eq!(keys_of(&p), vec!["disk_size"]);
    assert!(
        p[0].message
            .contains("`disk_sise` is set: did you mean `disk_size`?"),
        "{p:?}"
    );

    let problems = parse_strict(&yaml).unwrap_err();
    assert_eq!(keys_of(&problems), keys);
    assert!(describe(&problems).contains("strict: true"));
}

#[test]
fn unknown_keys_in_lower_layers_are_warnings_with_their_layer_path() {
    let defaults = json!({"coers": 2});
    let node = json!({"network_bridg": "vmbr1"});
    let data = resolve(
        false,
        MINIMAL,
        Some(("pve2", node.as_object().unwrap())),
        defaults.as_object().unwrap(),
    )
    .unwrap();
    assert_eq!(
        keys_of(&data.warnings),
        vec!["defaults.coers", "nodes.pve2.network_bridg"]
    );
    let found = ConfigLayers::read(
        defaults.as_object().unwrap(),
        json!({"pve2": node}).as_object().unwrap(),
        false,
    )
    .check();
    assert!(found.problems.is_empty(), "{found:?}");
    assert_eq!(
        keys_of(&found.warnings),
        vec!["defaults.coers", "nodes.pve2.network_bridg"]
    );
    assert!(describe(&found.warnings).contains("did you mean `cores`?"));
}

/// qemu-server src/PVE/QemuServer/Memory.pm, `config`: dies with "numa needs to be enabled to use
/// hugepages" when hugepages is set without numa (at start, not when the config is written);
/// without custom numaN entries it splits the memory evenly over one NUMA node per socket, and
/// `hugepages_size` dies unless each node's share is a multiple of the page size (2 or 1024 MB).
#[test]
fn hugepages_need_numa_and_whole_pages_per_numa_node() {
    let p = parse(&format!("{MINIMAL}hugepages: 2MB\nballoon: false\n")).unwrap_err();
    assert_eq!(keys_of(&p), vec!["numa"]);
    assert!(p[0].message.contains("numa: true"), "{p:?}");

    let base = "cores: 2\ndisk_size: 20\nstorage_selector: 'true'\nballoon: false\n";
    let ok = parse(&format!(
        "{base}numa: true\nhugepages: 1GB\nsockets: 2\nmemory: 4096\n"
    ));
    assert!(ok.is_ok(), "{ok:?}");
    // 6144 MB over 4 sockets is 1536 MB per node: not whole 1GB pages.
    let p = parse(&format!(
        "{base}numa: true\nhugepages: 1GB\nsockets: 4\nmemory: 6144\n"
    ))
    .unwrap_err();
    assert_eq!(keys_of(&p), vec!["memory"]);
    assert!(p[0].message.contains("multiple of 4096 MB"), "{p:?}");
    assert!(p[0].message.contains("memory: 4096"), "{p:?}");
    // 4098 MB over 2 sockets is 2049 MB per node: not whole 2MB pages.
    let p = parse(&format!(
        "{base}numa: true\nhugepages: 2MB\nsockets: 2\nmemory: 4098\n"
    ))
    .unwrap_err();
    assert_eq!(keys_of(&p), vec!["memory"]);
    assert!(
        parse(&format!(
            "{base}numa: true\nhugepages: 2MB\nsockets: 2\nmemory: 4100\n"
        ))
        .is_ok()
    );
}

/// The problem [`release_problems`] finds with `key`.
fn release_problem(key: &str, data: &ProviderData, pve_version: &str) -> Option<Problem> {
    release_problems(data, pve_version)
        .into_iter()
        .find(|p| p.key == key)
}

/// pve-ha-manager src/PVE/HA/Resources.pm: the `failback` property of an HA resource came with
/// commit "resources: introduce failback property in ha resource config" (version 5.0.2, the
/// trixie-based PVE 9 series); PVE 8 (4.0.x, bookworm) rejects the unknown parameter with a 400.
#[test]
fn ha_failback_is_refused_before_pve_9() {
    let with = parse(&format!(
        "{MINIMAL}ha:\n  state: started\n  failback: false\n"
    ))
    .unwrap();
    let p = release_problem("ha.failback", &with, "8.4.1").unwrap();
    assert_eq!(p.key, "ha.failback");
    assert!(
        p.message.contains("Proxmox VE 9") && p.message.contains("8.4.1"),
        "{p}"
    );
    assert_eq!(release_problem("ha.failback", &with, "9.0.10"), None);
    assert_eq!(release_problem("ha.failback", &with, "10.1"), None);
    assert_eq!(release_problem("ha.failback", &with, "garbage"), None);
    let without = parse(&format!("{MINIMAL}ha:\n  state: started\n")).unwrap();
    assert_eq!(release_problem("ha.failback", &without, "8.4.1"), None);
    assert_eq!(
        release_problem("ha.failback", &parse(MINIMAL).unwrap(), "7.4"),
        None
    );
}

/// `boot: image` needs download-url to take `.qcow2` into `import` storage: libpve-storage-perl
/// 8.3.6 (pve-storage src/PVE/API2/Storage/Status.pm `download_url`, `UPLOAD_IMPORT_EXT_RE_1`),
/// first required by Proxmox VE 8.4 (pve-manager debian/control). Also a template is `clone`-only.
#[test]
fn boot_image_is_refused_before_pve_8_4() {
    let image = parse(&format!("{MINIMAL}boot: image\n")).unwrap();
    assert_eq!(image.boot, BootMode::Image);
    let p = release_problem("boot", &image, "8.3.5").unwrap();
    assert_eq!(p.key, "boot");
    assert!(
        p.message.contains("8.4") && p.message.contains("8.3.5"),
        "{p}"
    );
    assert!(release_problem("boot", &image, "7.4").is_some());
    assert_eq!(release_problem("boot", &image, "8.4.0"), None);
    assert_eq!(release_problem("boot", &image, "9.1.2"), None);
    assert_eq!(release_problem("boot", &image, "garbage"), None);
    assert_eq!(
        release_problem("boot", &parse(MINIMAL).unwrap(), "7.4"),
        None
    );
    assert_eq!(release_problems(&image, "8.3.5").len(), 1);
    let with_template = parse(&format!("{MINIMAL}boot: image\ntemplate: 9000\n")).unwrap_err();
    assert!(
        with_template
            .iter()
            .any(|p| p.key == "template" && p.message.contains("boot: clone")),
        "{with_template:?}"
    );
}

/// An empty key is named as `""`, not left out of the path (which would name no key at all, or
/// only its layer, `defaults`).
#[test]
fn an_empty_key_is_named_quoted() {
    let problems = parse_strict(&format!("{MINIMAL}\"\": 1\n")).unwrap_err();
    assert_eq!(keys_of(&problems), ["\"\""], "{problems:?}");
    let defaults: Map<String, Value> = serde_json::from_str(r#"{"": null}"#).unwrap();
    let check = ConfigLayers::read(&defaults, &Map::new(), false).check();
    assert_eq!(keys_of(&check.warnings), ["defaults.\"\""], "{check:?}");
    let nested = parse(&format!(
        "{MINIMAL}additional_disks: [{{disk_size: 1, storage_selector: 'true', \"\": 2}}]\n"
    ))
    .unwrap();
    assert_eq!(keys_of(&nested.warnings), ["additional_disks[0].\"\""]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn arbitrary_yaml_never_panics(text in "\\PC{0,80}") {
        let _ = parse(&text);
    }

    #[test]
    fn arbitrary_values_never_panic_and_always_name_a_key(
        key in prop::sample::select(top_keys().to_vec()),
        value in prop_oneof![
            any::<i64>().prop_map(|n| json!(n)),
            "\\PC{0,12}".prop_map(|s| json!(s)),
            any::<bool>().prop_map(|b| json!(b)),
            Just(json!([1, "x", {"a": 1}])),
            Just(json!({"bridge": 1})),
        ],
    ) {
        let mut map: Map<String, Value> = serde_json::from_str(r#"{"cores":2,"memory":4096,"disk_size":20,"storage_selector":"true"}"#).unwrap();
        map.insert(key.to_string(), value);
        if let Err(problems) = resolve(false, &Value::Object(map).to_string(), None, &Map::new()) {
            prop_assert!(!problems.is_empty());
            for p in &problems {
                prop_assert!(!p.key.is_empty());
                prop_assert!(!p.message.is_empty());
            }
        }
    }
}

mod fuzz;

/// A value outside a key's list names the whole list, and the closest value when it looks like a
/// typo, at the top level and nested; a value far from every one gets the list alone.
#[test]
fn a_value_outside_its_list_names_the_list_and_the_closest_value() {
    let p = parse(&format!(
        "{MINIMAL}placement_strategy: sprad\nha:\n  state: startd\nbios: uefi\n"
    ))
    .unwrap_err();
    let message = |key: &str| {
        p.iter()
            .find(|x| x.key == key)
            .map(|x| x.message.clone())
            .unwrap_or_else(|| panic!("no problem for {key}: {p:?}"))
    };
    assert_eq!(
        message("placement_strategy"),
        "\"sprad\" is not one of spread, fewer-vms, round-robin, binpack (did you mean `spread`?)"
    );
    let ha = message("ha.state");
    assert!(ha.starts_with("\"startd\" is not one of "), "{ha}");
    assert!(ha.ends_with("(did you mean `started`?)"), "{ha}");
    assert_eq!(message("bios"), "\"uefi\" is not one of seabios, ovmf");
}

/// A key comes whole from the
/// highest layer that writes it; a wrong value there hides the lower layers' value too.
#[test]
fn keys_as_written_come_from_the_highest_layer() {
    let defaults = json!({"numa": true, "disk_ssd": true, "tags": ["a"]});
    let defaults = defaults.as_object().unwrap();
    let data = resolve(false, &format!("{MINIMAL}numa: false\n"), None, defaults).unwrap();
    assert_eq!(
        (data.keys.numa, data.keys.disk_ssd, data.keys.balloon),
        (false, true, None)
    );
    assert_eq!(data.tags.len(), 1);
    let problems = resolve(
        false,
        &format!("{MINIMAL}tags: [ok, 'a;b']\n"),
        None,
        defaults,
    )
    .unwrap_err();
    assert_eq!(keys_of(&problems), ["tags[1]"]);
}

/// serde stops at the first wrong value; every wrong item of a list and key of a mapping is still
/// named, each with its path, and the schema's finding is not repeated by the reading.
#[test]
fn every_wrong_item_is_named_once() {
    let problems = parse(&format!(
        "{MINIMAL}additional_nics:\n  - {{bridge: 'a,b', vlan: 4095}}\n  - {{bridge: vmbr1, ip_pool: ' '}}\nha:\n  rules: ['-x']\n  node_affinity_nodes: ['-y']\n"
    ))
    .unwrap_err();
    assert_eq!(
        keys_of(&problems),
        [
            "additional_nics[0].vlan",
            "ha.node_affinity_nodes[0]",
            "ha.rules[0]",
            "additional_nics[0].bridge",
            "additional_nics[1].ip_pool"
        ],
        "{problems:#?}"
    );
}

/// Within one key, each item's findings come in turn, as one reading of the list goes, and a rule
/// about the whole list after them.
#[test]
fn a_rule_about_a_list_comes_after_its_items() {
    let nic = |i| match i {
        1 => "  - {bridge: vmbr1, firewal: true}\n",
        _ => "  - {bridge: vmbr1}\n",
    };
    let nics: String = (0..32).map(nic).collect();
    let problems = parse_strict(&format!("{MINIMAL}additional_nics:\n{nics}")).unwrap_err();
    assert_eq!(
        keys_of(&problems),
        ["additional_nics[1].firewal", "additional_nics"],
        "{problems:#?}"
    );
}

/// A `nodes.<name>:` override that is not a mapping is one problem under the node's path, and
/// resolving the class on another node does not repeat it.
#[test]
fn an_override_that_is_not_a_mapping_is_one_problem_under_its_node() {
    let nodes = Map::from_iter([("pve2".to_owned(), json!([1, 2]))]);
    let layers = ConfigLayers::read(&Map::new(), &nodes, false);
    let found = layers.check();
    let problems: Vec<String> = found.problems.iter().map(Problem::to_string).collect();
    assert_eq!(
        problems,
        ["nodes.pve2: must be a mapping of provider-data keys, not a list"]
    );
    assert!(layers.resolve(MINIMAL, Some("pve1")).is_ok());
    assert!(layers.resolve(MINIMAL, Some("pve2")).is_ok());
}

/// A number past what Proxmox or the provider computes with is refused with its limit.
#[test]
fn numbers_past_their_limit_are_refused_with_the_limit() {
    let problems = parse(&format!(
        "{MINIMAL}sockets: 65\nha:\n  max_restart: 4294967296\n  max_relocate: 4294967295\n"
    ))
    .unwrap_err();
    let problems = problems.iter().map(Problem::to_string).collect::<Vec<_>>();
    assert_eq!(
        problems,
        [
            "sockets: 65 is too large (at most 64)",
            "ha.max_restart: 4294967296 is too large (at most 4294967295)",
        ]
    );
    let data = parse(&MINIMAL.replace("4096", "67108864")).unwrap();
    assert_eq!(data.memory_mb, 67_108_864);
}

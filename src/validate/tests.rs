//! The checks against a fixed cluster, without a network.

use serde_json::{Value, json};

use super::cluster::ClusterFacts;
use super::gather::{HEALTH_TEXT_MAX, summarize};
use super::*;
use crate::config::ProviderConfig;
use crate::proxmox::types::ClusterResource;
use crate::rules::provider_data::ConfigLayers;
use crate::rules::provider_data::needs_release_check;

/// pve1 (online, 6 GiB free, local-lvm + iso storage), pve2 (online, 1 GiB free, local-lvm only),
/// pve3 offline; template 9000 on pve1, VM 100 on pve2.
fn listing() -> crate::model::Listing {
    let resources: Vec<ClusterResource> = serde_json::from_value(json!([
        {"type":"node","node":"pve1","status":"online","mem":2147483648u64,"maxmem":8589934592u64},
        {"type":"node","node":"pve2","status":"online","mem":7516192768u64,"maxmem":8589934592u64},
        {"type":"node","node":"pve3","status":"offline"},
        {"type":"qemu","vmid":9000,"node":"pve1","name":"talos","template":1},
        {"type":"qemu","vmid":100,"node":"pve2","name":"web"},
        {"type":"storage","storage":"local","node":"pve1","content":"iso,backup","status":"available","disk":0,"maxdisk":107374182400u64,"plugintype":"dir"},
        {"type":"storage","storage":"local-lvm","node":"pve1","content":"images,rootdir","status":"available","disk":0,"maxdisk":107374182400u64,"plugintype":"lvmthin"},
        {"type":"storage","storage":"local-lvm","node":"pve2","content":"images,rootdir","status":"available","disk":0,"maxdisk":10737418240u64,"plugintype":"lvmthin"}
    ]))
    .unwrap();
    crate::model::Listing::read(resources, std::time::Instant::now())
}

/// [`listing`], with vmbr0/vmbr1 on pve1 and vmbr0 on pve2.
fn view() -> ClusterFacts {
    ClusterFacts {
        cluster: crate::model::ClusterSnapshot::from_resources(&listing()),
        bridges: [
            ("pve1".to_string(), Ok(vec!["vmbr0".into(), "vmbr1".into()])),
            ("pve2".to_string(), Ok(vec!["vmbr0".into()])),
        ]
        .into(),
        pci_mappings: None,
        usb_mappings: None,
        pve_version: None,
        clone_source: None,
        ha_rules: None,
        health: None,
    }
}

/// `view()` with what `gather` reads for a clone of `data`'s template: each copy's drives, here
/// the boot disk on local-lvm of the copy's node.
fn view_for(data: &crate::rules::provider_data::ProviderData) -> ClusterFacts {
    use crate::rules::placement::CloneSource;
    use crate::rules::provider_data::BootMode;
    let mut view = view();
    let (BootMode::Clone, Some(wanted)) = (data.boot, &data.template) else {
        return view;
    };
    let cluster = view.cluster.clone();
    let config: crate::proxmox::types::VmConfig =
        serde_json::from_value(json!({"scsi0": "local-lvm:base-9000-disk-0,size=8G"})).unwrap();
    view.clone_source = Some(
        crate::pipeline::template::matching_templates(&listing(), wanted).map(|vms| CloneSource {
            wanted: wanted.to_string(),
            mode: data.clone_mode,
            templates: vms
                .into_iter()
                .map(|vm| crate::model::TemplateFacts::from_config(vm, &config, &cluster))
                .collect(),
            offline: Vec::new(),
        }),
    );
    view
}

/// A config with these `defaults:` and `nodes:`.
fn config_with(defaults: Value, nodes: Value) -> ProviderConfig {
    let mut config = ProviderConfig::parse(
        "proxmox:\n  url: https://pve:8006\n  tokenID: a@pve!t\n  tokenSecret: s\n",
    )
    .unwrap();
    config.defaults = defaults.as_object().unwrap().clone();
    config.nodes = nodes.as_object().unwrap().clone();
    config.layers = ConfigLayers::read(&config.defaults, &config.nodes, false);
    config
}

fn run(class: &str, defaults: Value, nodes: Value) -> Report {
    let config = config_with(defaults, nodes);
    let layers = Layers::new(class, &config);
    let (mut findings, data) = check_schema(&layers);
    if let Some(data) = data {
        findings.extend(check_cluster(&layers, &data, &view_for(&data)));
    }
    Report::new(findings)
}

fn problem<'a>(r: &'a Report, key: &str, node: Option<&str>) -> Option<&'a Finding> {
    r.findings
        .iter()
        .find(|f| f.outcome == Outcome::Problem && f.key == key && f.node.as_deref() == node)
}

const BASE: &str =
    "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: name == \"local-lvm\"\nnode: pve1\n";

#[test]
fn unknown_keys_are_warnings_with_a_suggestion_and_the_class_still_passes() {
    let r = run(
        &format!("{BASE}disk_sise: 5\n"),
        json!({"coers": 2}),
        json!({"pve1": {"network_bridg": "vmbr1"}}),
    );
    assert!(r.ok, "{}", r.render_text());
    let warned: Vec<(&str, &str)> = r
        .findings
        .iter()
        .filter(|f| f.outcome == Outcome::Warning)
        .map(|f| (f.key.as_str(), f.message.as_str()))
        .collect();
    assert_eq!(warned.len(), 3, "{warned:?}");
    for (key, hint) in [
        ("defaults.coers", "`cores`"),
        ("nodes.pve1.network_bridg", "`network_bridge`"),
        ("disk_sise", "`disk_size`"),
    ] {
        assert!(
            warned
                .iter()
                .any(|(k, m)| *k == key && m.contains(&format!("did you mean {hint}?"))),
            "{key}: {warned:?}"
        );
    }
    assert!(r.render_text().contains("warn"), "{}", r.render_text());
    let config = ProviderConfig::parse(
        "proxmox:\n  url: https://pve:8006\n  tokenID: a@pve!t\n  tokenSecret: s\n  urll: x\n",
    )
    .unwrap();
    let found = &config.warnings;
    assert_eq!(found.len(), 1);
    assert!(found[0].contains("did you mean `url`?"), "{found:?}");
}

/// `class` checked against a cluster whose `GET /version` gave `version` (an error: unreadable).
fn on_release(class: &str, version: Result<&str, &str>) -> Report {
    let config = config_with(json!({}), json!({}));
    let layers = Layers::new(class, &config);
    let (_, data) = check_schema(&layers);
    let data = data.unwrap();
    assert!(needs_release_check(&data));
    let mut v = view();
    v.pve_version = Some(version.map(str::to_owned).map_err(str::to_owned));
    Report::new(check_cluster(&layers, &data, &v))
}

/// pve-ha-manager src/PVE/HA/Resources.pm: `failback` exists on HA resources only from 5.0.2
/// (PVE 9); PVE 8 answers 400, after the VM was already created and started. Refuse up front.
#[test]
fn ha_failback_is_a_problem_on_a_pve_8_cluster() {
    let class = format!("{BASE}ha:\n  state: started\n  failback: true\n");
    let r = on_release(&class, Ok("8.4.1"));
    let f = problem(&r, "ha.failback", None).expect("a problem");
    assert!(
        f.message.contains("8.4.1") && f.message.contains("Proxmox VE 9"),
        "{f}"
    );
    assert!(problem(&on_release(&class, Ok("9.0.10")), "ha.failback", None).is_none());
    let r = on_release(&class, Err("timeout"));
    assert!(
        r.findings
            .iter()
            .any(|f| f.key == "ha.failback" && f.outcome == Outcome::Skipped)
    );
}

/// HA rules: pve-ha-manager src/PVE/API2/HA/Rules.pm has no counterpart on PVE 8 (the path answers
/// 501), and `assert_valid_nodes_param` refuses a rule naming a node that does not exist.
#[test]
fn ha_rules_need_pve_9_and_existing_nodes() {
    let class = format!("{BASE}ha:\n  spread: true\n  node_affinity_nodes: [pve1, pve9]\n");
    let r = on_release(&class, Ok("8.4.1"));
    let f = problem(&r, "ha", None).expect("a problem");
    assert!(
        f.message
            .contains("node_affinity_nodes, resource_affinity/spread")
            && f.message
                .contains("Proxmox VE 9 or later; this cluster runs 8.4.1"),
        "{f}"
    );
    let r = on_release(&class, Ok("9.1.1"));
    assert!(problem(&r, "ha", None).is_none(), "{}", r.render_text());
    let f = problem(&r, "ha.node_affinity_nodes[1]", None).expect("a problem");
    assert!(f.message.contains("node \"pve9\" does not exist"), "{f}");
    assert!(problem(&r, "ha.node_affinity_nodes[0]", None).is_none());
}

#[test]
fn strict_mode_fails_unknown_keys() {
    let class = format!("{BASE}disk_sise: 5\n");
    let mut config = config_with(json!({}), json!({}));
    config.layers.strict = true;
    let layers = Layers::new(&class, &config);
    let (findings, data) = check_schema(&layers);
    assert!(data.is_none());
    let r = Report::new(findings);
    assert!(
        problem(&r, "disk_sise", None).is_some(),
        "{}",
        r.render_text()
    );
}

#[test]
fn a_good_pinned_class_passes() {
    let r = run(BASE, json!({}), json!({}));
    assert!(r.ok, "{}", r.render_text());
    assert_eq!(r.warnings, 0);
    assert!(r.render_text().contains("OK: no problems found"));
}

#[test]
fn storage_reasons_are_given_per_storage() {
    let r = run(
        &BASE
            .replace("node: pve1\n", "node: pve2\n")
            .replace("disk_size: 5", "disk_size: 50"),
        json!({}),
        json!({}),
    );
    let f = problem(&r, "storage_selector", Some("pve2")).expect("too small on pve2");
    assert!(
        f.message
            .contains("local-lvm: selected, but only 10 GiB free of 50 GiB needed"),
        "{f}"
    );
    // No ISO storage on pve2 for boot mode iso.
    let f = problem(&r, "iso_storage_selector", Some("pve2")).expect("no ISO storage");
    assert!(
        f.message
            .starts_with("there is no active storage for ISO images on pve2"),
        "{f}"
    );
}

#[test]
fn spread_checks_every_online_candidate_and_warns_for_offline_ones() {
    let class = BASE.replace("node: pve1\n", "");
    let r = run(&class, json!({}), json!({}));
    assert!(problem(&r, "iso_storage_selector", Some("pve2")).is_some());
    assert!(r.findings.iter().any(|f| f.outcome == Outcome::Warning
        && f.node.as_deref() == Some("pve3")
        && f.message.contains("offline")));
    // Limited to pve1: fine.
    let r = run(
        &format!("{class}allowed_nodes: [pve1]\n"),
        json!({}),
        json!({}),
    );
    assert!(r.ok, "{}", r.render_text());
}

#[test]
fn memory_must_fit_somewhere_and_a_tight_node_is_a_warning() {
    let class = BASE.replace(
        "node: pve1\n",
        "allowed_nodes: [pve1, pve2]\niso_storage_selector: \"true\"\n",
    );
    let r = run(
        &class.replace("memory: 2048", "memory: 4096"),
        json!({}),
        json!({}),
    );
    assert!(problem(&r, "memory", None).is_none(), "{}", r.render_text());
    assert!(r.findings.iter().any(|f| f.outcome == Outcome::Warning
        && f.key == "memory"
        && f.node.as_deref() == Some("pve2")));
    let r = run(
        &class.replace("memory: 2048", "memory: 16384"),
        json!({}),
        json!({}),
    );
    let f = problem(&r, "memory", None).expect("fits nowhere");
    assert!(f.message.contains("pve1 6144 MiB, pve2 1024 MiB"), "{f}");
}

#[test]
fn keys_name_the_layer_the_value_came_from() {
    let class = "cores: 1\nmemory: 2048\ndisk_size: 5\nnode: pve1\n";
    let r = run(
        class,
        json!({"storage_selector": "name == \"local-lvm\""}),
        json!({"pve1": {"network_bridge": "vmbr9"}, "pve7": {"cores": 2}}),
    );
    assert!(
        problem(&r, "nodes.pve1.network_bridge", Some("pve1")).is_some(),
        "{}",
        r.render_text()
    );
    assert!(
        r.findings
            .iter()
            .any(|f| f.key == "defaults.storage_selector" && f.outcome == Outcome::Pass)
    );
    assert!(
        r.findings
            .iter()
            .any(|f| f.key == "nodes.pve7" && f.outcome == Outcome::Warning)
    );
}

#[test]
fn unknown_bridges_and_mappings_are_not_guessed() {
    let mut v = view();
    v.bridges
        .insert("pve1".into(), Err("permission denied".into()));
    v.pci_mappings = Some(Err("501 not implemented".into()));
    let config = config_with(json!({}), json!({}));
    let class = format!("{BASE}pci_devices:\n  - mapping: gpu\n");
    let layers = Layers::new(&class, &config);
    let (_, data) = check_schema(&layers);
    let findings = check_cluster(&layers, &data.unwrap(), &v);
    let r = Report::new(findings);
    assert!(r.ok, "{}", r.render_text());
    assert!(
        r.findings
            .iter()
            .any(|f| f.outcome == Outcome::Warning && f.message.contains("permission denied"))
    );
    assert!(
        r.findings
            .iter()
            .any(|f| f.outcome == Outcome::Skipped && f.key == "pci_devices[0].mapping")
    );
}

#[test]
fn defaults_are_judged_only_on_what_they_set() {
    let check = |defaults: Value| {
        let mut config = ProviderConfig::parse(
            "proxmox:\n  url: https://pve:8006\n  tokenID: a@pve!t\n  tokenSecret: s\n",
        )
        .unwrap();
        config.defaults = defaults.as_object().unwrap().clone();
        config.layers = ConfigLayers::read(&config.defaults, &config.nodes, false);
        let layers = Layers {
            stand_ins: true,
            ..Layers::new("{}", &config)
        };
        // What `gather` reads for the data `defaults:` resolve to (a template's copies).
        let data = layers.resolve_on(None).unwrap();
        check_cluster(&layers, &data, &view_for(&data))
            .into_iter()
            .filter(|f| f.outcome == Outcome::Problem)
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
    };
    // Nothing set that could be wrong: no ISO, bridge, memory or storage findings.
    assert_eq!(check(json!({"cores": 4})), Vec::<String>::new());
    let problems = check(json!({"storage_selector": "name == \"ceph\""}));
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].starts_with("defaults.storage_selector (on pve1)"),
        "{problems:?}"
    );
    let problems = check(json!({"boot": "clone", "template": 4242}));
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("defaults.template: template 4242 not found")),
        "{problems:?}"
    );
}

#[test]
fn health_text_is_short() {
    let many = (0..40).map(|i| {
        let key = format!("additional_disks[{i}].storage_selector");
        Outcome::Problem.finding(key, "x".repeat(60)).on("pve1")
    });
    let text = summarize(&many.collect::<Vec<_>>()).unwrap();
    assert!(text.len() < HEALTH_TEXT_MAX + 60, "{}", text.len());
    assert!(text.contains("more (run `validate`)"), "{text}");
}

/// `validate` and the pipeline's placement must agree: the nodes validate says placement would skip
/// are exactly the nodes `rules::placement::pick` leaves out (besides those outside `allowed_nodes`),
/// and the storage validate names on the chosen node is the one placement picks.
#[test]
fn validate_and_placement_give_the_same_verdict() {
    use std::collections::BTreeSet;

    use crate::model::ClusterSnapshot;
    use crate::rules::placement::{self, LeftOut, PlacementError, PlacementReason, Reservations};

    // As `view()`, but pve2 has 4 GiB free.
    let mut view = view();
    view.cluster = ClusterSnapshot::from_resources(&serde_json::from_value::<Vec<crate::proxmox::types::ClusterResource>>(json!([
        {"type":"node","node":"pve1","status":"online","mem":2147483648u64,"maxmem":8589934592u64},
        {"type":"node","node":"pve2","status":"online","mem":4294967296u64,"maxmem":8589934592u64},
        {"type":"node","node":"pve3","status":"offline"},
        {"type":"storage","storage":"local","node":"pve1","content":"iso,backup","status":"available","disk":0,"maxdisk":107374182400u64,"plugintype":"dir"},
        {"type":"storage","storage":"local-lvm","node":"pve1","content":"images,rootdir","status":"available","disk":0,"maxdisk":107374182400u64,"plugintype":"lvmthin"},
        {"type":"storage","storage":"local-lvm","node":"pve2","content":"images,rootdir","status":"available","disk":0,"maxdisk":10737418240u64,"plugintype":"lvmthin"}
    ]))
    .unwrap());
    let base =
        "cores: 1\nstorage_selector: name == \"local-lvm\"\niso_storage_selector: \"true\"\n";
    let classes = [
        // pve2 is short of memory, pve3 offline: pve1.
        format!("{base}memory: 6000\ndisk_size: 5\n"),
        // pve2's local-lvm is too small: pve1.
        format!("{base}memory: 2048\ndisk_size: 50\n"),
        // Only pve2 allowed, and it fits.
        format!("{base}memory: 2048\ndisk_size: 5\nallowed_nodes: [pve2]\n"),
        // Only pve2 allowed, and its disk is too small: nothing fits.
        format!("{base}memory: 2048\ndisk_size: 50\nallowed_nodes: [pve2]\n"),
        // pve2 short of memory and disk, pve3 allowed but offline: pve1.
        format!("{base}memory: 5000\ndisk_size: 20\nallowed_nodes: [pve1, pve2, pve3]\n"),
    ];
    let cluster = view.cluster.clone();
    let config = config_with(json!({}), json!({}));
    for class in &classes {
        let layers = Layers::new(class, &config);
        let data = ConfigLayers::default().resolve(class, None).unwrap();
        let report = Report::new(check_cluster(&layers, &data, &view));
        let request = super::cluster::class_request(&data, Default::default(), None);
        let placed = placement::pick(&cluster, &request, &Reservations::default());
        let rejected = match &placed {
            Ok(p) => match &p.reason {
                PlacementReason::Automatic { rejected, .. } => rejected.clone(),
                PlacementReason::Pinned => Vec::new(),
            },
            Err(PlacementError::NothingFits { rejected }) => rejected.clone(),
            Err(e) => panic!("{class}: {e}"),
        };
        let left_out: BTreeSet<String> = rejected
            .into_iter()
            .filter(|(_, why)| *why != LeftOut::NotAllowed)
            .map(|(node, _)| node)
            .collect();
        let skipped: BTreeSet<String> = report
            .findings
            .iter()
            .filter(|f| {
                (f.outcome == Outcome::Warning
                    && (f.key == "memory" || f.message.contains("offline")))
                    || f.message.contains("placement would skip")
            })
            .filter_map(|f| f.node.clone())
            .collect();
        assert_eq!(skipped, left_out, "{class}\n{}", report.render_text());
        assert!(!left_out.is_empty() || placed.is_ok(), "{class}");
        if let Ok(p) = placed {
            let chosen = report
                .findings
                .iter()
                .find(|f| f.key == "storage_selector" && f.node.as_deref() == Some(p.node.as_str()))
                .expect("a storage finding on the chosen node");
            assert_eq!(chosen.outcome, Outcome::Pass, "{class}");
            assert!(
                chosen
                    .message
                    .starts_with(&format!("VM disks go to {} ", p.storage)),
                "{class}: {chosen}"
            );
        }
    }
}

/// A NIC on an IP pool that names a bridge goes on that bridge (`rules::ip_pool::apply_networks`,
/// which provisioning resolves the data with): the bridge check looks at it and names the pool's key.
#[test]
fn a_pools_bridge_is_the_one_checked() {
    let config = ProviderConfig::parse(
        "proxmox:\n  url: https://pve:8006\n  tokenID: a@pve!t\n  tokenSecret: s\nipPools:\n  storage-net:\n    cidr: 10.9.0.0/24\n    range: 10.9.0.10-10.9.0.20\n    bridge: vmbr1\n",
    )
    .unwrap();
    let report = |node: &str| {
        let class = format!(
            "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: name == \"local-lvm\"\nnode: {node}\nip_pool: storage-net\n"
        );
        let layers = Layers::new(&class, &config);
        let (mut findings, data) = check_schema(&layers);
        findings.extend(check_cluster(&layers, &data.unwrap(), &view()));
        Report::new(findings)
    };
    // pve2 has only vmbr0: the VM would go on the pool's vmbr1, which is not there.
    let r = report("pve2");
    let found = problem(&r, "ipPools.storage-net.bridge", Some("pve2"));
    assert!(
        found.is_some_and(|f| f.message.contains("\"vmbr1\" does not exist on pve2")),
        "{}",
        r.render_text()
    );
    assert!(problem(&r, "network_bridge", Some("pve2")).is_none());
    // pve1 has it.
    let r = report("pve1");
    assert!(r.ok, "{}", r.render_text());
}

/// `class` checked against `view()` whose HA rules are `rules`.
fn with_ha_rules(class: &str, rules: serde_json::Value) -> Report {
    let config = config_with(json!({}), json!({}));
    let layers = Layers::new(class, &config);
    let (_, data) = check_schema(&layers);
    let data = data.unwrap();
    let mut v = view();
    v.ha_rules = Some(Ok(serde_json::from_value(rules).unwrap()));
    Report::new(check_cluster(&layers, &data, &v))
}

/// pve-ha-manager src/PVE/HA/Rules/NodeAffinity.pm `check_single_resource_reference`: a class with
/// `node_affinity_nodes` that also names a node-affinity rule in `ha.rules` puts every VM in two
/// node-affinity rules, which Proxmox refuses; the shipped classes are valid on 3 to 8 nodes.
#[test]
fn validate_refuses_ha_rule_shapes_proxmox_calls_infeasible() {
    let rules = json!([{"rule": "db-nodes", "type": "node-affinity", "resources": "vm:100",
        "nodes": "pve2", "digest": "d"}]);
    let class =
        format!("{BASE}ha:\n  node_affinity_nodes: [pve1]\n  spread: true\n  rules: [db-nodes]\n");
    let r = with_ha_rules(&class, rules.clone());
    let f = problem(&r, "ha", None).expect("a problem");
    assert!(
        f.message.contains("ha.node_affinity_nodes") && f.message.contains("ha.rules[0]: db-nodes"),
        "{f}"
    );
    for example in [
        "control-plane-ha.yaml",
        "spread-set.yaml",
        "clone-from-template.yaml",
    ] {
        let path = format!(
            "{}/examples/machine-classes/{example}",
            env!("CARGO_MANIFEST_DIR")
        );
        let class = std::fs::read_to_string(path).unwrap();
        let r = with_ha_rules(&class, rules.clone());
        assert!(
            problem(&r, "ha", None).is_none(),
            "{example}: {}",
            r.render_text()
        );
    }
}

/// pve-manager PVE/API2/Cluster.pm `get_status` gives quorum and membership; without quorum
/// pve-cluster src/PVE/Cluster.pm `check_cfs_quorum` refuses every change, so validate says the
/// class cannot be provisioned now, naming the members online.
#[test]
fn validate_shows_quorum_and_refuses_a_cluster_without_it() {
    use crate::proxmox::cluster::ClusterHealth;
    let config = config_with(json!({}), json!({}));
    let layers = Layers::new(BASE, &config);
    let (_, data) = check_schema(&layers);
    let data = data.unwrap();
    use crate::proxmox::cluster::ClusterMember;
    let health = |quorate: bool| ClusterHealth {
        name: Some("prod".into()),
        quorate: Some(quorate),
        members: vec![
            ClusterMember {
                name: "pve1".into(),
                online: true,
            },
            ClusterMember {
                name: "pve2".into(),
                online: false,
            },
        ],
    };
    let mut v = view();
    v.health = Some(Ok(health(false)));
    let r = Report::new(check_cluster(&layers, &data, &v));
    let f = problem(&r, "cluster.quorum", None).expect("a problem");
    assert!(
        f.message
            .contains("NO QUORUM, 1 of 2 members online (pve1)"),
        "{f}"
    );
    v.health = Some(Ok(health(true)));
    let r = Report::new(check_cluster(&layers, &data, &v));
    assert!(problem(&r, "cluster.quorum", None).is_none());
}

/// Boot mode `clone` with a template whose `scsi1` holds a data disk: the class's first additional
/// disk would go there and never be made (the clone keeps the template's drive), so validate names
/// the entry.
#[test]
fn validate_refuses_an_additional_disk_on_a_slot_the_template_fills() {
    let class = "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: name == \"local-lvm\"\nnode: pve1\nboot: clone\ntemplate: 9000\nadditional_disks: [{disk_size: 4, storage_selector: 'true'}]\n";
    let config = config_with(json!({}), json!({}));
    let layers = Layers::new(class, &config);
    let (_, data) = check_schema(&layers);
    let data = data.unwrap();
    let mut v = view_for(&data);
    let cluster = v.cluster.clone();
    let config: crate::proxmox::types::VmConfig = serde_json::from_value(json!({
        "scsi0": "local-lvm:base-9000-disk-0,size=8G",
        "scsi1": "local-lvm:base-9000-disk-1,size=2G"
    }))
    .unwrap();
    if let Some(Ok(source)) = v.clone_source.as_mut() {
        let vm = crate::pipeline::template::matching_templates(
            &listing(),
            data.template.as_ref().unwrap(),
        )
        .unwrap()[0]
            .clone();
        source.templates = vec![crate::model::TemplateFacts::from_config(
            &vm, &config, &cluster,
        )];
    }
    let r = Report::new(check_cluster(&layers, &data, &v));
    let f = problem(&r, "additional_disks[0]", None).expect("a problem");
    assert!(
        f.message.contains("goes to scsi1, which template 9000"),
        "{f}"
    );
}

#[test]
fn only_system_reads_are_expected_on_the_root() {
    // `GET /access/permissions`: privileges by path, each with its propagate flag.
    let on_root = |held: &[&str]| {
        let held: serde_json::Map<String, Value> =
            held.iter().map(|p| (p.to_string(), json!(1))).collect();
        let privileges = serde_json::from_value(json!({ "/": held, "/vms": {"VM.Audit": 1} }));
        gather::root_warning(&privileges.unwrap())
    };
    assert_eq!(on_root(&["Sys.Audit", "Sys.Console"]), None);
    assert_eq!(on_root(&[]), None);
    let warning = on_root(&["VM.Allocate", "Sys.Audit", "Datastore.Allocate"]).unwrap();
    assert!(
        warning.contains("Datastore.Allocate, VM.Allocate on `/`"),
        "{warning}"
    );
}

/// The IP pool checks ([`super::check_pools`]).
mod pools {
    use super::*;
    use crate::rules::provider_data::ConfigLayers;

    fn data(yaml: &str) -> ProviderData {
        ConfigLayers::default()
            .resolve(
                &format!("cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\n{yaml}"),
                None,
            )
            .unwrap()
    }

    fn pools() -> Vec<IpPool> {
        crate::config::ProviderConfig::parse(
            "proxmox:\n  url: https://pve:8006\n  tokenID: a@pve!b\n  tokenSecret: c\nipPools:\n  two:\n    cidr: 10.0.0.0/24\n    range: 10.0.0.10-10.0.0.11\n",
        )
        .unwrap()
        .ip_pools
    }

    #[test]
    fn a_pool_must_exist_and_have_room() {
        let d = data("ip_pool: two\nadditional_nics:\n  - bridge: vmbr1\n    ip_pool: tow\n");
        let none = BTreeSet::new();
        let f = check_pools(&d, &pools(), &none);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].outcome, Outcome::Pass);
        assert!(
            f[0].message.contains("2 of 2 free, next 10.0.0.10"),
            "{}",
            f[0].message
        );
        assert_eq!(f[1].outcome, Outcome::Problem);
        assert_eq!(f[1].key, "additional_nics[0].ip_pool");
        assert!(
            f[1].message.contains("did you mean `two`"),
            "{}",
            f[1].message
        );

        let full: BTreeSet<IpAddr> = ["10.0.0.10", "10.0.0.11"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let f = check_pools(&data("ip_pool: two\n"), &pools(), &full);
        assert_eq!(f[0].outcome, Outcome::Problem);
        assert!(
            f[0].message
                .contains("pool two has no free address: 2 of 2 in use"),
            "{}",
            f[0].message
        );
        assert!(check_pools(&data(""), &pools(), &full).is_empty());
    }
}

//! HA rules end to end: machine classes written for the official provider (`ha.rules`,
//! `node_affinity_nodes`, `node_affinity_strict`, `resource_affinity`) and `ha: {spread: true}`,
//! against fakepve's HA rules, which keep pve-ha-manager's checks (src/PVE/API2/HA/Rules.pm and
//! src/PVE/HA/Rules/ResourceAffinity.pm): resources must be HA-managed, a resource-affinity rule needs
//! two of them and a negative one at most one per node, every change carries the rules' digest, and
//! deleting an HA resource takes it out of every rule (`purge`, by default, src/PVE/HA/Config.pm
//! `delete_service_from_config`).

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use std::time::Duration;

use omni_infra_provider_proxmox::omni::resources::{MACHINE_REQUEST, MACHINE_REQUEST_STATUS};
use omni_infra_provider_proxmox::pipeline::ledgers::HA_RULES_LOCK;
use serde_json::{Value, json};
use testkit::fakepve::three_node_scenario;
use testkit::harness::Harness;

const BASE: &str = "cores: 1\nmemory: 2048\ndisk_size: 10\nstorage_selector: name == \"local-lvm\"\nip_discovery_timeout: 0\n";

fn class(ha: &str) -> String {
    format!("{BASE}ha:\n{ha}")
}

fn rules(h: &mut Harness) -> serde_json::Map<String, Value> {
    h.pve
        .control(json!({"op": "ha_rules"}))
        .as_object()
        .cloned()
        .unwrap()
}

fn sid_of(h: &mut Harness, id: &str) -> String {
    let vms = h.vms_named(id);
    assert_eq!(vms.len(), 1, "{id}: {vms:?}");
    format!("vm:{}", vms[0]["vmid"])
}

fn node_of(h: &mut Harness, id: &str) -> String {
    h.vms_named(id)[0]["node"].as_str().unwrap().to_owned()
}

fn members(rule: &Value) -> Vec<String> {
    rule["resources"]
        .as_str()
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

async fn remove(h: &mut Harness, id: &str) {
    assert!(h.omni.state.teardown(&MACHINE_REQUEST, id));
    h.wait_released(id).await;
    assert!(h.vms_named(id).is_empty(), "{id} left a VM");
}

/// `spread: true` on a set of three, provisioned at once: one negative resource-affinity rule named
/// as the official provider names it, never two, holding every VM, the VMs on three different nodes
/// (placement follows the rule, whatever the strategy); removing VMs shrinks it and the rule goes
/// when fewer than two would be left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_keeps_one_negative_rule_in_step_with_the_set() {
    let mut h = Harness::start("").await;
    let data = class("  spread: true\n") + "placement_strategy: binpack\n";
    // Someone else makes a rule between our read and our create: Proxmox refuses ours
    // (pve-ha-manager Rules.pm `create_rule`: "already defined"), and the provider reads the rules
    // again instead of failing or writing twice.
    h.pve.control(
        json!({"op": "fail", "method": "POST", "suffix": "/cluster/ha/rules", "status": 500,
        "message": "create ha rule failed: HA rule 'omni-cp-raff' already defined", "times": 1}),
    );
    let ids: Vec<String> = (0..3).map(|i| format!("cp-{i}")).collect();
    for id in &ids {
        h.request(id, "cp", &data);
    }
    for id in &ids {
        h.wait_stage(id, Stage::Provisioned).await;
    }
    let mut nodes: Vec<String> = ids.iter().map(|id| node_of(&mut h, id)).collect();
    nodes.sort();
    assert_eq!(
        nodes,
        ["pve1", "pve2", "pve3"],
        "binpack alone would stack them"
    );

    let calls = h.pve.control(json!({"op": "requests"}));
    let count = |m: &str, p: &str| {
        calls
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c[0] == m && c[1].as_str().unwrap().ends_with(p))
            .count()
    };
    assert_eq!(
        count("POST", "/cluster/ha/rules"),
        2,
        "one refused create, one that worked"
    );
    let all = rules(&mut h);
    assert_eq!(all.len(), 1, "{all:?}");
    let rule = &all["omni-cp-raff"];
    assert_eq!(rule["type"], "resource-affinity");
    assert_eq!(rule["affinity"], "negative");
    assert!(rule.get("errors").is_none(), "{rule:?}");
    for id in &ids {
        // The official provider's field 13: its teardown leaves HA only when it is set.
        assert!(h.machine_state(id).spec.ha_registered, "{id}");
    }
    let mut sids: Vec<String> = ids.iter().map(|id| sid_of(&mut h, id)).collect();
    sids.sort();
    assert_eq!(members(rule), sids);

    // `cluster` shows the set's rule as Proxmox holds it.
    let config = h.pve.config_file("");
    let (ok, out) = testkit::cli(&["cluster", "--output", "json"], &config, "");
    assert!(ok, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["ha_rules"][0]["rule"], "omni-cp-raff");
    assert_eq!(report["ha_rules"][0]["resources"], json!(sids));
    let (ok, table) = testkit::cli(&["cluster"], &config, "");
    assert!(ok && table.contains("omni-cp-raff"), "{table}");

    let first = sid_of(&mut h, "cp-0");
    remove(&mut h, "cp-0").await;
    let rule = rules(&mut h)["omni-cp-raff"].clone();
    assert_eq!(members(&rule).len(), 2, "{rule:?}");
    assert!(!members(&rule).contains(&first), "{rule:?}");

    // One VM would be left: Proxmox would keep an ineffective rule, the provider deletes it.
    remove(&mut h, "cp-1").await;
    assert!(rules(&mut h).is_empty(), "{:?}", rules(&mut h));
    remove(&mut h, "cp-2").await;
    assert!(rules(&mut h).is_empty());
    let left = h.pve.control(json!({"op": "ha_resources"}));
    assert_eq!(left, json!([]), "HA resources left behind");
    h.stop_controller().await;
}

/// The official provider's node-affinity keys: the rule is made with the first VM, joined by the
/// rest, strict placement keeps every VM on the listed nodes, and the rule goes with the last VM.
/// A rule named in `ha.rules` is joined; one that does not exist fails readably and heals when an
/// operator creates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_affinity_and_named_rules_as_the_official_provider_writes_them() {
    let mut h = Harness::start("").await;
    let data = class(
        "  node_affinity_nodes: [pve2, pve3]\n  node_affinity_strict: true\n  rules: [db-apart]\n",
    );
    h.request("db-0", "db", &data);
    let status = h.wait_stage("db-0", Stage::Failed).await;
    assert!(
        status
            .spec
            .error
            .contains("HA rule \"db-apart\" named in ha.rules does not exist"),
        "{}",
        status.spec.error
    );
    // The operator creates the rule (around someone else's HA-managed VM): it heals.
    h.pve.control(json!({"op": "ha_manage", "vmid": 100}));
    h.pve
        .control(json!({"op": "ha_add_rule", "rule": "db-apart",
        "type": "resource-affinity", "affinity": "negative", "resources": ["vm:100"]}));
    h.wait_stage("db-0", Stage::Provisioned).await;
    // The rules change between our read and our join: the digest no longer matches (pve-common
    // Tools.pm `assert_if_modified`), and the join is planned again from a fresh read.
    h.pve.control(json!({"op": "fail", "method": "PUT", "suffix": "/cluster/ha/rules/omni-db-naff",
        "status": 500, "message": "update HA rules failed: detected modified configuration - file changed by other user? Try again.",
        "times": 1}));
    h.request("db-1", "db", &data);
    h.wait_stage("db-1", Stage::Provisioned).await;
    let calls = h.pve.control(json!({"op": "requests"}));
    let puts = calls
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            c[0] == "PUT"
                && c[1]
                    .as_str()
                    .unwrap()
                    .ends_with("/cluster/ha/rules/omni-db-naff")
        })
        .count();
    assert_eq!(puts, 2, "one refused join, one that worked");

    let all = rules(&mut h);
    let naff = &all["omni-db-naff"];
    assert_eq!(naff["type"], "node-affinity");
    assert_eq!(naff["nodes"], "pve2,pve3");
    assert_eq!(naff["strict"], 1);
    let (s0, s1) = (sid_of(&mut h, "db-0"), sid_of(&mut h, "db-1"));
    let mut both = vec![s0.clone(), s1.clone()];
    both.sort();
    assert_eq!(members(naff), both);
    for id in ["db-0", "db-1"] {
        assert_ne!(
            node_of(&mut h, id),
            "pve1",
            "{id} placed outside the strict rule's nodes"
        );
    }
    assert!(members(&all["db-apart"]).contains(&s0));
    assert!(members(&all["db-apart"]).contains(&s1));

    remove(&mut h, "db-0").await;
    remove(&mut h, "db-1").await;
    let all = rules(&mut h);
    assert!(!all.contains_key("omni-db-naff"), "{all:?}");
    // Someone else's rule keeps its own resource; ours left it.
    assert_eq!(members(&all["db-apart"]), ["vm:100"]);
    h.stop_controller().await;
}

/// More VMs than nodes: a negative rule may hold one VM per node (pve-ha-manager
/// ResourceAffinity.pm `check_negative_resource_affinity_resources_count`), so five VMs of a spread
/// set on three nodes all provision, the rule holds three of them and is never refused or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_rule_holds_one_vm_per_node_and_the_rest_still_provision() {
    let mut h = Harness::start("").await;
    let data = class("  spread: true\n");
    let ids: Vec<String> = (0..5).map(|i| format!("big-{i}")).collect();
    for id in &ids {
        h.request(id, "big", &data);
    }
    for id in &ids {
        h.wait_stage(id, Stage::Provisioned).await;
    }
    let all = rules(&mut h);
    assert_eq!(all.len(), 1, "{all:?}");
    let rule = &all["omni-big-raff"];
    assert_eq!(members(rule).len(), 3, "{rule:?}");
    assert!(rule.get("errors").is_none(), "{rule:?}");
    for id in &ids {
        remove(&mut h, id).await;
    }
    assert!(rules(&mut h).is_empty());
    h.stop_controller().await;
}

/// Proxmox VE 8 has no HA rules: a class using them is refused before anything is created, and
/// says why; `failback`-free HA registration alone still works there, and so does its teardown,
/// whose HA resource delete carries no `purge` (pve-ha-manager src/PVE/API2/HA/Resources.pm,
/// `delete`: the parameter came with 5.0.7, defaults to 1, and PVE 8's schema refuses it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_on_pve8_are_refused_before_anything_is_created() {
    let mut scenario = three_node_scenario();
    scenario["pve_version"] = json!("8.4.1");
    let mut h = Harness::start_with(scenario, "").await;
    h.request("old-0", "old", &class("  spread: true\n"));
    let status = h.wait_stage("old-0", Stage::Failed).await;
    assert!(
        status
            .spec
            .error
            .contains("need Proxmox VE 9 or later; this cluster runs 8.4.1"),
        "{}",
        status.spec.error
    );
    assert!(h.vms_named("old-0").is_empty());
    h.request("old-1", "old", &class("  state: started\n"));
    h.wait_stage("old-1", Stage::Provisioned).await;
    let sid = sid_of(&mut h, "old-1");
    assert_eq!(h.pve.control(json!({"op": "ha_resources"})), json!([sid]));
    remove(&mut h, "old-1").await;
    assert_eq!(h.pve.control(json!({"op": "ha_resources"})), json!([]));
    h.stop_controller().await;
}

/// A machine of the set joins its resource-affinity rule while another one is torn down: the teardown
/// read the cluster before the join, so the joiner is not in its listing and looked like a deleted VM,
/// and the rule (two live members after the join) was deleted as if one were left. Teardowns now take
/// the lock joins run under, and read the cluster again before deleting a rule with members it did not
/// see. pve-ha-manager src/PVE/API2/HA/Rules.pm: every rule change is checked against the rules' one
/// digest, but a delete (`delete_rule`) is not refused for members added since the caller's read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_a_machine_joins_during_a_teardown_is_kept() {
    let mut h = Harness::start("").await;
    let data = class("  spread: true\n");
    for id in ["join-0", "join-1"] {
        h.request(id, "join", &data);
        h.wait_stage(id, Stage::Provisioned).await;
    }
    let (sid0, sid1) = (sid_of(&mut h, "join-0"), sid_of(&mut h, "join-1"));
    assert_eq!(members(&rules(&mut h)["omni-join-raff"]).len(), 2);

    // Joins hold this lock; here the test holds it while "joining" a third machine by hand.
    let lock = h
        .services
        .as_ref()
        .unwrap()
        .ledgers
        .locks
        .exclusive(HA_RULES_LOCK);
    let held = lock.lock().await;
    assert!(h.omni.state.teardown(&MACHINE_REQUEST, "join-0"));
    let waiting = h
        .omni
        .state
        .wait_for(Duration::from_secs(30), |s| {
            s.get(&MACHINE_REQUEST_STATUS, "join-0")
                .is_some_and(|st| st.spec.status.contains("out of Proxmox HA"))
        })
        .await;
    assert!(waiting, "the teardown reached the HA rules");
    h.pve.control(
        json!({"op": "add_vm", "vmid": 190, "name": "join-2", "node": "pve3",
        "status": "running", "config": {"tags": "machine-request.join"}}),
    );
    h.pve.control(json!({"op": "ha_manage", "vmid": 190}));
    h.pve.control(
        json!({"op": "ha_add_rule", "rule": "omni-join-raff", "type": "resource-affinity",
        "affinity": "negative", "resources": [sid0, sid1.clone(), "vm:190"]}),
    );
    drop(held);
    h.wait_released("join-0").await;
    let rules = rules(&mut h);
    let mut kept = members(&rules["omni-join-raff"]);
    kept.sort();
    assert_eq!(kept, vec![sid1, "vm:190".to_string()], "{rules:?}");
    h.stop_controller().await;
}

/// PVE 9 refuses every HA rule write while HA groups are left from PVE 8 (pve-ha-manager
/// src/PVE/API2/HA/Rules.pm `create_rule`: "ha groups have not been migrated yet"); the HA manager
/// migrates them only once every node runs PVE 9 and its LRM is active (src/PVE/HA/Manager.pm
/// `try_persistent_group_migration`). The status says so and what to do, and the machine
/// joins its rule once the groups are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_groups_not_yet_migrated_are_named_with_what_to_do() {
    let mut h = Harness::start("").await;
    h.pve
        .control(json!({"op": "ha_groups", "names": ["old-group"]}));
    h.request(
        "grp-0",
        "grp",
        &class("  node_affinity_nodes: [pve2, pve3]\n"),
    );
    let status = h.wait_stage("grp-0", Stage::Failed).await;
    for says in [
        "still has HA groups",
        "every node runs Proxmox VE 9",
        "Datacenter > HA > Groups",
    ] {
        assert!(
            status.spec.error.contains(says),
            "{says}: {}",
            status.spec.error
        );
    }
    h.pve.control(json!({"op": "ha_groups", "names": []}));
    h.stop_controller().await;
    h.start_controller();
    h.wait_stage("grp-0", Stage::Provisioned).await;
    let sid = sid_of(&mut h, "grp-0");
    assert_eq!(members(&rules(&mut h)["omni-grp-naff"]), vec![sid]);
    h.stop_controller().await;
}

/// A spread set kept on two of three nodes (`node_affinity_nodes`): pve-ha-manager
/// src/PVE/HA/Rules.pm `check_negative_resource_affinity_node_affinity_consistency` refuses a
/// negative rule with more members than the node-affinity rule has nodes, so a third VM could never
/// join its rules. Placement refuses it before anything is made, naming both keys; the first two
/// are kept apart on the two nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_beyond_the_node_affinity_nodes_is_refused_before_anything_is_created() {
    let mut h = Harness::start("").await;
    let data = class("  spread: true\n  node_affinity_nodes: [pve2, pve3]\n");
    for id in ["two-0", "two-1"] {
        h.request(id, "two", &data);
        h.wait_stage(id, Stage::Provisioned).await;
    }
    assert_eq!(members(&rules(&mut h)["omni-two-raff"]).len(), 2);
    h.request("two-2", "two", &data);
    let status = h.wait_stage("two-2", Stage::Failed).await;
    for says in [
        "ha.spread/ha.resource_affinity",
        "ha.node_affinity_nodes",
        "2 node(s) (pve2, pve3)",
    ] {
        assert!(
            status.spec.error.contains(says),
            "{says}: {}",
            status.spec.error
        );
    }
    assert!(h.vms_named("two-2").is_empty(), "nothing made");
    h.stop_controller().await;
}

/// pve-ha-manager before 5.0.7 (early PVE 9.0) deletes an HA resource without taking it out of the
/// rules (src/PVE/HA/Config.pm `delete_service_from_config` had no purge; `purge` came with
/// src/PVE/API2/HA/Resources.pm 5.0.7). The set's node-affinity rule keeps the torn-down VM's sid,
/// and the next join, writing the whole member list, is refused ("cannot use unmanaged
/// resource(s)", src/PVE/API2/HA/Rules.pm `assert_valid_resources_param`): the join writes the
/// rule again without the sids Proxmox named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_keeping_a_deleted_vm_without_purge_is_joined_without_it() {
    let mut scenario = three_node_scenario();
    scenario["ha_purge"] = json!(false);
    let mut h = Harness::start_with(scenario, "").await;
    let data = class("  node_affinity_nodes: [pve1, pve2, pve3]\n");
    for id in ["keep-0", "keep-1"] {
        h.request(id, "keep", &data);
        h.wait_stage(id, Stage::Provisioned).await;
    }
    let gone = sid_of(&mut h, "keep-0");
    remove(&mut h, "keep-0").await;
    assert!(
        members(&rules(&mut h)["omni-keep-naff"]).contains(&gone),
        "no purge: the sid stays"
    );
    h.request("keep-2", "keep", &data);
    h.wait_stage("keep-2", Stage::Provisioned).await;
    let mut want = vec![sid_of(&mut h, "keep-1"), sid_of(&mut h, "keep-2")];
    want.sort();
    let mut got = members(&rules(&mut h)["omni-keep-naff"]);
    got.sort();
    assert_eq!(got, want);
    h.stop_controller().await;
}

/// The same shape in a burst: three machines of the spread set kept on two nodes requested at once.
/// Placement counts the set's machines placed but not yet HA-managed, so one of the three is
/// refused before anything is made and the two others provision; none fails its join after the
/// start (pve-ha-manager src/PVE/HA/Rules.pm
/// `check_negative_resource_affinity_node_affinity_consistency`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_beyond_the_node_affinity_nodes_refuses_the_extra_machine_up_front() {
    let h = Harness::start("").await;
    burst_beyond_the_node_affinity_nodes(h).await;
}

/// The same burst with every Proxmox answer taking 100 ms: the three machines read the HA rules at
/// the same moment, and each still counts the others placed before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_burst_beyond_the_node_affinity_nodes_still_refuses_the_extra_machine_up_front() {
    let mut scenario = three_node_scenario();
    scenario["latency"] = json!(0.1);
    let h = Harness::start_scaled(scenario, 1.0, "").await;
    burst_beyond_the_node_affinity_nodes(h).await;
}

async fn burst_beyond_the_node_affinity_nodes(mut h: Harness) {
    let data = class("  spread: true\n  node_affinity_nodes: [pve2, pve3]\n");
    let ids = ["wave-0", "wave-1", "wave-2"];
    for id in ids {
        h.request(id, "wave", &data);
    }
    let settled = h
        .omni
        .state
        .wait_for(Duration::from_secs(60), |s| {
            ids.iter().all(|id| {
                s.get(&MACHINE_REQUEST_STATUS, id).is_some_and(|st| {
                    st.spec.stage() == Stage::Provisioned
                        || (st.spec.stage() == Stage::Failed
                            && st.spec.error.contains("ha.node_affinity_nodes"))
                })
            })
        })
        .await;
    let stages: Vec<_> = ids.iter().map(|id| h.status(id)).collect();
    assert!(settled, "{stages:?}");
    let refused: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| h.status(id).unwrap().spec.stage() == Stage::Failed)
        .collect();
    assert_eq!(refused.len(), 1, "{stages:?}");
    assert!(h.vms_named(refused[0]).is_empty(), "nothing made");
    assert_eq!(members(&rules(&mut h)["omni-wave-raff"]).len(), 2);
    h.stop_controller().await;
}

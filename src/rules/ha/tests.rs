use super::*;
use crate::proxmox::types::NodeName;

fn rule(name: &str, kind: &str, resources: &str) -> HaRule {
    HaRule {
        rule: name.into(),
        kind: kind.into(),
        resources: Some(resources.into()),
        affinity: (kind == "resource-affinity").then(|| "negative".into()),
        digest: Some("d1".into()),
        ..HaRule::default()
    }
}

fn spread() -> HaSettings {
    HaSettings {
        resource_affinity: Some(ResourceAffinity::Negative),
        ..HaSettings::default()
    }
}

fn member<'a>(
    settings: &'a HaSettings,
    sid: &'a str,
    set_members: &'a [String],
) -> HaMembership<'a> {
    HaMembership {
        settings,
        set: Some("cp.set"),
        sid,
        set_members,
        cluster_nodes: 3,
        comment: "managed by test",
    }
}

#[test]
fn names_match_the_official_provider() {
    // The official provider: "omni-" + the set with [^A-Za-z0-9_-] replaced by "-" + "-naff"/"-raff".
    assert_eq!(node_affinity_rule("talos-cp"), "omni-talos-cp-naff");
    assert_eq!(resource_affinity_rule("my.set/1"), "omni-my-set-1-raff");
}

#[test]
fn the_first_vm_of_a_spread_set_waits_for_a_second() {
    let settings = spread();
    let plan = plan_join(&member(&settings, "vm:101", &[]), &[]).unwrap();
    assert!(plan.changes.is_empty());
    assert!(plan.notes[0].contains("second VM"), "{:?}", plan.notes);
}

#[test]
fn the_second_vm_creates_the_rule_with_both() {
    let settings = spread();
    let members = vec!["vm:101".to_string(), "vm:102".to_string()];
    let plan = plan_join(&member(&settings, "vm:102", &members), &[]).unwrap();
    let [
        RuleChange::Create {
            rule: new,
            resources,
        },
    ] = plan.changes.as_slice()
    else {
        panic!("{plan:?}")
    };
    assert_eq!(new.rule, "omni-cp-set-raff");
    assert_eq!(resources, &["vm:101", "vm:102"]);
    assert_eq!(new.kind, "resource-affinity");
    assert_eq!(new.affinity.as_deref(), Some("negative"));
    assert_eq!(new.comment.as_deref(), Some("managed by test"));
}

#[test]
fn a_later_vm_joins_the_existing_rule_once() {
    let settings = spread();
    let rules = [rule(
        "omni-cp-set-raff",
        "resource-affinity",
        "vm:101,vm:102",
    )];
    let plan = plan_join(&member(&settings, "vm:103", &[]), &rules).unwrap();
    let [
        RuleChange::Join {
            rule: read,
            resources,
        },
    ] = plan.changes.as_slice()
    else {
        panic!("{plan:?}")
    };
    assert_eq!(read.digest.as_deref(), Some("d1"));
    assert_eq!(resources, &["vm:101", "vm:102", "vm:103"]);
    // Already in: nothing to write (a re-run after a crash, or a second reconcile).
    let rules = [rule(
        "omni-cp-set-raff",
        "resource-affinity",
        "vm:101,vm:102,vm:103",
    )];
    assert!(
        plan_join(&member(&settings, "vm:103", &[]), &rules)
            .unwrap()
            .changes
            .is_empty()
    );
}

#[test]
fn a_negative_rule_never_holds_more_vms_than_nodes() {
    // pve-ha-manager ResourceAffinity.pm `check_negative_resource_affinity_resources_count`.
    let settings = spread();
    let rules = [rule(
        "omni-cp-set-raff",
        "resource-affinity",
        "vm:1,vm:2,vm:3",
    )];
    let plan = plan_join(&member(&settings, "vm:4", &[]), &rules).unwrap();
    assert!(plan.changes.is_empty());
    assert!(plan.notes[0].contains("3 nodes"), "{:?}", plan.notes);
    let members: Vec<String> = (1..=5).map(|i| format!("vm:{i}")).collect();
    let plan = plan_join(&member(&settings, "vm:5", &members), &[]).unwrap();
    let [RuleChange::Create { resources, .. }] = plan.changes.as_slice() else {
        panic!("{plan:?}")
    };
    assert_eq!(resources.len(), 3);
    assert!(resources.contains(&"vm:5".to_string()));
}

#[test]
fn node_affinity_is_made_with_the_first_vm_and_joined_by_the_rest() {
    let settings = HaSettings {
        node_affinity_nodes: vec![
            NodeName::parse("pve1").unwrap(),
            NodeName::parse("pve2").unwrap(),
        ],
        node_affinity_strict: true,
        ..HaSettings::default()
    };
    let plan = plan_join(&member(&settings, "vm:101", &[]), &[]).unwrap();
    let [
        RuleChange::Create {
            rule: new,
            resources,
        },
    ] = plan.changes.as_slice()
    else {
        panic!("{plan:?}")
    };
    assert_eq!(new.rule, "omni-cp-set-naff");
    assert_eq!(resources, &["vm:101"]);
    assert_eq!(new.kind, "node-affinity");
    assert_eq!(new.nodes.as_deref(), Some("pve1,pve2"));
    assert!(new.strict);
    let mut existing = rule("omni-cp-set-naff", "node-affinity", "vm:101");
    existing.nodes = Some("pve1,pve3:2".into());
    let plan = plan_join(&member(&settings, "vm:102", &[]), &[existing]).unwrap();
    assert!(matches!(plan.changes.as_slice(), [RuleChange::Join { .. }]));
    assert!(
        plan.notes[0].contains("edit its nodes in Proxmox"),
        "{:?}",
        plan.notes
    );
}

#[test]
fn named_rules_must_exist_and_are_joined() {
    let settings = HaSettings {
        rules: vec!["db-apart".into()],
        ..HaSettings::default()
    };
    let err = plan_join(&member(&settings, "vm:7", &[]), &[]).unwrap_err();
    assert!(
        err.to_string()
            .contains("\"db-apart\" named in ha.rules does not exist")
    );
    let rules = [rule("db-apart", "resource-affinity", "vm:1,vm:2")];
    let plan = plan_join(&member(&settings, "vm:7", &[]), &rules).unwrap();
    assert!(
        matches!(plan.changes.as_slice(), [RuleChange::Join { resources, .. }] if resources.len() == 3)
    );
}

#[test]
fn a_foreign_rule_under_our_name_is_an_error_not_overwritten() {
    let settings = spread();
    let rules = [rule("omni-cp-set-raff", "node-affinity", "vm:1")];
    let err = plan_join(&member(&settings, "vm:2", &[]), &rules).unwrap_err();
    assert!(matches!(err, HaRuleError::WrongKind { .. }));
}

#[test]
fn without_a_set_only_named_rules_apply() {
    let settings = HaSettings {
        resource_affinity: Some(ResourceAffinity::Negative),
        ..HaSettings::default()
    };
    let mut m = member(&settings, "vm:1", &[]);
    m.set = None;
    assert_eq!(plan_join(&m, &[]).unwrap(), JoinPlan::default());
}

#[test]
fn leaving_deletes_the_rules_it_would_leave_empty_or_ineffective() {
    let rules = [
        rule("omni-s-raff", "resource-affinity", "vm:1,vm:2,vm:3"),
        rule("omni-s-naff", "node-affinity", "vm:1,vm:2,vm:3"),
        rule("someone-elses", "resource-affinity", "vm:1,vm:2"),
    ];
    let all_alive = |_: &str| true;
    assert!(rules_to_delete("s", "vm:1", &rules, all_alive).is_empty());
    // Two of three gone: the resource-affinity rule would hold one VM.
    let only_3 = |s: &str| s == "vm:3";
    assert_eq!(
        rules_to_delete("s", "vm:1", &rules, only_3),
        ["omni-s-raff"]
    );
    // The last one: both go; other people's rules are the purge's business.
    let none = |_: &str| false;
    assert_eq!(
        rules_to_delete("s", "vm:3", &rules, none),
        ["omni-s-raff", "omni-s-naff"]
    );
}

fn node_rule(name: &str, resources: &str, nodes: &str) -> HaRule {
    HaRule {
        nodes: Some(nodes.into()),
        ..rule(name, "node-affinity", resources)
    }
}

fn nodes(names: &[&str]) -> Vec<NodeName> {
    names.iter().map(|n| NodeName::new(*n).unwrap()).collect()
}

/// pve-ha-manager src/PVE/HA/Rules.pm `check_negative_resource_affinity_node_affinity_consistency`:
/// the shape of examples/machine-classes/control-plane-ha.yaml (spread on three named nodes) takes
/// three VMs; the fourth, on a larger cluster, would make the rules infeasible.
#[test]
fn spread_within_node_affinity_takes_as_many_vms_as_nodes() {
    let settings = HaSettings {
        node_affinity_nodes: nodes(&["pve1", "pve2", "pve3"]),
        ..spread()
    };
    let three = [
        node_rule("omni-cp-set-naff", "vm:101,vm:102,vm:103", "pve1,pve2,pve3"),
        rule(
            "omni-cp-set-raff",
            "resource-affinity",
            "vm:101,vm:102,vm:103",
        ),
    ];
    let two = [
        node_rule("omni-cp-set-naff", "vm:101,vm:102", "pve1,pve2,pve3"),
        rule("omni-cp-set-raff", "resource-affinity", "vm:101,vm:102"),
    ];
    for cluster_nodes in 3..=8 {
        let m = HaMembership {
            cluster_nodes,
            ..member(&settings, "", &[])
        };
        assert_eq!(check_join(&m, &[]), Ok(()));
        assert_eq!(check_join(&m, &two), Ok(()));
        let fourth = check_join(&m, &three);
        if cluster_nodes == 3 {
            // The rule is as large as the cluster: the fourth VM stays out of it (plan_join).
            assert_eq!(fourth, Ok(()));
        } else {
            let e = fourth.unwrap_err();
            assert!(
                e.contains("ha.spread/ha.resource_affinity")
                    && e.contains("ha.node_affinity_nodes")
                    && e.contains("3 node(s) (pve1, pve2, pve3)"),
                "{e}"
            );
        }
    }
}

/// pve-ha-manager src/PVE/HA/Rules/NodeAffinity.pm `check_single_resource_reference`.
#[test]
fn a_vm_in_two_node_affinity_rules_is_refused() {
    let settings = HaSettings {
        node_affinity_nodes: nodes(&["pve1", "pve2"]),
        rules: vec!["db-nodes".into()],
        ..HaSettings::default()
    };
    let rules = [node_rule("db-nodes", "vm:100", "pve3")];
    let e = check_join(&member(&settings, "", &[]), &rules).unwrap_err();
    assert!(
        e.contains("ha.node_affinity_nodes: omni-cp-set-naff")
            && e.contains("ha.rules[0]: db-nodes"),
        "{e}"
    );
}

/// pve-ha-manager src/PVE/HA/Rules.pm
/// `check_single_node_affinity_per_positive_resource_affinity_rule`.
#[test]
fn a_positive_rule_across_node_affinity_rules_is_refused() {
    let settings = HaSettings {
        node_affinity_nodes: nodes(&["pve1"]),
        rules: vec!["together".into()],
        ..HaSettings::default()
    };
    let mut together = rule("together", "resource-affinity", "vm:100,vm:101");
    together.affinity = Some("positive".into());
    let rules = [together, node_rule("db-nodes", "vm:100", "pve2")];
    let e = check_join(&member(&settings, "", &[]), &rules).unwrap_err();
    assert!(
        e.contains("ha.rules[0]") && e.contains("positive") && e.contains("db-nodes"),
        "{e}"
    );
    // Without the set's own node-affinity rule the VM follows db-nodes: fine.
    let alone = HaSettings {
        rules: vec!["together".into()],
        ..HaSettings::default()
    };
    assert_eq!(check_join(&member(&alone, "", &[]), &rules), Ok(()));
}

/// pve-ha-manager src/PVE/API2/HA/Rules.pm `assert_valid_resources_param`, behind
/// `lock_ha_domain`'s prefix.
#[test]
fn unmanaged_sids_are_read_from_the_refusal() {
    assert_eq!(
        unmanaged_sids(
            "update HA rules failed: cannot use unmanaged resource(s) vm:101, vm:102.\n"
        ),
        ["vm:101", "vm:102"]
    );
    assert!(unmanaged_sids("update HA rules failed: no resources were specified").is_empty());
}

/// Machines of a burst are counted together: the set's VMs placed but not yet HA-managed
/// (`set_members`) join the set's rules too, so the third of a spread set kept on two nodes is
/// refused even before the first two joined (pve-ha-manager src/PVE/HA/Rules.pm
/// `check_negative_resource_affinity_node_affinity_consistency`).
#[test]
fn placed_machines_of_the_set_count_toward_its_rules() {
    let settings = HaSettings {
        node_affinity_nodes: nodes(&["pve2", "pve3"]),
        ..spread()
    };
    let one = vec!["burst-0".to_string()];
    let two = vec!["burst-0".to_string(), "burst-1".to_string()];
    let m = |members| HaMembership {
        cluster_nodes: 5,
        ..member(&settings, "", members)
    };
    assert_eq!(check_join(&m(&one), &[]), Ok(()));
    let e = check_join(&m(&two), &[]).unwrap_err();
    assert!(e.contains("2 node(s) (pve2, pve3)"), "{e}");
}

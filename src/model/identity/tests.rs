use super::*;
use proptest::prelude::*;
use serde_json::json;

fn listed(value: serde_json::Value) -> VmResource {
    serde_json::from_value(value).unwrap()
}

fn config(value: serde_json::Value) -> VmConfig {
    serde_json::from_value(value).unwrap()
}

fn claim(recorded: Option<u32>) -> Claim<'static> {
    Claim {
        request_id: "req-1",
        provider_id: "proxmox",
        recorded_vmid: recorded.map(|id| VmId::new(id).unwrap()),
        smbios_uuid: None,
    }
}

const UUID: &str = "5c1f0a52-9d3e-4c1b-8f57-0d6f1f4a2b10";

fn marker() -> String {
    description_marker("proxmox", "req-1")
}

#[test]
fn the_listing_alone_decides_when_name_and_both_tags_match() {
    let ours = listed(json!({"vmid": 104, "node": "pve1", "name": "req-1",
        "tags": "machine-request.workers;omni-provider.proxmox;omni-request.req-1"}));
    assert_eq!(judge_listing(&ours, &claim(None)), Some(Ownership::Ours));
    // Proxmox may show tags in another case than we wrote them.
    let upper = listed(json!({"vmid": 104, "node": "pve1", "name": "req-1",
        "tags": "OMNI-PROVIDER.proxmox;Omni-Request.req-1"}));
    assert_eq!(judge_listing(&upper, &claim(None)), Some(Ownership::Ours));
    // Another provider's tag, or another request's tag: the config decides.
    for tags in [
        "omni-provider.other;omni-request.req-1",
        "omni-provider.proxmox;omni-request.req-2",
        "omni-provider.proxmox",
        "machine-request.set",
        "",
    ] {
        let vm = listed(json!({"vmid": 104, "node": "pve1", "name": "req-1", "tags": tags}));
        assert_eq!(judge_listing(&vm, &claim(None)), None, "{tags}");
    }
}

#[test]
fn the_listing_rules_out_templates_and_other_names() {
    let tags = "omni-provider.proxmox;omni-request.req-1";
    let reused = listed(json!({"vmid": 104, "node": "pve1", "name": "web-1", "tags": tags}));
    assert!(matches!(
        judge_listing(&reused, &claim(Some(104))),
        Some(Ownership::NotOurs(ref why)) if why.contains("web-1")
    ));
    // Names are exact: Omni's IDs are, and Proxmox keeps a VM name as given.
    let renamed = listed(json!({"vmid": 104, "node": "pve1", "name": "Req-1", "tags": tags}));
    assert!(matches!(
        judge_listing(&renamed, &claim(None)),
        Some(Ownership::NotOurs(_))
    ));
    let template = listed(json!({"vmid": 9000, "node": "pve1", "name": "req-1",
        "template": 1, "tags": tags}));
    assert_eq!(
        judge_listing(&template, &claim(Some(9000))),
        Some(Ownership::NotOurs("it is a template".into()))
    );
}

#[test]
fn a_listing_without_a_name_proves_nothing() {
    // pve-manager PVE/API2/Cluster.pm `resources` fills a VM's entry through PVE/API2Tools.pm
    // `extract_vm_stats`, which takes name, status and template from the RRD data pvestatd
    // broadcasts; without it (a VM created seconds ago, a node offline for minutes) the entry has
    // only vmid/node/type plus tags and lock from the config.
    for tags in ["", "omni-provider.proxmox;omni-request.req-1"] {
        let vm = listed(json!({"vmid": 104, "node": "pve1", "tags": tags}));
        assert_eq!(judge_listing(&vm, &claim(Some(104))), None);
    }
}

#[test]
fn adoption_teardown_and_orphans_agree_on_mixed_case_tags() {
    // PVE lowercases tags unless datacenter.cfg `tag-style` sets case-sensitive (PVE::JSONSchema's
    // tag list): a provider ID with capitals comes back lowercased.
    let vm = listed(json!({"vmid": 104, "node": "pve1", "name": "Req-1",
        "tags": "omni-provider.my-proxmox;omni-request.req-1"}));
    let claim = Claim {
        request_id: "Req-1",
        provider_id: "My-Proxmox",
        recorded_vmid: None,
        smbios_uuid: None,
    };
    assert!(made_by(&vm, "MY-PROXMOX"), "orphans");
    assert!(looks_like(&vm, "Req-1", "My-Proxmox"));
    assert_eq!(candidates(std::iter::once(&vm), &claim).len(), 1);
    assert_eq!(judge_listing(&vm, &claim), Some(Ownership::Ours));
    // The config path ignores case the same way (a config read back with lowercased tags).
    let cfg = config(json!({"name": "Req-1", "tags": "omni-provider.my-proxmox",
        "description": description_marker("My-Proxmox", "Req-1"),
        "smbios1": format!("uuid={}", UUID.to_uppercase())}));
    let with_uuid = Claim {
        smbios_uuid: Some(UUID),
        ..claim
    };
    assert_eq!(judge_config(&vm, &cfg, &with_uuid), Ownership::Ours);
    assert!(!made_by(&vm, "other"));
    let template = listed(json!({"vmid": 9000, "node": "pve1", "name": "Req-1",
        "template": 1, "tags": "omni-provider.my-proxmox"}));
    assert!(!made_by(&template, "My-Proxmox"));
}

#[test]
fn candidates_are_the_recorded_vmid_then_lookalikes() {
    let vms = [
        listed(json!({"vmid": 100, "node": "pve1", "name": "req-1",
            "tags": "omni-provider.proxmox"})),
        listed(json!({"vmid": 101, "node": "pve1", "name": "web"})),
        listed(json!({"vmid": 102, "node": "pve2"})),
        listed(json!({"vmid": 103, "node": "pve1", "name": "req-1"})),
    ];
    let ids = |c: Vec<&VmResource>| c.iter().map(|vm| vm.vmid.get()).collect::<Vec<_>>();
    // The recorded VMID whatever it shows (no name yet here), then our lookalike; a VM named after
    // the request without our tag elsewhere is not a candidate (nothing recorded it).
    assert_eq!(
        ids(candidates(vms.iter(), &claim(Some(102)))),
        vec![102, 100]
    );
    assert_eq!(ids(candidates(vms.iter(), &claim(Some(100)))), vec![100]);
    assert_eq!(ids(candidates(vms.iter(), &claim(None))), vec![100]);
    assert_eq!(ids(candidates(vms.iter(), &claim(Some(999)))), vec![100]);
}

#[test]
fn the_config_marker_decides() {
    let vm = listed(json!({"vmid": 104, "node": "pve1"}));
    let judge = |value| judge_config(&vm, &config(value), &claim(Some(104)));
    assert_eq!(
        judge(json!({"name": "req-1", "description": marker()})),
        Ownership::Ours
    );
    // A user note above the marker does not break it.
    assert_eq!(
        judge(json!({"name": "req-1", "description": format!("note: keep\n{}", marker())})),
        Ownership::Ours
    );
    let other_request = judge(json!({"name": "req-1",
        "description": description_marker("proxmox", "req-2")}));
    assert!(matches!(other_request, Ownership::NotOurs(ref why) if why.contains("req-2")));
    let other_provider = judge(json!({"name": "req-1",
        "description": description_marker("other", "req-1")}));
    assert!(matches!(other_provider, Ownership::NotOurs(ref why) if why.contains("other")));
    // Our marker on a renamed VM (cloned by hand and renamed): not ours.
    assert!(matches!(
        judge(json!({"name": "copy", "description": marker()})),
        Ownership::NotOurs(_)
    ));
    assert!(matches!(
        judge(json!({"name": "web", "description": "my web server"})),
        Ownership::NotOurs(_)
    ));
    assert_eq!(
        judge(json!({"name": "req-1", "template": 1, "description": marker()})),
        Ownership::NotOurs("it is a template".into())
    );
    // No name in the config: the listing's name stands in.
    let named = listed(json!({"vmid": 104, "node": "pve1", "name": "req-1"}));
    assert_eq!(
        judge_config(
            &named,
            &config(json!({"description": marker()})),
            &claim(None)
        ),
        Ownership::Ours
    );
}

#[test]
fn the_official_providers_vm_is_the_requests_only_at_the_recorded_vmid() {
    // The official provider names the VM after the request and tags it with the machine-request
    // set, without any marker, and records the VMID in its state.
    let vm = listed(json!({"vmid": 104, "node": "pve1", "name": "req-1",
        "tags": "machine-request.workers"}));
    let cfg = config(json!({"name": "req-1", "tags": "machine-request.workers"}));
    assert_eq!(judge_config(&vm, &cfg, &claim(Some(104))), Ownership::Ours);
    assert!(matches!(
        judge_config(&vm, &cfg, &claim(Some(105))),
        Ownership::NotOurs(ref why) if why.contains("not recorded")
    ));
    assert!(matches!(
        judge_config(&vm, &cfg, &claim(None)),
        Ownership::NotOurs(_)
    ));
    // Without the set tag it is nobody's we know.
    let untagged = listed(json!({"vmid": 104, "node": "pve1", "name": "req-1"}));
    let bare = config(json!({"name": "req-1"}));
    assert!(matches!(
        judge_config(&untagged, &bare, &claim(Some(104))),
        Ownership::NotOurs(_)
    ));
}

#[test]
fn the_recorded_smbios_uuid_tells_our_vm_from_a_copy() {
    let vm = listed(json!({"vmid": 104, "node": "pve1", "name": "req-1"}));
    let with = |smbios1: Option<&str>, expected: Option<&'static str>, tags: &str| {
        let mut value = json!({"name": "req-1", "description": marker(), "tags": tags});
        if let Some(s) = smbios1 {
            value["smbios1"] = json!(s);
        }
        let claim = Claim {
            smbios_uuid: expected,
            ..claim(Some(104))
        };
        judge_config(&vm, &config(value), &claim)
    };
    let ours = format!("uuid={UUID},serial=x");
    let tags = "omni-provider.proxmox";
    assert_eq!(with(Some(&ours), Some(UUID), tags), Ownership::Ours);
    // Nothing recorded: the marker alone decides.
    assert_eq!(with(None, None, tags), Ownership::Ours);
    assert_eq!(with(Some(&ours), Some(" "), tags), Ownership::Ours);
    let copy = with(
        Some("uuid=00000000-0000-0000-0000-000000000001"),
        Some(UUID),
        tags,
    );
    assert!(matches!(copy, Ownership::NotOurs(ref why) if why.contains("SMBIOS")));
    assert!(matches!(
        with(None, Some(UUID), tags),
        Ownership::NotOurs(_)
    ));
    // A clone not configured yet (no tags of ours) still has the UUID Proxmox gave it at clone
    // time: not checked until our tags are on it.
    assert_eq!(
        with(
            Some("uuid=00000000-0000-0000-0000-000000000001"),
            Some(UUID),
            ""
        ),
        Ownership::Ours
    );
    assert_eq!(smbios_uuid("serial=a, uuid=abc"), Some("abc"));
    assert_eq!(smbios_uuid("serial=a"), None);
}

#[test]
fn request_tag_is_a_valid_tag_or_nothing() {
    assert_eq!(
        request_tag("req-1").as_ref().map(Tag::as_str),
        Some("omni-request.req-1")
    );
    assert_eq!(request_tag("has space"), None);
    assert_eq!(request_tag(""), None);
    assert_eq!(request_tag("a;b"), None);
    assert_eq!(request_tag(&"x".repeat(200)), None);
    assert_eq!(
        tagged_request(&["talos", "omni-request.req-1"]),
        Some("req-1")
    );
    assert_eq!(tagged_request(&["OMNI-REQUEST.req-1"]), Some("req-1"));
    assert_eq!(tagged_request(&["omni-request."]), None);
    assert_eq!(tagged_request(&["omni-provider.proxmox"]), None);
    // An ID that cannot be a tag is never recognised through the listing alone.
    let vm = listed(json!({"vmid": 104, "node": "pve1", "name": "a b",
        "tags": "omni-provider.proxmox"}));
    let odd = Claim {
        request_id: "a b",
        ..claim(None)
    };
    assert_eq!(judge_listing(&vm, &odd), None);
}

proptest! {
    #[test]
    fn request_tags_are_tags_or_absent(request in "\\PC{0,60}") {
        if let Some(tag) = request_tag(&request) {
            prop_assert!(Tag::new(tag.to_string()).is_ok());
            prop_assert_eq!(tagged_request(&[tag.as_str()]), Some(request.as_str()));
        }
    }

    #[test]
    fn marker_round_trips(request in "[a-z0-9][a-z0-9-]{0,40}", provider in "[a-z0-9][a-z0-9-]{0,20}") {
        let description = description_marker(&provider, &request);
        prop_assert_eq!(marked(&description, MARKER_REQUEST), Some(request.as_str()));
        prop_assert_eq!(marked(&description, MARKER_PROVIDER), Some(provider.as_str()));
        let vm = listed(json!({"vmid": 104, "node": "pve1"}));
        let cfg = config(json!({"name": request.clone(), "description": description_marker(&provider, &request)}));
        let claim = Claim { request_id: &request, provider_id: &provider, recorded_vmid: None, smbios_uuid: None };
        prop_assert_eq!(judge_config(&vm, &cfg, &claim), Ownership::Ours);
    }

    #[test]
    fn arbitrary_configs_never_panic(text in "\\PC{0,200}", name in "\\PC{0,20}", tags in "\\PC{0,40}") {
        let vm = listed(json!({"vmid": 104, "node": "pve1", "tags": tags.clone()}));
        let cfg = config(json!({"name": name, "description": text, "tags": tags, "smbios1": "uuid="}));
        let _ = judge_config(&vm, &cfg, &Claim { smbios_uuid: Some(UUID), ..claim(Some(104)) });
        let _ = judge_listing(&vm, &claim(None));
    }
}

/// A copy of our VM made by someone who may edit VM options carries our name, tags and marker, but
/// never the SMBIOS UUID we gave ours: with one recorded, the listing cannot prove a VM ours for an
/// adoption or a delete, and the config rules the copy out.
#[test]
fn a_recorded_uuid_makes_the_config_decide_before_acting() {
    let tags = "machine-request.workers;omni-provider.proxmox;omni-request.req-1";
    let copy = listed(json!({"vmid": 180, "node": "pve1", "name": "req-1", "tags": tags}));
    let with_uuid = Claim {
        smbios_uuid: Some(UUID),
        ..claim(Some(180))
    };
    assert_eq!(judge_listing(&copy, &with_uuid), Some(Ownership::Ours));
    assert_eq!(judge_listing_to_act(&copy, &with_uuid), None);
    assert_eq!(
        judge_listing_to_act(&copy, &claim(Some(180))),
        Some(Ownership::Ours),
        "nothing recorded to check: the listing decides"
    );
    let copied_config = config(
        json!({"name": "req-1", "tags": tags, "description": marker(),
        "smbios1": "uuid=0e1b7d1c-0000-4000-8000-000000000001"}),
    );
    assert!(matches!(
        judge_config(&copy, &copied_config, &with_uuid),
        Ownership::NotOurs(ref why) if why.contains("SMBIOS UUID")
    ));
    let ours = config(
        json!({"name": "req-1", "tags": tags, "description": marker(),
        "smbios1": format!("uuid={UUID}")}),
    );
    assert_eq!(judge_config(&copy, &ours, &with_uuid), Ownership::Ours);
}

/// The official provider records the SMBIOS UUID before its create and the VMID after: a VM it made
/// whose answer was lost (named and tagged as the set's, no marker) is the request's by the UUID.
#[test]
fn a_legacy_vm_carrying_the_recorded_uuid_is_the_requests_without_a_recorded_vmid() {
    let tags = "machine-request.workers;omni-provider.proxmox;omni-request.req-1";
    let vm = listed(json!({"vmid": 152, "node": "pve2", "name": "req-1", "tags": tags}));
    let claim = Claim {
        smbios_uuid: Some(UUID),
        ..claim(None)
    };
    let carrying =
        config(json!({"name": "req-1", "tags": tags, "smbios1": format!("uuid={UUID}")}));
    assert_eq!(judge_config(&vm, &carrying, &claim), Ownership::Ours);
    let other = config(json!({"name": "req-1", "tags": tags,
        "smbios1": "uuid=0e1b7d1c-0000-4000-8000-000000000001"}));
    assert!(matches!(
        judge_config(&vm, &other, &claim),
        Ownership::NotOurs(_)
    ));
}

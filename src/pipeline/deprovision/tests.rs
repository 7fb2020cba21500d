use super::*;
use crate::proxmox::ProxmoxError;
use crate::proxmox::types::ClusterResource;
use crate::proxmox::types::VmConfig;
use std::collections::{BTreeMap, BTreeSet};

fn vm(json: serde_json::Value) -> VmResource {
    serde_json::from_value(json).unwrap()
}

fn iso(node: &str, volid: &str) -> OrphanIso {
    OrphanIso {
        node: NodeName::new(node).unwrap(),
        storage: volid.split(':').next().unwrap().to_owned(),
        volume: volid.to_owned(),
        size: Some(1024),
    }
}

#[test]
fn orphans_are_our_vms_of_dead_requests_and_unused_seeds() {
    let vms = [
        vm(
            serde_json::json!({"vmid": 104, "node": "pve1", "name": "live-1", "tags": "omni-provider.proxmox;omni-request.live-1"}),
        ),
        vm(
            serde_json::json!({"vmid": 105, "node": "pve2", "name": "dead-1", "tags": "omni-provider.proxmox;omni-request.dead-1", "status": "running"}),
        ),
        // Older VM without the request tag: its name says which request.
        vm(
            serde_json::json!({"vmid": 106, "node": "pve2", "name": "live-2", "tags": "omni-provider.proxmox"}),
        ),
        // Not ours: no provider tag (someone else's, or the official provider's).
        vm(serde_json::json!({"vmid": 107, "node": "pve3", "name": "dead-2"})),
        // Another provider instance's VM.
        vm(
            serde_json::json!({"vmid": 108, "node": "pve3", "name": "dead-3", "tags": "omni-provider.other"}),
        ),
        // Ours, request dead, config not readable (node offline): listed, and its seed is not
        // listed apart from it.
        vm(
            serde_json::json!({"vmid": 109, "node": "pve3", "name": "dead-4", "tags": "omni-provider.proxmox;omni-request.dead-4", "status": "unknown"}),
        ),
        // A template with our tag is never an orphan.
        vm(
            serde_json::json!({"vmid": 9000, "node": "pve1", "name": "tmpl", "template": 1, "tags": "omni-provider.proxmox"}),
        ),
    ];
    let live: BTreeSet<String> = ["live-1".to_string(), "live-2".into(), "live-3".into()].into();
    let used: BTreeMap<VmId, Vec<String>> = [
        (
            VmId::new(104).unwrap(),
            vec!["local:iso/omni-seed-live-1.iso".to_string()],
        ),
        (
            VmId::new(105).unwrap(),
            vec![
                "local:iso/talos.iso".to_string(),
                "local:iso/omni-seed-dead-1.iso".into(),
            ],
        ),
    ]
    .into();
    let isos = vec![
        iso("pve1", "local:iso/omni-seed-live-1.iso"),
        iso("pve2", "local:iso/omni-seed-dead-1.iso"),
        iso("pve2", "local:iso/omni-seed-gone.iso"),
        iso("pve2", "local:iso/omni-seed-gone.iso"),
        iso("pve3", "local:iso/omni-seed-gone.iso"),
        // A live request being provisioned: seed uploaded, VM not created yet.
        iso("pve1", "local:iso/omni-seed-live-3.iso"),
        iso("pve1", "local:iso/talos.iso"),
        iso("pve3", "local:iso/omni-seed-dead-4.iso"),
    ];
    let orphans = find_orphans(vms.iter(), &live, "proxmox", &isos, &used);
    let ids: Vec<u32> = orphans.vms.iter().map(|v| v.vmid.get()).collect();
    assert_eq!(ids, [105, 109], "{orphans:?}");
    assert!(orphans.vms[1].seed_isos.is_empty());
    let o = &orphans.vms[0];
    assert_eq!(o.vmid.get(), 105);
    assert_eq!(o.request_id.as_deref(), Some("dead-1"));
    assert_eq!(o.seed_isos, ["local:iso/omni-seed-dead-1.iso"]);
    let seeds: Vec<(&str, &str)> = orphans
        .seed_isos
        .iter()
        .map(|i| (i.node.as_str(), i.volume.as_str()))
        .collect();
    assert_eq!(
        seeds,
        [
            ("pve2", "local:iso/omni-seed-gone.iso"),
            ("pve3", "local:iso/omni-seed-gone.iso")
        ]
    );
}

#[test]
fn iso_volumes_of_a_config() {
    let config: VmConfig = serde_json::from_value(serde_json::json!({
        "ide2": "local:iso/talos.iso,media=cdrom",
        "ide3": "shared-nfs:iso/omni-seed-r.iso,media=cdrom",
        "scsi0": "local-lvm:vm-104-disk-0,size=8G",
        "cores": 2,
        "description": "hello"
    }))
    .unwrap();
    let mut v = iso_volumes_in(&config);
    v.sort();
    assert_eq!(v, ["local:iso/talos.iso", "shared-nfs:iso/omni-seed-r.iso"]);
    assert!(is_seed_iso("local:iso/omni-seed-r.iso"));
    assert!(!is_seed_iso("local:iso/talos.iso"));
    assert!(!is_seed_iso("local-lvm:vm-104-disk-0"));
}

#[test]
fn view_finds_identity_and_nodes_for_shared_storage() {
    let resources: Vec<ClusterResource> = serde_json::from_value(serde_json::json!([
        {"type": "node", "node": "pve1", "status": "offline"},
        {"type": "node", "node": "pve2", "status": "online"},
        {"type": "storage", "storage": "local", "node": "pve1", "shared": 0},
        {"type": "storage", "storage": "local", "node": "pve2", "shared": 0},
        {"type": "storage", "storage": "nfs", "node": "pve1", "shared": 1},
        {"type": "storage", "storage": "nfs", "node": "pve2", "shared": 1},
        {"type": "qemu", "vmid": 104, "node": "pve1", "name": "r", "tags": "omni-provider.p"},
        {"type": "qemu", "vmid": 105, "node": "pve2", "name": "r"},
        {"type": "qemu", "vmid": 106, "node": "pve2", "name": "r", "template": 1, "tags": "omni-provider.p"},
        {"type": "lxc", "vmid": 200, "node": "pve2", "name": "ct"}
    ]))
    .unwrap();
    let view = Listing::read(resources, std::time::Instant::now());
    let found: Vec<u32> = view
        .vms()
        .filter(|vm| identity::looks_like(vm, "r", "p"))
        .map(|v| v.vmid.get())
        .collect();
    assert_eq!(found, [104]);
    assert_eq!(view.containers().count(), 1);
    let pve1 = NodeName::new("pve1").unwrap();
    assert_eq!(
        online_node_for(&view, "local", std::slice::from_ref(&pve1)),
        None
    );
    assert_eq!(
        online_node_for(&view, "nfs", std::slice::from_ref(&pve1)).map(|n| n.to_string()),
        Some("pve2".into())
    );
}

#[test]
fn errors_say_what_and_where_and_whether_a_retry_may_help() {
    let node = NodeName::new("pve3").unwrap();
    let vmid = VmId::new(104).unwrap();
    let offline = DeprovisionError::NodeOffline {
        node: node.clone(),
        vmid,
        state: "offline",
    };
    let text = offline.to_string();
    assert!(
        text.contains("pve3") && text.contains("104") && text.contains("may still exist"),
        "{text}"
    );
    let ambiguous = DeprovisionError::Ambiguous {
        request_id: "r".into(),
        vmids: vec![vmid, VmId::new(105).unwrap()],
    };
    assert!(ambiguous.to_string().contains("104, 105"), "{ambiguous}");
    let unreachable = DeprovisionError::Proxmox {
        action: Action::Destroy,
        vmid,
        node,
        source: ProxmoxError::Transient {
            call: crate::proxmox::error::Call {
                method: "DELETE",
                path: "/nodes/pve3/qemu/104".into(),
            },
            status: Some(595),
            message: "No route to host".into(),
            request_sent: true,
        },
    };
    let text = unreachable.to_string();
    assert!(
        text.starts_with("cannot destroy VM 104 on pve3: ")
            && text.contains("No route to host")
            && text.ends_with("will retry)"),
        "{text}"
    );
}

#[test]
fn the_sets_pool_is_asked_for_only_when_every_other_vm_in_it_is_going() {
    let resource =
        |json: serde_json::Value| -> ClusterResource { serde_json::from_value(json).unwrap() };
    let ours = |vmid: u32, name: Option<&str>| {
        let mut vm = serde_json::json!({"type": "qemu", "id": format!("qemu/{vmid}"), "vmid": vmid,
            "node": "pve1", "pool": "set-a", "tags": "omni-provider.proxmox"});
        if let Some(name) = name {
            vm["name"] = serde_json::json!(name);
        }
        resource(vm)
    };
    let view = |listing: Vec<ClusterResource>| Listing::read(listing, std::time::Instant::now());
    let deleted = VmId::new(101).ok();
    let departing: BTreeSet<String> = ["req-b".to_string()].into();
    let ask = |listing: Vec<ClusterResource>, departing: Option<&BTreeSet<String>>| {
        pool_may_be_empty(&view(listing), "set-a", deleted, "proxmox", departing)
    };

    // Only our own VM: ask.
    assert!(ask(vec![ours(101, Some("req-a"))], Some(&departing)));
    // Another machine of the set stays: no request spent on a refusal (one deprovision, 7 requests).
    assert!(!ask(
        vec![ours(101, Some("req-a")), ours(102, Some("req-c"))],
        Some(&departing)
    ));
    // The set's other machine is being torn down too (the last two at once): ask, Proxmox decides.
    assert!(ask(
        vec![ours(101, Some("req-a")), ours(102, Some("req-b"))],
        Some(&departing)
    ));
    // A VM the listing names nothing for yet may be going; the `orphans` command knows no requests.
    assert!(ask(
        vec![ours(101, Some("req-a")), ours(102, None)],
        Some(&departing)
    ));
    assert!(ask(
        vec![ours(101, Some("req-a")), ours(102, Some("req-c"))],
        None
    ));
    // Someone else's guest stays with the pool whatever happens.
    let foreign = resource(
        serde_json::json!({"type": "qemu", "id": "qemu/103", "vmid": 103,
        "node": "pve1", "pool": "set-a", "name": "req-b"}),
    );
    assert!(!ask(vec![ours(101, Some("req-a")), foreign], None));
    let container = resource(
        serde_json::json!({"type": "lxc", "id": "lxc/104", "vmid": 104,
        "node": "pve1", "pool": "set-a"}),
    );
    assert!(!ask(vec![ours(101, Some("req-a")), container], None));
}

//! The provider with a token that holds exactly the README's `OmniProvider` role: a whole provision and
//! deprovision works, and without any one of a few key privileges the failure names it. Also how it
//! chooses VMIDs when the token cannot see every guest and the datacenter narrows the next-id range.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::{MACHINE_REQUEST, MACHINE_REQUEST_STATUS};
use serde_json::{Value, json};
use testkit::fakepve::{TOKEN_ID, readme_role, three_node_scenario};
use testkit::harness::Harness;

const PINNED_PVE2: &str = "cores: 2\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve2\ntags: [talos]\nip_discovery_timeout: 0\n";

/// The standard scenario with the token holding `privs` on `/` (fakepve enforces an ACL once one is
/// given) and nothing else.
fn scenario_with_role(privs: &[String]) -> Value {
    let mut s = three_node_scenario();
    s["acl"] = json!({ TOKEN_ID: [["/", privs]] });
    s
}

/// The status text of `id` once it mentions `needle` (the failure is reported, then retried).
async fn wait_status_containing(h: &Harness, id: &str, needle: &str) -> String {
    let found = h
        .omni
        .state
        .wait_for(Duration::from_secs(30), |s| {
            s.get(&MACHINE_REQUEST_STATUS, id)
                .is_some_and(|st| st.spec.error.contains(needle) || st.spec.status.contains(needle))
        })
        .await;
    let status = h.omni.state.get(&MACHINE_REQUEST_STATUS, id);
    assert!(found, "{id}: no status naming {needle}: {status:?}");
    let spec = status.unwrap().spec;
    format!("{} {}", spec.status, spec.error)
}

// Privileges, from what each call checks upstream:
// - qemu-server src/PVE/API2/Qemu.pm, create_vm: VM.Allocate on the VM or its pool; per option
//   VM.Config.{CPU,Memory,HWType,Options,Disk,Network,CDROM}; Datastore.AllocateSpace for new disks;
//   SDN.Use on every bridge (check_bridge_access); tags through assert_tag_permissions.
// - pve-storage src/PVE/API2/Storage/Status.pm, upload: Datastore.AllocateTemplate; download_url:
//   Datastore.AllocateTemplate and (Sys.Audit+Sys.Modify on / or Sys.AccessNetwork on the node).
// - pve-storage src/PVE/API2/Storage/Content.pm, delete: Datastore.Allocate (the seed ISO).
// - pve-manager PVE/API2/Pool.pm, create_pool/delete_pool: Pool.Allocate on /pool/{poolid}.
// - pve-manager PVE/API2/Cluster.pm, resources: only guests with VM.Audit are listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_role_provisions_and_deprovisions() {
    let role = readme_role();
    let mut h = Harness::start_with(scenario_with_role(&role), "").await;
    h.request("perm-1", "perms", PINNED_PVE2);
    h.wait_stage("perm-1", Stage::Provisioned).await;
    let vms = h.vms_named("perm-1");
    assert_eq!(vms.len(), 1, "{vms:?}");
    let vmid = vms[0]["vmid"].as_u64().unwrap();
    assert_eq!(vms[0]["pool"], json!("perms"));
    assert!(h.omni.state.teardown(&MACHINE_REQUEST, "perm-1"));
    h.wait_released("perm-1").await;
    assert!(h.pve.vm(vmid as u32).is_null(), "VM deleted");
    let local = h
        .pve
        .control(json!({"op": "storage_volumes", "storage": "local"}))
        .to_string();
    assert!(!local.contains("omni-seed-perm-1"), "seed deleted: {local}");
    assert!(
        h.pve.control(json!({"op": "pools"})).get("perms").is_none(),
        "pool deleted"
    );
    h.stop_controller().await;
}

// qemu-server src/PVE/API2/Qemu.pm, clone_vm: VM.Clone on the template, VM.Allocate on the new VMID or
// its pool, Datastore.AllocateSpace on the target storage; then update_vm's per-option checks and
// resize_vm's VM.Config.Disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_role_clones_too() {
    let mut h = Harness::start_with(scenario_with_role(&readme_role()), "").await;
    h.request(
        "perm-clone",
        "perms",
        "cores: 2\nmemory: 2048\ndisk_size: 16\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nboot: clone\ntemplate: 9000\nip_discovery_timeout: 0\n",
    );
    h.wait_stage("perm-clone", Stage::Provisioned).await;
    assert_eq!(h.vms_named("perm-clone").len(), 1);
    assert!(h.omni.state.teardown(&MACHINE_REQUEST, "perm-clone"));
    h.wait_released("perm-clone").await;
    assert!(h.vms_named("perm-clone").is_empty(), "clone deleted");
    h.stop_controller().await;
}

/// Each of these privileges is needed, and its absence is reported by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_one_privilege_the_error_names_it() {
    let role = readme_role();
    for missing in [
        "Datastore.AllocateTemplate",
        "Datastore.AllocateSpace",
        "Sys.AccessNetwork",
        "Pool.Allocate",
        "VM.Allocate",
        "VM.Config.Memory",
        "SDN.Use",
    ] {
        assert!(role.iter().any(|p| p == missing), "{missing} not in role");
        let privs: Vec<String> = role.iter().filter(|p| *p != missing).cloned().collect();
        let mut h = Harness::start_with(scenario_with_role(&privs), "").await;
        h.request("perm-2", "perms", PINNED_PVE2);
        let text = wait_status_containing(&h, "perm-2", missing).await;
        assert!(text.contains("permission"), "{missing}: {text}");
        h.stop_controller().await;
    }
}

/// The seed ISO's deletion needs Datastore.Allocate (pve-storage src/PVE/API2/Storage/Content.pm,
/// `delete`): without it the ISO is left behind, which holds no teardown. The request is released,
/// the leftover is counted, and the provider's log names the privilege (the status that could say
/// it goes with the request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deprovision_without_datastore_allocate_names_it() {
    let log = captured_log();
    let role = readme_role();
    let mut h = Harness::start_with(scenario_with_role(&role), "").await;
    h.request("perm-3", "perms", PINNED_PVE2);
    h.wait_stage("perm-3", Stage::Provisioned).await;
    // The token loses Datastore.Allocate: fakepve's ACL is additive, so start from a fresh one.
    let fewer: Vec<String> = role
        .iter()
        .filter(|p| *p != "Datastore.Allocate")
        .cloned()
        .collect();
    h.pve
        .control(json!({"op": "set_acl", "who": TOKEN_ID, "entries": [["/", fewer]]}));
    assert!(h.omni.state.teardown(&MACHINE_REQUEST, "perm-3"));
    h.wait_released("perm-3").await;
    assert!(h.vms_named("perm-3").is_empty(), "VM deleted");
    let metrics = h.metrics.encode();
    assert!(
        metrics.contains(r#"omni_proxmox_teardown_leftovers_total{kind="seed_iso"} 1"#),
        "{metrics}"
    );
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    assert!(
        text.lines().any(|l| l.contains("perm-3")
            && l.contains("Datastore.Allocate")
            && l.contains("ermission")),
        "{text}"
    );
    h.stop_controller().await;
}

/// What the provider logs at warning level and above, for the tests of this binary that check a
/// message only the log carries.
fn captured_log() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let kept = buffer.clone();
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || testkit::LogWriter(kept.clone()))
            .try_init();
        buffer
    })
    .clone()
}

// pve-guest-common src/PVE/GuestHelpers.pm, assert_tag_permissions/get_allowed_tags: without Sys.Modify
// on `/`, a tag must be allowed by datacenter.cfg's user-tag-access (default `free`) and not be in
// registered-tags. The error must point at that setting, not only at Sys.Modify.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_tags_point_at_user_tag_access() {
    let mut scenario = scenario_with_role(&readme_role());
    scenario["user_tag_access"] = json!({"user-allow": "none"});
    let mut h = Harness::start_with(scenario, "").await;
    h.request("perm-4", "perms", PINNED_PVE2);
    let text = wait_status_containing(&h, "perm-4", "user-tag-access").await;
    assert!(text.contains("Sys.Modify"), "{text}");
    assert!(h.vms_named("perm-4").is_empty(), "no VM made");
    h.stop_controller().await;
}

/// Reading HA rules takes Sys.Audit on `/` (pve-ha-manager src/PVE/API2/HA/Rules.pm, `index`),
/// which a token set up for `ha: {state: …}` alone need not have: its HA VMs are still torn down,
/// the HA resource delete taking the VM out of every rule (`purge` by default,
/// src/PVE/API2/HA/Resources.pm, `delete`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ha_vm_is_torn_down_by_a_token_that_cannot_read_ha_rules() {
    let mut role = readme_role();
    role.push("Sys.Console".into());
    let mut h = Harness::start_with(scenario_with_role(&role), "").await;
    let class = format!("{PINNED_PVE2}ha:\n  state: started\n");
    h.request("perm-ha", "perms", &class);
    h.wait_stage("perm-ha", Stage::Provisioned).await;
    let without_audit: Vec<String> = role.into_iter().filter(|p| p != "Sys.Audit").collect();
    h.pve
        .control(json!({"op": "set_acl", "who": TOKEN_ID, "entries": [["/", without_audit]]}));
    assert!(h.omni.state.teardown(&MACHINE_REQUEST, "perm-ha"));
    h.wait_released("perm-ha").await;
    assert!(h.vms_named("perm-ha").is_empty());
    assert_eq!(h.pve.control(json!({"op": "ha_resources"})), json!([]));
    h.stop_controller().await;
}

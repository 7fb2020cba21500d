//! The provider keeps working after Omni's watch history moved on without it: a watch resumed from
//! a compacted bookmark starts over, requests removed meanwhile lose their VMs, and new requests are
//! provisioned, all without a restart.

use std::time::Duration;

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::{MACHINE_REQUEST, provider_machine};
use testkit::harness::{Harness, PROVIDER, WAIT};

const PINNED_PVE2: &str = "cores: 2\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve2\nip_discovery_timeout: 0\n";

/// Omni's default store is etcd with a few hours of history; a provider whose watch was down longer
/// resumes from a compacted revision, which state-etcd (pkg/state/impl/etcd/etcd.go, watchKind)
/// answers with an ERRORED event on an otherwise healthy stream. The old client resumed from the
/// same bookmark for ever: heartbeats went on and nothing was provisioned or torn down again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_bookmark_relists_cleans_up_and_keeps_provisioning() {
    let mut h = Harness::start("").await;
    h.request("wr-gone", "watch", PINNED_PVE2);
    h.wait_stage("wr-gone", Stage::Provisioned).await;
    let vms = h.vms_named("wr-gone");
    assert_eq!(vms.len(), 1);
    let vmid = vms[0]["vmid"].as_u64().unwrap() as u32;
    // Let the reconciles that our own writes triggered finish, so that nothing but the watch can
    // bring the request back into the queue.
    let mut gets = h.omni.state.calls("/cosi.resource.State/Get");
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = h.omni.state.calls("/cosi.resource.State/Get");
        if now == gets {
            break;
        }
        gets = now;
    }

    // Omni goes away; meanwhile the request is removed by force (finalizer ignored, so no teardown
    // reaches us) and the history is compacted.
    h.omni.stop().await;
    assert!(h.omni.state.remove(&MACHINE_REQUEST, "wr-gone"));
    h.omni.state.compact();
    h.omni.restart().await;

    // The fresh listing no longer shows the request; our provider state does, so the VM goes.
    let cleaned = h
        .omni
        .state
        .wait_for(WAIT, |s| {
            s.get(&provider_machine(PROVIDER), "wr-gone").is_none()
        })
        .await;
    assert!(cleaned, "provider state of the vanished request torn down");
    h.wait_vm_deleted(vmid, Duration::from_secs(10)).await;

    // And the watch is live again: a new request is provisioned.
    h.request("wr-new", "watch", PINNED_PVE2);
    h.wait_stage("wr-new", Stage::Provisioned).await;
    h.stop_controller().await;
}

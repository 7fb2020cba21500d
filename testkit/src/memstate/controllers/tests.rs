//! Omni's controllers in memstate behave as the sources cited in the module documentation say:
//! siderolabs/omni `machine_request_cleanup.go` and `infra_provider_config_patch.go` (and its test
//! `infra_provider_config_patch_test.go`), on cosi-project/runtime's `cleanup.Controller` and
//! `qtransform.QController`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use omni_infra_provider_proxmox::omni::state::Typed;

const DRAIN: Duration = Duration::from_secs(30);
const SOON: Duration = Duration::from_secs(1);

fn status(state: &MemState, id: &str, machine: &str) {
    let mut labels = BTreeMap::new();
    labels.insert(label::INFRA_PROVIDER_ID.to_owned(), "proxmox".to_owned());
    state.put(
        &MACHINE_REQUEST_STATUS,
        id,
        &specs::MachineRequestStatusSpec {
            id: machine.into(),
            ..Default::default()
        },
        labels,
    );
}

fn patch_request(state: &MemState, id: &str, request: &str) {
    let mut labels = BTreeMap::new();
    labels.insert(label::INFRA_PROVIDER_ID.to_owned(), "proxmox".to_owned());
    labels.insert(label::MACHINE_REQUEST.to_owned(), request.to_owned());
    state.put(
        &CONFIG_PATCH_REQUEST,
        id,
        &specs::ConfigPatchSpec {
            data: "machine: {}".into(),
            ..Default::default()
        },
        labels,
    );
}

fn finalizers(state: &MemState, ty: &str, id: &str) -> Vec<String> {
    state
        .get_raw(namespace::INFRA_PROVIDER, ty, id)
        .map(|r| md(&r).finalizers.clone())
        .unwrap_or_default()
}

fn config_patch(state: &MemState, id: &str) -> Option<Typed<specs::ConfigPatchSpec>> {
    state
        .get_raw(namespace::DEFAULT, CONFIG_PATCH_TYPE, id)
        .and_then(|r| Typed::decode(r).ok())
}

fn running(drain: Duration) -> (MemState, ControllersTask) {
    let state = MemState::new();
    let task = state.run_omni_controllers(OmniControllers { drain });
    (state, task)
}

#[tokio::test(start_paused = true)]
async fn the_cleanup_finalizer_holds_a_torn_down_status_for_the_drain_time() {
    let (state, _task) = running(DRAIN);
    status(&state, "r1", "uuid-1");
    let ty = &*MACHINE_REQUEST_STATUS.resource_type;
    assert!(
        state
            .wait_for(SOON, |s| finalizers(s, ty, "r1")
                == [STATUS_CLEANUP_CONTROLLER])
            .await,
        "cleanup.Controller.processInput puts its finalizer on every running input"
    );
    // The finalizer is an Update: the version moved on from the created 1.
    assert_eq!(
        md(&state.get_raw(namespace::INFRA_PROVIDER, ty, "r1").unwrap()).version,
        "2"
    );
    state.teardown(&MACHINE_REQUEST_STATUS, "r1");
    tokio::time::sleep(DRAIN - SOON).await;
    assert_eq!(
        finalizers(&state, ty, "r1"),
        [STATUS_CLEANUP_CONTROLLER],
        "held while the machine leaves its cluster"
    );
    assert!(
        state
            .wait_for(2 * SOON, |s| finalizers(s, ty, "r1").is_empty())
            .await,
        "released once the drain time is over"
    );
    assert_eq!(state.collect_torn_down(&MACHINE_REQUEST_STATUS), 1);
}

#[tokio::test(start_paused = true)]
async fn a_status_without_a_machine_is_released_at_once() {
    let (state, _task) = running(DRAIN);
    status(&state, "r1", "");
    let ty = &*MACHINE_REQUEST_STATUS.resource_type;
    assert!(
        state
            .wait_for(SOON, |s| !finalizers(s, ty, "r1").is_empty())
            .await
    );
    state.teardown(&MACHINE_REQUEST_STATUS, "r1");
    assert!(
        state
            .wait_for(SOON, |s| finalizers(s, ty, "r1").is_empty())
            .await,
        "no ClusterMachine has an empty ID, so the cleanup handlers have nothing to wait for"
    );
}

#[tokio::test(start_paused = true)]
async fn the_config_patch_follows_the_status_id_and_goes_with_the_request() {
    let (state, _task) = running(DRAIN);
    let ty = &*CONFIG_PATCH_REQUEST.resource_type;
    status(&state, "r1", "");
    patch_request(&state, "100-topology-r1", "r1");
    assert!(
        state
            .wait_for(SOON, |s| finalizers(s, ty, "100-topology-r1")
                == [CONFIG_PATCH_CONTROLLER])
            .await
    );
    tokio::time::sleep(SOON).await;
    assert!(
        config_patch(&state, "100-topology-r1").is_none(),
        "the transform fails while the status has no machine UUID"
    );
    status(&state, "r1", "uuid-1");
    assert!(
        state
            .wait_for(SOON, |s| config_patch(s, "100-topology-r1").is_some())
            .await
    );
    let patch = config_patch(&state, "100-topology-r1").unwrap();
    assert_eq!(patch.spec.data, "machine: {}");
    assert_eq!(patch.label(MACHINE_LABEL), Some("uuid-1"));
    assert_eq!(patch.label(SYSTEM_PATCH_LABEL), Some(""));
    assert_eq!(patch.label(label::MACHINE_REQUEST), Some("r1"));
    assert_eq!(patch.label(label::INFRA_PROVIDER_ID), Some("proxmox"));

    state.teardown(&CONFIG_PATCH_REQUEST, "100-topology-r1");
    assert!(
        state
            .wait_for(SOON, |s| finalizers(s, ty, "100-topology-r1").is_empty())
            .await,
        "reconcileTearingDown destroys the output, then removes the finalizer"
    );
    assert!(config_patch(&state, "100-topology-r1").is_none());
}

#[tokio::test(start_paused = true)]
async fn the_config_patch_is_destroyed_when_the_status_goes() {
    let (state, _task) = running(DRAIN);
    status(&state, "r1", "uuid-1");
    patch_request(&state, "p1", "r1");
    assert!(
        state
            .wait_for(SOON, |s| config_patch(s, "p1").is_some())
            .await
    );
    state.remove(&MACHINE_REQUEST_STATUS, "r1");
    assert!(
        state
            .wait_for(SOON, |s| config_patch(s, "p1").is_none())
            .await,
        "a missing status is the transform's DestroyOutputTag"
    );
    assert_eq!(
        finalizers(&state, &CONFIG_PATCH_REQUEST.resource_type, "p1"),
        [CONFIG_PATCH_CONTROLLER],
        "the request itself is still running, so its finalizer stays"
    );
}

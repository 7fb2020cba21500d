//! Tearing a MachineRequest down: the config patches requested for the machine are removed (as the Go
//! library does), then the MachineRequestStatus is torn down and we
//! wait until Omni's own finalizer on it is gone (the machine has left its cluster), then the VM is
//! deprovisioned, then the status and the provider state are destroyed, and last our finalizer leaves
//! the request so Omni can delete it.
//!
//! Different from the Go library, on purpose:
//! - The status is destroyed *after* the VM is gone, not before, so while the VM is being shut down
//!   and deleted Omni still shows what is happening, and why it is stuck if it is (an offline node).
//! - A missing provider state does not stop the teardown forever (docs/omni-protocol.md §3.6): there is
//!   simply no VM to delete.
//! - Deprovision finds the VM where it is now and proves it is ours before touching it
//!   ([`crate::pipeline::deprovision`]); a VMID taken over by someone else's VM is left alone.
//!
//! The same path cleans up provider state whose MachineRequest is gone (docs/omni-protocol.md §3.7): at start
//! every state is reconciled, and one without a request is deprovisioned and destroyed ([`orphan`]).

use std::collections::HashMap;
use std::time::Duration;

use super::context::{Context, Request};
use super::error_policy::{ReconcileError, omni};
use super::outputs::{Hold, OutputOf, PATCH_RELEASE_WAIT, WAIT_FOR_OMNI};
use super::progress::{Phase, StatusSink};
use super::workqueue::Action;
use crate::model::MachineState;
use crate::omni::resources::{CONFIG_PATCH_REQUEST, MACHINE_REQUEST_STATUS, label};
use crate::omni::state::ResourceRef;
use crate::pipeline::deprovision::{
    DeprovisionOptions, DeprovisionTarget, Deprovisioned, deprovision_reporting,
};
use crate::pipeline::ledgers::HA_RULES_LOCK;

/// Cleans up after `request`, which is being torn down (§3.6).
pub async fn cleanup(ctx: &Context, request: &Request) -> Result<Action, ReconcileError> {
    let id = request.id();
    if !request.has_finalizer(&ctx.owner) {
        // Never reconciled by us, or already released: nothing of ours to clean up.
        ctx.forget(id);
        return Ok(Action::Done);
    }
    // A topology round writing this request's patch finishes first; later rounds see the request
    // tearing down and leave its patch alone.
    drop(ctx.topology_writes.lock().await);
    if !remove_config_patches(ctx, id).await? {
        return Ok(Action::RequeueAfter(WAIT_FOR_OMNI));
    }
    let status_ref = ResourceRef::of(&MACHINE_REQUEST_STATUS, id);
    let status_exists = match ctx.outputs.status(id) {
        // Omni still drains the machine; the watch of our outputs says when it lets go.
        Some(Hold::Held) => return Ok(Action::RequeueAfter(WAIT_FOR_OMNI)),
        Some(Hold::Released) => true,
        Some(Hold::Live) | None => match ctx.state.teardown(&status_ref, &ctx.owner).await {
            Ok(true) => true,
            Ok(false) => {
                ctx.outputs.held(OutputOf::Status, id);
                return Ok(Action::RequeueAfter(WAIT_FOR_OMNI));
            }
            Err(e) if e.is_not_found() => false,
            Err(e) => return Err(omni("tearing down the machine request status")(e)),
        },
    };
    remove_vm_and_state(ctx, id, status_exists.then_some(&request.metadata.labels)).await?;
    if status_exists {
        ctx.state
            .destroy(&status_ref, &ctx.owner)
            .await
            .map_err(omni("destroying"))?;
        ctx.outputs.destroyed(OutputOf::Status, id);
    }
    ctx.state
        .remove_finalizer_from(request, &ctx.owner)
        .await
        .or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) })
        .map_err(omni("removing our finalizer from the machine request"))?;
    ctx.torn_down(id);
    ctx.services.metrics.deprovision("success");
    tracing::info!(request = %id, "machine request torn down");
    Ok(Action::Done)
}

/// Removes the config patches requested for this machine request (the official provider made one per
/// request for the hostname in its releases from November 2025 to February 2026), as the Go library
/// does first in its teardown: every ConfigPatchRequest labelled with our provider ID and the request
/// ID is torn down and destroyed. Returns false while Omni still holds a finalizer on one of them.
async fn remove_config_patches(ctx: &Context, id: &str) -> Result<bool, ReconcileError> {
    let patches = match ctx.outputs.patches_of(id) {
        Some(known) => known,
        None => ctx
            .state
            .list(
                &CONFIG_PATCH_REQUEST,
                &[
                    (label::INFRA_PROVIDER_ID, ctx.provider_id()),
                    (label::MACHINE_REQUEST, id),
                ],
            )
            .await
            .map_err(omni("listing the config patch requests of the request"))?
            .iter()
            .map(|patch| (patch.id().to_owned(), Hold::Live))
            .collect(),
    };
    let mut all_gone = true;
    for (patch, hold) in patches {
        let what = ResourceRef::of(&CONFIG_PATCH_REQUEST, &patch);
        let gone = match hold {
            Hold::Held => false,
            Hold::Released => match ctx.state.destroy(&what, &ctx.owner).await {
                Ok(()) => true,
                // A finalizer came back: the watch says when it goes.
                Err(e) if e.is_conflict() => false,
                Err(e) => return Err(omni("removing a config patch request")(e)),
            },
            Hold::Live => ctx
                .state
                .teardown_and_destroy(&what, &ctx.owner, PATCH_RELEASE_WAIT)
                .await
                .map_err(omni("removing a config patch request"))?,
        };
        if gone {
            ctx.outputs.destroyed(OutputOf::PatchRequest, &patch);
        } else {
            ctx.outputs.held(OutputOf::PatchRequest, &patch);
        }
        all_gone &= gone;
    }
    Ok(all_gone)
}

/// Provider state left without a MachineRequest (deleted while we were not running, or forcibly):
/// delete its VM by the same rules, then the state.
pub async fn orphan(ctx: &Context, id: &str) -> Result<Action, ReconcileError> {
    tracing::info!(request = %id, "provider state without a machine request: deleting its VM");
    remove_vm_and_state(ctx, id, None).await?;
    ctx.forget(id);
    Ok(Action::Done)
}

/// Deprovisions the VM recorded in the provider state (if any), then destroys the state.
/// `status_labels`: the status still exists, so progress and errors are written there.
async fn remove_vm_and_state(
    ctx: &Context,
    id: &str,
    status_labels: Option<&HashMap<String, String>>,
) -> Result<(), ReconcileError> {
    // Without a state there is no VM to delete, and no allocation or VMID anything depends on.
    let state = ctx.find_machine(id).await?;
    if let Some(state) = state.map(|machine| MachineState::from_spec(&machine.spec)) {
        // The node the VM was recorded on: a slow node holds up only the teardowns of its own VMs.
        let slot = ctx.lanes.enter(state.node.clone(), || {}).await;
        // On the heap while it runs, as the provisioning steps are: a teardown waiting for a slot
        // weighs little.
        let deprovisioned = Box::pin(deprovision_vm(ctx, id, &state, status_labels)).await;
        drop(slot);
        if let Err(e) = deprovisioned {
            ctx.services.metrics.deprovision("failure");
            if let Some(labels) = status_labels {
                ctx.report_failure(id, labels, &e).await;
            }
            return Err(e);
        }
        // No controller of Omni's puts a finalizer on a provider's own state, and COSI destroys a
        // resource in any phase once no finalizer holds it (cosi-project/runtime
        // `pkg/state/impl/inmem/collection.go` Destroy; siderolabs/omni
        // `internal/backend/runtime/omni/infraprovider/state.go` Destroy adds the provider
        // check): one call. Should something hold it after all, it is torn down and destroyed.
        let machine_ref = ResourceRef::of(ctx.machine_kind(), id);
        match ctx.state.destroy(&machine_ref, &ctx.owner).await {
            Err(e) if e.is_conflict() => {
                ctx.state
                    .teardown(&machine_ref, &ctx.owner)
                    .await
                    .map_err(omni("tearing down the provider state"))?;
                ctx.state
                    .destroy(&machine_ref, &ctx.owner)
                    .await
                    .map_err(omni("destroying"))?;
            }
            destroyed => destroyed.map_err(omni("destroying the provider state"))?,
        }
    }
    // Only now, with the VM deleted and the state that recorded them gone (if there was one), are
    // its static addresses and VMIDs free: a crash before this point leaves them in the state for
    // the next process.
    ctx.services.ledgers.ip.release(id);
    ctx.services.ledgers.vmids.forget_of(id);
    Ok(())
}

async fn deprovision_vm(
    ctx: &Context,
    id: &str,
    state: &MachineState,
    status_labels: Option<&HashMap<String, String>>,
) -> Result<(), ReconcileError> {
    let (services, ledgers) = (&ctx.services, &ctx.services.ledgers);
    let target = target(id, ctx.provider_id(), state);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let progress = move |text: &str| {
        tracing::info!(request = %id, "{text}");
        let _ = tx.send(text.to_owned());
    };
    // The seed ISO delete is sent but not waited for (DeprovisionOptions' default): deleting a file is
    // near instant, the poll would be a seventh request per machine, and an ISO left behind is
    // harmless and listed by `orphans`.
    ledgers.releases.teardown_started(id);
    let options = DeprovisionOptions {
        departing: Some(ledgers.releases.departing()),
        ha_rules_lock: Some(ledgers.locks.exclusive(HA_RULES_LOCK)),
        ..DeprovisionOptions::default()
    };
    let work = async {
        let result = deprovision_reporting(&services.pve, &target, &options, &progress).await;
        drop(progress);
        result
    };
    // Without a status, the texts are only logged.
    let sink = status_labels
        .map(|labels| StatusSink::new(ctx, id, labels.clone(), None, Phase::Deprovisioning));
    let show = async {
        if let Some(sink) = &sink {
            let show = |text: String| async move { sink.show(&text).await };
            show_while_slow(rx, show).await;
        }
    };
    let (result, ()) = tokio::join!(work, show);
    if let Some(pool) = &state.default_pool {
        // Made again on demand if the set comes back.
        ledgers.pools.forget(pool.as_str());
    }
    // A seed ISO that could not be deleted does not hold the teardown (the VM is gone): it is
    // counted and logged, tried again by the housekeeping round for a while, and the `orphans`
    // command lists it once the request is gone.
    let leftover = result.as_ref().ok().map(|d: &Deprovisioned| {
        if d.leftover_seed_iso.is_some() {
            services.metrics.leftover("seed_iso");
        }
        d.leftover_seed_iso.is_some() || d.leftover_pool
    });
    ledgers.releases.teardown_ended(&target, leftover);
    // The deprovision logs what it did with the VM.
    result
        .map(drop)
        .map_err(|e| ReconcileError::Deprovision(Box::new(e)))
}

/// How often at most a deprovision's progress is written to the status.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Shows the latest of `texts` once the work has gone on for [`PROGRESS_EVERY`], then at most once
/// per [`PROGRESS_EVERY`]. A deprovision that ends quickly writes no progress (its status goes right after); one
/// that takes long (a guest that shuts down slowly, an offline node) shows where it is.
async fn show_while_slow<F: Future<Output = ()>>(
    mut texts: tokio::sync::mpsc::UnboundedReceiver<String>,
    mut show: impl FnMut(String) -> F,
) {
    let mut next = tokio::time::Instant::now() + PROGRESS_EVERY;
    let mut pending: Option<String> = None;
    loop {
        tokio::select! {
            text = texts.recv() => match text {
                Some(text) => pending = Some(text),
                None => return,
            },
            () = tokio::time::sleep_until(next), if pending.is_some() => {
                if let Some(text) = pending.take() {
                    show(text).await;
                }
                next = tokio::time::Instant::now() + PROGRESS_EVERY;
            }
        }
    }
}

/// Pure: what the provider state says about the VM (ours, or the Go provider's `vmid` + `node`).
pub fn target(id: &str, provider_id: &str, state: &MachineState) -> DeprovisionTarget {
    DeprovisionTarget {
        request_id: id.to_owned(),
        provider_id: provider_id.to_owned(),
        vmid: state.recorded_vmid(),
        recorded_node: state.node.clone(),
        smbios_uuid: state.uuid.map(|u| u.to_string()),
        seed_iso_volume: state.seed_iso.clone(),
        set_pool: state
            .default_pool
            .clone()
            .or(state.official_pool().cloned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::omni::proto::provider::MachineSpec;
    use crate::proxmox::types::{NodeName, VmId};

    #[tokio::test(start_paused = true)]
    async fn progress_shows_only_while_the_work_is_slow_and_at_most_once_a_second() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let shown = std::sync::Mutex::new(Vec::new());
        let show = |text: String| {
            shown.lock().unwrap().push(text);
            std::future::ready(())
        };
        let work = async {
            tx.send("shutting down".to_owned()).unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            tx.send("deleting".to_owned()).unwrap();
            tokio::time::sleep(Duration::from_millis(1500)).await;
            tx.send("deleting the seed ISO".to_owned()).unwrap();
            tx.send("done".to_owned()).unwrap();
            drop(tx);
        };
        tokio::join!(work, show_while_slow(rx, show));
        assert_eq!(
            *shown.lock().unwrap(),
            ["deleting"],
            "the latest line once slow; nothing after the end"
        );
    }

    #[test]
    fn target_from_go_provider_state() {
        let spec = MachineSpec {
            vmid: 104,
            node: "pve2".into(),
            ..Default::default()
        };
        let t = target("req-1", "proxmox", &MachineState::from_spec(&spec));
        assert_eq!(t.vmid.map(VmId::get), Some(104));
        assert_eq!(t.recorded_node.as_ref().map(NodeName::as_str), Some("pve2"));
        assert!(t.smbios_uuid.is_none() && t.seed_iso_volume.is_none());
        let reserved_only = MachineSpec {
            reserved_vmid: 120,
            ..Default::default()
        };
        assert_eq!(
            target("r", "p", &MachineState::from_spec(&reserved_only))
                .vmid
                .map(VmId::get),
            Some(120)
        );
        assert!(target("r", "p", &MachineState::default()).vmid.is_none());
    }
}

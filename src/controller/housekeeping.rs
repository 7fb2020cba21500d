//! The leader's chores beside the reconciles, one round every `--topology-interval`: the machines'
//! topology labels ([`super::topology::round`]) and what releases left behind ([`remove_late_vms`]).
//! A chore that fails or panics ends its own round only; the next round tries again.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::context::Context;
use super::error_policy::{ReconcileError, omni};
use crate::model::identity;
use crate::omni::resources::MACHINE_REQUEST;
use crate::pipeline::deprovision::{
    DeprovisionError, DeprovisionOptions, DeprovisionOutcome, DeprovisionTarget, Deprovisioned,
    deprovision_reporting,
};
use crate::proxmox::types::VmResource;

/// Runs rounds until `stop`, every `interval`.
pub async fn run(ctx: Arc<Context>, interval: Duration, mut stop: watch::Receiver<bool>) {
    crate::contain::install_hook();
    loop {
        chore(
            "bring the topology labels up to date",
            super::topology::round(&ctx),
        )
        .await;
        chore("remove what a release left behind", remove_late_vms(&ctx)).await;
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = async { stop.wait_for(|s| *s).await.is_ok() } => return,
        }
    }
}

async fn chore<T, E: Display>(what: &str, work: impl Future<Output = Result<T, E>>) {
    match crate::contain::future(work).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot {what}; trying again next round"),
        Err(panic) => tracing::error!("{what}: panicked: {}", panic.message),
    }
}

/// How long after a release a VM of that request is still looked for.
pub const LATE_VM_WINDOW: Duration = Duration::from_secs(15 * 60);

/// Deletes what a release left behind: VMs that appeared for a request after it was released, and
/// a seed ISO or set pool whose delete failed (tried again each round for a while). A create (or
/// clone) whose answer never arrived, because the provider was killed or gave up waiting, can still
/// be applied by Proxmox afterwards: the request's next attempt made its VM at the same VMID
/// meanwhile, and once that VM is deleted and the request released, the late create makes the VM
/// again, which nothing would ever look at. Each round lists the cluster for the requests this
/// process released within [`LATE_VM_WINDOW`] and deletes such a VM with the usual ownership
/// checks (the listing or the description marker must name the request), unless the request is
/// back.
pub async fn remove_late_vms(ctx: &Context) -> Result<(), ReconcileError> {
    let released = ctx.services.ledgers.releases.recent(LATE_VM_WINDOW);
    if released.is_empty() {
        return Ok(());
    }
    let listing = ctx.services.pve.cluster_listing().await.map_err(|source| {
        ReconcileError::Deprovision(Box::new(DeprovisionError::Listing {
            request_id: released
                .iter()
                .map(|(t, _)| t.request_id.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            source,
        }))
    })?;
    for (released, leftover) in released {
        let id = released.request_id.as_str();
        // Tries again to delete the seed ISO or set pool the teardown could not.
        if leftover {
            let done = deprovision_logged(ctx, &released).await?;
            if done.leftover_seed_iso.is_none() && !done.leftover_pool {
                tracing::info!(request = %id, "what the teardown left behind is deleted now");
                ctx.services.ledgers.releases.complete(id);
            }
        }
        // Templates are left out.
        let late: Vec<&VmResource> = listing
            .guests()
            .filter(|vm| {
                vm.name
                    .as_deref()
                    .is_some_and(|n| n.eq_ignore_ascii_case(id))
                    || identity::tagged_request(&vm.tag_list())
                        .is_some_and(|t| t.eq_ignore_ascii_case(id))
            })
            .collect();
        if !late.is_empty() {
            delete_late_vms(ctx, &released, &late).await?;
        }
    }
    Ok(())
}

/// Deletes the VMs of `released` that appeared after its release, unless the request is back.
async fn delete_late_vms(
    ctx: &Context,
    released: &DeprovisionTarget,
    late: &[&VmResource],
) -> Result<(), ReconcileError> {
    let id = released.request_id.as_str();
    let back = ctx
        .state
        .find(&MACHINE_REQUEST, id)
        .await
        .map_err(omni("looking for the released machine request"))?;
    if back.is_some() {
        // The same ID was requested again: its own reconcile adopts or replaces the VM.
        ctx.services.ledgers.releases.forget(id);
        return Ok(());
    }
    for vm in late {
        tracing::warn!(request = %id, vmid = %vm.vmid, node = %vm.node, "a VM of this request appeared after it was released (a create Proxmox applied late); deleting it");
        let target = DeprovisionTarget {
            vmid: Some(vm.vmid),
            recorded_node: Some(vm.node.clone()),
            smbios_uuid: None,
            seed_iso_volume: None,
            ..released.clone()
        };
        let done = deprovision_logged(ctx, &target).await?;
        if let Some(pool) = &target.set_pool {
            ctx.services.ledgers.pools.forget(pool.as_str());
        }
        if let DeprovisionOutcome::NotOurs { vmid, reason } = done.outcome {
            tracing::info!(request = %id, %vmid, %reason, "not this request's VM; left alone");
        }
    }
    Ok(())
}

/// Deprovisions `target`, its progress only logged: no status is left to show it.
async fn deprovision_logged(
    ctx: &Context,
    target: &DeprovisionTarget,
) -> Result<Deprovisioned, ReconcileError> {
    let progress = |text: &str| tracing::info!(request = %target.request_id, "{text}");
    let options = DeprovisionOptions::default();
    deprovision_reporting(&ctx.services.pve, target, &options, &progress)
        .await
        .map_err(|e| ReconcileError::Deprovision(Box::new(e)))
}

//! One reconcile of one request key, dispatched the way kube-runtime's `finalizer()` does: a live
//! request is **applied** ([`provision`]), a request being torn down is **cleaned up**
//! ([`teardown::cleanup`]), and provider state whose request is gone is an **orphan**
//! ([`teardown::orphan`], docs/omni-protocol.md §3.7).

use std::sync::Arc;

use super::context::Context;
use super::error_policy::{ReconcileError, omni};
use super::outputs::OutputOf;
use super::requests::Request;
use super::workqueue::Action;
use super::{provision, teardown};
use crate::contain::Panic;
use crate::omni::resources::{Kind, MACHINE_REQUEST, label};
use crate::omni::state::{StateError, Typed, WatchEvent};
use tokio::sync::mpsc;

/// Keys the watch cannot announce: state left by requests that may be gone (§3.7).
pub async fn dangling_keys(ctx: &Context) -> Vec<String> {
    match ctx.machine_states().await {
        Ok(machines) => machines.into_iter().map(|(id, _)| id).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list provider state; orphaned state is cleaned up when its request is seen");
            Vec::new()
        }
    }
}

/// A reconcile of `id` that panicked, as the failure the error policy sees; shown on the request,
/// when it still exists, like any failure.
pub async fn panicked(ctx: &Context, id: &str, panic: Panic) -> ReconcileError {
    let error = ReconcileError::Panicked(panic);
    match ctx.state.find(&MACHINE_REQUEST, id).await {
        Ok(Some(request)) => {
            ctx.report_failure(id, &super::context::labels(&request), &error)
                .await;
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(request = %id, error = %e, "cannot show the internal error in Omni");
        }
    }
    error
}

/// One event of our MachineRequestStatuses' watch: kept in [`Context::outputs`] and, updated, in
/// the write cache; answers the teardown Omni let go of, if any.
pub fn status_seen(ctx: &Context, event: WatchEvent) -> Option<String> {
    let released = ctx.outputs.observe(OutputOf::Status, &event);
    if let WatchEvent::Updated(status) = event
        && let Ok(status) = Typed::decode(status)
    {
        ctx.statuses.observe(status);
    }
    released
}

/// The resources of `kind` labelled with our provider ID, as they change; dropping the receiver
/// stops the watch.
pub fn watch_ours<S>(
    ctx: &Context,
    kind: &Kind<S>,
) -> mpsc::Receiver<Result<WatchEvent, StateError>> {
    ctx.state
        .watch_kind(kind, &[(label::INFRA_PROVIDER_ID, ctx.provider_id())])
}

/// One reconcile of `id`. `delivered` is the request as the watch last delivered it, if it did
/// since the last relisting; it is the newest version the watch has seen, not necessarily the
/// newest that exists, and the reconcile decides whether that suffices.
pub async fn reconcile(
    ctx: &Context,
    id: &str,
    delivered: Option<Arc<Request>>,
) -> Result<Action, ReconcileError> {
    // Deleted after this process tore it down: nothing is left to look for. A live delivery means
    // the request was made again, and its deletion is then looked into as usual.
    match &delivered {
        None if ctx.take_torn_down(id) => return Ok(Action::Done),
        Some(request) if !request.is_tearing_down() => {
            ctx.take_torn_down(id);
        }
        _ => {}
    }
    let request = match delivered.filter(|r| ctx.is_current(r)) {
        Some(r) => Some(r),
        None => ctx
            .state
            .find(&MACHINE_REQUEST, id)
            .await
            .map_err(omni("reading the machine request"))?
            .map(Arc::new),
    };
    let Some(request) = request else {
        if ctx.find_machine(id).await?.is_some() {
            return teardown::orphan(ctx, id).await;
        }
        ctx.forget(id);
        return Ok(Action::Done);
    };
    if request.label(label::INFRA_PROVIDER_ID) != Some(ctx.provider_id()) {
        return Ok(Action::Done);
    }
    if request.is_tearing_down() {
        teardown::cleanup(ctx, &request).await
    } else {
        provision::apply(ctx, &request).await
    }
}

//! One reconcile of one request key, dispatched the way kube-runtime's `finalizer()` does: a live
//! request is **applied** ([`provision`]), a request being torn down is **cleaned up**
//! ([`teardown::cleanup`]), and provider state whose request is gone is an **orphan**
//! ([`teardown::orphan`], docs/omni-protocol.md §3.7).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::context::Context;
use super::error_policy::{ReconcileError, error_policy, omni};
use super::outputs::OutputOf;
use super::requests::{Request, RequestQueueEvent};
use super::runner::{Action, Reconcile};
use super::{provision, teardown};
use crate::contain::Panic;
use crate::omni::resources::{
    CONFIG_PATCH_REQUEST, Kind, MACHINE_REQUEST, MACHINE_REQUEST_STATUS, label,
};
use crate::omni::state::{StateError, Typed, WatchEvent};
use tokio::sync::mpsc;

impl Reconcile for Context {
    type Error = ReconcileError;

    /// The MachineRequest watch, with [`RequestQueueEvent::Retry`] for the requests waiting on a
    /// full IP pool each time this process frees an address, and for a teardown each time Omni
    /// lets go of what it tore down: our MachineRequestStatuses (its cleanup controller) and
    /// ConfigPatchRequests (its config-patch controller), whose watch keeps [`Context::outputs`] up
    /// to date (docs/omni-protocol.md §3.6) and hands every updated status to the write cache. A
    /// teardown waits for this instead of asking Omni again and again; it only looks again on its
    /// own after [`super::outputs::WAIT_FOR_OMNI`], in case an event was lost. Dropping the
    /// receiver stops the watches.
    fn watch(&self) -> mpsc::Receiver<RequestQueueEvent> {
        let mut requests = watch_ours(self, &MACHINE_REQUEST);
        let mut statuses = watch_ours(self, &MACHINE_REQUEST_STATUS);
        let mut patches = watch_ours(self, &CONFIG_PATCH_REQUEST);
        let (services, outputs) = (self.services.clone(), self.outputs.clone());
        let written = self.statuses.clone();
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            loop {
                let events = tokio::select! {
                    event = requests.recv() => match event {
                        Some(event) => vec![event.into()],
                        None => return,
                    },
                    Some(Ok(event)) = statuses.recv() => {
                        let released = outputs.observe(OutputOf::Status, &event);
                        if let WatchEvent::Updated(status) = event
                            && let Ok(status) = Typed::decode(status)
                        {
                            written.observe(status);
                        }
                        retry(released)
                    }
                    Some(Ok(event)) = patches.recv() => {
                        retry(outputs.observe(OutputOf::PatchRequest, &event))
                    }
                    () = services.ledgers.ip.freed() => retry(services.ledgers.ip.take_waiting()),
                    () = tx.closed() => return,
                };
                for event in events {
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
            }
        });
        rx
    }

    fn dangling_keys(&self) -> BoxFuture<'_, Vec<String>> {
        Box::pin(async move {
            match self.machine_states().await {
                Ok(machines) => machines.into_iter().map(|(id, _)| id).collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list provider state; orphaned state is cleaned up when its request is seen");
                    Vec::new()
                }
            }
        })
    }

    fn reconcile<'a>(
        &'a self,
        id: &'a str,
        delivered: Option<Arc<Request>>,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        Box::pin(reconcile(self, id, delivered))
    }

    /// Shown on the request, when it still exists, like any failure.
    fn panicked<'a>(&'a self, id: &'a str, panic: Panic) -> BoxFuture<'a, ReconcileError> {
        Box::pin(async move {
            let error = ReconcileError::Panicked(panic);
            match self.state.find(&MACHINE_REQUEST, id).await {
                Ok(Some(request)) => {
                    self.report_failure(id, &super::context::labels(&request), &error)
                        .await;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(request = %id, error = %e, "cannot show the internal error in Omni");
                }
            }
            error
        })
    }

    fn error_policy(&self, error: &ReconcileError, attempt: u32) -> Duration {
        error_policy(error, attempt)
    }

    fn queue_depth(&self, depth: usize) {
        self.services
            .metrics
            .requests_in_flight
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }
}

/// The resources of `kind` labelled with our provider ID, as they change.
fn watch_ours<S>(ctx: &Context, kind: &Kind<S>) -> mpsc::Receiver<Result<WatchEvent, StateError>> {
    ctx.state
        .watch_kind(kind, &[(label::INFRA_PROVIDER_ID, ctx.provider_id())])
}

fn retry(ids: impl IntoIterator<Item = String>) -> Vec<RequestQueueEvent> {
    ids.into_iter()
        .map(|id| RequestQueueEvent::Retry { id })
        .collect()
}

async fn reconcile(
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

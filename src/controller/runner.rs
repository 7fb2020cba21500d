//! The controller loop: the MachineRequest watch feeds the [`WorkQueue`], each key taken from it is
//! reconciled in a task of its own (at most [`MAX_IN_FLIGHT`] at once), and the outcome decides when
//! the key comes back.
//!
//! Shaped like kube-runtime's controller: the reconcile returns an [`Action`], failures go through an
//! error policy (its delay grows with the request's consecutive failures, reset on success), and the
//! loop knows nothing about provisioning. Reconciles of different requests run concurrently; one
//! request is never reconciled twice at once (the queue guarantees it).
//!
//! One reconcile of one key is dispatched the way kube-runtime's `finalizer()` does ([`reconcile`]):
//! a live request is **applied** ([`provision`]), a request being torn down is **cleaned up**
//! ([`teardown::cleanup`]), and provider state whose request is gone is an **orphan**
//! ([`teardown::orphan`], docs/omni-protocol.md §3.7).
//!
//! The loop's bound is a memory bound, not the Proxmox one: a reconcile mostly waits (for Proxmox,
//! for Omni, for a slot), and how many may talk to each Proxmox node at once is the reconciler's
//! business ([`super::lanes`]). Were the loop's bound the limit, reconciles waiting on one slow
//! node would take every place and hold up requests that have nothing to do with that node.
//!
//! Like kube-runtime's reflector store, the loop keeps the last version of each request the watch
//! delivered and hands it to the reconcile, which then need not read it again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tracing::Instrument;

use super::context::{Context, Request, version};
use super::error_policy::{ReconcileError, kind, omni, retry_after};
use super::outputs::OutputOf;
use super::workqueue::{Action, WorkQueue};
use super::{provision, teardown};
use crate::contain::{self, Panic};
use crate::omni::resources::{
    CONFIG_PATCH_REQUEST, MACHINE_REQUEST, MACHINE_REQUEST_STATUS, label,
};
use crate::omni::state::{StateError, Typed, WatchEvent};
use crate::pipeline::ledgers::entry;

/// How long workers may finish their current reconcile at shutdown, by default. Everything is
/// resumable, so cutting a reconcile short loses nothing but time.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Reconciles in flight at most, by default: more requests than any Proxmox cluster is asked for at
/// once, each a few KiB while it waits.
const MAX_IN_FLIGHT: usize = 4096;

pub struct Controller {
    queue: Arc<WorkQueue>,
    failures: Mutex<HashMap<String, u32>>,
    /// The last version of each request the watch delivered.
    delivered: Mutex<HashMap<String, Arc<Request>>>,
    shutdown_grace: Duration,
}

impl Controller {
    /// A controller whose reconciles still running at shutdown get `grace` to finish, and are then
    /// cut short (they resume wherever they stopped, in this process or another).
    pub fn with_shutdown_grace(shutdown_grace: Duration) -> Arc<Self> {
        contain::install_hook();
        Arc::new(Self {
            queue: Arc::default(),
            failures: Mutex::default(),
            delivered: Mutex::default(),
            shutdown_grace,
        })
    }

    /// Runs until `stop` turns true. Besides the MachineRequest watch, a request is looked at again
    /// (with a fresh backoff) when this process frees an address of the IP pool it waits on, and a
    /// teardown when Omni lets go of what it tore down: our MachineRequestStatuses (its cleanup
    /// controller) and ConfigPatchRequests (its config-patch controller), whose watch keeps
    /// [`Context::outputs`] up to date (docs/omni-protocol.md §3.6) and hands every updated status
    /// to the write cache. A teardown waits for this instead of asking Omni again and again; it only
    /// looks again on its own after [`super::outputs::WAIT_FOR_OMNI`], in case an event was lost.
    pub async fn run(self: Arc<Self>, ctx: Arc<Context>, mut stop: watch::Receiver<bool>) {
        // Ours: labelled with our provider ID.
        let ours = [(label::INFRA_PROVIDER_ID, ctx.provider_id())];
        let mut requests = ctx.state.watch_kind(&MACHINE_REQUEST, &ours);
        let mut statuses = ctx.state.watch_kind(&MACHINE_REQUEST_STATUS, &ours);
        let mut patches = ctx.state.watch_kind(&CONFIG_PATCH_REQUEST, &ours);
        let ip = &ctx.services.ledgers.ip;
        // Set at start and by a Resync, cleared by the Bootstrapped that completes the listing: then
        // the provider states whose requests the listing did not deliver are looked at.
        let mut relisting = true;
        let dispatcher = tokio::spawn(self.clone().dispatch(ctx.clone()));
        loop {
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        break;
                    }
                }
                event = requests.recv() => match event {
                    Some(event) => {
                        if self.on_event(event, &mut relisting) {
                            self.enqueue_dangling(dangling_keys(&ctx).await);
                        }
                    }
                    None => break,
                },
                // Kept in the outputs and, updated, in the write cache.
                Some(Ok(event)) = statuses.recv() => {
                    self.retry(ctx.outputs.observe(OutputOf::Status, &event));
                    if let WatchEvent::Updated(status) = event
                        && let Ok(status) = Typed::decode(status)
                    {
                        ctx.statuses.observe(status);
                    }
                }
                Some(Ok(event)) = patches.recv() => {
                    self.retry(ctx.outputs.observe(OutputOf::PatchRequest, &event));
                }
                () = ip.freed() => self.retry(ip.take_waiting()),
            }
        }
        drop((requests, statuses, patches));
        self.queue.close();
        let Ok(mut running) = dispatcher.await else {
            return;
        };
        let all = async { while running.join_next().await.is_some() {} };
        if tokio::time::timeout(self.shutdown_grace, all)
            .await
            .is_err()
        {
            tracing::warn!(
                "reconciles still running at shutdown were cut short; they resume at the next start"
            );
        }
    }

    /// Takes keys from the queue as they come due and reconciles each in a task of its own, at most
    /// [`MAX_IN_FLIGHT`] at once; once the queue is closed, hands back the reconciles still running.
    async fn dispatch(self: Arc<Self>, ctx: Arc<Context>) -> tokio::task::JoinSet<()> {
        let places = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
        let mut running = tokio::task::JoinSet::new();
        loop {
            let Ok(place) = places.clone().acquire_owned().await else {
                break;
            };
            let Some(id) = self.queue.next().await else {
                break;
            };
            let (me, ctx) = (self.clone(), ctx.clone());
            running.spawn(async move {
                me.reconcile_one(&ctx, id).await;
                drop(place);
            });
            // Finished reconciles are collected as we go, so the set holds only running ones.
            while running.try_join_next().is_some() {}
        }
        running
    }

    /// Run once the watch has listed every request, at start and after every re-bootstrap: a request
    /// removed by force in the gap has no Destroyed event to announce it, only its provider state is
    /// left to tell. The keys the listing delivered are queued already; queued again, a request
    /// reconciled meanwhile would be reconciled twice, and after a restart with a thousand machines
    /// that is a thousand reconciles more.
    fn enqueue_dangling(&self, dangling: Vec<String>) {
        for id in dangling {
            if !entry(&self.delivered).contains_key(&id) {
                self.queue.add(id);
            }
        }
    }

    /// Takes one event of the MachineRequest watch; true when the listing is complete and the
    /// provider states must be looked at for requests that are gone.
    fn on_event(&self, event: Result<WatchEvent, StateError>, relisting: &mut bool) -> bool {
        match event {
            Ok(WatchEvent::Created(r) | WatchEvent::Updated(r)) => match Typed::decode(r) {
                Ok(r) => {
                    let id = r.id().to_owned();
                    self.remember(Arc::new(r));
                    self.queue.add(id);
                }
                Err(e) => tracing::error!(error = %e, "machine request watch"),
            },
            // Normally our finalizer kept it until we cleaned up; if it was removed by force, the
            // reconcile finds the provider state without a request and deletes the VM.
            Ok(WatchEvent::Destroyed(r)) => {
                let id = r.metadata.map(|m| m.id).unwrap_or_default();
                entry(&self.delivered).remove(&id);
                self.retry([id]);
            }
            // Every request of the listing came as `Created` and is queued already.
            Ok(WatchEvent::Bootstrapped) if std::mem::take(relisting) => {
                tracing::info!(
                    "machine requests listed; checking provider state for requests that are gone"
                );
                return true;
            }
            Ok(WatchEvent::Bootstrapped) => tracing::debug!("machine requests listed"),
            Ok(WatchEvent::Resync) => {
                tracing::info!("machine request watch re-established; relisting");
                // What was delivered before may have been deleted in the gap without an event: until
                // the listing delivers a request again, reconciles read it from Omni.
                entry(&self.delivered).clear();
                *relisting = true;
            }
            Err(e) => tracing::error!(error = %e, "machine request watch"),
        }
        false
    }

    /// Something may let these requests go on (this process freed what they wait on, or the
    /// request is gone): look again now, with a fresh backoff.
    fn retry(&self, ids: impl IntoIterator<Item = String>) {
        for id in ids {
            entry(&self.failures).remove(&id);
            self.queue.add(id);
        }
    }

    /// Keeps `request` unless a newer version was delivered already (a relisting racing an update).
    fn remember(&self, request: Arc<Request>) {
        let mut delivered = entry(&self.delivered);
        let newer_known = delivered
            .get(request.id())
            .is_some_and(|known| version(known) > version(&request));
        if !newer_known {
            delivered.insert(request.id().to_owned(), request);
        }
    }

    async fn reconcile_one(&self, ctx: &Context, id: String) {
        let depth = || {
            let depth = i64::try_from(self.queue.len()).unwrap_or(i64::MAX);
            ctx.services.metrics.requests_in_flight.set(depth);
        };
        depth();
        let span = tracing::info_span!("reconcile", request = %id);
        let delivered = entry(&self.delivered).get(&id).cloned();
        // Boxed because a reconcile is the provider's largest future and a thousand may be in
        // flight: moved by value into `contained`, its state would be laid out again in each
        // wrapper around it, and every task would carry that size for as long as it waits.
        let reconcile = Box::pin(reconcile(ctx, &id, delivered).instrument(span));
        let result = contained(&id, reconcile, |panic| panicked(ctx, &id, panic)).await;
        self.settle(id, result);
        depth();
    }

    /// Hands the key back to the queue after a reconcile, due again as `result` says.
    fn settle(&self, id: String, result: Result<Action, ReconcileError>) {
        match result {
            Ok(action) => {
                entry(&self.failures).remove(&id);
                if let Action::RequeueAfter(d) = action {
                    self.queue.add_after(id.clone(), d);
                }
            }
            Err(e) => {
                // This failure's number in the request's run of consecutive failures.
                let failures = *entry(&self.failures)
                    .entry(id.clone())
                    .and_modify(|n| *n = n.saturating_add(1))
                    .or_insert(1);
                let delay = retry_after(kind(&e), failures);
                tracing::warn!(request = %id, error = %e, retry_in = ?delay, "reconcile failed");
                self.queue.add_after(id.clone(), delay);
            }
        }
        self.queue.done(&id);
    }
}

/// Awaits `reconcile`, a panic in it contained and turned by `panicked` into the failure it is (shown
/// on the request), so that the key is handed back to the queue like any failure: otherwise the
/// queue would hold it as in progress for ever.
async fn contained<P: Future<Output = ReconcileError>>(
    id: &str,
    reconcile: impl Future<Output = Result<Action, ReconcileError>>,
    panicked: impl FnOnce(Panic) -> P,
) -> Result<Action, ReconcileError> {
    match contain::future(reconcile).await {
        Ok(result) => result,
        Err(panic) => {
            tracing::error!(request = %id, "reconcile panicked: {}", panic.message);
            Err(panicked(panic).await)
        }
    }
}

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
            ctx.report_failure(id, &request.metadata.labels, &error)
                .await;
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(request = %id, error = %e, "cannot show the internal error in Omni");
        }
    }
    error
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::omni::proto::cosi::resource as pb;

    fn resource(id: &str, version: &str) -> pb::Resource {
        let metadata = pb::Metadata {
            id: id.into(),
            version: version.into(),
            ..Default::default()
        };
        pb::Resource {
            metadata: Some(metadata),
            ..Default::default()
        }
    }

    fn created(id: &str, version: &str) -> Result<WatchEvent, StateError> {
        Ok(WatchEvent::Created(resource(id, version)))
    }

    fn handed_over(c: &Controller, id: &str) -> Option<String> {
        let delivered = entry(&c.delivered).get(id).cloned();
        delivered.map(|r| r.metadata.version.clone())
    }

    fn failures(c: &Controller, id: &str) -> Option<u32> {
        entry(&c.failures).get(id).copied()
    }

    /// The next key due; `None` if none comes within ten (paused) minutes.
    async fn next(c: &Controller) -> Option<String> {
        let next = tokio::time::timeout(Duration::from_secs(600), c.queue.next());
        next.await.ok().flatten()
    }

    fn failed() -> Result<Action, ReconcileError> {
        Err(ReconcileError::Panicked(Panic {
            message: "no".into(),
        }))
    }

    #[tokio::test(start_paused = true)]
    async fn the_delivered_request_is_handed_over_and_failures_are_counted() {
        let c = Controller::with_shutdown_grace(SHUTDOWN_GRACE);
        // A relisting's older copy arriving after a newer one does not replace it.
        c.remember(Arc::new(Typed::decode(resource("req-1", "3")).unwrap()));
        let mut relisting = true;
        assert!(!c.on_event(created("req-1", "2"), &mut relisting));
        assert_eq!(handed_over(&c, "req-1").as_deref(), Some("3"));
        assert!(c.on_event(Ok(WatchEvent::Bootstrapped), &mut relisting));
        assert!(!c.on_event(Ok(WatchEvent::Bootstrapped), &mut relisting));
        for attempt in 1..=2 {
            let id = next(&c).await.unwrap();
            c.settle(id, failed());
            assert_eq!(failures(&c, "req-1"), Some(attempt));
        }
        let id = next(&c).await.unwrap();
        c.settle(id, Ok(Action::Done));
        assert_eq!(failures(&c, "req-1"), None, "reset on success");
        // After a re-established watch, only what the listing delivers again is handed over.
        assert!(!c.on_event(Ok(WatchEvent::Resync), &mut relisting));
        assert_eq!(handed_over(&c, "req-1"), None);
        assert!(c.on_event(Ok(WatchEvent::Bootstrapped), &mut relisting));
    }

    /// At a restart every request comes twice to the loop's attention: the watch lists it, and its
    /// provider state lists it as possibly dangling. Queued by the listing and reconciled, it must
    /// not be queued again by the provider states (it was, when those were queued at start:
    /// a request still being reconciled when its listing arrived was reconciled twice).
    #[tokio::test(start_paused = true)]
    async fn a_request_the_listing_delivered_is_not_queued_again_as_dangling() {
        let c = Controller::with_shutdown_grace(SHUTDOWN_GRACE);
        let mut relisting = true;
        c.on_event(created("req-1", "1"), &mut relisting);
        assert!(c.on_event(Ok(WatchEvent::Bootstrapped), &mut relisting));
        let id = next(&c).await.unwrap();
        c.enqueue_dangling(vec!["req-1".to_owned(), "gone".to_owned()]);
        c.settle(id, Ok(Action::Done));
        assert_eq!(
            c.queue.len(),
            1,
            "the dangling state is looked at, req-1 not again"
        );
        assert_eq!(next(&c).await.as_deref(), Some("gone"));
    }

    /// A reconcile that panics is a failure of that request: reported once, retried, and the loop
    /// goes on with every other request. Uncontained, the key stayed "in progress" for ever.
    #[tokio::test(start_paused = true)]
    async fn a_panicking_reconcile_is_a_failure_of_its_request_and_the_loop_goes_on() {
        contain::install_hook();
        let c = Controller::with_shutdown_grace(SHUTDOWN_GRACE);
        let mut relisting = true;
        c.on_event(created("req-1", "1"), &mut relisting);
        let id = next(&c).await.unwrap();
        let panics = Mutex::new(Vec::new());
        let reconcile = async {
            tokio::task::yield_now().await;
            panic!("selector parser blew up on req-1")
        };
        let result = contained(&id, reconcile, |panic: Panic| {
            entry(&panics).push(panic.message.clone());
            async { ReconcileError::Panicked(panic) }
        })
        .await;
        let panics = panics.into_inner().unwrap();
        assert_eq!(panics.len(), 1, "reported once: {panics:?}");
        assert!(
            panics[0].contains("selector parser blew up on req-1"),
            "{panics:?}"
        );
        assert!(
            matches!(result, Err(ReconcileError::Panicked(_))),
            "{result:?}"
        );
        c.settle(id, result);
        assert_eq!(failures(&c, "req-1"), Some(1));
        c.on_event(created("req-2", "1"), &mut relisting);
        assert_eq!(next(&c).await.as_deref(), Some("req-2"), "the loop goes on");
        assert_eq!(next(&c).await.as_deref(), Some("req-1"), "retried");
    }
}

//! The controller loop: the MachineRequest watch feeds the [`WorkQueue`], each key taken from it is
//! reconciled in a task of its own (at most `max_in_flight` at once), and the outcome decides when
//! the key comes back.
//!
//! Shaped like kube-runtime's controller: the reconcile returns an [`Action`], failures go through an
//! error policy (its delay grows with the request's consecutive failures, reset on success), and the
//! loop knows nothing about provisioning: what a key means is the [`Reconcile`] implementation's
//! business. Reconciles of different requests run concurrently; one request is never reconciled twice
//! at once (the queue guarantees it).
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

use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use super::context::version;
use super::requests::{Request, RequestQueueEvent};
use super::workqueue::WorkQueue;
use crate::contain::{self, Panic};
use crate::pipeline::ledgers::entry;

/// How long workers may finish their current reconcile at shutdown, by default. Everything is
/// resumable, so cutting a reconcile short loses nothing but time.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What the work queue should do with the request after a reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing more until the request changes.
    Done,
    /// Look again after this long.
    RequeueAfter(Duration),
}

/// What the loop needs from the controller it drives.
pub trait Reconcile: Send + Sync + 'static {
    type Error: std::fmt::Display + Send;

    /// The requests to reconcile, as they change.
    fn watch(&self) -> mpsc::Receiver<RequestQueueEvent>;

    /// Keys the watch cannot announce: state left by requests that may be gone (§3.7).
    fn dangling_keys(&self) -> BoxFuture<'_, Vec<String>>;

    /// One reconcile of `id`. `delivered` is the request as the watch last delivered it, if it did
    /// since the last relisting; it is the newest version the watch has seen, not necessarily the
    /// newest that exists, and the reconcile decides whether that suffices.
    fn reconcile<'a>(
        &'a self,
        id: &'a str,
        delivered: Option<Arc<Request>>,
    ) -> BoxFuture<'a, Result<Action, Self::Error>>;

    /// A reconcile of `id` that panicked, as the failure the error policy sees; the implementation
    /// shows it on the request.
    fn panicked<'a>(&'a self, id: &'a str, panic: Panic) -> BoxFuture<'a, Self::Error>;

    /// When to try again after `error`, the `attempt`-th failure in a row (1 = the first).
    fn error_policy(&self, error: &Self::Error, attempt: u32) -> Duration;

    /// The number of keys waiting or being worked on, for the metrics.
    fn queue_depth(&self, _depth: usize) {}
}

/// Reconciles in flight at most, by default: more requests than any Proxmox cluster is asked for at
/// once, each a few KiB while it waits.
pub const MAX_IN_FLIGHT: usize = 4096;

pub struct Controller<R: Reconcile> {
    reconciler: Arc<R>,
    queue: Arc<WorkQueue<String>>,
    failures: Mutex<HashMap<String, u32>>,
    /// The last version of each request the watch delivered.
    delivered: Mutex<HashMap<String, Arc<Request>>>,
    max_in_flight: usize,
    shutdown_grace: Duration,
}

impl<R: Reconcile> Controller<R> {
    /// A controller whose reconciles still running at shutdown get `grace` to finish, and are then
    /// cut short (they resume wherever they stopped, in this process or another).
    pub fn with_shutdown_grace(
        reconciler: Arc<R>,
        max_in_flight: usize,
        shutdown_grace: Duration,
    ) -> Arc<Self> {
        contain::install_hook();
        Arc::new(Self {
            reconciler,
            queue: Arc::new(WorkQueue::new()),
            failures: Mutex::new(HashMap::new()),
            delivered: Mutex::new(HashMap::new()),
            max_in_flight: max_in_flight.max(1),
            shutdown_grace,
        })
    }

    /// Runs until `stop` turns true.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut events = self.reconciler.watch();
        // Set at start and by a Resync, cleared by the Synced that completes the listing: then the
        // provider states whose requests the listing did not deliver are looked at.
        let mut relisting = true;
        let dispatcher = tokio::spawn(self.clone().dispatch());
        loop {
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        break;
                    }
                }
                ev = events.recv() => match ev {
                    Some(ev) => self.on_event(ev, &mut relisting).await,
                    None => break,
                },
            }
        }
        drop(events);
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
    /// `max_in_flight` at once; once the queue is closed, hands back the reconciles still running.
    async fn dispatch(self: Arc<Self>) -> tokio::task::JoinSet<()> {
        let places = Arc::new(tokio::sync::Semaphore::new(self.max_in_flight));
        let mut running = tokio::task::JoinSet::new();
        loop {
            let Ok(place) = places.clone().acquire_owned().await else {
                break;
            };
            let Some(id) = self.queue.next().await else {
                break;
            };
            let me = self.clone();
            running.spawn(async move {
                me.reconcile_one(id).await;
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
    async fn enqueue_dangling(&self) {
        for id in self.reconciler.dangling_keys().await {
            if !entry(&self.delivered).contains_key(&id) {
                self.queue.add(id);
            }
        }
    }

    async fn on_event(&self, ev: RequestQueueEvent, relisting: &mut bool) {
        match ev {
            RequestQueueEvent::Changed(r) => {
                let id = r.id().to_owned();
                self.remember(Arc::from(r));
                self.queue.add(id);
            }
            // Normally our finalizer kept it until we cleaned up; if it was removed by force, the
            // reconcile finds the provider state without a request and deletes the VM.
            RequestQueueEvent::Destroyed { id } => {
                entry(&self.delivered).remove(&id);
                self.reset(&id);
                self.queue.add(id);
            }
            // Every request of the listing came as `Changed` and is queued already.
            RequestQueueEvent::Synced if std::mem::take(relisting) => {
                tracing::info!(
                    "machine requests listed; checking provider state for requests that are gone"
                );
                self.enqueue_dangling().await;
            }
            RequestQueueEvent::Synced => tracing::debug!("machine requests listed"),
            RequestQueueEvent::Resync => {
                tracing::info!("machine request watch re-established; relisting");
                // What was delivered before may have been deleted in the gap without an event: until
                // the listing delivers a request again, reconciles read it from Omni.
                entry(&self.delivered).clear();
                *relisting = true;
            }
            RequestQueueEvent::Error(e) => tracing::error!(error = %e, "machine request watch"),
            RequestQueueEvent::Retry { id } => {
                self.reset(&id);
                self.queue.add(id);
            }
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

    async fn reconcile_one(&self, id: String) {
        let depth = || self.reconciler.queue_depth(self.queue.len());
        depth();
        let span = tracing::info_span!("reconcile", request = %id);
        let delivered = entry(&self.delivered).get(&id).cloned();
        // A panic is contained here, so that the key is handed back to the queue like any failure:
        // otherwise the queue would hold it as in progress for ever.
        let result =
            match contain::future(self.reconciler.reconcile(&id, delivered).instrument(span)).await
            {
                Ok(result) => result,
                Err(panic) => {
                    tracing::error!(request = %id, "reconcile panicked: {}", panic.message);
                    Err(self.reconciler.panicked(&id, panic).await)
                }
            };
        match result {
            Ok(Action::Done) => self.reset(&id),
            Ok(Action::RequeueAfter(d)) => {
                self.reset(&id);
                self.queue.add_after(id.clone(), d);
            }
            Err(e) => {
                let delay = self.reconciler.error_policy(&e, self.count_failure(&id));
                tracing::warn!(request = %id, error = %e, retry_in = ?delay, "reconcile failed");
                self.queue.add_after(id.clone(), delay);
            }
        }
        self.queue.done(&id);
        depth();
    }

    fn reset(&self, id: &str) {
        entry(&self.failures).remove(id);
    }

    /// This failure's number in the request's run of consecutive failures (1 = the first).
    fn count_failure(&self, id: &str) -> u32 {
        let mut failures = entry(&self.failures);
        let n = failures.entry(id.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::omni::proto::specs::MachineRequestSpec;
    use crate::omni::resources::MACHINE_REQUEST;
    use crate::omni::state::Typed;

    /// Fails every reconcile, recording what it was handed and the attempts the policy saw.
    #[derive(Default)]
    struct Recorder {
        events: Mutex<Option<mpsc::Receiver<RequestQueueEvent>>>,
        seen: Mutex<Vec<(String, Option<String>)>>,
        attempts: Mutex<Vec<u32>>,
        /// Provider states left, as `dangling_keys` answers (default: one, "dangling").
        dangling: Option<Vec<String>>,
        /// Reconciles succeed after this long instead of failing at once.
        succeed_after: Option<Duration>,
        /// The first reconcile of each key panics.
        panic_first: bool,
        /// What `panicked` was told.
        panics: Mutex<Vec<(String, String)>>,
    }

    impl Reconcile for Recorder {
        type Error = String;

        fn watch(&self) -> mpsc::Receiver<RequestQueueEvent> {
            let taken = self.events.lock().unwrap().take();
            taken.unwrap_or_else(|| mpsc::channel(1).1)
        }

        fn dangling_keys(&self) -> BoxFuture<'_, Vec<String>> {
            let keys = self
                .dangling
                .clone()
                .unwrap_or_else(|| vec!["dangling".to_owned()]);
            Box::pin(async move { keys })
        }

        fn reconcile<'a>(
            &'a self,
            id: &'a str,
            delivered: Option<Arc<Request>>,
        ) -> BoxFuture<'a, Result<Action, String>> {
            let version = delivered.map(|r| r.metadata.version.clone());
            let first = {
                let mut seen = self.seen.lock().unwrap();
                let first = !seen.iter().any(|(k, _)| k == id);
                seen.push((id.to_owned(), version));
                first
            };
            let succeed_after = self.succeed_after;
            let panics = self.panic_first && first;
            Box::pin(async move {
                tokio::task::yield_now().await;
                if panics {
                    panic!("selector parser blew up on {id}");
                }
                match succeed_after {
                    Some(after) => {
                        tokio::time::sleep(after).await;
                        Ok(Action::Done)
                    }
                    None => Err("no".to_owned()),
                }
            })
        }

        fn panicked<'a>(&'a self, id: &'a str, panic: Panic) -> BoxFuture<'a, String> {
            self.panics
                .lock()
                .unwrap()
                .push((id.to_owned(), panic.message.clone()));
            Box::pin(async move { panic.to_string() })
        }

        fn error_policy(&self, _: &String, attempt: u32) -> Duration {
            self.attempts.lock().unwrap().push(attempt);
            Duration::from_millis(10)
        }
    }

    fn request(version: &str) -> Box<Request> {
        let mut r = Typed::fresh(&MACHINE_REQUEST, "req-1", MachineRequestSpec::default());
        r.metadata.version = version.into();
        Box::new(r)
    }

    #[tokio::test]
    async fn the_delivered_request_is_handed_over_and_failures_are_counted() {
        let (tx, rx) = mpsc::channel(8);
        let recorder = Arc::new(Recorder {
            events: Mutex::new(Some(rx)),
            ..Default::default()
        });
        let controller = Controller::with_shutdown_grace(recorder.clone(), 1, SHUTDOWN_GRACE);
        // A relisting's older copy arriving after a newer one does not replace it.
        controller.remember(Arc::from(request("3")));
        controller.remember(Arc::from(request("2")));
        let (stop_tx, stop) = watch::channel(false);
        let running = tokio::spawn(controller.clone().run(stop));
        tx.send(RequestQueueEvent::Changed(request("1")))
            .await
            .unwrap();
        tx.send(RequestQueueEvent::Synced).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = stop_tx.send(true);
        running.await.unwrap();
        let seen = recorder.seen.lock().unwrap().clone();
        assert!(seen.contains(&("dangling".to_owned(), None)), "{seen:?}");
        let versions: Vec<_> = seen.iter().filter(|(id, _)| id == "req-1").collect();
        assert!(versions.len() >= 2, "retried: {seen:?}");
        assert!(
            versions.iter().all(|(_, v)| v.as_deref() == Some("3")),
            "{seen:?}"
        );
        let attempts = recorder.attempts.lock().unwrap().clone();
        assert!(attempts.contains(&2), "{attempts:?}");
    }

    /// At a restart every request comes twice to the loop's attention: the watch lists it, and its
    /// provider state lists it as possibly dangling. Queued by the listing and reconciled, it must
    /// not be queued again by the provider states (it was, when those were queued at start:
    /// a request still being reconciled when its listing arrived was reconciled twice).
    #[tokio::test]
    async fn a_request_the_listing_delivered_is_not_queued_again_as_dangling() {
        let (tx, rx) = mpsc::channel(8);
        let recorder = Arc::new(Recorder {
            events: Mutex::new(Some(rx)),
            dangling: Some(vec!["req-1".to_owned(), "gone".to_owned()]),
            succeed_after: Some(Duration::from_millis(50)),
            ..Default::default()
        });
        let controller = Controller::with_shutdown_grace(recorder.clone(), 8, SHUTDOWN_GRACE);
        let (stop_tx, stop) = watch::channel(false);
        let running = tokio::spawn(controller.clone().run(stop));
        tokio::time::sleep(Duration::from_millis(20)).await;
        tx.send(RequestQueueEvent::Changed(request("1")))
            .await
            .unwrap();
        tx.send(RequestQueueEvent::Synced).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = stop_tx.send(true);
        running.await.unwrap();
        let seen = recorder.seen.lock().unwrap().clone();
        let times = |id: &str| seen.iter().filter(|(k, _)| k == id).count();
        assert_eq!(times("req-1"), 1, "{seen:?}");
        assert_eq!(
            times("gone"),
            1,
            "the dangling state is looked at: {seen:?}"
        );
    }

    /// A reconcile that panics is a failure of that request: reported once, retried, and the
    /// loop goes on with every other request. Uncontained, the key stayed "in progress" for ever.
    #[tokio::test]
    async fn a_panicking_reconcile_is_a_failure_of_its_request_and_the_loop_goes_on() {
        let (tx, rx) = mpsc::channel(8);
        let recorder = Arc::new(Recorder {
            events: Mutex::new(Some(rx)),
            dangling: Some(Vec::new()),
            succeed_after: Some(Duration::from_millis(1)),
            panic_first: true,
            ..Default::default()
        });
        let controller = Controller::with_shutdown_grace(recorder.clone(), 8, SHUTDOWN_GRACE);
        let (stop_tx, stop) = watch::channel(false);
        let running = tokio::spawn(controller.clone().run(stop));
        tx.send(RequestQueueEvent::Changed(request("1")))
            .await
            .unwrap();
        tx.send(RequestQueueEvent::Synced).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut other = request("1");
        other.metadata.id = "req-2".into();
        tx.send(RequestQueueEvent::Changed(other)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = stop_tx.send(true);
        running.await.unwrap();
        let seen = recorder.seen.lock().unwrap().clone();
        let times = |id: &str| seen.iter().filter(|(k, _)| k == id).count();
        assert_eq!(times("req-1"), 2, "retried after its panic: {seen:?}");
        assert_eq!(times("req-2"), 2, "the loop goes on: {seen:?}");
        let panics = recorder.panics.lock().unwrap().clone();
        assert_eq!(panics.len(), 2, "{panics:?}");
        assert!(
            panics[0].1.contains("selector parser blew up on req-1"),
            "{panics:?}"
        );
        assert_eq!(recorder.attempts.lock().unwrap().clone(), vec![1, 1]);
    }
}

//! The controller loop: the MachineRequest watch feeds the [`WorkQueue`], `concurrency` workers take
//! keys from it and reconcile them, and the outcome decides when the key comes back.
//!
//! Shaped like kube-runtime's controller: the reconcile returns an [`Action`], failures go through an
//! error policy (exponential backoff per request, reset on success), and the loop itself knows nothing
//! about provisioning. Reconciles of different requests run concurrently; one request is never
//! reconciled twice at once (the queue guarantees it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tracing::Instrument;

use super::error_policy::error_policy;
use super::provision::{Action, Provisioner};
use super::requests::{self, RequestQueueEvent};
use super::workqueue::WorkQueue;
use crate::omni::resources::ProviderMachine;

/// How long workers may finish their current reconcile at shutdown. Everything is resumable, so
/// cutting a reconcile short loses nothing but time.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

pub struct Controller {
    provisioner: Arc<Provisioner>,
    queue: Arc<WorkQueue<String>>,
    failures: Mutex<HashMap<String, u32>>,
    concurrency: usize,
}

impl Controller {
    pub fn new(provisioner: Arc<Provisioner>, concurrency: usize) -> Arc<Self> {
        Arc::new(Self {
            provisioner,
            queue: Arc::new(WorkQueue::new()),
            failures: Mutex::new(HashMap::new()),
            concurrency: concurrency.max(1),
        })
    }

    /// Runs until `stop` turns true.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut events = requests::watch(
            &self.provisioner.state,
            &self.provisioner.services.provider_id,
        );
        self.enqueue_existing_state().await;
        // Set by a Resync, cleared by the Synced that completes the fresh listing.
        let mut relisting = false;
        let workers: Vec<_> = (0..self.concurrency)
            .map(|n| {
                let me = self.clone();
                tokio::spawn(async move { me.worker(n).await })
            })
            .collect();
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
        let all = futures_util::future::join_all(workers);
        if tokio::time::timeout(SHUTDOWN_GRACE, all).await.is_err() {
            tracing::warn!(
                "reconciles still running at shutdown were cut short; they resume at the next start"
            );
        }
    }

    /// Provider state whose request may be gone (deleted while we were not running or while the
    /// watch was down) gets a reconcile too; requests themselves arrive through the watch. Run at
    /// start and after every re-bootstrap of the watch: a request removed by force in the gap has
    /// no Destroyed event to announce it, only its provider state is left to tell.
    async fn enqueue_existing_state(&self) {
        let kind = ProviderMachine::new(&self.provisioner.services.provider_id);
        match self.provisioner.state.list(&kind, vec![]).await {
            Ok(machines) => {
                for m in machines {
                    self.queue.add(m.id().to_owned());
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot list provider state at start; orphaned state is cleaned up when its request is seen")
            }
        }
    }

    async fn on_event(&self, ev: RequestQueueEvent, relisting: &mut bool) {
        match ev {
            RequestQueueEvent::Changed(r) => self.queue.add(r.id().to_owned()),
            // Normally our finalizer kept it until we cleaned up; if it was removed by force, the
            // reconcile finds the provider state without a request and deletes the VM.
            RequestQueueEvent::Destroyed { id } => {
                self.reset(&id);
                self.queue.add(id);
            }
            // Every request of the listing came as `Changed` and is queued already.
            RequestQueueEvent::Synced if std::mem::take(relisting) => {
                tracing::info!(
                    "machine requests listed again; checking provider state for requests that vanished meanwhile"
                );
                self.enqueue_existing_state().await;
            }
            RequestQueueEvent::Synced => tracing::debug!("machine requests listed"),
            RequestQueueEvent::Resync => {
                tracing::info!("machine request watch re-established; relisting");
                *relisting = true;
            }
            RequestQueueEvent::Error(e) => tracing::error!(error = %e, "machine request watch"),
        }
    }

    async fn worker(self: Arc<Self>, n: usize) {
        while let Some(id) = self.queue.next().await {
            self.gauge();
            let span = tracing::info_span!("reconcile", request = %id, worker = n);
            let result = self.provisioner.reconcile(&id).instrument(span).await;
            match result {
                Ok(Action::Done) => self.reset(&id),
                Ok(Action::RequeueAfter(d)) => {
                    self.reset(&id);
                    self.queue.add_after(id.clone(), d);
                }
                Err(e) => {
                    let verdict = error_policy(&e, self.count_failure(&id));
                    let delay = verdict.retry_after;
                    tracing::warn!(request = %id, error = %e, kind = ?verdict.kind, retry_in = ?delay, "reconcile failed");
                    self.queue.add_after(id.clone(), delay);
                }
            }
            self.queue.done(&id);
            self.gauge();
        }
    }

    fn gauge(&self) {
        self.provisioner
            .services
            .metrics
            .requests_in_flight
            .set(self.queue.len() as i64);
    }

    fn reset(&self, id: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// This failure's number in the request's run of consecutive failures (1 = the first).
    fn count_failure(&self, id: &str) -> u32 {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(id.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }
}

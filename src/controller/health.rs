//! The heartbeat (§3.2): Omni shows a provider as disconnected 31 s after its last beat, so we beat
//! every `--health-interval` (10 s by default, well inside that window: Omni's window is its own
//! constant, so a longer interval would not widen it) and report what the health check says.
//!
//! The health check is the latest result of checks that run on their own schedule, as a watch
//! receiver, so the Proxmox check (reachable, credentials accepted) plugs in without this module
//! knowing about Proxmox, and a slow check never delays a beat.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::omni::resources::{INFRA_PROVIDER_HEALTH_STATUS, health_controller_name};
use crate::omni::state::{StateClient, StateError};

/// One beat: Modify the health status (created when missing, e.g. after an Omni restart wiped the
/// ephemeral namespace) with `problem`, the error text Omni should show (`None` when healthy).
pub async fn beat(
    state: &StateClient,
    provider_id: &str,
    problem: Option<String>,
) -> Result<Option<String>, StateError> {
    let ts = prost_types::Timestamp::from(SystemTime::now());
    state
        .modify(
            &INFRA_PROVIDER_HEALTH_STATUS,
            provider_id,
            &health_controller_name(provider_id),
            None,
            |r| {
                r.spec.last_heartbeat_timestamp = Some(ts);
                r.spec.error = problem.clone().unwrap_or_default();
            },
        )
        .await
        .map(|_| problem)
}

/// The least a beat is given: a signed round trip to a loaded Omni takes a good part of a second,
/// and a beat given up every time is worse than a slow one. Only sub-second intervals (tests) meet
/// it; Omni's window is 31 s.
pub const BEAT_DEADLINE_FLOOR: Duration = Duration::from_secs(1);

/// What beats: the State client, the provider it beats for, how often, what it reports, and where
/// the outcome is counted.
pub struct Heartbeat {
    pub state: StateClient,
    pub provider_id: String,
    pub interval: Duration,
    /// The latest health check: `None` when healthy, else the error text Omni should show.
    pub check: watch::Receiver<Option<String>>,
    pub metrics: Arc<Metrics>,
}

impl Heartbeat {
    /// Beats every `interval` until `shutdown` turns true; a beat in progress is finished first.
    /// Only the leader beats (at once when it becomes leader, so Omni does not count the takeover
    /// against it); a standby reads the check for `/readyz` and writes nothing.
    ///
    /// A beat never takes longer than `interval` (at least [`BEAT_DEADLINE_FLOOR`]): one that Omni
    /// leaves unanswered is given up, counted as failed, and the next beat is sent on time, so one
    /// hung call cannot silence the provider for longer than one interval.
    pub async fn run(
        self,
        mut shutdown: watch::Receiver<bool>,
        mut leading: watch::Receiver<bool>,
    ) {
        crate::contain::install_hook();
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Shutdown first: after a beat given up, the next tick is due at once too.
            tokio::select! {
                biased;
                _ = async { shutdown.wait_for(|s| *s).await.is_ok() } => return,
                _ = ticker.tick() => {}
                Ok(()) = leading.changed() => {
                    if *leading.borrow() {
                        ticker.reset();
                    } else {
                        continue;
                    }
                }
            }
            if *leading.borrow() {
                self.beat_once().await;
            } else {
                self.metrics.proxmox_checked(self.check.borrow().is_none());
            }
        }
    }

    /// One beat, given up after the interval, its outcome logged and counted.
    async fn beat_once(&self) {
        let deadline = self.interval.max(BEAT_DEADLINE_FLOOR);
        let beating = crate::contain::future(beat(
            &self.state,
            &self.provider_id,
            self.check.borrow().clone(),
        ));
        let (omni_ok, proxmox_ok) = match tokio::time::timeout(deadline, beating).await {
            Ok(Ok(Ok(None))) => {
                tracing::debug!("heartbeat sent");
                (true, true)
            }
            Ok(Ok(Ok(Some(problem)))) => {
                tracing::warn!(%problem, "heartbeat sent with a health problem");
                (true, false)
            }
            Ok(Ok(Err(e))) => {
                tracing::warn!(error = %e, "heartbeat failed");
                (false, false)
            }
            Ok(Err(panic)) => {
                tracing::error!("heartbeat panicked: {}", panic.message);
                (false, false)
            }
            Err(_) => {
                tracing::warn!(
                    "heartbeat not answered within {deadline:?}; giving it up and beating again"
                );
                (false, false)
            }
        };
        self.metrics.heartbeat(omni_ok, proxmox_ok);
    }
}

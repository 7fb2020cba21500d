//! Active/standby replicas: one leader does everything, the others wait, coordinated through a lease
//! resource in Omni, the store every replica already shares.
//!
//! The lease ([`provider_lease`]) changes only by versioned writes, so of two replicas trying at
//! once one wins and the other gets a conflict. The leader renews it every [`Timings::renew_every`]
//! and opens the [`Fence`] until the instant each successful renew was sent plus the renew deadline:
//! a leader that cannot reach Omni stops writing to Proxmox and Omni by itself, before a standby,
//! which waits a whole lease duration from the last change it saw, may take over. A standby reads
//! the lease every retry period and whenever the watch says it changed, so a released lease is
//! taken within moments. How a restarted replica proves that the holder the lease names is its own
//! exited predecessor is in [`identity`].
//!
//! The lease rules are pure functions: when a replica may take the lease ([`decide`]), and the
//! timings that keep a leader that lost it quiet before anyone else starts ([`Timings`]). They follow client-go's `tools/leaderelection` (`leaderelection.go`, `tryAcquireOrRenew`,
//! `isLeaseValid`, `NewLeaderElector`): a record that has not changed for a whole lease duration,
//! judged by the observer's own clock from when it last saw it change, may be taken over; the holder
//! renews, and stops leading when it has not renewed within the renew deadline. No two clocks need
//! to agree, only to run at nearly the same rate.

pub mod identity;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::fence::Fence;
use crate::metrics::Metrics;
use crate::omni::proto::provider::LeaseSpec;
use crate::omni::resources::{Kind, LEASE_ID, provider_lease};
use crate::omni::state::{StateClient, StateError, Typed, WatchEvent};
use identity::{Holder, LocalClaim};

/// The lease has no owner: any replica of the provider may write it.
const OWNER: &str = "";

pub struct Election {
    /// Unfenced: the lease itself is how the fence opens.
    state: StateClient,
    kind: Kind<LeaseSpec>,
    me: Holder,
    claim: LocalClaim,
    timings: Timings,
    fence: Fence,
    metrics: Arc<Metrics>,
    /// Whether this replica leads now (else it stands by).
    leading: watch::Sender<bool>,
    /// The lease as last read or written.
    last: Option<Typed<LeaseSpec>>,
    /// When this replica first saw the version in `last`: expiry counts from here.
    seen_at: Instant,
    /// When the last successful renew (or acquire) was sent.
    renewed_at: Option<Instant>,
    /// The holder last named in the log, so that a standby says who leads once, not every look.
    announced: String,
    /// Whether the last look reached Omni, so that a streak of failures is logged once.
    reachable: bool,
}

impl Election {
    /// A replica standing by, its fence shut. `claim` is the claim file (see [`identity`]); `None`
    /// disables the fast takeover after a restart.
    pub fn new(
        state: StateClient,
        provider_id: &str,
        timings: Timings,
        claim: Option<&Path>,
        fence: Fence,
        metrics: Arc<Metrics>,
    ) -> (Self, watch::Receiver<bool>) {
        let me = Holder::this_process();
        let claim = claim.map_or_else(LocalClaim::default, |path| LocalClaim::take(path, &me));
        fence.set(None);
        metrics.leader.set(0);
        let (leading, rx) = watch::channel(false);
        let election = Self {
            state,
            kind: provider_lease(provider_id),
            me,
            claim,
            timings,
            fence,
            metrics,
            leading,
            last: None,
            seen_at: Instant::now(),
            renewed_at: None,
            announced: String::new(),
            reachable: true,
        };
        (election, rx)
    }

    fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// How long from `now` the fence stays open while this replica leads.
    fn left(&self, now: Instant) -> Option<Duration> {
        self.renewed_at
            .filter(|_| self.is_leader())
            .map(|t| (t + self.timings.renew_deadline).saturating_duration_since(now))
    }

    /// Looks at the lease until `stop` turns true, then releases it if held.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        tracing::info!(
            identity = %self.me.id(),
            predecessor = self.claim.predecessor.as_deref().unwrap_or(""),
            "standing by for the leader lease"
        );
        let mut changes = self.state.watch_kind(&self.kind, &[]);
        loop {
            // A leader looks again at the next renew, or at its deadline if that comes first; a
            // standby every retry period (and at every change the watch reports).
            let wait = (self.left(Instant::now())).map_or(self.timings.retry_period, |left| {
                self.timings.renew_every().min(left)
            });
            // A change the watch delivers carries the lease: no need to read it again.
            let delivered = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break,
                Some(event) = changes.recv(), if !self.is_leader() => lease_of(event),
                () = tokio::time::sleep(wait) => None,
            };
            self.look(delivered).await;
        }
        self.release().await;
    }

    /// `delivered`: the lease as the watch just delivered it, if it did.
    async fn look(&mut self, delivered: Option<Typed<LeaseSpec>>) {
        let sent = Instant::now();
        let budget = self.left(sent).unwrap_or(self.timings.renew_deadline);
        let attempt = self.try_acquire_or_renew(sent, delivered);
        let outcome = (tokio::time::timeout(budget, attempt).await)
            .unwrap_or_else(|_| Err(format!("no answer from Omni within {budget:?}")));
        self.metrics.omni_connected.set(i64::from(outcome.is_ok()));
        match outcome {
            Ok(held) => {
                self.reachable = true;
                if held {
                    self.renewed_at = Some(sent);
                    self.fence.set(Some(sent + self.timings.renew_deadline));
                    self.set_leading(true);
                } else if self.is_leader() {
                    let holder = self.last_holder();
                    self.lose(&format!("the lease is held by {holder}"));
                }
            }
            // A streak of failures is logged once.
            Err(e) if std::mem::replace(&mut self.reachable, false) => {
                tracing::warn!(error = %e, "cannot read or renew the leader lease");
            }
            Err(_) => {}
        }
        if self.is_leader() && self.left(Instant::now()).is_none_or(|left| left.is_zero()) {
            self.lose(&format!(
                "not renewed within the renew deadline ({:?})",
                self.timings.renew_deadline
            ));
        }
    }

    /// One look: read the lease and act as [`decide`] says. A leader renews from its own last
    /// write without reading first; should someone have written since (a conflict), it reads the
    /// lease and decides again. `Ok(true)` while this replica holds the lease.
    async fn try_acquire_or_renew(
        &mut self,
        now: Instant,
        mut delivered: Option<Typed<LeaseSpec>>,
    ) -> Result<bool, String> {
        let mut from_last_write = self.is_leader();
        loop {
            let mine =
                (self.last.clone()).filter(|l| from_last_write && l.spec.holder == self.me.id());
            from_last_write = mine.is_some();
            let current = match mine.or_else(|| delivered.take()) {
                Some(lease) => Some(lease),
                None => self
                    .state
                    .find(&self.kind, LEASE_ID)
                    .await
                    .map_err(|e| e.to_string())?,
            };
            if let Some(current) = &current {
                self.saw(current.clone(), now);
            }
            let attempt = decide(
                current.as_ref().map(|c| &c.spec),
                &self.me.id(),
                self.claim.predecessor.as_deref(),
                now.saturating_duration_since(self.seen_at),
            );
            let written = match (&attempt, current) {
                (Attempt::Wait, _) => {
                    let holder = self.last_holder();
                    if holder != self.announced {
                        tracing::info!(%holder, "standing by: another replica holds the leader lease");
                        self.announced = holder;
                    }
                    return Ok(false);
                }
                (_, None) => {
                    let fresh = Typed::fresh(&self.kind, LEASE_ID, self.record(None, true));
                    self.state.create(&self.kind, &fresh, OWNER).await
                }
                (_, Some(current)) => {
                    let taking = attempt != Attempt::Renew;
                    let mut next = current.clone();
                    next.spec = self.record(Some(&current.spec), taking);
                    self.state.update(&self.kind, &next, OWNER, None).await
                }
            };
            match written {
                Ok(stored) => {
                    if let Attempt::Take(how) = attempt {
                        let from = self.last_holder();
                        tracing::info!(holder = %self.me.id(), previous = %from, "acquired the leader lease: {how}");
                        self.announced = self.me.id();
                    }
                    self.saw(stored, now);
                    return Ok(true);
                }
                Err(e) if e.is_conflict() && std::mem::take(&mut from_last_write) => {}
                // Another replica wrote first: it won this round.
                Err(e) if e.is_conflict() || matches!(e, StateError::AlreadyExists { .. }) => {
                    return Ok(false);
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// The record this replica writes: `previous` kept where a renew keeps it.
    fn record(&self, previous: Option<&LeaseSpec>, taking: bool) -> LeaseSpec {
        let now = unix_ms();
        let previous = previous.cloned().unwrap_or_default();
        LeaseSpec {
            holder: self.me.id(),
            host: self.me.host.clone(),
            pid: self.me.pid,
            lease_duration_ms: self.timings.lease_duration.as_millis() as u64,
            acquire_time_ms: if taking {
                now
            } else {
                previous.acquire_time_ms
            },
            renew_time_ms: now,
            transitions: previous.transitions + u32::from(taking),
        }
    }

    /// Remembers `lease`; a version not seen before restarts the expiry clock.
    fn saw(&mut self, lease: Typed<LeaseSpec>, now: Instant) {
        if self
            .last
            .as_ref()
            .is_none_or(|l| l.metadata.version != lease.metadata.version)
        {
            self.seen_at = now;
        }
        self.last = Some(lease);
    }

    fn last_holder(&self) -> String {
        self.last
            .as_ref()
            .map(|l| l.spec.holder.clone())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "nobody".to_owned())
    }

    fn set_leading(&mut self, leading: bool) {
        let changed = self
            .leading
            .send_if_modified(|l| std::mem::replace(l, leading) != leading);
        if changed {
            self.metrics.leader.set(i64::from(leading));
            self.metrics.leader_transitions.inc();
        }
    }

    fn lose(&mut self, why: &str) {
        self.fence.set(None);
        self.renewed_at = None;
        tracing::warn!(holder = %self.me.id(), "lost the leader lease ({why}); every write stopped; standing by");
        self.announced = String::new();
        self.set_leading(false);
    }

    /// Gives the lease up (at shutdown), so that a standby takes it at once instead of waiting
    /// it out.
    async fn release(&mut self) {
        self.fence.set(None);
        if !self.is_leader() {
            return;
        }
        self.set_leading(false);
        let Some(mut next) = self.last.clone().filter(|l| l.spec.holder == self.me.id()) else {
            return;
        };
        next.spec.holder.clear();
        next.spec.host.clear();
        next.spec.pid = 0;
        next.spec.renew_time_ms = unix_ms();
        let write = self.state.update(&self.kind, &next, OWNER, None);
        match tokio::time::timeout(self.timings.renew_deadline, write).await {
            Ok(Ok(_)) => tracing::info!(holder = %self.me.id(), "released the leader lease"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not release the leader lease; a standby takes it when it expires");
            }
            Err(_) => tracing::warn!(
                "Omni did not answer the release of the leader lease; a standby takes it when it expires"
            ),
        }
    }
}

/// The lease a watch event carries, when it is a created or changed lease that decodes.
fn lease_of(event: Result<WatchEvent, StateError>) -> Option<Typed<LeaseSpec>> {
    match event {
        Ok(WatchEvent::Created(r) | WatchEvent::Updated(r))
            if r.metadata.as_ref().is_some_and(|m| m.id == LEASE_ID) =>
        {
            Typed::decode(r).ok()
        }
        _ => None,
    }
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The three timings (client-go's defaults: 15 s, 10 s, 2 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How long a standby waits, from the last change it saw, before taking the lease over.
    pub lease_duration: Duration,
    /// How long a leader may go without a successful renew before it stops every write.
    pub renew_deadline: Duration,
    /// How often a standby looks at the lease.
    pub retry_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl Timings {
    /// The orderings safety needs, as client-go's `NewLeaderElector` checks them: a leader stops
    /// (renew deadline) before a standby may start (lease duration), and has more than one look
    /// in the renew deadline.
    pub fn check(&self) -> Result<(), String> {
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "--leader-elect-lease-duration ({:?}) must be longer than --leader-elect-renew-deadline ({:?}): a leader must stop before another replica may start",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline.as_secs_f64() <= 1.2 * self.retry_period.as_secs_f64() {
            return Err(format!(
                "--leader-elect-renew-deadline ({:?}) must be longer than 1.2 × --leader-elect-retry-period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        Ok(())
    }

    /// How often the leader renews: three tries within the renew deadline (3.3 s by default), never
    /// more often than a standby looks. client-go renews every retry period; a third of the
    /// deadline keeps an idle leader under 30 Omni writes a minute with its heartbeat.
    pub fn renew_every(&self) -> Duration {
        (self.renew_deadline / 3).max(self.retry_period)
    }
}

/// What a replica does with the lease it just read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// Held by this replica: renew it.
    Renew,
    /// Free (none yet, released, expired, or held by this replica's exited predecessor): take it
    /// (create it when there is none), for the reason the log gives.
    Take(&'static str),
    /// Held by someone else, who may still be alive.
    Wait,
}

/// The decision on `record` for the replica `me`, whose exited predecessor on this host (if any) is
/// `predecessor`, having seen this version of the record unchanged for `unchanged_for`.
pub fn decide(
    record: Option<&LeaseSpec>,
    me: &str,
    predecessor: Option<&str>,
    unchanged_for: Duration,
) -> Attempt {
    let Some(record) = record else {
        return Attempt::Take("no replica had held it yet");
    };
    if record.holder == me {
        Attempt::Renew
    } else if record.holder.is_empty() {
        Attempt::Take("it was released")
    } else if predecessor == Some(record.holder.as_str()) {
        Attempt::Take("it named this replica's exited predecessor")
    } else if unchanged_for >= Duration::from_millis(record.lease_duration_ms) {
        Attempt::Take("its holder stopped renewing it")
    } else {
        Attempt::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: &str) -> LeaseSpec {
        LeaseSpec {
            holder: holder.into(),
            lease_duration_ms: 15_000,
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_is_taken_only_when_free_expired_or_left_by_a_dead_predecessor() {
        let s = Duration::from_secs;
        assert_eq!(
            decide(None, "me", None, s(0)),
            Attempt::Take("no replica had held it yet")
        );
        assert_eq!(
            decide(Some(&held_by("me")), "me", None, s(0)),
            Attempt::Renew
        );
        assert_eq!(
            decide(Some(&held_by("")), "me", None, s(0)),
            Attempt::Take("it was released")
        );
        assert_eq!(
            decide(Some(&held_by("other")), "me", None, s(14)),
            Attempt::Wait
        );
        assert_eq!(
            decide(Some(&held_by("other")), "me", None, s(15)),
            Attempt::Take("its holder stopped renewing it")
        );
        assert_eq!(
            decide(Some(&held_by("old")), "me", Some("old"), s(0)),
            Attempt::Take("it named this replica's exited predecessor")
        );
        assert_eq!(
            decide(Some(&held_by("other")), "me", Some("old"), s(0)),
            Attempt::Wait,
            "a predecessor counts only for the lease it held"
        );
    }

    #[test]
    fn the_holders_own_lease_duration_decides_expiry() {
        let mut short = held_by("other");
        short.lease_duration_ms = 1_000;
        assert_eq!(
            decide(Some(&short), "me", None, Duration::from_secs(1)),
            Attempt::Take("its holder stopped renewing it")
        );
    }

    #[test]
    fn timings_keep_a_leader_quiet_before_a_standby_may_start() {
        let d = Timings::default();
        assert_eq!(d.check(), Ok(()));
        assert_eq!(d.renew_every(), Duration::from_nanos(3_333_333_333));
        let equal = Timings {
            lease_duration: d.renew_deadline,
            ..d
        };
        assert!(equal.check().unwrap_err().contains("longer than"));
        let tight = Timings {
            renew_deadline: Duration::from_millis(2400),
            lease_duration: Duration::from_secs(5),
            ..d
        };
        assert!(tight.check().unwrap_err().contains("1.2"));
        let quick = Timings {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(500),
        };
        assert_eq!(quick.renew_every(), Duration::from_nanos(666_666_666));
    }
}

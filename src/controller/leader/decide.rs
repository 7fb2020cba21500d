//! The lease rules as pure functions: when a replica may take the lease, and the timings that keep
//! a leader that lost it quiet before anyone else starts.
//!
//! They follow client-go's `tools/leaderelection` (`leaderelection.go`, `tryAcquireOrRenew`,
//! `isLeaseValid`, `NewLeaderElector`): a record that has not changed for a whole lease duration,
//! judged by the observer's own clock from when it last saw it change, may be taken over; the holder
//! renews, and stops leading when it has not renewed within the renew deadline. No two clocks need
//! to agree, only to run at nearly the same rate.

use std::time::Duration;

use crate::omni::proto::provider::LeaseSpec;

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
    /// No lease yet: create it.
    Create,
    /// Held by this replica: renew it.
    Renew,
    /// Free (released, expired, or held by this replica's exited predecessor): take it.
    Take(Why),
    /// Held by someone else, who may still be alive.
    Wait,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    Released,
    Expired,
    Predecessor,
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
        return Attempt::Create;
    };
    if record.holder == me {
        Attempt::Renew
    } else if record.holder.is_empty() {
        Attempt::Take(Why::Released)
    } else if predecessor == Some(record.holder.as_str()) {
        Attempt::Take(Why::Predecessor)
    } else if unchanged_for >= Duration::from_millis(record.lease_duration_ms) {
        Attempt::Take(Why::Expired)
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
        assert_eq!(decide(None, "me", None, s(0)), Attempt::Create);
        assert_eq!(
            decide(Some(&held_by("me")), "me", None, s(0)),
            Attempt::Renew
        );
        assert_eq!(
            decide(Some(&held_by("")), "me", None, s(0)),
            Attempt::Take(Why::Released)
        );
        assert_eq!(
            decide(Some(&held_by("other")), "me", None, s(14)),
            Attempt::Wait
        );
        assert_eq!(
            decide(Some(&held_by("other")), "me", None, s(15)),
            Attempt::Take(Why::Expired)
        );
        assert_eq!(
            decide(Some(&held_by("old")), "me", Some("old"), s(0)),
            Attempt::Take(Why::Predecessor)
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
            Attempt::Take(Why::Expired)
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

//! The reconcile queue: which MachineRequest to work on next, and when.
//!
//! Guarantees the controller relies on:
//! - A key is never handed to two workers at once. An event for a key that is being reconciled is kept
//!   and the key comes back as soon as the running reconcile finishes, so no change is lost.
//! - A key waits in the queue at most once: adding it again keeps the earliest due time. A requeue in
//!   five minutes is brought forward by a watch event now (the Go runtime behaves the same way).
//! - Workers sleep until the earliest due time or until something is added; nothing polls.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::pipeline::ledgers::entry;

/// What the work queue should do with the request after a reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing more until the request changes.
    Done,
    /// Look again after this long.
    RequeueAfter(Duration),
}

#[derive(Default)]
pub struct WorkQueue {
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Default)]
struct State {
    /// Keys waiting, with the instant they become due; one that is also active is due again once
    /// its reconcile ends.
    waiting: HashMap<String, Instant>,
    /// Keys a worker holds right now.
    active: HashSet<String>,
    closed: bool,
}

impl WorkQueue {
    /// Schedules `key` now.
    pub fn add(&self, key: String) {
        self.add_after(key, Duration::ZERO);
    }

    /// Schedules `key` after `delay` (or earlier, if it is already due earlier).
    pub fn add_after(&self, key: String, delay: Duration) {
        let due = Instant::now() + delay;
        {
            // A panic while holding this lock cannot leave the maps inconsistent (every update is
            // a single insert or remove), so a poisoned lock is safe to keep using.
            let mut s = entry(&self.state);
            if s.closed {
                return;
            }
            s.waiting
                .entry(key)
                .and_modify(|d| *d = (*d).min(due))
                .or_insert(due);
        }
        self.changed.notify_waiters();
    }

    /// Waits for the next due key and marks it active; `None` once the queue is closed.
    pub async fn next(&self) -> Option<String> {
        loop {
            // Register interest before looking, so an add between the look and the wait is not missed.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wake_at = {
                let mut s = entry(&self.state);
                if s.closed {
                    return None;
                }
                let earliest = s
                    .waiting
                    .iter()
                    .filter(|(k, _)| !s.active.contains(*k))
                    .min_by_key(|(_, due)| **due)
                    .map(|(k, due)| (k.clone(), *due));
                match earliest {
                    Some((key, due)) if due <= Instant::now() => {
                        s.waiting.remove(&key);
                        s.active.insert(key.clone());
                        return Some(key);
                    }
                    later => later.map(|(_, due)| due),
                }
            };
            // Until the earliest due time, or until something is added.
            if let Some(at) = wake_at {
                let _ = tokio::time::timeout_at(at, notified).await;
            } else {
                notified.await;
            }
        }
    }

    /// Releases a key a worker got from [`WorkQueue::next`]; an add that arrived meanwhile takes effect.
    pub fn done(&self, key: &str) {
        entry(&self.state).active.remove(key);
        self.changed.notify_waiters();
    }

    /// Wakes every waiting worker with `None`; pending keys are dropped.
    pub fn close(&self) {
        entry(&self.state).closed = true;
        self.changed.notify_waiters();
    }

    /// Keys waiting or active (for metrics and tests).
    pub fn len(&self) -> usize {
        let s = entry(&self.state);
        let waiting_only = s.waiting.keys().filter(|k| !s.active.contains(*k));
        waiting_only.count() + s.active.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn earliest_due_time_wins_and_delays_are_honoured() {
        let q = WorkQueue::default();
        q.add_after("a".into(), Duration::from_secs(60));
        q.add_after("b".into(), Duration::from_secs(10));
        q.add_after("a".into(), Duration::from_secs(5));
        let t0 = Instant::now();
        assert_eq!(q.next().await.as_deref(), Some("a"));
        assert!(t0.elapsed() >= Duration::from_secs(5));
        assert_eq!(q.next().await.as_deref(), Some("b"));
        assert!(t0.elapsed() >= Duration::from_secs(10) && t0.elapsed() < Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn an_active_key_is_not_handed_out_twice_and_events_are_kept() {
        let q = Arc::new(WorkQueue::default());
        q.add("k".into());
        assert_eq!(q.next().await.as_deref(), Some("k"));
        q.add("k".into()); // an event while the key is being reconciled
        let q2 = q.clone();
        let second = tokio::spawn(async move { q2.next().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !second.is_finished(),
            "must wait until the first reconcile is done"
        );
        q.done("k");
        assert_eq!(second.await.unwrap().as_deref(), Some("k"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_brings_a_requeue_forward() {
        let q = Arc::new(WorkQueue::default());
        q.add_after("k".into(), Duration::from_secs(300));
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.next().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        q.add("k".into());
        let t0 = Instant::now();
        assert_eq!(waiter.await.unwrap().as_deref(), Some("k"));
        assert!(t0.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn close_releases_workers() {
        let q = Arc::new(WorkQueue::default());
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.next().await });
        tokio::task::yield_now().await;
        q.close();
        assert_eq!(waiter.await.unwrap(), None);
    }
}

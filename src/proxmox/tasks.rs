//! Waiting for Proxmox tasks.
//!
//! Almost every write in Proxmox returns a task ID (UPID) and does its work in the background. The wait
//! here is built for speed and for the ways tasks misbehave:
//! - Polls are timed by how long tasks of the same type took on the same node lately ([`poll_delay`]):
//!   the first when most of that time has passed, then backing off from a fraction of it, so a
//!   create that takes two seconds costs two or three polls rather than seven, and a task never seen
//!   before is polled right away, then from 50 ms growing to 1 s, as a task that takes 80 ms costs two
//!   polls, not a fixed sleep, and one that takes a minute about sixty.
//! - A task that is not visible yet (Proxmox answers "unable to parse worker upid" or "no such task" for
//!   a moment after creating it, especially on another node) counts as running.
//! - A failed task comes back as [`ProxmoxError::TaskFailed`] with the last lines of its log, which is
//!   where Proxmox says *why*.
//! - Transient errors while polling do not fail the wait: the task keeps running on Proxmox anyway.

use std::time::{Duration, Instant};

use super::client::{Params, ProxmoxClient, TaskTimes};
use super::error::{ProxmoxError, Result};
use super::types::{TaskLogLine, TaskStatus, Upid};

const FIRST_POLL_DELAY: Duration = Duration::from_millis(50);
const MAX_POLL_DELAY: Duration = Duration::from_secs(1);
/// The first poll comes no later than this whatever tasks of the kind took: a download that took
/// minutes once must not hide the failure of the next one for minutes.
const MAX_FIRST_POLL_DELAY: Duration = Duration::from_secs(10);
/// How long a task may stay invisible before we believe it does not exist.
const INVISIBLE_GRACE: Duration = Duration::from_secs(30);
/// Log lines kept for a failure message.
const LOG_TAIL_LINES: usize = 8;

impl ProxmoxClient {
    /// Waits until the task ends or `timeout` passes. `Ok` for `OK` and `WARNINGS: n` (success with
    /// warnings); any other exit status is Proxmox's error text.
    pub async fn wait_for_task(&self, upid: &Upid, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        let node = upid.node();
        // `GET /nodes/{node}/tasks/{upid}/status`, on the node the UPID names.
        let status = ["nodes", node.as_str(), "tasks", upid.as_str(), "status"];
        let kind = (node.to_string(), upid.task_type().to_owned());
        let times = &self.inner.task_times;
        let expected = times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&kind)
            .copied();
        let mut polls = 0;
        let mut last_running = Duration::ZERO;
        tokio::time::sleep(poll_delay(expected, 0).min(timeout)).await;
        loop {
            let asked = started.elapsed();
            match self.get::<TaskStatus>(&status, Params::new()).await {
                Ok(status) if status.status != "running" => {
                    // It ended between the last poll that saw it running and this one.
                    record(times, kind, (last_running + asked) / 2);
                    let exit_status = status.exitstatus.unwrap_or_else(|| "unknown".into());
                    return self.finish(upid, exit_status).await;
                }
                Ok(_) => last_running = asked,
                Err(e) if not_visible_yet(&e) && started.elapsed() < INVISIBLE_GRACE => {
                    tracing::trace!(%upid, "task not visible yet");
                }
                Err(e) if e.is_transient() => {
                    tracing::debug!(%upid, error = %e, "cannot poll task; it keeps running on Proxmox");
                }
                Err(e) => return Err(e),
            }
            let waited = started.elapsed();
            if waited >= timeout {
                return Err(ProxmoxError::TaskTimeout {
                    upid: upid.clone(),
                    waited,
                });
            }
            polls += 1;
            tokio::time::sleep(poll_delay(expected, polls).min(timeout - waited)).await;
        }
    }

    async fn finish(&self, upid: &Upid, exit_status: String) -> Result<()> {
        if exit_status == "OK" || exit_status.starts_with("WARNINGS") {
            if exit_status != "OK" {
                tracing::warn!(%upid, %exit_status, "Proxmox task finished with warnings");
            }
            return Ok(());
        }
        // The last lines of the log (`GET /nodes/{node}/tasks/{upid}/log`) say why; best effort.
        let node = upid.node();
        let path = ["nodes", node.as_str(), "tasks", upid.as_str(), "log"];
        let params = Params::new().with("start", 0).with("limit", 10_000);
        let lines = self.get::<Vec<TaskLogLine>>(&path, params).await;
        let lines =
            lines.inspect_err(|e| tracing::debug!(%upid, error = %e, "cannot read task log"));
        let lines = lines.unwrap_or_default();
        let skip = lines.len().saturating_sub(LOG_TAIL_LINES);
        Err(ProxmoxError::TaskFailed {
            log_tail: lines.into_iter().skip(skip).map(|l| l.t).collect(),
            upid: upid.clone(),
            exit_status,
        })
    }
}

/// Adds a task that took `took` to the moving average of its kind, so a node that got slower (or
/// a storage that filled up) moves it within a few tasks.
fn record(times: &TaskTimes, kind: (String, String), took: Duration) {
    let mut times = times.lock().unwrap_or_else(|p| p.into_inner());
    let before = times.get(&kind).copied();
    let average = before.map_or(took, |before| before.mul_f64(0.7) + took.mul_f64(0.3));
    times.insert(kind, average);
}

/// How long to wait before poll number `polls + 1` (before the first: `polls` = 0) of a task whose
/// kind took `expected` lately. Without a figure: at once, then 50 ms growing by 1.6 to 1 s. With
/// one: the first at 80 % of it (a task rarely ends much sooner than its kind usually does, and one
/// that does waits at most that long), then from an eighth of it growing the same way.
pub fn poll_delay(expected: Option<Duration>, polls: u32) -> Duration {
    let growth = |base: Duration, n: u32| {
        let factor = 1.6_f64.powi(i32::try_from(n).unwrap_or(i32::MAX));
        base.mul_f64(factor.min(1e6)).min(MAX_POLL_DELAY)
    };
    match expected {
        None if polls == 0 => Duration::ZERO,
        None => growth(FIRST_POLL_DELAY, polls - 1),
        Some(e) if polls == 0 => e.mul_f64(0.8).min(MAX_FIRST_POLL_DELAY),
        Some(e) => growth((e / 8).max(FIRST_POLL_DELAY), polls - 1),
    }
}

fn not_visible_yet(e: &ProxmoxError) -> bool {
    let says = |text: &str| {
        let t = text.to_ascii_lowercase();
        t.contains("unable to parse worker upid") || t.contains("no such task")
    };
    match e {
        ProxmoxError::NotFound { .. } => true,
        // pve-manager answers a task whose status file is not written yet with a parameter error on
        // `upid` (400 "Parameter verification failed.", the reason in `errors.upid`).
        ProxmoxError::Api {
            status: 400 | 500,
            message,
            field_errors,
            ..
        } => field_errors.get("upid").is_some_and(|t| says(t)) || says(message),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The polls a task that ends at `ends` gets with this schedule: the times they are sent.
    fn polls_until(expected: Option<Duration>, ends: Duration) -> Vec<Duration> {
        let mut at = Duration::ZERO;
        let mut sent = Vec::new();
        for n in 0..100 {
            at += poll_delay(expected, n);
            sent.push(at);
            if at >= ends {
                break;
            }
        }
        sent
    }

    #[test]
    fn task_times_follow_the_recent_durations_by_node_and_type() {
        let times = TaskTimes::default();
        let expected = |kind: &(String, String)| times.lock().unwrap().get(kind).copied();
        let create = ("pve1".to_string(), "qmcreate".to_string());
        assert_eq!(expected(&create), None);
        record(&times, create.clone(), Duration::from_secs(2));
        assert_eq!(expected(&create), Some(Duration::from_secs(2)));
        for _ in 0..10 {
            record(&times, create.clone(), Duration::from_secs(1));
        }
        let now = expected(&create).unwrap();
        assert!(now < Duration::from_millis(1100), "{now:?}");
        assert_eq!(
            expected(&("pve2".to_string(), "qmcreate".to_string())),
            None,
            "another node's figure is its own"
        );
    }

    #[test]
    fn an_unknown_kind_is_polled_at_once_then_backing_off() {
        let sent = polls_until(None, Duration::from_millis(2000));
        assert_eq!(sent[0], Duration::ZERO);
        assert_eq!(sent[1], Duration::from_millis(50));
        assert_eq!(sent.len(), 8, "{sent:?}");
        assert!(poll_delay(None, 40) <= MAX_POLL_DELAY);
    }

    #[test]
    fn a_known_kind_is_polled_near_its_usual_end() {
        let two_secs = Some(Duration::from_secs(2));
        let sent = polls_until(two_secs, Duration::from_millis(2100));
        assert_eq!(sent[0], Duration::from_millis(1600));
        assert!(sent.len() <= 3, "a usual 2 s task: {sent:?}");
        // One that ends sooner than usual is seen at the first poll, 80 % of the usual time.
        assert_eq!(polls_until(two_secs, Duration::from_millis(300)).len(), 1);
        // A task that once took an hour does not push the first poll beyond 10 s.
        assert_eq!(
            poll_delay(Some(Duration::from_secs(3600)), 0),
            MAX_FIRST_POLL_DELAY
        );
        // Instant tasks stay instant.
        assert!(poll_delay(Some(Duration::from_millis(2)), 0) < Duration::from_millis(2));
    }
}

//! Waiting for Proxmox tasks.
//!
//! Almost every write in Proxmox returns a task ID (UPID) and does its work in the background. The wait
//! here is built for speed and for the ways tasks misbehave:
//! - Polls start right away and back off (50 ms growing to 1 s), so a task that takes 80 ms costs two
//!   polls, not a fixed sleep, and a task that takes a minute costs about sixty.
//! - A task that is not visible yet (Proxmox answers "unable to parse worker upid" or "no such task" for
//!   a moment after creating it, especially on another node) counts as running.
//! - A failed task comes back as [`ProxmoxError::TaskFailed`] with the last lines of its log, which is
//!   where Proxmox says *why*.
//! - Transient errors while polling do not fail the wait: the task keeps running on Proxmox anyway.

use std::time::{Duration, Instant};

use super::client::{Params, ProxmoxClient};
use super::error::ProxmoxError;
use super::types::{TaskLogLine, TaskOutcome, TaskStatus, Upid};

const FIRST_POLL_DELAY: Duration = Duration::from_millis(50);
const MAX_POLL_DELAY: Duration = Duration::from_secs(1);
/// How long a task may stay invisible before we believe it does not exist.
const INVISIBLE_GRACE: Duration = Duration::from_secs(30);
/// Log lines kept for a failure message.
const LOG_TAIL_LINES: usize = 8;

impl ProxmoxClient {
    /// `GET /nodes/{node}/tasks/{upid}/status` (the node is the one in the UPID).
    pub async fn task_status(&self, upid: &Upid) -> Result<TaskStatus, ProxmoxError> {
        let node = upid.node();
        self.get(
            &["nodes", node.as_str(), "tasks", upid.as_str(), "status"],
            Params::new(),
        )
        .await
    }

    /// `GET /nodes/{node}/tasks/{upid}/log`, lines `start..start+limit`.
    pub async fn task_log(
        &self,
        upid: &Upid,
        start: u64,
        limit: u64,
    ) -> Result<Vec<TaskLogLine>, ProxmoxError> {
        let node = upid.node();
        let params = Params::new().with("start", start).with("limit", limit);
        self.get(
            &["nodes", node.as_str(), "tasks", upid.as_str(), "log"],
            params,
        )
        .await
    }

    /// The last lines of a task's log (best effort: empty when the log cannot be read).
    pub async fn task_log_tail(&self, upid: &Upid) -> Vec<String> {
        match self.task_log(upid, 0, 10_000).await {
            Ok(lines) => {
                let skip = lines.len().saturating_sub(LOG_TAIL_LINES);
                lines.into_iter().skip(skip).map(|l| l.t).collect()
            }
            Err(e) => {
                tracing::debug!(%upid, error = %e, "cannot read task log");
                Vec::new()
            }
        }
    }

    /// Makes `call`, which starts a task, then waits for the task. One error for both halves: callers
    /// decide by what the error says (gone, locked, already running), not by which half it came from.
    pub async fn run_task(
        &self,
        call: impl Future<Output = Result<Upid, ProxmoxError>>,
        timeout: Duration,
    ) -> Result<TaskOutcome, ProxmoxError> {
        let upid = call.await?;
        self.wait_for_task(&upid, timeout).await
    }

    /// Waits until the task ends or `timeout` passes. `Ok` for `OK` and `WARNINGS: n`.
    pub async fn wait_for_task(
        &self,
        upid: &Upid,
        timeout: Duration,
    ) -> Result<TaskOutcome, ProxmoxError> {
        let started = Instant::now();
        let mut delay = FIRST_POLL_DELAY;
        loop {
            match self.task_status(upid).await {
                Ok(status) if !status.is_running() => {
                    let exit_status = status.exitstatus.unwrap_or_else(|| "unknown".into());
                    return self.finish(upid, exit_status).await;
                }
                Ok(_) => {}
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
            tokio::time::sleep(delay.min(timeout - waited)).await;
            delay = (delay.mul_f64(1.6)).min(MAX_POLL_DELAY);
        }
    }

    async fn finish(&self, upid: &Upid, exit_status: String) -> Result<TaskOutcome, ProxmoxError> {
        if exit_status == "OK" || exit_status.starts_with("WARNINGS") {
            if exit_status != "OK" {
                tracing::warn!(%upid, %exit_status, "Proxmox task finished with warnings");
            }
            return Ok(TaskOutcome { exit_status });
        }
        Err(ProxmoxError::TaskFailed {
            task_type: upid.task_type().to_owned(),
            log_tail: self.task_log_tail(upid).await,
            upid: upid.clone(),
            exit_status,
        })
    }
}

fn not_visible_yet(e: &ProxmoxError) -> bool {
    match e {
        ProxmoxError::NotFound { .. } => true,
        // pve-manager answers a task whose status file is not written yet with a parameter error on
        // `upid` (400 "Parameter verification failed.", the reason in `errors.upid`).
        ProxmoxError::Api {
            status,
            message,
            field_errors,
            ..
        } if *status == 400 || *status == 500 => field_errors
            .get("upid")
            .map(String::as_str)
            .into_iter()
            .chain([message.as_str()])
            .any(|text| {
                let t = text.to_ascii_lowercase();
                t.contains("unable to parse worker upid") || t.contains("no such task")
            }),
        _ => false,
    }
}

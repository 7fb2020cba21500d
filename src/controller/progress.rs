//! The two ports a step run writes through. Its progress goes to one place, the text of the
//! request's MachineRequestStatus, which is what Omni shows ("Running step 3/6 create_vm: cloning
//! template 9000 to VM 104 on pve2", "Deprovisioning: shutting down VM 104 on pve2"):
//! [`StatusSink`]. Its decisions go to the provider state: [`StateStore`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::future::BoxFuture;

use super::context::Context;
use crate::model::MachineState;
use crate::omni::proto::specs::machine_request_status_spec::Stage;
use crate::omni::state::StateError;
use crate::pipeline::step::{StatePort, StatusPort, Step};
use crate::rules::provider_data::Problem;

/// What the request is going through, which words the text.
pub enum Phase {
    /// A provisioning step; `warnings` (about the provider data) end every text, so the user sees in
    /// Omni what was ignored.
    Step {
        step: Step,
        warnings: String,
    },
    Deprovisioning,
}

pub struct StatusSink<'a> {
    ctx: &'a Context,
    id: &'a str,
    labels: HashMap<String, String>,
    phase: Phase,
    /// The status `id` (the VM's SMBIOS UUID) every write of this sink sets, once the VM exists, so
    /// linking the machine costs no write of its own; `labels` then carry `infra-id` too.
    machine_id: Option<String>,
    /// Some text of this sink was written (see [`StatusSink::ensure_shown`]).
    shown: AtomicBool,
}

impl<'a> StatusSink<'a> {
    pub fn new(
        ctx: &'a Context,
        id: &'a str,
        labels: HashMap<String, String>,
        machine_id: Option<String>,
        phase: Phase,
    ) -> Self {
        Self {
            ctx,
            id,
            labels,
            phase,
            machine_id,
            shown: AtomicBool::new(false),
        }
    }

    /// Writes the bare line ("Running step 4/6 configure_vm") unless this sink wrote a line already:
    /// a step that says what it is doing straight away costs one write, not two, and a step that
    /// says nothing still shows.
    pub async fn ensure_shown(&self) {
        if !self.shown.load(Ordering::Relaxed) {
            self.show("").await;
        }
    }

    fn text(&self, detail: &str) -> String {
        match &self.phase {
            Phase::Step { step, warnings } => {
                let colon = if detail.is_empty() { "" } else { ": " };
                format!(
                    "Running step {}/{} {}{colon}{detail}{warnings}",
                    step.number(),
                    Step::ALL.len(),
                    step.as_str(),
                )
            }
            Phase::Deprovisioning => format!("Deprovisioning: {detail}"),
        }
    }

    /// Best effort: progress that cannot be written is logged, and the work goes on.
    pub async fn show(&self, detail: &str) {
        let text = self.text(detail);
        tracing::debug!(request = %self.id, "{text}");
        let provisioning = matches!(self.phase, Phase::Step { .. });
        self.shown.store(true, Ordering::Relaxed);
        if let Err(e) = self
            .ctx
            .write_status(self.id, &self.labels, |s| {
                // The error of an earlier failed attempt stays until this step succeeds; the stage
                // stays FAILED meanwhile so Omni keeps showing it.
                if provisioning && s.stage != Stage::Failed as i32 {
                    s.stage = Stage::Provisioning as i32;
                }
                s.status = text.clone();
                if let Some(id) = &self.machine_id {
                    s.id = id.clone();
                }
            })
            .await
        {
            tracing::warn!(request = %self.id, error = %e, "cannot write progress to Omni");
        }
    }
}

impl StatusPort for StatusSink<'_> {
    fn report(&self, detail: String) -> BoxFuture<'_, ()> {
        Box::pin(async move { self.show(&detail).await })
    }
}

/// The provider state of one request as a step run keeps it: each write names the step, in the
/// official provider's words ([`Context::save_machine`]).
pub struct StateStore<'a> {
    pub ctx: &'a Context,
    pub id: &'a str,
    pub step: Step,
}

impl StatePort for StateStore<'_> {
    fn persist<'a>(&'a self, state: &'a MachineState) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(self.ctx.save_machine(self.id, self.step, state))
    }

    fn machine_states(&self) -> BoxFuture<'_, Result<Vec<(String, MachineState)>, StateError>> {
        Box::pin(self.ctx.machine_states())
    }
}

/// ` (warning: disk_sise: is not a known key and is ignored (did you mean `disk_size`?))`, or nothing.
pub fn warnings_text(warnings: &[Problem]) -> String {
    let noun = match warnings.len() {
        0 => return String::new(),
        1 => "warning",
        _ => "warnings",
    };
    let list: Vec<String> = warnings.iter().map(ToString::to_string).collect();
    format!(" ({noun}: {})", list.join("; "))
}

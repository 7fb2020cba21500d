//! Applying a MachineRequest: the running phase of what Omni expects of a provision controller
//! (docs/omni-protocol.md §3.4), with the official Go library's known weaknesses fixed.
//!
//! Finalizer, then the steps from where the provider state says we stopped; the first step's line
//! creates the MachineRequestStatus (stage PROVISIONING, the request's labels). Progress goes to the status text through the
//! [`StatusSink`]. Unlike the Go library:
//! - a failure is shown as the error policy words it ([`super::error_policy`]) and **stays visible**
//!   until the step succeeds on a retry (the Go library cleared it on every retry, omni#2629);
//! - an unknown step name restarts from the beginning instead of skipping to PROVISIONED;
//! - the step annotation and the state fields the Go library and the official provider read are
//!   written in their names and formats ([`Step::go_name`]), so either provider continues the other's
//!   requests at any step;
//! - the `infra-id` label is kept when the request is marked PROVISIONED;
//! - the status `id` is set to the SMBIOS UUID with the first line after the VM exists, and the request ID is encoded
//!   in the join token, so Omni links the machine to its request either way (§3.5).

use std::collections::HashMap;

use tracing::Instrument;

use super::context::{Context, Request, request_info};
use super::error_policy::{ReconcileError, omni};
use super::progress::{Phase, StateStore, StatusSink, warnings_text};
use super::topology;
use super::workqueue::Action;
use crate::model::{Listing, MachineState};
use crate::omni::join::{self, JoinInputs, JoinMode};
use crate::omni::proto::specs::machine_request_status_spec::Stage;
use crate::omni::resources::{
    CONNECTION_PARAMS as LegacyConnectionParams, MACHINE_REQUEST, MACHINE_REQUEST_STATUS,
    PROVIDER_JOIN_CONFIG, SIDEROLINK_API_CONFIG, SIDEROLINK_CONFIG_ID, annotation, label,
};
use crate::omni::state::ResourceRef;
use crate::pipeline::ledgers::Ledgers;
use crate::pipeline::run_step;
use crate::pipeline::step::{RequestInfo, Step, StepContext, StepError, StepOutcome};
use crate::proxmox::ProxmoxClient;
use crate::rules::provider_data::{ProviderData, describe, needs_release_check, release_problems};

/// How long a step may work without saying what it does before its bare line is written.
const SILENT_STEP_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Applies `request`; a failure is shown in its status before it goes to the error policy.
pub async fn apply(ctx: &Context, request: &Request) -> Result<Action, ReconcileError> {
    let run = Provisioning {
        ctx,
        id: request.id(),
        labels: request.metadata.labels.clone(),
    };
    // The reads before the steps are on the heap while they run, so that what the reconcile
    // keeps while it waits for a slot is only what the steps need (see `run_steps`).
    let result = match Box::pin(run.prepare(request)).await {
        Ok(Some(mut ready)) => run.run_steps(&mut ready).await,
        // PROVISIONED already, or a failure.
        prepared => prepared.map(|_| Action::Done),
    };
    // What the status says about the failure is the error policy's to decide.
    if let Err(e) = &result {
        ctx.report_failure(run.id, &run.labels, e).await;
    }
    result
}

/// One request's running phase.
struct Provisioning<'a> {
    ctx: &'a Context,
    id: &'a str,
    labels: HashMap<String, String>,
}

/// What the steps need, read before the first of them runs, and the cluster listing they share.
struct Ready {
    info: RequestInfo,
    /// The Talos join config, carrying the join token.
    join: crate::secret::Secret,
    state: MachineState,
    /// The index in [`Step::ALL`] of the step to run first.
    start: usize,
    cluster: Option<Listing>,
}

impl Provisioning<'_> {
    /// What the steps need, read from Omni: `None` when the request is PROVISIONED already.
    async fn prepare(&self, request: &Request) -> Result<Option<Ready>, ReconcileError> {
        let (ctx, id) = (self.ctx, self.id);
        if !request.has_finalizer(&ctx.owner) {
            ctx.state
                .set_finalizer(&ResourceRef::of(&MACHINE_REQUEST, id), &ctx.owner, true)
                .await
                .map_err(omni("adding our finalizer to the machine request"))?;
            ctx.finalizer_added(id);
        }
        let status = ctx
            .state
            .find(&MACHINE_REQUEST_STATUS, id)
            .await
            .map_err(omni("reading the machine request status"))?;
        if status
            .as_ref()
            .is_some_and(|s| s.spec.stage == Stage::Provisioned as i32)
        {
            return Ok(None);
        }
        // A new request's status is created by its first step's line (or by its error): a "Queued"
        // of its own would cost a write shown for milliseconds.
        let mut info = request_info(request);
        self.check_request(&info, status.is_none()).await?;
        info.image_factory = ctx.talos_factory(&info.talos_version).await;
        let join = self.connection_params(request).await?;
        // The provider state is created by the first decision a step records (or at the end), not
        // here: until then there is nothing in Proxmox a crash or a teardown would need to find.
        let machine = ctx.find_machine(id).await?;
        let state = machine
            .as_ref()
            .map(|m| MachineState::from_spec(&m.spec))
            .unwrap_or_default();
        let start = Step::resume_index(
            state.step.as_deref().unwrap_or_default(),
            machine
                .as_ref()
                .and_then(|m| m.metadata.annotations.get(annotation::STEP))
                .map(String::as_str),
            &state,
        );
        Ok(Some(Ready {
            info,
            join,
            state,
            start,
            cluster: None,
        }))
    }

    /// Provider data is validated before anything is created; bad data never gets as far as
    /// Proxmox. `first_seen`: the request has no status yet, so its warnings are logged (once; the
    /// status text repeats them).
    async fn check_request(
        &self,
        info: &RequestInfo,
        first_seen: bool,
    ) -> Result<(), ReconcileError> {
        let services = &self.ctx.services;
        let data = services
            .provider_data(info, None)
            .map_err(|e| ReconcileError::Refused {
                doing: "validating provider data",
                problem: e.to_string(),
            })?;
        if first_seen {
            for warning in &data.warnings {
                tracing::warn!(request = %self.id, "provider data: {warning}");
            }
        }
        let problem = release_problem(&services.pve, &data, &services.ledgers).await;
        problem.map_or(Ok(()), |problem| {
            Err(ReconcileError::Refused {
                doing: "checking the Proxmox VE release",
                problem,
            })
        })
    }

    /// The steps from `start`, each in the lane of the node the request is on.
    ///
    /// Most of a burst's requests are here, waiting for a slot, and a future is as large as the
    /// largest state it can be in: so everything but the wait is on the heap while it runs (the
    /// step, its status writes, the end), and a waiting request holds its own state and little
    /// more. Measured in a release build: a reconcile's future is 3.1 KiB like this, 11.7 KiB with
    /// the step and its Omni writes part of it; a thousand requests at once wait.
    async fn run_steps(&self, ready: &mut Ready) -> Result<Action, ReconcileError> {
        // A slot in the lane of the node the request is on (placement until it has one), held
        // while it stays there.
        let mut slot = None;
        for step in &Step::ALL[ready.start.min(Step::ALL.len())..] {
            // A listing kept through a wait for a slot would be stale after it, and a thousand
            // requests waiting would each hold one.
            let lane = ready.state.node.clone();
            self.ctx
                .lanes
                .keep_or_enter(&mut slot, lane, || ready.cluster = None)
                .await;
            if let Some(action) = Box::pin(self.step(*step, ready)).await? {
                return Ok(action);
            }
        }
        Box::pin(self.provisioned(ready)).await
    }

    /// Runs `step` and acts on its outcome: `None` to go on with the next step, else what the
    /// reconcile ends with.
    async fn step(&self, step: Step, ready: &mut Ready) -> Result<Option<Action>, ReconcileError> {
        let (outcome, progress) = self.run_step(step, ready).await?;
        let state = &mut ready.state;
        match outcome {
            // The state is written here only after a retry healed a failure; otherwise the next
            // write takes it along: a decision a step must keep before acting on Proxmox is
            // written by the step itself ([`StepContext::persist`]), a requeue, a failure and the
            // end write the state, and a crash in between re-runs steps that find their work done.
            Ok(StepOutcome::Done) => {
                state.step = Some(step.as_str().to_owned());
                if state.last_error.take().is_some() {
                    self.save_state(step, state).await?;
                    self.ctx
                        .write_status(self.id, &self.labels, |s| {
                            s.stage = Stage::Provisioning as i32;
                            s.error.clear();
                        })
                        .await?;
                }
                Ok(None)
            }
            Ok(StepOutcome::Requeue { after, why }) => {
                self.save_state(step, state).await?;
                progress.show(&why).await;
                Ok(Some(Action::RequeueAfter(after)))
            }
            Err(source) => {
                let e = ReconcileError::Step { step, source };
                state.last_error = Some(e.to_string());
                // Best effort: the decisions the step recorded before failing are kept.
                if let Err(save) = self.save_state(step, state).await {
                    tracing::warn!(request = %self.id, error = %save, "cannot record the provider state after a failure");
                }
                self.ctx.services.metrics.provision("failure");
                self.ctx.services.metrics.step_failure(step.as_str());
                Err(e)
            }
        }
    }

    /// Runs one step with its progress going to the status; the sink is handed back for the text of
    /// a requeue.
    async fn run_step(
        &self,
        step: Step,
        ready: &mut Ready,
    ) -> Result<(Result<StepOutcome, StepError>, StatusSink<'_>), ReconcileError> {
        let (services, state) = (&self.ctx.services, &ready.state);
        let node = state.node.as_ref().map(|n| n.as_str());
        let data = services
            .provider_data(&ready.info, node)
            .map_err(|source| ReconcileError::Step { step, source })?;
        // Status `id` = SMBIOS UUID (Omni links the machine by it), label `infra-id` = VMID,
        // written with the first line of the step after the VM came to exist.
        let (labels, machine_id) = match state.vmid {
            Some(_) => (with_infra_id(&self.labels, state), Some(text(&state.uuid))),
            None => (self.labels.clone(), None),
        };
        let warnings = warnings_text(&data.warnings);
        let phase = Phase::Step { step, warnings };
        let progress = StatusSink::new(self.ctx, self.id, labels, machine_id, phase);
        let mut step_ctx = StepContext {
            services,
            request: &ready.info,
            data,
            join: &ready.join,
            state: &mut ready.state,
            status: &progress,
            store: &StateStore {
                ctx: self.ctx,
                id: self.id,
                step,
            },
            cluster: &mut ready.cluster,
        };
        let started = std::time::Instant::now();
        // Every log line inside the step carries the step and node (the reconcile span around it
        // carries the request ID).
        let node = step_ctx.state.node.as_ref().map_or("", |n| n.as_str());
        let span = tracing::info_span!("step", step = step.as_str(), node = %node);
        // The step's bare line is written only if the step says nothing for a moment: most steps
        // say what they are doing at once, and that line names the step too.
        let outcome = {
            let mut work = std::pin::pin!(run_step(step, &mut step_ctx).instrument(span));
            tokio::select! {
                biased;
                outcome = &mut work => outcome,
                () = tokio::time::sleep(SILENT_STEP_GRACE) => {
                    progress.ensure_shown().await;
                    work.await
                }
            }
        };
        drop(step_ctx);
        if matches!(outcome, Ok(StepOutcome::Done)) {
            // A quick step that said nothing still appears in the status once.
            progress.ensure_shown().await;
        }
        services.metrics.step(step.as_str(), started.elapsed());
        Ok((outcome, progress))
    }

    /// After the last step: the machine's topology labels (zone = its node), unless its provider
    /// data turns them off, then PROVISIONED. A failure to label does not fail the machine: the
    /// housekeeping round writes the patch on its next round.
    async fn provisioned(&self, ready: &Ready) -> Result<Action, ReconcileError> {
        let (ctx, id) = (self.ctx, self.id);
        let state = &ready.state;
        if let Some(node) = state.node.as_ref()
            && ctx
                .services
                .provider_data(&ready.info, Some(node.as_str()))
                .is_ok_and(|data| data.topology_labels)
            && let Err(e) = topology::label(ctx, id, node.as_str()).await
        {
            tracing::warn!(request = %id, error = %e, "cannot write the topology labels now; the next housekeeping round will");
        }
        self.save_state(Step::ALL[Step::ALL.len() - 1], state)
            .await?;
        ctx.services.ledgers.placements.release(id);
        let (vmid, node) = (text(&state.vmid), text(&state.node));
        let mut summary = format!("Provisioned: VM {vmid} on {node}");
        if !state.addresses.is_empty() {
            summary += &format!(" ({})", state.addresses.join(", "));
        }
        tracing::info!(request = %id, %vmid, %node, addresses = ?state.addresses, "provisioned");
        ctx.services.metrics.provision("success");
        let uuid = text(&state.uuid);
        ctx.write_status(id, &with_infra_id(&self.labels, state), |s| {
            s.stage = Stage::Provisioned as i32;
            s.status = summary.clone();
            s.error.clear();
            s.id = uuid.clone();
        })
        .await
        .map(|()| Action::Done)
    }

    async fn save_state(&self, step: Step, state: &MachineState) -> Result<(), ReconcileError> {
        self.ctx
            .save_machine(self.id, step, state)
            .await
            .map_err(omni("recording the provider state"))
    }

    /// The join configuration for this request (§4): v2 tokens from ProviderJoinConfig and
    /// SiderolinkAPIConfig, or legacy ConnectionParams on Omni before 1.0.
    async fn connection_params(
        &self,
        request: &Request,
    ) -> Result<crate::secret::Secret, ReconcileError> {
        let ctx = self.ctx;
        let (token, api_url, events_port, logs_port) = match ctx.join_mode {
            JoinMode::V2 => {
                let join = ctx
                    .state
                    .get(&PROVIDER_JOIN_CONFIG, ctx.provider_id())
                    .await
                    .map_err(omni("reading the provider join config"))?;
                let api = ctx
                    .state
                    .get(&SIDEROLINK_API_CONFIG, SIDEROLINK_CONFIG_ID)
                    .await
                    .map_err(omni("reading the SideroLink API config"))?;
                (
                    join.spec.join_token,
                    api.spec.machine_api_advertised_url,
                    api.spec.events_port,
                    api.spec.logs_port,
                )
            }
            JoinMode::Legacy => {
                let p = ctx
                    .state
                    .get(&LegacyConnectionParams, SIDEROLINK_CONFIG_ID)
                    .await
                    .map_err(omni("reading the connection params"))?;
                (
                    p.spec.join_token,
                    p.spec.api_endpoint,
                    p.spec.events_port,
                    p.spec.logs_port,
                )
            }
        };
        join::connection_params(&JoinInputs {
            mode: ctx.join_mode,
            join_token: crate::secret::Secret::new(token),
            api_url,
            events_port: u32::try_from(events_port).unwrap_or(0),
            logs_port: u32::try_from(logs_port).unwrap_or(0),
            grpc_tunnel: request.spec.grpc_tunnel == 1,
            provider_id: ctx.provider_id().to_owned(),
            request_id: request.id().to_owned(),
        })
        .map_err(ReconcileError::Join)
    }
}

/// The request's labels plus `omni.sidero.dev/infra-id` = VMID (kept at PROVISIONED, unlike the Go
/// library, which dropped it).
fn with_infra_id(
    labels: &HashMap<String, String>,
    state: &MachineState,
) -> HashMap<String, String> {
    let mut with = labels.clone();
    let vmid = state.vmid.map_or(0, |v| v.get());
    with.insert(label::INFRA_ID.to_owned(), vmid.to_string());
    with
}

/// An optional value as status text ("" when absent, as the protobuf has it).
fn text<T: ToString>(value: &Option<T>) -> String {
    value.as_ref().map(T::to_string).unwrap_or_default()
}

/// Before provisioning: a key the cluster's Proxmox VE release does not accept (`ha.failback` before
/// PVE 9, `boot: image` before 8.4), as a sentence; `None` when all is well or the version cannot be
/// read (Proxmox then answers for itself when the key is sent). The version is read only for such a
/// key, and at most every ten minutes (the ledgers keep what was read).
async fn release_problem(
    pve: &ProxmoxClient,
    data: &ProviderData,
    known: &Ledgers,
) -> Option<String> {
    if !needs_release_check(data) {
        return None;
    }
    let version = (known.facts.pve_version(pve).await)
        .inspect_err(|e| tracing::debug!(error = %e, "cannot read the Proxmox VE version"))
        .ok()?;
    let problems = release_problems(data, &version);
    (!problems.is_empty()).then(|| describe(&problems))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProviderConfig;
    use serde_json::json;

    const BASE: &str = "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: name == \"local-lvm\"\nnode: pve1\n";

    /// Provisioning asks `GET /version` before anything is created, only when a key needs a release
    /// (`ha.failback`, `boot: image`), and once per ten minutes whatever the number of reconciles; on
    /// PVE 8 the request is refused naming the version instead of failing at HA registration.
    #[tokio::test]
    async fn release_problem_reads_the_version_only_when_needed_and_once() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/api2/json/version"))
            .respond_with(ResponseTemplate::new(200).set_body_json(
                json!({"data": {"version": "8.4.1", "release": "8.4", "repoid": "abc"}}),
            ))
            .expect(1)
            .mount(&server)
            .await;
        let config = ProviderConfig::parse(&format!(
            "proxmox:\n  url: {}\n  tokenID: a@pve!t\n  tokenSecret: s\n  insecureHTTP: true\n",
            server.uri()
        ))
        .unwrap();
        let pve = ProxmoxClient::new(&config.proxmox).unwrap();
        let resolve = |yaml: String| config.layers.resolve(&yaml, None).unwrap();
        let plain = resolve(format!("{BASE}ha:\n  state: started\n"));
        let known = Ledgers::default();
        assert_eq!(release_problem(&pve, &plain, &known).await, None);
        let failback = resolve(format!("{BASE}ha:\n  failback: false\n"));
        let problem = release_problem(&pve, &failback, &known)
            .await
            .expect("refused");
        assert!(
            problem.starts_with("ha.failback: needs Proxmox VE 9"),
            "{problem}"
        );
        assert!(problem.contains("8.4.1"), "{problem}");
        // Again, and for `boot: image` (fine on 8.4): answered from what was read (`expect(1)`).
        assert!(release_problem(&pve, &failback, &known).await.is_some());
        let image = resolve(format!("{BASE}boot: image\n"));
        assert_eq!(release_problem(&pve, &image, &known).await, None);
    }
}

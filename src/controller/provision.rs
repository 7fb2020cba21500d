//! One reconcile of one MachineRequest: what Omni expects of a provision controller (docs/omni-protocol.md §3),
//! with the official Go library's known weaknesses fixed.
//!
//! Running phase: finalizer, MachineRequestStatus (stage PROVISIONING, the request's labels), provider
//! state, then the steps from where the state says we stopped. Progress goes to the status text
//! ("Running step 3/6 create_vm: cloning template 9000 to VM 104 on pve2"). Unlike the Go library:
//! - a failure is shown as the error policy words it ([`super::error_policy`]) and **stays visible**
//!   until the step succeeds on a retry (the Go library cleared it on every retry, omni#2629);
//! - an unknown step name restarts from the beginning instead of skipping to PROVISIONED;
//! - the step annotation and the state fields the Go library and the official provider read are
//!   written in their names and formats ([`Step::go_name`]), so either provider continues the other's
//!   requests at any step;
//! - the `infra-id` label is kept when the request is marked PROVISIONED;
//! - the status `id` is set to the SMBIOS UUID as soon as the VM exists, and the request ID is encoded
//!   in the join token, so Omni links the machine to its request either way (§3.5).
//!
//! Tearing down: see [`super::teardown`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tracing::Instrument;

use super::cache::WriteCache;
use super::error_policy::{self, ReconcileError};
use crate::omni::join::{self, ConnectionParams, JoinInputs, JoinMode};
use crate::omni::proto::provider::MachineSpec;
use crate::omni::proto::specs::{
    MachineRequestSpec, MachineRequestStatusSpec, machine_request_status_spec::Stage,
};
use crate::omni::resources::{
    ConnectionParams as LegacyConnectionParams, MachineRequest, MachineRequestStatus,
    ProviderJoinConfig, ProviderMachine, SIDEROLINK_CONFIG_ID, SiderolinkApiConfig, annotation,
    label, provision_controller_name,
};
use crate::omni::state::{ResourceRef, StateClient, StateError, Typed};
use crate::pipeline::run_step;
use crate::pipeline::step::{
    ClusterView, Progress, RequestInfo, Services, Step, StepContext, StepOutcome,
};

/// What the work queue should do with the request after a reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing more until the request changes.
    Done,
    /// Look again after this long.
    RequeueAfter(Duration),
}

fn omni(doing: &'static str) -> impl FnOnce(StateError) -> ReconcileError {
    ReconcileError::omni(doing)
}

pub struct Provisioner {
    pub services: Arc<Services>,
    pub state: StateClient,
    pub join_mode: JoinMode,
    /// `<id>.ProvisionController`: our finalizer and the owner of what we write.
    pub owner: String,
    statuses: WriteCache<MachineRequestStatus>,
    machines: WriteCache<ProviderMachine>,
}

impl Provisioner {
    pub fn new(services: Arc<Services>, state: StateClient, join_mode: JoinMode) -> Self {
        let owner = provision_controller_name(&services.provider_id);
        let machines = WriteCache::new(ProviderMachine::new(&services.provider_id));
        Self {
            services,
            state,
            join_mode,
            owner,
            statuses: WriteCache::new(MachineRequestStatus),
            machines,
        }
    }

    pub fn provider_id(&self) -> &str {
        &self.services.provider_id
    }

    pub async fn reconcile(&self, id: &str) -> Result<Action, ReconcileError> {
        let Some(request) = self
            .state
            .find(&MachineRequest, id)
            .await
            .map_err(omni("reading the machine request"))?
        else {
            let machine = self
                .state
                .find(&ProviderMachine::new(self.provider_id()), id)
                .await
                .map_err(omni("reading the provider state"))?;
            if machine.is_some() {
                return super::teardown::clean_up_orphaned_state(self, id).await;
            }
            self.forget(id);
            return Ok(Action::Done);
        };
        if request.label(label::INFRA_PROVIDER_ID) != Some(self.provider_id()) {
            return Ok(Action::Done);
        }
        if request.is_tearing_down() {
            return super::teardown::run(self, &request).await;
        }
        let labels: BTreeMap<String, String> = request
            .metadata
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let result = self.provision(&request, &labels).await;
        if let Err(e) = &result {
            self.report_failure(id, &labels, e).await;
        }
        result
    }

    /// The running phase (§3.4), up to the first failure; what the status says about the failure is
    /// the error policy's to decide.
    async fn provision(
        &self,
        request: &Typed<MachineRequestSpec>,
        labels: &BTreeMap<String, String>,
    ) -> Result<Action, ReconcileError> {
        let id = request.id();
        if !request.has_finalizer(&self.owner) {
            self.state
                .add_finalizer(&ResourceRef::of(&MachineRequest, id), &self.owner)
                .await
                .map_err(omni("adding our finalizer to the machine request"))?;
        }
        let status = self.status(id).await?;
        if status
            .as_ref()
            .is_some_and(|s| s.spec.stage == Stage::Provisioned as i32)
        {
            return Ok(Action::Done);
        }
        if status.is_none() {
            self.write_status(id, labels, |s| {
                s.stage = Stage::Provisioning as i32;
                s.status = "Queued".into();
            })
            .await?;
        }

        let info = request_info(request);
        // Provider data is validated before anything is created; bad data never gets as far as
        // Proxmox.
        match self.services.provider_data(&info, None) {
            Err(e) => {
                return Err(ReconcileError::Refused {
                    doing: "validating provider data",
                    problem: e.to_string(),
                });
            }
            Ok(data) => {
                // Logged once, when the request is first seen; the status text repeats them.
                if status.is_none() {
                    for warning in &data.warnings {
                        tracing::warn!(request = %id, "provider data: {warning}");
                    }
                }
                if let Some(problem) =
                    crate::validate::release_problem(&self.services.pve, &data).await
                {
                    return Err(ReconcileError::Refused {
                        doing: "checking the Proxmox VE release",
                        problem,
                    });
                }
            }
        }
        let join = self.connection_params(request).await?;
        let machine = self
            .state
            .modify(
                &ProviderMachine::new(self.provider_id()),
                id,
                &self.owner,
                |_| {},
            )
            .await
            .map_err(omni("creating the provider state"))?;
        let mut spec = machine.spec.clone();
        let start = Step::resume_index(
            &spec.step,
            machine
                .metadata
                .annotations
                .get(annotation::STEP)
                .map(String::as_str),
            &spec,
        );
        self.run_steps(id, labels, &info, &join, &mut spec, start)
            .await
    }

    async fn run_steps(
        &self,
        id: &str,
        labels: &BTreeMap<String, String>,
        info: &RequestInfo,
        join: &ConnectionParams,
        spec: &mut MachineSpec,
        start: usize,
    ) -> Result<Action, ReconcileError> {
        let total = Step::ALL.len();
        let mut cluster: Option<ClusterView> = None;
        for step in &Step::ALL[start.min(total)..] {
            let step = *step;
            let node = (!spec.node.is_empty()).then(|| spec.node.clone());
            let data = self
                .services
                .provider_data(info, node.as_deref())
                .map_err(|source| ReconcileError::Step { step, source })?;
            let progress = StatusProgress {
                provisioner: self,
                id,
                labels,
                step,
                warnings: warnings_text(&data.warnings),
            };
            progress.set_text(String::new()).await;
            let outcome = {
                let mut ctx = StepContext {
                    services: &self.services,
                    request: info,
                    data,
                    join,
                    state: spec,
                    progress: &progress,
                    cluster: &mut cluster,
                };
                let started = std::time::Instant::now();
                // Every log line inside the step carries the step and node (the reconcile span
                // around it carries the request ID).
                let span = tracing::info_span!("step", step = step.name(), node = %ctx.state.node);
                let outcome = run_step(step, &mut ctx).instrument(span).await;
                self.services.metrics.step(step.name(), started.elapsed());
                outcome
            };
            match outcome {
                Ok(StepOutcome::Done) => {
                    spec.step = step.name().to_owned();
                    let recovered = !std::mem::take(&mut spec.last_error).is_empty();
                    self.save_state(id, step, spec).await?;
                    if recovered {
                        self.write_status(id, labels, |s| {
                            s.stage = Stage::Provisioning as i32;
                            s.error.clear();
                        })
                        .await?;
                    }
                    if step == Step::CreateVm {
                        self.link_machine(id, labels, spec).await?;
                    }
                }
                Ok(StepOutcome::Requeue { after, why }) => {
                    self.save_state(id, step, spec).await?;
                    progress.set_text(why).await;
                    return Ok(Action::RequeueAfter(after));
                }
                Err(source) => {
                    let e = ReconcileError::Step { step, source };
                    spec.last_error = e.to_string();
                    // Best effort: the decisions the step recorded before failing are kept.
                    if let Err(save) = self.save_state(id, step, spec).await {
                        tracing::warn!(request = %id, error = %save, "cannot record the provider state after a failure");
                    }
                    self.services.metrics.provision("failure");
                    return Err(e);
                }
            }
        }
        self.services.ledgers.release_reservation(id);
        let summary = format!(
            "Provisioned: VM {} on {}{}",
            spec.vmid,
            spec.node,
            if spec.addresses.is_empty() {
                String::new()
            } else {
                format!(" ({})", spec.addresses.join(", "))
            }
        );
        tracing::info!(request = %id, vmid = spec.vmid, node = %spec.node, addresses = ?spec.addresses, "provisioned");
        self.services.metrics.provision("success");
        let uuid = spec.uuid.clone();
        self.write_status(id, &with_infra_id(labels, spec), |s| {
            s.stage = Stage::Provisioned as i32;
            s.status = summary.clone();
            s.error.clear();
            s.id = uuid.clone();
        })
        .await?;
        Ok(Action::Done)
    }

    /// Status `id` = SMBIOS UUID (Omni links the machine by it), label `infra-id` = VMID.
    async fn link_machine(
        &self,
        id: &str,
        labels: &BTreeMap<String, String>,
        spec: &MachineSpec,
    ) -> Result<(), ReconcileError> {
        let uuid = spec.uuid.clone();
        self.write_status(id, &with_infra_id(labels, spec), |s| s.id = uuid.clone())
            .await
    }

    async fn status(
        &self,
        id: &str,
    ) -> Result<Option<Typed<MachineRequestStatusSpec>>, ReconcileError> {
        self.state
            .find(&MachineRequestStatus, id)
            .await
            .map_err(omni("reading the machine request status"))
    }

    /// Modifies the status (creating it with the request's labels); labels we add are kept.
    pub(crate) async fn write_status(
        &self,
        id: &str,
        labels: &BTreeMap<String, String>,
        mut mutate: impl FnMut(&mut MachineRequestStatusSpec),
    ) -> Result<(), ReconcileError> {
        self.statuses
            .modify(&self.state, id, &self.owner, |s| {
                for (k, v) in labels {
                    s.metadata.labels.insert(k.clone(), v.clone());
                }
                mutate(&mut s.spec);
            })
            .await
            .map(|_| ())
            .map_err(omni("writing the machine request status"))
    }

    /// Shows a failure in the status as the error policy words it. Best effort: the retry comes
    /// either way, and a status that cannot be written now is written by the next attempt.
    pub(crate) async fn report_failure(
        &self,
        id: &str,
        labels: &BTreeMap<String, String>,
        error: &ReconcileError,
    ) {
        let Some(report) = error_policy::report(error) else {
            return;
        };
        let written = self
            .write_status(id, labels, |s| {
                if let Some(stage) = report.stage {
                    s.stage = stage as i32;
                }
                s.status = report.status.clone();
                s.error = report.error.clone();
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(request = %id, error = %e, "cannot show the failure in Omni");
        }
    }

    async fn save_state(
        &self,
        id: &str,
        step: Step,
        spec: &MachineSpec,
    ) -> Result<(), ReconcileError> {
        self.save_machine(id, step, spec)
            .await
            .map_err(omni("recording the provider state"))
    }

    /// Writes the provider state spec, and in the step annotation the official provider's name for
    /// the step that ran ([`Step::go_name`]), so it can continue from here.
    async fn save_machine(
        &self,
        id: &str,
        step: Step,
        spec: &MachineSpec,
    ) -> Result<(), StateError> {
        self.machines
            .modify(&self.state, id, &self.owner, |m| {
                m.spec = spec.clone();
                m.metadata
                    .annotations
                    .insert(annotation::STEP.to_owned(), step.go_name(spec).to_owned());
            })
            .await
            .map(|_| ())
    }

    /// The join configuration for this request (§4): v2 tokens from ProviderJoinConfig and
    /// SiderolinkAPIConfig, or legacy ConnectionParams on Omni before 1.0.
    async fn connection_params(
        &self,
        request: &Typed<MachineRequestSpec>,
    ) -> Result<ConnectionParams, ReconcileError> {
        let (token, api_url, events_port, logs_port) = match self.join_mode {
            JoinMode::V2 => {
                let join = self
                    .state
                    .get(&ProviderJoinConfig, self.provider_id())
                    .await
                    .map_err(omni("reading the provider join config"))?;
                let api = self
                    .state
                    .get(&SiderolinkApiConfig, SIDEROLINK_CONFIG_ID)
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
                let p = self
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
            mode: self.join_mode,
            join_token: crate::secret::Secret::new(token),
            api_url,
            events_port: u32::try_from(events_port).unwrap_or(0),
            logs_port: u32::try_from(logs_port).unwrap_or(0),
            grpc_tunnel: request.spec.grpc_tunnel == 1,
            provider_id: self.provider_id().to_owned(),
            request_id: Some(request.id().to_owned()),
        })
        .map_err(ReconcileError::Join)
    }

    /// Drops in-memory bookkeeping for a request that is gone.
    pub fn forget(&self, id: &str) {
        self.statuses.forget(id);
        self.machines.forget(id);
        self.services.ledgers.release_reservation(id);
    }
}

/// The request's labels plus `omni.sidero.dev/infra-id` = VMID (kept at PROVISIONED, unlike the Go
/// library, which dropped it).
fn with_infra_id(
    labels: &BTreeMap<String, String>,
    spec: &MachineSpec,
) -> BTreeMap<String, String> {
    let mut with = labels.clone();
    with.insert(label::INFRA_ID.to_owned(), spec.vmid.to_string());
    with
}

pub fn request_info(request: &Typed<MachineRequestSpec>) -> RequestInfo {
    let spec = &request.spec;
    RequestInfo {
        id: request.id().to_owned(),
        set_id: request.label(label::MACHINE_REQUEST_SET).map(str::to_owned),
        talos_version: spec.talos_version.clone(),
        extensions: spec.extensions.clone(),
        kernel_args: spec.kernel_args.clone(),
        meta_values: spec
            .meta_values
            .iter()
            .map(|m| (m.key, m.value.clone()))
            .collect(),
        overlay: spec
            .overlay
            .as_ref()
            .filter(|o| !o.image.is_empty() || !o.name.is_empty())
            .map(|o| (o.image.clone(), o.name.clone())),
        provider_data: spec.provider_data.clone(),
    }
}

/// Writes step progress into the MachineRequestStatus.
struct StatusProgress<'a> {
    provisioner: &'a Provisioner,
    id: &'a str,
    labels: &'a BTreeMap<String, String>,
    step: Step,
    /// Appended to every progress text so the user sees in Omni what was ignored.
    warnings: String,
}

/// ` (warning: disk_sise: is not a known key and is ignored (did you mean `disk_size`?))`, or nothing.
fn warnings_text(warnings: &[crate::pipeline::provider_data::Problem]) -> String {
    if warnings.is_empty() {
        return String::new();
    }
    let list: Vec<String> = warnings.iter().map(ToString::to_string).collect();
    let noun = if list.len() == 1 {
        "warning"
    } else {
        "warnings"
    };
    format!(" ({noun}: {})", list.join("; "))
}

impl StatusProgress<'_> {
    async fn set_text(&self, detail: String) {
        let text = format!(
            "Running step {}/{} {}{}{}",
            self.step.number(),
            Step::ALL.len(),
            self.step.name(),
            if detail.is_empty() {
                String::new()
            } else {
                format!(": {detail}")
            },
            self.warnings
        );
        tracing::debug!(request = %self.id, step = self.step.name(), "{text}");
        // The error of an earlier failed attempt stays until this step succeeds; the stage stays FAILED
        // meanwhile so Omni keeps showing it.
        if let Err(e) = self
            .provisioner
            .write_status(self.id, self.labels, |s| {
                if s.stage != Stage::Failed as i32 {
                    s.stage = Stage::Provisioning as i32;
                }
                s.status = text.clone();
            })
            .await
        {
            tracing::warn!(request = %self.id, error = %e, "cannot write progress to Omni");
        }
    }
}

impl Progress for StatusProgress<'_> {
    fn report(&self, detail: String) -> BoxFuture<'_, ()> {
        Box::pin(self.set_text(detail))
    }

    fn persist<'a>(&'a self, state: &'a MachineSpec) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(self.provisioner.save_machine(self.id, self.step, state))
    }
}

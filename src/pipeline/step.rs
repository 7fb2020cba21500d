//! The six provisioning steps, what they share, and how they report.
//!
//! Steps run in order; each reads what the previous ones recorded in the provider state
//! ([`MachineState`]) and records what it decided, so a restart at any point resumes at the first step
//! not yet done, and re-running a step is always safe. A step returns [`StepOutcome::Done`], asks to
//! be called again later ([`StepOutcome::Requeue`], for waits that take long, such as a guest agent
//! coming up: a requeue never holds a worker), or fails with a [`StepError`] whose text is what the
//! user reads in Omni.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::config::ProviderConfig;
use crate::model::{Listing, MachineState};
use crate::pipeline::ledgers::Ledgers;

use crate::omni::join::ConnectionParams;
use crate::omni::management::ManagementClient;
use crate::omni::state::StateError;
use crate::proxmox::types::{NodeName, Upid, VmId};
use crate::proxmox::{ProxmoxClient, ProxmoxError};
use crate::rules::provider_data::{ProviderData, ProviderDataSchema, describe};

/// The steps, in order. Names are persisted in the provider state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    PickNode,
    PrepareImage,
    CreateVm,
    ConfigureVm,
    StartVm,
    DiscoverIp,
}

impl Step {
    pub const ALL: [Step; 6] = [
        Step::PickNode,
        Step::PrepareImage,
        Step::CreateVm,
        Step::ConfigureVm,
        Step::StartVm,
        Step::DiscoverIp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Step::PickNode => "pick_node",
            Step::PrepareImage => "prepare_image",
            Step::CreateVm => "create_vm",
            Step::ConfigureVm => "configure_vm",
            Step::StartVm => "start_vm",
            Step::DiscoverIp => "discover_ip",
        }
    }

    /// 1-based position, for "step 3/6".
    pub fn number(self) -> usize {
        Self::ALL.iter().position(|s| *s == self).unwrap_or(0) + 1
    }

    /// The official provider's name for the step of its own that this step's work corresponds to,
    /// written to the `infra.omni.sidero.dev/step` annotation after the step ran (done or not), as the
    /// Go library writes the name of the step it last ran.
    ///
    /// The Go library resumes by skipping every step until the annotated one and running that one
    /// again (an unknown name skips them all and marks the request provisioned with no VM), so the
    /// name must be one of its steps and its re-run must be harmless given the state fields we wrote:
    /// - `pickNode` picks a node again (nothing exists yet);
    /// - `uploadISO` checks the recorded download task, or finds the ISO by name, or downloads it;
    ///   without a schematic (clone mode) it could build no URL, so `createSchematic` is named instead;
    /// - `syncVM` checks the recorded create task instead of creating a VM; with no create task
    ///   recorded (a VM adopted rather than created by us) it would create a second VM, so once a
    ///   VMID is recorded without a create task `startVM` is named instead;
    /// - `startVM` checks the recorded start task instead of starting again. Its later steps
    ///   (`registerHA`, `syncHARules`) check what exists before they act.
    pub fn go_name(self, state: &MachineState) -> &'static str {
        match self {
            Step::PickNode => "pickNode",
            Step::PrepareImage if state.schematic.is_none() => "createSchematic",
            Step::PrepareImage => "uploadISO",
            Step::CreateVm | Step::ConfigureVm
                if state.vmid.is_some() && state.vm_create_task.is_none() =>
            {
                "startVM"
            }
            Step::CreateVm | Step::ConfigureVm => "syncVM",
            Step::StartVm | Step::DiscoverIp => "startVM",
        }
    }

    /// Where to resume. `last_done` is our own record (field 21: the last step completed);
    /// `annotation` is the step annotation, written by us or by the official provider, naming the
    /// Go step last run (to be run again).
    ///
    /// When the annotation agrees with our record (it names the Go step of `last_done` or of the step
    /// after it), our finer record decides. Otherwise the official provider ran last and its
    /// annotation decides: its step is run again in our terms. A Go step before the VM exists maps to
    /// `prepare_image` at the latest, which is cheap and fills our own fields (the full ISO volume ID)
    /// from its bare ones; `syncVM` then finds its VM by the recorded VMID.
    pub fn resume_index(last_done: &str, annotation: Option<&str>, state: &MachineState) -> usize {
        let ours = Self::ALL.iter().position(|s| s.name() == last_done);
        let Some(annotation) = annotation else {
            return ours.map_or(0, |i| i + 1);
        };
        if let Some(i) = ours {
            let agrees = Self::ALL[i].go_name(state) == annotation
                || Self::ALL
                    .get(i + 1)
                    .is_some_and(|next| next.go_name(state) == annotation);
            if agrees {
                return i + 1;
            }
        }
        let go = GO_STEPS
            .iter()
            .find(|(name, _)| *name == annotation)
            .map(|(_, ours)| *ours);
        match (go, ours) {
            // The official provider records the node but none of what our `pick_node` decides with
            // it (the boot disk's storage, the copy to clone); before a VM exists `pick_node` runs
            // again, and keeps the node when the rest of the decision fits it.
            (Some(_), _) if state.storage.is_none() && state.recorded_vmid().is_none() => 0,
            (Some(step), _) => step.number() - 1,
            // Our own step names: a state this provider wrote with them is read as it was meant.
            (None, Some(i)) => i + 1,
            (None, None) => 0,
        }
    }
}

/// Every step name the official provider has written into the step annotation, in its order, and
/// the step of ours that runs again when we take a request over from it (the table in the README's
/// migration section). siderolabs/omni-infra-provider-proxmox `internal/pkg/provider/provision.go`,
/// `ProvisionSteps`: `configureHostname` existed from November 2025 to February 2026;
/// `registerHA` and `syncHARules` come after `startVM` from its HA support on.
///
/// A step before the VM exists maps to `prepare_image`, which is cheap and fills our own fields from
/// its bare ones; `syncVM` then finds its VM by the recorded VMID (`create_vm` adopts it). From
/// `startVM` on the VM exists and may run: `start_vm` checks it, starts it only if it is stopped,
/// and joins HA idempotently, which is what `registerHA` and `syncHARules` did.
pub const GO_STEPS: [(&str, Step); 8] = [
    ("pickNode", Step::PickNode),
    ("createSchematic", Step::PrepareImage),
    ("uploadISO", Step::PrepareImage),
    ("configureHostname", Step::PrepareImage),
    ("syncVM", Step::PrepareImage),
    ("startVM", Step::StartVm),
    ("registerHA", Step::StartVm),
    ("syncHARules", Step::StartVm),
];

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a step asks the controller to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    Done,
    /// Run this step again after `after`; `why` is shown in Omni meanwhile.
    Requeue {
        after: Duration,
        why: String,
    },
}

/// A step failure, worded for the person reading Omni's machine status. What happens next is the
/// controller's error policy's to decide, from the variant and the Proxmox or Omni error inside.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// Provider data or config that cannot work; retrying will not help until it changes.
    #[error("{0}")]
    Config(String),
    /// Proxmox refused or failed; `doing` says what we were doing ("cloning template 9000 to VM 104
    /// on pve2").
    #[error("{doing}: {source}")]
    Proxmox {
        doing: String,
        #[source]
        source: Box<ProxmoxError>,
    },
    #[error("{doing}: {source}")]
    Omni {
        doing: String,
        #[source]
        source: Box<StateError>,
    },
    /// The cluster is not in a state where the step can succeed (no template, no ISO storage, ...).
    #[error("{0}")]
    Cluster(String),
    /// The cluster has no room for the VM right now (nodes offline, memory or storage short) but may
    /// make room by itself: waited for, not a failure someone must fix.
    #[error("{0}")]
    Capacity(String),
    /// A static IP pool has no free address: FAILED until a machine on it goes away, and retried
    /// meanwhile, since a release heals it without anyone changing anything.
    #[error("{0}")]
    PoolFull(String),
}

impl StepError {
    pub fn proxmox(doing: impl Into<String>) -> impl FnOnce(ProxmoxError) -> StepError {
        let doing = doing.into();
        move |source| StepError::Proxmox {
            doing,
            source: Box::new(source),
        }
    }

    pub fn omni(doing: impl Into<String>) -> impl FnOnce(StateError) -> StepError {
        let doing = doing.into();
        move |source| StepError::Omni {
            doing,
            source: Box::new(source),
        }
    }
}

/// The MachineRequest as the steps need it.
#[derive(Debug, Clone)]
pub struct RequestInfo {
    pub id: String,
    pub set_id: Option<String>,
    pub talos_version: String,
    pub extensions: Vec<String>,
    pub kernel_args: Vec<String>,
    pub meta_values: Vec<(u32, String)>,
    pub overlay: Option<(String, String)>,
    pub provider_data: String,
    /// The Image Factory Omni uses for this Talos version when it is not the one in
    /// [`Services::image_factory_url`] (Omni's `TalosVersions` resource names it).
    pub image_factory: Option<String>,
}

impl RequestInfo {
    /// The factory this request's boot images come from: the one Omni made its schematic on.
    pub fn factory<'a>(&'a self, services: &'a Services) -> &'a str {
        self.image_factory
            .as_deref()
            .unwrap_or(&services.image_factory_url)
    }
}

/// Long-lived pieces every reconcile shares: clients, config, and the in-memory ledgers that make
/// concurrent requests behave.
pub struct Services {
    pub provider_id: String,
    pub pve: ProxmoxClient,
    pub management: ManagementClient,
    pub config: ProviderConfig,
    pub schema: ProviderDataSchema,
    pub ledgers: Ledgers,
    /// Image factory base URL for boot ISOs.
    pub image_factory_url: String,
    /// HTTP client for the Image Factory (schematics on Omni before 1.8, and boot images from a
    /// factory that needs credentials).
    pub factory_http: reqwest::Client,
    /// Credentials of the factories that need them (`--image-factory-auth-file`).
    pub factory_auth: super::factory_auth::FactoryAuth,
    pub timeouts: Timeouts,
    pub metrics: Arc<crate::metrics::Metrics>,
}

#[derive(Debug, Clone)]
pub struct Timeouts {
    /// Create, clone, config, upload, start tasks.
    pub task: Duration,
    /// Image downloads by the node.
    pub download: Duration,
    /// How often to ask the guest agent while waiting for an address.
    pub agent_poll: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            task: Duration::from_secs(600),
            download: Duration::from_secs(1800),
            agent_poll: Duration::from_secs(5),
        }
    }
}

impl Services {
    /// Resolves provider data for `request`, with the chosen node's override once it is known.
    pub fn provider_data(
        &self,
        request: &RequestInfo,
        node: Option<&str>,
    ) -> Result<ProviderData, StepError> {
        let invalid = |problems: Vec<crate::rules::provider_data::Problem>| {
            StepError::Config(format!("invalid provider data: {}", describe(&problems)))
        };
        let mut data = self
            .schema
            .resolve_with(&request.provider_data, node, &self.config.layers)
            .map_err(invalid)?;
        crate::rules::ip_pool::apply_networks(&mut data, &self.config.ip_pools).map_err(invalid)?;
        let refused = self.config.policy.check(&data);
        if !refused.is_empty() {
            return Err(invalid(refused));
        }
        Ok(data)
    }
}

/// How a step reports progress in Omni while it works (written to the MachineRequestStatus).
pub trait Progress: Send + Sync {
    fn report(&self, detail: String) -> futures_util::future::BoxFuture<'_, ()>;
    /// Writes the provider state now (a step records a decision before acting on it).
    fn persist<'a>(
        &'a self,
        state: &'a MachineState,
    ) -> futures_util::future::BoxFuture<'a, Result<(), StateError>>;
    /// Every provider state of this provider in Omni, by request ID: what the IP ledger is seeded
    /// from.
    fn machine_states(
        &self,
    ) -> futures_util::future::BoxFuture<'_, Result<Vec<(String, MachineState)>, StateError>>;
}

/// What one step run gets.
pub struct StepContext<'a> {
    pub services: &'a Services,
    pub request: &'a RequestInfo,
    /// Provider data, resolved with the chosen node's override once there is a node.
    pub data: ProviderData,
    pub join: &'a ConnectionParams,
    pub state: &'a mut MachineState,
    pub progress: &'a dyn Progress,
    /// `/cluster/resources` read earlier in this reconcile, reused while fresh.
    pub cluster: &'a mut Option<Listing>,
}

/// The request's VM and the node it is on.
#[derive(Debug, Clone)]
pub struct VmAt {
    pub node: NodeName,
    pub vmid: VmId,
}

/// A Proxmox task a step started, with the words its progress line and errors use.
#[derive(Debug)]
pub struct StartedTask {
    pub upid: Upid,
    pub doing: String,
}

/// Reads reused within one reconcile are this fresh at most.
const CLUSTER_VIEW_MAX_AGE: Duration = Duration::from_secs(2);

/// A reconcile's first read may be another request's read this recent: requests starting together
/// (a burst of one machine set) share one listing. What they decide from it that the listing cannot
/// show yet (placements, VMIDs, pools being made) is held in the ledgers until it is visible.
const SHARED_LISTING_MAX_AGE: Duration = Duration::from_secs(1);

impl StepContext<'_> {
    /// The node `pick_node` recorded: what every later step acts on.
    pub fn placed(&self) -> Result<NodeName, StepError> {
        self.state
            .node
            .clone()
            .ok_or_else(|| StepError::Cluster("the provider state has no valid node yet".into()))
    }

    /// The VM `create_vm` recorded and where it is: what the steps after it act on.
    pub fn made(&self) -> Result<VmAt, StepError> {
        let node = self.placed()?;
        let vmid = self
            .state
            .vmid
            .ok_or_else(|| StepError::Cluster("the provider state has no VMID yet".into()))?;
        Ok(VmAt { node, vmid })
    }

    /// The cluster as `/cluster/resources` shows it; re-read unless read moments ago in this
    /// reconcile. The listing is shared, not copied: keep it across calls that need the context
    /// mutably.
    pub async fn cluster(&mut self, fresh: bool) -> Result<Listing, StepError> {
        if let Some(listing) = self.cluster.as_ref()
            && !fresh
            && listing.read_at.elapsed() <= CLUSTER_VIEW_MAX_AGE
        {
            return Ok(listing.clone());
        }
        let shared = if fresh {
            Duration::ZERO
        } else {
            // Never a listing older than the last dropped reservation: it may lack that VM,
            // which then counts nowhere.
            self.services
                .ledgers
                .placements
                .since_dropped()
                .map_or(SHARED_LISTING_MAX_AGE, |d| d.min(SHARED_LISTING_MAX_AGE))
        };
        let listing: Listing = self
            .services
            .pve
            .cluster_listing_within(shared)
            .await
            .map_err(StepError::proxmox("reading the cluster state"))?;
        *self.cluster = Some(listing.clone());
        Ok(listing)
    }

    pub async fn report(&self, detail: impl Into<String>) {
        self.progress.report(detail.into()).await;
    }

    /// Says what the step is doing (the machine's status text), then makes `call`, which starts a
    /// Proxmox task. Any error names what was being done. Use [`Self::finish_task`] after recording
    /// the task where a crash must find it again, or [`Self::run_task`] for both at once.
    pub async fn start_task(
        &self,
        doing: String,
        call: impl Future<Output = Result<Upid, ProxmoxError>>,
    ) -> Result<StartedTask, StepError> {
        self.report(doing.clone()).await;
        match call.await {
            Ok(upid) => Ok(StartedTask { upid, doing }),
            Err(e) => Err(StepError::proxmox(doing)(e)),
        }
    }

    /// Waits for a task [`Self::start_task`] started, for at most `timeout`. A failed task's error
    /// names what was being done and carries the task log's last lines.
    pub async fn finish_task(
        &self,
        task: StartedTask,
        timeout: Duration,
    ) -> Result<Upid, StepError> {
        match self.services.pve.wait_for_task(&task.upid, timeout).await {
            Ok(_) => Ok(task.upid),
            Err(e) => Err(StepError::proxmox(task.doing)(e)),
        }
    }

    /// [`Self::start_task`] and [`Self::finish_task`], for a task with nothing to record in between.
    pub async fn run_task(
        &self,
        doing: String,
        timeout: Duration,
        call: impl Future<Output = Result<Upid, ProxmoxError>>,
    ) -> Result<Upid, StepError> {
        let task = self.start_task(doing, call).await?;
        self.finish_task(task, timeout).await
    }

    pub async fn persist(&self) -> Result<(), StepError> {
        self.progress
            .persist(self.state)
            .await
            .map_err(StepError::omni("recording the provider state"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_points() {
        let st = MachineState::default();
        assert_eq!(Step::resume_index("", None, &st), 0);
        assert_eq!(Step::resume_index("pick_node", None, &st), 1);
        assert_eq!(Step::resume_index("discover_ip", None, &st), 6);
        // The Go provider's annotation names the step to run again.
        assert_eq!(Step::resume_index("", Some("pickNode"), &st), 0);
        // Before its VM exists the official provider has recorded no storage: placement again.
        assert_eq!(Step::resume_index("", Some("uploadISO"), &st), 0);
        assert_eq!(Step::resume_index("", Some("syncVM"), &st), 0);
        let mut vm = MachineState::default();
        vm.vmid = VmId::new(150).ok();
        assert_eq!(Step::resume_index("", Some("syncVM"), &vm), 1);
        assert_eq!(Step::resume_index("", Some("configureHostname"), &vm), 1);
        assert_eq!(Step::resume_index("", Some("startVM"), &vm), 4);
        // The newest official release's steps after the start: the VM exists and may run, so we
        // resume at our start step, not at placement.
        assert_eq!(Step::resume_index("", Some("registerHA"), &vm), 4);
        assert_eq!(Step::resume_index("", Some("syncHARules"), &vm), 4);
        assert_eq!(Step::resume_index("pick_node", Some("syncHARules"), &vm), 4);
        assert_eq!(Step::resume_index("", Some("bogus"), &st), 0);
        // Our record and our annotation agree: our record decides.
        assert_eq!(Step::resume_index("create_vm", Some("syncVM"), &st), 3);
        assert_eq!(Step::resume_index("configure_vm", Some("startVM"), &st), 4);
        // The Go provider ran after us (its annotation is ahead of our record): it decides.
        assert_eq!(Step::resume_index("pick_node", Some("startVM"), &vm), 4);
        // Our old snake_case annotation.
        assert_eq!(Step::resume_index("create_vm", Some("create_vm"), &st), 3);
        assert_eq!(Step::CreateVm.number(), 3);
    }

    #[test]
    fn annotation_names_are_go_step_names() {
        // omni-infra-provider-proxmox internal/pkg/provider/provision.go, ProvisionSteps: the Go
        // provider's steps are pickNode, createSchematic, uploadISO, (configureHostname from Nov 2025
        // to Feb 2026), syncVM, startVM (then registerHA, syncHARules in its newest releases);
        // Omni's client/pkg/infra/controllers/provision.go, reconcileRunning, skips steps until the
        // annotated name, so only names every release knows are written.
        let every_release = [
            "pickNode",
            "createSchematic",
            "uploadISO",
            "syncVM",
            "startVM",
        ];
        let mut iso = MachineState::default();
        iso.schematic = Some("abc".into());
        let mut adopted = iso.clone();
        adopted.vmid = VmId::new(150).ok();
        for st in [MachineState::default(), iso, adopted] {
            for step in Step::ALL {
                assert!(every_release.contains(&step.go_name(&st)), "{step}");
            }
        }
        for (name, _) in GO_STEPS {
            assert!(
                every_release.contains(&name)
                    || ["configureHostname", "registerHA", "syncHARules"].contains(&name),
                "{name}"
            );
        }
    }

    #[test]
    fn an_adopted_vm_without_a_create_task_resumes_the_official_provider_at_its_start() {
        // The official provider's syncVM creates a VM whenever no create task is recorded
        // (internal/pkg/provider/provision.go, ProvisionSteps, syncVM: `VmCreateTask != ""` is its
        // only check), so for a VM we adopted it must not be told to run syncVM again.
        let mut st = MachineState::default();
        st.schematic = Some("abc".into());
        st.vmid = VmId::new(150).ok();
        assert_eq!(Step::CreateVm.go_name(&st), "startVM");
        assert_eq!(Step::ConfigureVm.go_name(&st), "startVM");
        assert_eq!(Step::resume_index("create_vm", Some("startVM"), &st), 3);
        st.vm_create_task =
            Upid::parse("UPID:pve1:0000AAAA:00000001:65000000:qmcreate:150:root@pam:").ok();
        assert_eq!(Step::CreateVm.go_name(&st), "syncVM");
        st.vm_create_task = None;
        st.vmid = None;
        st.reserved_vmid = VmId::new(150).ok();
        assert_eq!(
            Step::CreateVm.go_name(&st),
            "syncVM",
            "no VM yet: syncVM makes it"
        );
    }
}

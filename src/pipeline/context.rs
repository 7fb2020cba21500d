//! What one step run gets ([`StepContext`]): the request, its provider data and state, the
//! cluster listing read in this reconcile, and the ways to report and to run Proxmox tasks.

use std::time::Duration;

use super::error::StepError;
use super::services::{RequestInfo, Services, TASK_TIMEOUT};
use crate::model::{Listing, MachineState};
use crate::omni::state::StateError;
use crate::proxmox::ProxmoxError;
use crate::proxmox::types::{NodeName, Upid, VmId};
use crate::rules::provider_data::ProviderData;
use crate::rules::vm_config::VmIdentity;

/// Where a step's progress shows while it works: the request's status text in Omni.
pub trait StatusPort: Send + Sync {
    fn report(&self, detail: String) -> futures_util::future::BoxFuture<'_, ()>;
}

/// Where the steps' decisions are kept: the provider state in Omni.
pub trait StatePort: Send + Sync {
    /// Writes the request's provider state now (a step records a decision before acting on it).
    fn persist<'a>(
        &'a self,
        state: &'a MachineState,
    ) -> futures_util::future::BoxFuture<'a, Result<(), StateError>>;
    /// Every provider state of this provider, by request ID: what the IP ledger is seeded from.
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
    /// The Talos join config (the seed's user-data), carrying the join token.
    pub join: &'a crate::secret::Secret,
    pub state: &'a mut MachineState,
    pub status: &'a dyn StatusPort,
    pub store: &'a dyn StatePort,
    /// `/cluster/resources` read earlier in this reconcile, reused while fresh.
    pub cluster: &'a mut Option<Listing>,
}

/// A Proxmox task a step started, with the words its progress line and errors use.
#[derive(Debug)]
pub struct StartedTask {
    pub upid: Upid,
    pub doing: String,
}

/// What an earlier step recorded in the provider state; `what` names it when it is missing.
pub fn recorded<T: Clone>(field: &Option<T>, what: &str) -> Result<T, StepError> {
    let missing = || StepError::Cluster(format!("the provider state records no {what}"));
    field.clone().ok_or_else(missing)
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
    pub fn made(&self) -> Result<(NodeName, VmId), StepError> {
        let node = self.placed()?;
        let vmid = self
            .state
            .vmid
            .ok_or_else(|| StepError::Cluster("the provider state has no VMID yet".into()))?;
        Ok((node, vmid))
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
        let listing = self
            .services
            .pve
            .cluster_listing_within(shared)
            .await
            .map_err(StepError::proxmox("reading the cluster state"))?;
        Ok(self.cluster.insert(listing).clone())
    }

    /// How the request's VM is named and tagged.
    pub fn identity(&self) -> VmIdentity<'_> {
        VmIdentity {
            request_id: &self.request.id,
            set_id: self.request.set_id.as_deref(),
            provider_id: &self.services.provider_id,
        }
    }

    pub async fn report(&self, detail: impl Into<String>) {
        self.status.report(detail.into()).await;
    }

    /// Says what the step is doing (the machine's status text), then makes `call`. Any error names
    /// what was being done.
    pub async fn call<T>(
        &self,
        doing: String,
        call: impl Future<Output = Result<T, ProxmoxError>>,
    ) -> Result<T, StepError> {
        self.report(doing.clone()).await;
        call.await.map_err(StepError::proxmox(doing))
    }

    /// [`Self::call`] for a call that starts a Proxmox task. Use [`Self::finish_task`] after
    /// recording the task where a crash must find it again, or [`Self::run_task`] for both at once.
    pub async fn start_task(
        &self,
        doing: String,
        call: impl Future<Output = Result<Upid, ProxmoxError>>,
    ) -> Result<StartedTask, StepError> {
        let upid = self.call(doing.clone(), call).await?;
        Ok(StartedTask { upid, doing })
    }

    /// Waits for a task [`Self::start_task`] started, for at most `timeout`. A failed task's error
    /// names what was being done and carries the task log's last lines.
    pub async fn finish_task(
        &self,
        task: StartedTask,
        timeout: Duration,
    ) -> Result<Upid, StepError> {
        let waited = self.services.pve.wait_for_task(&task.upid, timeout).await;
        waited.map_err(StepError::proxmox(task.doing))?;
        Ok(task.upid)
    }

    /// [`Self::start_task`] and [`Self::finish_task`], for a task with nothing to record in between.
    pub async fn run_task(
        &self,
        doing: String,
        call: impl Future<Output = Result<Upid, ProxmoxError>>,
    ) -> Result<Upid, StepError> {
        let task = self.start_task(doing, call).await?;
        self.finish_task(task, TASK_TIMEOUT).await
    }

    pub async fn persist(&self) -> Result<(), StepError> {
        self.store
            .persist(self.state)
            .await
            .map_err(StepError::omni("recording the provider state"))
    }
}

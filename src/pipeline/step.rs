//! The six provisioning steps, what they share, and how they report.
//!
//! Steps run in order; each reads what the previous ones recorded in the provider state
//! ([`MachineState`]) and records what it decided, so a restart at any point resumes at the first step
//! not yet done, and re-running a step is always safe. A step returns [`StepOutcome::Done`], asks to
//! be called again later ([`StepOutcome::Requeue`], for waits that take long, such as a guest agent
//! coming up: a requeue never holds a worker), or fails with a [`StepError`] whose text is what the
//! user reads in Omni.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::ProviderConfig;
use crate::model::MachineState;
use crate::omni::join::ConnectionParams;
use crate::omni::management::ManagementClient;
use crate::omni::state::StateError;
use crate::pipeline::deprovision::DeprovisionTarget;
use crate::proxmox::types::{ClusterResource, NodeName, Upid, VmId};
use crate::proxmox::{ProxmoxClient, ProxmoxError};
use crate::rules::placement::{Placement, PlacementError, Reservations};
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
    /// - `syncVM` checks the recorded create task instead of creating a VM;
    /// - `startVM` checks the recorded start task instead of starting again.
    pub fn go_name(self, state: &MachineState) -> &'static str {
        match self {
            Step::PickNode => "pickNode",
            Step::PrepareImage if state.schematic.is_none() => "createSchematic",
            Step::PrepareImage => "uploadISO",
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
        let go = match annotation {
            "pickNode" => Some(Step::PickNode),
            "createSchematic" | "uploadISO" | "configureHostname" | "syncVM" => {
                Some(Step::PrepareImage)
            }
            "startVM" => Some(Step::StartVm),
            _ => None,
        };
        match (go, ours) {
            (Some(step), _) => step.number() - 1,
            // Our own step names, written by earlier versions of this provider.
            (None, Some(i)) => i + 1,
            (None, None) => 0,
        }
    }
}

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
    /// HTTP client for the Image Factory (schematics on Omni before 1.8).
    pub factory_http: reqwest::Client,
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

/// What concurrent requests in this process must know of each other before Proxmox shows it: the
/// placements not yet visible as VMs, the VMIDs being created, the pools made, the images being
/// fetched. Lost at a restart by design: each entry is either visible in Proxmox by then or redone.
#[derive(Default)]
pub struct Ledgers {
    /// Static IP allocations: unlike the rest, filled from the provider states, which hold them (see
    /// [`IpLedgers`]).
    pub ip: IpLedgers,
    reservations: Mutex<Reservations>,
    /// VMIDs chosen by requests in flight and not yet visible in `/cluster/resources`.
    vmids_in_flight: Mutex<BTreeSet<u32>>,
    /// Default pools (named after machine-request sets) this process made sure exist.
    pools_created: Mutex<HashSet<String>>,
    /// One async lock per key, for work that must not run twice at once: see [`Ledgers::exclusive`].
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The Proxmox VE version last read, and when: keys that need a release check it on every
    /// reconcile, which must not cost a request each time.
    pve_version: Mutex<Option<(String, std::time::Instant)>>,
    /// The Proxmox cluster's name (`None`: a standalone node, or not readable), read once: a
    /// Proxmox cluster cannot be renamed.
    cluster_name: tokio::sync::OnceCell<Option<String>>,
    /// Requests released by this process, with what their VM was and when they went: a create
    /// Proxmox applies late (sent before a crash, its answer never read) can make the VM again after
    /// the teardown; see [`Ledgers::recently_released`].
    released: Mutex<HashMap<String, Released>>,
}

/// A request released by this process (see [`Ledgers::recently_released`]).
struct Released {
    target: DeprovisionTarget,
    at: std::time::Instant,
    leftover: bool,
}

/// A poisoned ledger is still right: every update is a single insert or remove.
pub(crate) fn entry<T>(ledger: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    ledger.lock().unwrap_or_else(|p| p.into_inner())
}

/// The key of [`Ledgers::exclusive`] for an image download.
pub fn image_lock_key(volume: &str) -> String {
    format!("image:{volume}")
}

/// The key of [`Ledgers::exclusive`] for HA rule changes: every rule lives in one file with one
/// digest, so two changes at once would make one of them fail and read again.
pub const HA_RULES_LOCK: &str = "ha-rules";

/// How long a Proxmox VE version read is trusted: an upgrade is noticed within this time.
pub const PVE_VERSION_MAX_AGE: Duration = Duration::from_secs(600);

impl Ledgers {
    /// The Proxmox VE version (`GET /version`), read again after [`PVE_VERSION_MAX_AGE`].
    pub async fn pve_version(&self, pve: &ProxmoxClient) -> Result<String, ProxmoxError> {
        let known = entry(&self.pve_version)
            .as_ref()
            .filter(|(_, at)| at.elapsed() < PVE_VERSION_MAX_AGE)
            .map(|(v, _)| v.clone());
        if let Some(version) = known {
            return Ok(version);
        }
        let version = pve.version().await?.version;
        *entry(&self.pve_version) = Some((version.clone(), std::time::Instant::now()));
        Ok(version)
    }

    /// The Proxmox cluster's name (`GET /cluster/status`), read once per process. A token without
    /// `Sys.Audit` on `/` cannot read it: that is remembered as no name (a warning says why, once),
    /// so the topology labels go without the region instead of failing every round.
    pub async fn cluster_name(&self, pve: &ProxmoxClient) -> Result<Option<String>, ProxmoxError> {
        let name = self
            .cluster_name
            .get_or_try_init(|| async {
                match pve.cluster_name().await {
                    Err(ProxmoxError::PermissionDenied { message, .. }) => {
                        tracing::warn!(%message, "cannot read the cluster name (GET /cluster/status needs Sys.Audit on /): topology labels go without the region");
                        Ok(None)
                    }
                    other => other,
                }
            })
            .await?;
        Ok(name.clone())
    }

    /// Places a request with the reservations of requests in flight counted, and reserves the
    /// chosen node for it under the same lock: two requests placed at once cannot both take the last
    /// room on a node.
    pub fn place(
        &self,
        request_id: &str,
        set_id: Option<&str>,
        (memory_mb, vcpus): (u64, u64),
        decide: impl FnOnce(&Reservations) -> Result<Placement, PlacementError>,
    ) -> Result<Placement, PlacementError> {
        let mut reservations = entry(&self.reservations);
        let placement = decide(&reservations)?;
        reservations.reserve(request_id, &placement.node, set_id, memory_mb, vcpus);
        Ok(placement)
    }

    pub fn reserve(
        &self,
        request_id: &str,
        node: &str,
        set_id: Option<&str>,
        memory_mb: u64,
        vcpus: u64,
    ) {
        entry(&self.reservations).reserve(request_id, node, set_id, memory_mb, vcpus);
    }

    /// The request's VM is visible now (or never will be): it counts through the listing again.
    pub fn release_reservation(&self, request_id: &str) {
        entry(&self.reservations).release(request_id);
    }

    pub fn vmid_in_flight(&self, vmid: u32) -> bool {
        entry(&self.vmids_in_flight).contains(&vmid)
    }

    /// Marks `vmid` as in flight; false when a concurrent request took it first.
    pub fn take_vmid(&self, vmid: u32) -> bool {
        entry(&self.vmids_in_flight).insert(vmid)
    }

    pub fn release_vmid(&self, vmid: u32) {
        entry(&self.vmids_in_flight).remove(&vmid);
    }

    pub fn pool_known(&self, pool: &str) -> bool {
        entry(&self.pools_created).contains(pool)
    }

    pub fn pool_created(&self, pool: &str) {
        entry(&self.pools_created).insert(pool.to_owned());
    }

    /// Made again on demand if its set comes back.
    pub fn forget_pool(&self, pool: &str) {
        entry(&self.pools_created).remove(pool);
    }

    /// Remembers that the request's VM (as `target` describes it) was deleted and the request let go;
    /// `leftover`: its seed ISO or its set's pool could not be deleted yet.
    pub fn request_released(&self, target: DeprovisionTarget, leftover: bool) {
        entry(&self.released).insert(
            target.request_id.clone(),
            Released {
                target,
                at: std::time::Instant::now(),
                leftover,
            },
        );
    }

    /// The requests released within `window` (oldest forgotten), each with whether something it
    /// had is still left.
    pub fn recently_released(&self, window: Duration) -> Vec<(DeprovisionTarget, bool)> {
        let mut released = entry(&self.released);
        released.retain(|_, r| r.at.elapsed() < window);
        released
            .values()
            .map(|r| (r.target.clone(), r.leftover))
            .collect()
    }

    /// Nothing of the released request is left any more.
    pub fn release_complete(&self, request_id: &str) {
        if let Some(r) = entry(&self.released).get_mut(request_id) {
            r.leftover = false;
        }
    }

    /// The request is back (same ID) or its late VM was dealt with.
    pub fn forget_released(&self, request_id: &str) {
        entry(&self.released).remove(request_id);
    }

    /// A lock shared by everyone handling this key: concurrent requests for one image download it
    /// once ([`image_lock_key`]), and this process edits HA rules one change at a time
    /// ([`HA_RULES_LOCK`]). Entries live as long as the process (a handful: one per image and node).
    pub fn exclusive(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        entry(&self.locks)
            .entry(key.to_owned())
            .or_default()
            .clone()
    }
}

/// When the guest agents were asked, and what each VM (by VMID) reported.
pub(crate) type AgentAnswers = (std::time::Instant, BTreeMap<u32, Vec<IpAddr>>);

/// The static IP allocations this process knows of, and what running VMs report.
///
/// Unlike the other ledgers this one must not start empty: an address recorded in a provider state
/// before a restart is still taken. It is seeded once per process from every provider state in Omni
/// (lazily, by the first request that needs an address, so a provider without pools never lists
/// them), then kept by this process's own allocations and releases. An allocation is recorded here
/// under the same lock it is decided with, so two requests at once never get the same address, and
/// written to the request's provider state before anything depends on it.
#[derive(Default)]
pub struct IpLedgers {
    pub(crate) held: Mutex<crate::rules::ip_pool::IpLedger>,
    /// Set once the ledger holds every provider state's allocations.
    pub(crate) seeded: tokio::sync::OnceCell<()>,
    /// Requests released before the ledger was seeded: a listing read before their state was
    /// destroyed must not bring their addresses back.
    pub(crate) released_before_seed: Mutex<HashSet<String>>,
    /// Addresses running VMs reported through their guest agent, by VMID, and when they were read.
    pub(crate) agent: tokio::sync::Mutex<Option<AgentAnswers>>,
    /// Requests that found their pool full, to be looked at again as soon as an address is freed
    /// (instead of at their next backoff, which may be minutes away).
    waiting: Mutex<BTreeSet<String>>,
    /// Signalled when an address is freed while requests wait.
    freed_signal: tokio::sync::Notify,
}

impl IpLedgers {
    /// Forgets `request`'s allocations: its provider state was destroyed after its VM was.
    pub fn release(&self, request: &str) {
        if !self.seeded.initialized() {
            entry(&self.released_before_seed).insert(request.to_owned());
        }
        let had = !entry(&self.held).of(request).is_empty();
        entry(&self.held).release(request);
        entry(&self.waiting).remove(request);
        if had && !entry(&self.waiting).is_empty() {
            self.freed_signal.notify_one();
        }
    }

    /// `request` found its pool full.
    pub(crate) fn wait_for_address(&self, request: &str) {
        entry(&self.waiting).insert(request.to_owned());
    }

    /// `request` has its addresses (or is gone): nothing to wake it for.
    pub(crate) fn stop_waiting(&self, request: &str) {
        entry(&self.waiting).remove(request);
    }

    /// Resolves when an address was freed while requests waited (at once if that happened since
    /// the last call).
    pub async fn freed(&self) {
        self.freed_signal.notified().await;
    }

    /// The requests waiting for an address, no longer waiting: their reconcile decides again.
    pub fn take_waiting(&self) -> Vec<String> {
        std::mem::take(&mut *entry(&self.waiting))
            .into_iter()
            .collect()
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
    pub cluster: &'a mut Option<ClusterView>,
}

/// A Proxmox task a step started, with the words its progress line and errors use.
#[derive(Debug)]
pub struct StartedTask {
    pub upid: Upid,
    pub doing: String,
}

/// One `/cluster/resources` answer and when it was read.
#[derive(Debug, Clone)]
pub struct ClusterView {
    pub resources: Arc<Vec<ClusterResource>>,
    pub read_at: std::time::Instant,
}

/// Reads reused within one reconcile are this fresh at most.
const CLUSTER_VIEW_MAX_AGE: Duration = Duration::from_secs(2);

impl StepContext<'_> {
    pub fn node(&self) -> Result<NodeName, StepError> {
        self.state
            .node
            .clone()
            .ok_or_else(|| StepError::Cluster("the provider state has no valid node yet".into()))
    }

    pub fn vmid(&self) -> Result<VmId, StepError> {
        self.state
            .vmid
            .ok_or_else(|| StepError::Cluster("the provider state has no VMID yet".into()))
    }

    /// The cluster as `/cluster/resources` shows it; re-read unless read moments ago in this reconcile.
    pub async fn cluster(&mut self, fresh: bool) -> Result<&[ClusterResource], StepError> {
        self.cluster_shared(fresh).await?;
        Ok(self
            .cluster
            .as_ref()
            .map(|v| v.resources.as_slice())
            .unwrap_or_default())
    }

    /// [`Self::cluster`], as a handle to keep across calls that need the context mutably. Keep this
    /// handle rather than a copy (`cluster(..).to_vec()`): with a thousand guests a copy is a few
    /// hundred KiB, and every request placing or configuring at once made its own.
    pub async fn cluster_shared(
        &mut self,
        fresh: bool,
    ) -> Result<Arc<Vec<ClusterResource>>, StepError> {
        let stale = match self.cluster.as_ref() {
            Some(v) => fresh || v.read_at.elapsed() > CLUSTER_VIEW_MAX_AGE,
            None => true,
        };
        if stale {
            let resources = self
                .services
                .pve
                .cluster_listing()
                .await
                .map_err(StepError::proxmox("reading the cluster state"))?;
            *self.cluster = Some(ClusterView {
                resources,
                read_at: std::time::Instant::now(),
            });
        }
        Ok(self
            .cluster
            .as_ref()
            .map(|v| v.resources.clone())
            .unwrap_or_default())
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
    fn a_placement_is_reserved_under_the_lock_it_was_decided_with() {
        let ledgers = Ledgers::default();
        let place = |id: &str| {
            ledgers.place(id, Some("set"), (1024, 2), |reservations| {
                // What the next decision sees already holds every earlier one.
                let node = format!("pve{}", reservations.len() + 1);
                Ok(Placement {
                    node,
                    storage: "local-lvm".into(),
                    reason: crate::rules::placement::PlacementReason::Pinned,
                    template: None,
                })
            })
        };
        assert_eq!(place("a").map(|p| p.node).ok().as_deref(), Some("pve1"));
        assert_eq!(place("b").map(|p| p.node).ok().as_deref(), Some("pve2"));
        let _ = ledgers.place("c", None, (1024, 2), |r| {
            assert_eq!(r.get("b").map(|r| r.node.as_str()), Some("pve2"));
            assert_eq!(r.get("b").map(|r| r.memory_bytes), Some(1024 * 1024 * 1024));
            Ok(Placement {
                node: "pve3".into(),
                storage: "local-lvm".into(),
                reason: crate::rules::placement::PlacementReason::Pinned,
                template: None,
            })
        });
    }

    #[test]
    fn resume_points() {
        let st = MachineState::default();
        assert_eq!(Step::resume_index("", None, &st), 0);
        assert_eq!(Step::resume_index("pick_node", None, &st), 1);
        assert_eq!(Step::resume_index("discover_ip", None, &st), 6);
        // The Go provider's annotation names the step to run again.
        assert_eq!(Step::resume_index("", Some("pickNode"), &st), 0);
        assert_eq!(Step::resume_index("", Some("syncVM"), &st), 1);
        assert_eq!(Step::resume_index("", Some("configureHostname"), &st), 1);
        assert_eq!(Step::resume_index("", Some("startVM"), &st), 4);
        assert_eq!(Step::resume_index("", Some("bogus"), &st), 0);
        // Our record and our annotation agree: our record decides.
        assert_eq!(Step::resume_index("create_vm", Some("syncVM"), &st), 3);
        assert_eq!(Step::resume_index("configure_vm", Some("startVM"), &st), 4);
        // The Go provider ran after us (its annotation is ahead of our record): it decides.
        assert_eq!(Step::resume_index("pick_node", Some("startVM"), &st), 4);
        // Our old snake_case annotation.
        assert_eq!(Step::resume_index("create_vm", Some("create_vm"), &st), 3);
        assert_eq!(Step::CreateVm.number(), 3);
    }

    #[test]
    fn annotation_names_are_go_step_names() {
        // omni-infra-provider-proxmox internal/pkg/provider/provision.go, ProvisionSteps: the Go
        // provider's steps are pickNode, createSchematic, uploadISO, (configureHostname from Nov 2025
        // to Feb 2026), syncVM, startVM; Omni's client/pkg/infra/controllers/provision.go,
        // reconcileRunning, skips steps until the annotated name, so only these names are safe.
        let go = [
            "pickNode",
            "createSchematic",
            "uploadISO",
            "configureHostname",
            "syncVM",
            "startVM",
        ];
        let mut iso = MachineState::default();
        iso.schematic = Some("abc".into());
        for st in [MachineState::default(), iso] {
            for step in Step::ALL {
                assert!(go.contains(&step.go_name(&st)), "{step}");
            }
        }
    }
}

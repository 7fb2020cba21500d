//! What every reconcile of every request shares: the Proxmox and Omni clients, the in-memory ledgers
//! (in [`Services`]), the copies of what this process wrote to Omni last, and a MachineRequest as
//! the watch delivers it ([`Request`]) with what the steps need of it ([`request_info`]).
//!
//! Writes to the two resources the provider owns per request (its MachineRequestStatus and its
//! provider state) go through here, so that every part of the controller writes them the same way.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::error_policy::{self, ReconcileError};
use super::lanes::Lanes;
use super::outputs::{Outputs, WAIT_FOR_OMNI};
use crate::model::MachineState;
use crate::omni::join::JoinMode;
use crate::omni::proto::provider::MachineSpec;
use crate::omni::proto::specs::{MachineRequestSpec, MachineRequestStatusSpec};
use crate::omni::resources::{
    Kind, MACHINE_REQUEST_STATUS, Spec, annotation, label, provider_machine,
    provision_controller_name,
};
use crate::omni::state::{StateClient, StateError, Typed};
use crate::pipeline::image_factory;
use crate::pipeline::ledgers::entry;
use crate::pipeline::step::{RequestInfo, Services, Step};
use crate::rules::schematic::{Overlay, SchematicRequest};

pub struct Context {
    pub services: Arc<Services>,
    pub state: StateClient,
    pub join_mode: JoinMode,
    /// `<id>.ProvisionController`: our finalizer and the owner of what we write.
    pub owner: String,
    /// Shared with the watch of our outputs, which tells it of Omni's changes
    /// ([`WriteCache::observe`]).
    pub(super) statuses: WriteCache<MachineRequestStatusSpec>,
    machines: WriteCache<MachineSpec>,
    /// Requests this process added its finalizer to: a delivered version without it predates that
    /// write (see [`Context::is_current`]).
    finalized: Mutex<HashSet<String>>,
    /// How many requests work on each Proxmox node at once ([`Context::with_concurrency`]).
    pub lanes: Lanes,
    /// Held by the topology round while it checks that a request is live and writes its patch, and
    /// passed through by a teardown before it removes the request's patches: a round that read the
    /// request before its teardown began cannot write the patch after the teardown removed it.
    pub topology_writes: tokio::sync::Mutex<()>,
    /// The Image Factory Omni names for each Talos version, and when it was read.
    talos_factories: Mutex<HashMap<String, (Option<String>, Instant)>>,
    /// What Omni holds of our statuses and patch requests, as the watch of them shows it.
    pub outputs: Outputs,
    /// Requests whose teardown this process finished: the reconcile that follows their deletion
    /// has nothing to look for.
    torn_down: Mutex<HashSet<String>>,
}

/// How long the factory Omni names for a Talos version is used before it is read again.
const TALOS_FACTORY_TTL: Duration = Duration::from_secs(600);

/// Requests working on one Proxmox node at once unless [`Context::with_concurrency`] says otherwise
/// (the `--concurrency` default).
pub const DEFAULT_CONCURRENCY: usize = 4;

impl Context {
    pub fn new(services: Arc<Services>, state: StateClient, join_mode: JoinMode) -> Self {
        let owner = provision_controller_name(&services.provider_id);
        Self {
            machines: WriteCache::new(provider_machine(&services.provider_id), false),
            services,
            state,
            join_mode,
            owner,
            statuses: WriteCache::new(MACHINE_REQUEST_STATUS, true),
            finalized: Mutex::default(),
            lanes: Lanes::new(DEFAULT_CONCURRENCY),
            topology_writes: Default::default(),
            talos_factories: Mutex::default(),
            outputs: Outputs::new(WAIT_FOR_OMNI),
            torn_down: Mutex::default(),
        }
    }

    /// `per_node` requests work on each Proxmox node at once, and as many are being placed.
    pub fn with_concurrency(mut self, per_node: usize) -> Self {
        self.lanes = Lanes::new(per_node);
        self
    }

    pub fn provider_id(&self) -> &str {
        &self.services.provider_id
    }

    /// Our provider state's kind, as the write cache of it holds it.
    pub fn machine_kind(&self) -> &Kind<MachineSpec> {
        &self.machines.kind
    }

    /// Whether a request the watch delivered may stand in for reading it again. The watch delivers
    /// every version in order, and a later change queues another reconcile with it; the one thing
    /// the delivered copy can be behind on is our own write, the finalizer, and a copy without our
    /// finalizer after we added it is older than that write.
    pub fn is_current(&self, delivered: &Request) -> bool {
        let we_added = entry(&self.finalized).contains(delivered.id());
        delivered_is_current(delivered, &self.owner, we_added)
    }

    pub fn finalizer_added(&self, id: &str) {
        entry(&self.finalized).insert(id.to_owned());
    }

    /// Modifies the status (creating it with the request's labels); labels we add are kept.
    pub async fn write_status(
        &self,
        id: &str,
        labels: &HashMap<String, String>,
        mut mutate: impl FnMut(&mut MachineRequestStatusSpec),
    ) -> Result<(), ReconcileError> {
        // Boxed, as every Omni write here: see `run_steps` in `provision.rs`.
        Box::pin(self.statuses.modify(&self.state, id, &self.owner, |s| {
            for (k, v) in labels {
                s.metadata.labels.insert(k.clone(), v.clone());
            }
            mutate(&mut s.spec);
        }))
        .await
        .map(|_| ())
        .map_err(error_policy::omni("writing the machine request status"))
    }

    /// Shows a failure in the status as the error policy words it. Best effort: the retry comes
    /// either way, and a status that cannot be written now is written by the next attempt.
    pub async fn report_failure(
        &self,
        id: &str,
        labels: &HashMap<String, String>,
        error: &ReconcileError,
    ) {
        if let Some(report) = error_policy::report(error)
            && let Err(e) = self
                .write_status(id, labels, |s| {
                    if let Some(stage) = report.stage {
                        s.stage = stage as i32;
                    }
                    s.status = report.status.clone();
                    s.error = report.error.clone();
                })
                .await
        {
            tracing::warn!(request = %id, error = %e, "cannot show the failure in Omni");
        }
    }

    /// Writes the provider state spec, and in the step annotation the official provider's name for
    /// the step that ran ([`Step::go_name`]), so it can continue from here.
    pub async fn save_machine(
        &self,
        id: &str,
        step: Step,
        state: &MachineState,
    ) -> Result<(), StateError> {
        let spec = state.to_spec();
        Box::pin(self.machines.modify(&self.state, id, &self.owner, |m| {
            m.spec = spec.clone();
            m.metadata
                .annotations
                .insert(annotation::STEP.to_owned(), step.go_name(state).to_owned());
        }))
        .await
        .map(|_| ())
    }

    /// The provider state of `id`: as this process wrote it last, or else as Omni has it. This
    /// process is the only writer while it leads, so its own last write is what Omni holds.
    pub async fn find_machine(
        &self,
        id: &str,
    ) -> Result<Option<Typed<MachineSpec>>, ReconcileError> {
        if let Some(written) = self.machines.last_written(id) {
            return Ok(Some(written));
        }
        self.state
            .find(self.machine_kind(), id)
            .await
            .map_err(error_policy::omni("reading the provider state"))
    }

    /// Every provider state of ours, as Omni has it.
    pub async fn machine_states(&self) -> Result<Vec<(String, MachineState)>, StateError> {
        let machines = self.state.list(self.machine_kind(), &[]).await?;
        Ok(machines
            .iter()
            .map(|m| (m.id().to_owned(), MachineState::from_spec(&m.spec)))
            .collect())
    }

    /// The Image Factory Omni uses for `talos_version` when it names one
    /// ([`image_factory::factory_for_version`]), read at most every ten minutes per version.
    pub async fn talos_factory(&self, talos_version: &str) -> Option<String> {
        if let Some((factory, _)) = entry(&self.talos_factories)
            .get(talos_version)
            .filter(|(_, read)| read.elapsed() < TALOS_FACTORY_TTL)
        {
            return factory.clone();
        }
        let factory = image_factory::factory_for_version(&self.state, talos_version).await;
        entry(&self.talos_factories)
            .insert(talos_version.to_owned(), (factory.clone(), Instant::now()));
        factory
    }

    /// The teardown of `id` is finished: its status, provider state and our finalizer are gone.
    pub fn torn_down(&self, id: &str) {
        self.forget(id);
        entry(&self.torn_down).insert(id.to_owned());
    }

    /// Whether this process finished the teardown of `id` (asked once, when the request is gone).
    pub fn take_torn_down(&self, id: &str) -> bool {
        entry(&self.torn_down).remove(id)
    }

    /// Drops in-memory bookkeeping for a request that is gone.
    pub fn forget(&self, id: &str) {
        self.statuses.forget(id);
        self.machines.forget(id);
        entry(&self.finalized).remove(id);
        self.services.ledgers.placements.release(id);
    }
}

/// A MachineRequest as the watch delivers it.
pub type Request = Typed<MachineRequestSpec>;

/// What the steps need of a request, taken from the copy the watch delivered.
pub fn request_info(request: &Request) -> RequestInfo {
    let spec = &request.spec;
    RequestInfo {
        id: request.id().to_owned(),
        set_id: request.label(label::MACHINE_REQUEST_SET).map(str::to_owned),
        talos_version: spec.talos_version.clone(),
        schematic: SchematicRequest {
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
                .map(|o| Overlay {
                    image: o.image.clone(),
                    name: o.name.clone(),
                }),
        },
        provider_data: spec.provider_data.clone(),
        image_factory: None,
    }
}

/// COSI versions count up from 1 per resource; one that does not parse sorts first, so a newer
/// copy always replaces it.
pub fn version<S>(resource: &Typed<S>) -> u64 {
    resource.metadata.version.parse().unwrap_or(0)
}

fn delivered_is_current(delivered: &Request, owner: &str, we_added_finalizer: bool) -> bool {
    delivered.has_finalizer(owner) || !we_added_finalizer
}

/// Remembers the resources this process wrote last, so updating them costs one call, not two.
///
/// Every status line and every recorded decision is an Omni write. A plain modify reads the resource
/// first to learn its version; but we wrote it ourselves a moment ago and know that version. The
/// cache tries the update with the remembered copy and falls back to read-modify-write when someone
/// else wrote in between (a version conflict, e.g. Omni adding its finalizer) or the copy is gone.
pub struct WriteCache<S: Spec> {
    kind: Kind<S>,
    last: Mutex<HashMap<String, Typed<S>>>,
    /// Omni's controllers put a finalizer on every resource of this kind right after its creation
    /// (MachineRequestStatus: siderolabs/omni `machine_request_cleanup.go`), so the created
    /// version is outdated at once: it is not remembered, since an update with it would only be
    /// refused; the next write reads the resource first, unless the watch delivered the newer
    /// version meanwhile ([`Self::observe`]).
    omni_adds_finalizers: bool,
}

impl<S: Spec> WriteCache<S> {
    /// `omni_adds_finalizers`: see the field.
    pub fn new(kind: Kind<S>, omni_adds_finalizers: bool) -> Self {
        Self {
            kind,
            last: Mutex::default(),
            omni_adds_finalizers,
        }
    }

    /// The copy of `id` this process wrote last, if it remembers one.
    pub fn last_written(&self, id: &str) -> Option<Typed<S>> {
        entry(&self.last).get(id).cloned()
    }

    /// A newer version of a resource this process wrote, as a watch delivered it (Omni's
    /// controllers add their finalizers right after our create): remembered instead, so the next
    /// update carries the version Omni holds and costs one call, not a refused update and a read.
    pub fn observe(&self, resource: Typed<S>) {
        let mut last = entry(&self.last);
        if let Some(known) = last.get_mut(resource.id())
            && version(&resource) > version(known)
        {
            *known = resource;
        }
    }

    pub fn forget(&self, id: &str) {
        entry(&self.last).remove(id);
    }

    /// Like [`StateClient::modify`] (creates when missing, skips unchanged writes), starting from the
    /// copy this process wrote last. `mutate` may run twice, so it must only set values.
    pub async fn modify(
        &self,
        state: &StateClient,
        id: &str,
        owner: &str,
        mut mutate: impl FnMut(&mut Typed<S>),
    ) -> Result<Typed<S>, StateError> {
        if let Some(current) = self.last_written(id) {
            let mut next = current.clone();
            mutate(&mut next);
            if next == current {
                return Ok(current);
            }
            match state.update(&self.kind, &next, owner, None).await {
                Ok(stored) => {
                    entry(&self.last).insert(id.to_owned(), stored.clone());
                    return Ok(stored);
                }
                Err(e) if e.is_conflict() || e.is_not_found() => self.forget(id),
                Err(e) => return Err(e),
            }
        }
        let stored = state.modify(&self.kind, id, owner, None, mutate).await?;
        // Version 1: just created.
        if !(stored.metadata.version == "1" && self.omni_adds_finalizers) {
            entry(&self.last).insert(id.to_owned(), stored.clone());
        }
        Ok(stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::omni::proto::specs::MachineRequestSpec;
    use crate::omni::resources::MACHINE_REQUEST;

    fn request(finalizers: &[&str]) -> Request {
        let mut r = Typed::fresh(&MACHINE_REQUEST, "req-1", MachineRequestSpec::default());
        r.metadata.finalizers = finalizers.iter().map(|f| f.to_string()).collect();
        r
    }

    #[test]
    fn a_delivered_request_older_than_our_finalizer_is_read_again() {
        let owner = "proxmox.ProvisionController";
        // First sight: nothing of ours written yet, the delivered copy is all there is to know.
        assert!(delivered_is_current(&request(&[]), owner, false));
        // We added the finalizer; a copy without it was delivered before that write.
        assert!(!delivered_is_current(&request(&[]), owner, true));
        assert!(!delivered_is_current(&request(&["other"]), owner, true));
        // A copy with it is at least as new as our write (after a restart too).
        assert!(delivered_is_current(&request(&[owner]), owner, true));
        assert!(delivered_is_current(&request(&[owner]), owner, false));
    }

    fn status(
        version: &str,
        text: &str,
    ) -> Typed<crate::omni::proto::specs::MachineRequestStatusSpec> {
        let mut s = Typed::fresh(
            &MACHINE_REQUEST_STATUS,
            "r1",
            MachineRequestStatusSpec::default(),
        );
        s.metadata.version = version.into();
        s.spec.status = text.into();
        s
    }

    #[test]
    fn a_newer_version_from_the_watch_replaces_what_we_wrote_and_an_older_one_does_not() {
        let cache = WriteCache::new(MACHINE_REQUEST_STATUS, true);
        cache.observe(status("9", "never written by us"));
        assert!(
            cache.last_written("r1").is_none(),
            "only what we wrote is kept"
        );
        entry(&cache.last).insert("r1".into(), status("3", "ours"));
        cache.observe(status("2", "older echo"));
        assert_eq!(cache.last_written("r1").unwrap().spec.status, "ours");
        cache.observe(status("4", "with Omni's finalizer"));
        assert_eq!(cache.last_written("r1").unwrap().metadata.version, "4");
    }
}

//! Omni's own controllers that act on what a provider writes (docs/omni-protocol.md §3.6, §3.9), as
//! an opt-in mode of the in-memory Omni: without them memstate would let a provider destroy its
//! status and patch requests at once, which the real Omni never does.
//!
//! - `MachineRequestStatusCleanupController` (siderolabs/omni,
//!   `internal/backend/runtime/omni/controllers/omni/machine_request_cleanup.go`, built on
//!   cosi-project/runtime `pkg/controller/generic/cleanup/cleanup.go`, `processInput`): puts its
//!   finalizer on every running MachineRequestStatus and, once the status is torn down, removes it
//!   only after the machine's MachineSetNode, ClusterMachine and Link are gone. A machine leaving its
//!   cluster takes seconds to minutes; here that is [`OmniControllers::drain`], counted from the
//!   moment the status is seen tearing down. A status without a machine `id` has no cluster machine
//!   to wait for, so its finalizer goes at once.
//! - `ConfigPatchRequestController` (`infra_provider_config_patch.go`, a cosi-project/runtime
//!   `qtransform.QController`: `reconcileRunning` adds the finalizer, `reconcileTearingDown` destroys
//!   the output and then removes it): puts its finalizer on every running ConfigPatchRequest; derives
//!   the ConfigPatch of the same ID in `default` (the request's spec and labels, plus
//!   `omni.sidero.dev/system-patch` and `omni.sidero.dev/machine` = the status `id`) only once the
//!   status of the labelled machine request carries an `id`; destroys the patch when the status is
//!   gone (its `DestroyOutputTag`) or the request is torn down, and only then lets the request go.
//!
//! Every finalizer change is an Update, as cosi-project/runtime's `AddFinalizer`/`RemoveFinalizer`
//! (`pkg/state/wrap.go`) make it: the version moves on, so a provider's next write of that resource
//! meets a version conflict, as it does against the real Omni.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::MemState;
use super::store::{Key, LoggedEvent, Store, md, next_version, now_ts};
use omni_infra_provider_proxmox::omni::proto::cosi::resource as pb;
use omni_infra_provider_proxmox::omni::proto::specs;
use omni_infra_provider_proxmox::omni::resources::{
    CONFIG_PATCH_REQUEST, MACHINE_REQUEST_STATUS, PHASE_RUNNING, PHASE_TEARING_DOWN, label,
    namespace,
};

/// Labels Omni's ConfigPatchRequestController puts on the ConfigPatch it derives.
const MACHINE_LABEL: &str = "omni.sidero.dev/machine";
const SYSTEM_PATCH_LABEL: &str = "omni.sidero.dev/system-patch";

/// The finalizer (controller name) of Omni's cleanup controller on MachineRequestStatuses.
pub const STATUS_CLEANUP_CONTROLLER: &str = "MachineRequestStatusCleanupController";
/// The finalizer (controller name) of Omni's controller on ConfigPatchRequests.
pub const CONFIG_PATCH_CONTROLLER: &str = "ConfigPatchRequestController";
/// The type of the machine config patches Omni derives from ConfigPatchRequests (in `default`).
pub const CONFIG_PATCH_TYPE: &str = "ConfigPatches.omni.sidero.dev";

/// Settings of Omni's controllers in memstate.
#[derive(Debug, Clone, Copy)]
pub struct OmniControllers {
    /// How long a torn-down MachineRequestStatus keeps the cleanup finalizer when it names a
    /// machine: the time that machine takes to leave its cluster.
    pub drain: Duration,
}

/// The running controllers; they stop when this is dropped.
pub struct ControllersTask(tokio::task::JoinHandle<()>);

impl Drop for ControllersTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl MemState {
    /// Runs Omni's controllers over this state (see the module documentation) until the returned
    /// task is dropped.
    pub fn run_omni_controllers(&self, settings: OmniControllers) -> ControllersTask {
        self.set_drain(settings.drain);
        let state = self.clone();
        let mut events = self.events.subscribe();
        ControllersTask(tokio::spawn(async move {
            let mut drains = Drains::default();
            state.reconcile_everything(&mut drains);
            loop {
                let due = drains.next_due();
                tokio::select! {
                    ev = events.recv() => match ev {
                        Ok(ev) => state.on_event(&ev, &mut drains),
                        Err(RecvError::Lagged(_)) => state.reconcile_everything(&mut drains),
                        Err(RecvError::Closed) => return,
                    },
                    _ = sleep_until(due) => state.reconcile_everything(&mut drains),
                }
            }
        }))
    }

    /// Changes how long the cleanup controller holds a torn-down status with a machine, from the
    /// next status torn down on (a benchmark measures a long drain after a quick provisioning).
    pub fn set_drain(&self, drain: Duration) {
        self.lock().drain = drain;
    }

    fn on_event(&self, ev: &LoggedEvent, drains: &mut Drains) {
        let m = md(&ev.resource);
        if m.namespace != namespace::INFRA_PROVIDER {
            return;
        }
        let mut store = self.lock();
        if m.r#type == MACHINE_REQUEST_STATUS.resource_type {
            self.reconcile_status(&mut store, &m.id, drains);
        } else if m.r#type == CONFIG_PATCH_REQUEST.resource_type {
            self.reconcile_patch_request(&mut store, &m.id);
        }
    }

    fn reconcile_everything(&self, drains: &mut Drains) {
        let mut store = self.lock();
        for id in ids_of(&store, &MACHINE_REQUEST_STATUS.resource_type) {
            self.reconcile_status(&mut store, &id, drains);
        }
        for id in ids_of(&store, &CONFIG_PATCH_REQUEST.resource_type) {
            self.reconcile_patch_request(&mut store, &id);
        }
    }

    /// The cleanup controller on one status, then the patch requests that name its machine request
    /// (the config-patch controller's extra mapped input).
    fn reconcile_status(&self, store: &mut Store, id: &str, drains: &mut Drains) {
        let key = shared_key(&MACHINE_REQUEST_STATUS.resource_type, id);
        match store.resources.get(&key).map(|r| md(r).clone()) {
            None => drains.forget(id),
            Some(m) if m.phase == PHASE_RUNNING => {
                drains.forget(id);
                if !m.finalizers.iter().any(|f| f == STATUS_CLEANUP_CONTROLLER) {
                    self.edit_as_omni(store, &key, |m| {
                        m.finalizers.push(STATUS_CLEANUP_CONTROLLER.into())
                    });
                }
            }
            Some(m) if m.finalizers.iter().any(|f| f == STATUS_CLEANUP_CONTROLLER) => {
                let machine = status_spec(store, &key).is_some_and(|s| !s.id.is_empty());
                let due = drains.torn_down_since(id, store.drain);
                if !machine || Instant::now() >= due {
                    drains.forget(id);
                    self.edit_as_omni(store, &key, |m| {
                        m.finalizers.retain(|f| f != STATUS_CLEANUP_CONTROLLER)
                    });
                }
            }
            // Let go already (or never held): nothing to wait for.
            Some(_) => drains.forget(id),
        }
        let requests: Vec<String> = of_type(store, &CONFIG_PATCH_REQUEST.resource_type)
            .filter(|(_, r)| {
                md(r).labels.get(label::MACHINE_REQUEST).map(String::as_str) == Some(id)
            })
            .map(|(request, _)| request.to_owned())
            .collect();
        for request in requests {
            self.reconcile_patch_request(store, &request);
        }
    }

    /// The config-patch controller on one ConfigPatchRequest.
    fn reconcile_patch_request(&self, store: &mut Store, id: &str) {
        let key = shared_key(&CONFIG_PATCH_REQUEST.resource_type, id);
        let Some(request) = store.resources.get(&key).cloned() else {
            return;
        };
        let m = md(&request);
        let held = m.finalizers.iter().any(|f| f == CONFIG_PATCH_CONTROLLER);
        if m.phase == PHASE_TEARING_DOWN {
            if held {
                self.destroy_config_patch(store, id);
                self.edit_as_omni(store, &key, |m| {
                    m.finalizers.retain(|f| f != CONFIG_PATCH_CONTROLLER)
                });
            }
            return;
        }
        if !held {
            self.edit_as_omni(store, &key, |m| {
                m.finalizers.push(CONFIG_PATCH_CONTROLLER.into())
            });
        }
        let Some(request_id) = m.labels.get(label::MACHINE_REQUEST) else {
            self.destroy_config_patch(store, id);
            return;
        };
        let status_key = shared_key(&MACHINE_REQUEST_STATUS.resource_type, request_id);
        if !store.resources.contains_key(&status_key) {
            self.destroy_config_patch(store, id);
            return;
        }
        // Without the machine's UUID Omni's transform fails and is retried when the status changes.
        let Some(machine) = status_spec(store, &status_key)
            .map(|s| s.id)
            .filter(|m| !m.is_empty())
        else {
            return;
        };
        let mut labels = m.labels.clone();
        labels.insert(SYSTEM_PATCH_LABEL.into(), String::new());
        labels.insert(MACHINE_LABEL.into(), machine);
        let spec = request.spec.clone().unwrap_or_default();
        self.write_config_patch(store, id, labels, spec);
    }

    fn write_config_patch(
        &self,
        store: &mut Store,
        id: &str,
        labels: HashMap<String, String>,
        spec: pb::Spec,
    ) {
        let key = config_patch_key(id);
        let old = store.resources.get(&key).cloned();
        if let Some(o) = &old
            && md(o).labels == labels
            && o.spec.as_ref().map(|s| &s.proto_spec) == Some(&spec.proto_spec)
        {
            return;
        }
        let (version, created) = match &old {
            Some(o) => (next_version(&md(o).version), md(o).created),
            None => ("1".to_owned(), Some(now_ts())),
        };
        let patch = pb::Resource {
            metadata: Some(pb::Metadata {
                namespace: namespace::DEFAULT.into(),
                r#type: CONFIG_PATCH_TYPE.into(),
                id: id.to_owned(),
                version,
                owner: CONFIG_PATCH_CONTROLLER.into(),
                phase: PHASE_RUNNING.into(),
                created,
                updated: Some(now_ts()),
                labels,
                ..Default::default()
            }),
            spec: Some(pb::Spec {
                proto_spec: spec.proto_spec,
                yaml_spec: String::new(),
            }),
        };
        store.resources.insert(key, patch.clone());
        let kind = if old.is_some() {
            pb::EventType::Updated
        } else {
            pb::EventType::Created
        };
        self.emit(store, kind, patch, old);
    }

    fn destroy_config_patch(&self, store: &mut Store, id: &str) {
        if let Some(patch) = store.resources.remove(&config_patch_key(id)) {
            self.emit(store, pb::EventType::Destroyed, patch, None);
        }
    }

    /// Changes a resource's metadata as Omni's controllers do (an Update with the stored owner and
    /// any phase): a new version and an Updated event.
    fn edit_as_omni(&self, store: &mut Store, key: &Key, edit: impl FnOnce(&mut pb::Metadata)) {
        let Some(old) = store.resources.get(key).cloned() else {
            return;
        };
        let mut new = old.clone();
        let m = new.metadata.get_or_insert_with(Default::default);
        edit(m);
        m.version = next_version(&m.version);
        m.updated = Some(now_ts());
        store.resources.insert(key.clone(), new.clone());
        self.emit(store, pb::EventType::Updated, new, Some(old));
    }
}

/// When the drain of each torn-down status ends (counted from when it was first seen tearing down).
#[derive(Default)]
struct Drains(HashMap<String, Instant>);

impl Drains {
    fn torn_down_since(&mut self, id: &str, drain: Duration) -> Instant {
        *self
            .0
            .entry(id.to_owned())
            .or_insert_with(|| Instant::now() + drain)
    }

    fn forget(&mut self, id: &str) {
        self.0.remove(id);
    }

    /// When the next drain ends, if one is running.
    fn next_due(&self) -> Option<Instant> {
        self.0.values().min().copied()
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn shared_key(resource_type: &str, id: &str) -> Key {
    (
        namespace::INFRA_PROVIDER.to_owned(),
        resource_type.to_owned(),
        id.to_owned(),
    )
}

fn config_patch_key(id: &str) -> Key {
    (
        namespace::DEFAULT.to_owned(),
        CONFIG_PATCH_TYPE.to_owned(),
        id.to_owned(),
    )
}

/// The resources of one type in the shared namespace, by ID (a range of the sorted store).
fn of_type<'a>(
    store: &'a Store,
    resource_type: &'a str,
) -> impl Iterator<Item = (&'a str, &'a pb::Resource)> + 'a {
    store
        .resources
        .range(shared_key(resource_type, "")..)
        .take_while(move |((ns, ty, _), _)| ns == namespace::INFRA_PROVIDER && ty == resource_type)
        .map(|((_, _, id), r)| (id.as_str(), r))
}

fn ids_of(store: &Store, resource_type: &str) -> Vec<String> {
    of_type(store, resource_type)
        .map(|(id, _)| id.to_owned())
        .collect()
}

fn status_spec(store: &Store, key: &Key) -> Option<specs::MachineRequestStatusSpec> {
    let spec = store.resources.get(key)?.spec.as_ref()?;
    prost::Message::decode(spec.proto_spec.as_slice()).ok()
}

#[cfg(test)]
mod tests;

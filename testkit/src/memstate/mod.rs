//! An in-memory Omni: a real tonic server of the COSI State service and of the management
//! schematic call, with the semantics a provider depends on (§1), Omni's access rules for
//! infra-provider callers (§2.4) and Omni's signature check (§6.3).
//!
//! It exists so the provider can be tested and demonstrated end to end over real gRPC without an
//! Omni installation. Being strict is the point: whatever the real Omni would refuse (an update of
//! a MachineRequest that changes more than finalizers, a wrong owner, a stale version, a bad
//! signature) is refused here with the same status code, so our client cannot grow habits that only
//! work against a lenient fake.
//!
//! Besides gRPC it offers an in-process API ([`MemState`]) through which tests and the demo act as
//! Omni itself: seed a provider, create and tear down MachineRequests, read what the provider wrote.

mod access;
mod controllers;
mod query;
mod service;
mod store;
mod watch;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;

pub use controllers::{
    CONFIG_PATCH_CONTROLLER, CONFIG_PATCH_TYPE, ControllersTask, OmniControllers,
    STATUS_CLEANUP_CONTROLLER,
};
use omni_infra_provider_proxmox::omni::proto::cosi::resource as pb;
use omni_infra_provider_proxmox::omni::proto::cosi::resource::meta::ResourceDefinitionSpec;
use omni_infra_provider_proxmox::omni::proto::specs;
use omni_infra_provider_proxmox::omni::resources::{
    self, Kind, MACHINE_REQUEST, PHASE_RUNNING, PHASE_TEARING_DOWN, PROVIDER_JOIN_CONFIG,
    RESOURCE_DEFINITION, SIDEROLINK_API_CONFIG, Spec, label, namespace,
};
use omni_infra_provider_proxmox::omni::state::Typed;
use omni_infra_provider_proxmox::secret::Secret;
pub use service::MemServer;
pub use store::{COMPACTED_ERROR, FUTURE_REVISION_ERROR};
use store::{Key, LoggedEvent, Store, key_of, md, next_version, now_ts};

/// Admin-created registration of the provider ID (`omnictl infraprovider create`): Omni lets a
/// provider act only once it exists.
pub const INFRA_PROVIDER: Kind<specs::InfraProviderSpec> =
    Kind::omni(namespace::INFRA_PROVIDER, "InfraProviders.omni.sidero.dev");

/// The in-memory Omni state. Cheap to clone; all clones share the same store.
#[derive(Clone)]
pub struct MemState {
    store: Arc<Mutex<Store>>,
    events: broadcast::Sender<LoggedEvent>,
    changed: tokio::sync::watch::Sender<u64>,
    /// Bumped by [`MemState::cut_connections`]: every open watch stream ends when it changes.
    cuts: tokio::sync::watch::Sender<u64>,
}

impl Default for MemState {
    fn default() -> Self {
        Self::new()
    }
}

impl MemState {
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(4096);
        let (changed, _) = tokio::sync::watch::channel(0);
        let (cuts, _) = tokio::sync::watch::channel(0);
        Self {
            store: Arc::new(Mutex::new(Store::default())),
            events,
            changed,
            cuts,
        }
    }

    // ---- in-process "Omni" API -------------------------------------------------------------------

    /// Registers a provider the way `omnictl infraprovider create <id>` does: the `InfraProviders`
    /// resource, a fresh key (returned in `omnictl`'s base64 form), plus what Omni ≥ 1.0 provides:
    /// the ProviderJoinConfig, the SideroLink API config and the resource definition that signals
    /// v2 join tokens.
    pub fn register_provider(&self, provider_id: &str) -> Result<Secret, String> {
        let key = crate::keys::NewKey::generate(provider_id);
        self.register_key(&key.encoded())?;
        let mut labels = BTreeMap::new();
        labels.insert(label::INFRA_PROVIDER_ID.to_owned(), provider_id.to_owned());
        self.put(
            &INFRA_PROVIDER,
            provider_id,
            &specs::InfraProviderSpec {},
            BTreeMap::new(),
        );
        self.put(
            &PROVIDER_JOIN_CONFIG,
            provider_id,
            &specs::ProviderJoinConfigSpec {
                config: None,
                join_token: format!("{provider_id}-join-token"),
            },
            labels,
        );
        self.put(
            &SIDEROLINK_API_CONFIG,
            resources::SIDEROLINK_CONFIG_ID,
            &specs::SiderolinkApiConfigSpec {
                machine_api_advertised_url: "grpc://127.0.0.1:8090".into(),
                wireguard_advertised_endpoint: "127.0.0.1:50180".into(),
                enforce_grpc_tunnel: false,
                events_port: 8091,
                logs_port: 8092,
            },
            BTreeMap::new(),
        );
        self.put(
            &RESOURCE_DEFINITION,
            resources::PROVIDER_JOIN_CONFIG_DEFINITION_ID,
            &ResourceDefinitionSpec {
                resource_type: PROVIDER_JOIN_CONFIG.resource_type.into(),
                default_namespace: namespace::INFRA_PROVIDER.into(),
                ..Default::default()
            },
            BTreeMap::new(),
        );
        Ok(Secret::new(key.encoded()))
    }

    /// Drops the whole event history, as etcd's periodic compaction does (Omni keeps about five
    /// hours): a watch resuming from any bookmark handed out so far gets an ERRORED event.
    pub fn compact(&self) {
        let mut store = self.lock();
        store.compacted = store.seq;
        store.log.clear();
    }

    /// Fault injection for chaos runs (`make chaos`): the connection to Omni breaks as a load
    /// balancer or an Omni restart breaks it. Every open watch stream ends with UNAVAILABLE, a
    /// waiting TeardownAndDestroy is abandoned the same way, and the next `failed_calls` calls of
    /// any method are refused with UNAVAILABLE before they touch the store.
    pub fn cut_connections(&self, failed_calls: u32) {
        self.lock().failing_calls = failed_calls;
        self.cuts.send_modify(|c| *c += 1);
    }

    /// Trusts an existing key, given in `omnictl`'s transport form (its name decides the provider
    /// ID it acts as).
    pub fn register_key(&self, encoded: &str) -> Result<(), String> {
        let (identity, public) = crate::keys::public_of(encoded)?;
        self.lock()
            .verifier
            .register(&identity, &public)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Creates or replaces a resource as Omni itself (no access rules, owner `""`).
    pub fn put<S: Spec>(
        &self,
        kind: &Kind<S>,
        id: &str,
        spec: &S,
        labels: BTreeMap<String, String>,
    ) {
        let resource = pb::Resource {
            metadata: Some(pb::Metadata {
                namespace: kind.namespace.to_string(),
                r#type: kind.resource_type.to_string(),
                id: id.to_owned(),
                phase: PHASE_RUNNING.into(),
                labels: labels.into_iter().collect(),
                ..Default::default()
            }),
            spec: Some(pb::Spec {
                proto_spec: prost::Message::encode_to_vec(spec),
                yaml_spec: String::new(),
            }),
        };
        let mut store = self.lock();
        let k = key_of(md(&resource));
        let old = store.resources.get(&k).cloned();
        let mut resource = resource;
        let m = resource.metadata.get_or_insert_with(Default::default);
        match &old {
            Some(o) => {
                let om = md(o);
                m.version = next_version(&om.version);
                m.created = om.created;
                m.finalizers = om.finalizers.clone();
                m.owner = om.owner.clone();
            }
            None => {
                m.version = "1".into();
                m.created = Some(now_ts());
            }
        }
        m.updated = Some(now_ts());
        store.resources.insert(k, resource.clone());
        let kind = if old.is_some() {
            pb::EventType::Updated
        } else {
            pb::EventType::Created
        };
        self.emit(&mut store, kind, resource, old);
    }

    /// Creates a MachineRequest the way Omni's MachineRequestSet controller does (owner `""`,
    /// labels provider ID and request set).
    pub fn create_machine_request(
        &self,
        id: &str,
        provider_id: &str,
        request_set: &str,
        spec: &specs::MachineRequestSpec,
    ) {
        let mut labels = BTreeMap::new();
        labels.insert(label::INFRA_PROVIDER_ID.to_owned(), provider_id.to_owned());
        labels.insert(
            label::MACHINE_REQUEST_SET.to_owned(),
            request_set.to_owned(),
        );
        self.put(&MACHINE_REQUEST, id, spec, labels);
    }

    /// Starts tearing a resource down as Omni would; it is destroyed once its finalizers are gone
    /// (see [`Self::collect_torn_down`]).
    pub fn teardown<S: Spec>(&self, kind: &Kind<S>, id: &str) -> bool {
        let mut store = self.lock();
        let k = (
            kind.namespace.to_string(),
            kind.resource_type.to_string(),
            id.to_owned(),
        );
        let Some(old) = store.resources.get(&k).cloned() else {
            return false;
        };
        let mut new = old.clone();
        let m = new.metadata.get_or_insert_with(Default::default);
        if m.phase != PHASE_TEARING_DOWN {
            m.phase = PHASE_TEARING_DOWN.into();
            m.version = next_version(&m.version);
            store.resources.insert(k, new.clone());
            self.emit(&mut store, pb::EventType::Updated, new, Some(old));
        }
        true
    }

    /// Destroys every torn-down resource of `kind` whose finalizers are gone, as Omni's
    /// controllers do; returns how many were destroyed.
    pub fn collect_torn_down<S: Spec>(&self, kind: &Kind<S>) -> usize {
        let mut store = self.lock();
        let (ns, ty) = (kind.namespace.to_string(), kind.resource_type.to_string());
        let ready: Vec<Key> = store
            .resources
            .iter()
            .filter(|((n, t, _), r)| {
                *n == ns
                    && *t == ty
                    && md(r).phase == PHASE_TEARING_DOWN
                    && md(r).finalizers.is_empty()
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in &ready {
            if let Some(r) = store.resources.remove(k) {
                self.emit(&mut store, pb::EventType::Destroyed, r, None);
            }
        }
        ready.len()
    }

    /// Destroys a resource as Omni (ignores finalizers and owners).
    pub fn remove<S: Spec>(&self, kind: &Kind<S>, id: &str) -> bool {
        let mut store = self.lock();
        let k = (
            kind.namespace.to_string(),
            kind.resource_type.to_string(),
            id.to_owned(),
        );
        match store.resources.remove(&k) {
            Some(r) => {
                self.emit(&mut store, pb::EventType::Destroyed, r, None);
                true
            }
            None => false,
        }
    }

    pub fn get_raw(&self, namespace: &str, resource_type: &str, id: &str) -> Option<pb::Resource> {
        self.lock()
            .resources
            .get(&(
                namespace.to_owned(),
                resource_type.to_owned(),
                id.to_owned(),
            ))
            .cloned()
    }

    pub fn get<S: Spec>(&self, kind: &Kind<S>, id: &str) -> Option<Typed<S>> {
        self.get_raw(&kind.namespace, &kind.resource_type, id)
            .and_then(|r| Typed::decode(r).ok())
    }

    /// Every version of one resource that was created or updated, oldest first, as far back as the
    /// event log reaches (the last 10,000 changes): what a watcher of it would have seen.
    pub fn history<S: Spec>(&self, kind: &Kind<S>, id: &str) -> Vec<Typed<S>> {
        let (ns, ty) = (kind.namespace.to_string(), kind.resource_type.to_string());
        self.lock()
            .log
            .iter()
            .filter(|e| matches!(e.kind, pb::EventType::Created | pb::EventType::Updated))
            .filter(|e| {
                store::key_of(store::md(&e.resource)) == (ns.clone(), ty.clone(), id.to_owned())
            })
            .filter_map(|e| Typed::decode(e.resource.clone()).ok())
            .collect()
    }

    pub fn list<S: Spec>(&self, kind: &Kind<S>) -> Vec<Typed<S>> {
        let (ns, ty) = (kind.namespace.to_string(), kind.resource_type.to_string());
        self.lock()
            .resources
            .iter()
            .filter(|((n, t, _), _)| *n == ns && *t == ty)
            .filter_map(|(_, r)| Typed::decode(r.clone()).ok())
            .collect()
    }

    /// How many signed calls of `method` (e.g. `/cosi.resource.State/Teardown`) were accepted.
    pub fn calls(&self, method: &str) -> u64 {
        self.lock().calls.get(method).copied().unwrap_or(0)
    }

    /// How many resource calls were made, per (method, resource type): `("Update",
    /// "MachineRequestStatuses.omni.sidero.dev") -> 9`. Counted once a call is signed and well
    /// formed, whether it then succeeds or not (a version conflict costs a call too).
    pub fn typed_calls(&self) -> BTreeMap<(String, String), u64> {
        self.lock().typed_calls.clone()
    }

    /// Gives the factory at `url` credentials, as an ImageFactoryAuth resource does in Omni:
    /// `GetBootAssetURL` then answers with them in an `Authorization` header.
    pub fn set_image_factory_auth(&self, url: &str, username: &str, password: &str) {
        self.lock().factory_auth.insert(
            url.trim_end_matches('/').to_owned(),
            (username.to_owned(), password.to_owned()),
        );
    }

    /// Makes Teardown/TeardownAndDestroy answer `Unimplemented`, like Omni before 1.8.
    pub fn set_teardown_unimplemented(&self, on: bool) {
        self.lock().teardown_unimplemented = on;
    }

    /// Waits until `condition` holds, re-checking after every change, for at most `timeout`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut condition: impl FnMut(&MemState) -> bool,
    ) -> bool {
        let mut rx = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if condition(self) {
                return true;
            }
            tokio::select! {
                r = rx.changed() => { if r.is_err() { return condition(self); } }
                _ = tokio::time::sleep_until(deadline) => return condition(self),
            }
        }
    }
}

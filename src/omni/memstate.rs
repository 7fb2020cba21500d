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

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::Stream;
use sha2::Digest as _;
use tokio::sync::{broadcast, mpsc, watch};
use tonic::{Request, Response, Status};

use super::auth::{ProviderKey, Verifier};
use super::proto::cosi::resource as pb;
use super::proto::cosi::resource::meta::ResourceDefinitionSpec;
use super::proto::cosi::resource::state_server::{State, StateServer};
use super::proto::management as mpb;
use super::proto::management::management_service_server::{
    ManagementService, ManagementServiceServer,
};
use super::proto::specs;
use super::resources::{
    self, InfraProvider, Kind, MachineRequest, PHASE_RUNNING, PHASE_TEARING_DOWN,
    ProviderJoinConfig, ResourceDefinition, SiderolinkApiConfig, label, namespace,
};
use super::state::Typed;
use crate::secret::Secret;

/// Events kept for bookmark resumes. Older history is compacted away, as etcd (Omni's default
/// store) compacts its revisions; resuming from before the compaction gets an ERRORED event.
const EVENT_LOG_CAPACITY: usize = 10_000;

/// What Omni's etcd store reports for a bookmark older than the compacted history (etcd's
/// `ErrCompacted` text, passed through unchanged as the ERRORED event's error).
pub const COMPACTED_ERROR: &str = "etcdserver: mvcc: required revision has been compacted";
/// What it reports for a bookmark ahead of the store (another store, or a restored one).
pub const FUTURE_REVISION_ERROR: &str = "etcdserver: mvcc: required revision is a future revision";

type Key = (String, String, String);

#[derive(Clone, Debug)]
struct LoggedEvent {
    seq: u64,
    kind: pb::EventType,
    resource: pb::Resource,
    old: Option<pb::Resource>,
}

#[derive(Default)]
struct Store {
    resources: BTreeMap<Key, pb::Resource>,
    seq: u64,
    log: VecDeque<LoggedEvent>,
    /// Sequence number of the newest event dropped from `log`; bookmarks before it are compacted.
    compacted: u64,
    verifier: Verifier,
    teardown_unimplemented: bool,
    /// Counts calls per method, for tests ("heartbeats arrive", "no Teardown RPC used").
    calls: BTreeMap<String, u64>,
}

/// The in-memory Omni state. Cheap to clone; all clones share the same store.
#[derive(Clone)]
pub struct MemState {
    store: Arc<Mutex<Store>>,
    events: broadcast::Sender<LoggedEvent>,
    changed: watch::Sender<u64>,
}

impl Default for MemState {
    fn default() -> Self {
        Self::new()
    }
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn now_ts() -> prost_types::Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn md(r: &pb::Resource) -> &pb::Metadata {
    static EMPTY: std::sync::LazyLock<pb::Metadata> = std::sync::LazyLock::new(Default::default);
    r.metadata.as_ref().unwrap_or(&EMPTY)
}

impl MemState {
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(4096);
        let (changed, _) = watch::channel(0);
        Self {
            store: Arc::new(Mutex::new(Store::default())),
            events,
            changed,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        // A panic while holding the lock cannot leave the map half-written (every mutation is a
        // single insert/remove), so a poisoned lock is still usable.
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn emit(
        &self,
        store: &mut Store,
        kind: pb::EventType,
        resource: pb::Resource,
        old: Option<pb::Resource>,
    ) {
        store.seq += 1;
        let ev = LoggedEvent {
            seq: store.seq,
            kind,
            resource,
            old,
        };
        store.log.push_back(ev.clone());
        if store.log.len() > EVENT_LOG_CAPACITY
            && let Some(dropped) = store.log.pop_front()
        {
            store.compacted = dropped.seq;
        }
        let _ = self.events.send(ev);
        self.changed.send_modify(|c| *c += 1);
    }

    // ---- in-process "Omni" API -------------------------------------------------------------------

    /// Registers a provider the way `omnictl infraprovider create <id>` does: the `InfraProviders`
    /// resource, a fresh key (returned in `omnictl`'s base64 form), plus what Omni ≥ 1.0 provides:
    /// the ProviderJoinConfig, the SideroLink API config and the resource definition that signals
    /// v2 join tokens.
    pub fn register_provider(&self, provider_id: &str) -> Result<Secret, String> {
        let key = ProviderKey::generate(provider_id).map_err(|e| e.to_string())?;
        self.register_key(&key)?;
        let mut labels = BTreeMap::new();
        labels.insert(label::INFRA_PROVIDER_ID.to_owned(), provider_id.to_owned());
        self.put(
            &InfraProvider,
            provider_id,
            &specs::InfraProviderSpec {},
            BTreeMap::new(),
        );
        self.put(
            &ProviderJoinConfig,
            provider_id,
            &specs::ProviderJoinConfigSpec {
                config: None,
                join_token: format!("{provider_id}-join-token"),
            },
            labels,
        );
        self.put(
            &SiderolinkApiConfig,
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
            &ResourceDefinition,
            resources::PROVIDER_JOIN_CONFIG_DEFINITION_ID,
            &ResourceDefinitionSpec {
                resource_type: ProviderJoinConfig::TYPE.into(),
                default_namespace: namespace::INFRA_PROVIDER.into(),
                ..Default::default()
            },
            BTreeMap::new(),
        );
        key.to_encoded().map_err(|e| e.to_string())
    }

    /// Drops the whole event history, as etcd's periodic compaction does (Omni keeps about five
    /// hours): a watch resuming from any bookmark handed out so far gets an ERRORED event.
    pub fn compact(&self) {
        let mut store = self.lock();
        store.compacted = store.seq;
        store.log.clear();
    }

    /// Trusts an existing key (its identity decides the provider ID it acts as).
    pub fn register_key(&self, key: &ProviderKey) -> Result<(), String> {
        let public = key.public_key_armored().map_err(|e| e.to_string())?;
        self.lock()
            .verifier
            .register(key.identity(), &public)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Creates or replaces a resource as Omni itself (no access rules, owner `""`).
    pub fn put<K: Kind>(
        &self,
        kind: &K,
        id: &str,
        spec: &K::Spec,
        labels: BTreeMap<String, String>,
    ) {
        let resource = pb::Resource {
            metadata: Some(pb::Metadata {
                namespace: kind.namespace(),
                r#type: kind.resource_type(),
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
        self.put(&MachineRequest, id, spec, labels);
    }

    /// Starts tearing a resource down as Omni would; it is destroyed once its finalizers are gone
    /// (see [`Self::collect_torn_down`]).
    pub fn teardown<K: Kind>(&self, kind: &K, id: &str) -> bool {
        let mut store = self.lock();
        let k = (kind.namespace(), kind.resource_type(), id.to_owned());
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
    pub fn collect_torn_down<K: Kind>(&self, kind: &K) -> usize {
        let mut store = self.lock();
        let (ns, ty) = (kind.namespace(), kind.resource_type());
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
    pub fn remove<K: Kind>(&self, kind: &K, id: &str) -> bool {
        let mut store = self.lock();
        let k = (kind.namespace(), kind.resource_type(), id.to_owned());
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

    pub fn get<K: Kind>(&self, kind: &K, id: &str) -> Option<Typed<K::Spec>> {
        self.get_raw(&kind.namespace(), &kind.resource_type(), id)
            .and_then(|r| Typed::decode(r).ok())
    }

    pub fn list<K: Kind>(&self, kind: &K) -> Vec<Typed<K::Spec>> {
        let (ns, ty) = (kind.namespace(), kind.resource_type());
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

    // ---- serving --------------------------------------------------------------------------------

    /// Serves State and Management on `listener` until [`MemServer::stop`].
    pub fn serve(
        &self,
        listener: tokio::net::TcpListener,
        tls: Option<tonic::transport::ServerTlsConfig>,
    ) -> Result<MemServer, tonic::transport::Error> {
        let addr = listener.local_addr().ok();
        let (stop_tx, stop_rx) = watch::channel(false);
        let svc = StateService {
            state: self.clone(),
            stop: stop_rx.clone(),
        };
        let mgmt = MgmtService {
            state: self.clone(),
        };
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls)?;
        }
        let router = builder
            .add_service(StateServer::new(svc).max_decoding_message_size(32 << 20))
            .add_service(ManagementServiceServer::new(mgmt));
        // Without TCP_NODELAY every small gRPC answer waits for the client's delayed ACK (~40 ms).
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |conn| {
                if let Ok(stream) = &conn {
                    let _ = stream.set_nodelay(true);
                }
                conn
            },
        );
        let mut shutdown = stop_rx;
        let task = tokio::spawn(async move {
            let signal = async move {
                let _ = shutdown.wait_for(|s| *s).await;
            };
            router.serve_with_incoming_shutdown(incoming, signal).await
        });
        Ok(MemServer {
            addr,
            stop: stop_tx,
            task,
        })
    }
}

/// A running server; stopping it ends open watch streams so clients see a broken connection.
pub struct MemServer {
    addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl MemServer {
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

fn key_of(m: &pb::Metadata) -> Key {
    (m.namespace.clone(), m.r#type.clone(), m.id.clone())
}

fn next_version(v: &str) -> String {
    (v.parse::<u64>().unwrap_or(0) + 1).to_string()
}

fn bookmark(seq: u64) -> Vec<u8> {
    seq.to_be_bytes().to_vec()
}

fn parse_bookmark(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

// ---- label queries ------------------------------------------------------------------------------

/// Whether `labels` match any of `queries` (none = everything). Pure.
fn matches_queries(
    labels: &std::collections::HashMap<String, String>,
    queries: &[pb::LabelQuery],
) -> Result<bool, Status> {
    if queries.is_empty() {
        return Ok(true);
    }
    for q in queries {
        let mut all = true;
        for t in &q.terms {
            if !term_matches(labels, t)? {
                all = false;
                break;
            }
        }
        if all {
            return Ok(true);
        }
    }
    Ok(false)
}

fn term_matches(
    labels: &std::collections::HashMap<String, String>,
    t: &pb::LabelTerm,
) -> Result<bool, Status> {
    use pb::label_term::Operation as Op;
    let op = Op::try_from(t.op).map_err(|_| {
        Status::unimplemented(format!("unsupported label query operator: {}", t.op))
    })?;
    let first = || {
        t.value
            .first()
            .ok_or_else(|| Status::internal("runtime error: index out of range [0] with length 0"))
    };
    let have = labels.get(&t.key);
    let result = match op {
        Op::Exists => have.is_some(),
        Op::NotExists => have.is_none(),
        Op::Equal => have == Some(first()?),
        Op::In => have.is_some_and(|v| t.value.contains(v)),
        Op::Lt => have.is_some_and(|v| v.as_str() < first().map(|s| s.as_str()).unwrap_or("")),
        Op::Lte => have.is_some_and(|v| v.as_str() <= first().map(|s| s.as_str()).unwrap_or("")),
        Op::LtNumeric | Op::LteNumeric => {
            let bound: i64 = first()?.parse().unwrap_or(i64::MIN);
            have.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| {
                if op == Op::LtNumeric {
                    v < bound
                } else {
                    v <= bound
                }
            })
        }
    };
    Ok(result != t.invert)
}

// ---- access rules (§2.4) ------------------------------------------------------------------------

/// Who is calling, as established by the signature.
#[derive(Clone, Debug)]
struct Caller {
    provider_id: String,
}

/// Resource types providers may only read (and change finalizers of).
const READ_ONLY_FOR_PROVIDERS: &[&str] = &[
    "MachineRequests.omni.sidero.dev",
    "InfraMachineRegistrations.omni.sidero.dev",
    "ProviderJoinConfigs.omni.sidero.dev",
    "InfraMachines.omni.sidero.dev",
    "BMCConfigs.omni.sidero.dev",
];
/// The types Omni manages for infra providers in the shared namespaces (Omni's
/// internal/backend/runtime/omni/infraprovider/state.go, getResourceConfig); any other type there is
/// refused, as Omni's general access filter refuses types it does not list. ConfigPatchRequests are
/// readable and writable, label-checked like the rest of the shared namespace.
const SHARED_TYPES: &[&str] = &[
    "MachineRequests.omni.sidero.dev",
    "MachineRequestStatuses.omni.sidero.dev",
    "InfraMachineRegistrations.omni.sidero.dev",
    "ProviderJoinConfigs.omni.sidero.dev",
    "InfraMachines.omni.sidero.dev",
    "InfraMachineStatuses.omni.sidero.dev",
    "InfraProviderStatuses.omni.sidero.dev",
    "InfraProviderHealthStatuses.omni.sidero.dev",
    "InfraProviders.omni.sidero.dev",
    "ConfigPatchRequests.omni.sidero.dev",
    "BMCConfigs.omni.sidero.dev",
];
/// Types whose ID must be the provider ID.
const CHECK_ID_TYPES: &[&str] = &[
    "InfraProviderStatuses.omni.sidero.dev",
    "InfraProviderHealthStatuses.omni.sidero.dev",
    "InfraProviders.omni.sidero.dev",
];
/// Types a provider may read outside the provider namespaces.
const READABLE_ELSEWHERE: &[&str] = &[
    "SiderolinkAPIConfigs.omni.sidero.dev",
    "ConnectionParams.omni.sidero.dev",
    "Machines.omni.sidero.dev",
    "ResourceDefinitions.meta.cosi.dev",
    "Namespaces.meta.cosi.dev",
    "FeaturesConfigs.omni.sidero.dev",
    "TalosVersions.omni.sidero.dev",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// How a namespace is treated for a provider caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// `infra-provider` / `infra-provider-ephemeral`: label-filtered and label-forced.
    Shared,
    /// `infra-provider:<own id>`: no label checks.
    Private,
    /// Anything else: read-only allow-list.
    Other,
}

impl Caller {
    fn scope(&self, store: &Store, ns: &str, ty: &str, access: Access) -> Result<Scope, Status> {
        let scope = if ns == namespace::INFRA_PROVIDER || ns == namespace::INFRA_PROVIDER_EPHEMERAL
        {
            if !SHARED_TYPES.contains(&ty) {
                return Err(Status::permission_denied("no access is permitted"));
            }
            Scope::Shared
        } else if let Some(other) = ns.strip_prefix(namespace::PROVIDER_PRIVATE_PREFIX) {
            if other != self.provider_id {
                return Err(Status::permission_denied(format!(
                    "namespace {ns:?} not allowed"
                )));
            }
            let suffix = format!(".{}.infraprovider.sidero.dev", self.provider_id);
            if !ty.ends_with(&suffix) {
                return Err(Status::invalid_argument(format!(
                    "resource type {ty:?} must end with {suffix:?} in namespace {ns:?}"
                )));
            }
            Scope::Private
        } else {
            if !READABLE_ELSEWHERE.contains(&ty) {
                return Err(Status::permission_denied("no access is permitted"));
            }
            if access == Access::Write {
                return Err(Status::permission_denied("only read access is permitted"));
            }
            return Ok(Scope::Other);
        };
        let registered = (
            namespace::INFRA_PROVIDER.to_owned(),
            InfraProvider::TYPE.to_owned(),
            self.provider_id.clone(),
        );
        if !store.resources.contains_key(&registered) {
            return Err(Status::permission_denied(format!(
                "infra provider with name {:?} is not registered in the system",
                self.provider_id
            )));
        }
        Ok(scope)
    }

    fn check_id(&self, ty: &str, id: &str) -> Result<(), Status> {
        if CHECK_ID_TYPES.contains(&ty) && id != self.provider_id {
            return Err(Status::invalid_argument(format!(
                "resource ID {id:?} must match the infra provider ID {:?}",
                self.provider_id
            )));
        }
        Ok(())
    }

    /// Shared namespaces only show resources labelled with the caller's ID.
    fn visible(&self, scope: Scope, r: &pb::Resource) -> bool {
        scope != Scope::Shared
            || md(r).labels.get(label::INFRA_PROVIDER_ID) == Some(&self.provider_id)
    }
}

/// `metadata`/`spec` present, phase valid (the COSI server's parser, answered as `Unknown`).
fn validate_resource(r: &pb::Resource) -> Result<(), Status> {
    let m = r
        .metadata
        .as_ref()
        .ok_or_else(|| Status::unknown("metadata is missing"))?;
    if r.spec.is_none() {
        return Err(Status::unknown("spec is missing"));
    }
    if m.phase != PHASE_RUNNING && m.phase != PHASE_TEARING_DOWN {
        return Err(Status::unknown(format!("unknown phase {:?}", m.phase)));
    }
    if m.version != "undefined" && m.version.parse::<u64>().is_err() {
        return Err(Status::unknown(format!("invalid version {:?}", m.version)));
    }
    Ok(())
}

/// Read-only types: everything but version and finalizers (and `updated`) must be unchanged,
/// spec compared as bytes (stricter than Omni's decoded comparison; same for echoed bytes).
fn only_finalizers_changed(stored: &pb::Resource, new: &pb::Resource) -> bool {
    let strip = |r: &pb::Resource| {
        let mut r = r.clone();
        if let Some(m) = r.metadata.as_mut() {
            m.version.clear();
            m.finalizers.clear();
            m.updated = None;
            m.created = None;
        }
        if let Some(s) = r.spec.as_mut() {
            s.yaml_spec.clear();
        }
        r
    };
    strip(stored) == strip(new)
}

// ---- gRPC State service -----------------------------------------------------------------------

#[derive(Clone)]
struct StateService {
    state: MemState,
    stop: watch::Receiver<bool>,
}

const SVC: &str = "/cosi.resource.State/";

impl StateService {
    fn authenticate<T>(&self, req: &Request<T>, method: &str) -> Result<Caller, Status> {
        let full = format!("{SVC}{method}");
        let mut store = self.state.lock();
        let identity = store.verifier.verify(&full, req.metadata(), now_unix())?;
        *store.calls.entry(full).or_default() += 1;
        let provider_id = identity
            .strip_prefix("infra-provider:")
            .ok_or_else(|| {
                Status::permission_denied("only infra-provider keys are supported by memstate")
            })?
            .to_owned();
        Ok(Caller { provider_id })
    }

    fn teardown_impl(
        &self,
        caller: &Caller,
        ns: &str,
        ty: &str,
        id: &str,
        owner: &str,
    ) -> Result<bool, Status> {
        let mut store = self.state.lock();
        if store.teardown_unimplemented {
            return Err(Status::unimplemented("unknown method Teardown"));
        }
        let scope = caller.scope(&store, ns, ty, Access::Write)?;
        caller.check_id(ty, id)?;
        let k = (ns.to_owned(), ty.to_owned(), id.to_owned());
        let old = store
            .resources
            .get(&k)
            .filter(|r| caller.visible(scope, r))
            .cloned()
            .ok_or_else(|| Status::not_found(format!("resource {id} doesn't exist")))?;
        if READ_ONLY_FOR_PROVIDERS.contains(&ty) {
            // Server-side teardown is Get + Update of the phase, which the read-only rule rejects.
            return Err(Status::permission_denied(format!(
                "infra providers are not allowed to tear down {ty}"
            )));
        }
        if md(&old).owner != owner {
            return Err(Status::permission_denied(format!(
                "owner conflict: {:?} != {owner:?}",
                md(&old).owner
            )));
        }
        let ready = md(&old).finalizers.is_empty();
        if md(&old).phase != PHASE_TEARING_DOWN {
            let mut new = old.clone();
            let m = new.metadata.get_or_insert_with(Default::default);
            m.phase = PHASE_TEARING_DOWN.into();
            m.version = next_version(&m.version);
            m.updated = Some(now_ts());
            store.resources.insert(k, new.clone());
            self.state
                .emit(&mut store, pb::EventType::Updated, new, Some(old));
        }
        Ok(ready)
    }

    fn destroy_impl(
        &self,
        caller: &Caller,
        ns: &str,
        ty: &str,
        id: &str,
        owner: &str,
    ) -> Result<(), Status> {
        let mut store = self.state.lock();
        let scope = caller.scope(&store, ns, ty, Access::Write)?;
        caller.check_id(ty, id)?;
        if READ_ONLY_FOR_PROVIDERS.contains(&ty) {
            return Err(Status::permission_denied(format!(
                "infra providers are not allowed to destroy {ty}"
            )));
        }
        let k = (ns.to_owned(), ty.to_owned(), id.to_owned());
        let old = store
            .resources
            .get(&k)
            .filter(|r| caller.visible(scope, r))
            .cloned()
            .ok_or_else(|| Status::not_found(format!("resource {id} doesn't exist")))?;
        if md(&old).owner != owner {
            return Err(Status::permission_denied(format!(
                "owner conflict: {:?} != {owner:?}",
                md(&old).owner
            )));
        }
        if !md(&old).finalizers.is_empty() {
            return Err(Status::failed_precondition(format!(
                "resource {id} has pending finalizers {:?}",
                md(&old).finalizers
            )));
        }
        store.resources.remove(&k);
        self.state
            .emit(&mut store, pb::EventType::Destroyed, old, None);
        Ok(())
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl State for StateService {
    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        let caller = self.authenticate(&req, "Get")?;
        let r = req.into_inner();
        let store = self.state.lock();
        let scope = caller.scope(&store, &r.namespace, &r.r#type, Access::Read)?;
        let found = store
            .resources
            .get(&(r.namespace.clone(), r.r#type.clone(), r.id.clone()))
            .filter(|res| caller.visible(scope, res))
            .cloned()
            .ok_or_else(|| Status::not_found(format!("resource {} doesn't exist", r.id)))?;
        Ok(Response::new(pb::GetResponse {
            resource: Some(found),
        }))
    }

    type ListStream = BoxStream<pb::ListResponse>;

    async fn list(
        &self,
        req: Request<pb::ListRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        let caller = self.authenticate(&req, "List")?;
        let r = req.into_inner();
        let queries = r.options.map(|o| o.label_query).unwrap_or_default();
        let store = self.state.lock();
        let scope = caller.scope(&store, &r.namespace, &r.r#type, Access::Read)?;
        let mut out = Vec::new();
        for ((ns, ty, _), res) in &store.resources {
            if *ns == r.namespace
                && *ty == r.r#type
                && caller.visible(scope, res)
                && matches_queries(&md(res).labels, &queries)?
            {
                out.push(Ok(pb::ListResponse {
                    resource: Some(res.clone()),
                }));
            }
        }
        Ok(Response::new(Box::pin(tokio_stream::iter(out))))
    }

    async fn create(
        &self,
        req: Request<pb::CreateRequest>,
    ) -> Result<Response<pb::CreateResponse>, Status> {
        let caller = self.authenticate(&req, "Create")?;
        let r = req.into_inner();
        let owner = r.options.map(|o| o.owner).unwrap_or_default();
        let mut res = r
            .resource
            .ok_or_else(|| Status::unknown("resource is missing"))?;
        validate_resource(&res)?;
        let mut store = self.state.lock();
        let (ns, ty, id) = key_of(md(&res));
        let scope = caller.scope(&store, &ns, &ty, Access::Write)?;
        caller.check_id(&ty, &id)?;
        if READ_ONLY_FOR_PROVIDERS.contains(&ty.as_str()) {
            return Err(Status::permission_denied(format!(
                "infra providers are not allowed to create {ty}"
            )));
        }
        if !md(&res).owner.is_empty() && md(&res).owner != owner {
            return Err(Status::unknown(format!(
                "metadata owner {:?} differs from the create owner {owner:?}",
                md(&res).owner
            )));
        }
        let k = (ns, ty, id.clone());
        if store.resources.contains_key(&k) {
            return Err(Status::already_exists(format!(
                "resource {id} already exists"
            )));
        }
        let m = res.metadata.get_or_insert_with(Default::default);
        m.version = "1".into();
        m.owner = owner;
        m.created = Some(now_ts());
        m.updated = m.created;
        if scope == Scope::Shared {
            m.labels
                .insert(label::INFRA_PROVIDER_ID.into(), caller.provider_id.clone());
        }
        store.resources.insert(k, res.clone());
        self.state
            .emit(&mut store, pb::EventType::Created, res.clone(), None);
        Ok(Response::new(pb::CreateResponse {
            resource: Some(res),
        }))
    }

    async fn update(
        &self,
        req: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let caller = self.authenticate(&req, "Update")?;
        let r = req.into_inner();
        let opts = r.options.unwrap_or_default();
        let mut res = r
            .new_resource
            .ok_or_else(|| Status::unknown("resource is missing"))?;
        validate_resource(&res)?;
        let mut store = self.state.lock();
        let (ns, ty, id) = key_of(md(&res));
        let scope = caller.scope(&store, &ns, &ty, Access::Write)?;
        caller.check_id(&ty, &id)?;
        let k = (ns, ty.clone(), id.clone());
        let old = store
            .resources
            .get(&k)
            .filter(|s| caller.visible(scope, s))
            .cloned()
            .ok_or_else(|| Status::not_found(format!("resource {id} doesn't exist")))?;
        if md(&old).owner != opts.owner {
            return Err(Status::permission_denied(format!(
                "owner conflict: {:?} != {:?}",
                md(&old).owner,
                opts.owner
            )));
        }
        if md(&old).version != md(&res).version {
            return Err(Status::failed_precondition(format!(
                "resource {id} update conflict: expected version {:?}, actual version {:?}",
                md(&res).version,
                md(&old).version
            )));
        }
        if let Some(phase) = &opts.expected_phase
            && md(&old).phase != *phase
        {
            return Err(Status::invalid_argument(format!(
                "resource {id} phase conflict: expected {phase:?}, actual {:?}",
                md(&old).phase
            )));
        }
        if scope == Scope::Shared {
            res.metadata
                .get_or_insert_with(Default::default)
                .labels
                .insert(label::INFRA_PROVIDER_ID.into(), caller.provider_id.clone());
        }
        if READ_ONLY_FOR_PROVIDERS.contains(&ty.as_str()) && !only_finalizers_changed(&old, &res) {
            return Err(Status::permission_denied(format!(
                "infra providers are not allowed to update {ty} except its finalizers"
            )));
        }
        let m = res.metadata.get_or_insert_with(Default::default);
        m.version = next_version(&md(&old).version);
        m.created = md(&old).created;
        m.updated = Some(now_ts());
        m.owner = md(&old).owner.clone();
        let mut dedup = Vec::new();
        for f in std::mem::take(&mut m.finalizers) {
            if !dedup.contains(&f) {
                dedup.push(f);
            }
        }
        m.finalizers = dedup;
        store.resources.insert(k, res.clone());
        self.state
            .emit(&mut store, pb::EventType::Updated, res.clone(), Some(old));
        Ok(Response::new(pb::UpdateResponse {
            resource: Some(res),
        }))
    }

    async fn destroy(
        &self,
        req: Request<pb::DestroyRequest>,
    ) -> Result<Response<pb::DestroyResponse>, Status> {
        let caller = self.authenticate(&req, "Destroy")?;
        let r = req.into_inner();
        let owner = r.options.map(|o| o.owner).unwrap_or_default();
        self.destroy_impl(&caller, &r.namespace, &r.r#type, &r.id, &owner)?;
        Ok(Response::new(pb::DestroyResponse {}))
    }

    type WatchStream = BoxStream<pb::WatchResponse>;

    async fn watch(
        &self,
        req: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let caller = self.authenticate(&req, "Watch")?;
        let r = req.into_inner();
        let opts = r.options.clone().unwrap_or_default();
        let (tx, rx) = mpsc::channel::<Result<pb::WatchResponse, Status>>(1024);
        let api_v1 = r.api_version >= 1;
        let mut live;
        let mut initial: Vec<pb::Event> = Vec::new();
        let first_error;
        {
            let store = self.state.lock();
            let scope = caller.scope(&store, &r.namespace, &r.r#type, Access::Read)?;
            if r.id.is_some() && (opts.bootstrap_contents || !opts.label_query.is_empty()) {
                return Err(Status::unimplemented(
                    "bootstrap_contents and label_query are not supported on single-resource watches",
                ));
            }
            if opts.bootstrap_contents
                && (opts.tail_events > 0 || opts.start_from_bookmark.is_some())
            {
                return Err(Status::unknown(
                    "bootstrap_contents is incompatible with tail_events and start_from_bookmark",
                ));
            }
            // Subscribe under the lock so no event falls between the snapshot and the live feed.
            live = self.state.events.subscribe();
            let filter = WatchFilter {
                caller: caller.clone(),
                scope,
                namespace: r.namespace.clone(),
                resource_type: r.r#type.clone(),
                id: r.id.clone(),
                queries: opts.label_query.clone(),
            };
            let mut err = None;
            let mut errored = None;
            if let Some(b) = &opts.start_from_bookmark {
                // state-etcd pkg/state/impl/etcd/etcd.go (watchKind): a bookmark that does not decode
                // fails the call (FailedPrecondition); a compacted or future revision is only found
                // by etcd's watch, and arrives as an ERRORED event on the established stream.
                match parse_bookmark(b) {
                    None => err = Some(Status::failed_precondition("invalid watch bookmark")),
                    Some(seq) if seq > store.seq => errored = Some(FUTURE_REVISION_ERROR),
                    Some(seq) if seq < store.compacted => errored = Some(COMPACTED_ERROR),
                    Some(seq) => {
                        for ev in store.log.iter().filter(|e| e.seq > seq) {
                            if let Some(e) = filter.map(ev)? {
                                initial.push(e);
                            }
                        }
                    }
                }
            } else if let Some(id) = &r.id {
                let k = (r.namespace.clone(), r.r#type.clone(), id.clone());
                match store.resources.get(&k).filter(|x| caller.visible(scope, x)) {
                    Some(res) => {
                        initial.push(event(pb::EventType::Created, res.clone(), None, store.seq))
                    }
                    // Omni's provider filter drops the tombstone in shared namespaces (§1.5).
                    None if scope != Scope::Shared => {
                        let tomb = tombstone(&r.namespace, &r.r#type, id);
                        initial.push(event(pb::EventType::Destroyed, tomb, None, store.seq));
                    }
                    None => {}
                }
            } else if opts.bootstrap_contents {
                for ((ns, ty, _), res) in &store.resources {
                    if *ns == r.namespace
                        && *ty == r.r#type
                        && caller.visible(scope, res)
                        && matches_queries(&md(res).labels, &opts.label_query)?
                    {
                        initial.push(event(pb::EventType::Created, res.clone(), None, store.seq));
                    }
                }
                if api_v1 {
                    initial.push(event(
                        pb::EventType::Bootstrapped,
                        tombstone(&r.namespace, &r.r#type, ""),
                        None,
                        store.seq,
                    ));
                }
            } else if opts.bootstrap_bookmark {
                initial.push(event(
                    pb::EventType::Noop,
                    tombstone(&r.namespace, &r.r#type, ""),
                    None,
                    store.seq,
                ));
            }
            first_error = err;
            let mut stop = self.stop.clone();
            tokio::spawn(async move {
                if let Some(e) = first_error {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                // "Watch established": an empty first message.
                if tx
                    .send(Ok(pb::WatchResponse { event: vec![] }))
                    .await
                    .is_err()
                {
                    return;
                }
                if let Some(message) = errored {
                    let mut e = event(
                        pb::EventType::Errored,
                        tombstone(&filter.namespace, &filter.resource_type, ""),
                        None,
                        0,
                    );
                    e.resource = None;
                    e.bookmark = None;
                    e.error = Some(message.into());
                    if api_v1
                        && tx
                            .send(Ok(pb::WatchResponse { event: vec![e] }))
                            .await
                            .is_err()
                    {
                        return;
                    }
                    // The backend's watch is over but cosi's server keeps the stream open, silent,
                    // until the client goes away.
                    tokio::select! {
                        _ = tx.closed() => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                    return;
                }
                for e in initial {
                    if tx
                        .send(Ok(pb::WatchResponse { event: vec![e] }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                loop {
                    tokio::select! {
                        _ = async { stop.wait_for(|s| *s).await.is_ok() } => {
                            let _ = tx.send(Err(Status::unavailable("server shutting down"))).await;
                            return;
                        }
                        _ = tx.closed() => return,
                        ev = live.recv() => match ev {
                            Ok(ev) => match filter.map(&ev) {
                                Ok(Some(e)) => {
                                    if tx.send(Ok(pb::WatchResponse { event: vec![e] })).await.is_err() {
                                        return;
                                    }
                                }
                                Ok(None) => {}
                                Err(s) => {
                                    let _ = tx.send(Err(s)).await;
                                    return;
                                }
                            },
                            Err(broadcast::error::RecvError::Lagged(_)) => {
                                if api_v1 {
                                    let mut e = event(pb::EventType::Errored, tombstone(&filter.namespace, &filter.resource_type, ""), None, 0);
                                    e.bookmark = None;
                                    e.error = Some("buffer overrun".into());
                                    let _ = tx.send(Ok(pb::WatchResponse { event: vec![e] })).await;
                                }
                                return;
                            }
                            Err(broadcast::error::RecvError::Closed) => return,
                        }
                    }
                }
            });
        }
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn teardown(
        &self,
        req: Request<pb::TeardownRequest>,
    ) -> Result<Response<pb::TeardownResponse>, Status> {
        let caller = self.authenticate(&req, "Teardown")?;
        let r = req.into_inner();
        let owner = r.options.map(|o| o.owner).unwrap_or_default();
        let ready = self.teardown_impl(&caller, &r.namespace, &r.r#type, &r.id, &owner)?;
        Ok(Response::new(pb::TeardownResponse {
            destroy_ready: ready,
        }))
    }

    async fn teardown_and_destroy(
        &self,
        req: Request<pb::TeardownAndDestroyRequest>,
    ) -> Result<Response<pb::TeardownAndDestroyResponse>, Status> {
        let caller = self.authenticate(&req, "TeardownAndDestroy")?;
        let r = req.into_inner();
        let owner = r.options.map(|o| o.owner).unwrap_or_default();
        let mut changes = self.state.changed.subscribe();
        loop {
            match self.teardown_impl(&caller, &r.namespace, &r.r#type, &r.id, &owner) {
                Ok(true) => {
                    self.destroy_impl(&caller, &r.namespace, &r.r#type, &r.id, &owner)?;
                    return Ok(Response::new(pb::TeardownAndDestroyResponse {}));
                }
                Ok(false) => {}
                Err(s) if s.code() == tonic::Code::NotFound => {
                    return Ok(Response::new(pb::TeardownAndDestroyResponse {}));
                }
                Err(s) => return Err(s),
            }
            if changes.changed().await.is_err() {
                return Err(Status::unavailable("server shutting down"));
            }
        }
    }
}

fn event(
    kind: pb::EventType,
    resource: pb::Resource,
    old: Option<pb::Resource>,
    seq: u64,
) -> pb::Event {
    pb::Event {
        resource: Some(resource),
        event_type: kind as i32,
        old,
        error: None,
        bookmark: Some(bookmark(seq)),
    }
}

fn tombstone(ns: &str, ty: &str, id: &str) -> pb::Resource {
    pb::Resource {
        metadata: Some(pb::Metadata {
            namespace: ns.into(),
            r#type: ty.into(),
            id: id.into(),
            version: "undefined".into(),
            phase: PHASE_RUNNING.into(),
            ..Default::default()
        }),
        spec: Some(pb::Spec::default()),
    }
}

/// Turns stored events into what one watch should see (kind, id, visibility, label queries with
/// match flips rewritten to CREATED/DESTROYED).
struct WatchFilter {
    caller: Caller,
    scope: Scope,
    namespace: String,
    resource_type: String,
    id: Option<String>,
    queries: Vec<pb::LabelQuery>,
}

impl WatchFilter {
    fn map(&self, ev: &LoggedEvent) -> Result<Option<pb::Event>, Status> {
        let m = md(&ev.resource);
        if m.namespace != self.namespace || m.r#type != self.resource_type {
            return Ok(None);
        }
        if self.id.as_ref().is_some_and(|id| *id != m.id) {
            return Ok(None);
        }
        let now = self.caller.visible(self.scope, &ev.resource)
            && matches_queries(&m.labels, &self.queries)?;
        let before = match &ev.old {
            Some(o) => {
                self.caller.visible(self.scope, o) && matches_queries(&md(o).labels, &self.queries)?
            }
            None => false,
        };
        let out = match ev.kind {
            pb::EventType::Created if now => Some(event(
                pb::EventType::Created,
                ev.resource.clone(),
                None,
                ev.seq,
            )),
            pb::EventType::Destroyed if now => Some(event(
                pb::EventType::Destroyed,
                ev.resource.clone(),
                None,
                ev.seq,
            )),
            pb::EventType::Updated => match (before, now) {
                (true, true) => Some(event(
                    pb::EventType::Updated,
                    ev.resource.clone(),
                    ev.old.clone(),
                    ev.seq,
                )),
                (false, true) => Some(event(
                    pb::EventType::Created,
                    ev.resource.clone(),
                    None,
                    ev.seq,
                )),
                (true, false) => Some(event(
                    pb::EventType::Destroyed,
                    ev.resource.clone(),
                    None,
                    ev.seq,
                )),
                (false, false) => None,
            },
            _ => None,
        };
        Ok(out)
    }
}

// ---- management --------------------------------------------------------------------------------

#[derive(Clone)]
struct MgmtService {
    state: MemState,
}

#[tonic::async_trait]
impl ManagementService for MgmtService {
    async fn create_schematic_from_raw(
        &self,
        req: Request<mpb::CreateSchematicFromRawRequest>,
    ) -> Result<Response<mpb::CreateSchematicResponse>, Status> {
        let method = "/management.ManagementService/CreateSchematicFromRaw";
        {
            let mut store = self.state.lock();
            store.verifier.verify(method, req.metadata(), now_unix())?;
            *store.calls.entry(method.to_owned()).or_default() += 1;
        }
        let r = req.into_inner();
        if r.raw_schematic.is_empty() {
            return Err(Status::invalid_argument("raw schematic is empty"));
        }
        // Deterministic like the image factory: SHA-256 of the document (here: of the raw bytes).
        let id = hex(&sha2::Sha256::digest(&r.raw_schematic));
        Ok(Response::new(mpb::CreateSchematicResponse {
            schematic_id: id,
            pxe_url: String::new(),
            grpc_tunnel_enabled: false,
            schematic_yml: String::from_utf8_lossy(&r.raw_schematic).into_owned(),
        }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::label_term::Operation as Op;

    fn labels(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn term(key: &str, op: Op, values: &[&str], invert: bool) -> pb::LabelTerm {
        pb::LabelTerm {
            key: key.into(),
            op: op as i32,
            value: values.iter().map(|s| s.to_string()).collect(),
            invert,
        }
    }

    #[test]
    fn label_queries_and_or() {
        let l = labels(&[("a", "1"), ("b", "x")]);
        let q = |terms| pb::LabelQuery { terms };
        assert!(matches_queries(&l, &[]).unwrap());
        assert!(
            matches_queries(
                &l,
                &[q(vec![
                    term("a", Op::Equal, &["1"], false),
                    term("b", Op::Exists, &[], false)
                ])]
            )
            .unwrap()
        );
        assert!(!matches_queries(&l, &[q(vec![term("a", Op::Equal, &["2"], false)])]).unwrap());
        assert!(
            matches_queries(
                &l,
                &[
                    q(vec![term("a", Op::Equal, &["2"], false)]),
                    q(vec![term("b", Op::In, &["y", "x"], false)])
                ]
            )
            .unwrap()
        );
        assert!(matches_queries(&l, &[q(vec![term("c", Op::Exists, &[], true)])]).unwrap());
        assert!(matches_queries(&l, &[q(vec![term("a", Op::LtNumeric, &["2"], false)])]).unwrap());
        assert_eq!(
            matches_queries(&l, &[q(vec![term("a", Op::Equal, &[], false)])])
                .unwrap_err()
                .code(),
            tonic::Code::Internal
        );
    }

    #[test]
    fn read_only_update_may_only_touch_finalizers() {
        let r = tombstone("infra-provider", "MachineRequests.omni.sidero.dev", "r1");
        let mut f = r.clone();
        f.metadata.as_mut().unwrap().finalizers.push("x".into());
        f.metadata.as_mut().unwrap().version = "7".into();
        assert!(only_finalizers_changed(&r, &f));
        let mut s = r.clone();
        s.spec.as_mut().unwrap().proto_spec = vec![10, 1, b'v'];
        assert!(!only_finalizers_changed(&r, &s));
        let mut l = r.clone();
        l.metadata
            .as_mut()
            .unwrap()
            .labels
            .insert("k".into(), "v".into());
        assert!(!only_finalizers_changed(&r, &l));
    }
}

//! The gRPC face of the in-memory Omni: the COSI State service and the management schematic call,
//! each call checked against Omni's signature rules (§6.3) and access rules (§2.4) before it
//! touches the store.

use std::net::SocketAddr;
use std::pin::Pin;

use futures_util::Stream;
use sha2::Digest as _;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::MemState;
use super::access::{
    Access, Caller, READ_ONLY_FOR_PROVIDERS, Scope, only_finalizers_changed, validate_resource,
};
use super::query::matches_queries;
use super::store::{Key, Store, key_of, md, next_version, now_ts, now_unix};
use crate::proto::management::management_service_server::{
    ManagementService, ManagementServiceServer,
};
use crate::proto::state::state_server::{State, StateServer};
use omni_infra_provider_proxmox::omni::proto::cosi::resource as pb;
use omni_infra_provider_proxmox::omni::proto::management as mpb;
use omni_infra_provider_proxmox::omni::resources::{
    FEATURES_CONFIG, FEATURES_CONFIG_ID, PHASE_TEARING_DOWN, TALOS_VERSION, label,
};

impl MemState {
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

#[derive(Clone)]
pub(super) struct StateService {
    pub(super) state: MemState,
    pub(super) stop: watch::Receiver<bool>,
}

const SVC: &str = "/cosi.resource.State/";

impl StateService {
    fn authenticate<T>(&self, req: &Request<T>, method: &str) -> Result<Caller, Status> {
        let full = format!("{SVC}{method}");
        let mut store = self.state.lock();
        MemState::injected_failure(&mut store)?;
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

    /// Counts an accepted call of `method` on resources of type `ty` (see [`MemState::typed_calls`]).
    fn tally(&self, method: &str, ty: &str) {
        *self
            .state
            .lock()
            .typed_calls
            .entry((method.to_owned(), ty.to_owned()))
            .or_default() += 1;
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
        let old = visible(&store, caller, scope, &k)?;
        if READ_ONLY_FOR_PROVIDERS.contains(&ty) {
            // Server-side teardown is Get + Update of the phase, which the read-only rule rejects.
            return Err(Status::permission_denied(format!(
                "infra providers are not allowed to tear down {ty}"
            )));
        }
        owned_by(&old, owner)?;
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
        let old = visible(&store, caller, scope, &k)?;
        owned_by(&old, owner)?;
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

pub(super) type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl State for StateService {
    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        let caller = self.authenticate(&req, "Get")?;
        let r = req.into_inner();
        self.tally("Get", &r.r#type);
        let store = self.state.lock();
        let scope = caller.scope(&store, &r.namespace, &r.r#type, Access::Read)?;
        let found = visible(&store, &caller, scope, &(r.namespace, r.r#type, r.id))?;
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
        self.tally("List", &r.r#type);
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
        self.tally("Create", &key_of(md(&res)).1);
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
        self.tally("Update", &key_of(md(&res)).1);
        let mut store = self.state.lock();
        let (ns, ty, id) = key_of(md(&res));
        let scope = caller.scope(&store, &ns, &ty, Access::Write)?;
        caller.check_id(&ty, &id)?;
        let k = (ns, ty.clone(), id.clone());
        let old = visible(&store, &caller, scope, &k)?;
        owned_by(&old, &opts.owner)?;
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
        self.tally("Destroy", &r.r#type);
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
        self.tally("Watch", &req.get_ref().r#type);
        self.open_watch(caller, req.into_inner()).map(Response::new)
    }

    async fn teardown(
        &self,
        req: Request<pb::TeardownRequest>,
    ) -> Result<Response<pb::TeardownResponse>, Status> {
        let caller = self.authenticate(&req, "Teardown")?;
        let r = req.into_inner();
        self.tally("Teardown", &r.r#type);
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
        self.tally("TeardownAndDestroy", &r.r#type);
        let owner = r.options.map(|o| o.owner).unwrap_or_default();
        let mut changes = self.state.changed.subscribe();
        let mut cut = self.state.cut_signal();
        let mut waited = false;
        loop {
            match self.teardown_impl(&caller, &r.namespace, &r.r#type, &r.id, &owner) {
                Ok(true) => {
                    self.destroy_impl(&caller, &r.namespace, &r.r#type, &r.id, &owner)?;
                    return Ok(Response::new(pb::TeardownAndDestroyResponse {}));
                }
                Ok(false) => {}
                // Destroyed by someone else while the call waited: done, as COSI's wait for the
                // finalizers ends on a Destroyed event. A resource that is not there when the call
                // comes is an error (cosi-project/runtime `pkg/state/wrap.go` TeardownAndDestroy:
                // "If a resource doesn't exist, error is returned"; the server answers NotFound).
                Err(s) if waited && s.code() == tonic::Code::NotFound => {
                    return Ok(Response::new(pb::TeardownAndDestroyResponse {}));
                }
                Err(s) => return Err(s),
            }
            waited = true;
            tokio::select! {
                changed = changes.changed() => if changed.is_err() {
                    return Err(Status::unavailable("server shutting down"));
                },
                _ = cut.changed() => {
                    return Err(Status::unavailable("connection to Omni cut (memstate fault injection)"));
                }
            }
        }
    }
}

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
        self.signed(
            "/management.ManagementService/CreateSchematicFromRaw",
            req.metadata(),
        )?;
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

    async fn get_boot_asset_url(
        &self,
        req: Request<mpb::BootAssetUrlRequest>,
    ) -> Result<Response<mpb::BootAssetUrlResponse>, Status> {
        self.signed(
            "/management.ManagementService/GetBootAssetURL",
            req.metadata(),
        )?;
        self.boot_asset(req.get_ref()).map(Response::new)
    }
}

impl MgmtService {
    /// Omni's `GetBootAssetURL` (siderolabs/omni `internal/backend/grpc/schematics.go`, and
    /// `client/pkg/imagefactory/bootasset.go` `ResolveBootAsset`): the factory of the Talos version
    /// (its TalosVersions resource, else the features configuration, else factory.talos.dev),
    /// `<factory>/image/<schematic>/v<version>/<platform>-<arch>.<iso|format>`, and the factory's
    /// credentials as a basic `Authorization` header when it has some.
    fn boot_asset(
        &self,
        r: &mpb::BootAssetUrlRequest,
    ) -> Result<mpb::BootAssetUrlResponse, Status> {
        use base64::Engine;
        use mpb::boot_asset_url_request::BootAssetKind as Kind;
        let file = match Kind::try_from(r.boot_asset_kind) {
            Ok(Kind::Iso) => format!("{}-{}.iso", r.platform, r.architecture),
            Ok(Kind::Disk) if !r.format.is_empty() => {
                format!("{}-{}.{}", r.platform, r.architecture, r.format)
            }
            _ => return Err(Status::invalid_argument("unknown boot asset kind")),
        };
        if r.schematic_id.is_empty() || r.schematic_id.contains('/') {
            return Err(Status::invalid_argument("invalid schematic ID"));
        }
        let version = r.talos_version.trim_start_matches('v');
        let talos = self
            .state
            .get(&TALOS_VERSION, version)
            .map(|v| v.spec.image_factory_url)
            .filter(|u| !u.is_empty());
        let features = self
            .state
            .get(&FEATURES_CONFIG, FEATURES_CONFIG_ID)
            .map(|f| f.spec.image_factory_base_url)
            .filter(|u| !u.is_empty());
        let factory = talos
            .or(features)
            .unwrap_or_else(|| "https://factory.talos.dev".into());
        let factory = factory.trim_end_matches('/').to_owned();
        let url = format!("{factory}/image/{}/v{version}/{file}", r.schematic_id);
        let headers = match self.state.lock().factory_auth.get(&factory) {
            Some((user, password)) if !r.standalone_url => [(
                "Authorization".to_owned(),
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
                ),
            )]
            .into(),
            _ => Default::default(),
        };
        Ok(mpb::BootAssetUrlResponse {
            image_factory_host: url::Url::parse(&url)
                .ok()
                .and_then(|u| u.host_str().map(str::to_owned))
                .unwrap_or_default(),
            storage_key: hex(&sha2::Sha256::digest(format!("{}/{file}", r.schematic_id))),
            url,
            headers,
        })
    }

    fn signed(&self, method: &str, metadata: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        let mut store = self.state.lock();
        MemState::injected_failure(&mut store)?;
        store.verifier.verify(method, metadata, now_unix())?;
        *store.calls.entry(method.to_owned()).or_default() += 1;
        Ok(())
    }
}

/// The resource `k` as `caller` may see it; NotFound for one it may not see, as Omni answers a
/// provider asking for another's.
fn visible(store: &Store, caller: &Caller, scope: Scope, k: &Key) -> Result<pb::Resource, Status> {
    store
        .resources
        .get(k)
        .filter(|r| caller.visible(scope, r))
        .cloned()
        .ok_or_else(|| Status::not_found(format!("resource {} doesn't exist", k.2)))
}

/// Refuses a write by anyone but the resource's owner.
fn owned_by(old: &pb::Resource, owner: &str) -> Result<(), Status> {
    if md(old).owner == owner {
        return Ok(());
    }
    Err(Status::permission_denied(format!(
        "owner conflict: {:?} != {owner:?}",
        md(old).owner
    )))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

//! Typed client of Omni's COSI State service.
//!
//! The raw RPCs are thin; the value is in the helpers the Go runtime has and Omni's rules require:
//! finalizer loops that echo the received spec bytes (Omni compares specs of read-only resources
//! byte-for-byte after decoding), modify-with-conflict-retry (Omni's controllers add their
//! finalizers right after we create a resource, so our next update usually conflicts once),
//! teardown with a fallback for Omni < 1.8, and a watch that survives reconnects.
//!
//! Every error names the resource it was about, so a log line is enough to go and look.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::Code;

use super::proto::cosi::resource as pb;
use super::proto::cosi::resource::state_client::StateClient as RawClient;
use super::resources::{Kind, PHASE_RUNNING, PHASE_TEARING_DOWN};
use super::transport::{MAX_MESSAGE_BYTES, SignedChannel};

/// `namespace/type/id`, for error messages and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRef {
    pub namespace: String,
    pub resource_type: String,
    pub id: String,
}

impl ResourceRef {
    pub fn new(
        namespace: impl Into<String>,
        resource_type: impl Into<String>,
        id: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            resource_type: resource_type.into(),
            id: id.into(),
        }
    }

    pub fn of<K: Kind>(kind: &K, id: &str) -> Self {
        Self::new(kind.namespace(), kind.resource_type(), id)
    }

    pub fn from_metadata(md: &pb::Metadata) -> Self {
        Self::new(&md.namespace, &md.r#type, &md.id)
    }
}

impl std::fmt::Display for ResourceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.id.is_empty() {
            write!(f, "{}({})", self.resource_type, self.namespace)
        } else {
            write!(f, "{}({})/{}", self.resource_type, self.namespace, self.id)
        }
    }
}

/// What went wrong talking to the State service, by what the caller can do about it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StateError {
    #[error("{what} not found")]
    NotFound { what: ResourceRef },
    /// Version conflict (someone else wrote first) or pending finalizers on destroy.
    #[error("{what}: conflict: {message}")]
    Conflict { what: ResourceRef, message: String },
    #[error("{what} already exists")]
    AlreadyExists { what: ResourceRef },
    #[error(
        "{what}: permission denied by Omni: {message} (is the key an infra-provider key for this provider ID?)"
    )]
    PermissionDenied { what: ResourceRef, message: String },
    #[error("{what}: Omni rejected the request signature: {message} (check the key and the clock)")]
    Unauthenticated { what: ResourceRef, message: String },
    #[error("{what}: invalid request: {message}")]
    InvalidArgument { what: ResourceRef, message: String },
    #[error("{what}: not supported by this Omni: {message}")]
    Unimplemented { what: ResourceRef, message: String },
    #[error("{what}: cannot reach Omni: {message}")]
    Transport { what: ResourceRef, message: String },
    #[error("{what}: {message}")]
    Other { what: ResourceRef, message: String },
    #[error("{what}: spec does not decode: {message}")]
    Decode { what: ResourceRef, message: String },
}

impl StateError {
    pub fn from_status(what: ResourceRef, status: &tonic::Status) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            Code::NotFound => Self::NotFound { what },
            Code::FailedPrecondition => Self::Conflict { what, message },
            Code::AlreadyExists => Self::AlreadyExists { what },
            Code::PermissionDenied => Self::PermissionDenied { what, message },
            Code::Unauthenticated => Self::Unauthenticated { what, message },
            Code::InvalidArgument => Self::InvalidArgument { what, message },
            Code::Unimplemented => Self::Unimplemented { what, message },
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                Self::Transport { what, message }
            }
            _ => Self::Other {
                what,
                message: format!("{:?}: {message}", status.code()),
            },
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict { .. })
    }
}

/// A resource with its spec decoded, keeping the raw form to echo back.
#[derive(Debug, Clone, PartialEq)]
pub struct Typed<S> {
    pub metadata: pb::Metadata,
    pub spec: S,
}

impl<S: prost::Message + Default> Typed<S> {
    pub fn decode(resource: pb::Resource) -> Result<Self, StateError> {
        let metadata = resource.metadata.unwrap_or_default();
        let bytes = resource.spec.map(|s| s.proto_spec).unwrap_or_default();
        let spec = S::decode(bytes.as_slice()).map_err(|e| StateError::Decode {
            what: ResourceRef::from_metadata(&metadata),
            message: e.to_string(),
        })?;
        Ok(Self { metadata, spec })
    }

    pub fn id(&self) -> &str {
        &self.metadata.id
    }

    pub fn is_tearing_down(&self) -> bool {
        self.metadata.phase == PHASE_TEARING_DOWN
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.get(key).map(String::as_str)
    }

    pub fn has_finalizer(&self, finalizer: &str) -> bool {
        self.metadata.finalizers.iter().any(|f| f == finalizer)
    }
}

/// Builds label queries: terms inside one query are AND-ed; several queries are OR-ed.
#[derive(Debug, Clone, Default)]
pub struct LabelSelector(pb::LabelQuery);

impl LabelSelector {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn equal(mut self, key: &str, value: &str) -> Self {
        self.0.terms.push(pb::LabelTerm {
            key: key.to_owned(),
            op: pb::label_term::Operation::Equal as i32,
            // The server reads value[0]; always send exactly one.
            value: vec![value.to_owned()],
            invert: false,
        });
        self
    }

    pub fn exists(mut self, key: &str) -> Self {
        self.0.terms.push(pb::LabelTerm {
            key: key.to_owned(),
            op: pb::label_term::Operation::Exists as i32,
            value: vec![],
            invert: false,
        });
        self
    }

    pub fn into_query(self) -> pb::LabelQuery {
        self.0
    }
}

/// What a watch delivers, already reduced to what a reconcile queue needs.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    Created(pb::Resource),
    Updated(pb::Resource),
    Destroyed(pb::Resource),
    /// The initial listing is complete; everything that exists has been delivered as `Created`.
    Bootstrapped,
    /// The stream was re-established without a usable bookmark: a fresh bootstrap follows, so
    /// consumers should treat anything not re-announced as possibly gone.
    Resync,
}

impl WatchEvent {
    /// The resource the event is about, if any.
    pub fn resource(&self) -> Option<&pb::Resource> {
        match self {
            Self::Created(r) | Self::Updated(r) | Self::Destroyed(r) => Some(r),
            Self::Bootstrapped | Self::Resync => None,
        }
    }
}

/// Cheap to clone; share one per process.
#[derive(Clone)]
pub struct StateClient {
    raw: RawClient<SignedChannel>,
    /// Set once the server answered `Unimplemented` to Teardown (Omni < 1.8): from then on the
    /// Get+Update path is used directly, as the Go adapter does.
    teardown_unsupported: Arc<AtomicBool>,
    /// Backoff bounds for watch reconnects.
    reconnect: (Duration, Duration),
}

impl StateClient {
    pub fn new(channel: SignedChannel) -> Self {
        let raw = RawClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Self {
            raw,
            teardown_unsupported: Arc::new(AtomicBool::new(false)),
            reconnect: (Duration::from_millis(100), Duration::from_secs(30)),
        }
    }

    /// Overrides the watch reconnect backoff (initial, max); tests shorten it.
    pub fn with_reconnect_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.reconnect = (initial, max);
        self
    }

    // ---- raw resources -------------------------------------------------------------------------

    pub async fn get_raw(&self, what: &ResourceRef) -> Result<pb::Resource, StateError> {
        let req = pb::GetRequest {
            namespace: what.namespace.clone(),
            r#type: what.resource_type.clone(),
            id: what.id.clone(),
            options: Some(pb::GetOptions {}),
        };
        let resp = self
            .raw
            .clone()
            .get(req)
            .await
            .map_err(|s| StateError::from_status(what.clone(), &s))?;
        resp.into_inner().resource.ok_or_else(|| StateError::Other {
            what: what.clone(),
            message: "Get returned no resource".into(),
        })
    }

    pub async fn list_raw(
        &self,
        namespace: &str,
        resource_type: &str,
        selectors: Vec<LabelSelector>,
    ) -> Result<Vec<pb::Resource>, StateError> {
        let what = ResourceRef::new(namespace, resource_type, "");
        let req = pb::ListRequest {
            namespace: namespace.to_owned(),
            r#type: resource_type.to_owned(),
            options: Some(pb::ListOptions {
                label_query: selectors
                    .into_iter()
                    .map(LabelSelector::into_query)
                    .collect(),
                id_query: None,
            }),
        };
        let mut stream = self
            .raw
            .clone()
            .list(req)
            .await
            .map_err(|s| StateError::from_status(what.clone(), &s))?
            .into_inner();
        let mut out = Vec::new();
        while let Some(msg) = stream
            .message()
            .await
            .map_err(|s| StateError::from_status(what.clone(), &s))?
        {
            out.extend(msg.resource);
        }
        Ok(out)
    }

    /// Creates `resource` (version and phase are set as the server expects); returns what was stored.
    pub async fn create_raw(
        &self,
        mut resource: pb::Resource,
        owner: &str,
    ) -> Result<pb::Resource, StateError> {
        let md = resource.metadata.get_or_insert_with(Default::default);
        md.version = "undefined".into();
        md.phase = PHASE_RUNNING.into();
        md.owner = owner.to_owned();
        let what = ResourceRef::from_metadata(md);
        resource.spec.get_or_insert_with(Default::default);
        let req = pb::CreateRequest {
            resource: Some(resource),
            options: Some(pb::CreateOptions {
                owner: owner.to_owned(),
            }),
        };
        let resp = self
            .raw
            .clone()
            .create(req)
            .await
            .map_err(|s| StateError::from_status(what.clone(), &s))?;
        resp.into_inner().resource.ok_or(StateError::Other {
            what,
            message: "Create returned no resource".into(),
        })
    }

    /// Updates `resource`, whose metadata version must be the stored one. `owner` is the owner the
    /// caller acts as (must equal the stored owner); `expected_phase` None accepts any phase.
    pub async fn update_raw(
        &self,
        resource: pb::Resource,
        owner: &str,
        expected_phase: Option<&str>,
    ) -> Result<pb::Resource, StateError> {
        let what = resource
            .metadata
            .as_ref()
            .map(ResourceRef::from_metadata)
            .unwrap_or_else(|| ResourceRef::new("", "", ""));
        let req = pb::UpdateRequest {
            new_resource: Some(resource),
            options: Some(pb::UpdateOptions {
                owner: owner.to_owned(),
                expected_phase: expected_phase.map(str::to_owned),
            }),
        };
        let resp = self
            .raw
            .clone()
            .update(req)
            .await
            .map_err(|s| StateError::from_status(what.clone(), &s))?;
        resp.into_inner().resource.ok_or(StateError::Other {
            what,
            message: "Update returned no resource".into(),
        })
    }

    pub async fn destroy(&self, what: &ResourceRef, owner: &str) -> Result<(), StateError> {
        let req = pb::DestroyRequest {
            namespace: what.namespace.clone(),
            r#type: what.resource_type.clone(),
            id: what.id.clone(),
            options: Some(pb::DestroyOptions {
                owner: owner.to_owned(),
            }),
        };
        self.raw
            .clone()
            .destroy(req)
            .await
            .map_err(|s| StateError::from_status(what.clone(), &s))?;
        Ok(())
    }

    /// Moves a resource to `tearingDown`; returns whether it can be destroyed now (no finalizers).
    /// Uses the Teardown RPC, and Get+Update on Omni < 1.8.
    pub async fn teardown(&self, what: &ResourceRef, owner: &str) -> Result<bool, StateError> {
        if !self.teardown_unsupported.load(Ordering::Relaxed) {
            let req = pb::TeardownRequest {
                namespace: what.namespace.clone(),
                r#type: what.resource_type.clone(),
                id: what.id.clone(),
                options: Some(pb::TeardownOptions {
                    owner: owner.to_owned(),
                }),
            };
            match self.raw.clone().teardown(req).await {
                Ok(resp) => return Ok(resp.into_inner().destroy_ready),
                Err(s) if s.code() == Code::Unimplemented => {
                    tracing::info!("Omni has no Teardown RPC (older than 1.8); using Get+Update");
                    self.teardown_unsupported.store(true, Ordering::Relaxed);
                }
                Err(s) => return Err(StateError::from_status(what.clone(), &s)),
            }
        }
        self.teardown_by_update(what, owner).await
    }

    async fn teardown_by_update(
        &self,
        what: &ResourceRef,
        owner: &str,
    ) -> Result<bool, StateError> {
        loop {
            let mut current = self.get_raw(what).await?;
            let md = current.metadata.get_or_insert_with(Default::default);
            if md.phase == PHASE_TEARING_DOWN {
                return Ok(md.finalizers.is_empty());
            }
            md.phase = PHASE_TEARING_DOWN.into();
            match self.update_raw(current, owner, Some(PHASE_RUNNING)).await {
                Ok(stored) => {
                    return Ok(stored.metadata.is_none_or(|m| m.finalizers.is_empty()));
                }
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Adds a finalizer, echoing the received spec bytes and acting as the resource's current
    /// owner, with no expected phase, as Omni allows providers on read-only resources. Retries version conflicts.
    pub async fn add_finalizer(
        &self,
        what: &ResourceRef,
        finalizer: &str,
    ) -> Result<(), StateError> {
        self.edit_finalizers(what, |f| {
            if f.iter().any(|x| x == finalizer) {
                false
            } else {
                f.push(finalizer.to_owned());
                true
            }
        })
        .await
    }

    /// Removes a finalizer (same rules as [`Self::add_finalizer`]).
    pub async fn remove_finalizer(
        &self,
        what: &ResourceRef,
        finalizer: &str,
    ) -> Result<(), StateError> {
        self.edit_finalizers(what, |f| {
            let before = f.len();
            f.retain(|x| x != finalizer);
            f.len() != before
        })
        .await
    }

    async fn edit_finalizers(
        &self,
        what: &ResourceRef,
        mut edit: impl FnMut(&mut Vec<String>) -> bool,
    ) -> Result<(), StateError> {
        loop {
            // The whole received resource goes back unchanged except the finalizer list: spec bytes
            // are never decoded and re-encoded.
            let mut current = self.get_raw(what).await?;
            let md = current.metadata.get_or_insert_with(Default::default);
            if !edit(&mut md.finalizers) {
                return Ok(());
            }
            let owner = md.owner.clone();
            match self.update_raw(current, &owner, None).await {
                Ok(_) => return Ok(()),
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(e),
            }
        }
    }

    // ---- typed -----------------------------------------------------------------------------------

    pub async fn get<K: Kind>(&self, kind: &K, id: &str) -> Result<Typed<K::Spec>, StateError> {
        Typed::decode(self.get_raw(&ResourceRef::of(kind, id)).await?)
    }

    /// `get` that maps NotFound to `None`.
    pub async fn find<K: Kind>(
        &self,
        kind: &K,
        id: &str,
    ) -> Result<Option<Typed<K::Spec>>, StateError> {
        match self.get(kind, id).await {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn list<K: Kind>(
        &self,
        kind: &K,
        selectors: Vec<LabelSelector>,
    ) -> Result<Vec<Typed<K::Spec>>, StateError> {
        self.list_raw(&kind.namespace(), &kind.resource_type(), selectors)
            .await?
            .into_iter()
            .map(Typed::decode)
            .collect()
    }

    pub async fn create<K: Kind>(
        &self,
        kind: &K,
        id: &str,
        spec: &K::Spec,
        labels: BTreeMap<String, String>,
        owner: &str,
    ) -> Result<Typed<K::Spec>, StateError> {
        let resource = pb::Resource {
            metadata: Some(pb::Metadata {
                namespace: kind.namespace(),
                r#type: kind.resource_type(),
                id: id.to_owned(),
                labels: labels.into_iter().collect(),
                ..Default::default()
            }),
            spec: Some(encode_spec(kind, spec)),
        };
        Typed::decode(self.create_raw(resource, owner).await?)
    }

    /// Writes a typed resource back (metadata as read, so the version check applies).
    pub async fn update<K: Kind>(
        &self,
        kind: &K,
        resource: &Typed<K::Spec>,
        owner: &str,
        expected_phase: Option<&str>,
    ) -> Result<Typed<K::Spec>, StateError> {
        let raw = pb::Resource {
            metadata: Some(resource.metadata.clone()),
            spec: Some(encode_spec(kind, &resource.spec)),
        };
        Typed::decode(self.update_raw(raw, owner, expected_phase).await?)
    }

    /// Get → mutate → Update, retrying version conflicts; creates (with `owner`) when absent.
    /// Skips the write when `mutate` changed nothing. Returns the stored resource.
    pub async fn modify<K: Kind>(
        &self,
        kind: &K,
        id: &str,
        owner: &str,
        mut mutate: impl FnMut(&mut Typed<K::Spec>),
    ) -> Result<Typed<K::Spec>, StateError> {
        loop {
            match self.find(kind, id).await? {
                None => {
                    let mut fresh = Typed {
                        metadata: pb::Metadata {
                            namespace: kind.namespace(),
                            r#type: kind.resource_type(),
                            id: id.to_owned(),
                            ..Default::default()
                        },
                        spec: K::Spec::default(),
                    };
                    mutate(&mut fresh);
                    let labels = fresh.metadata.labels.clone().into_iter().collect();
                    match self.create(kind, id, &fresh.spec, labels, owner).await {
                        Err(StateError::AlreadyExists { .. }) => continue,
                        other => return other,
                    }
                }
                Some(current) => {
                    let mut next = current.clone();
                    mutate(&mut next);
                    if next == current {
                        return Ok(current);
                    }
                    match self.update(kind, &next, owner, None).await {
                        Err(e) if e.is_conflict() => continue,
                        other => return other,
                    }
                }
            }
        }
    }

    // ---- watch -----------------------------------------------------------------------------------

    /// Watches all resources of a kind matching `selectors` (bootstrap first). Events arrive on the
    /// returned receiver; dropping it stops the watch. Broken streams are re-established with
    /// backoff, resuming from the last bookmark, or re-bootstrapping (after a
    /// [`WatchEvent::Resync`]) when there is none, Omni refuses it, or the stream ended with an
    /// ERRORED event (how Omni's etcd store reports a bookmark older than its compacted history).
    pub fn watch_kind(
        &self,
        namespace: &str,
        resource_type: &str,
        selectors: Vec<LabelSelector>,
    ) -> mpsc::Receiver<Result<WatchEvent, StateError>> {
        let (tx, rx) = mpsc::channel(256);
        let client = self.clone();
        let what = ResourceRef::new(namespace, resource_type, "");
        let queries: Vec<pb::LabelQuery> = selectors
            .into_iter()
            .map(LabelSelector::into_query)
            .collect();
        tokio::spawn(async move {
            tokio::select! {
                _ = tx.closed() => {}
                _ = client.run_watch(what, queries, &tx) => {}
            }
        });
        rx
    }

    async fn run_watch(
        &self,
        what: ResourceRef,
        queries: Vec<pb::LabelQuery>,
        tx: &mpsc::Sender<Result<WatchEvent, StateError>>,
    ) {
        let mut bookmark: Option<Vec<u8>> = None;
        let mut first = true;
        let mut backoff = self.reconnect.0;
        loop {
            let resume = bookmark.clone();
            if resume.is_none() && !first && tx.send(Ok(WatchEvent::Resync)).await.is_err() {
                return;
            }
            first = false;
            let req = watch_request(&what, &queries, resume.clone());
            let result = self
                .stream_events(&what, req, &mut bookmark, tx, &mut backoff)
                .await;
            match result {
                StreamEnd::ReceiverGone => return,
                StreamEnd::BookmarkRefused => {
                    tracing::info!(watch = %what, "Omni refused the watch bookmark; re-bootstrapping");
                    bookmark = None;
                }
                StreamEnd::Errored(message) => {
                    // Resuming would only replay the same error (a compacted revision stays
                    // compacted): start over with a full listing.
                    tracing::warn!(watch = %what, error = %message, "Omni ended the watch with an error; re-bootstrapping");
                    bookmark = None;
                }
                StreamEnd::Broken(e) => {
                    tracing::warn!(watch = %what, error = %e, retry_in = ?backoff, "watch broken; reconnecting");
                    if e.is_permanent() && tx.send(Err(e)).await.is_err() {
                        return;
                    }
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.reconnect.1);
        }
    }

    async fn stream_events(
        &self,
        what: &ResourceRef,
        req: pb::WatchRequest,
        bookmark: &mut Option<Vec<u8>>,
        tx: &mpsc::Sender<Result<WatchEvent, StateError>>,
        backoff: &mut Duration,
    ) -> StreamEnd {
        let resuming = req
            .options
            .as_ref()
            .is_some_and(|o| o.start_from_bookmark.is_some());
        let mut stream = match self.raw.clone().watch(req).await {
            Ok(s) => s.into_inner(),
            Err(s) if resuming && s.code() == Code::FailedPrecondition => {
                return StreamEnd::BookmarkRefused;
            }
            Err(s) => return StreamEnd::Broken(StateError::from_status(what.clone(), &s)),
        };
        loop {
            let msg = match stream.message().await {
                Ok(Some(m)) => m,
                Ok(None) => {
                    return StreamEnd::Broken(StateError::Transport {
                        what: what.clone(),
                        message: "watch stream ended".into(),
                    });
                }
                Err(s) if resuming && s.code() == Code::FailedPrecondition => {
                    return StreamEnd::BookmarkRefused;
                }
                Err(s) => return StreamEnd::Broken(StateError::from_status(what.clone(), &s)),
            };
            // The first message is empty ("established"); aggregated messages may also be empty
            // after Omni's per-provider filtering. Neither is an error.
            for event in msg.event {
                let mapped = match pb::EventType::try_from(event.event_type) {
                    Ok(pb::EventType::Created) => event.resource.map(WatchEvent::Created),
                    Ok(pb::EventType::Updated) => event.resource.map(WatchEvent::Updated),
                    Ok(pb::EventType::Destroyed) => event.resource.map(WatchEvent::Destroyed),
                    Ok(pb::EventType::Bootstrapped) => Some(WatchEvent::Bootstrapped),
                    Ok(pb::EventType::Noop) => None,
                    Ok(pb::EventType::Errored) | Err(_) => {
                        // The backend's watch has ended; the server keeps the stream open but sends
                        // nothing more. On Omni's etcd store this is how an expired bookmark is
                        // reported ("required revision has been compacted"), so the bookmark must
                        // go with the stream.
                        return StreamEnd::Errored(event.error.unwrap_or_default());
                    }
                };
                // A working stream: the next break starts its backoff afresh.
                *backoff = self.reconnect.0;
                if let Some(b) = &event.bookmark {
                    *bookmark = Some(b.clone());
                }
                if let Some(ev) = mapped
                    && tx.send(Ok(ev)).await.is_err()
                {
                    return StreamEnd::ReceiverGone;
                }
            }
        }
    }
}

enum StreamEnd {
    ReceiverGone,
    /// The call itself was refused because of the bookmark (FailedPrecondition).
    BookmarkRefused,
    /// An ERRORED event: the stream is dead and its bookmark is not to be trusted.
    Errored(String),
    Broken(StateError),
}

impl StateError {
    /// Errors a reconnect will not fix; reported to the watcher (the watch still retries, since
    /// e.g. a key registration may be fixed while we run).
    fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::PermissionDenied { .. }
                | Self::Unauthenticated { .. }
                | Self::InvalidArgument { .. }
        )
    }
}

fn watch_request(
    what: &ResourceRef,
    queries: &[pb::LabelQuery],
    resume: Option<Vec<u8>>,
) -> pb::WatchRequest {
    let bootstrap = resume.is_none();
    pb::WatchRequest {
        namespace: what.namespace.clone(),
        r#type: what.resource_type.clone(),
        id: None,
        options: Some(pb::WatchOptions {
            bootstrap_contents: bootstrap,
            tail_events: 0,
            label_query: queries.to_vec(),
            id_query: None,
            aggregated: false,
            start_from_bookmark: resume,
            bootstrap_bookmark: false,
        }),
        // 0 would make the server drop BOOTSTRAPPED and ERRORED events.
        api_version: 1,
    }
}

fn encode_spec<K: Kind>(kind: &K, spec: &K::Spec) -> pb::Spec {
    pb::Spec {
        proto_spec: prost::Message::encode_to_vec(spec),
        yaml_spec: kind.yaml(spec),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_map_to_typed_errors() {
        let what = ResourceRef::new("infra-provider", "MachineRequests.omni.sidero.dev", "r1");
        let e = StateError::from_status(what.clone(), &tonic::Status::not_found("x"));
        assert!(e.is_not_found());
        assert!(
            e.to_string()
                .contains("MachineRequests.omni.sidero.dev(infra-provider)/r1")
        );
        let e =
            StateError::from_status(what.clone(), &tonic::Status::failed_precondition("version"));
        assert!(e.is_conflict());
        let e = StateError::from_status(what, &tonic::Status::permission_denied("nope"));
        assert!(matches!(e, StateError::PermissionDenied { .. }));
    }

    #[test]
    fn bootstrap_or_resume() {
        let what = ResourceRef::new("ns", "T", "");
        let r = watch_request(&what, &[], None);
        let o = r.options.unwrap();
        assert!(o.bootstrap_contents && o.start_from_bookmark.is_none());
        assert_eq!(r.api_version, 1);
        let r = watch_request(&what, &[], Some(vec![1]));
        let o = r.options.unwrap();
        assert!(!o.bootstrap_contents && o.start_from_bookmark == Some(vec![1]));
    }
}

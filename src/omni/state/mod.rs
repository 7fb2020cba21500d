//! Typed client of Omni's COSI State service.
//!
//! The raw RPCs are thin; the value is in the helpers the Go runtime has and Omni's rules require:
//! finalizer loops that echo the received spec bytes (Omni compares specs of read-only resources
//! byte-for-byte after decoding), modify-with-conflict-retry (Omni's controllers add their
//! finalizers right after we create a resource, so our next update usually conflicts once),
//! teardown with a fallback for Omni < 1.8, and a watch that survives reconnects.
//!
//! Every error names the resource it was about, so a log line is enough to go and look.

mod watch;

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prost::encoding::{DecodeContext, decode_key, skip_field};
use tonic::Code;

use super::proto::cosi::resource as pb;
use super::proto::cosi::resource::state_client::StateClient as RawClient;
use super::resources::{Kind, PHASE_RUNNING, PHASE_TEARING_DOWN, Spec};
use super::transport::{MAX_MESSAGE_BYTES, SignedChannel};
use crate::fence::Fence;
pub use watch::WatchEvent;

/// `namespace/type/id`, for error messages and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceRef {
    pub namespace: String,
    pub resource_type: String,
    pub id: String,
}

impl ResourceRef {
    pub fn of<S>(kind: &Kind<S>, id: &str) -> Self {
        Self {
            namespace: kind.namespace.to_string(),
            resource_type: kind.resource_type.to_string(),
            id: id.to_owned(),
        }
    }

    pub fn from_metadata(md: &pb::Metadata) -> Self {
        Self {
            namespace: md.namespace.clone(),
            resource_type: md.r#type.clone(),
            id: md.id.clone(),
        }
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
    /// Not sent: this replica does not hold the leader lease (see [`crate::fence`]).
    #[error("{what}: {source}")]
    Fenced {
        what: ResourceRef,
        source: crate::fence::Fenced,
    },
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
    /// The spec's fields `S` does not define, as read, written back with it ([`unknown_fields`]).
    pub unknown_fields: Vec<u8>,
    /// The spec exactly as Omni sent it (`None` for a resource built here): a finalizer-only
    /// update echoes it unchanged ([`StateClient::remove_finalizer_from`]).
    pub received_spec: Option<pb::Spec>,
}

impl<S: prost::Message + Default> Typed<S> {
    pub fn decode(resource: pb::Resource) -> Result<Self, StateError> {
        let metadata = resource.metadata.unwrap_or_default();
        let received_spec = resource.spec.unwrap_or_default();
        let bytes = received_spec.proto_spec.as_slice();
        let spec = S::decode(bytes).map_err(|e| StateError::Decode {
            what: ResourceRef::from_metadata(&metadata),
            message: e.to_string(),
        })?;
        Ok(Self {
            unknown_fields: unknown_fields(bytes, &spec),
            metadata,
            spec,
            received_spec: Some(received_spec),
        })
    }

    /// A resource of `kind` not yet stored: its ID and spec, nothing else.
    pub fn fresh(kind: &Kind<S>, id: &str, spec: S) -> Self {
        Self {
            metadata: pb::Metadata {
                namespace: kind.namespace.clone().into(),
                r#type: kind.resource_type.clone().into(),
                id: id.to_owned(),
                ..Default::default()
            },
            spec,
            unknown_fields: Vec::new(),
            received_spec: None,
        }
    }

    /// The resource to send with `metadata`: the spec encoded after its kept unknown fields, and
    /// its YAML.
    fn encode(&self, kind: &Kind<S>, metadata: pb::Metadata) -> pb::Resource {
        let mut proto_spec = self.unknown_fields.clone();
        self.spec.encode_raw(&mut proto_spec);
        pb::Resource {
            metadata: Some(metadata),
            spec: Some(pb::Spec {
                proto_spec,
                yaml_spec: kind.yaml(&self.spec),
            }),
        }
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

/// The label query asking that every `(key, value)` of `labels` be set as given; none (every
/// resource) when `labels` is empty.
pub fn label_query(labels: &[(&str, &str)]) -> Vec<pb::LabelQuery> {
    let terms: Vec<pb::LabelTerm> = (labels.iter())
        .map(|(key, value)| pb::LabelTerm {
            key: (*key).to_owned(),
            op: pb::label_term::Operation::Equal as i32,
            // The server reads value[0]; always send exactly one.
            value: vec![(*value).to_owned()],
            invert: false,
        })
        .collect();
    Vec::from_iter((!terms.is_empty()).then_some(pb::LabelQuery { terms }))
}

/// Cheap to clone; share one per process.
///
/// Every RPC's future (the request, the signing channel's state, the codec's) is about 2 KiB, and
/// is boxed where it is made: a reconcile holds one only while the call is in flight, not for its
/// whole life. A future is as large as the largest state it can be in, so an unboxed call
/// anywhere in a reconcile would make every reconcile that large, also while it waits for a slot
/// (a thousand may wait at once).
#[derive(Clone)]
pub struct StateClient {
    raw: RawClient<SignedChannel>,
    /// Set once the server answered `Unimplemented` to Teardown (Omni < 1.8): from then on the
    /// Get+Update path is used directly, as the Go adapter does.
    teardown_unsupported: Arc<AtomicBool>,
    /// Backoff bounds for watch reconnects (initial, max); tests shorten them.
    pub reconnect: (Duration, Duration),
    /// Asked before every write (create, update, teardown, destroy).
    fence: Fence,
    /// How long one call may wait for Omni's answer ([`CALL_DEADLINE`]); tests shorten it.
    pub deadline: Duration,
}

/// How long one State call may wait for Omni's answer by default: far beyond a healthy answer
/// (milliseconds; a listing of thousands of resources, a second or two), short enough that an Omni
/// (or a proxy before it) that takes a request and never answers holds nothing for long.
pub const CALL_DEADLINE: Duration = Duration::from_secs(30);

impl StateClient {
    pub fn new(channel: SignedChannel) -> Self {
        Self {
            raw: RawClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            teardown_unsupported: Arc::new(AtomicBool::new(false)),
            reconnect: (Duration::from_millis(100), Duration::from_secs(30)),
            fence: Fence::default(),
            deadline: CALL_DEADLINE,
        }
    }

    /// The same client, sending writes only while `fence` is open; reads and watches are not
    /// fenced. The leader lease itself is written through the unfenced client.
    pub fn fenced(&self, fence: Fence) -> Self {
        Self {
            fence,
            ..self.clone()
        }
    }

    fn check_fence(&self, what: &ResourceRef) -> Result<(), StateError> {
        self.fence.check().map_err(|source| StateError::Fenced {
            what: what.clone(),
            source,
        })
    }

    /// One unary call (boxed where it is made, see [`StateClient`]) within the deadline, its status
    /// turned into a [`StateError`] about `what`; a `write` is sent only while the fence is open.
    async fn unary<T, F>(
        &self,
        what: &ResourceRef,
        write: bool,
        call: impl FnOnce(RawClient<SignedChannel>) -> F,
    ) -> Result<T, StateError>
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        if write {
            self.check_fence(what)?;
        }
        let call = Box::pin(call(self.raw.clone()));
        self.bounded(what, async {
            call.await
                .map(tonic::Response::into_inner)
                .map_err(|s| StateError::from_status(what.clone(), &s))
        })
        .await
    }

    /// `call`, or a transport error once the deadline has passed without an answer.
    async fn bounded<T>(
        &self,
        what: &ResourceRef,
        call: impl std::future::Future<Output = Result<T, StateError>>,
    ) -> Result<T, StateError> {
        tokio::time::timeout(self.deadline, call)
            .await
            .unwrap_or_else(|_| {
                Err(StateError::Transport {
                    what: what.clone(),
                    message: format!("no answer within {:?}", self.deadline),
                })
            })
    }

    // ---- raw resources -------------------------------------------------------------------------

    pub async fn get_raw(&self, what: &ResourceRef) -> Result<pb::Resource, StateError> {
        let req = pb::GetRequest {
            namespace: what.namespace.clone(),
            r#type: what.resource_type.clone(),
            id: what.id.clone(),
            options: Some(pb::GetOptions {}),
        };
        let resp = (self.unary(what, false, |mut raw| async move { raw.get(req).await })).await?;
        returned(what, "Get", resp.resource)
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
            .map_or_else(Default::default, ResourceRef::from_metadata);
        let req = pb::UpdateRequest {
            new_resource: Some(resource),
            options: Some(pb::UpdateOptions {
                owner: owner.to_owned(),
                expected_phase: expected_phase.map(str::to_owned),
            }),
        };
        let update = |mut raw: RawClient<_>| async move { raw.update(req).await };
        let resp = self.unary(&what, true, update).await?;
        returned(&what, "Update", resp.resource)
    }

    /// Destroys `what`; gone already is fine.
    pub async fn destroy(&self, what: &ResourceRef, owner: &str) -> Result<(), StateError> {
        let req = pb::DestroyRequest {
            namespace: what.namespace.clone(),
            r#type: what.resource_type.clone(),
            id: what.id.clone(),
            options: Some(pb::DestroyOptions {
                owner: owner.to_owned(),
            }),
        };
        let destroy = |mut raw: RawClient<_>| async move { raw.destroy(req).await };
        match self.unary(what, true, destroy).await {
            Err(e) if e.is_not_found() => Ok(()),
            destroyed => destroyed.map(drop),
        }
    }

    /// Moves a resource to `tearingDown`; returns whether it can be destroyed now (no finalizers).
    /// Uses the Teardown RPC, and Get+Update on Omni < 1.8.
    pub async fn teardown(&self, what: &ResourceRef, owner: &str) -> Result<bool, StateError> {
        self.check_fence(what)?;
        if !self.teardown_unsupported.load(Ordering::Relaxed) {
            let req = pb::TeardownRequest {
                namespace: what.namespace.clone(),
                r#type: what.resource_type.clone(),
                id: what.id.clone(),
                options: Some(pb::TeardownOptions {
                    owner: owner.to_owned(),
                }),
            };
            let teardown = |mut raw: RawClient<_>| async move { raw.teardown(req).await };
            match self.unary(what, false, teardown).await {
                Ok(resp) => return Ok(resp.destroy_ready),
                Err(e) => self.unless_unimplemented("Teardown", e)?,
            }
        }
        let edit = |md: &mut pb::Metadata| {
            let running = md.phase != PHASE_TEARING_DOWN;
            md.phase = PHASE_TEARING_DOWN.into();
            running
        };
        self.edit_metadata(what, Some(owner), Some(PHASE_RUNNING), edit)
            .await
            .map(|md| md.finalizers.is_empty())
    }

    /// Tears `what` down and destroys it once no finalizer holds it: `Ok(true)` when it is gone (or
    /// already was), `Ok(false)` while another controller's finalizer keeps it (try again later).
    ///
    /// One TeardownAndDestroy call, which waits on the server for the finalizers to go
    /// (cosi-project/runtime `pkg/state/wrap.go` TeardownAndDestroy: Teardown, a watch until the
    /// finalizers are empty, Destroy), for at most `wait`: a controller that lets go at once (Omni's
    /// ConfigPatchRequestController does, as soon as it sees the teardown) costs one call instead
    /// of two; one that holds on is left to the watch, the resource torn down.
    pub async fn teardown_and_destroy(
        &self,
        what: &ResourceRef,
        owner: &str,
        wait: Duration,
    ) -> Result<bool, StateError> {
        self.check_fence(what)?;
        if !self.teardown_unsupported.load(Ordering::Relaxed) {
            let req = pb::TeardownAndDestroyRequest {
                namespace: what.namespace.clone(),
                r#type: what.resource_type.clone(),
                id: what.id.clone(),
                options: Some(pb::TeardownAndDestroyOptions {
                    owner: owner.to_owned(),
                }),
            };
            let mut raw = self.raw.clone();
            let call = Box::pin(raw.teardown_and_destroy(req));
            let Ok(answer) = tokio::time::timeout(wait.min(self.deadline), call).await else {
                return Ok(false);
            };
            match answer.map_err(|s| StateError::from_status(what.clone(), &s)) {
                Err(e) if !e.is_not_found() => {
                    self.unless_unimplemented("TeardownAndDestroy", e)?
                }
                _ => return Ok(true),
            }
        }
        match self.teardown(what, owner).await {
            Ok(true) => {}
            Err(e) if e.is_not_found() => return Ok(true),
            other => return other,
        }
        self.destroy(what, owner).await.map(|()| true)
    }

    /// `error`, unless it says Omni lacks the `rpc` (Teardown and TeardownAndDestroy came in the
    /// same COSI release, Omni 1.8): then the Get+Update path is used from now on, as the Go
    /// adapter does.
    fn unless_unimplemented(&self, rpc: &str, error: StateError) -> Result<(), StateError> {
        if !matches!(error, StateError::Unimplemented { .. }) {
            return Err(error);
        }
        tracing::info!("Omni has no {rpc} RPC (older than 1.8); using Get+Update");
        self.teardown_unsupported.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Adds (`present`) or removes a finalizer, echoing the received spec bytes and acting as the
    /// resource's current owner, with no expected phase, as Omni allows providers on read-only
    /// resources. Retries version conflicts; writes nothing when the finalizer already is as asked.
    pub async fn set_finalizer(
        &self,
        what: &ResourceRef,
        finalizer: &str,
        present: bool,
    ) -> Result<(), StateError> {
        let edit = |md: &mut pb::Metadata| {
            let had = md.finalizers.iter().any(|f| f == finalizer);
            if had != present {
                md.finalizers.retain(|f| f != finalizer);
                md.finalizers.extend(present.then(|| finalizer.to_owned()));
            }
            had != present
        };
        self.edit_metadata(what, None, None, edit).await.map(drop)
    }

    /// Removes a finalizer from the copy of a resource a watch delivered, echoing its spec as
    /// received and acting as its owner: one Update where [`Self::set_finalizer`] needs a Get
    /// first. Should the resource have changed since (a version conflict), the Get+Update loop
    /// runs.
    pub async fn remove_finalizer_from<S>(
        &self,
        delivered: &Typed<S>,
        finalizer: &str,
    ) -> Result<(), StateError> {
        let what = ResourceRef::from_metadata(&delivered.metadata);
        let mut metadata = delivered.metadata.clone();
        metadata.finalizers.retain(|f| f != finalizer);
        let removed = metadata.finalizers.len() < delivered.metadata.finalizers.len();
        let Some(spec) = delivered.received_spec.clone().filter(|_| removed) else {
            return self.set_finalizer(&what, finalizer, false).await;
        };
        let echo = pb::Resource {
            metadata: Some(metadata),
            spec: Some(spec),
        };
        match self.update_raw(echo, &delivered.metadata.owner, None).await {
            Err(e) if e.is_conflict() => self.set_finalizer(&what, finalizer, false).await,
            other => other.map(drop),
        }
    }

    /// Get → `edit` the metadata → Update (as `owner`, else as the stored owner), retrying version
    /// conflicts; `edit` says whether it changed anything worth writing. The whole received resource
    /// goes back unchanged except its metadata: spec bytes are never decoded and re-encoded. Returns
    /// the metadata as stored.
    async fn edit_metadata(
        &self,
        what: &ResourceRef,
        owner: Option<&str>,
        expected_phase: Option<&str>,
        mut edit: impl FnMut(&mut pb::Metadata) -> bool,
    ) -> Result<pb::Metadata, StateError> {
        loop {
            let mut current = self.get_raw(what).await?;
            let md = current.metadata.get_or_insert_with(Default::default);
            if !edit(md) {
                return Ok(md.clone());
            }
            let owner = owner.map_or_else(|| md.owner.clone(), str::to_owned);
            match self.update_raw(current, &owner, expected_phase).await {
                Err(e) if e.is_conflict() => continue,
                stored => return stored.map(|s| s.metadata.unwrap_or_default()),
            }
        }
    }

    // ---- typed -----------------------------------------------------------------------------------

    pub async fn get<S: Spec>(&self, kind: &Kind<S>, id: &str) -> Result<Typed<S>, StateError> {
        Typed::decode(self.get_raw(&ResourceRef::of(kind, id)).await?)
    }

    /// `get` that maps NotFound to `None`.
    pub async fn find<S: Spec>(
        &self,
        kind: &Kind<S>,
        id: &str,
    ) -> Result<Option<Typed<S>>, StateError> {
        match self.get(kind, id).await {
            Err(e) if e.is_not_found() => Ok(None),
            other => other.map(Some),
        }
    }

    pub async fn list<S: Spec>(
        &self,
        kind: &Kind<S>,
        labels: &[(&str, &str)],
    ) -> Result<Vec<Typed<S>>, StateError> {
        let what = ResourceRef::of(kind, "");
        let req = pb::ListRequest {
            namespace: what.namespace.clone(),
            r#type: what.resource_type.clone(),
            options: Some(pb::ListOptions {
                label_query: label_query(labels),
                id_query: None,
            }),
        };
        let mut raw = self.raw.clone();
        let call = Box::pin(raw.list(req));
        // The whole listing, stream included, within the deadline.
        self.bounded(&what, async {
            let mut stream = call
                .await
                .map_err(|s| StateError::from_status(what.clone(), &s))?
                .into_inner();
            let mut out = Vec::new();
            while let Some(msg) = stream
                .message()
                .await
                .map_err(|s| StateError::from_status(what.clone(), &s))?
            {
                out.extend(msg.resource.map(Typed::decode).transpose()?);
            }
            Ok(out)
        })
        .await
    }

    /// Creates `fresh` ([`Typed::fresh`]) with its labels and annotations (version and phase as the
    /// server expects): a resource's first version carries everything a reader of it needs (the
    /// step annotation of the provider state, for one).
    pub async fn create<S: Spec>(
        &self,
        kind: &Kind<S>,
        fresh: &Typed<S>,
        owner: &str,
    ) -> Result<Typed<S>, StateError> {
        let metadata = pb::Metadata {
            version: "undefined".into(),
            owner: owner.to_owned(),
            phase: PHASE_RUNNING.into(),
            ..fresh.metadata.clone()
        };
        let what = ResourceRef::from_metadata(&metadata);
        let req = pb::CreateRequest {
            resource: Some(fresh.encode(kind, metadata)),
            options: Some(pb::CreateOptions {
                owner: owner.to_owned(),
            }),
        };
        let create = |mut raw: RawClient<_>| async move { raw.create(req).await };
        let resp = self.unary(&what, true, create).await?;
        Typed::decode(returned(&what, "Create", resp.resource)?)
    }

    /// Writes a typed resource back (metadata as read, so the version check applies).
    pub async fn update<S: Spec>(
        &self,
        kind: &Kind<S>,
        resource: &Typed<S>,
        owner: &str,
        expected_phase: Option<&str>,
    ) -> Result<Typed<S>, StateError> {
        let raw = resource.encode(kind, resource.metadata.clone());
        Typed::decode(self.update_raw(raw, owner, expected_phase).await?)
    }

    /// Get → mutate → Update (expecting `expected_phase`, any when `None`), retrying version
    /// conflicts; creates (with `owner`) when absent. Skips the write when `mutate` changed
    /// nothing. Returns the stored resource.
    pub async fn modify<S: Spec>(
        &self,
        kind: &Kind<S>,
        id: &str,
        owner: &str,
        expected_phase: Option<&str>,
        mut mutate: impl FnMut(&mut Typed<S>),
    ) -> Result<Typed<S>, StateError> {
        loop {
            match self.find(kind, id).await? {
                None => {
                    let mut fresh = Typed::fresh(kind, id, S::default());
                    mutate(&mut fresh);
                    match self.create(kind, &fresh, owner).await {
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
                    match self.update(kind, &next, owner, expected_phase).await {
                        Err(e) if e.is_conflict() => continue,
                        other => return other,
                    }
                }
            }
        }
    }
}

/// What a call that returns the stored resource returned, or an error saying it returned nothing.
fn returned(
    what: &ResourceRef,
    call: &str,
    resource: Option<pb::Resource>,
) -> Result<pb::Resource, StateError> {
    resource.ok_or_else(|| StateError::Other {
        what: what.clone(),
        message: format!("{call} returned no resource"),
    })
}

// ---- unknown fields ---------------------------------------------------------------------------
// Spec fields our message definitions do not know, kept so that writing a resource back does not
// erase them. prost drops unknown fields when it decodes; a newer Omni or a newer official
// provider may have written fields we lack (the official provider's `start_attempts`, field 14 of
// the provider state, is one), and both read them again after our write.
//
// The fields are kept as their raw bytes and written in front of our encoding. Protobuf readers
// accept fields in any order and the last value of a singular field wins, so a field we learn to
// know later, or one we set ourselves, is never shadowed by a kept copy.

/// The raw bytes of the fields of `raw` that re-encoding `decoded` (decoded from `raw`) leaves out:
/// fields the message does not define (and, harmlessly, explicitly encoded default values).
fn unknown_fields<S: prost::Message>(raw: &[u8], decoded: &S) -> Vec<u8> {
    let known: HashSet<u32> = fields(&decoded.encode_to_vec())
        .map(|(tag, _)| tag)
        .collect();
    fields(raw)
        .filter(|(tag, _)| !known.contains(tag))
        .flat_map(|(_, range)| raw[range].iter().copied())
        .collect()
}

/// Each top-level field of a message: its tag and where its bytes are. Stops at the first malformed
/// field (the message decoded, so there is none).
fn fields(bytes: &[u8]) -> impl Iterator<Item = (u32, Range<usize>)> + '_ {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let start = bytes.len() - rest.len();
        let (tag, wire_type) = decode_key(&mut rest).ok()?;
        skip_field(wire_type, tag, &mut rest, DecodeContext::default()).ok()?;
        Some((tag, start..bytes.len() - rest.len()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::omni::proto::provider::MachineSpec;

    #[test]
    fn status_codes_map_to_typed_errors() {
        let what = ResourceRef::of(&crate::omni::resources::MACHINE_REQUEST, "r1");
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

    /// `spec` as a write sends it ([`Typed::encode`]), after the kept `unknown` fields.
    fn encode_keeping(spec: &MachineSpec, unknown: &[u8]) -> Vec<u8> {
        let kind = crate::omni::resources::provider_machine("proxmox");
        let mut typed = Typed::fresh(&kind, "m1", spec.clone());
        typed.unknown_fields = unknown.to_vec();
        let written = typed.encode(&kind, pb::Metadata::default());
        written.spec.unwrap().proto_spec
    }

    /// The official provider's state with a field we do not define: `start_attempts`, field 14 of
    /// its MachineSpec (siderolabs/omni-infra-provider-proxmox `api/specs/specs.proto`), and a
    /// length-delimited field from a release yet to come.
    fn official_state() -> Vec<u8> {
        let known = MachineSpec {
            uuid: "u-1".into(),
            vmid: 150,
            ..Default::default()
        };
        let mut raw = prost::Message::encode_to_vec(&known);
        raw.extend_from_slice(&[14 << 3, 3]); // start_attempts = 3 (varint)
        raw.extend_from_slice(&[(15 << 3) | 2, 2, b'h', b'i']); // field 15 = "hi"
        raw
    }

    #[test]
    fn unknown_fields_survive_a_rewrite() {
        let raw = official_state();
        let decoded: MachineSpec = prost::Message::decode(raw.as_slice()).unwrap();
        let unknown = unknown_fields(&raw, &decoded);
        assert_eq!(unknown, [14 << 3, 3, (15 << 3) | 2, 2, b'h', b'i']);
        let mut changed = decoded.clone();
        changed.vmid = 151;
        changed.node = "pve2".into();
        let written = encode_keeping(&changed, &unknown);
        let reread: MachineSpec = prost::Message::decode(written.as_slice()).unwrap();
        assert_eq!(reread, changed, "our fields as we set them");
        assert_eq!(
            unknown_fields(&written, &reread),
            unknown,
            "the unknown fields are still there after our write"
        );
    }

    #[test]
    fn a_kept_field_never_shadows_what_we_write() {
        // A known field explicitly encoded with its default value looks unknown; written in front,
        // our later value for it wins.
        let raw = [11 << 3, 0];
        let decoded: MachineSpec = prost::Message::decode(raw.as_slice()).unwrap();
        let unknown = unknown_fields(&raw, &decoded);
        let set = MachineSpec {
            vmid: 104,
            ..Default::default()
        };
        let written = encode_keeping(&set, &unknown);
        let reread: MachineSpec = prost::Message::decode(written.as_slice()).unwrap();
        assert_eq!(reread.vmid, 104);
    }
}

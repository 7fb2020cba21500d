//! The store behind the in-memory Omni: resources keyed by namespace, type and ID, their versions,
//! and the event log that watches resume from (bookmarks) until it is compacted.

use std::collections::{BTreeMap, VecDeque};
use std::sync::MutexGuard;
use std::time::{SystemTime, UNIX_EPOCH};

use super::MemState;
use crate::verify::Verifier;
use omni_infra_provider_proxmox::omni::proto::cosi::resource as pb;

/// Events kept for bookmark resumes. Older history is compacted away, as etcd (Omni's default
/// store) compacts its revisions; resuming from before the compaction gets an ERRORED event.
const EVENT_LOG_CAPACITY: usize = 10_000;

/// What Omni's etcd store reports for a bookmark older than the compacted history (etcd's
/// `ErrCompacted` text, passed through unchanged as the ERRORED event's error).
pub const COMPACTED_ERROR: &str = "etcdserver: mvcc: required revision has been compacted";
/// What it reports for a bookmark ahead of the store (another store, or a restored one).
pub const FUTURE_REVISION_ERROR: &str = "etcdserver: mvcc: required revision is a future revision";

pub(super) type Key = (String, String, String);

#[derive(Clone, Debug)]
pub(super) struct LoggedEvent {
    pub(super) seq: u64,
    pub(super) kind: pb::EventType,
    pub(super) resource: pb::Resource,
    pub(super) old: Option<pb::Resource>,
}

#[derive(Default)]
pub(super) struct Store {
    pub(super) resources: BTreeMap<Key, pb::Resource>,
    pub(super) seq: u64,
    pub(super) log: VecDeque<LoggedEvent>,
    /// Sequence number of the newest event dropped from `log`; bookmarks before it are compacted.
    pub(super) compacted: u64,
    pub(super) verifier: Verifier,
    pub(super) teardown_unimplemented: bool,
    /// Calls still to refuse with UNAVAILABLE (see `MemState::cut_connections`).
    pub(super) failing_calls: u32,
    /// Counts calls per method, for tests ("heartbeats arrive", "no Teardown RPC used").
    pub(super) calls: BTreeMap<String, u64>,
    /// Counts accepted resource calls per (method, resource type), e.g. (`Update`,
    /// `MachineRequestStatuses.omni.sidero.dev`): what a provider costs Omni, by kind.
    pub(super) typed_calls: BTreeMap<(String, String), u64>,
    /// How long Omni's cleanup controller holds a torn-down status (see `controllers`).
    pub(super) drain: std::time::Duration,
    /// Omni's ImageFactoryAuth resources: the username and password of each factory that needs
    /// them, by URL without a trailing `/` (see `MemState::set_image_factory_auth`).
    pub(super) factory_auth: BTreeMap<String, (String, String)>,
}

pub(super) fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

pub(super) fn now_ts() -> prost_types::Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

pub(super) fn md(r: &pb::Resource) -> &pb::Metadata {
    static EMPTY: std::sync::LazyLock<pb::Metadata> = std::sync::LazyLock::new(Default::default);
    r.metadata.as_ref().unwrap_or(&EMPTY)
}

impl MemState {
    pub(super) fn lock(&self) -> MutexGuard<'_, Store> {
        // A panic while holding the lock cannot leave the map half-written (every mutation is a
        // single insert/remove), so a poisoned lock is still usable.
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses this call when a cut is still failing calls (`MemState::cut_connections`).
    pub(super) fn injected_failure(store: &mut Store) -> Result<(), tonic::Status> {
        if store.failing_calls == 0 {
            return Ok(());
        }
        store.failing_calls -= 1;
        Err(tonic::Status::unavailable(
            "connection to Omni cut (memstate fault injection)",
        ))
    }

    /// A receiver that sees the next [`MemState::cut_connections`].
    pub(super) fn cut_signal(&self) -> tokio::sync::watch::Receiver<u64> {
        self.cuts.subscribe()
    }

    pub(super) fn emit(
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
}

pub(super) fn key_of(m: &pb::Metadata) -> Key {
    (m.namespace.clone(), m.r#type.clone(), m.id.clone())
}

pub(super) fn next_version(v: &str) -> String {
    (v.parse::<u64>().unwrap_or(0) + 1).to_string()
}

pub(super) fn bookmark(seq: u64) -> Vec<u8> {
    seq.to_be_bytes().to_vec()
}

pub(super) fn parse_bookmark(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

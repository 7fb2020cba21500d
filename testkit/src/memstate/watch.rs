//! Watches as Omni's COSI server runs them (§1.5): an empty "established" message, then what the
//! request asked to see first (a bookmark's backlog, one resource, the bootstrap contents), then the
//! live feed. A compacted or future bookmark gets the ERRORED event Omni's etcd store produces, so
//! the client's resume logic is exercised against the real failure, not a silently short backlog.

use tokio::sync::{broadcast, mpsc, watch};
use tonic::Status;

use super::access::{Access, Caller, Scope};
use super::query::matches_queries;
use super::service::{BoxStream, StateService};
use super::store::{
    COMPACTED_ERROR, FUTURE_REVISION_ERROR, LoggedEvent, Store, bookmark, md, parse_bookmark,
};
use omni_infra_provider_proxmox::omni::proto::cosi::resource as pb;
use omni_infra_provider_proxmox::omni::resources::PHASE_RUNNING;

/// What a watch sends between "established" and the live feed. Decided under the store lock,
/// together with the live subscription, so nothing falls between the two.
enum Opening {
    /// The stream's only item is this error (a bookmark that does not decode).
    Fails(Status),
    /// The backend's watch is over before it began (a compacted or future bookmark).
    Errored(&'static str),
    /// These events, then the live feed.
    Replay(Vec<pb::Event>),
}

impl StateService {
    /// Checks the request, takes the snapshot and the live subscription, and hands the stream to
    /// its own task. Errors here fail the call itself; later ones arrive on the stream.
    pub(super) fn open_watch(
        &self,
        caller: Caller,
        r: pb::WatchRequest,
    ) -> Result<BoxStream<pb::WatchResponse>, Status> {
        let opts = r.options.clone().unwrap_or_default();
        let (tx, rx) = mpsc::channel::<Result<pb::WatchResponse, Status>>(1024);
        let api_v1 = r.api_version >= 1;
        let (filter, opening, live) = {
            let store = self.state.lock();
            let scope = caller.scope(&store, &r.namespace, &r.r#type, Access::Read)?;
            check_options(&r, &opts)?;
            // Subscribe under the lock so no event falls between the snapshot and the live feed.
            let live = self.state.events.subscribe();
            let filter = WatchFilter {
                caller,
                scope,
                namespace: r.namespace,
                resource_type: r.r#type,
                id: r.id,
                queries: opts.label_query.clone(),
            };
            let opening = opening(&store, &filter, &opts, api_v1)?;
            (filter, opening, live)
        };
        let stream = WatchStream {
            tx,
            filter,
            live,
            stop: self.stop.clone(),
            cut: self.state.cut_signal(),
            api_v1,
        };
        tokio::spawn(stream.run(opening));
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// Option combinations the COSI server refuses before any watch starts.
fn check_options(r: &pb::WatchRequest, opts: &pb::WatchOptions) -> Result<(), Status> {
    if r.id.is_some() && (opts.bootstrap_contents || !opts.label_query.is_empty()) {
        return Err(Status::unimplemented(
            "bootstrap_contents and label_query are not supported on single-resource watches",
        ));
    }
    if opts.bootstrap_contents && (opts.tail_events > 0 || opts.start_from_bookmark.is_some()) {
        return Err(Status::unknown(
            "bootstrap_contents is incompatible with tail_events and start_from_bookmark",
        ));
    }
    Ok(())
}

fn opening(
    store: &Store,
    filter: &WatchFilter,
    opts: &pb::WatchOptions,
    api_v1: bool,
) -> Result<Opening, Status> {
    let events = if let Some(from) = &opts.start_from_bookmark {
        return resume(store, filter, from);
    } else if let Some(id) = &filter.id {
        single_resource(store, filter, id)
    } else if opts.bootstrap_contents {
        bootstrap_contents(store, filter, api_v1)?
    } else if opts.bootstrap_bookmark {
        vec![event(
            pb::EventType::Noop,
            tombstone(&filter.namespace, &filter.resource_type, ""),
            None,
            store.seq,
        )]
    } else {
        Vec::new()
    };
    Ok(Opening::Replay(events))
}

/// state-etcd pkg/state/impl/etcd/etcd.go (watchKind): a bookmark that does not decode fails the
/// call (FailedPrecondition); a compacted or future revision is only found by etcd's watch, and
/// arrives as an ERRORED event on the established stream.
fn resume(store: &Store, filter: &WatchFilter, from: &[u8]) -> Result<Opening, Status> {
    Ok(match parse_bookmark(from) {
        None => Opening::Fails(Status::failed_precondition("invalid watch bookmark")),
        Some(seq) if seq > store.seq => Opening::Errored(FUTURE_REVISION_ERROR),
        Some(seq) if seq < store.compacted => Opening::Errored(COMPACTED_ERROR),
        Some(seq) => {
            let mut events = Vec::new();
            for ev in store.log.iter().filter(|e| e.seq > seq) {
                if let Some(e) = filter.map(ev)? {
                    events.push(e);
                }
            }
            Opening::Replay(events)
        }
    })
}

fn single_resource(store: &Store, filter: &WatchFilter, id: &str) -> Vec<pb::Event> {
    let k = (
        filter.namespace.clone(),
        filter.resource_type.clone(),
        id.to_owned(),
    );
    match store
        .resources
        .get(&k)
        .filter(|x| filter.caller.visible(filter.scope, x))
    {
        Some(res) => vec![event(pb::EventType::Created, res.clone(), None, store.seq)],
        // Omni's provider filter drops the tombstone in shared namespaces (§1.5).
        None if filter.scope != Scope::Shared => {
            let tomb = tombstone(&filter.namespace, &filter.resource_type, id);
            vec![event(pb::EventType::Destroyed, tomb, None, store.seq)]
        }
        None => Vec::new(),
    }
}

fn bootstrap_contents(
    store: &Store,
    filter: &WatchFilter,
    api_v1: bool,
) -> Result<Vec<pb::Event>, Status> {
    let mut events = Vec::new();
    for ((ns, ty, _), res) in &store.resources {
        if *ns == filter.namespace
            && *ty == filter.resource_type
            && filter.caller.visible(filter.scope, res)
            && matches_queries(&md(res).labels, &filter.queries)?
        {
            events.push(event(pb::EventType::Created, res.clone(), None, store.seq));
        }
    }
    if api_v1 {
        events.push(event(
            pb::EventType::Bootstrapped,
            tombstone(&filter.namespace, &filter.resource_type, ""),
            None,
            store.seq,
        ));
    }
    Ok(events)
}

/// One watch's stream, fed by its own task until the client goes away or the server stops.
struct WatchStream {
    tx: mpsc::Sender<Result<pb::WatchResponse, Status>>,
    filter: WatchFilter,
    live: broadcast::Receiver<LoggedEvent>,
    stop: watch::Receiver<bool>,
    /// Changes when the connection is cut (`MemState::cut_connections`).
    cut: watch::Receiver<u64>,
    api_v1: bool,
}

impl WatchStream {
    async fn run(self, opening: Opening) {
        let replay = match opening {
            Opening::Fails(e) => {
                let _ = self.tx.send(Err(e)).await;
                return;
            }
            Opening::Errored(message) => Err(message),
            Opening::Replay(events) => Ok(events),
        };
        // "Watch established": an empty first message.
        if !self.send(vec![]).await {
            return;
        }
        match replay {
            Err(message) => self.end_errored(message).await,
            Ok(events) => {
                for e in events {
                    if !self.send(vec![e]).await {
                        return;
                    }
                }
                self.follow_live().await;
            }
        }
    }

    /// Whether the client still listens.
    async fn send(&self, events: Vec<pb::Event>) -> bool {
        self.tx
            .send(Ok(pb::WatchResponse { event: events }))
            .await
            .is_ok()
    }

    async fn end_errored(mut self, message: &str) {
        let mut e = event(
            pb::EventType::Errored,
            tombstone(&self.filter.namespace, &self.filter.resource_type, ""),
            None,
            0,
        );
        e.resource = None;
        e.bookmark = None;
        e.error = Some(message.into());
        if self.api_v1 && !self.send(vec![e]).await {
            return;
        }
        // The backend's watch is over but cosi's server keeps the stream open, silent,
        // until the client goes away.
        let cut = tokio::select! {
            _ = self.tx.closed() => false,
            _ = async { self.stop.wait_for(|s| *s).await.is_ok() } => false,
            _ = self.cut.changed() => true,
        };
        if cut {
            let _ = self.tx.send(Err(cut_status())).await;
        }
    }

    async fn follow_live(mut self) {
        loop {
            let stop = &mut self.stop;
            let received = tokio::select! {
                _ = async { stop.wait_for(|s| *s).await.is_ok() } => {
                    let _ = self.tx.send(Err(Status::unavailable("server shutting down"))).await;
                    return;
                }
                _ = self.cut.changed() => {
                    let _ = self.tx.send(Err(cut_status())).await;
                    return;
                }
                _ = self.tx.closed() => return,
                ev = self.live.recv() => ev,
            };
            if !self.forward(received).await {
                return;
            }
        }
    }

    /// Passes one live event on if this watch should see it; false once the stream is over.
    async fn forward(&self, received: Result<LoggedEvent, broadcast::error::RecvError>) -> bool {
        match received {
            Ok(ev) => match self.filter.map(&ev) {
                Ok(Some(e)) => self.send(vec![e]).await,
                Ok(None) => true,
                Err(s) => {
                    let _ = self.tx.send(Err(s)).await;
                    false
                }
            },
            Err(broadcast::error::RecvError::Lagged(_)) => {
                if self.api_v1 {
                    let mut e = event(
                        pb::EventType::Errored,
                        tombstone(&self.filter.namespace, &self.filter.resource_type, ""),
                        None,
                        0,
                    );
                    e.bookmark = None;
                    e.error = Some("buffer overrun".into());
                    let _ = self.send(vec![e]).await;
                }
                false
            }
            Err(broadcast::error::RecvError::Closed) => false,
        }
    }
}

fn cut_status() -> Status {
    Status::unavailable("connection to Omni cut (memstate fault injection)")
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

pub(super) fn tombstone(ns: &str, ty: &str, id: &str) -> pb::Resource {
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

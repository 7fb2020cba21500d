//! The State watch that survives reconnects: resumes from the last bookmark, and re-bootstraps
//! (announcing a [`WatchEvent::Resync`]) when there is none or Omni will not honour it.

use std::time::Duration;

use tokio::sync::mpsc;
use tonic::Code;

use super::{ResourceRef, StateClient, StateError, label_query};
use crate::omni::proto::cosi::resource as pb;
use crate::omni::resources::Kind;

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

impl StateClient {
    /// Watches all resources of a kind carrying `labels` (bootstrap first). Events arrive on the
    /// returned receiver; dropping it stops the watch. Broken streams are re-established with
    /// backoff, resuming from the last bookmark, or re-bootstrapping (after a
    /// [`WatchEvent::Resync`]) when there is none, Omni refuses it, or the stream ended with an
    /// ERRORED event (how Omni's etcd store reports a bookmark older than its compacted history).
    pub fn watch_kind<S>(
        &self,
        kind: &Kind<S>,
        labels: &[(&str, &str)],
    ) -> mpsc::Receiver<Result<WatchEvent, StateError>> {
        let (tx, rx) = mpsc::channel(256);
        let client = self.clone();
        let what = ResourceRef::of(kind, "");
        let queries = label_query(labels);
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
        let mut backoff = self.reconnect.0;
        loop {
            match self
                .stream_events(&what, &queries, &mut bookmark, tx, &mut backoff)
                .await
            {
                StreamEnd::ReceiverGone => return,
                StreamEnd::Rebootstrap => bookmark = None,
                StreamEnd::Broken(e) => {
                    tracing::warn!(watch = %what, error = %e, retry_in = ?backoff, "watch broken; reconnecting");
                    // Errors a reconnect will not fix go to the watcher (the watch still retries,
                    // since e.g. a key registration may be fixed while we run).
                    let permanent = matches!(
                        e,
                        StateError::PermissionDenied { .. }
                            | StateError::Unauthenticated { .. }
                            | StateError::InvalidArgument { .. }
                    );
                    if permanent && tx.send(Err(e)).await.is_err() {
                        return;
                    }
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.reconnect.1);
            if bookmark.is_none() && tx.send(Ok(WatchEvent::Resync)).await.is_err() {
                return;
            }
        }
    }

    async fn stream_events(
        &self,
        what: &ResourceRef,
        queries: &[pb::LabelQuery],
        bookmark: &mut Option<Vec<u8>>,
        tx: &mpsc::Sender<Result<WatchEvent, StateError>>,
        backoff: &mut Duration,
    ) -> StreamEnd {
        let resuming = bookmark.is_some();
        let req = watch_request(what, queries, bookmark.clone());
        let end = |s: tonic::Status| match s.code() {
            Code::FailedPrecondition if resuming => {
                tracing::info!(watch = %what, "Omni refused the watch bookmark; re-bootstrapping");
                StreamEnd::Rebootstrap
            }
            _ => StreamEnd::Broken(StateError::from_status(what.clone(), &s)),
        };
        let mut stream = match self.raw.clone().watch(req).await {
            Ok(s) => s.into_inner(),
            Err(s) => return end(s),
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
                Err(s) => return end(s),
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
                        // go with the stream: resuming would only replay the same error (a
                        // compacted revision stays compacted), so a full listing starts over.
                        let error = event.error.unwrap_or_default();
                        tracing::warn!(watch = %what, %error, "Omni ended the watch with an error; re-bootstrapping");
                        return StreamEnd::Rebootstrap;
                    }
                };
                // A working stream: the next break starts its backoff afresh.
                *backoff = self.reconnect.0;
                *bookmark = event.bookmark.or_else(|| bookmark.take());
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
    /// The bookmark is not to be trusted: Omni refused it (FailedPrecondition), or the stream
    /// ended with an ERRORED event. A full listing starts over.
    Rebootstrap,
    Broken(StateError),
}

fn watch_request(
    what: &ResourceRef,
    queries: &[pb::LabelQuery],
    resume: Option<Vec<u8>>,
) -> pb::WatchRequest {
    pb::WatchRequest {
        namespace: what.namespace.clone(),
        r#type: what.resource_type.clone(),
        id: None,
        options: Some(pb::WatchOptions {
            bootstrap_contents: resume.is_none(),
            label_query: queries.to_vec(),
            start_from_bookmark: resume,
            ..Default::default()
        }),
        // 0 would make the server drop BOOTSTRAPPED and ERRORED events.
        api_version: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_or_resume() {
        let what = ResourceRef::default();
        let r = watch_request(&what, &[], None);
        let o = r.options.unwrap();
        assert!(o.bootstrap_contents && o.start_from_bookmark.is_none());
        assert_eq!(r.api_version, 1);
        let r = watch_request(&what, &[], Some(vec![1]));
        let o = r.options.unwrap();
        assert!(!o.bootstrap_contents && o.start_from_bookmark == Some(vec![1]));
    }
}

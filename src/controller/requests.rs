//! Turns the MachineRequest watch into reconcile work items.
//!
//! A reconcile loop wants keys, not events: "look at request X again". Events for the same request
//! collapse into one key, and a re-bootstrap after a lost watch says "everything may have changed".
//! That is what [`RequestQueueEvent`] carries; the provisioning controller consumes it.

use tokio::sync::mpsc;

use crate::pipeline::step::RequestInfo;
use crate::rules::schematic::{Overlay, SchematicRequest};

use crate::omni::proto::specs::MachineRequestSpec;
use std::sync::Arc;

use super::outputs::{OutputOf, Outputs};
use crate::omni::resources::{
    ConfigPatchRequest, Kind, MachineRequest, MachineRequestStatus, label,
};
use crate::omni::state::{LabelSelector, StateClient, StateError, Typed, WatchEvent};

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

/// Something the reconcile loop must look at.
#[derive(Debug, Clone)]
pub enum RequestQueueEvent {
    /// Request created or changed (including entering `tearingDown`).
    Changed(Box<Request>),
    /// Request gone from Omni.
    Destroyed { id: String },
    /// The initial listing is complete: requests not announced since the last `Resync` no longer
    /// exist.
    Synced,
    /// The watch lost its place; a fresh listing follows.
    Resync,
    /// The watch reported an error that needs a human (permission, signature).
    Error(StateError),
    /// Not from the watch: something this process did may let the request go on (an address of
    /// the IP pool it waits on was freed). Look again now, with a fresh backoff.
    Retry { id: String },
}

/// Watches the MachineRequests labelled with our provider ID. Dropping the receiver stops it.
pub fn watch(state: &StateClient, provider_id: &str) -> mpsc::Receiver<RequestQueueEvent> {
    let mut events = state.watch_kind(
        &MachineRequest.namespace(),
        &MachineRequest.resource_type(),
        vec![LabelSelector::new().equal(label::INFRA_PROVIDER_ID, provider_id)],
    );
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            let item = match ev {
                Ok(WatchEvent::Created(r)) | Ok(WatchEvent::Updated(r)) => match Typed::decode(r) {
                    Ok(t) => RequestQueueEvent::Changed(Box::new(t)),
                    Err(e) => RequestQueueEvent::Error(e),
                },
                Ok(WatchEvent::Destroyed(r)) => RequestQueueEvent::Destroyed {
                    id: r.metadata.map(|m| m.id).unwrap_or_default(),
                },
                Ok(WatchEvent::Bootstrapped) => RequestQueueEvent::Synced,
                Ok(WatchEvent::Resync) => RequestQueueEvent::Resync,
                Err(e) => RequestQueueEvent::Error(e),
            };
            if tx.send(item).await.is_err() {
                return;
            }
        }
    });
    rx
}

/// Watches what we tear down and Omni holds with its finalizers: our MachineRequestStatuses (its
/// cleanup controller) and ConfigPatchRequests (its config-patch controller), keeping `outputs` up
/// to date. Sends the ID of the machine request whose teardown may go on, each time one of them is
/// left tearing down with no finalizer (docs/omni-protocol.md §3.6), and every updated status. A
/// teardown waits for this instead of asking Omni again and again; it only looks again on its own
/// after [`super::outputs::WAIT_FOR_OMNI`], in case an event was lost. Dropping the receiver stops
/// both watches.
pub fn watch_released_outputs(
    state: &StateClient,
    provider_id: &str,
    outputs: Arc<Outputs>,
) -> mpsc::Receiver<OutputEvent> {
    let selector = || vec![LabelSelector::new().equal(label::INFRA_PROVIDER_ID, provider_id)];
    let mut statuses = state.watch_kind(
        &MachineRequestStatus.namespace(),
        &MachineRequestStatus.resource_type(),
        selector(),
    );
    let mut patches = state.watch_kind(
        &ConfigPatchRequest.namespace(),
        &ConfigPatchRequest.resource_type(),
        selector(),
    );
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        loop {
            let (event, of) = tokio::select! {
                Some(event) = statuses.recv() => (event, OutputOf::Status),
                Some(event) = patches.recv() => (event, OutputOf::PatchRequest),
                () = tx.closed() => return,
                else => return,
            };
            let Ok(event) = event else {
                continue;
            };
            let mut out = Vec::with_capacity(2);
            if let Some(id) = outputs.observe(of, &event) {
                out.push(OutputEvent::Released(id));
            }
            if let (OutputOf::Status, WatchEvent::Updated(r)) = (of, event) {
                out.push(OutputEvent::StatusSeen(Box::new(r)));
            }
            for item in out {
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// What the watch of our outputs reports.
#[derive(Debug, Clone)]
pub enum OutputEvent {
    /// The teardown of this machine request may go on.
    Released(String),
    /// A status of ours changed (by us, or by Omni adding or removing its finalizer).
    StatusSeen(Box<crate::omni::proto::cosi::resource::Resource>),
}

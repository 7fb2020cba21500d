//! Turns the MachineRequest watch into reconcile work items.
//!
//! A reconcile loop wants keys, not events: "look at request X again". Events for the same request
//! collapse into one key, and a re-bootstrap after a lost watch says "everything may have changed".
//! That is what [`RequestQueueEvent`] carries; the provisioning controller consumes it.

use crate::omni::proto::specs::MachineRequestSpec;
use crate::omni::resources::label;
use crate::omni::state::{StateError, Typed, WatchEvent};
use crate::pipeline::step::RequestInfo;
use crate::rules::schematic::{Overlay, SchematicRequest};

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
    /// the IP pool it waits on was freed, or Omni let go of what its teardown tore down). Look
    /// again now, with a fresh backoff.
    Retry { id: String },
}

impl From<Result<WatchEvent, StateError>> for RequestQueueEvent {
    /// One event of the MachineRequest watch.
    fn from(event: Result<WatchEvent, StateError>) -> Self {
        match event {
            Ok(WatchEvent::Created(r) | WatchEvent::Updated(r)) => match Typed::decode(r) {
                Ok(t) => RequestQueueEvent::Changed(Box::new(t)),
                Err(e) => RequestQueueEvent::Error(e),
            },
            Ok(WatchEvent::Destroyed(r)) => RequestQueueEvent::Destroyed {
                id: r.metadata.map(|m| m.id).unwrap_or_default(),
            },
            Ok(WatchEvent::Bootstrapped) => RequestQueueEvent::Synced,
            Ok(WatchEvent::Resync) => RequestQueueEvent::Resync,
            Err(e) => RequestQueueEvent::Error(e),
        }
    }
}

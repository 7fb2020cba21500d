//! A MachineRequest as the watch delivers it, and what the steps need of it.

use crate::omni::proto::specs::MachineRequestSpec;
use crate::omni::resources::label;
use crate::omni::state::Typed;
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

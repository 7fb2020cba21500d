//! Omni's management API, as far as a provider uses it: creating image-factory schematics.
//!
//! Omni (not the provider) creates the schematic, on the image factory Omni is configured with, using
//! Omni's credentials for it. That covers the schematic only: the boot ISO is then downloaded by the
//! Proxmox node from a URL, so it must name the same factory (see [`crate::pipeline::image_factory`]
//! for how that factory is found), and a factory that wants credentials for downloads cannot be used
//! for boot ISOs. The call is signed like every other but carries no `providerid` header.

use super::proto::management as pb;
use super::proto::management::management_service_client::ManagementServiceClient;
use super::transport::{MAX_MESSAGE_BYTES, SignedChannel};

#[derive(Debug, Clone, thiserror::Error)]
pub enum ManagementError {
    #[error(
        "creating schematics through Omni needs Omni 1.8 or newer (CreateSchematicFromRaw is not implemented by this Omni)"
    )]
    OmniTooOld,
    #[error("Omni refused to create the schematic: {code:?}: {message}")]
    Refused { code: tonic::Code, message: String },
}

#[derive(Clone)]
pub struct ManagementClient {
    raw: ManagementServiceClient<SignedChannel>,
}

impl ManagementClient {
    /// `channel` must be signed without the provider-ID header.
    pub fn new(channel: SignedChannel) -> Self {
        Self {
            raw: ManagementServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        }
    }

    /// Registers a schematic (image-factory YAML) and returns its ID.
    pub async fn create_schematic_from_raw(
        &self,
        raw_schematic: &str,
        talos_version: &str,
    ) -> Result<String, ManagementError> {
        let req = pb::CreateSchematicFromRawRequest {
            raw_schematic: raw_schematic.as_bytes().to_vec(),
            talos_version: talos_version.to_owned(),
        };
        let mut raw = self.raw.clone();
        let call = raw.create_schematic_from_raw(req);
        let Ok(answer) = tokio::time::timeout(super::state::CALL_DEADLINE, call).await else {
            return Err(ManagementError::Refused {
                code: tonic::Code::DeadlineExceeded,
                message: format!("no answer within {:?}", super::state::CALL_DEADLINE),
            });
        };
        match answer {
            Ok(resp) => Ok(resp.into_inner().schematic_id),
            Err(s) if s.code() == tonic::Code::Unimplemented => Err(ManagementError::OmniTooOld),
            Err(s) => Err(ManagementError::Refused {
                code: s.code(),
                message: s.message().to_owned(),
            }),
        }
    }
}

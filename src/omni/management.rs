//! Omni's management API, as far as a provider uses it: creating image-factory schematics, and
//! asking where a boot asset is and with which headers to fetch it.
//!
//! Omni (not the provider) creates the schematic, on the image factory Omni is configured with, using
//! Omni's credentials for it. The boot image is then fetched from that same factory (see
//! [`crate::pipeline::image_factory`] for how it is found); when the factory asks for credentials,
//! Omni from August 2026 hands them out as headers for one asset (`GetBootAssetURL`, which the
//! InfraProvider role may call: siderolabs/omni `internal/backend/grpc/schematics.go`). The calls
//! are signed like every other but carry no `providerid` header.

use super::proto::management as pb;
use super::proto::management::management_service_client::ManagementServiceClient;
use super::transport::{MAX_MESSAGE_BYTES, SignedChannel};
/// Which boot asset of a schematic: `Iso` (`nocloud-amd64.iso`) or `Disk` (`nocloud-amd64.qcow2`).
pub use pb::boot_asset_url_request::BootAssetKind;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ManagementError {
    #[error(
        "creating schematics through Omni needs Omni 1.8 or newer (CreateSchematicFromRaw is not implemented by this Omni)"
    )]
    OmniTooOld,
    #[error("Omni refused: {code:?}: {message}")]
    Refused { code: tonic::Code, message: String },
}

/// Where Omni says a boot asset is, and the headers to send with the download (the factory's
/// credentials, so their values are secrets).
pub struct BootAsset {
    pub url: String,
    pub headers: Vec<(String, crate::secret::Secret)>,
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

    /// Where the nocloud amd64 `kind` asset of `schematic` for `talos_version` is, and with which
    /// headers to fetch it; `None` from an Omni that does not answer this (older than August 2026).
    pub async fn boot_asset(
        &self,
        talos_version: &str,
        schematic: &str,
        kind: BootAssetKind,
    ) -> Result<Option<BootAsset>, ManagementError> {
        let req = pb::BootAssetUrlRequest {
            talos_version: talos_version.to_owned(),
            schematic_id: schematic.to_owned(),
            boot_asset_kind: kind as i32,
            platform: "nocloud".into(),
            architecture: "amd64".into(),
            format: if kind == BootAssetKind::Disk {
                "qcow2"
            } else {
                ""
            }
            .into(),
            ..Default::default()
        };
        match bounded(self.raw.clone().get_boot_asset_url(req)).await {
            Err(ManagementError::OmniTooOld) => Ok(None),
            answer => answer.map(|resp| {
                Some(BootAsset {
                    url: resp.url,
                    headers: (resp.headers.into_iter())
                        .map(|(k, v)| (k, crate::secret::Secret::new(v)))
                        .collect(),
                })
            }),
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
        bounded(self.raw.clone().create_schematic_from_raw(req))
            .await
            .map(|resp| resp.schematic_id)
    }
}

/// One call within the State calls' deadline: `Unimplemented` is [`ManagementError::OmniTooOld`]
/// (what that means depends on the call), any other refusal and a missing answer are `Refused`.
async fn bounded<T>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, ManagementError> {
    let deadline = super::state::CALL_DEADLINE;
    match tokio::time::timeout(deadline, call).await {
        Ok(Ok(resp)) => Ok(resp.into_inner()),
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Err(ManagementError::OmniTooOld),
        Ok(Err(s)) => Err(ManagementError::Refused {
            code: s.code(),
            message: s.message().to_owned(),
        }),
        Err(_) => Err(ManagementError::Refused {
            code: tonic::Code::DeadlineExceeded,
            message: format!("no answer within {deadline:?}"),
        }),
    }
}

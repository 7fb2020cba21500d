//! One connection to Omni: the signed State client (with the `providerid` header) and the
//! management client (without it), sharing one HTTP/2 channel.

use std::sync::Arc;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::auth::ProviderKey;
use super::management::ManagementClient;
use super::state::StateClient;
use super::transport::{self, ConnectError, OmniEndpoint, Signer};

#[derive(Clone)]
pub struct OmniClient {
    pub state: StateClient,
    pub management: ManagementClient,
}

impl OmniClient {
    /// Builds the clients; the connection is made on first use and re-made after failures.
    pub fn connect(
        endpoint: &OmniEndpoint,
        key: Arc<ProviderKey>,
        provider_id: &str,
    ) -> Result<Self, ConnectError> {
        let signer = Signer {
            key,
            provider_id: Some(provider_id.to_owned()),
            clock_offset_secs: 0,
        };
        Ok(Self::over(transport::channel(endpoint)?, signer))
    }

    /// Over `channel`, signed by `signer` (tests skew its clock); the management calls without
    /// the provider ID.
    pub fn over(channel: Channel, signer: Signer) -> Self {
        let management = Signer {
            provider_id: None,
            ..signer.clone()
        };
        Self {
            state: StateClient::new(InterceptedService::new(channel.clone(), signer)),
            management: ManagementClient::new(InterceptedService::new(channel, management)),
        }
    }
}

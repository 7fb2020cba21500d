//! One connection to Omni: the signed State client (with the `providerid` header) and the
//! management client (without it), sharing one HTTP/2 channel.

use std::sync::Arc;

use tonic::service::interceptor::InterceptedService;

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
        let channel = transport::channel(endpoint)?;
        let signer = Signer {
            key,
            provider_id: Some(provider_id.to_owned()),
        };
        // The management calls carry no provider ID.
        let management = Signer {
            provider_id: None,
            ..signer.clone()
        };
        Ok(Self {
            state: StateClient::new(InterceptedService::new(channel.clone(), signer)),
            management: ManagementClient::new(InterceptedService::new(channel, management)),
        })
    }
}

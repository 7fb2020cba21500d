//! One connection to Omni: the signed State client (with the `providerid` header) and the
//! management client (without it), sharing one HTTP/2 channel.

use std::sync::Arc;

use super::auth::ProviderKey;
use super::management::ManagementClient;
use super::state::StateClient;
use super::transport::{self, ConnectError, OmniEndpoint, SignedChannel};

#[derive(Clone)]
pub struct OmniClient {
    pub state: StateClient,
    pub management: ManagementClient,
    pub provider_id: String,
}

impl OmniClient {
    /// Builds the clients; the connection is made on first use and re-made after failures.
    pub fn connect(
        endpoint: &OmniEndpoint,
        key: Arc<ProviderKey>,
        provider_id: &str,
    ) -> Result<Self, ConnectError> {
        let channel = transport::channel(endpoint)?;
        Ok(Self::from_channels(
            SignedChannel::new(channel.clone(), key.clone(), Some(provider_id.to_owned())),
            SignedChannel::new(channel, key, None),
            provider_id,
        ))
    }

    /// From already signed channels (tests use this to skew the clock).
    pub fn from_channels(
        state: SignedChannel,
        management: SignedChannel,
        provider_id: &str,
    ) -> Self {
        Self {
            state: StateClient::new(state),
            management: ManagementClient::new(management),
            provider_id: provider_id.to_owned(),
        }
    }
}

//! Shared set-up for tests against the in-memory Omni.

use std::sync::Arc;
use std::time::Duration;

use crate::memstate::{ControllersTask, MemServer, MemState, OmniControllers};
use omni_infra_provider_proxmox::omni::auth::ProviderKey;
use omni_infra_provider_proxmox::omni::client::OmniClient;
use omni_infra_provider_proxmox::omni::transport::{self, OmniEndpoint, OmniTls};

pub const WAIT: Duration = Duration::from_secs(10);

/// How long Omni's cleanup controller holds a torn-down status in the end-to-end tests: long enough
/// that a teardown really waits on Omni, short enough to keep the suite fast.
pub const DRAIN: Duration = Duration::from_millis(300);

pub struct Omni {
    pub state: MemState,
    pub server: Option<MemServer>,
    pub addr: std::net::SocketAddr,
    pub key: Arc<ProviderKey>,
    /// The service-account key as `omnictl infraprovider create` prints it, for the real binary.
    pub encoded_key: String,
    /// Omni's own controllers, when started with them ([`Omni::start_with_controllers`]).
    pub controllers: Option<ControllersTask>,
}

impl Omni {
    pub async fn start(provider_id: &str) -> Self {
        transport::install_crypto_provider();
        let state = MemState::new();
        let encoded = state.register_provider(provider_id).unwrap();
        let key = Arc::new(ProviderKey::parse(&encoded).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = state.serve(listener, None).unwrap();
        Self {
            state,
            server: Some(server),
            addr,
            key,
            encoded_key: encoded.expose().to_owned(),
            controllers: None,
        }
    }

    /// [`Omni::start`] with Omni's controllers running: its finalizers on statuses and patch
    /// requests, held for `drain` once a status with a machine is torn down.
    pub async fn start_with_controllers(provider_id: &str, drain: Duration) -> Self {
        let mut omni = Self::start(provider_id).await;
        omni.controllers = Some(omni.state.run_omni_controllers(OmniControllers { drain }));
        omni
    }

    /// The provider binary with what reaches this Omni in its environment: the endpoint, plaintext
    /// allowed (the in-memory Omni serves no TLS) and the registered key, under the variable names
    /// of the official provider; its other key variable cleared, so the caller's cannot leak in.
    pub fn provider_command(&self) -> std::process::Command {
        let mut command = std::process::Command::new(crate::process::provider_binary_for_test());
        command
            .env("OMNI_ENDPOINT", self.url())
            .env("OMNI_INSECURE_HTTP", "true")
            .env("OMNI_SERVICE_ACCOUNT_KEY", &self.encoded_key)
            .env_remove("SIDERO_SERVICE_ACCOUNT_KEY");
        command
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn client(&self, provider_id: &str) -> OmniClient {
        let endpoint = OmniEndpoint {
            url: self.url(),
            tls: OmniTls::SystemAndPublicRoots,
        };
        OmniClient::connect(&endpoint, self.key.clone(), provider_id).unwrap()
    }

    pub async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop().await;
        }
    }

    /// Serves the same state again on the same port.
    pub async fn restart(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr).await.unwrap();
        self.server = Some(self.state.serve(listener, None).unwrap());
    }
}

//! `dev-omni` as a user runs it: it prints where it listens and the key, and a provider holding that
//! key can read its own join config there over signed gRPC.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use omni_infra_provider_proxmox::omni::auth::ProviderKey;
use omni_infra_provider_proxmox::omni::client::OmniClient;
use omni_infra_provider_proxmox::omni::resources::PROVIDER_JOIN_CONFIG;
use omni_infra_provider_proxmox::omni::transport::{self, OmniEndpoint, OmniTls};
use omni_infra_provider_proxmox::secret::Secret;

/// The child, killed when the test ends however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn dev_omni_serves_the_provider_it_registered() {
    transport::install_crypto_provider();
    let mut child = Killed(
        Command::new(env!("CARGO_BIN_EXE_dev-omni"))
            .args(["--listen", "127.0.0.1:0", "--provider-id", "dev"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut printed = std::collections::BTreeMap::new();
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.starts_with("provider id:") {
            assert_eq!(line, "provider id: dev");
            break;
        }
        let (name, value) = line.split_once('=').unwrap();
        printed.insert(name.to_owned(), value.to_owned());
    }
    assert_eq!(printed["OMNI_INSECURE_HTTP"], "true");
    let key = Arc::new(
        ProviderKey::parse(&Secret::new(printed["OMNI_SERVICE_ACCOUNT_KEY"].clone())).unwrap(),
    );
    assert_eq!(key.provider_id(), Some("dev"));
    let endpoint = OmniEndpoint {
        url: printed["OMNI_ENDPOINT"].clone(),
        tls: OmniTls::SystemAndPublicRoots,
    };
    let client = OmniClient::connect(&endpoint, key, "dev").unwrap();
    let join = client
        .state
        .get(&PROVIDER_JOIN_CONFIG, "dev")
        .await
        .unwrap();
    assert_eq!(join.spec.join_token, "dev-join-token");
}

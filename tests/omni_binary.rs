//! The real binary against the in-memory Omni: connect (plaintext and TLS with a private CA),
//! register, beat, and exit 0 on SIGTERM.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use omni_infra_provider_proxmox::omni::memstate::{MemServer, MemState};
use omni_infra_provider_proxmox::omni::proto::specs::FeaturesConfigSpec;
use omni_infra_provider_proxmox::omni::resources::{
    FEATURES_CONFIG_ID, FeaturesConfig, InfraProviderHealthStatus, InfraProviderStatus,
};
use omni_infra_provider_proxmox::omni::transport;

const WAIT: Duration = Duration::from_secs(20);

struct Killer(Option<Child>);

impl Drop for Killer {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn write_config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("config.yaml");
    std::fs::write(
        &path,
        "proxmox:\n  url: https://127.0.0.1:1/api2/json\n  tokenID: omni@pve!provider\n  tokenSecret: not-used\n",
    )
    .unwrap();
    path
}

async fn run_provider(
    state: &MemState,
    endpoint: &str,
    key: &str,
    extra: &[&str],
    dir: &std::path::Path,
) -> String {
    let config = write_config(dir);
    let child = Command::new(env!("CARGO_BIN_EXE_omni-infra-provider-proxmox"))
        .arg("--config-file")
        .arg(&config)
        .args(["--health-interval", "100ms", "--log-level", "debug"])
        .args(extra)
        .env("OMNI_ENDPOINT", endpoint)
        .env("OMNI_SERVICE_ACCOUNT_KEY", key)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Killer(Some(child));
    let registered = state
        .wait_for(WAIT, |s| {
            s.get(&InfraProviderStatus, "proxmox").is_some()
                && s.get(&InfraProviderHealthStatus, "proxmox")
                    .is_some_and(|h| h.metadata.version.parse::<u64>().unwrap_or(0) >= 3)
        })
        .await;
    let pid = child.0.as_ref().unwrap().id();
    if !registered {
        let mut c = child.0.take().unwrap();
        let _ = c.kill();
        let out = c.wait_with_output().unwrap();
        panic!(
            "provider did not register and beat: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let status = state.get(&InfraProviderStatus, "proxmox").unwrap();
    assert_eq!(status.spec.name, "Proxmox");
    assert_eq!(status.spec.version, env!("CARGO_PKG_VERSION"));
    assert!(!status.spec.icon.is_empty());

    let ok = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let c = child.0.take().unwrap();
    let deadline = Instant::now() + WAIT;
    let out = tokio::task::spawn_blocking(move || c.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(Instant::now() < deadline);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(stderr.contains("stopped"), "{stderr}");
    // The key never shows up in the logs.
    assert!(!stderr.contains(key), "key leaked into logs");
    assert!(!stderr.contains("PRIVATE KEY"), "key leaked into logs");
    stderr.into_owned()
}

async fn serve(
    state: &MemState,
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> (MemServer, std::net::SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (state.serve(listener, tls).unwrap(), addr)
}

#[tokio::test]
async fn binary_registers_beats_and_stops_over_plaintext() {
    transport::install_crypto_provider();
    let state = MemState::new();
    let key = state.register_provider("proxmox").unwrap();
    let (server, addr) = serve(&state, None).await;
    let dir = tempfile::tempdir().unwrap();
    run_provider(
        &state,
        &format!("http://{addr}/ignored/path"),
        key.expose(),
        &[],
        dir.path(),
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn binary_takes_the_image_factory_from_omni_and_says_so() {
    transport::install_crypto_provider();
    let state = MemState::new();
    let key = state.register_provider("proxmox").unwrap();
    // Omni publishes the factory it creates schematics on in its features configuration
    // (omni client/api/omni/specs/omni.proto, FeaturesConfigSpec.image_factory_base_url), readable by
    // infra providers (internal/backend/runtime/omni/state_access.go, filterAccess: valid signature).
    state.put(
        &FeaturesConfig,
        FEATURES_CONFIG_ID,
        &FeaturesConfigSpec {
            image_factory_base_url: "https://factory.internal.example".into(),
        },
        Default::default(),
    );
    let (server, addr) = serve(&state, None).await;
    let dir = tempfile::tempdir().unwrap();
    let stderr = run_provider(
        &state,
        &format!("http://{addr}"),
        key.expose(),
        &["--image-factory-url", "https://flag.example"],
        dir.path(),
    )
    .await;
    server.stop().await;
    let line = stderr
        .lines()
        .find(|l| l.contains("Image Factory"))
        .unwrap_or_else(|| panic!("no log line names the factory: {stderr}"));
    assert!(line.contains("https://factory.internal.example"), "{line}");
    assert!(line.contains("features configuration"), "{line}");
    assert!(!line.contains("flag.example"), "{line}");
}

#[tokio::test]
async fn binary_connects_over_tls_with_a_private_ca() {
    transport::install_crypto_provider();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let tls = tonic::transport::ServerTlsConfig::new().identity(
        tonic::transport::Identity::from_pem(leaf.pem(), leaf_key.serialize_pem()),
    );

    let state = MemState::new();
    let key = state.register_provider("proxmox").unwrap();
    let (server, addr) = serve(&state, Some(tls)).await;
    let ca_arg = ca_file.to_str().unwrap().to_owned();
    run_provider(
        &state,
        &format!("https://{addr}"),
        key.expose(),
        &["--omni-ca-file", &ca_arg],
        dir.path(),
    )
    .await;
    server.stop().await;
}

#[test]
fn binary_refuses_a_bad_key_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_omni-infra-provider-proxmox"))
        .arg("--config-file")
        .arg(&config)
        .env("OMNI_ENDPOINT", "http://127.0.0.1:1")
        .env("OMNI_SERVICE_ACCOUNT_KEY", "definitely not base64!")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not base64"), "{stderr}");
    assert!(!stderr.contains("definitely"), "{stderr}");
}

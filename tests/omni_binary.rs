//! The real binary against the in-memory Omni: connect (plaintext and TLS with a private CA),
//! register, beat, and exit 0 on SIGTERM.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use omni_infra_provider_proxmox::omni::proto::specs::FeaturesConfigSpec;
use omni_infra_provider_proxmox::omni::resources::{
    FEATURES_CONFIG, FEATURES_CONFIG_ID, INFRA_PROVIDER_HEALTH_STATUS, INFRA_PROVIDER_STATUS,
};
use omni_infra_provider_proxmox::omni::transport;
use testkit::keys::NewKey;
use testkit::memstate::{MemServer, MemState};

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
    run_provider_with_env(
        state,
        endpoint,
        key,
        &[("OMNI_SERVICE_ACCOUNT_KEY", key)],
        extra,
        dir,
    )
    .await
}

/// The provider binary with a clean environment for what it reads (key variables, CA store
/// variables) plus `env`. A plaintext endpoint (the in-memory Omni) is opted into, as a local test
/// setup must.
fn provider_command(endpoint: &str, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_omni-infra-provider-proxmox"));
    cmd.env("OMNI_ENDPOINT", endpoint);
    for var in [
        "OMNI_SERVICE_ACCOUNT_KEY",
        "OMNI_SERVICE_ACCOUNT_KEY_FILE",
        "SIDERO_SERVICE_ACCOUNT_KEY",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "OMNI_CA_FILE",
        "OMNI_INSECURE_HTTP",
    ] {
        cmd.env_remove(var);
    }
    if endpoint.starts_with("http://") {
        cmd.env("OMNI_INSECURE_HTTP", "true");
    }
    cmd.envs(env.iter().copied());
    cmd
}

async fn run_provider_with_env(
    state: &MemState,
    endpoint: &str,
    key: &str,
    env: &[(&str, &str)],
    extra: &[&str],
    dir: &std::path::Path,
) -> String {
    let config = write_config(dir);
    let child = provider_command(endpoint, env)
        .arg("--config-file")
        .arg(&config)
        .args(["--health-interval", "100ms", "--log-level", "debug"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Killer(Some(child));
    let registered = state
        .wait_for(WAIT, |s| {
            s.get(&INFRA_PROVIDER_STATUS, "proxmox").is_some()
                && s.get(&INFRA_PROVIDER_HEALTH_STATUS, "proxmox")
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
    let status = state.get(&INFRA_PROVIDER_STATUS, "proxmox").unwrap();
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
    let stderr = run_provider(
        &state,
        &format!("http://{addr}/ignored/path"),
        key.expose(),
        &[],
        dir.path(),
    )
    .await;
    assert!(
        stderr.contains("the Omni endpoint is plaintext"),
        "warned at start: {stderr}"
    );
    server.stop().await;
}

/// Plaintext to Omni lets whoever is on the path forge the machine requests the provider deletes
/// VMs for: refused unless the operator says so.
#[test]
fn binary_refuses_a_plaintext_omni_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let key = NewKey::generate("proxmox").encoded();
    let out = provider_command("http://127.0.0.1:1", &[("OMNI_SERVICE_ACCOUNT_KEY", &key)])
        .env_remove("OMNI_INSECURE_HTTP")
        .arg("--config-file")
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("plaintext") && stderr.contains("--omni-insecure-http"),
        "{stderr}"
    );
}

/// The key from a file (a Docker or Kubernetes secret), not from the environment.
#[tokio::test]
async fn binary_takes_the_key_from_a_file() {
    transport::install_crypto_provider();
    let state = MemState::new();
    let key = state.register_provider("proxmox").unwrap();
    let (server, addr) = serve(&state, None).await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("omni-key");
    std::fs::write(&key_file, format!("{}\n", key.expose())).unwrap();
    let key_path = key_file.to_str().unwrap().to_owned();
    run_provider_with_env(
        &state,
        &format!("http://{addr}"),
        key.expose(),
        &[],
        &["--omni-service-account-key-file", &key_path],
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
        &FEATURES_CONFIG,
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

/// A private CA (written to `dir/ca.pem`) and the TLS config of a server for 127.0.0.1 signed by it.
fn private_ca(dir: &std::path::Path) -> (std::path::PathBuf, tonic::transport::ServerTlsConfig) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let tls = tonic::transport::ServerTlsConfig::new().identity(
        tonic::transport::Identity::from_pem(leaf.pem(), leaf_key.serialize_pem()),
    );
    (ca_file, tls)
}

/// The official provider dials Omni with Go's default TLS config (omni client/pkg/client/client.go,
/// New: `credentials.NewTLS` without RootCAs), i.e. the system pool, which Go's crypto/x509 reads
/// from `SSL_CERT_FILE` / `SSL_CERT_DIR` when they are set. A CA installed that way must be trusted
/// without `--omni-ca-file`.
#[tokio::test]
async fn binary_trusts_the_system_ca_store_from_ssl_cert_file_and_dir() {
    transport::install_crypto_provider();
    for var in ["SSL_CERT_FILE", "SSL_CERT_DIR"] {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir(&store).unwrap();
        let (ca_file, tls) = private_ca(&store);
        let value = match var {
            "SSL_CERT_FILE" => ca_file.to_str().unwrap().to_owned(),
            _ => store.to_str().unwrap().to_owned(),
        };
        let state = MemState::new();
        let key = state.register_provider("proxmox").unwrap();
        let (server, addr) = serve(&state, Some(tls)).await;
        run_provider_with_env(
            &state,
            &format!("https://{addr}"),
            key.expose(),
            &[("OMNI_SERVICE_ACCOUNT_KEY", key.expose()), (var, &value)],
            &[],
            dir.path(),
        )
        .await;
        server.stop().await;
    }
}

/// go-api-signature pkg/serviceaccount/serviceaccount.go, GetFromEnv: the Go client also takes the
/// key from SIDERO_SERVICE_ACCOUNT_KEY. The key here is named as the Omni UI names it (the bare
/// provider ID, omni frontend/src/methods/user.ts, createServiceAccount); Omni knows it as the
/// account `infra-provider:proxmox` either way.
#[tokio::test]
async fn binary_takes_a_ui_made_key_from_sidero_service_account_key() {
    transport::install_crypto_provider();
    let state = MemState::new();
    let omnictl_key = state.register_provider("proxmox").unwrap();
    let ui_key = testkit::keys::renamed(omnictl_key.expose(), "proxmox");
    let (server, addr) = serve(&state, None).await;
    let dir = tempfile::tempdir().unwrap();
    run_provider_with_env(
        &state,
        &format!("http://{addr}"),
        &ui_key,
        &[("SIDERO_SERVICE_ACCOUNT_KEY", &ui_key)],
        &[],
        dir.path(),
    )
    .await;
    server.stop().await;
}

/// A UI-made key names its provider only by its bare name; `--id` must still be checked against it
/// before anything is sent to Omni.
#[test]
fn binary_refuses_a_ui_made_key_for_another_id_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let ui_key = NewKey::generate("proxmox").encoded_as("proxmox");
    let mut child = provider_command(
        "http://127.0.0.1:1",
        &[("OMNI_SERVICE_ACCOUNT_KEY", &ui_key)],
    )
    .arg("--config-file")
    .arg(&config)
    .args(["--id", "other"])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "provider kept running with a key for another ID: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    assert!(!status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("\"proxmox\"") && stderr.contains("--id"),
        "{stderr}"
    );
    assert!(!stderr.contains(&ui_key), "key leaked: {stderr}");
}

#[tokio::test]
async fn binary_connects_over_tls_with_a_private_ca() {
    transport::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let (ca_file, tls) = private_ca(dir.path());

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
        .env("OMNI_INSECURE_HTTP", "true")
        .env("OMNI_SERVICE_ACCOUNT_KEY", "definitely not base64!")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not base64"), "{stderr}");
    assert!(!stderr.contains("definitely"), "{stderr}");
}

/// Omni out of reach for the provider's first calls (Omni restarting, a load balancer in the way)
/// must not end the process at the first UNAVAILABLE: the start waits it out, and the provider
/// registers and beats.
#[tokio::test]
async fn binary_waits_out_omni_unreachable_at_start() {
    transport::install_crypto_provider();
    let state = MemState::new();
    let key = state.register_provider("proxmox").unwrap();
    let (server, addr) = serve(&state, None).await;
    state.cut_connections(3);
    let dir = tempfile::tempdir().unwrap();
    let stderr = run_provider(
        &state,
        &format!("http://{addr}"),
        key.expose(),
        &[],
        dir.path(),
    )
    .await;
    server.stop().await;
    assert!(
        stderr.contains("Omni is out of reach; trying again"),
        "{stderr}"
    );
}

/// SIGTERM while the start still waits for Omni: a clean stop, exit 0, not death by the signal.
#[tokio::test]
async fn binary_stops_cleanly_on_sigterm_while_omni_is_out_of_reach() {
    transport::install_crypto_provider();
    let state = MemState::new();
    let key = state.register_provider("proxmox").unwrap();
    let (server, addr) = serve(&state, None).await;
    state.cut_connections(u32::MAX);
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let child = provider_command(
        &format!("http://{addr}"),
        &[("OMNI_SERVICE_ACCOUNT_KEY", key.expose())],
    )
    .arg("--config-file")
    .arg(&config)
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut child = Killer(Some(child));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let pid = child.0.as_ref().unwrap().id();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let c = child.0.take().unwrap();
    let out = tokio::task::spawn_blocking(move || c.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(
        stderr.contains("stopped before the start was complete"),
        "{stderr}"
    );
    server.stop().await;
}

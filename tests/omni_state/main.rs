//! The Omni client against the in-memory Omni over real gRPC on loopback.

mod resources;
mod watch;

use std::collections::BTreeMap;
use std::time::Duration;

use omni_infra_provider_proxmox::controller::health;
use omni_infra_provider_proxmox::controller::registration::{self, ProviderInfo};
use omni_infra_provider_proxmox::omni::auth::{
    self, PAYLOAD_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};
use omni_infra_provider_proxmox::omni::proto::cosi::resource as pb;
use omni_infra_provider_proxmox::omni::proto::provider::MachineSpec;
use omni_infra_provider_proxmox::omni::proto::specs::{self, MachineRequestSpec};
use omni_infra_provider_proxmox::omni::resources::*;
use omni_infra_provider_proxmox::omni::state::{
    ResourceRef, StateError, Typed, WatchEvent, label_query,
};
use omni_infra_provider_proxmox::omni::transport;
use testkit::memstate;
use testkit::omni::{Omni, WAIT};
use tokio::sync::mpsc;
use tonic::Code;

fn request_spec(v: &str) -> MachineRequestSpec {
    MachineRequestSpec {
        talos_version: v.into(),
        provider_data: "cores: 2\n".into(),
        ..Default::default()
    }
}

async fn next_event(rx: &mut mpsc::Receiver<Result<WatchEvent, StateError>>) -> WatchEvent {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("watch event in time")
        .unwrap()
        .unwrap()
}

fn id_of(ev: &WatchEvent) -> String {
    let resource = match ev {
        WatchEvent::Created(r) | WatchEvent::Updated(r) | WatchEvent::Destroyed(r) => Some(r),
        WatchEvent::Bootstrapped | WatchEvent::Resync => None,
    };
    resource
        .and_then(|r| r.metadata.as_ref())
        .map(|m| m.id.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn registration_creates_then_updates_and_heartbeats_arrive() {
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    assert_eq!(
        omni_infra_provider_proxmox::omni::join::JoinMode::detect(&client.state)
            .await
            .unwrap(),
        omni_infra_provider_proxmox::omni::join::JoinMode::V2
    );
    let mut info = ProviderInfo {
        id: "proxmox".into(),
        name: "Proxmox".into(),
        description: "first".into(),
    };
    registration::register(&client.state, &info).await.unwrap();
    let stored = omni.state.get(&INFRA_PROVIDER_STATUS, "proxmox").unwrap();
    assert_eq!(stored.spec.description, "first");
    assert_eq!(stored.metadata.version, "1");
    // The icon in unpadded base64, the provider-data schema and our version.
    use base64::Engine as _;
    assert_eq!(stored.spec.name, "Proxmox");
    assert!(!stored.spec.icon.ends_with('='));
    let svg = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(&stored.spec.icon)
        .unwrap();
    assert!(String::from_utf8(svg).unwrap().contains("<svg"));
    assert_eq!(stored.spec.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(stored.spec.schema, registration::PROVIDER_DATA_SCHEMA);
    assert_eq!(
        stored
            .metadata
            .labels
            .get(label::INFRA_PROVIDER_ID)
            .unwrap(),
        "proxmox"
    );
    info.description = "second".into();
    registration::register(&client.state, &info).await.unwrap();
    let stored = omni.state.get(&INFRA_PROVIDER_STATUS, "proxmox").unwrap();
    assert_eq!(stored.spec.description, "second");
    assert_eq!(stored.metadata.version, "2");

    let problem = Some("proxmox unreachable".to_owned());
    health::beat(&client.state, "proxmox", problem)
        .await
        .unwrap();
    let hs = omni
        .state
        .get(&INFRA_PROVIDER_HEALTH_STATUS, "proxmox")
        .unwrap();
    assert_eq!(hs.spec.error, "proxmox unreachable");
    assert_eq!(hs.metadata.owner, "proxmox.ProviderHealthStatusController");
    health::beat(&client.state, "proxmox", None).await.unwrap();
    let hs = omni
        .state
        .get(&INFRA_PROVIDER_HEALTH_STATUS, "proxmox")
        .unwrap();
    assert_eq!(hs.spec.error, "");
    assert!(hs.spec.last_heartbeat_timestamp.is_some());
    // Ephemeral namespace lost (Omni restart): the next beat recreates it.
    omni.state.remove(&INFRA_PROVIDER_HEALTH_STATUS, "proxmox");
    health::beat(&client.state, "proxmox", None).await.unwrap();
    assert!(
        omni.state
            .get(&INFRA_PROVIDER_HEALTH_STATUS, "proxmox")
            .is_some()
    );

    // The ID of checkID types must be ours.
    let other = ProviderInfo {
        id: "other".into(),
        name: "x".into(),
        description: "y".into(),
    };
    let err = registration::register(&client.state, &other)
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::InvalidArgument { .. }), "{err}");
}

#[tokio::test]
async fn bad_signatures_are_rejected() {
    let omni = Omni::start("proxmox").await;
    // Hand-made requests over a plain channel.
    let channel = tonic::transport::Endpoint::from_shared(omni.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = pb::state_client::StateClient::new(channel);
    let method = "/cosi.resource.State/Get";
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let get = || pb::GetRequest {
        namespace: "infra-provider".into(),
        r#type: PROVIDER_JOIN_CONFIG.resource_type.into(),
        id: "proxmox".into(),
        options: Some(pb::GetOptions {}),
    };
    let send_at = |at: i64, payload: String, sig: String| {
        let mut req = tonic::Request::new(get());
        req.metadata_mut()
            .insert(TIMESTAMP_HEADER, at.to_string().parse().unwrap());
        req.metadata_mut()
            .insert(PAYLOAD_HEADER, payload.parse().unwrap());
        req.metadata_mut()
            .insert(SIGNATURE_HEADER, sig.parse().unwrap());
        req
    };
    let send = |payload, sig| send_at(now, payload, sig);
    // A clock more than 5 minutes off is refused, as the client reports it.
    let (payload, signature) = omni.key.sign_call(method, now + 6 * 60).unwrap();
    let st = raw
        .get(send_at(now + 6 * 60, payload, signature))
        .await
        .unwrap_err();
    let err = StateError::from_status(ResourceRef::default(), &st);
    assert!(matches!(err, StateError::Unauthenticated { .. }), "{err}");
    // Within the window it works.
    let (payload, signature) = omni.key.sign_call(method, now - 4 * 60).unwrap();
    raw.get(send_at(now - 4 * 60, payload, signature))
        .await
        .unwrap();
    // Correct hand-made signature is accepted (control).
    let (payload, signature) = omni.key.sign_call(method, now).unwrap();
    raw.get(send(payload.clone(), signature.clone()))
        .await
        .unwrap();
    // Tampered payload: signature no longer matches.
    let tampered = payload.replace("\"authorization\":null,", "");
    assert_ne!(tampered, payload);
    let st = raw
        .get(send(tampered, signature.clone()))
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::Unauthenticated);
    assert_eq!(st.message(), "invalid signature");
    // `[]` for an absent header, correctly signed: still rejected.
    let empty_array = payload.replace("\"cluster\":null", "\"cluster\":[]");
    let sig = omni.key.signature_header(&empty_array).unwrap();
    let st = raw.get(send(empty_array, sig)).await.unwrap_err();
    assert_eq!(st.code(), Code::Unauthenticated);
    // Omitted keys are fine (Go decodes them as nil).
    let omitted =
        format!(r#"{{"headers":{{"x-sidero-timestamp":["{now}"]}},"method":"{method}"}}"#);
    let sig = omni.key.signature_header(&omitted).unwrap();
    raw.get(send(omitted, sig)).await.unwrap();
    // No signature at all.
    let st = raw.get(get()).await.unwrap_err();
    assert_eq!(st.code(), Code::Unauthenticated);
    // A key Omni does not know.
    let stranger = testkit::keys::NewKey::generate("proxmox").parsed();
    let (payload, signature) = stranger.sign_call(method, now).unwrap();
    let st = raw.get(send(payload, signature)).await.unwrap_err();
    assert_eq!(st.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn gpg_verifies_our_signature_with_an_omni_style_key() {
    let have_gpg = std::process::Command::new("gpg")
        .arg("--version")
        .output()
        .is_ok();
    if !have_gpg {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "gpg is required in CI"
        );
        eprintln!("SKIPPED: gpg not installed");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let gpg = |args: &[&str]| {
        std::process::Command::new("gpg")
            .env("GNUPGHOME", home.path())
            .args([
                "--batch",
                "--yes",
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
            ])
            .args(args)
            .output()
            .unwrap()
    };
    let out = gpg(&[
        "--quick-gen-key",
        "proxmox <proxmox@infra-provider.serviceaccount.omni.sidero.dev>",
        "ed25519",
        "sign",
        "1y",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let armored = gpg(&["--armor", "--export-secret-keys"]);
    let armored = String::from_utf8(armored.stdout).unwrap();
    let encoded = testkit::keys::encode_key_json("infra-provider:proxmox", &armored);
    let key = auth::ProviderKey::parse(&omni_infra_provider_proxmox::secret::Secret::new(encoded))
        .unwrap();
    let (payload, signature) = key
        .sign_call("/cosi.resource.State/List", 1_767_225_600)
        .unwrap();
    let b64 = signature.split(' ').nth(3).unwrap();
    use base64::Engine as _;
    let sig = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    std::fs::write(home.path().join("payload"), &payload).unwrap();
    std::fs::write(home.path().join("payload.sig"), &sig).unwrap();
    let sig_path = home.path().join("payload.sig");
    let payload_path = home.path().join("payload");
    let out = gpg(&[
        "--verify",
        sig_path.to_str().unwrap(),
        payload_path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And a tampered payload fails gpg too.
    std::fs::write(&payload_path, payload.replace("List", "Get")).unwrap();
    let out = gpg(&[
        "--verify",
        sig_path.to_str().unwrap(),
        payload_path.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    // The fingerprint in the header is gpg's, lower-cased.
    let fp = signature.split(' ').nth(2).unwrap();
    let listing = String::from_utf8(gpg(&["--with-colons", "--list-keys"]).stdout).unwrap();
    assert!(listing.to_lowercase().contains(fp), "{fp} not in {listing}");
}

/// An Omni (or a proxy before it) that accepts connections and reads requests but never answers.
async fn silent_omni() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            held.push(tokio::spawn(async move {
                let mut sink = vec![0u8; 4096];
                use tokio::io::AsyncReadExt;
                while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
            }));
        }
    });
    (addr, task)
}

fn client_of(addr: std::net::SocketAddr) -> omni_infra_provider_proxmox::omni::client::OmniClient {
    transport::install_crypto_provider();
    let key = testkit::keys::NewKey::generate("proxmox").parsed();
    omni_infra_provider_proxmox::omni::client::OmniClient::connect(
        &transport::OmniEndpoint {
            url: format!("http://{addr}"),
            tls: transport::OmniTls::SystemAndPublicRoots,
        },
        std::sync::Arc::new(key),
        "proxmox",
    )
    .unwrap()
}

/// A call Omni never answers ends at its deadline with a transport error (retried like one).
#[tokio::test]
async fn a_call_omni_never_answers_ends_at_its_deadline() {
    let (addr, server) = silent_omni().await;
    let mut state = client_of(addr).state;
    state.deadline = Duration::from_millis(200);
    let started = std::time::Instant::now();
    let err = state
        .get(&MACHINE_REQUEST, "never-answered")
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::Transport { .. }), "{err}");
    assert!(err.to_string().contains("no answer within"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    let listed = state.list(&MACHINE_REQUEST, &[]).await;
    assert!(matches!(listed, Err(StateError::Transport { .. })));
    server.abort();
}

/// One hung heartbeat call must not silence the provider: each beat is given up after one interval
/// (here the 1 s floor) and the next one is sent on time (without it, the first beat waited for
/// ever). The beats given up are counted in the log, which this test's thread keeps.
#[tokio::test]
async fn the_heartbeat_never_waits_longer_than_its_interval() {
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || testkit::LogWriter(kept.clone()))
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let (addr, server) = silent_omni().await;
    let state = client_of(addr).state;
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let (_lead, leader) = tokio::sync::watch::channel(true);
    let heartbeat = health::Heartbeat {
        state,
        provider_id: "proxmox".into(),
        interval: Duration::from_millis(100),
        check: tokio::sync::watch::channel(None).1,
        metrics: Default::default(),
    };
    let beating = tokio::spawn(heartbeat.run(shutdown, leader.clone()));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(2), beating)
        .await
        .expect("the heartbeat stops within an interval")
        .unwrap();
    let log = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    let given_up = log.matches("heartbeat not answered").count();
    assert!(
        given_up >= 2,
        "{given_up} beats given up in 2.5 s with each given up after 1 s: {log}"
    );
    server.abort();
}

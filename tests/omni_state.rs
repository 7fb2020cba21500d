//! The Omni client against the in-memory Omni over real gRPC on loopback.

#[path = "support/omni.rs"]
mod omni_support;

use std::collections::BTreeMap;
use std::time::Duration;

use omni_infra_provider_proxmox::controller::health;
use omni_infra_provider_proxmox::controller::registration::{self, ProviderInfo};
use omni_infra_provider_proxmox::omni::auth::{
    self, PAYLOAD_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};
use omni_infra_provider_proxmox::omni::memstate;
use omni_infra_provider_proxmox::omni::proto::cosi::resource as pb;
use omni_infra_provider_proxmox::omni::proto::provider::MachineSpec;
use omni_infra_provider_proxmox::omni::proto::specs::{self, MachineRequestSpec};
use omni_infra_provider_proxmox::omni::resources::*;
use omni_infra_provider_proxmox::omni::state::{
    LabelSelector, ResourceRef, StateError, WatchEvent,
};
use omni_infra_provider_proxmox::omni::transport;
use omni_support::{Omni, WAIT};
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
    ev.resource()
        .and_then(|r| r.metadata.as_ref())
        .map(|m| m.id.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn registration_creates_then_updates_and_heartbeats_arrive() {
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    assert_eq!(
        omni_infra_provider_proxmox::controller::detect_join_mode(&client.state)
            .await
            .unwrap(),
        omni_infra_provider_proxmox::omni::join::JoinMode::V2
    );
    let mut info = ProviderInfo::new("proxmox", "Proxmox", "first");
    registration::register(&client.state, &info).await.unwrap();
    let stored = omni.state.get(&InfraProviderStatus, "proxmox").unwrap();
    assert_eq!(stored.spec.description, "first");
    assert_eq!(stored.metadata.version, "1");
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
    let stored = omni.state.get(&InfraProviderStatus, "proxmox").unwrap();
    assert_eq!(stored.spec.description, "second");
    assert_eq!(stored.metadata.version, "2");

    let check = health::health_check(|| async { Some("proxmox unreachable".to_owned()) });
    health::beat(&client.state, "proxmox", &check)
        .await
        .unwrap();
    let hs = omni
        .state
        .get(&InfraProviderHealthStatus, "proxmox")
        .unwrap();
    assert_eq!(hs.spec.error, "proxmox unreachable");
    assert_eq!(hs.metadata.owner, "proxmox.ProviderHealthStatusController");
    health::beat(&client.state, "proxmox", &health::always_healthy())
        .await
        .unwrap();
    let hs = omni
        .state
        .get(&InfraProviderHealthStatus, "proxmox")
        .unwrap();
    assert_eq!(hs.spec.error, "");
    assert!(hs.spec.last_heartbeat_timestamp.is_some());
    // Ephemeral namespace lost (Omni restart): the next beat recreates it.
    omni.state.remove(&InfraProviderHealthStatus, "proxmox");
    health::beat(&client.state, "proxmox", &health::always_healthy())
        .await
        .unwrap();
    assert!(
        omni.state
            .get(&InfraProviderHealthStatus, "proxmox")
            .is_some()
    );

    // The ID of checkID types must be ours.
    let other = ProviderInfo::new("other", "x", "y");
    let err = registration::register(&client.state, &other)
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::InvalidArgument { .. }), "{err}");
}

#[tokio::test]
async fn bad_signatures_are_rejected() {
    let omni = Omni::start("proxmox").await;
    // Skewed clock (> 5 min).
    let skewed = omni.client_with_offset("proxmox", 6 * 60);
    let err = skewed
        .state
        .get(&ProviderJoinConfig, "proxmox")
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::Unauthenticated { .. }), "{err}");
    // Within the window it works.
    let ok = omni.client_with_offset("proxmox", -4 * 60);
    ok.state.get(&ProviderJoinConfig, "proxmox").await.unwrap();

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
        r#type: ProviderJoinConfig::TYPE.into(),
        id: "proxmox".into(),
        options: Some(pb::GetOptions {}),
    };
    let send = |payload: String, sig: String| {
        let mut req = tonic::Request::new(get());
        req.metadata_mut()
            .insert(TIMESTAMP_HEADER, now.to_string().parse().unwrap());
        req.metadata_mut()
            .insert(PAYLOAD_HEADER, payload.parse().unwrap());
        req.metadata_mut()
            .insert(SIGNATURE_HEADER, sig.parse().unwrap());
        req
    };
    // Correct hand-made signature is accepted (control).
    let good = omni.key.sign_call(method, now).unwrap();
    raw.get(send(good.payload.clone(), good.signature.clone()))
        .await
        .unwrap();
    // Tampered payload: signature no longer matches.
    let tampered = good.payload.replace("\"authorization\":null,", "");
    assert_ne!(tampered, good.payload);
    let st = raw
        .get(send(tampered, good.signature.clone()))
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::Unauthenticated);
    assert_eq!(st.message(), "invalid signature");
    // `[]` for an absent header, correctly signed: still rejected.
    let empty_array = good.payload.replace("\"cluster\":null", "\"cluster\":[]");
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
    let stranger = auth::ProviderKey::generate("proxmox").unwrap();
    let s = stranger.sign_call(method, now).unwrap();
    let st = raw.get(send(s.payload, s.signature)).await.unwrap_err();
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
    let encoded = auth::encode_key_json("infra-provider:proxmox", &armored);
    let key = auth::ProviderKey::parse(&omni_infra_provider_proxmox::secret::Secret::new(encoded))
        .unwrap();
    let signed = key
        .sign_call("/cosi.resource.State/List", 1_767_225_600)
        .unwrap();
    let b64 = signed.signature.split(' ').nth(3).unwrap();
    use base64::Engine as _;
    let sig = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    std::fs::write(home.path().join("payload"), &signed.payload).unwrap();
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
    std::fs::write(&payload_path, signed.payload.replace("List", "Get")).unwrap();
    let out = gpg(&[
        "--verify",
        sig_path.to_str().unwrap(),
        payload_path.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    // The fingerprint in the header is gpg's, lower-cased.
    let fp = signed.signature.split(' ').nth(2).unwrap();
    let listing = String::from_utf8(gpg(&["--with-colons", "--list-keys"]).stdout).unwrap();
    assert!(listing.to_lowercase().contains(fp), "{fp} not in {listing}");
}

#[tokio::test]
async fn watch_sees_create_update_destroy_and_only_our_requests() {
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    omni.state
        .create_machine_request("existing-1", "proxmox", "set", &request_spec("v1.11.0"));
    omni.state
        .create_machine_request("foreign-1", "other", "set", &request_spec("v1.11.0"));
    let mut rx = client.state.watch_kind(
        MachineRequest::NAMESPACE,
        MachineRequest::TYPE,
        vec![LabelSelector::new().equal(label::INFRA_PROVIDER_ID, "proxmox")],
    );
    let ev = next_event(&mut rx).await;
    assert!(
        matches!(ev, WatchEvent::Created(_)) && id_of(&ev) == "existing-1",
        "{ev:?}"
    );
    assert_eq!(next_event(&mut rx).await, WatchEvent::Bootstrapped);
    omni.state
        .create_machine_request("r1", "proxmox", "set", &request_spec("v1.11.0"));
    omni.state
        .create_machine_request("foreign-2", "other", "set", &request_spec("v1.11.0"));
    let ev = next_event(&mut rx).await;
    assert!(
        matches!(ev, WatchEvent::Created(_)) && id_of(&ev) == "r1",
        "{ev:?}"
    );
    omni.state.teardown(&MachineRequest, "r1");
    let ev = next_event(&mut rx).await;
    assert!(
        matches!(ev, WatchEvent::Updated(_)) && id_of(&ev) == "r1",
        "{ev:?}"
    );
    omni.state.collect_torn_down(&MachineRequest);
    let ev = next_event(&mut rx).await;
    assert!(
        matches!(ev, WatchEvent::Destroyed(_)) && id_of(&ev) == "r1",
        "{ev:?}"
    );

    // Reads are filtered by provider label too.
    let err = client
        .state
        .get(&MachineRequest, "foreign-1")
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let listed = client.state.list(&MachineRequest, vec![]).await.unwrap();
    assert_eq!(
        listed.iter().map(|r| r.id()).collect::<Vec<_>>(),
        vec!["existing-1"]
    );
}

#[tokio::test]
async fn finalizers_are_added_and_removed_without_touching_the_spec() {
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    omni.state
        .create_machine_request("r1", "proxmox", "set", &request_spec("v1.11.0"));
    let what = ResourceRef::of(&MachineRequest, "r1");
    let fin = provision_controller_name("proxmox");
    client.state.add_finalizer(&what, &fin).await.unwrap();
    let stored = omni
        .state
        .get_raw(MachineRequest::NAMESPACE, MachineRequest::TYPE, "r1")
        .unwrap();
    assert_eq!(
        stored.metadata.as_ref().unwrap().finalizers,
        vec![fin.clone()]
    );
    let spec_after_add = stored.spec.as_ref().unwrap().proto_spec.clone();
    // Adding again is a no-op.
    client.state.add_finalizer(&what, &fin).await.unwrap();
    client.state.remove_finalizer(&what, &fin).await.unwrap();
    let stored = omni
        .state
        .get_raw(MachineRequest::NAMESPACE, MachineRequest::TYPE, "r1")
        .unwrap();
    assert!(stored.metadata.as_ref().unwrap().finalizers.is_empty());
    assert_eq!(stored.spec.as_ref().unwrap().proto_spec, spec_after_add);

    // Changing the spec of a MachineRequest is refused (finalizers only).
    let mut req = client.state.get(&MachineRequest, "r1").await.unwrap();
    req.spec.talos_version = "v9".into();
    let err = client
        .state
        .update(&MachineRequest, &req, "", None)
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::PermissionDenied { .. }), "{err}");
    // A missing request is NotFound.
    let err = client
        .state
        .add_finalizer(&ResourceRef::of(&MachineRequest, "missing"), &fin)
        .await
        .unwrap_err();
    assert!(err.is_not_found());
}

#[tokio::test]
async fn finalizer_edit_echoes_unknown_spec_fields() {
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    // Our own state type: the in-process API stores whatever bytes we give it via gRPC create.
    let kind = ProviderMachine::new("proxmox");
    let mut bytes = prost::Message::encode_to_vec(&MachineSpec {
        node: "pve1".into(),
        ..Default::default()
    });
    bytes.extend_from_slice(&[0x9a, 0x06, 0x02, b'h', b'i']); // field 99, unknown to us
    let resource = pb::Resource {
        metadata: Some(pb::Metadata {
            namespace: kind.namespace(),
            r#type: kind.resource_type(),
            id: "m1".into(),
            ..Default::default()
        }),
        spec: Some(pb::Spec {
            proto_spec: bytes.clone(),
            yaml_spec: String::new(),
        }),
    };
    client
        .state
        .create_raw(resource, "proxmox.ProvisionController")
        .await
        .unwrap();
    let what = ResourceRef::of(&kind, "m1");
    client.state.add_finalizer(&what, "x").await.unwrap();
    client.state.remove_finalizer(&what, "x").await.unwrap();
    let stored = omni
        .state
        .get_raw(&kind.namespace(), &kind.resource_type(), "m1")
        .unwrap();
    assert_eq!(stored.spec.unwrap().proto_spec, bytes);
    assert_eq!(stored.metadata.unwrap().version, "3");
}

#[tokio::test]
async fn teardown_by_rpc_and_by_fallback() {
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    let owner = provision_controller_name("proxmox");
    let kind = ProviderMachine::new("proxmox");
    for id in ["a", "b"] {
        client
            .state
            .create(&kind, id, &MachineSpec::default(), BTreeMap::new(), &owner)
            .await
            .unwrap();
    }
    client
        .state
        .add_finalizer(&ResourceRef::of(&kind, "a"), "keep")
        .await
        .unwrap();
    // RPC path: not ready while a finalizer is pending.
    assert!(
        !client
            .state
            .teardown(&ResourceRef::of(&kind, "a"), &owner)
            .await
            .unwrap()
    );
    assert_eq!(omni.state.calls("/cosi.resource.State/Teardown"), 1);
    assert!(omni.state.get(&kind, "a").unwrap().is_tearing_down());
    let err = client
        .state
        .destroy(&ResourceRef::of(&kind, "a"), &owner)
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    client
        .state
        .remove_finalizer(&ResourceRef::of(&kind, "a"), "keep")
        .await
        .unwrap();
    assert!(
        client
            .state
            .teardown(&ResourceRef::of(&kind, "a"), &owner)
            .await
            .unwrap()
    );
    client
        .state
        .destroy(&ResourceRef::of(&kind, "a"), &owner)
        .await
        .unwrap();
    assert!(omni.state.get(&kind, "a").is_none());

    // Fallback path on an "old Omni".
    omni.state.set_teardown_unimplemented(true);
    let before = omni.state.calls("/cosi.resource.State/Update");
    assert!(
        client
            .state
            .teardown(&ResourceRef::of(&kind, "b"), &owner)
            .await
            .unwrap()
    );
    assert!(omni.state.get(&kind, "b").unwrap().is_tearing_down());
    assert!(omni.state.calls("/cosi.resource.State/Update") > before);
    // Wrong owner is refused on both paths.
    let err = client
        .state
        .destroy(&ResourceRef::of(&kind, "b"), "someone-else")
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::PermissionDenied { .. }), "{err}");

    // Provider may not tear down a MachineRequest.
    omni.state.set_teardown_unimplemented(false);
    omni.state
        .create_machine_request("r1", "proxmox", "set", &request_spec("v1"));
    let err = client
        .state
        .teardown(&ResourceRef::of(&MachineRequest, "r1"), "")
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::PermissionDenied { .. }), "{err}");
}

#[tokio::test]
async fn modify_retries_version_conflicts_and_namespace_rules_apply() {
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    let owner = provision_controller_name("proxmox");
    let status = client
        .state
        .modify(&MachineRequestStatus, "r1", &owner, |r| {
            r.spec.stage = specs::machine_request_status_spec::Stage::Provisioning as i32;
        })
        .await
        .unwrap();
    assert_eq!(status.label(label::INFRA_PROVIDER_ID), Some("proxmox"));
    // Omni adds its finalizer behind our back: our stale copy conflicts.
    let err = client
        .state
        .update(&MachineRequestStatus, &status, &owner, None)
        .await;
    assert!(err.is_ok());
    let err = client
        .state
        .update(&MachineRequestStatus, &status, &owner, None)
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    let done = client
        .state
        .modify(&MachineRequestStatus, "r1", &owner, |r| {
            r.spec.status = "Provision Complete".into()
        })
        .await
        .unwrap();
    assert_eq!(done.spec.status, "Provision Complete");

    // Other providers' private namespaces and wrong type suffixes.
    let err = client
        .state
        .list(&ProviderMachine::new("other"), vec![])
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::PermissionDenied { .. }), "{err}");
    let err = client
        .state
        .list_raw(
            "infra-provider:proxmox",
            "Machine.other.infraprovider.sidero.dev",
            vec![],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::InvalidArgument { .. }), "{err}");
    // Read-only elsewhere.
    let cfg = client
        .state
        .get(&SiderolinkApiConfig, SIDEROLINK_CONFIG_ID)
        .await
        .unwrap();
    assert_eq!(cfg.spec.events_port, 8091);
    let err = client
        .state
        .update(&SiderolinkApiConfig, &cfg, "", None)
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::PermissionDenied { .. }), "{err}");
    let join = client
        .state
        .get(&ProviderJoinConfig, "proxmox")
        .await
        .unwrap();
    assert!(!join.spec.join_token.is_empty());
}

#[tokio::test]
async fn providers_read_the_features_config_and_manage_their_config_patch_requests() {
    // Omni's internal/backend/runtime/omni/state_access.go, filterAccess: FeaturesConfigs need only a
    // valid signature (read-only for providers); infraprovider/state.go, getResourceConfig: in the
    // shared namespace only the listed types exist for providers, ConfigPatchRequests among them
    // (read and write, label-checked); any other type there is refused.
    let omni = Omni::start("proxmox").await;
    omni.state.put(
        &FeaturesConfig,
        FEATURES_CONFIG_ID,
        &specs::FeaturesConfigSpec {
            image_factory_base_url: "https://factory.internal.example".into(),
        },
        BTreeMap::new(),
    );
    let client = omni.client("proxmox");
    let features = client
        .state
        .get(&FeaturesConfig, FEATURES_CONFIG_ID)
        .await
        .unwrap();
    assert_eq!(
        features.spec.image_factory_base_url,
        "https://factory.internal.example"
    );
    let err = client
        .state
        .update(&FeaturesConfig, &features, "", None)
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::PermissionDenied { .. }), "{err}");

    let owner = provision_controller_name("proxmox");
    let patch = client
        .state
        .modify(&ConfigPatchRequest, "000-hostname-r1", &owner, |p| {
            p.metadata
                .labels
                .insert(label::MACHINE_REQUEST.into(), "r1".into());
            p.spec.data = "machine: {}".into();
        })
        .await
        .unwrap();
    assert_eq!(patch.label(label::INFRA_PROVIDER_ID), Some("proxmox"));
    let found = client
        .state
        .list(
            &ConfigPatchRequest,
            vec![LabelSelector::new().equal(label::MACHINE_REQUEST, "r1")],
        )
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert!(
        client
            .state
            .teardown(
                &ResourceRef::of(&ConfigPatchRequest, "000-hostname-r1"),
                &owner
            )
            .await
            .unwrap()
    );
    client
        .state
        .destroy(
            &ResourceRef::of(&ConfigPatchRequest, "000-hostname-r1"),
            &owner,
        )
        .await
        .unwrap();
    assert!(
        omni.state
            .get(&ConfigPatchRequest, "000-hostname-r1")
            .is_none()
    );

    let err = client
        .state
        .list_raw("infra-provider", "Clusters.omni.sidero.dev", vec![])
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::PermissionDenied { .. }), "{err}");
}

#[tokio::test]
async fn schematic_through_management() {
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    let yaml = "customization:\n  systemExtensions:\n    officialExtensions: [siderolabs/qemu-guest-agent]\n";
    let a = client
        .management
        .create_schematic_from_raw(yaml, "v1.11.0")
        .await
        .unwrap();
    let b = client
        .management
        .create_schematic_from_raw(yaml, "v1.11.0")
        .await
        .unwrap();
    let c = client
        .management
        .create_schematic_from_raw("customization: {}\n", "")
        .await
        .unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a.len(), 64);
}

#[tokio::test]
async fn watch_survives_a_server_restart() {
    let mut omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    let state = client
        .state
        .clone()
        .with_reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200));
    let mut rx = state.watch_kind(
        MachineRequest::NAMESPACE,
        MachineRequest::TYPE,
        vec![LabelSelector::new().equal(label::INFRA_PROVIDER_ID, "proxmox")],
    );
    assert_eq!(next_event(&mut rx).await, WatchEvent::Bootstrapped);
    omni.state
        .create_machine_request("before", "proxmox", "set", &request_spec("v1"));
    assert_eq!(id_of(&next_event(&mut rx).await), "before");
    omni.stop().await;
    // Created while the server is down: must be delivered after the reconnect (bookmark resume).
    omni.state
        .create_machine_request("during", "proxmox", "set", &request_spec("v1"));
    omni.restart().await;
    let ev = next_event(&mut rx).await;
    assert!(
        matches!(ev, WatchEvent::Created(_)) && id_of(&ev) == "during",
        "{ev:?}"
    );
    omni.state
        .create_machine_request("after", "proxmox", "set", &request_spec("v1"));
    assert_eq!(id_of(&next_event(&mut rx).await), "after");
}

#[tokio::test]
async fn watch_rebootstraps_when_the_bookmark_is_unknown() {
    let mut omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    let state = client
        .state
        .clone()
        .with_reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200));
    omni.state
        .create_machine_request("r1", "proxmox", "set", &request_spec("v1"));
    let mut rx = state.watch_kind(MachineRequest::NAMESPACE, MachineRequest::TYPE, vec![]);
    assert_eq!(id_of(&next_event(&mut rx).await), "r1");
    assert_eq!(next_event(&mut rx).await, WatchEvent::Bootstrapped);
    // A brand-new Omni on the same port: our bookmark means nothing there.
    omni.stop().await;
    let fresh = omni_infra_provider_proxmox::omni::memstate::MemState::new();
    fresh.register_key(&omni.key).unwrap();
    fresh.put(
        &InfraProvider,
        "proxmox",
        &specs::InfraProviderSpec {},
        BTreeMap::new(),
    );
    fresh.create_machine_request("r2", "proxmox", "set", &request_spec("v1"));
    let listener = tokio::net::TcpListener::bind(omni.addr).await.unwrap();
    let server = fresh.serve(listener, None).unwrap();
    assert_eq!(next_event(&mut rx).await, WatchEvent::Resync);
    assert_eq!(id_of(&next_event(&mut rx).await), "r2");
    assert_eq!(next_event(&mut rx).await, WatchEvent::Bootstrapped);
    server.stop().await;
}

/// A raw State client signed like the provider's, for checking what the server itself sends.
fn raw_state(omni: &Omni) -> pb::state_client::StateClient<transport::SignedChannel> {
    let channel = transport::channel(&transport::OmniEndpoint {
        url: omni.url(),
        tls: transport::OmniTls::SystemAndPublicRoots,
    })
    .unwrap();
    pb::state_client::StateClient::new(transport::SignedChannel::new(
        channel,
        omni.key.clone(),
        Some("proxmox".into()),
    ))
}

fn resume_request(bookmark: Vec<u8>) -> pb::WatchRequest {
    pb::WatchRequest {
        namespace: MachineRequest::NAMESPACE.into(),
        r#type: MachineRequest::TYPE.into(),
        id: None,
        options: Some(pb::WatchOptions {
            start_from_bookmark: Some(bookmark),
            label_query: vec![
                LabelSelector::new()
                    .equal(label::INFRA_PROVIDER_ID, "proxmox")
                    .into_query(),
            ],
            ..Default::default()
        }),
        api_version: 1,
    }
}

/// What Omni's default store (etcd) does with an expired bookmark: state-etcd
/// pkg/state/impl/etcd/etcd.go, watchKind, turns etcd's ErrCompacted (and ErrFutureRev) into an
/// Errored event sent after the watch was set up, and cosi runtime
/// pkg/state/protobuf/server/server.go, Watch, forwards it as an ERRORED event after the empty
/// "established" message, leaving the stream open. Only a bookmark that does not decode fails the
/// call itself (FailedPrecondition), which is what our client used to rely on.
#[tokio::test]
async fn memstate_reports_a_compacted_bookmark_like_omnis_etcd_store() {
    let omni = Omni::start("proxmox").await;
    omni.state
        .create_machine_request("r1", "proxmox", "set", &request_spec("v1"));
    let mut raw = raw_state(&omni);
    let mut first = raw
        .watch(resume_request(1u64.to_be_bytes().to_vec()))
        .await
        .unwrap()
        .into_inner();
    assert!(first.message().await.unwrap().unwrap().event.is_empty());
    // Before compaction the bookmark resumes: r1's creation is replayed.
    let replayed = first.message().await.unwrap().unwrap();
    assert_eq!(replayed.event[0].event_type, pb::EventType::Created as i32);
    drop(first);

    omni.state.compact();
    let mut stream = raw
        .watch(resume_request(1u64.to_be_bytes().to_vec()))
        .await
        .expect("the call itself succeeds; the error comes as an event")
        .into_inner();
    assert!(stream.message().await.unwrap().unwrap().event.is_empty());
    let msg = stream.message().await.unwrap().unwrap();
    assert_eq!(msg.event.len(), 1);
    let ev = &msg.event[0];
    assert_eq!(ev.event_type, pb::EventType::Errored as i32);
    assert_eq!(ev.error.as_deref(), Some(memstate::COMPACTED_ERROR));
    assert!(ev.bookmark.is_none() && ev.resource.is_none());
    // Nothing more, but the stream stays open.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.message())
            .await
            .is_err()
    );

    // A bookmark from the future (another store) is reported the same way.
    let mut stream = raw
        .watch(resume_request(1_000_000u64.to_be_bytes().to_vec()))
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().unwrap().event.is_empty());
    let ev = stream.message().await.unwrap().unwrap().event.remove(0);
    assert_eq!(ev.error.as_deref(), Some(memstate::FUTURE_REVISION_ERROR));

    // A bookmark that does not decode fails the call.
    let status = match raw.watch(resume_request(vec![1, 2, 3])).await {
        Err(status) => status,
        Ok(stream) => stream.into_inner().message().await.unwrap_err(),
    };
    assert_eq!(status.code(), Code::FailedPrecondition);
}

/// The expired-bookmark loop: a watch that resumes into compacted history must start over with a
/// full listing (and say so with Resync) instead of retrying the same bookmark for ever.
#[tokio::test]
async fn watch_resumed_from_a_compacted_bookmark_rebootstraps() {
    let mut omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    let state = client
        .state
        .clone()
        .with_reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200));
    let mut rx = state.watch_kind(
        MachineRequest::NAMESPACE,
        MachineRequest::TYPE,
        vec![LabelSelector::new().equal(label::INFRA_PROVIDER_ID, "proxmox")],
    );
    assert_eq!(next_event(&mut rx).await, WatchEvent::Bootstrapped);
    omni.state
        .create_machine_request("before", "proxmox", "set", &request_spec("v1"));
    assert_eq!(id_of(&next_event(&mut rx).await), "before");
    omni.stop().await;
    // While the watch is down: one request is removed by force, one is created, and the history
    // both happened in is compacted away.
    omni.state
        .create_machine_request("during", "proxmox", "set", &request_spec("v1"));
    assert!(omni.state.remove(&MachineRequest, "before"));
    omni.state.compact();
    omni.restart().await;
    assert_eq!(next_event(&mut rx).await, WatchEvent::Resync);
    let ev = next_event(&mut rx).await;
    assert!(
        matches!(ev, WatchEvent::Created(_)) && id_of(&ev) == "during",
        "{ev:?}"
    );
    assert_eq!(next_event(&mut rx).await, WatchEvent::Bootstrapped);
    omni.state
        .create_machine_request("after", "proxmox", "set", &request_spec("v1"));
    let ev = next_event(&mut rx).await;
    assert!(
        matches!(ev, WatchEvent::Created(_)) && id_of(&ev) == "after",
        "{ev:?}"
    );
}

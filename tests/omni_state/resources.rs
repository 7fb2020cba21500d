//! Reading and writing resources: the watch's events, finalizers, teardown, version conflicts and
//! the namespace rules Omni enforces on a provider, and the management service.

use super::*;

#[tokio::test]
async fn watch_sees_create_update_destroy_and_only_our_requests() {
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    omni.state
        .create_machine_request("existing-1", "proxmox", "set", &request_spec("v1.11.0"));
    omni.state
        .create_machine_request("foreign-1", "other", "set", &request_spec("v1.11.0"));
    let mut rx = client
        .state
        .watch_kind(&MACHINE_REQUEST, &[(label::INFRA_PROVIDER_ID, "proxmox")]);
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
    omni.state.teardown(&MACHINE_REQUEST, "r1");
    let ev = next_event(&mut rx).await;
    assert!(
        matches!(ev, WatchEvent::Updated(_)) && id_of(&ev) == "r1",
        "{ev:?}"
    );
    omni.state.collect_torn_down(&MACHINE_REQUEST);
    let ev = next_event(&mut rx).await;
    assert!(
        matches!(ev, WatchEvent::Destroyed(_)) && id_of(&ev) == "r1",
        "{ev:?}"
    );

    // Reads are filtered by provider label too.
    let err = client
        .state
        .get(&MACHINE_REQUEST, "foreign-1")
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let listed = client.state.list(&MACHINE_REQUEST, &[]).await.unwrap();
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
    let what = ResourceRef::of(&MACHINE_REQUEST, "r1");
    let fin = provision_controller_name("proxmox");
    client.state.set_finalizer(&what, &fin, true).await.unwrap();
    let stored = omni
        .state
        .get_raw(
            &MACHINE_REQUEST.namespace,
            &MACHINE_REQUEST.resource_type,
            "r1",
        )
        .unwrap();
    assert_eq!(
        stored.metadata.as_ref().unwrap().finalizers,
        vec![fin.clone()]
    );
    let spec_after_add = stored.spec.as_ref().unwrap().proto_spec.clone();
    // Adding again is a no-op.
    client.state.set_finalizer(&what, &fin, true).await.unwrap();
    client
        .state
        .set_finalizer(&what, &fin, false)
        .await
        .unwrap();
    let stored = omni
        .state
        .get_raw(
            &MACHINE_REQUEST.namespace,
            &MACHINE_REQUEST.resource_type,
            "r1",
        )
        .unwrap();
    assert!(stored.metadata.as_ref().unwrap().finalizers.is_empty());
    assert_eq!(stored.spec.as_ref().unwrap().proto_spec, spec_after_add);

    // Changing the spec of a MachineRequest is refused (finalizers only).
    let mut req = client.state.get(&MACHINE_REQUEST, "r1").await.unwrap();
    req.spec.talos_version = "v9".into();
    let err = client
        .state
        .update(&MACHINE_REQUEST, &req, "", None)
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::PermissionDenied { .. }), "{err}");
    // A missing request is NotFound.
    let err = client
        .state
        .set_finalizer(&ResourceRef::of(&MACHINE_REQUEST, "missing"), &fin, true)
        .await
        .unwrap_err();
    assert!(err.is_not_found());
}

#[tokio::test]
async fn finalizer_edit_echoes_unknown_spec_fields() {
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    // Our own state type: the in-process API stores whatever bytes we give it via gRPC create.
    let kind = provider_machine("proxmox");
    let unknown = [0x9a, 0x06, 0x02, b'h', b'i']; // field 99, unknown to us
    let mut bytes = unknown.to_vec();
    let spec = MachineSpec {
        node: "pve1".into(),
        ..Default::default()
    };
    prost::Message::encode_raw(&spec, &mut bytes);
    client
        .state
        .modify(&kind, "m1", "proxmox.ProvisionController", None, |m| {
            m.spec = spec.clone();
            m.unknown_fields = unknown.to_vec();
        })
        .await
        .unwrap();
    let created = omni
        .state
        .get_raw(&kind.namespace, &kind.resource_type, "m1")
        .unwrap();
    assert_eq!(created.spec.unwrap().proto_spec, bytes);
    let what = ResourceRef::of(&kind, "m1");
    client.state.set_finalizer(&what, "x", true).await.unwrap();
    client.state.set_finalizer(&what, "x", false).await.unwrap();
    let stored = omni
        .state
        .get_raw(&kind.namespace, &kind.resource_type, "m1")
        .unwrap();
    assert_eq!(stored.spec.unwrap().proto_spec, bytes);
    assert_eq!(stored.metadata.unwrap().version, "3");
}

#[tokio::test]
async fn teardown_by_rpc_and_by_fallback() {
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    let owner = provision_controller_name("proxmox");
    let kind = provider_machine("proxmox");
    for id in ["a", "b"] {
        client
            .state
            .create(
                &kind,
                &Typed::fresh(&kind, id, MachineSpec::default()),
                &owner,
            )
            .await
            .unwrap();
    }
    client
        .state
        .set_finalizer(&ResourceRef::of(&kind, "a"), "keep", true)
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
        .set_finalizer(&ResourceRef::of(&kind, "a"), "keep", false)
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
        .teardown(&ResourceRef::of(&MACHINE_REQUEST, "r1"), "")
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
        .modify(&MACHINE_REQUEST_STATUS, "r1", &owner, None, |r| {
            r.spec.stage = specs::machine_request_status_spec::Stage::Provisioning as i32;
        })
        .await
        .unwrap();
    assert_eq!(status.label(label::INFRA_PROVIDER_ID), Some("proxmox"));
    // Omni adds its finalizer behind our back: our stale copy conflicts.
    let err = client
        .state
        .update(&MACHINE_REQUEST_STATUS, &status, &owner, None)
        .await;
    assert!(err.is_ok());
    let err = client
        .state
        .update(&MACHINE_REQUEST_STATUS, &status, &owner, None)
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    let done = client
        .state
        .modify(&MACHINE_REQUEST_STATUS, "r1", &owner, None, |r| {
            r.spec.status = "Provision Complete".into()
        })
        .await
        .unwrap();
    assert_eq!(done.spec.status, "Provision Complete");

    // Other providers' private namespaces and wrong type suffixes.
    let err = client
        .state
        .list(&provider_machine("other"), &[])
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::PermissionDenied { .. }), "{err}");
    let err = client
        .state
        .list(
            &Kind::<MachineSpec>::omni(
                "infra-provider:proxmox",
                "Machine.other.infraprovider.sidero.dev",
            ),
            &[],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::InvalidArgument { .. }), "{err}");
    // Read-only elsewhere.
    let cfg = client
        .state
        .get(&SIDEROLINK_API_CONFIG, SIDEROLINK_CONFIG_ID)
        .await
        .unwrap();
    assert_eq!(cfg.spec.events_port, 8091);
    let err = client
        .state
        .update(&SIDEROLINK_API_CONFIG, &cfg, "", None)
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::PermissionDenied { .. }), "{err}");
    let join = client
        .state
        .get(&PROVIDER_JOIN_CONFIG, "proxmox")
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
        &FEATURES_CONFIG,
        FEATURES_CONFIG_ID,
        &specs::FeaturesConfigSpec {
            image_factory_base_url: "https://factory.internal.example".into(),
        },
        BTreeMap::new(),
    );
    let client = omni.client("proxmox");
    let features = client
        .state
        .get(&FEATURES_CONFIG, FEATURES_CONFIG_ID)
        .await
        .unwrap();
    assert_eq!(
        features.spec.image_factory_base_url,
        "https://factory.internal.example"
    );
    let err = client
        .state
        .update(&FEATURES_CONFIG, &features, "", None)
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::PermissionDenied { .. }), "{err}");

    let owner = provision_controller_name("proxmox");
    let patch = client
        .state
        .modify(
            &CONFIG_PATCH_REQUEST,
            "000-hostname-r1",
            &owner,
            None,
            |p| {
                p.metadata
                    .labels
                    .insert(label::MACHINE_REQUEST.into(), "r1".into());
                p.spec.data = "machine: {}".into();
            },
        )
        .await
        .unwrap();
    assert_eq!(patch.label(label::INFRA_PROVIDER_ID), Some("proxmox"));
    let found = client
        .state
        .list(&CONFIG_PATCH_REQUEST, &[(label::MACHINE_REQUEST, "r1")])
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert!(
        client
            .state
            .teardown(
                &ResourceRef::of(&CONFIG_PATCH_REQUEST, "000-hostname-r1"),
                &owner
            )
            .await
            .unwrap()
    );
    client
        .state
        .destroy(
            &ResourceRef::of(&CONFIG_PATCH_REQUEST, "000-hostname-r1"),
            &owner,
        )
        .await
        .unwrap();
    assert!(
        omni.state
            .get(&CONFIG_PATCH_REQUEST, "000-hostname-r1")
            .is_none()
    );

    let err = client
        .state
        .list(
            &Kind::<MachineSpec>::omni("infra-provider", "Clusters.omni.sidero.dev"),
            &[],
        )
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

/// The leader lease: a type of our own in the provider's namespace, which Omni allows there only
/// with the `.<id>.infraprovider.sidero.dev` suffix (siderolabs/omni
/// `internal/backend/runtime/omni/infraprovider/state.go`, `checkNamespaceAndType`), changed only by
/// versioned updates (COSI's Update refuses a stale version), and invisible to other providers.
#[tokio::test]
async fn the_leader_lease_lives_in_the_providers_namespace_and_changes_only_by_version() {
    use omni_infra_provider_proxmox::omni::proto::provider::LeaseSpec;
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    let lease = provider_lease("proxmox");
    assert_eq!(lease.namespace, "infra-provider:proxmox");
    let spec = LeaseSpec {
        holder: "a/1/x".into(),
        lease_duration_ms: 15_000,
        ..Default::default()
    };
    let created = client
        .state
        .create(&lease, &Typed::fresh(&lease, LEASE_ID, spec.clone()), "")
        .await
        .unwrap();
    // A second create loses: the lease exists.
    let err = client
        .state
        .create(&lease, &Typed::fresh(&lease, LEASE_ID, spec.clone()), "")
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::AlreadyExists { .. }), "{err}");
    // Two replicas update from the same version: the first wins, the second conflicts.
    let mut mine = created.clone();
    mine.spec.holder = "b/2/y".into();
    client.state.update(&lease, &mine, "", None).await.unwrap();
    let mut theirs = created.clone();
    theirs.spec.holder = "c/3/z".into();
    let err = client
        .state
        .update(&lease, &theirs, "", None)
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    let stored = client.state.get(&lease, LEASE_ID).await.unwrap();
    assert_eq!(stored.spec.holder, "b/2/y");
    assert!(
        omni.state
            .get(&lease, LEASE_ID)
            .is_some_and(|l| l.spec.holder == "b/2/y")
    );
    // Another provider's lease type in our namespace is refused.
    let other = provider_lease("other");
    let err = client
        .state
        .create(&other, &Typed::fresh(&other, LEASE_ID, spec.clone()), "")
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StateError::PermissionDenied { .. } | StateError::InvalidArgument { .. }
        ),
        "{err}"
    );
}

/// COSI's TeardownAndDestroy tears down, waits on the server until no finalizer holds the
/// resource, then destroys it (cosi-project/runtime `pkg/state/wrap.go` TeardownAndDestroy,
/// `pkg/state/protobuf/server/server.go`): a prompt release costs one call. A finalizer held
/// beyond the wait leaves the resource torn down for the caller to destroy later; a missing
/// resource is gone; Omni before 1.8 (no such RPC) gets Teardown and Destroy.
#[tokio::test]
async fn teardown_and_destroy_is_one_call_for_a_prompt_release() {
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    let owner = provision_controller_name("proxmox");
    let kind = provider_machine("proxmox");
    for id in ["prompt", "held", "old"] {
        client
            .state
            .create(
                &kind,
                &Typed::fresh(&kind, id, MachineSpec::default()),
                &owner,
            )
            .await
            .unwrap();
    }
    for id in ["prompt", "held"] {
        client
            .state
            .set_finalizer(&ResourceRef::of(&kind, id), "keep", true)
            .await
            .unwrap();
    }
    let releaser = omni.client("proxmox");
    let release = tokio::spawn(async move {
        let what = ResourceRef::of(&provider_machine("proxmox"), "prompt");
        for _ in 0..100 {
            if releaser
                .state
                .get_raw(&what)
                .await
                .unwrap()
                .metadata
                .unwrap()
                .phase
                == "tearingDown"
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        releaser
            .state
            .set_finalizer(&what, "keep", false)
            .await
            .unwrap();
    });
    let calls = |m: &str| omni.state.calls(&format!("/cosi.resource.State/{m}"));
    let (teardowns, destroys) = (calls("Teardown"), calls("Destroy"));
    let remove = |id: &'static str, wait_ms: u64| {
        let (state, what, owner) = (&client.state, ResourceRef::of(&kind, id), &owner);
        async move {
            let wait = Duration::from_millis(wait_ms);
            state
                .teardown_and_destroy(&what, owner, wait)
                .await
                .unwrap()
        }
    };
    assert!(remove("prompt", 5000).await);
    release.await.unwrap();
    assert!(omni.state.get(&kind, "prompt").is_none());
    assert_eq!(calls("TeardownAndDestroy"), 1);
    assert_eq!((calls("Teardown"), calls("Destroy")), (teardowns, destroys));

    assert!(!remove("held", 200).await, "held beyond the wait");
    assert!(omni.state.get(&kind, "held").unwrap().is_tearing_down());
    assert!(remove("missing", 1000).await, "a missing resource is gone");

    omni.state.set_teardown_unimplemented(true);
    assert!(remove("old", 1000).await);
    assert!(omni.state.get(&kind, "old").is_none());
    assert_eq!(calls("Destroy"), destroys + 1, "the fallback destroys");
}

/// Our finalizer leaves a MachineRequest in one Update from the copy the watch delivered, its spec
/// echoed as received (Omni refuses a provider's update of a request that changes anything but
/// finalizers: siderolabs/omni `internal/backend/runtime/omni/infraprovider/state.go`
/// resourcesAreEqual). A copy older than the stored request conflicts on its version and is
/// replaced by a fresh read, so another controller's finalizer is never dropped.
#[tokio::test]
async fn a_finalizer_leaves_the_delivered_copy_in_one_update() {
    let omni = Omni::start("proxmox").await;
    let client = omni.client("proxmox");
    omni.state
        .create_machine_request("r1", "proxmox", "set", &request_spec("v1.11.0"));
    let what = ResourceRef::of(&MACHINE_REQUEST, "r1");
    let fin = provision_controller_name("proxmox");
    client.state.set_finalizer(&what, &fin, true).await.unwrap();
    let delivered = client.state.get(&MACHINE_REQUEST, "r1").await.unwrap();
    let calls = |m: &str| omni.state.calls(&format!("/cosi.resource.State/{m}"));
    let (gets, updates) = (calls("Get"), calls("Update"));
    client
        .state
        .remove_finalizer_from(&delivered, &fin)
        .await
        .unwrap();
    assert_eq!((calls("Get"), calls("Update")), (gets, updates + 1));
    let stored = omni.state.get(&MACHINE_REQUEST, "r1").unwrap();
    assert!(stored.metadata.finalizers.is_empty());
    assert_eq!(stored.received_spec, delivered.received_spec);

    client.state.set_finalizer(&what, &fin, true).await.unwrap();
    let stale = client.state.get(&MACHINE_REQUEST, "r1").await.unwrap();
    client
        .state
        .set_finalizer(&what, "Omni.Other", true)
        .await
        .unwrap();
    client
        .state
        .remove_finalizer_from(&stale, &fin)
        .await
        .unwrap();
    let stored = omni.state.get(&MACHINE_REQUEST, "r1").unwrap();
    assert_eq!(stored.metadata.finalizers, vec!["Omni.Other".to_owned()]);
}

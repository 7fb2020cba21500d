//! The watch when the world goes wrong: a server restart, an unknown or compacted bookmark.

use super::*;

/// A watch of the `proxmox` provider's MachineRequests, as the controller holds it but reconnecting
/// within 200 ms, past its first listing (empty).
async fn provider_watch(omni: &Omni) -> mpsc::Receiver<Result<WatchEvent, StateError>> {
    let mut state = omni.client("proxmox").state;
    state.reconnect = (Duration::from_millis(20), Duration::from_millis(200));
    let mut rx = state.watch_kind(&MACHINE_REQUEST, &[(label::INFRA_PROVIDER_ID, "proxmox")]);
    assert_eq!(next_event(&mut rx).await, WatchEvent::Bootstrapped);
    rx
}

#[tokio::test]
async fn watch_survives_a_server_restart() {
    let mut omni = Omni::start("proxmox").await;
    let mut rx = provider_watch(&omni).await;
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
    let mut state = client.state.clone();
    state.reconnect = (Duration::from_millis(20), Duration::from_millis(200));
    omni.state
        .create_machine_request("r1", "proxmox", "set", &request_spec("v1"));
    let mut rx = state.watch_kind(&MACHINE_REQUEST, &[]);
    assert_eq!(id_of(&next_event(&mut rx).await), "r1");
    assert_eq!(next_event(&mut rx).await, WatchEvent::Bootstrapped);
    // A brand-new Omni on the same port: our bookmark means nothing there.
    omni.stop().await;
    let fresh = testkit::memstate::MemState::new();
    fresh.register_key(&omni.encoded_key).unwrap();
    fresh.put(
        &testkit::memstate::INFRA_PROVIDER,
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
    let signer = transport::Signer {
        key: omni.key.clone(),
        provider_id: Some("proxmox".into()),
    };
    pb::state_client::StateClient::with_interceptor(channel, signer)
}

fn resume_request(bookmark: Vec<u8>) -> pb::WatchRequest {
    pb::WatchRequest {
        namespace: MACHINE_REQUEST.namespace.into(),
        r#type: MACHINE_REQUEST.resource_type.into(),
        id: None,
        options: Some(pb::WatchOptions {
            start_from_bookmark: Some(bookmark),
            label_query: label_query(&[(label::INFRA_PROVIDER_ID, "proxmox")]),
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
/// call itself (FailedPrecondition), so a client that waits only for that would miss the rest.
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
    let mut rx = provider_watch(&omni).await;
    omni.state
        .create_machine_request("before", "proxmox", "set", &request_spec("v1"));
    assert_eq!(id_of(&next_event(&mut rx).await), "before");
    omni.stop().await;
    // While the watch is down: one request is removed by force, one is created, and the history
    // both happened in is compacted away.
    omni.state
        .create_machine_request("during", "proxmox", "set", &request_spec("v1"));
    assert!(omni.state.remove(&MACHINE_REQUEST, "before"));
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

/// memstate's fault hook for chaos runs (`MemState::cut_connections`): an open watch stream ends
/// with UNAVAILABLE and the next calls are refused, as a broken connection to Omni does; the client
/// resumes from its bookmark and nothing created meanwhile is missed.
#[tokio::test]
async fn a_cut_connection_ends_the_watch_and_refuses_calls_then_the_watch_resumes() {
    let omni = Omni::start("proxmox").await;
    let mut raw = raw_state(&omni);
    let mut stream = raw
        .watch(resume_request(0u64.to_be_bytes().to_vec()))
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().unwrap().event.is_empty());
    omni.state.cut_connections(2);
    let ended = stream.message().await.unwrap_err();
    assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");
    for _ in 0..2 {
        let refused = raw
            .watch(resume_request(0u64.to_be_bytes().to_vec()))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    }

    let mut rx = provider_watch(&omni).await;
    omni.state.cut_connections(1);
    omni.state
        .create_machine_request("during", "proxmox", "set", &request_spec("v1"));
    let ev = next_event(&mut rx).await;
    assert!(
        matches!(ev, WatchEvent::Created(_)) && id_of(&ev) == "during",
        "{ev:?}"
    );
}

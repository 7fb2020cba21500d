//! Machine classes written to hurt: a selector that costs minutes of CPU, one that panics the CEL
//! parser. Each is refused on its own request, the heartbeat keeps beating while they are read,
//! the other requests are provisioned, and both hostile requests are torn down.

use std::time::Instant;

use omni_infra_provider_proxmox::controller::health;
use omni_infra_provider_proxmox::omni::resources::{INFRA_PROVIDER_HEALTH_STATUS, MACHINE_REQUEST};

use super::*;
use testkit::harness::PROVIDER;

/// Seven nested `all` macros over ten items (252 characters): 10^7 evaluations of the inner
/// condition, over a minute of CPU each time it is evaluated.
const NESTED_MACROS: &str = "[0,1,2,3,4,5,6,7,8,9].all(a,[0,1,2,3,4,5,6,7,8,9].all(b,[0,1,2,3,4,5,6,7,8,9].all(c,[0,1,2,3,4,5,6,7,8,9].all(d,[0,1,2,3,4,5,6,7,8,9].all(e,[0,1,2,3,4,5,6,7,8,9].all(f,[0,1,2,3,4,5,6,7,8,9].all(g,name != \"\" && storageType != \"\" && node != \"xyzw\")))))))";

fn class(selector: &str) -> String {
    format!(
        "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: '{}'\n",
        selector.replace('\'', "''")
    )
}

/// The largest gap between heartbeats Omni saw, sampled until `until` resolves.
async fn widest_heartbeat_gap(
    h: &Harness,
    until: impl std::future::Future<Output = ()>,
) -> Duration {
    let state = h.omni.state.clone();
    let sampling = async move {
        let mut last: Option<(i64, Instant)> = None;
        let mut widest = Duration::ZERO;
        loop {
            let beat = state
                .get(&INFRA_PROVIDER_HEALTH_STATUS, PROVIDER)
                .and_then(|s| s.spec.last_heartbeat_timestamp)
                .map(|t| t.seconds * 1_000_000_000 + i64::from(t.nanos));
            if let Some(beat) = beat {
                match last {
                    Some((seen, _)) if seen == beat => {}
                    _ => last = Some((beat, Instant::now())),
                }
            }
            if let Some((_, at)) = last {
                widest = widest.max(at.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            if widest > Duration::from_secs(30) {
                return widest;
            }
        }
    };
    tokio::select! {
        widest = sampling => widest,
        () = until => Duration::ZERO,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_selectors_fail_their_own_requests_while_the_heartbeat_beats() {
    let mut h = Harness::start("").await;
    let (stop_beating, beating) = tokio::sync::watch::channel(false);
    let (_lead, leader) = tokio::sync::watch::channel(true);
    let heartbeat = health::Heartbeat {
        state: h.omni.client(PROVIDER).state,
        provider_id: PROVIDER.into(),
        interval: Duration::from_millis(100),
        check: tokio::sync::watch::channel(None).1,
        metrics: h.metrics.clone(),
    };
    let heartbeat = tokio::spawn(heartbeat.run(beating, leader.clone()));
    let long = format!("name == \"{}\" &&", "a".repeat(70_000));
    h.request("hostile-macros-1", "hostile", &class(NESTED_MACROS));
    h.request("hostile-macros-2", "hostile", &class(NESTED_MACROS));
    h.request("hostile-long", "hostile", &class(&long));
    h.request("fine-1", "fine", SPREAD);

    let gap = {
        let h = &h;
        let work = async move {
            h.wait_stage("fine-1", Stage::Provisioned).await;
            for id in ["hostile-macros-1", "hostile-macros-2", "hostile-long"] {
                let status = h.wait_stage(id, Stage::Failed).await;
                assert!(
                    status.spec.error.contains("storage_selector"),
                    "{id}: {}",
                    status.spec.error
                );
                assert!(
                    status.spec.error.len() < 2000,
                    "{id}: the selector is not quoted whole: {}",
                    status.spec.error.chars().take(300).collect::<String>()
                );
            }
        };
        widest_heartbeat_gap(h, work).await
    };
    assert!(
        gap < Duration::from_secs(2),
        "the heartbeat stopped for {gap:?}"
    );

    for id in ["hostile-macros-1", "hostile-macros-2", "hostile-long"] {
        assert!(h.omni.state.teardown(&MACHINE_REQUEST, id));
    }
    for id in ["hostile-macros-1", "hostile-macros-2", "hostile-long"] {
        h.wait_released(id).await;
    }
    let _ = stop_beating.send(true);
    heartbeat.await.unwrap();
    h.stop_controller().await;
}

/// A class author asking for a VLAN the operator's `policy:` does not allow: refused on the request
/// with the key and the allowed values, nothing created. Without the policy the same class is
/// provisioned (the token could).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_asking_beyond_the_policy_is_refused_before_anything_is_created() {
    let mut h = Harness::start("policy:\n  vlans: [0, 10-19]\n").await;
    h.request("greedy-1", "greedy", &format!("{SPREAD}vlan: 4000\n"));
    h.request("modest-1", "modest", &format!("{SPREAD}vlan: 12\n"));
    let status = h.wait_stage("greedy-1", Stage::Failed).await;
    let error = status.spec.error;
    assert!(
        error.contains("vlan") && error.contains("policy") && error.contains("10-19"),
        "{error}"
    );
    h.wait_stage("modest-1", Stage::Provisioned).await;
    assert!(h.vms_named("greedy-1").is_empty(), "nothing created");
    h.stop_controller().await;
}

//! Several provider processes against one Omni and one Proxmox: the real binary, the in-memory Omni
//! over real gRPC and fakepve over real HTTPS. Whatever happens to the replicas (nothing, a SIGKILL,
//! a cut from Omni, a SIGTERM), every request gets exactly one VM, made by one replica, and nothing
//! is left behind. Each replica has its own Proxmox token, so fakepve's log of writes says which
//! replica sent what and when.
//!
//! The lease follows client-go's `tools/leaderelection/leaderelection.go` (`tryAcquireOrRenew`,
//! `renew`, `release`): a standby may take a lease it has seen unchanged for a lease duration by
//! its own clock, a leader that has not renewed within the renew deadline stops, and a leader that
//! stops releases the lease so that a standby takes it at once. Omni lets a provider create the
//! lease's type in its own namespace (`internal/backend/runtime/omni/infraprovider/state.go`,
//! `checkNamespaceAndType`), which the in-memory Omni enforces too.

#[path = "../examples/stack/mod.rs"]
mod stack;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::{
    INFRA_PROVIDER_HEALTH_STATUS, MACHINE_REQUEST_STATUS,
};
use serde_json::{Value, json};
use stack::{PROVIDER, Stack, three_node_scenario};
use testkit::until;

/// Short timings, so that a takeover takes seconds: lease 3 s, renew deadline 2 s, looks every
/// 500 ms (the defaults are 15 s, 10 s and 2 s).
const FAST: &[&str] = &[
    "--leader-elect-lease-duration",
    "3s",
    "--leader-elect-renew-deadline",
    "2s",
    "--leader-elect-retry-period",
    "500ms",
    "--health-interval",
    "1s",
];
const RENEW_DEADLINE: Duration = Duration::from_secs(2);

const CLASS: &str =
    "cores: 1\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'storageType == \"lvmthin\"'\n";
const WAIT: Duration = Duration::from_secs(120);

fn roomy_scenario() -> Value {
    let mut scenario = three_node_scenario();
    scenario["nodes"] = json!(
        ["pve1", "pve2", "pve3"]
            .map(|name| json!({"name": name, "maxcpu": 64, "maxmem": 256u64 << 30}))
    );
    scenario
}

/// `replicas` provider processes (behind links a test can cut when `linked`), once one leads.
async fn replicated(replicas: usize, time_scale: f64, linked: bool) -> Stack {
    let mut stack = Stack::start_servers(roomy_scenario(), time_scale, FAST, "")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for _ in 0..replicas {
        stack.add_replica(FAST, linked).unwrap();
    }
    stack.wait_for_a_leader().await.unwrap();
    stack
}

fn request_all(stack: &Stack, ids: &[String]) {
    for id in ids {
        stack.request(id, "replicated", CLASS);
    }
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}-{i:02}")).collect()
}

fn provisioned(stack: &Stack, ids: &[String]) -> bool {
    ids.iter().all(|id| {
        stack
            .omni
            .get(&MACHINE_REQUEST_STATUS, id)
            .is_some_and(|s| s.spec.stage == Stage::Provisioned as i32)
    })
}

/// Every write fakepve saw: (unix seconds, method, path, token).
fn writes(stack: &mut Stack) -> Vec<(f64, String, String, String)> {
    let all = stack.pve.control(json!({"op": "writes"}));
    all.as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            (
                w[0].as_f64().unwrap_or(0.0),
                w[1].as_str().unwrap_or_default().to_owned(),
                w[2].as_str().unwrap_or_default().to_owned(),
                w[3].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The VM creates fakepve was sent: `POST /api2/json/nodes/<node>/qemu`, by token.
fn creates_by_token(stack: &mut Stack) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for (_, method, path, token) in writes(stack) {
        if method == "POST" && path.ends_with("/qemu") {
            *by.entry(token).or_default() += 1;
        }
    }
    by
}

/// Every VM fakepve ever held for each of `ids`: exactly one, never two (not even one after the
/// other).
fn assert_one_vm_each(stack: &mut Stack, ids: &[String]) {
    let record = stack.pve.control(json!({"op": "vm_lifetimes"}));
    let mut by_name: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for vm in record["vms"].as_array().cloned().unwrap_or_default() {
        let name = vm["name"].as_str().unwrap_or_default().to_owned();
        by_name
            .entry(name)
            .or_default()
            .push(vm["vmid"].as_u64().unwrap_or(0));
    }
    for id in ids {
        let vms = by_name.get(id).cloned().unwrap_or_default();
        assert_eq!(vms.len(), 1, "{id} had VMs {vms:?}, not exactly one");
    }
}

/// Requests `n` machines and waits until one of them is being created.
async fn request_and_wait_for_creates(stack: &Stack, prefix: &str, n: usize) -> Vec<String> {
    let machines = ids(prefix, n);
    request_all(stack, &machines);
    until(WAIT, "the first creates", || {
        stack.omni.list(&MACHINE_REQUEST_STATUS).iter().any(|s| {
            s.spec.status.contains("create_vm") || s.spec.stage == Stage::Provisioned as i32
        })
    })
    .await;
    machines
}

async fn until_another_leads(stack: &Stack, first: usize) {
    until(
        Duration::from_secs(20),
        "another replica to take over",
        || stack.leader().is_some_and(|l| l != first),
    )
    .await;
}

/// Every machine provisioned with exactly one VM, torn down, nothing left, every replica stopped
/// cleanly.
async fn finish(mut stack: Stack, machines: &[String]) {
    until(WAIT, "every machine provisioned", || {
        provisioned(&stack, machines)
    })
    .await;
    assert_one_vm_each(&mut stack, machines);
    tear_down_and_check(&mut stack, machines).await;
    stack.stop().await.unwrap();
}

async fn tear_down_and_check(stack: &mut Stack, ids: &[String]) {
    for id in ids {
        stack.tear_down(id);
    }
    let started = Instant::now();
    while !stack.all_released(ids) {
        assert!(
            started.elapsed() < WAIT,
            "teardown did not finish: {:?}",
            stack.leftovers(&[])
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = stack.leftovers(&[]);
    assert!(left.is_empty(), "left behind: {left:?}");
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_make_one_vm_per_request_all_by_the_leader_and_leave_nothing() {
    let mut stack = replicated(3, 0.0, false).await;
    let leader = stack.leader().expect("one replica holds the lease");
    let machines = ids("trio", 20);
    request_all(&stack, &machines);
    until(WAIT, "20 machines provisioned", || {
        provisioned(&stack, &machines)
    })
    .await;
    assert_one_vm_each(&mut stack, &machines);
    let creates = creates_by_token(&mut stack);
    assert_eq!(
        creates.keys().collect::<Vec<_>>(),
        vec![&stack.replicas[leader].token],
        "every create came from the leader: {creates:?}"
    );
    assert_eq!(creates.values().sum::<usize>(), 20, "{creates:?}");
    let writers: BTreeSet<String> = writes(&mut stack).into_iter().map(|w| w.3).collect();
    assert_eq!(
        writers,
        BTreeSet::from([stack.replicas[leader].token.clone()]),
        "standbys write nothing to Proxmox"
    );
    // The roles show: the leader's gauge is 1, the standbys' 0, and every replica is ready.
    for (i, replica) in stack.replicas.iter().enumerate() {
        let metrics = replica.metrics_text().await.unwrap();
        let expected = if i == leader { 1.0 } else { 0.0 };
        assert_eq!(
            gauge(&metrics, "omni_proxmox_leader"),
            Some(expected),
            "{}",
            replica.name
        );
        let (status, body) = replica.readyz().await.unwrap();
        let role = if i == leader { "leader" } else { "standby" };
        assert_eq!((status, body.contains(role)), (200, true), "{body}");
    }
    assert!(
        stack
            .omni
            .get(&INFRA_PROVIDER_HEALTH_STATUS, PROVIDER)
            .is_some()
    );
    tear_down_and_check(&mut stack, &machines).await;
    stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_provisioning_leaves_the_standby_to_finish_without_duplicates() {
    // Tasks take time, so the kill lands while creates, uploads and starts are under way.
    let mut stack = replicated(2, 0.05, false).await;
    let first = stack.leader().unwrap();
    let machines = request_and_wait_for_creates(&stack, "killed", 10).await;
    stack.replicas[first].kill();
    let killed_at = Instant::now();
    until_another_leads(&stack, first).await;
    let takeover = killed_at.elapsed();
    assert!(
        takeover >= Duration::from_secs(1),
        "the standby took the lease {takeover:?} after the kill, before it could have expired"
    );
    finish(stack, &machines).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_omni_goes_quiet_on_proxmox_before_the_standby_acquires() {
    let mut stack = replicated(2, 0.05, true).await;
    let first = stack.leader().unwrap();
    let machines = request_and_wait_for_creates(&stack, "cut", 10).await;
    let cut_at = unix_now();
    stack.replicas[first].link.as_ref().unwrap().cut();
    until_another_leads(&stack, first).await;
    let acquired_at = stack.lease().unwrap().acquire_time_ms as f64 / 1000.0;
    let cut_off = stack.replicas[first].token.clone();
    let last_write = writes(&mut stack)
        .into_iter()
        .filter(|w| w.3 == cut_off)
        .map(|w| w.0)
        .fold(0.0, f64::max);
    assert!(
        last_write < acquired_at,
        "the cut-off leader wrote to Proxmox at {last_write:.3}, after the standby acquired at {acquired_at:.3}"
    );
    assert!(
        last_write < cut_at + RENEW_DEADLINE.as_secs_f64() + 0.5,
        "the cut-off leader kept writing {:.3} s after the cut (renew deadline {RENEW_DEADLINE:?})",
        last_write - cut_at
    );
    // Mended, the old leader finds the lease taken and stays a standby.
    stack.replicas[first].link.as_ref().unwrap().mend();
    until(WAIT, "every machine provisioned", || {
        provisioned(&stack, &machines)
    })
    .await;
    let later = writes(&mut stack)
        .into_iter()
        .filter(|w| w.3 == cut_off && w.0 > acquired_at)
        .count();
    assert_eq!(
        later, 0,
        "the old leader wrote to Proxmox after it lost the lease"
    );
    finish(stack, &machines).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_hands_over_on_sigterm_within_two_seconds_and_loses_nothing() {
    let mut stack = replicated(2, 0.05, false).await;
    let first = stack.leader().unwrap();
    let machines = request_and_wait_for_creates(&stack, "rolling", 8).await;
    // The old replica goes (SIGTERM), the standby takes over, and a new replica starts beside it.
    stack.replicas[first].terminate();
    let terminated = Instant::now();
    until_another_leads(&stack, first).await;
    let handover = terminated.elapsed();
    assert!(
        handover < Duration::from_secs(2),
        "handover after SIGTERM took {handover:?}"
    );
    until(Duration::from_secs(20), "the old replica to exit", || {
        stack.replicas[first].exited().is_some()
    })
    .await;
    assert!(stack.replicas[first].exited().is_some_and(|s| s.success()));
    stack.add_replica(FAST, false).unwrap();
    finish(stack, &machines).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarted_after_a_crash_takes_its_own_lease_back_at_once() {
    // The default timings: a stranger would wait 15 s for the lease.
    let mut stack = Stack::start_servers(roomy_scenario(), 0.0, &[], "")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    stack.add_replica(&[], false).unwrap();
    stack.wait_for_a_leader().await.unwrap();
    let before = stack.lease().unwrap();
    stack.replicas[0].kill();
    let restarted = Instant::now();
    stack.respawn(0, false).unwrap();
    until(
        Duration::from_secs(10),
        "the restarted replica to lead",
        || stack.leader() == Some(0),
    )
    .await;
    assert!(
        restarted.elapsed() < Duration::from_secs(5),
        "took {:?}: the restart waited for its own lease",
        restarted.elapsed()
    );
    let after = stack.lease().unwrap();
    assert_ne!(before.holder, after.holder);
    assert_eq!(after.transitions, before.transitions + 1);
    let machines = ids("restarted", 2);
    request_all(&stack, &machines);
    until(WAIT, "machines provisioned", || {
        provisioned(&stack, &machines)
    })
    .await;
    tear_down_and_check(&mut stack, &machines).await;
    stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_sharing_a_claim_file_never_both_lead() {
    // Both replicas on one "host": the second is started with the first one's claim file, which the
    // first holds locked, so it has no predecessor to claim and must wait the lease out.
    let mut stack = replicated(1, 0.0, false).await;
    let index = stack.add_replica(FAST, false).unwrap();
    stack.replicas[index].kill();
    stack.share_claim(index, 0);
    stack.respawn(index, false).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(stack.leader(), Some(0), "the second copy must not lead");
    // The first crashes: the second, which never held the claim, waits out the lease duration.
    stack.replicas[0].kill();
    let killed = Instant::now();
    until(Duration::from_secs(20), "the second copy to lead", || {
        stack.leader() == Some(index)
    })
    .await;
    assert!(
        killed.elapsed() >= Duration::from_secs(1),
        "the second copy took the lease after {:?}, before it could have expired",
        killed.elapsed()
    );
    stack.stop().await.unwrap();
}

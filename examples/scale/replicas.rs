//! Replicas in the benchmark: what an idle leader writes to Omni, how long a standby takes over
//! after the leader is SIGKILLed, and how long a SIGTERM handover takes while machines are being
//! provisioned, all with the default lease timings (15 s, 10 s, 2 s).

use std::time::{Duration, Instant};

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::MACHINE_REQUEST_STATUS;

use super::Row;
use crate::stack::{self, Stack};

const CLASS: &str = "\
cores: 1
memory: 2048
disk_size: 10
storage_selector: 'storageType == \"lvmthin\"'
";
/// How long the idle leader's writes are counted.
const IDLE_WINDOW: Duration = Duration::from_secs(30);
const IN_FLIGHT: usize = 20;

/// The State calls that change something.
const WRITES: &[&str] = &[
    "/cosi.resource.State/Create",
    "/cosi.resource.State/Update",
    "/cosi.resource.State/Destroy",
    "/cosi.resource.State/Teardown",
];

fn omni_writes(stack: &Stack) -> u64 {
    WRITES.iter().map(|m| stack.omni.calls(m)).sum()
}

async fn until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) -> Result<Duration, String> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > timeout {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(started.elapsed())
}

pub async fn rows() -> Result<Vec<Row>, String> {
    let mut scenario = stack::three_node_scenario();
    scenario["nodes"] = serde_json::json!(["pve1", "pve2", "pve3"].map(|name| serde_json::json!(
        {"name": name, "maxcpu": 64, "maxmem": 256u64 << 30}
    )));
    let args = ["--health-interval", "10s", "--topology-interval", "60m"];
    let mut stack = Stack::start_servers(scenario, 0.05, &args, "").await?;
    stack.add_replica(&args, false)?;
    stack.wait_for_a_leader().await?;
    stack.add_replica(&args, false)?;
    // Both looked at the lease and settled.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut rows = Vec::new();

    let before = omni_writes(&stack);
    tokio::time::sleep(IDLE_WINDOW).await;
    let per_minute = (omni_writes(&stack) - before) as f64 * 60.0 / IDLE_WINDOW.as_secs_f64();
    rows.push(
        Row::new(
            "Omni writes per minute, idle leader and a standby",
            format!("{per_minute:.0}"),
            "<= 30 (lease renews and heartbeats)",
        )
        .judged(per_minute <= 30.0),
    );

    let leader = stack.leader().ok_or("no replica leads")?;
    stack.replicas[leader].kill();
    let takeover = until("a takeover after SIGKILL", Duration::from_secs(60), || {
        stack.leader().is_some_and(|l| l != leader)
    })
    .await?;
    rows.push(
        Row::new(
            "Takeover after the leader is SIGKILLed",
            format!("{:.1} s", takeover.as_secs_f64()),
            "< 20 s (lease 15 s, looks every 2 s)",
        )
        .judged(takeover < Duration::from_secs(20)),
    );

    // A standby again, then a rolling update's SIGTERM while machines are being provisioned.
    stack.respawn(leader, false)?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ids: Vec<String> = (0..IN_FLIGHT).map(|i| format!("handover-{i:02}")).collect();
    for id in &ids {
        stack.request(id, "handover", CLASS);
    }
    until("machines under way", Duration::from_secs(60), || {
        stack
            .omni
            .list(&MACHINE_REQUEST_STATUS)
            .iter()
            .any(|s| s.spec.status.contains("create_vm"))
    })
    .await?;
    let leader = stack.leader().ok_or("no replica leads")?;
    stack.replicas[leader].terminate();
    let handover = until("a handover after SIGTERM", Duration::from_secs(60), || {
        stack.leader().is_some_and(|l| l != leader)
    })
    .await?;
    rows.push(
        Row::new(
            format!("Handover after SIGTERM, {IN_FLIGHT} machines in flight"),
            format!("{:.2} s", handover.as_secs_f64()),
            "< 2 s",
        )
        .judged(handover < Duration::from_secs(2)),
    );
    until(
        "every machine provisioned",
        Duration::from_secs(300),
        || {
            ids.iter().all(|id| {
                stack
                    .omni
                    .get(&MACHINE_REQUEST_STATUS, id)
                    .is_some_and(|s| s.spec.stage == Stage::Provisioned as i32)
            })
        },
    )
    .await?;
    for id in &ids {
        stack.tear_down(id);
    }
    until("every machine released", Duration::from_secs(300), || {
        stack.all_released(&ids)
    })
    .await?;
    let left = stack.leftovers(&[]);
    if !left.is_empty() {
        return Err(format!("the replica runs left behind: {}", left.join(", ")));
    }
    stack.stop().await?;
    Ok(rows)
}

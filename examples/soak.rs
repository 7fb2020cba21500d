//! Churn soak (`make soak`): machines created and torn down in a loop against fakepve with the
//! benchmark's latency and task durations, then checks that nothing grew or slowed down and nothing
//! was left behind.
//!
//! `SOAK_SECS` (default 600) sets how long it churns, `SOAK_MACHINES` (default 50) how many machines
//! each round creates and tears down. Memory and open file descriptors at the end are held against
//! their values after the first minute (or the first tenth of a shorter run); the slowest request of
//! the last round against the slowest of the first. Exits non-zero when a check fails.

mod scale;
mod stack;

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::MACHINE_REQUEST_STATUS;
use scale::Row;
use stack::Stack;

const CLASS: &str = "\
cores: 2
memory: 2048
disk_size: 10
storage_selector: 'storageType == \"lvmthin\"'
";

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One round: when each request became PROVISIONED after it was made, and how long the teardown of
/// all of them took.
struct Round {
    slowest: Duration,
    median: Duration,
    teardown: Duration,
}

/// What the provider holds, sampled after a round.
#[derive(Clone, Copy)]
struct Sample {
    at: Duration,
    rss_kib: u64,
    fds: usize,
}

#[tokio::main]
async fn main() -> ExitCode {
    match soak().await {
        Ok((rows, ok)) => {
            scale::print_report(
                "Churn soak (fakepve: 20 ms per answer, tasks take time; release build)",
                &rows,
            );
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("soak FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn soak() -> Result<(Vec<Row>, bool), String> {
    let duration = Duration::from_secs(env_number("SOAK_SECS", 600));
    let machines = env_number("SOAK_MACHINES", 50) as usize;
    let baseline_after = Duration::from_secs(60).min(duration / 10);
    let args = [
        "--health-interval",
        "10m",
        "--topology-interval",
        "60m",
        "--concurrency",
        "16",
    ];
    let mut stack = Stack::start_with(scale::scenario(&[]), 1.0, &args).await?;
    // Each node downloads the boot image once; that is not what the rounds measure.
    warm_up(&mut stack).await?;
    let started = Instant::now();
    let mut rounds = Vec::new();
    let mut samples = Vec::new();
    let mut baseline: Option<Sample> = None;
    let mut n = 0;
    while started.elapsed() < duration || rounds.len() < 2 {
        let ids: Vec<String> = (0..machines).map(|i| format!("soak-{n}-{i:03}")).collect();
        n += 1;
        let round = churn(&mut stack, &ids).await?;
        eprintln!(
            "soak: round {n} at {:.0} s: slowest {:.2} s, median {:.2} s, teardown {:.1} s, RSS {:.1} MiB, {} fds",
            started.elapsed().as_secs_f64(),
            round.slowest.as_secs_f64(),
            round.median.as_secs_f64(),
            round.teardown.as_secs_f64(),
            stack.provider_rss_kib().unwrap_or(0) as f64 / 1024.0,
            stack.provider_fds().unwrap_or(0),
        );
        rounds.push(round);
        let sample = Sample {
            at: started.elapsed(),
            rss_kib: stack.provider_rss_kib().unwrap_or(0),
            fds: stack.provider_fds().unwrap_or(0),
        };
        if baseline.is_none() && sample.at >= baseline_after {
            baseline = Some(sample);
        }
        samples.push(sample);
    }
    scale::leftovers(&mut stack, &warm_ids()).await?;
    let (Some(first), Some(last), Some(end)) = (rounds.first(), rounds.last(), samples.last())
    else {
        return Err("no round finished".into());
    };
    let base = baseline.unwrap_or(samples[0]);
    let within = |end: f64, base: f64| end <= base * 1.1;
    let mut rows = vec![
        Row::new(
            "Rounds",
            format!(
                "{} of {machines} machines in {:.0} s",
                rounds.len(),
                started.elapsed().as_secs_f64()
            ),
            "-",
        ),
        Row::new(
            "RSS at the end",
            format!(
                "{:.1} MiB (after {:.0} s: {:.1} MiB)",
                end.rss_kib as f64 / 1024.0,
                base.at.as_secs_f64(),
                base.rss_kib as f64 / 1024.0
            ),
            "within 10%",
        )
        .judged(within(end.rss_kib as f64, base.rss_kib as f64)),
        Row::new(
            "Open file descriptors at the end",
            format!(
                "{} (after {:.0} s: {})",
                end.fds,
                base.at.as_secs_f64(),
                base.fds
            ),
            "within 10%",
        )
        .judged(within(end.fds as f64, base.fds as f64)),
        Row::new(
            "Slowest request, last round",
            format!(
                "{:.2} s (first round: {:.2} s)",
                last.slowest.as_secs_f64(),
                first.slowest.as_secs_f64()
            ),
            "no slower than the first (10% for noise)",
        )
        .judged(within(
            last.slowest.as_secs_f64(),
            first.slowest.as_secs_f64(),
        )),
        Row::new(
            "Median request, last round",
            format!(
                "{:.2} s (first round: {:.2} s)",
                last.median.as_secs_f64(),
                first.median.as_secs_f64()
            ),
            "-",
        ),
        Row::new(
            "Teardown of a round, last",
            format!(
                "{:.1} s (first round: {:.1} s)",
                last.teardown.as_secs_f64(),
                first.teardown.as_secs_f64()
            ),
            "-",
        ),
        Row::new("Left behind (VMs, seed ISOs, Omni resources)", "0", "0").judged(true),
    ];
    let ok = rows.iter().all(|r| r.ok != Some(false));
    rows.push(Row::new(
        "  provider CPU over the soak",
        format!(
            "{:.1} s (fakepve: {:.1} s)",
            stack.provider_cpu().unwrap_or_default().as_secs_f64(),
            stack.fakepve_cpu().unwrap_or_default().as_secs_f64()
        ),
        "-",
    ));
    stack.stop().await?;
    Ok((rows, ok))
}

fn warm_ids() -> Vec<String> {
    ["pve1", "pve2", "pve3"]
        .map(|n| format!("soak-warm-{n}"))
        .to_vec()
}

async fn warm_up(stack: &mut Stack) -> Result<(), String> {
    let ids = warm_ids();
    for (id, node) in ids.iter().zip(["pve1", "pve2", "pve3"]) {
        stack.request(id, "soak", &format!("{CLASS}node: {node}\n"));
    }
    let started = Instant::now();
    while provisioned_at(stack, &ids, &mut HashMap::new(), started) < ids.len() {
        if started.elapsed() > Duration::from_secs(120) {
            return Err("the warm-up machines were not provisioned".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Notes in `done` when each of `ids` is first seen PROVISIONED; returns how many are.
fn provisioned_at(
    stack: &Stack,
    ids: &[String],
    done: &mut HashMap<String, Duration>,
    since: Instant,
) -> usize {
    for status in stack.omni.list(&MACHINE_REQUEST_STATUS) {
        if status.spec.stage == Stage::Provisioned as i32 && ids.iter().any(|id| id == status.id())
        {
            done.entry(status.id().to_owned())
                .or_insert_with(|| since.elapsed());
        }
    }
    done.len()
}

/// Requests every one of `ids`, waits until all are PROVISIONED, tears them all down, waits until
/// Omni has deleted them.
async fn churn(stack: &mut Stack, ids: &[String]) -> Result<Round, String> {
    let deadline = Duration::from_secs(300);
    let started = Instant::now();
    for id in ids {
        stack.request(id, "soak", CLASS);
    }
    let mut done = HashMap::new();
    while provisioned_at(stack, ids, &mut done, started) < ids.len() {
        if started.elapsed() > deadline {
            return Err(format!(
                "{} of {} provisioned in {} s; provider log: {}",
                done.len(),
                ids.len(),
                deadline.as_secs(),
                stack.log().display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut times: Vec<Duration> = done.into_values().collect();
    times.sort();
    let teardown = scale::tear_down(stack, ids).await?.took;
    Ok(Round {
        slowest: times.last().copied().unwrap_or_default(),
        median: times.get(times.len() / 2).copied().unwrap_or_default(),
        teardown,
    })
}

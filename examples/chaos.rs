//! Chaos run (`make chaos`): the release provider binary against fakepve (real task durations,
//! latency) and the in-memory Omni, machines provisioned and torn down while a seeded schedule
//! kills the provider, breaks Proxmox and Omni connections and injects Proxmox's real errors; then
//! every invariant is checked (see `docs/chaos.md`).
//!
//! `chaos [--seed N] [--runs K] [--short] [--replicas R]`: K runs (default 1) with seed N, N+1, …
//! (default: from the clock), each with R provider processes (default 1; with more, the faults kill
//! and cut whichever leads). Each run prints its seed and schedule first; `--seed N` replays it.
//! Exits non-zero when any run broke an invariant.

mod stack;

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use stack::chaos::{Options, describe, run};

#[tokio::main]
async fn main() -> ExitCode {
    let mut seed: Option<u64> = None;
    let mut runs = 1u64;
    let mut short = false;
    let mut replicas = 1u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = |name: &str, v: Option<String>| -> Result<u64, String> {
            v.as_deref()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        let parsed = match arg.as_str() {
            "--seed" => value("--seed", args.next()).map(|v| seed = Some(v)),
            "--runs" => value("--runs", args.next()).map(|v| runs = v.max(1)),
            "--replicas" => value("--replicas", args.next()).map(|v| replicas = v.clamp(1, 4)),
            "--short" => {
                short = true;
                Ok(())
            }
            other => Err(format!(
                "unknown argument {other:?}; usage: chaos [--seed N] [--runs K] [--short] [--replicas R]"
            )),
        };
        if let Err(e) = parsed {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    }
    let first = seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() % 100_000)
            .unwrap_or(1)
    });
    let mut summary = Vec::new();
    let mut failed = false;
    for seed in first..first + runs {
        let opts = if short {
            Options::short(seed)
        } else {
            Options::full(seed)
        }
        .with_replicas(replicas as usize);
        let line = match run(&opts).await {
            Ok(report) => {
                failed |= !report.violations.is_empty();
                describe(&report)
            }
            Err(e) => {
                failed = true;
                format!("chaos seed {seed} could not run: {e}")
            }
        };
        println!("\n{line}\n");
        summary.push(line);
    }
    println!("Summary:\n{}", summary.join("\n"));
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

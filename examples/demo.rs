//! The provider doing its job, on a machine with no Proxmox and no Omni (`make demo`).
//!
//! Starts fakepve with a three-node cluster and a Talos template, the in-memory Omni, and the real
//! provider binary; asks for five machines from two machine classes (two pinned to pve2, three spread
//! over the cluster); shows their progress live as Omni would; tears them all down; and prints where
//! each VM landed, how long each step took and how many Proxmox API calls it all cost.
//! Exits 0 only if every machine was provisioned and everything was cleaned up.

mod stack;

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::{MachineRequestStatus, ProviderMachine};
use stack::{PROVIDER, Stack};

/// Two machine classes, as a user would write them in Omni.
const CONTROL_PLANE: &str = "\
cores: 2
memory: 4096
disk_size: 20
storage_selector: 'name == \"local-lvm\"'
node: pve2
tags: [control-plane]
";
const WORKERS: &str = "\
cores: 2
memory: 2048
disk_size: 10
storage_selector: 'storageType == \"lvmthin\" && availableSpace > 10u * 1024u * 1024u * 1024u'
placement_strategy: spread
";

const DEADLINE: Duration = Duration::from_secs(120);

struct Machine {
    id: String,
    class: &'static str,
    /// When each step was first seen running, and when the machine was provisioned.
    steps: Vec<(String, Instant)>,
    provisioned: Option<Instant>,
    last_text: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\ndemo FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    println!("Starting fakepve (3 nodes, template 9000), the in-memory Omni and the provider...");
    // Tasks take a little real time (as on a real cluster), so the progress is visible.
    let mut stack = Stack::start(0.02, &["--concurrency", "4"]).await?;
    println!(
        "Provider connected. Metrics at http://{}/metrics\n",
        stack.metrics()
    );
    stack.reset_proxmox_requests();

    let mut machines: Vec<Machine> = Vec::new();
    for (i, class) in [("cp", CONTROL_PLANE), ("cp", CONTROL_PLANE)]
        .iter()
        .enumerate()
    {
        machines.push(new_machine(
            &stack,
            &format!("{}-demo{i}", class.0),
            "control-plane",
            class.1,
        ));
    }
    for i in 0..3 {
        machines.push(new_machine(
            &stack,
            &format!("workers-demo{i}"),
            "workers",
            WORKERS,
        ));
    }
    let started = Instant::now();
    let tty = std::io::stdout().is_terminal();
    let mut drawn = 0;
    loop {
        let all_done = observe(&stack, &mut machines);
        drawn = draw(&stack, &machines, drawn, tty);
        if all_done {
            break;
        }
        if started.elapsed() > DEADLINE {
            return Err(format!(
                "not every machine was provisioned within {DEADLINE:?}; provider log: {}",
                stack.log().display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let provision_time = started.elapsed();
    let provision_calls = stack.proxmox_requests().len();
    let placements = placements(&stack, &machines);

    println!(
        "\nAll {} machines provisioned in {:.1}s. Tearing everything down...",
        machines.len(),
        provision_time.as_secs_f64()
    );
    stack.reset_proxmox_requests();
    let ids: Vec<String> = machines.iter().map(|m| m.id.clone()).collect();
    let teardown_started = Instant::now();
    for id in &ids {
        stack.tear_down(id);
    }
    while !stack.all_released(&ids) {
        if teardown_started.elapsed() > DEADLINE {
            return Err("teardown did not finish".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let teardown_time = teardown_started.elapsed();
    let teardown_calls = stack.proxmox_requests().len();
    let leftovers = leftovers(&mut stack, &ids);

    let steps = stack.step_seconds().await.unwrap_or_default();
    summary(
        &machines,
        &steps,
        &placements,
        provision_time,
        provision_calls,
        teardown_time,
        teardown_calls,
    );
    stack.stop().await?;
    if !leftovers.is_empty() {
        return Err(format!("left behind: {}", leftovers.join(", ")));
    }
    println!("\nEverything provisioned and cleaned up. Demo OK.");
    Ok(())
}

fn new_machine(stack: &Stack, id: &str, class: &'static str, data: &str) -> Machine {
    stack.request(id, class, data);
    Machine {
        id: id.to_owned(),
        class,
        steps: Vec::new(),
        provisioned: None,
        last_text: "requested".into(),
    }
}

/// Reads every status; true once all are provisioned.
fn observe(stack: &Stack, machines: &mut [Machine]) -> bool {
    let mut all = true;
    for m in machines.iter_mut() {
        let Some(status) = stack.omni.get(&MachineRequestStatus, &m.id) else {
            all = false;
            continue;
        };
        m.last_text = if status.spec.error.is_empty() {
            status.spec.status.clone()
        } else {
            format!("{} ({})", status.spec.status, status.spec.error)
        };
        if let Some(step) = step_name(&status.spec.status)
            && m.steps.last().map(|(s, _)| s.as_str()) != Some(step)
            && !m.steps.iter().any(|(s, _)| s == step)
        {
            m.steps.push((step.to_owned(), Instant::now()));
        }
        if status.spec.stage == Stage::Provisioned as i32 {
            m.provisioned.get_or_insert_with(Instant::now);
        } else {
            all = false;
        }
    }
    all
}

/// `Running step 3/6 create_vm: ...` -> `create_vm`.
fn step_name(text: &str) -> Option<&str> {
    let rest = text.strip_prefix("Running step ")?;
    let after_number = rest.split_once(' ')?.1;
    Some(
        after_number
            .split(':')
            .next()
            .unwrap_or(after_number)
            .trim(),
    )
}

fn draw(stack: &Stack, machines: &[Machine], previous: usize, tty: bool) -> usize {
    let mut lines = vec![format!(
        "{:<16} {:<14} {:<12} {:<6} {}",
        "MACHINE", "CLASS", "STAGE", "NODE", "PROGRESS"
    )];
    for m in machines {
        let status = stack.omni.get(&MachineRequestStatus, &m.id);
        let stage = match status.as_ref().map(|s| s.spec.stage) {
            Some(s) if s == Stage::Provisioned as i32 => "provisioned",
            Some(s) if s == Stage::Failed as i32 => "FAILED",
            Some(_) => "provisioning",
            None => "queued",
        };
        let node = stack
            .omni
            .get(&ProviderMachine::new(PROVIDER), &m.id)
            .map(|s| s.spec.node)
            .unwrap_or_default();
        let mut text = m.last_text.clone();
        text.truncate(70);
        lines.push(format!(
            "{:<16} {:<14} {:<12} {:<6} {}",
            m.id, m.class, stage, node, text
        ));
    }
    let mut out = std::io::stdout().lock();
    if tty {
        if previous > 0 {
            let _ = write!(out, "\x1b[{previous}A");
        }
        for l in &lines {
            let _ = writeln!(out, "\x1b[2K{l}");
        }
        let _ = out.flush();
        lines.len()
    } else {
        // In a log, print only what changed.
        static LAST: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
        for l in lines.iter().skip(1) {
            if !last.contains(l) {
                let _ = writeln!(out, "{l}");
            }
        }
        *last = lines;
        0
    }
}

fn placements(stack: &Stack, machines: &[Machine]) -> BTreeMap<String, (String, i32, Vec<String>)> {
    machines
        .iter()
        .filter_map(|m| {
            let s = stack.omni.get(&ProviderMachine::new(PROVIDER), &m.id)?;
            Some((m.id.clone(), (s.spec.node, s.spec.vmid, s.spec.addresses)))
        })
        .collect()
}

/// VMs or seed ISOs of the demo machines still in fakepve.
fn leftovers(stack: &mut Stack, ids: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    let vms = stack.pve.control(serde_json::json!({"op": "vms"}));
    for vm in vms.as_array().into_iter().flatten() {
        if let Some(name) = vm["name"].as_str()
            && ids.iter().any(|id| id == name)
        {
            left.push(format!("VM {} ({name})", vm["vmid"]));
        }
    }
    let volumes = stack
        .pve
        .control(serde_json::json!({"op": "storage_volumes", "storage": "local"}));
    for v in volumes.as_array().into_iter().flatten() {
        if let Some(v) = v.as_str()
            && v.contains("omni-seed-")
        {
            left.push(format!("seed ISO {v}"));
        }
    }
    left
}

fn summary(
    machines: &[Machine],
    steps: &[(String, f64, u64)],
    placements: &BTreeMap<String, (String, i32, Vec<String>)>,
    provision_time: Duration,
    provision_calls: usize,
    teardown_time: Duration,
    teardown_calls: usize,
) {
    println!("\nWhere each VM landed:");
    for m in machines {
        let (node, vmid, addrs) = placements.get(&m.id).cloned().unwrap_or_default();
        println!(
            "  {:<16} {:<14} VM {vmid:<5} on {node}  {}",
            m.id,
            m.class,
            addrs.join(", ")
        );
    }
    println!("\nTime per step run (average, from the provider's /metrics):");
    for (step, sum, count) in steps {
        println!(
            "  {step:<14} {:>7.1} ms  ({count} runs)",
            sum * 1000.0 / (*count).max(1) as f64
        );
    }
    println!("\nProxmox API calls:");
    println!(
        "  provisioning {} machines: {provision_calls} ({:.1} per machine) in {:.1}s",
        machines.len(),
        provision_calls as f64 / machines.len() as f64,
        provision_time.as_secs_f64()
    );
    println!(
        "  tearing them down:        {teardown_calls} ({:.1} per machine) in {:.1}s",
        teardown_calls as f64 / machines.len() as f64,
        teardown_time.as_secs_f64()
    );
}

//! The provider doing its job, on a machine with no Proxmox and no Omni (`make demo`).
//!
//! Starts fakepve with a three-node cluster and a Talos template, the in-memory Omni, and the real
//! provider binary; asks for five machines from two machine classes (two pinned to pve2, three spread
//! over the cluster); shows their progress live as Omni would; tears them all down; and prints where
//! each VM landed and why (what placement said), how long each step took and how many Proxmox API
//! calls it all cost, sorted by what they were for.
//! Exits 0 only if every machine was provisioned and everything was cleaned up.

mod stack;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::{MACHINE_REQUEST_STATUS, provider_machine};
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
    watch_until_provisioned(&stack, &mut machines, started).await?;
    let provision_time = started.elapsed();
    let provision_requests = stack.proxmox_requests();
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
    let reasons = placement_reasons(&std::fs::read_to_string(stack.log()).unwrap_or_default());
    landed(&machines, &placements, &reasons);
    step_times(&steps);
    println!("\nProxmox API calls:");
    provisioning_calls(machines.len(), &provision_requests, provision_time);
    println!(
        "  tearing them down: {teardown_calls} ({:.1} per machine) in {:.1}s",
        teardown_calls as f64 / machines.len() as f64,
        teardown_time.as_secs_f64()
    );
    stack.stop().await?;
    if !leftovers.is_empty() {
        return Err(format!("left behind: {}", leftovers.join(", ")));
    }
    println!("\nEverything provisioned and cleaned up. Demo OK.");
    Ok(())
}

/// Shows each status change until every machine is provisioned, or fails after [`DEADLINE`].
async fn watch_until_provisioned(
    stack: &Stack,
    machines: &mut [Machine],
    started: Instant,
) -> Result<(), String> {
    println!("Progress as Omni shows it (a line each time a machine's status changes):\n");
    println!(
        "{:>6}  {:<14} {:<14} {:<12} {:<5} STATUS IN OMNI",
        "TIME", "MACHINE", "CLASS", "STAGE", "NODE"
    );
    let mut shown = BTreeMap::new();
    loop {
        let all_done = observe(stack, machines);
        draw(stack, machines, &mut shown, started);
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
        let Some(status) = stack.omni.get(&MACHINE_REQUEST_STATUS, &m.id) else {
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

/// Prints a line for each machine whose stage, node or status text changed since the last call,
/// with the whole status text.
fn draw(
    stack: &Stack,
    machines: &[Machine],
    shown: &mut BTreeMap<String, String>,
    started: Instant,
) {
    let mut out = std::io::stdout().lock();
    for m in machines {
        let status = stack.omni.get(&MACHINE_REQUEST_STATUS, &m.id);
        let stage = match status.as_ref().map(|s| s.spec.stage) {
            Some(s) if s == Stage::Provisioned as i32 => "provisioned",
            Some(s) if s == Stage::Failed as i32 => "FAILED",
            Some(_) => "provisioning",
            None => "queued",
        };
        let node = stack
            .omni
            .get(&provider_machine(PROVIDER), &m.id)
            .map(|s| s.spec.node)
            .unwrap_or_default();
        let line = format!(
            "{:<14} {:<14} {:<12} {:<5} {}",
            m.id, m.class, stage, node, m.last_text
        );
        if shown.get(&m.id) != Some(&line) {
            let _ = writeln!(out, "{:>5.1}s  {line}", started.elapsed().as_secs_f64());
            shown.insert(m.id.clone(), line);
        }
    }
    let _ = out.flush();
}

fn placements(stack: &Stack, machines: &[Machine]) -> BTreeMap<String, (String, i32, Vec<String>)> {
    machines
        .iter()
        .filter_map(|m| {
            let s = stack.omni.get(&provider_machine(PROVIDER), &m.id)?;
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

/// What placement said about each request, from the provider's log: the `reason` of its
/// "automatically picked node" or "using configured node" line.
fn placement_reasons(log: &str) -> BTreeMap<String, String> {
    log.lines()
        .filter(|l| l.contains("picked node request=") || l.contains("configured node request="))
        .filter_map(|l| {
            // The event's own field, not the span's `reconcile{request=…}` before it.
            let request = l.split(" request=").nth(1)?.split_whitespace().next()?;
            let reason = l.split_once("reason=")?.1.trim();
            Some((request.to_owned(), reason.to_owned()))
        })
        .collect()
}

fn landed(
    machines: &[Machine],
    placements: &BTreeMap<String, (String, i32, Vec<String>)>,
    reasons: &BTreeMap<String, String>,
) {
    println!("\nWhere each VM landed, and why (the provider's placement log):\n");
    println!(
        "  {:<14} {:<14} {:<5} {:<5} {:<12} WHY",
        "MACHINE", "CLASS", "VM", "NODE", "ADDRESS"
    );
    for m in machines {
        let (node, vmid, addrs) = placements.get(&m.id).cloned().unwrap_or_default();
        println!(
            "  {:<14} {:<14} {vmid:<5} {node:<5} {:<12} {}",
            m.id,
            m.class,
            addrs.join(", "),
            reasons.get(&m.id).map_or("-", String::as_str)
        );
    }
    println!(
        "\n  `spread` puts a VM on the eligible node with the fewest VMs of its own machine set, then the\n  \
         most free memory. A node without room is not eligible (the reason says why), so two workers\n  \
         can share a node while another holds none of their set."
    );
}

fn step_times(steps: &[(String, f64, u64)]) {
    println!("\nTime per step run (average, from the provider's /metrics):\n");
    println!("  {:<14} {:>10}  RUNS", "STEP", "AVERAGE");
    for (step, sum, count) in steps {
        println!(
            "  {step:<14} {:>7.1} ms  {count}",
            sum * 1000.0 / (*count).max(1) as f64
        );
    }
}

/// What a Proxmox request was for, in the demo's summary.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Purpose {
    /// Read once by the provider process: the token's privileges, the datacenter options, the
    /// cluster's name.
    Once,
    /// The Talos ISO: the ISO storage listed once per node, downloaded once, the download's task.
    Image,
    /// The machine sets' resource pools, made by the first machines of a set.
    Pools,
    /// Everything each machine costs by itself.
    Machine,
}

fn purpose(method: &str, path: &str) -> Purpose {
    let path = path.replace("%3A", ":").replace("%3a", ":");
    let task_type = path
        .split("/tasks/")
        .nth(1)
        .and_then(|upid| upid.split(':').nth(5));
    if ["/access/permissions", "/cluster/options", "/cluster/status"]
        .iter()
        .any(|p| path.ends_with(p))
    {
        Purpose::Once
    } else if path.ends_with("/download-url")
        || (method == "GET" && path.ends_with("/content"))
        || task_type == Some("download")
    {
        Purpose::Image
    } else if method == "POST" && path.ends_with("/pools") {
        Purpose::Pools
    } else {
        Purpose::Machine
    }
}

fn provisioning_calls(machines: usize, requests: &[(String, String)], took: Duration) {
    let mut by_purpose = BTreeMap::<Purpose, usize>::new();
    for (method, path) in requests {
        *by_purpose.entry(purpose(method, path)).or_default() += 1;
    }
    let count = |p| by_purpose.get(&p).copied().unwrap_or(0);
    let own = count(Purpose::Machine);
    println!(
        "  provisioning {machines} machines: {} in {:.1}s ({:.1} per machine), of which",
        requests.len(),
        took.as_secs_f64(),
        requests.len() as f64 / machines as f64
    );
    println!(
        "    {:>3}  once for the provider process: the token's privileges, datacenter options, cluster name",
        count(Purpose::Once)
    );
    println!(
        "    {:>3}  the Talos ISO: ISO storage listed once per node, downloaded once, its task checked",
        count(Purpose::Image)
    );
    println!(
        "    {:>3}  the machine sets' resource pools, made by the first machines of each set",
        count(Purpose::Pools)
    );
    println!(
        "    {own:>3}  the machines themselves: {:.1} each (the README's 8 is this part: a cluster listing,\n         \
         the seed upload, the create and the start, each with its task checked, a guest-agent read; task\n         \
         checks repeat while a task runs)",
        own as f64 / machines as f64
    );
    println!(
        "  So the first machine on a node costs more than 8: it pays for the ISO (and the first of all for\n  \
         the process's reads); later machines on that node cost about 8."
    );
}

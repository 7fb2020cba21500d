//! `pools`: the static IP pools of the config file and who holds their addresses.
//!
//! An address is held by the provider state that records it, so the command reads every provider
//! state of this provider in Omni (and the live MachineRequests, to name allocations whose request is
//! gone), and the addresses running VMs report through their guest agent (one request per running
//! VM), which the provider never hands out either. The counting is [`ip_pool::report`], over the
//! same [`ip_pool::usage`] the allocation uses.
//!
//! `--output json` prints `{"pools": [{"name", "cidr", "ranges", "size", "in_use", "free", "held":
//! [{"address", "request", "nic"}], "reported_by_vms": [...]}], "left_over": {"gone_requests": [...],
//! "unknown_pools": [...]}}`.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use super::omni_args::OmniArgs;
use super::{CliResult, OutputFormat};
use crate::proxmox::ProxmoxClient;
use crate::rules::ip_pool::{self, Holding, LeftOver, PoolUse};

#[derive(Debug, clap::Args)]
pub struct PoolsArgs {
    /// Provider config file with `ipPools:` and the `proxmox:` connection settings.
    #[arg(long, env = "CONFIG_FILE")]
    pub config_file: PathBuf,
    /// `table` for people, `json` for scripts.
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
    /// Omni connection: the provider states hold the allocations.
    #[command(flatten)]
    pub omni: OmniArgs,
}

#[derive(Serialize)]
struct JsonReport {
    pools: Vec<PoolUse>,
    left_over: LeftOver,
}

pub async fn run(args: PoolsArgs) -> CliResult {
    let needs = "pools needs the Omni connection (--omni-api-endpoint and --omni-service-account-key, or OMNI_ENDPOINT and OMNI_SERVICE_ACCOUNT_KEY): the allocations are recorded in the provider states there";
    let reads = ["read the machine requests", "read the provider states"];
    let (config, live, states) =
        super::omni_records(&args.omni, &args.config_file, needs, reads).await?;
    let reported = if config.ip_pools.is_empty() {
        BTreeSet::new()
    } else {
        let pve = ProxmoxClient::new(&config.proxmox)?;
        crate::pipeline::ip_pool::reported_by_agents(&pve).await?
    };
    let (pools, left_over) = ip_pool::report(&config.ip_pools, &states, &reported, &live);
    let report = JsonReport { pools, left_over };
    args.output.print(&report, render_table)
}

/// The table: one block per pool, then what is left over.
fn render_table(JsonReport { pools, left_over }: &JsonReport) -> String {
    let mut out = String::new();
    if pools.is_empty() {
        out.push_str("The config file defines no IP pools (`ipPools:`).\n");
    }
    for u in pools {
        let _ = writeln!(
            out,
            "{}  {}  ranges {}  {} of {} in use, {} free",
            u.name,
            u.cidr,
            u.ranges.join(", "),
            u.in_use,
            u.size,
            u.free
        );
        let reported = u.reported_by_vms.iter().map(|a| {
            vec![
                a.to_string(),
                "(reported by a running VM's guest agent)".into(),
            ]
        });
        let rows = u.held.iter().map(holding_row).chain(reported);
        crate::table::render(&mut out, "  ", &[], rows);
    }
    if !left_over.gone_requests.is_empty() {
        out.push_str("\nAllocations whose machine request is gone (the provider releases them once it has deleted the VM):\n");
        let rows = left_over.gone_requests.iter().map(holding_row);
        crate::table::render(&mut out, "  ", &[], rows);
    }
    if !left_over.unknown_pools.is_empty() {
        out.push_str("\nAllocations from pools the config file no longer has:\n");
        let rows = left_over.unknown_pools.iter().map(|(pool, h)| {
            let mut row = holding_row(h);
            row.push(format!("(pool {pool})"));
            row
        });
        crate::table::render(&mut out, "  ", &[], rows);
    }
    out
}

/// An allocation as a table row: address, request, NIC.
pub(super) fn holding_row(h: &Holding) -> Vec<String> {
    vec![
        h.address.to_string(),
        h.request.to_string(),
        h.nic.to_string(),
    ]
}

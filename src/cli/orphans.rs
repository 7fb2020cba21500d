//! `orphans`: what deprovisioning left behind, and (with `--delete`) getting rid of it.
//!
//! An orphan is a VM carrying our provider tag whose MachineRequest no longer exists in Omni, or a
//! seed ISO (`omni-seed-*.iso`) no VM uses. They appear when a VM was made but its state was lost,
//! when someone removed a request's finalizer by hand, or when a seed ISO delete failed.
//!
//! Deciding "no longer exists" needs the live MachineRequests, so the command connects to Omni with
//! the provider's own flags and refuses to run without them: with no list, every VM would look
//! orphaned. Deletion goes through [`deprovision_reporting`] with its ownership checks (the listing or the
//! description marker must name the request; official-provider VMs without a marker are never
//! deleted from here), and nothing is deleted without `--delete`.
//!
//! The Proxmox cost of a scan: one listing, one config read per VM of ours on an online node, one
//! content listing per ISO storage (once for a shared one).
//!
//! Static IP allocations (`ip_pool`) whose MachineRequest is gone are listed too: they are released
//! when the provider deletes the VM and its state, so one listed here means that has not happened yet.
//! `--delete` does not touch them (the provider's own teardown of the state does).
//!
//! `--output json` prints `{"orphans": {"vms": [...], "seed_isos": [...], "problems": [...]},
//! "ip_allocations": [{"address", "request", "nic"}],
//! "deletion": null | {"deleted_vms": [...], "deleted_isos": [...], "left_alone": [...], "failures": [...]}}`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use super::omni_args::OmniArgs;
use super::pools::holding_row;
use super::{CliResult, OutputFormat};
use crate::model::Listing;
use crate::pipeline::deprovision::{
    DeprovisionOptions, DeprovisionOutcome, DeprovisionTarget, OrphanIso, Orphans,
    TEARDOWN_TASK_TIMEOUT, deprovision_reporting, find_orphans, iso_volumes_in,
};
use crate::proxmox::property::IsoVolume;
use crate::proxmox::types::{NodeName, VmId, content_types};
use crate::proxmox::{ProxmoxClient, ProxmoxError};
use crate::rules::ip_pool::{self, Holding};
use crate::table::or_dash;

#[derive(Debug, clap::Args)]
pub struct OrphansArgs {
    /// Provider config file with the `proxmox:` connection settings.
    #[arg(long, env = "CONFIG_FILE")]
    pub config_file: PathBuf,
    /// Delete the orphans found (VMs after the ownership checks, then unused seed ISOs).
    #[arg(long)]
    pub delete: bool,
    /// With `--delete`: delete even when Omni lists no MachineRequest at all for this provider
    /// while VMs of ours exist (an Omni restored from an old backup, a wrong provider ID or Omni
    /// instance would otherwise make every VM an orphan).
    #[arg(long)]
    pub force: bool,
    /// `table` for people, `json` for scripts.
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
    /// Omni connection: needed to know which requests are live.
    #[command(flatten)]
    pub omni: OmniArgs,
}

const NEEDS_OMNI: &str = "orphans needs the Omni connection (--omni-api-endpoint and --omni-service-account-key, or OMNI_ENDPOINT and OMNI_SERVICE_ACCOUNT_KEY): without the list of live MachineRequests every VM of ours would look orphaned";

/// Whether `--delete` may go ahead: an empty request list while VMs of ours exist looks more like
/// the wrong Omni (or provider ID, or a restored backup) than like every machine gone at once.
fn deletion_allowed(provider_id: &str, live_requests: usize, vms: usize, force: bool) -> CliResult {
    if live_requests == 0 && vms > 0 && !force {
        return Err(format!("Omni lists no MachineRequest for provider {provider_id} at all, yet {vms} VM(s) of ours exist: refusing to delete them all. Check --id and the Omni endpoint; if every one of them really is an orphan, run again with --force").into());
    }
    Ok(())
}

/// What `--delete` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeletionReport {
    pub deleted_vms: Vec<VmId>,
    pub deleted_isos: Vec<String>,
    /// VMs the ownership check refused, with why.
    pub left_alone: Vec<(VmId, String)>,
    pub failures: Vec<String>,
}

/// What the command prints, as JSON or as the table.
#[derive(Serialize)]
struct Report {
    orphans: Orphans,
    ip_allocations: Vec<Holding>,
    deletion: Option<DeletionReport>,
}

pub async fn run(args: OrphansArgs) -> CliResult {
    let reads = ["list the MachineRequests"; 2];
    let (config, live, states) =
        super::omni_records(&args.omni, &args.config_file, NEEDS_OMNI, reads).await?;
    // Those whose MachineRequest is gone (the same counting as the `pools` command).
    let (_, left) = ip_pool::report(&[], &states, &BTreeSet::new(), &live);

    let pve = ProxmoxClient::new(&config.proxmox)?;
    let orphans = scan(&pve, &args.omni.id, &live).await?;
    let deletion = if args.delete {
        deletion_allowed(&args.omni.id, live.len(), orphans.vms.len(), args.force)?;
        let report_line = |line: &str| {
            if args.output == OutputFormat::Table {
                println!("{line}");
            }
        };
        Some(delete(&pve, &args.omni.id, &orphans, &report_line).await)
    } else {
        None
    };
    let report = Report {
        orphans,
        ip_allocations: left.gone_requests,
        deletion,
    };
    (args.output).print(&report, |r| render_table(&args.omni.id, r, live.len()))?;
    match report.deletion.map_or(0, |d| d.failures.len()) {
        0 => Ok(()),
        failed => Err(format!("{failed} orphan(s) could not be deleted (see above)").into()),
    }
}

/// Lists the orphans: one cluster listing, the config of every VM (for the ISOs it uses: a seed ISO
/// attached to any VM, another provider instance's included, is never an orphan), and the ISO
/// content of every storage that holds ISOs. When a VM's config cannot be read, the ISOs it may use
/// are unknown, and no loose seed ISO is listed.
pub async fn scan(
    pve: &ProxmoxClient,
    provider_id: &str,
    live_requests: &BTreeSet<String>,
) -> Result<Orphans, ProxmoxError> {
    let view = pve.cluster_listing().await?;
    let mut problems = Vec::new();
    let used = iso_usage(pve, &view, &mut problems).await;
    // Every VM config was read when reading them added no problem.
    let attachments_known = problems.is_empty();

    let mut isos = Vec::new();
    let mut shared_done = BTreeSet::new();
    let mut offline_nodes = BTreeSet::new();
    for storage in view.storages() {
        let content = storage.content.as_deref().unwrap_or_default();
        let holds_iso = content_types(content).any(|c| c == "iso");
        if !holds_iso || (storage.shared && shared_done.contains(&storage.storage)) {
            continue;
        }
        if !view.node_online(&storage.node) {
            offline_nodes.insert(storage.node.clone());
            continue;
        }
        match pve
            .storage_content(&storage.node, &storage.storage, Some("iso"))
            .await
        {
            Ok(volumes) => {
                if storage.shared {
                    shared_done.insert(storage.storage.clone());
                }
                isos.extend(volumes.into_iter().map(|volume| OrphanIso {
                    node: storage.node.clone(),
                    storage: storage.storage.clone(),
                    volume: volume.volid,
                    size: volume.size,
                }));
            }
            Err(e) => problems.push(format!(
                "cannot list storage {} on {}: {e}",
                storage.storage, storage.node
            )),
        }
    }
    for node in offline_nodes {
        problems.push(format!(
            "node {node} is not online: its ISO storages were not searched"
        ));
    }
    let mut orphans = find_orphans(view.vms(), live_requests, provider_id, &isos, &used);
    if !attachments_known && !orphans.seed_isos.is_empty() {
        problems.push(format!(
            "{} seed ISO(s) no readable VM uses were not listed: a VM whose config could not be read may use them",
            orphans.seed_isos.len()
        ));
        orphans.seed_isos.clear();
    }
    orphans.problems = problems;
    Ok(orphans)
}

/// The ISO volumes each VM's config uses (every VM's: a seed attached to another provider
/// instance's VM is in use too); a config it cannot read is a problem it adds.
async fn iso_usage(
    pve: &ProxmoxClient,
    view: &Listing,
    problems: &mut Vec<String>,
) -> BTreeMap<VmId, Vec<String>> {
    let mut used = BTreeMap::new();
    for vm in view.guests() {
        if !view.node_online(&vm.node) {
            problems.push(format!(
                "node {} is not online: cannot read the config of VM {}",
                vm.node, vm.vmid
            ));
            continue;
        }
        match pve.vm(&vm.node, vm.vmid).config().await {
            Ok(config) => {
                used.insert(vm.vmid, iso_volumes_in(&config));
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => problems.push(format!("cannot read the config of VM {}: {e}", vm.vmid)),
        }
    }
    used
}

/// Deletes what [`scan`] found: VMs through [`deprovision_reporting`] (ownership checked again, official
/// provider VMs refused), then seed ISOs. Failures are collected, not fatal.
pub async fn delete(
    pve: &ProxmoxClient,
    provider_id: &str,
    orphans: &Orphans,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> DeletionReport {
    let mut report = DeletionReport::default();
    let options = DeprovisionOptions {
        listed_vmid: true,
        ..DeprovisionOptions::default()
    };
    for vm in &orphans.vms {
        let Some(request_id) = vm.request_id.clone() else {
            report
                .left_alone
                .push((vm.vmid, "it names no request".into()));
            continue;
        };
        let mut seeds = vm.seed_isos.iter();
        let target = DeprovisionTarget {
            request_id,
            provider_id: provider_id.to_owned(),
            vmid: Some(vm.vmid),
            recorded_node: Some(vm.node.clone()),
            smbios_uuid: None,
            seed_iso_volume: seeds.next().and_then(|v| IsoVolume::parse(v).ok()),
            set_pool: None,
        };
        let done = match deprovision_reporting(pve, &target, &options, progress).await {
            Ok(done) => done,
            Err(e) => {
                report.failures.push(format!("VM {}: {e}", vm.vmid));
                continue;
            }
        };
        match done.outcome {
            DeprovisionOutcome::Deleted { vmid, .. } => report.deleted_vms.push(vmid),
            DeprovisionOutcome::NotOurs { vmid, reason } => {
                report.left_alone.push((vmid, reason));
                continue;
            }
            DeprovisionOutcome::AlreadyGone | DeprovisionOutcome::NothingRecorded => {}
        }
        match done.leftover_seed_iso {
            Some(why) => report.failures.push(why.to_string()),
            None => report
                .deleted_isos
                .extend(target.seed_iso_volume.as_ref().map(ToString::to_string)),
        }
        for volume in seeds {
            delete_iso(pve, &vm.node, volume, progress, &mut report).await;
        }
    }
    for iso in &orphans.seed_isos {
        delete_iso(pve, &iso.node, &iso.volume, progress, &mut report).await;
    }
    report
}

async fn delete_iso(
    pve: &ProxmoxClient,
    node: &NodeName,
    volume: &str,
    progress: &(dyn Fn(&str) + Send + Sync),
    report: &mut DeletionReport,
) {
    let storage = volume.split(':').next().unwrap_or_default();
    progress(&format!("deleting seed ISO {volume} on {node}"));
    let timeout = TEARDOWN_TASK_TIMEOUT;
    let result = match pve.delete_volume(node, storage, volume).await {
        Ok(Some(upid)) => pve.wait_for_task(&upid, timeout).await.map(|_| ()),
        deleted => deleted.map(|_| ()),
    };
    match result {
        Ok(()) => report.deleted_isos.push(volume.to_owned()),
        Err(e) if e.is_not_found() => {}
        Err(e) => report
            .failures
            .push(format!("seed ISO {volume} on {node}: {e}")),
    }
}

fn render_table(provider: &str, report: &Report, live: usize) -> String {
    let (orphans, mut out) = (&report.orphans, String::new());
    let tag = crate::model::identity::provider_tag(provider);
    let _ = writeln!(
        out,
        "{live} live MachineRequest(s) for provider {provider}."
    );
    if orphans.vms.is_empty() {
        let _ = writeln!(out, "No orphan VMs (tag {tag}).");
    } else {
        let _ = writeln!(out, "VMs tagged {tag} whose MachineRequest is gone:");
        let rows = orphans.vms.iter().map(|vm| {
            vec![
                vm.vmid.to_string(),
                vm.node.to_string(),
                or_dash(vm.status.as_ref()),
                or_dash(vm.name.as_ref()),
                or_dash(vm.request_id.as_ref()),
            ]
        });
        let header = ["VMID", "NODE", "STATUS", "NAME", "REQUEST"];
        crate::table::render(&mut out, "", &header, rows);
    }
    if orphans.seed_isos.is_empty() {
        let _ = writeln!(out, "No orphan seed ISOs.");
    } else {
        let _ = writeln!(out, "Seed ISOs no VM uses:");
        let rows = (orphans.seed_isos.iter())
            .map(|iso| vec![iso.node.to_string(), or_dash(iso.size), iso.volume.clone()]);
        crate::table::render(&mut out, "", &["NODE", "SIZE", "VOLUME"], rows);
    }
    for problem in &orphans.problems {
        let _ = writeln!(out, "not checked: {problem}");
    }
    match &report.deletion {
        None if !orphans.vms.is_empty() || !orphans.seed_isos.is_empty() => {
            let _ = writeln!(out, "Run again with --delete to delete them.");
        }
        None => {}
        Some(d) => {
            let (vms, isos) = (d.deleted_vms.len(), d.deleted_isos.len());
            let _ = writeln!(out, "Deleted {vms} VM(s) and {isos} ISO(s).");
            for (vmid, why) in &d.left_alone {
                let _ = writeln!(out, "left VM {vmid} alone: {why}");
            }
            for failure in &d.failures {
                let _ = writeln!(out, "failed: {failure}");
            }
        }
    }
    if report.ip_allocations.is_empty() {
        return out + "No static IP allocations of gone MachineRequests.\n";
    }
    out.push_str("Static IP allocations whose MachineRequest is gone (released when the provider deletes the VM):\n");
    let rows = report.ip_allocations.iter().map(holding_row);
    crate::table::render(&mut out, "  ", &[], rows);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::deprovision::{OrphanIso, OrphanVm};

    /// An empty request list while VMs of ours exist (the wrong Omni, provider ID, or a restored
    /// backup) made every VM an orphan, and `--delete` deleted them all.
    #[test]
    fn deleting_everything_on_an_empty_request_list_needs_force() {
        let err = deletion_allowed("proxmox", 0, 3, false).unwrap_err();
        assert!(err.to_string().contains("yet 3 VM(s) of ours"), "{err}");
        assert!(err.to_string().contains("--force"), "{err}");
        assert!(deletion_allowed("proxmox", 0, 3, true).is_ok());
        assert!(deletion_allowed("proxmox", 1, 3, false).is_ok());
        assert!(deletion_allowed("proxmox", 0, 0, false).is_ok());
    }

    #[tokio::test]
    async fn refuses_without_omni() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: OrphansArgs,
        }
        let refusal = async |args: &OrphansArgs| {
            let reads = ["list the MachineRequests"; 2];
            super::super::omni_records(&args.omni, &args.config_file, NEEDS_OMNI, reads)
                .await
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let cli = Cli::try_parse_from(["x", "--config-file", "c.yaml", "--delete"]).unwrap();
        let err = refusal(&cli.args).await;
        assert!(
            err.contains("--omni-api-endpoint") && err.contains("live MachineRequests"),
            "{err}"
        );
        let cli = Cli::try_parse_from([
            "x",
            "--config-file",
            "c.yaml",
            "--omni-api-endpoint",
            "https://omni.example.com",
        ])
        .unwrap();
        assert!(
            refusal(&cli.args).await.contains("live MachineRequests"),
            "a key is needed too"
        );
    }

    #[test]
    fn table_lists_orphans_and_says_how_to_delete() {
        let orphans = Orphans {
            vms: vec![OrphanVm {
                vmid: VmId::new(141).unwrap(),
                node: NodeName::new("pve2").unwrap(),
                name: Some("req-dead".into()),
                request_id: Some("req-dead".into()),
                status: Some("running".into()),
                seed_isos: vec![],
            }],
            seed_isos: vec![OrphanIso {
                volume: "local:iso/omni-seed-x.iso".into(),
                storage: "local".into(),
                node: NodeName::new("pve3").unwrap(),
                size: Some(2048),
            }],
            problems: vec!["node pve4 is not online: its ISO storages were not searched".into()],
        };
        let report = |orphans| Report {
            orphans,
            ip_allocations: Vec::new(),
            deletion: None,
        };
        let text = render_table("proxmox", &report(orphans), 1);
        assert!(text.contains("141") && text.contains("req-dead"), "{text}");
        assert!(text.contains("local:iso/omni-seed-x.iso"), "{text}");
        assert!(text.contains("not checked: node pve4"), "{text}");
        assert!(text.contains("--delete"), "{text}");
        let empty = render_table("proxmox", &report(Orphans::default()), 0);
        assert!(!empty.contains("--delete"), "{empty}");
    }
}

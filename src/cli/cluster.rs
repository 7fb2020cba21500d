//! `cluster`: the Proxmox cluster as the provider sees it, for an admin about to write machine classes.
//!
//! Shows each node (online or not, CPU, memory, VMs, and the vCPUs and memory given to VMs against
//! the limits of the config's `placement:`, as automatic placement counts them), each storage per node (type, content, shared,
//! active, usage, and whether it can hold VM disks), and the VM templates. An offline node is shown as
//! offline, not treated as an error: that is exactly what an admin wants to see.
//!
//! `--output json` prints a stable document for scripts (fields are only ever added):
//!
//! ```json
//! { "api_url": "https://pve:8006/api2/json", "version": "9.0.10",
//!   "nodes": [ { "name": "pve1", "status": "online", "cpu_usage": 0.02, "cpus": 4,
//!                "memory_used": 2147483648, "memory_total": 8589934592, "uptime": 3600,
//!                "vms": 2, "running_vms": 1,
//!                "vcpus_allocated": 6, "vcpus_limit": 16,
//!                "memory_allocated": 4294967296, "memory_limit": 8589934592,
//!                "storages": [ { "name": "local-lvm", "type": "lvmthin", "content": ["images", "rootdir"],
//!                                "shared": false, "active": true, "enabled": true, "used": 0,
//!                                "total": 107374182400, "available": 107374182400,
//!                                "holds_vm_disks": true, "holds_iso": false } ],
//!                "storage_error": null } ],
//!   "templates": [ { "vmid": 9000, "name": "talos-template", "node": "pve1" } ],
//!   "cpu_overcommit": 4.0, "memory_overcommit": 1.0,
//!   "ha_rules": [ { "rule": "omni-cp-raff", "type": "resource-affinity",
//!                   "resources": ["vm:101", "vm:102"], "nodes": null, "strict": false,
//!                   "affinity": "negative", "problems": null } ],
//!   "ha_rules_error": null,
//!   "cluster_health": { "name": "prod", "quorate": true,
//!                       "members": [ { "name": "pve1", "online": true } ] },
//!   "cluster_health_error": null }
//! ```
//! `cluster_health` is quorum and membership (`quorate` and `name` are `null` for a standalone
//! node); without quorum Proxmox refuses every change.
//! `ha_rules` lists the machine sets' own HA rules (`omni-<set>-naff`/`-raff`); it is `null` with
//! the reason in `ha_rules_error` when they cannot be read (Proxmox VE 8, or no `Sys.Audit` on `/`).
//! Figures a node does not report (an offline node's memory, and so its limits) are `null`; `storages` is `null` when the
//! node could not be asked, with the reason in `storage_error`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use futures_util::future::join_all;
use serde::Serialize;

use super::{CliResult, OutputFormat};
use crate::model::{ClusterSnapshot, GIB, Listing, MIB};
use crate::proxmox::cluster::ClusterHealth;
use crate::proxmox::ha::{HaRule, problems_line};
use crate::proxmox::types::{NodeName, NodeResource, NodeState, NodeStorage, content_types};
use crate::proxmox::{ProxmoxClient, ProxmoxError};
use crate::rules::ha::is_set_rule;
use crate::rules::placement::{self, Allocation, PlacementLimits, Reservations};
use crate::table::or_dash;

#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// Provider config file with the `proxmox:` connection settings.
    #[arg(long, env = "CONFIG_FILE")]
    pub config_file: PathBuf,
    /// `table` for people, `json` for scripts.
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

#[derive(Debug, Default, Serialize)]
pub struct ClusterReport {
    pub api_url: String,
    pub version: String,
    pub nodes: Vec<NodeReport>,
    pub templates: Vec<TemplateReport>,
    /// The config's `placement:` limits the nodes' `vcpus_limit` and `memory_limit` come from.
    pub cpu_overcommit: f64,
    pub memory_overcommit: f64,
    /// The machine sets' own HA rules.
    pub ha_rules: Option<Vec<HaRule>>,
    pub ha_rules_error: Option<String>,
    /// Quorum and corosync membership (`GET /cluster/status`); `null` with the reason in
    /// `cluster_health_error` when it cannot be read.
    pub cluster_health: Option<ClusterHealth>,
    pub cluster_health_error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct NodeReport {
    #[serde(flatten)]
    pub node: NodeResource,
    pub vms: usize,
    pub running_vms: usize,
    /// vCPUs and memory (bytes) given to the node's VMs, running or stopped, as placement counts
    /// them, against the node's CPUs × `placement.cpuOvercommit` and memory ×
    /// `placement.memoryOvercommit` (`vcpus_allocated`, `vcpus_limit`, `memory_allocated`,
    /// `memory_limit`).
    #[serde(flatten)]
    pub given: Allocation,
    pub storages: Option<Vec<StorageReport>>,
    pub storage_error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct StorageReport {
    #[serde(flatten)]
    pub storage: NodeStorage,
    pub holds_vm_disks: bool,
    pub holds_iso: bool,
}

#[derive(Debug, Serialize)]
pub struct TemplateReport {
    pub vmid: u32,
    pub name: Option<String>,
    pub node: String,
}

pub async fn run(args: ClusterArgs) -> CliResult {
    // Warnings (such as TLS verification being off) go to stderr; stdout stays clean for `--output json`.
    let config = super::load_config(&args.config_file)?;
    let client = ProxmoxClient::new(&config.proxmox)?;
    let report = gather(&client, &config.placement).await?;
    args.output.print(&report, render_table)
}

/// Reads the cluster: one `/cluster/resources`, then the storages of each online node in parallel.
pub async fn gather(
    client: &ProxmoxClient,
    limits: &PlacementLimits,
) -> Result<ClusterReport, ProxmoxError> {
    let version = client.version().await?.version;
    let resources = client.cluster_listing().await?;
    let answers = resources
        .nodes()
        .filter(|n| n.status == NodeState::Online)
        .map(|n| async {
            let read = client.node_storages(&n.node).await;
            (n.node.clone(), read.map_err(|e| e.to_string()))
        });
    let storages = join_all(answers).await.into_iter().collect();
    let url = client.api_url();
    let mut report = build_report(url.as_str(), &version, &resources, &storages, limits);
    let health = client.cluster_health().await.map_err(|e| e.to_string());
    (report.cluster_health, report.cluster_health_error) = split(health);
    let rules = match client.ha_rules().await {
        Ok(rules) => Ok(rules.into_iter().filter(|r| is_set_rule(&r.rule)).collect()),
        Err(ProxmoxError::Api { status: 501, .. }) => {
            Err("this Proxmox VE release has no HA rules".to_string())
        }
        Err(e) => Err(e.to_string()),
    };
    (report.ha_rules, report.ha_rules_error) = split(rules);
    Ok(report)
}

/// A read that may fail as the report's pair of fields: the value, or the reason it is missing.
fn split<T>(read: Result<T, String>) -> (Option<T>, Option<String>) {
    match read {
        Ok(value) => (Some(value), None),
        Err(e) => (None, Some(e)),
    }
}

/// Pure: turns the API answers into the report.
pub fn build_report(
    api_url: &str,
    version: &str,
    resources: &Listing,
    storages: &BTreeMap<NodeName, Result<Vec<NodeStorage>, String>>,
    limits: &PlacementLimits,
) -> ClusterReport {
    let snapshot = ClusterSnapshot::from_resources(resources);
    // In name order, as the snapshot keeps them.
    let nodes = snapshot.nodes.iter().filter_map(|node| {
        let n = resources.nodes().find(|n| n.node == node.name)?;
        let read = (storages.get(&n.node).cloned())
            .unwrap_or_else(|| Err(format!("node is {}", NodeState::word(Some(n.status)))));
        let (storages, storage_error) = split(read.map(|list| {
            let report = |storage: NodeStorage| StorageReport {
                holds_vm_disks: storage.holds("images"),
                holds_iso: storage.holds("iso"),
                storage,
            };
            list.into_iter().map(report).collect()
        }));
        Some(NodeReport {
            node: n.clone(),
            vms: node.vms.len(),
            running_vms: node.vms.iter().filter(|vm| vm.is_running()).count(),
            given: placement::allocation(node, limits, &Reservations::default(), ""),
            storages,
            storage_error,
        })
    });
    let mut templates: Vec<TemplateReport> = resources
        .templates()
        .map(|vm| TemplateReport {
            vmid: vm.vmid.get(),
            name: vm.name.clone(),
            node: vm.node.to_string(),
        })
        .collect();
    templates.sort_by_key(|t| t.vmid);
    ClusterReport {
        api_url: api_url.to_owned(),
        version: version.to_owned(),
        nodes: nodes.collect(),
        templates,
        cpu_overcommit: limits.cpu_overcommit,
        memory_overcommit: limits.memory_overcommit,
        ..ClusterReport::default()
    }
}

/// Pure: the human-readable view.
pub fn render_table(r: &ClusterReport) -> String {
    let mut out = String::new();
    let health = match &r.cluster_health {
        Some(h) => format!("Cluster {}: {}", or_dash(h.name.as_ref()), h.summary()),
        None => format!("Cluster health not read: {}", why(&r.cluster_health_error)),
    };
    let _ = writeln!(out, "Proxmox VE {} at {}\n{health}\n", r.version, r.api_url);
    // One row per node, what it has and what it has given to VMs, then what the limits are made of.
    let header = [
        "NODE",
        "STATUS",
        "CPU",
        "MEMORY",
        "VCPUS GIVEN / LIMIT",
        "MEMORY GIVEN / LIMIT",
        "VMS",
    ];
    crate::table::render(&mut out, "", &header, r.nodes.iter().map(node_row));
    let _ = writeln!(
        out,
        "(given: to the node's VMs, running or stopped; limit: CPUs × placement.cpuOvercommit {}, memory × placement.memoryOvercommit {})\n",
        r.cpu_overcommit, r.memory_overcommit
    );
    // Every storage of every node; a node whose storages could not be read says why in their place.
    let header = [
        "NODE",
        "STORAGE",
        "TYPE",
        "CONTENT",
        "SHARED",
        "ACTIVE",
        "USED / TOTAL",
        "VM DISKS",
    ];
    crate::table::render(&mut out, "", &header, r.nodes.iter().flat_map(storage_rows));
    out.push('\n');
    if r.templates.is_empty() {
        out.push_str("No VM templates (boot mode `clone` needs one).\n");
    } else {
        let rows = r.templates.iter().map(|t| {
            let name = t.name.clone().unwrap_or_default();
            vec![t.vmid.to_string(), name, t.node.clone()]
        });
        crate::table::render(&mut out, "", &["TEMPLATE VMID", "NAME", "NODE"], rows);
    }
    out.push('\n');
    render_ha_rules(&mut out, r);
    out
}

fn render_ha_rules(out: &mut String, r: &ClusterReport) {
    let Some(rules) = &r.ha_rules else {
        let _ = writeln!(out, "HA rules not read: {}", why(&r.ha_rules_error));
        return;
    };
    if rules.is_empty() {
        return out.push_str("No HA rules of machine sets.\n");
    }
    let rows = rules.iter().map(|h| {
        let what = match (&h.affinity, &h.nodes) {
            (Some(affinity), _) => affinity.clone(),
            (None, Some(nodes)) if h.strict => format!("{nodes} (strict)"),
            (None, Some(nodes)) => nodes.clone(),
            (None, None) => String::new(),
        };
        vec![
            h.rule.clone(),
            h.kind.clone(),
            what,
            h.resource_list().join(","),
            problems_line(&h.errors).unwrap_or_default(),
        ]
    });
    let header = ["HA RULE", "TYPE", "KEEPS", "VMS", "PROBLEMS"];
    crate::table::render(out, "", &header, rows);
}

fn node_row(n: &NodeReport) -> Vec<String> {
    let node = &n.node;
    let cpu = match (node.cpu, node.maxcpu) {
        (Some(u), Some(c)) => format!("{:.0}% of {c}", u * 100.0),
        _ => "-".into(),
    };
    let memory_limit = or_dash(n.given.memory_limit.map(bytes));
    vec![
        node.node.to_string(),
        NodeState::word(Some(node.status)).to_owned(),
        cpu,
        used_of(node.mem, node.maxmem),
        format!(
            "{} / {}",
            n.given.cpus_allocated,
            or_dash(n.given.cpus_limit)
        ),
        format!("{} / {memory_limit}", bytes(n.given.memory_allocated)),
        format!("{} ({} running)", n.vms, n.running_vms),
    ]
}

fn storage_rows(n: &NodeReport) -> Vec<Vec<String>> {
    let name = n.node.node.to_string();
    let Some(list) = &n.storages else {
        let why = why(&n.storage_error);
        return vec![vec![name, format!("(storages not shown: {why})")]];
    };
    list.iter()
        .map(|report| {
            let s = &report.storage;
            vec![
                name.clone(),
                s.storage.clone(),
                s.storage_type.clone(),
                content_types(&s.content).collect::<Vec<_>>().join(","),
                yes_no(s.shared),
                yes_no(s.active && s.enabled),
                used_of(s.used, s.total),
                yes_no(report.holds_vm_disks),
            ]
        })
        .collect()
}

/// `used / total` in bytes, or `-` when either is not reported.
fn used_of(used: Option<u64>, total: Option<u64>) -> String {
    match (used, total) {
        (Some(u), Some(t)) => format!("{} / {}", bytes(u), bytes(t)),
        _ => "-".into(),
    }
}

/// Why a part of the report is missing.
fn why(error: &Option<String>) -> &str {
    error.as_deref().unwrap_or("unknown")
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_owned()
}

fn bytes(n: u64) -> String {
    if n >= GIB {
        format!("{:.1} GiB", n as f64 / GIB as f64)
    } else {
        format!("{:.0} MiB", n as f64 / MIB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offline_nodes_are_shown_not_failed() {
        let resources: Vec<crate::proxmox::types::ClusterResource> = serde_json::from_str(
            r#"[
            {"type":"node","node":"pve1","status":"online","cpu":0.25,"maxcpu":4,"mem":1073741824,"maxmem":8589934592},
            {"type":"node","node":"pve2","status":"offline"},
            {"type":"qemu","vmid":9000,"node":"pve1","name":"talos","template":1,"status":"stopped"},
            {"type":"qemu","vmid":100,"node":"pve1","name":"a","status":"running","maxcpu":2,"maxmem":2147483648},
            {"type":"qemu","vmid":102,"node":"pve1","name":"c","status":"stopped","maxcpu":4,"maxmem":1073741824},
            {"type":"qemu","vmid":101,"node":"pve2","name":"b","status":"unknown"}
        ]"#,
        )
        .unwrap();
        let storages: BTreeMap<NodeName, Result<Vec<NodeStorage>, String>> = [(
            NodeName::new("pve1").unwrap(),
            Ok(serde_json::from_str(
                r#"[{"storage":"local-lvm","type":"lvmthin","content":"images,rootdir","active":1,"avail":100,"total":200,"used":100}]"#,
            )
            .unwrap()),
        )]
        .into();
        let limits = PlacementLimits {
            cpu_overcommit: 1.5,
            memory_overcommit: 1.0,
        };
        let r = build_report(
            "https://x/api2/json",
            "9.0",
            &crate::proxmox::listing::Listing::read(resources, std::time::Instant::now()),
            &storages,
            &limits,
        );
        assert_eq!(r.nodes[0].vms, 2);
        // Running or stopped, every VM's vCPUs and memory count; the template's do not.
        assert_eq!(
            (r.nodes[0].given.cpus_allocated, r.nodes[0].given.cpus_limit),
            (6, Some(6))
        );
        assert_eq!(
            (
                r.nodes[0].given.memory_allocated,
                r.nodes[0].given.memory_limit
            ),
            (3 * 1073741824, Some(8589934592))
        );
        assert_eq!(
            r.nodes[1].given.cpus_limit, None,
            "an offline node reports no CPUs"
        );
        assert_eq!(r.nodes[0].running_vms, 1);
        // The JSON document names them as it always has.
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["nodes"][0]["vcpus_allocated"], 6);
        assert_eq!(json["nodes"][0]["memory_limit"], 8589934592u64);
        assert!(json["nodes"][1]["vcpus_limit"].is_null());
        assert_eq!(r.nodes[1].node.status, NodeState::Offline);
        assert_eq!(r.nodes[1].storage_error.as_deref(), Some("node is offline"));
        assert!(r.nodes[0].storages.as_ref().unwrap()[0].holds_vm_disks);
        assert_eq!(r.templates[0].vmid, 9000);
        let text = render_table(&r);
        assert!(text.contains("pve2  offline"), "{text}");
        assert!(text.contains("25% of 4"), "{text}");
        assert!(text.contains("9000"), "{text}");
        assert!(text.contains("6 / 6"), "{text}");
        assert!(text.contains("3.0 GiB / 8.0 GiB"), "{text}");
        assert!(text.contains("placement.cpuOvercommit 1.5"), "{text}");
    }
}

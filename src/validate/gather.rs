//! The reads, at the edge: one `/cluster/resources`, the bridges of the candidate nodes (in parallel),
//! the PCI/USB resource mappings and the Proxmox VE version only when the data needs them, and with
//! `boot: clone` the config of each copy of the template (where its drives are); last, the token's
//! privileges on `/`. Around them, the two whole checks: of a machine class ([`validate_class`]) and
//! of the config's `defaults:` and `nodes:` for the provider's health status ([`check_defaults`]).

use std::fmt::Write as _;

use futures_util::future::OptionFuture;

use super::cluster::{ClusterFacts, candidate_nodes};
use super::{Finding, Layers, Outcome, Report, check_cluster, check_pools, check_schema};
use crate::config::ProviderConfig;
use crate::model::ClusterSnapshot;
use crate::pipeline::ip_pool::reported_by_agents;
use crate::pipeline::template::clone_source;
use crate::proxmox::cluster::EffectivePrivileges;
use crate::proxmox::types::NodeName;
use crate::proxmox::{ProxmoxClient, ProxmoxError};
use crate::rules::ip_pool;
use crate::rules::provider_data::{BootMode, ProviderData, needs_release_check};

/// Reads what the checks need for `data`: `/cluster/resources`, the bridges of every online candidate
/// node (in parallel), and the PCI/USB mappings when the data (or a node override) names devices.
pub async fn gather(
    pve: &ProxmoxClient,
    data: &ProviderData,
    config: &ProviderConfig,
) -> Result<ClusterFacts, ProxmoxError> {
    let resources = pve.cluster_listing().await?;
    let cluster = ClusterSnapshot::from_resources(&resources);
    let candidates = candidate_nodes(data, &cluster);
    let online = candidates.iter().filter(|n| n.online);
    let answers = online.map(|n| async { (n.name.to_string(), bridges(pve, &n.name).await) });
    let answers = futures_util::future::join_all(answers).await;
    let mappings = |kind, key: &str, in_data: bool| {
        // A missing key (or a node override that is not a map) indexes as null.
        let in_nodes =
            (config.nodes.values()).any(|v| v[key].as_array().is_some_and(|a| !a.is_empty()));
        let read = async move { text(pve.resource_mappings(kind).await) };
        OptionFuture::from((in_data || in_nodes).then_some(read))
    };
    let (pci, usb) = (!data.pci_devices.is_empty(), !data.usb_devices.is_empty());
    let version = async { text(pve.version().await).map(|v| v.version) };
    let uses_ha_rules = data.ha.as_ref().is_some_and(|ha| ha.uses_rules());
    // The reads run one after the other, in the order of the fields.
    Ok(ClusterFacts {
        bridges: answers.into_iter().collect(),
        pci_mappings: mappings("pci", "pci_devices", pci).await,
        usb_mappings: mappings("usb", "usb_devices", usb).await,
        pve_version: OptionFuture::from(needs_release_check(data).then_some(version)).await,
        clone_source: match (data.boot, &data.template) {
            (BootMode::Clone, Some(wanted)) => Some(text(
                clone_source(pve, &resources, &cluster, wanted, data.clone_mode).await,
            )),
            _ => None,
        },
        // Proxmox VE 8 has no HA rules (501): the release check says so.
        ha_rules: match OptionFuture::from(uses_ha_rules.then(|| pve.ha_rules())).await {
            Some(Err(ProxmoxError::Api { status: 501, .. })) => None,
            read => read.map(text),
        },
        health: Some(text(pve.cluster_health().await)),
        cluster,
    })
}

/// A failed read as the words the findings show.
fn text<T>(read: Result<T, impl std::fmt::Display>) -> Result<T, String> {
    read.map_err(|e| e.to_string())
}

/// Bridges and SDN VNets of a node; Proxmox before 9.0 does not know `include_sdn` (a parameter error
/// on `type`), so that refusal falls back to plain bridges.
async fn bridges(pve: &ProxmoxClient, node: &NodeName) -> Result<Vec<String>, String> {
    let read = |kind| pve.node_networks(node, kind);
    let list = match read("include_sdn").await {
        Err(ProxmoxError::Api {
            status: 400,
            field_errors,
            ..
        }) if field_errors.contains_key("type") => read("any_bridge").await,
        other => other,
    };
    let list = text(list)?.into_iter();
    Ok(list
        // The interfaces a guest NIC can be attached to (`net0: ...,bridge=<iface>`).
        .filter(|i| matches!(i.kind.as_str(), "bridge" | "OVSBridge" | "vnet"))
        .map(|i| i.iface)
        .collect())
}

/// The whole check of one machine class's provider data over `config`: the config file's own
/// warnings, the schema, then (if that passes) the cluster, the IP pools it names and the config's
/// `policy:` (as provisioning checks it), and last what the token reaches beyond the provider's need.
/// `Err` only when the cluster cannot be read.
pub async fn validate_class(
    pve: &ProxmoxClient,
    class_yaml: &str,
    config: &ProviderConfig,
) -> Result<Report, ProxmoxError> {
    let layers = Layers::new(class_yaml, config);
    let (schema_findings, data) = check_schema(&layers);
    // The config file's own warnings (unknown keys, a token and a password both set) come first.
    let mut findings: Vec<Finding> = (config.warnings.iter())
        .map(|w| Outcome::Warning.finding("config", w))
        .chain(schema_findings)
        .collect();
    if let Some(data) = data {
        let view = gather(pve, &data, config).await?;
        findings.extend(check_cluster(&layers, &data, &view));
        // The addresses in use are read only when the data names a pool.
        if !ip_pool::wanted(&data).is_empty() {
            let in_use = reported_by_agents(pve).await?;
            findings.extend(check_pools(&data, &config.ip_pools, &in_use));
        }
        findings.extend(Outcome::Problem.findings(config.policy.check(&data)));
    }
    let reach = root_reach_warning(pve).await;
    findings.extend(reach.map(|w| Outcome::Warning.finding("proxmox.tokenID", w)));
    Ok(Report::new(findings))
}

/// The warning about what the token holds on `/` beyond the provider's need
/// ([`root_warning`]), if any. A token whose privileges cannot be read gets no
/// warning: the calls that need them say what is missing.
pub async fn root_reach_warning(pve: &ProxmoxClient) -> Option<String> {
    let privileges = pve
        .effective_privileges()
        .await
        .inspect_err(|e| tracing::debug!(error = %e, "cannot read the token's privileges"))
        .ok()?;
    root_warning(&privileges)
}

// Whether the Proxmox token holds more on `/` than the provider needs there.
//
// A privilege granted on `/` (with propagation, as `pveum acl modify /` grants it) reaches every
// VM, storage, pool and node of the datacenter, not only the provider's: with `VM.Allocate` there
// the token can delete any VM, and the provider's ownership checks become the only fence. On `/`
// itself the provider needs only what is read or decided there: `Sys.Audit` (the cluster's name
// from `/cluster/status`, the next-id range from `/cluster/options`, HA rules), and, when the
// features are used, `Sys.Console` (HA resources and rules), `Sys.Modify` (tags under a restrictive
// `user-tag-access`) and `Sys.AccessNetwork` (`download-url` probes). Everything else belongs on
// the provider's pool, storages, nodes and SDN zones (docs/security.md).
//
// The privileges on `/` are read from `GET /access/permissions`, which pve-access-control
// (src/PVE/RPCEnvironment.pm, `get_effective_permissions`) answers with the privileges effective
// on each path, inherited ones included.

/// What the provider may hold on `/` without a warning.
const NEEDED_ON_ROOT: [&str; 4] = [
    "Sys.Audit",
    "Sys.Console",
    "Sys.Modify",
    "Sys.AccessNetwork",
];

/// The warning naming the privileges held on `/` beyond [`NEEDED_ON_ROOT`] (sorted, as
/// [`EffectivePrivileges::on`] lists them), `None` when there are none.
pub(super) fn root_warning(privileges: &EffectivePrivileges) -> Option<String> {
    let excess: Vec<&str> = (privileges.on("/"))
        .filter(|p| !NEEDED_ON_ROOT.contains(p))
        .collect();
    (!excess.is_empty()).then(|| format!(
        "the Proxmox token holds {} on `/`, which reaches every VM and storage of the datacenter, not only the provider's: grant them on the provider's pool, storages, nodes and SDN zones instead, with a privilege-separated token (see docs/security.md)",
        excess.join(", ")
    ))
}

/// The longest health text [`check_defaults`] returns; Omni shows it in one line.
pub(crate) const HEALTH_TEXT_MAX: usize = 480;

/// The config's `defaults:` and `nodes:` checked against the live cluster, for the provider's health
/// status: `None` when nothing is wrong (or nothing is set), else a short text naming the keys and
/// nodes to fix. Only problems count; warnings (an offline node) do not make the provider unhealthy.
pub async fn check_defaults(pve: &ProxmoxClient, config: &ProviderConfig) -> Option<String> {
    if config.defaults.is_empty() && config.nodes.is_empty() {
        return None;
    }
    // The config's `defaults:` may lack keys a machine class must have: stand-ins fill them and
    // checks of stand-ins are dropped, so only what is actually set is judged. Data that does not
    // resolve gets no cluster read: its problems are the findings.
    let layers = Layers {
        stand_ins: true,
        ..Layers::new("{}", config)
    };
    let findings = match layers.resolve_on(None) {
        Ok(data) => match gather(pve, &data, config).await {
            Ok(view) => check_cluster(&layers, &data, &view),
            Err(e) => {
                return Some(format!(
                    "cannot check the config defaults against Proxmox: {e}"
                ));
            }
        },
        Err(problems) => Outcome::Problem.findings(problems).collect(),
    };
    summarize(&findings)
}

/// The problems among `findings` as `provider config: KEY (on NODE): MESSAGE; ... and N more`, cut
/// to [`HEALTH_TEXT_MAX`]; `None` when there is none.
pub(crate) fn summarize(findings: &[Finding]) -> Option<String> {
    const PREFIX: &str = "provider config: ";
    let problems = findings.iter().filter(|f| f.outcome == Outcome::Problem);
    let all: Vec<String> = problems.map(|f| f.to_string()).collect();
    if all.is_empty() {
        return None;
    }
    // The first problem always shows (cut below when it alone is too long), the others while
    // they fit.
    let fits = |n: usize| n == 1 || PREFIX.len() + all[..n].join("; ").len() <= HEALTH_TEXT_MAX;
    let shown = (1..=all.len()).take_while(|&n| fits(n)).count();
    let mut text = format!("{PREFIX}{}", all[..shown].join("; "));
    if shown < all.len() {
        let _ = write!(text, "; and {} more (run `validate`)", all.len() - shown);
    }
    if text.len() > HEALTH_TEXT_MAX + 40 {
        let cut = (0..=HEALTH_TEXT_MAX)
            .rev()
            .find(|&i| text.is_char_boundary(i));
        text.truncate(cut.unwrap_or(0));
        text.push('…');
    }
    Some(text)
}

//! The config's `defaults:` and `nodes:` against the cluster: the provider's health status.

use std::fmt::Write as _;

use super::checks::check_cluster_inner;
use super::cluster::ClusterFacts;
use super::gather::gather;
use super::layers::{Layers, with_stand_ins};
use super::report::{Finding, Outcome, findings_of};
use crate::config::ProviderConfig;
use crate::proxmox::ProxmoxClient;
use crate::rules::provider_data::ProviderDataSchema;

/// The config's `defaults:` (with its `nodes:` overrides) against the cluster, pure. `defaults` may
/// lack keys a machine class must have, so stand-ins fill them and checks of stand-ins are dropped:
/// only what is actually set is judged.
pub fn check_defaults_against(
    schema: &ProviderDataSchema,
    config: &ProviderConfig,
    view: &ClusterFacts,
) -> Vec<Finding> {
    let (filled, stand_ins) = with_stand_ins(&config.defaults);
    let written = Layers::new("{}", config);
    let layers = Layers {
        defaults: &filled,
        ..written
    };
    match layers.resolve_on(schema, None) {
        Ok(data) => check_cluster_inner(schema, &layers, &written, &data, view, &stand_ins),
        Err(problems) => findings_of(Outcome::Problem, None, problems).collect(),
    }
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
    let schema = match ProviderDataSchema::new() {
        Ok(s) => s.strict(config.strict),
        Err(e) => return Some(e.to_string()),
    };
    let (filled, _) = with_stand_ins(&config.defaults);
    let layers = Layers {
        defaults: &filled,
        ..Layers::new("{}", config)
    };
    // Data that does not resolve gets no cluster read: its problems are the findings.
    let view = match layers.resolve_on(&schema, None) {
        Ok(data) => match gather(pve, &data, &config.nodes, config.placement).await {
            Ok(v) => v,
            Err(e) => {
                return Some(format!(
                    "cannot check the config defaults against Proxmox: {e}"
                ));
            }
        },
        Err(_) => ClusterFacts::default(),
    };
    let findings = check_defaults_against(&schema, config, &view);
    let problems: Vec<Finding> = findings
        .into_iter()
        .filter(|f| f.outcome == Outcome::Problem)
        .collect();
    (!problems.is_empty()).then(|| summarize(problems.into_iter()))
}

/// `provider config: KEY (on NODE): MESSAGE; ... and N more`, cut to [`HEALTH_TEXT_MAX`].
pub(crate) fn summarize(problems: impl Iterator<Item = Finding>) -> String {
    let all: Vec<String> = problems.map(|f| f.to_string()).collect();
    let mut text = String::from("provider config: ");
    let mut shown = 0;
    for (i, p) in all.iter().enumerate() {
        let sep = if i == 0 { "" } else { "; " };
        if text.len() + sep.len() + p.len() > HEALTH_TEXT_MAX && shown > 0 {
            break;
        }
        text.push_str(sep);
        text.push_str(p);
        shown += 1;
    }
    if shown < all.len() {
        let _ = write!(text, "; and {} more (run `validate`)", all.len() - shown);
    }
    if text.len() > HEALTH_TEXT_MAX + 40 {
        let mut cut = HEALTH_TEXT_MAX;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

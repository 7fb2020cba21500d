//! The config's `defaults:` and `nodes:` against the cluster: the provider's health status.

use std::fmt::Write as _;

use super::check_cluster;
use super::gather::gather;
use super::layers::Layers;
use super::report::{Finding, Outcome};
use crate::config::ProviderConfig;
use crate::proxmox::ProxmoxClient;

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
    let layers = Layers::of_defaults(config);
    let findings = match layers.resolve_on(None) {
        Ok(data) => match gather(pve, &data, &config.nodes, config.placement).await {
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

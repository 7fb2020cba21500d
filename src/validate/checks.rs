//! One class against the cluster: the findings about the cluster as a whole
//! ([`super::cluster`]), then each node placement could choose ([`super::node`]), then what the
//! nodes' verdicts together say.

use super::cluster::{ClusterCheck, ClusterFacts};
use super::layers::{Layers, Origin};
use super::node::check_node;
use super::report::Finding;
use crate::rules::placement::{CloneRefusal, LeftOut};
use crate::rules::provider_data::{ProviderData, ProviderDataSchema};

/// Step 2, pure: `data` (the class resolved without a node override) against the cluster.
pub fn check_cluster(
    schema: &ProviderDataSchema,
    layers: &Layers<'_>,
    data: &ProviderData,
    view: &ClusterFacts,
) -> Vec<Finding> {
    check_cluster_inner(schema, layers, layers, data, view, &[])
}

/// `layers` resolve the data; `written` are the layers as the user wrote them (they differ by the
/// `stand_ins` when `defaults:` are checked), for key paths.
pub(crate) fn check_cluster_inner(
    schema: &ProviderDataSchema,
    layers: &Layers<'_>,
    written: &Layers<'_>,
    data: &ProviderData,
    view: &ClusterFacts,
    stand_ins: &[&str],
) -> Vec<Finding> {
    let origin = Origin {
        layers: written,
        stand_ins,
    };
    let check = ClusterCheck::new(schema, layers, origin, data, view);
    let mut out = check.cluster_findings();
    let request = check.class.request(data);
    let mut outcomes = Vec::new();
    for node in check
        .cluster
        .nodes
        .iter()
        .filter(|n| n.online && request.considers(&n.name))
    {
        if let Some(outcome) = check_node(&check, node, &mut out) {
            outcomes.push((node.name.to_string(), outcome));
        }
    }
    let clones: Vec<(&str, &Result<String, CloneRefusal>)> = outcomes
        .iter()
        .filter_map(|(n, o)| o.clone.as_ref().map(|c| (n.as_str(), c)))
        .collect();
    check.clone_findings(&clones, &mut out);
    let capacity: Vec<(String, Result<u64, LeftOut>)> =
        outcomes.into_iter().map(|(n, o)| (n, o.capacity)).collect();
    check.memory_findings(&capacity, &mut out);
    out
}

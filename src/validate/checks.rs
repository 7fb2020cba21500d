//! One class against the cluster: the findings about the cluster as a whole
//! ([`super::cluster`]), then each node placement could choose ([`super::node`]), then what the
//! nodes' verdicts together say.

use super::cluster::{ClusterCheck, ClusterFacts};
use super::layers::Layers;
use super::node::check_node;
use super::report::Finding;
use crate::rules::provider_data::{ProviderData, ProviderDataSchema};

/// Step 2, pure: `data` (the class resolved without a node override) against the cluster.
pub fn check_cluster(
    schema: &ProviderDataSchema,
    layers: &Layers<'_>,
    data: &ProviderData,
    view: &ClusterFacts,
) -> Vec<Finding> {
    let check = ClusterCheck::new(schema, layers, data, view);
    let mut out = check.cluster_findings();
    let request = check.request(data);
    let (mut clones, mut capacity) = (Vec::new(), Vec::new());
    for node in view.cluster.nodes.iter() {
        if !node.online || !request.considers(&node.name) {
            continue;
        }
        if let Some(outcome) = check_node(&check, node, &mut out) {
            let name = node.name.as_str();
            clones.extend(outcome.clone.map(|c| (name, c)));
            capacity.push((name, outcome.capacity.err()));
        }
    }
    check.clone_findings(&clones, &mut out);
    check.memory_findings(&capacity, &mut out);
    out
}

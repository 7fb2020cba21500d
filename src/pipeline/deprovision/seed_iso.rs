//! Deleting the request's NoCloud seed ISO after its VM.

use super::{DeprovisionError, DeprovisionTarget, Run};
use crate::proxmox::ProxmoxError;
use crate::proxmox::types::{NodeName, NodeState};

/// Deletes the recorded seed ISO, from the first online node among the recorded node (where the seed
/// was uploaded) and the node the VM was deleted on (or any node, for shared storage).
pub(super) async fn delete_seed_iso(
    run: &Run<'_>,
    target: &DeprovisionTarget,
    vm_node: Option<NodeName>,
) -> Result<(), DeprovisionError> {
    let (pve, view) = (run.pve, run.view);
    let Some(iso) = &target.seed_iso_volume else {
        return Ok(());
    };
    let (volume, storage) = (&iso.to_string(), iso.storage.to_string());
    let mut preferred: Vec<NodeName> = target.recorded_node.iter().cloned().collect();
    if let Some(n) = vm_node.filter(|n| !preferred.contains(n)) {
        preferred.push(n);
    }
    let Some(node) = super::online_node_for(view, &storage, &preferred) else {
        if let Some(n) = preferred.iter().find(|n| view.node_state(n).is_some()) {
            return Err(DeprovisionError::SeedIsoNodeOffline {
                volume: volume.to_owned(),
                node: n.clone(),
                state: NodeState::word(view.node_state(n)),
            });
        }
        // The node is no longer in the cluster: the ISO went with it.
        tracing::warn!(request = %target.request_id, %volume, nodes = ?preferred,
            "no node that could hold the seed ISO is in the cluster; skipping it");
        return Ok(());
    };
    (run.progress)(&format!("deleting seed ISO {volume} on {node}"));
    let fail = |source| DeprovisionError::SeedIso {
        volume: volume.to_owned(),
        node: node.clone(),
        source,
    };
    match pve.delete_volume(&node, &storage, volume).await {
        Err(e) if !e.is_not_found() && !volume_gone(&e) => Err(fail(e)),
        _ => Ok(()),
    }
}

/// Proxmox words a missing volume in several ways, not all of which map to "not found".
fn volume_gone(e: &ProxmoxError) -> bool {
    let ProxmoxError::Api { message, .. } = e else {
        return false;
    };
    let m = message.to_ascii_lowercase();
    m.contains("does not exist") || m.contains("no such volume")
}

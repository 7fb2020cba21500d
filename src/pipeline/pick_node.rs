//! Step 1, `pick_node`: which node the VM goes to, and the storage for its disks.
//!
//! One `/cluster/resources` read describes every node, VM and storage; [`placement::pick`] decides;
//! the decision is reserved in the in-memory ledger so requests running at the same moment spread
//! instead of all seeing the same "emptiest" node.

use std::collections::BTreeMap;

use super::placement::{self, NodeSnapshot, PlacementRequest, StorageSnapshot, VmSummary};
use super::step::{StepContext, StepError, StepOutcome};
use super::storage_selector::StorageSelector;
use crate::proxmox::types::{ClusterResource, NodeState, split_tags};

pub async fn run(ctx: &mut StepContext<'_>) -> Result<StepOutcome, StepError> {
    if !ctx.state.node.is_empty() && !ctx.state.storage.is_empty() {
        // Decided before a restart: keep the decision (and the ledger entry that spreads others).
        reserve(ctx);
        return Ok(StepOutcome::Done);
    }
    ctx.report("reading nodes and storages").await;
    let snapshot = snapshot(ctx.cluster(false).await?);
    let node_selectors = node_selectors(ctx)?;
    let allowed: Vec<String> = ctx
        .data
        .allowed_nodes
        .iter()
        .map(|n| n.to_string())
        .collect();
    let pinned = ctx.data.node.as_ref().map(|n| n.to_string());
    let request = PlacementRequest {
        request_id: &ctx.request.id,
        memory_mb: ctx.data.memory_mb,
        disk_gb: ctx.data.total_disk_gb(),
        selector: &ctx.data.storage_selector,
        node_selectors: &node_selectors,
        pinned_node: pinned.as_deref(),
        allowed_nodes: &allowed,
        set_id: ctx.request.set_id.as_deref(),
        strategy: ctx.data.placement_strategy,
    };
    let choice = ctx
        .services
        .ledgers
        .with_reservations(|reservations| placement::pick(&snapshot, &request, reservations))
        .map_err(|e| StepError::Cluster(e.to_string()))?;
    tracing::info!(
        request = %ctx.request.id,
        node = %choice.node,
        storage = %choice.storage,
        reason = %choice.reason,
        "{}",
        if matches!(choice.reason, placement::PlacementReason::Pinned) {
            "using configured node"
        } else {
            "automatically picked node"
        }
    );
    ctx.state.node = choice.node;
    ctx.state.storage = choice.storage;
    ctx.state.request_set = ctx.request.set_id.clone().unwrap_or_default();
    reserve(ctx);
    Ok(StepOutcome::Done)
}

fn reserve(ctx: &StepContext<'_>) {
    ctx.services.ledgers.reserve(
        &ctx.request.id,
        &ctx.state.node,
        ctx.request.set_id.as_deref(),
        ctx.data.memory_mb,
    );
}

/// Per-node storage selectors from the config's `nodes:` overrides.
fn node_selectors(ctx: &StepContext<'_>) -> Result<BTreeMap<String, StorageSelector>, StepError> {
    let mut out = BTreeMap::new();
    for (node, value) in &ctx.services.config.nodes {
        if let Some(expr) = value.get("storage_selector").and_then(|v| v.as_str()) {
            let selector = StorageSelector::new(expr)
                .map_err(|e| StepError::Config(format!("nodes.{node}.storage_selector: {e}")))?;
            out.insert(node.clone(), selector);
        }
    }
    Ok(out)
}

/// Pure: the storages of one node as placement sees them (API order kept).
pub fn node_storages(resources: &[ClusterResource], node: &str) -> Vec<StorageSnapshot> {
    snapshot(resources)
        .into_iter()
        .find(|n| n.name == node)
        .map(|n| n.storages)
        .unwrap_or_default()
}

/// Pure: the placement view of `/cluster/resources`.
pub fn snapshot(resources: &[ClusterResource]) -> Vec<NodeSnapshot> {
    let mut nodes: BTreeMap<String, NodeSnapshot> = BTreeMap::new();
    for r in resources {
        if let ClusterResource::Node(n) = r {
            nodes.insert(
                n.node.to_string(),
                NodeSnapshot {
                    name: n.node.to_string(),
                    online: n.status == NodeState::Online,
                    memory_used: n.mem.unwrap_or(0),
                    memory_max: n.maxmem.unwrap_or(0),
                    vms: Vec::new(),
                    storages: Vec::new(),
                },
            );
        }
    }
    for r in resources {
        match r {
            ClusterResource::Vm(vm) if !vm.template => {
                if let Some(node) = nodes.get_mut(vm.node.as_str()) {
                    node.vms.push(VmSummary {
                        name: vm.name.clone().unwrap_or_default(),
                        tags: split_tags(vm.tags.as_deref().unwrap_or_default())
                            .into_iter()
                            .map(str::to_owned)
                            .collect(),
                    });
                }
            }
            ClusterResource::Storage(s) => {
                if let Some(node) = nodes.get_mut(s.node.as_str()) {
                    let total = s.maxdisk.unwrap_or(0);
                    node.storages.push(StorageSnapshot {
                        name: s.storage.clone(),
                        storage_type: s.plugintype.clone().unwrap_or_default(),
                        content: s
                            .content
                            .as_deref()
                            .unwrap_or_default()
                            .split(',')
                            .map(|c| c.trim().to_owned())
                            .filter(|c| !c.is_empty())
                            .collect(),
                        // `/cluster/resources` lists only storages enabled on that node.
                        enabled: true,
                        active: s.status.as_deref() == Some("available"),
                        shared: s.shared,
                        available: total.saturating_sub(s.disk.unwrap_or(0)),
                    });
                }
            }
            _ => {}
        }
    }
    nodes.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_from_resources() {
        let r: Vec<ClusterResource> = serde_json::from_str(
            r#"[
            {"type":"node","node":"pve1","status":"online","mem":100,"maxmem":1000},
            {"type":"node","node":"pve2","status":"offline"},
            {"type":"qemu","vmid":101,"node":"pve1","name":"r1","tags":"machine-request.s;x"},
            {"type":"qemu","vmid":9000,"node":"pve1","name":"t","template":1},
            {"type":"storage","storage":"local-lvm","node":"pve1","content":"images,rootdir","status":"available","disk":10,"maxdisk":110,"plugintype":"lvmthin"}
        ]"#,
        )
        .unwrap();
        let s = snapshot(&r);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].vms.len(), 1, "templates are not VMs of a set");
        assert_eq!(s[0].vms[0].tags, ["machine-request.s", "x"]);
        assert_eq!(s[0].storages[0].available, 100);
        assert!(s[0].storages[0].active && s[0].storages[0].holds("images"));
        assert!(!s[1].online);
    }
}

//! Step 1, `pick_node`: which node the VM goes to, and the storage for its disks.
//!
//! One `/cluster/resources` read describes every node, VM and storage; [`placement::pick`] decides;
//! the decision is reserved in the in-memory ledger so requests running at the same moment spread
//! instead of all seeing the same "emptiest" node. With `boot: clone` the copies of the template are
//! read first (one config read each), so that placement only picks a node a clone can reach, and
//! the copy to clone is recorded with the node: nothing is written to Proxmox before that is known.
//!
//! First of all, a NIC that names a static IP pool gets its address ([`super::ip_pool::allocate`]),
//! recorded before anything else is decided.

use std::collections::BTreeMap;

use super::context::StepContext;
use super::error::StepError;
use super::step::StepOutcome;
use super::template::copies_of;
use crate::model::{ClusterSnapshot, MIB};
use crate::proxmox::types::VmId;
use crate::rules::placement::{self, PlacementRequest, Reservation};
use crate::rules::provider_data::BootMode;
use crate::rules::vm_config;

pub async fn run(ctx: &mut StepContext<'_>) -> Result<StepOutcome, StepError> {
    super::ip_pool::allocate(ctx).await?;
    if let Some(node) = &ctx.state.node
        && ctx.state.storage.is_some()
    {
        // Decided before a restart: keep the decision (and the ledger entry that spreads others).
        let reservation = Reservation {
            node: node.clone(),
            set_id: ctx.request.set_id.clone(),
            memory_bytes: ctx.data.memory_mb.saturating_mul(MIB),
            vcpus: ctx.data.vcpus(),
        };
        let placements = &ctx.services.ledgers.placements;
        placements.reserve(&ctx.request.id, reservation);
        return Ok(StepOutcome::Done);
    }
    ctx.report("reading nodes and storages").await;
    let listing = ctx.cluster(false).await?;
    // Held until the VM is placed: see `check_rules_in_turn`.
    let _turn = super::ha::check_rules_in_turn(ctx, &listing).await?;
    let cluster = ClusterSnapshot::from_resources(&listing);
    let clone = match (ctx.data.boot, &ctx.data.template) {
        (BootMode::Clone, Some(wanted)) => Some(copies_of(ctx, wanted, &listing, &cluster).await?),
        _ => None,
    };
    if let Some(source) = &clone {
        additional_disks_fit(&ctx.data, source)?;
    }
    // The storage selector each node with a `nodes:` override would use, by the same precedence as
    // every other key (the class, then the node's override, then `defaults:`): resolving the
    // provider data for that node is the one rule, so placement cannot prefer an override the class
    // outranks.
    let selector_of = |node: &String| {
        let data = ctx.services.provider_data(ctx.request, Some(node))?;
        Ok((node.clone(), data.storage_selector))
    };
    let node_selectors: BTreeMap<_, _> = (ctx.services.config.nodes.keys())
        .map(selector_of)
        .collect::<Result<_, StepError>>()?;
    let request = PlacementRequest {
        request_id: &ctx.request.id,
        data: &ctx.data,
        node_selectors: &node_selectors,
        set_id: ctx.request.set_id.as_deref(),
        limits: ctx.services.config.placement,
        clone: clone.as_ref(),
    };
    let placements = &ctx.services.ledgers.placements;
    let choice = placements
        .place(&request, |reservations| {
            placement::pick(&cluster, &request, reservations)
        })
        .map_err(StepError::Placement)?;
    let how = match choice.reason {
        placement::PlacementReason::Pinned => "using configured node",
        _ => "automatically picked node",
    };
    tracing::info!(request = %ctx.request.id, node = %choice.node, storage = %choice.storage, reason = %choice.reason, "{how}");
    ctx.state.node = Some(choice.node);
    ctx.state.storage = Some(choice.storage);
    ctx.state.request_set = ctx.request.set_id.clone();
    if let Some(template) = choice.template {
        ctx.state.template_vmid = VmId::new(template).ok();
    }
    Ok(StepOutcome::Done)
}

/// Boot mode `clone`: no `additional_disks` entry may go to a slot a copy of the template fills
/// ([`vm_config::additional_disk_clash`]), or that disk is silently never made.
fn additional_disks_fit(
    data: &crate::rules::provider_data::ProviderData,
    source: &placement::CloneSource,
) -> Result<(), StepError> {
    for template in &source.templates {
        let slots: Vec<&str> = template.drives.iter().map(|d| d.slot.as_str()).collect();
        if let Some((i, slot)) = vm_config::additional_disk_clash(data, &slots) {
            return Err(StepError::config(format!(
                "additional_disks[{i}] goes to {slot}, which template {} (VM {} on {}) already fills: \
                 the clone keeps the template's drive there and this disk would never be made; \
                 remove that drive from the template, or drop the entry and use the template's disk",
                source.wanted, template.vmid, template.node
            )));
        }
    }
    Ok(())
}

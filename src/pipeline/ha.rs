//! After the start: the VM becomes an HA resource and joins its HA rules (`ha:` in the class).
//!
//! The official provider does the same in two steps after its start (`registerHA`, `syncHARules`);
//! here it is the end of `start_vm`, which both providers re-run after a takeover, and every part
//! of it is idempotent. Rule changes go one at a time under one lock of this process, each carrying
//! the digest it was planned from; a change someone else made in between makes Proxmox refuse ours,
//! and the rules are read and planned again.

use futures_util::future::OptionFuture;

use super::context::StepContext;
use super::error::StepError;
use super::ledgers::HA_RULES_LOCK;
use crate::model::Listing;
use crate::model::identity::set_tag;
use crate::proxmox::ProxmoxError;
use crate::proxmox::client::Params;
use crate::proxmox::ha::vm_sid;
use crate::proxmox::types::{VmId, VmResource};
use crate::rules::ha::{
    HaMembership, RuleChange, check_join, plan_join, resource_affinity_rule, unmanaged_sids,
};
use crate::rules::provider_data::HaSettings;

/// How often the rules are read and planned again after a change or a refusal before giving up
/// (and retrying the step later).
const ATTEMPTS: usize = 10;

pub async fn join(ctx: &mut StepContext<'_>, vmid: VmId) -> Result<(), StepError> {
    let Some(ha) = ctx.data.ha.clone() else {
        return Ok(());
    };
    let settings = Params::new()
        .with_opt("state", ha.state.map(|s| s.as_str()))
        .with_opt("comment", ha.comment.as_deref())
        .with_opt("max_restart", ha.max_restart)
        .with_opt("max_relocate", ha.max_relocate)
        .with_opt("failback", ha.failback.map(u8::from));
    let doing = format!("registering VM {vmid} with Proxmox HA");
    ctx.call(doing, ctx.services.pve.add_ha_resource(vmid, settings))
        .await?;
    // For the official provider, whose teardown leaves HA only when its state says so.
    ctx.state.ha_registered = true;
    if ha.uses_rules() {
        join_rules(ctx, &ha, vmid).await?;
    }
    Ok(())
}

async fn join_rules(
    ctx: &mut StepContext<'_>,
    ha: &HaSettings,
    vmid: VmId,
) -> Result<(), StepError> {
    let doing = format!("adding VM {vmid} to its HA rules");
    ctx.report(doing.clone()).await;
    let _one_change_at_a_time = ctx.services.ledgers.locks.hold(HA_RULES_LOCK).await;
    let sid = vm_sid(vmid);
    let set = ctx.request.set_id.as_deref();
    let comment = format!(
        "kept by omni-infra-provider-proxmox ({}) for machine set {}",
        ctx.services.provider_id,
        set.unwrap_or("-")
    );
    // Sids Proxmox refused as not HA-managed: left out of the next writes.
    let mut gone = Vec::new();
    for _ in 0..ATTEMPTS {
        let pve = &ctx.services.pve;
        let rules = pve
            .ha_rules()
            .await
            .map_err(StepError::proxmox(doing.clone()))?;
        let needs_members = ha.resource_affinity.is_some()
            && set.is_some_and(|s| rules.iter().all(|r| r.rule != resource_affinity_rule(s)));
        // A new rule starts with the set's HA-managed VMs, seen fresh: tags and `hastate` come from
        // the config files on every read, so a VM registered moments ago is in. Only the set's
        // resource-affinity rule is bounded by the node count (a negative one); node-affinity and
        // named rules need no listing at all.
        // From a fresh `/cluster/resources` when a new rule needs its members, else from this
        // reconcile's read.
        let (members, cluster_nodes) = if ha.resource_affinity.is_some() {
            let listing = ctx.cluster(needs_members).await?;
            set_members_in(&listing, set.filter(|_| needs_members))
        } else {
            (Vec::new(), usize::MAX)
        };
        let membership = HaMembership {
            settings: ha,
            set,
            sid: &sid,
            set_members: &members,
            cluster_nodes,
            comment: &comment,
        };
        let plan = plan_join(&membership, &rules).map_err(|e| StepError::Cluster(e.to_string()))?;
        for note in &plan.notes {
            tracing::warn!(request = %ctx.request.id, %vmid, "{note}");
        }
        let last = plan.changes.len() == 1;
        let Some(mut change) = plan.changes.into_iter().next() else {
            return Ok(());
        };
        // Sids in `gone` are left out.
        let (RuleChange::Create { resources, .. } | RuleChange::Join { resources, .. }) =
            &mut change;
        resources.retain(|s| !gone.contains(s));
        let applied = match &change {
            RuleChange::Create { rule, resources } => {
                tracing::info!(rule = %rule.rule, resources = ?resources, "creating HA rule");
                pve.create_ha_rule(rule, resources).await
            }
            RuleChange::Join { rule, resources } => {
                tracing::info!(rule = %rule.rule, resources = ?resources, "adding a VM to HA rule");
                pve.set_ha_rule_resources(rule, resources).await
            }
        };
        match applied {
            Ok(()) if last => return Ok(()),
            Ok(()) => {}
            Err(e) => read_again_after(e, vmid, &mut gone, &doing)?,
        }
    }
    Err(StepError::Cluster(format!(
        "{doing}: the HA rules kept changing while they were edited ({ATTEMPTS} attempts); will try again"
    )))
}

/// A change Proxmox refused: `Ok` to read the rules and plan again (someone changed them since they
/// were read, or made the rule first; or the rule names VMs no longer HA-managed, which are then
/// added to `gone` and left out), else the step's error.
fn read_again_after(
    e: ProxmoxError,
    vmid: VmId,
    gone: &mut Vec<String>,
    doing: &str,
) -> Result<(), StepError> {
    let sid = vm_sid(vmid);
    let mut stale = match &e {
        ProxmoxError::Api { message, .. } => unmanaged_sids(message),
        _ => Vec::new(),
    };
    stale.retain(|s| *s != sid);
    match e {
        e if e.is_ha_rules_changed() || e.is_ha_rule_defined() => {
            tracing::debug!(%vmid, error = %e, "HA rules changed meanwhile; reading them again");
            Ok(())
        }
        _ if stale.iter().any(|s| !gone.contains(s)) => {
            tracing::info!(%vmid, ?stale, "HA rule names VMs no longer HA-managed; writing it without them");
            gone.extend(stale);
            Ok(())
        }
        // PVE 9 still has HA groups: the HA manager (CRM) turns them into rules by itself,
        // retrying about every minute, but only once every node runs Proxmox VE 9, is online and
        // its LRM is active or idle (pve-ha-manager src/PVE/HA/Manager.pm
        // `try_persistent_group_migration`); until then every rule write is refused.
        e if e.is_ha_groups_unmigrated() => Err(StepError::Cluster(format!(
            "{doing}: Proxmox refuses HA rules while the cluster still has HA groups ({e}); its HA \
             manager migrates them to rules once every node runs Proxmox VE 9, is online and its HA \
             LRM is active or idle (see `journalctl -u pve-ha-crm`, \"ha groups migration\"): \
             finish the upgrade or bring those nodes back, or remove the HA groups \
             (Datacenter > HA > Groups); retried until then"
        ))),
        e => Err(StepError::proxmox(doing)(e)),
    }
}

/// The HA-managed VMs of `set` in a listing (as sids; none without a set) and its number of nodes.
pub(super) fn set_members_in(listing: &Listing, set: Option<&str>) -> (Vec<String>, usize) {
    let tag = set.map(set_tag);
    let members = (tag.iter().flat_map(|tag| listing.tagged(tag)))
        .filter(|vm| vm.hastate.is_some())
        .map(|vm| vm_sid(vm.vmid))
        .collect();
    (members, listing.nodes().count())
}

/// Before anything is made: whether the VM can join the HA rules its class puts it in without
/// Proxmox calling the rule set infeasible ([`check_join`]); the join comes after the start, where
/// a refusal would repeat on every retry. Without HA rules (PVE 8) or the right to read them, the
/// join decides, as before.
///
/// Checked in the set's turn, which the returned guard holds until the VM is placed: the check
/// counts the machines of the set placed before this one, so two machines of a set checked at once
/// would not count each other.
pub(super) async fn check_rules_in_turn(
    ctx: &StepContext<'_>,
    listing: &Listing,
) -> Result<Option<tokio::sync::OwnedMutexGuard<()>>, StepError> {
    let Some(ha) = ctx.data.ha.clone().filter(HaSettings::uses_rules) else {
        return Ok(None);
    };
    let locks = &ctx.services.ledgers.locks;
    let set = ctx.request.set_id.as_deref();
    let key = set.map(|set| format!("ha-placement:{set}"));
    let turn = OptionFuture::from(key.as_deref().map(|key| locks.hold(key))).await;
    let rules = match ctx.services.pve.ha_rules().await {
        Ok(rules) => rules,
        Err(ProxmoxError::Api { status: 501, .. } | ProxmoxError::PermissionDenied { .. }) => {
            return Ok(turn);
        }
        Err(e) => return Err(StepError::proxmox("reading the HA rules")(e)),
    };
    let (mut members, cluster_nodes) = set_members_in(listing, set);
    // The set's VMs that will join its rules but are not HA-managed yet count too: made (tagged in
    // the listing) or placed by this process and not listed yet (by request ID), so machines of a
    // burst are counted together.
    if let Some(set) = set {
        let tag = set_tag(set);
        let listed: Vec<&VmResource> = listing.tagged(&tag).collect();
        let made = listed.iter().filter(|vm| vm.hastate.is_none());
        let mut placed = ctx.services.ledgers.placements.in_set(set, &ctx.request.id);
        placed.retain(|id| !listed.iter().any(|vm| vm.name.as_ref() == Some(id)));
        members.extend(made.map(|vm| vm_sid(vm.vmid)).chain(placed));
    }
    let membership = HaMembership {
        settings: &ha,
        set,
        sid: "",
        set_members: &members,
        cluster_nodes,
        comment: "",
    };
    check_join(&membership, &rules)
        .map_err(|e| StepError::key("ha", format!("{e} (checked before creating the VM)")))?;
    Ok(turn)
}

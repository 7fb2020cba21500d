//! Step 3, `create_vm`: the VM exists exactly once, whatever crashes or races happen.
//!
//! - First look: a VM that already belongs to this request (named after it and carrying our provider
//!   tag) anywhere in the cluster is adopted, wherever it is now.
//! - Otherwise ask `/cluster/nextid` (it sees guests the token cannot list and honours the datacenter's
//!   `next-id` range), step over VMIDs of requests in flight, **record it in the provider state before
//!   the create call**, then create or clone. A crash at any instant leaves either no VM
//!   or a VM we find again by that VMID or by name.
//! - Proxmox answering "already exists" (someone else took the VMID between our read and the create)
//!   means: choose another.
//!
//! Boot mode `iso` creates the VM with its whole configuration in one call, so the NoCloud seed is
//! uploaded first; boot mode `clone` clones here and configures in the next step.

use super::seed::upload_seed;
use super::step::{StepContext, StepError, StepOutcome};
use super::vm_config::{self, VmIdentity, VmTarget};
use crate::model::ClusterSnapshot;
use crate::proxmox::property::parse_tags;
use crate::proxmox::property::{IsoVolume, PoolId, StorageId};
use crate::proxmox::types::{ClusterResource, NodeName, NodeState, VmId, VmResource};
use crate::rules::storage::{self, StorageNeed};

/// How long to wait before looking again at a recorded VM that cannot be identified yet.
const WAIT_FOR_IDENTITY: std::time::Duration = std::time::Duration::from_secs(5);

/// How many taken VMIDs to step over before giving up (each costs one refused create).
const VMID_ATTEMPTS: usize = 5;

pub async fn run(ctx: &mut StepContext<'_>) -> Result<StepOutcome, StepError> {
    if ctx.state.uuid.is_empty() {
        ctx.state.uuid = uuid::Uuid::new_v4().to_string();
    }
    let node = ctx.node()?;
    let request_id = ctx.request.id.clone();
    let provider_id = ctx.services.provider_id.clone();
    let resources = ctx.cluster(true).await?.to_vec();
    if let Some(vm) = find_own_vm(&resources, &request_id, &provider_id) {
        tracing::info!(request = %request_id, vmid = %vm.vmid, node = %vm.node, "adopting the VM made for this request earlier");
        ctx.state.vmid = vm.vmid.get() as i32;
        ctx.state.node = vm.node.to_string();
        ctx.services.ledgers.release_vmid(vm.vmid.get());
        return Ok(StepOutcome::Done);
    }
    // The official provider records the VMID it created (named after the request, without our tag):
    // continuing its request, that VM is the request's, not a reason to create a second.
    if let Some(vm) = recorded_vm(&resources, ctx.state.vmid, &request_id) {
        tracing::info!(request = %request_id, vmid = %vm.vmid, node = %vm.node, "continuing with the VM the provider state records");
        ctx.state.node = vm.node.to_string();
        ctx.services.ledgers.release_vmid(vm.vmid.get());
        return Ok(StepOutcome::Done);
    }
    if let Some(vm) =
        unidentified_recorded_vm(&resources, recorded_vmid(ctx), &request_id, &provider_id)
    {
        match identify_unnamed(ctx, vm, &resources).await? {
            Unnamed::Ours => {
                tracing::info!(request = %request_id, vmid = %vm.vmid, node = %vm.node, "adopting the VM made for this request earlier (identified by its config)");
                ctx.state.vmid = vm.vmid.get() as i32;
                ctx.state.node = vm.node.to_string();
                ctx.services.ledgers.release_vmid(vm.vmid.get());
                return Ok(StepOutcome::Done);
            }
            Unnamed::NotOurs => {}
            Unnamed::CannotTell(why) => {
                return Ok(StepOutcome::Requeue {
                    after: WAIT_FOR_IDENTITY,
                    why,
                });
            }
        }
    }

    default_pool(ctx).await?;
    let mut refused: Vec<u32> = Vec::new();
    for _ in 0..VMID_ATTEMPTS {
        let vmid = choose_vmid(ctx, &resources, &refused).await?;
        ctx.state.reserved_vmid = vmid.get() as i32;
        ctx.persist().await?;
        let result = match ctx.data.boot {
            super::provider_data::BootMode::Iso => create(ctx, &node, vmid, &resources).await,
            super::provider_data::BootMode::Clone => clone(ctx, &node, vmid, &resources).await,
        };
        match result {
            Ok(()) => {
                ctx.state.vmid = vmid.get() as i32;
                ctx.persist().await?;
                ctx.services.ledgers.release_vmid(vmid.get());
                return Ok(StepOutcome::Done);
            }
            Err(StepError::Proxmox { source, .. }) if source.is_vmid_taken() => {
                tracing::info!(request = %request_id, %vmid, "VMID taken meanwhile; choosing another");
                // The task was recorded as if it would make our VM; the VMID is someone else's.
                if i64::from(ctx.state.vmid) == i64::from(vmid.get()) {
                    ctx.state.vmid = 0;
                    ctx.state.vm_create_task.clear();
                }
                ctx.services.ledgers.release_vmid(vmid.get());
                refused.push(vmid.get());
            }
            Err(e) => return Err(e),
        }
    }
    Err(StepError::Cluster(format!(
        "could not find a free VMID after {VMID_ATTEMPTS} tries (refused: {refused:?}); something else is creating VMs very fast"
    )))
}

/// Without a `pool` in the class, the VM goes into a pool named after its machine-request set, created
/// on demand (as the official provider does). Created once per set and process.
async fn default_pool(ctx: &mut StepContext<'_>) -> Result<(), StepError> {
    if ctx.data.pool.is_some() {
        return Ok(());
    }
    let Some(set) = ctx.request.set_id.clone() else {
        return Ok(());
    };
    let pool = match PoolId::new(set.clone()) {
        Ok(p) if set.starts_with(|c: char| c.is_ascii_alphabetic()) => p,
        _ => {
            tracing::info!(request = %ctx.request.id, set = %set, "set ID is not a valid pool name; no default pool");
            return Ok(());
        }
    };
    let known = ctx.services.ledgers.pool_known(pool.as_str());
    if !known {
        let doing = format!("creating pool {pool} for machine-request set {set}");
        ctx.report(doing.clone()).await;
        ctx.services
            .pve
            .ensure_pool(
                pool.as_str(),
                &format!(
                    "Created by the Omni infrastructure provider for machine-request set {set}"
                ),
            )
            .await
            .map_err(StepError::proxmox(doing))?;
        ctx.services.ledgers.pool_created(pool.as_str());
    }
    ctx.state.default_pool = pool.as_str().to_owned();
    ctx.data.pool = Some(pool);
    Ok(())
}

/// The VM this request made earlier, if any: named after the request and carrying our tag (in any
/// case: Proxmox lowercases tags by default).
pub fn find_own_vm<'a>(
    resources: &'a [ClusterResource],
    request_id: &str,
    provider_id: &str,
) -> Option<&'a VmResource> {
    resources.iter().find_map(|r| match r {
        ClusterResource::Vm(vm) if vm_config::listed_as_ours(vm, Some(request_id), provider_id) => {
            Some(vm)
        }
        _ => None,
    })
}

/// The VMID this request recorded: its `vmid`, else the `reserved_vmid` written before the create.
fn recorded_vmid(ctx: &StepContext<'_>) -> Option<VmId> {
    [ctx.state.vmid, ctx.state.reserved_vmid]
        .into_iter()
        .find(|v| *v > 0)
        .and_then(|v| u32::try_from(v).ok())
        .and_then(|v| VmId::new(v).ok())
}

/// The VM at the recorded VMID when the listing cannot say whether it is ours: listed without a name
/// (the listing takes name, status and template from what pvestatd last reported, which a VM made
/// seconds ago, or one on a node offline for minutes, does not have yet), or named after the request
/// without our tags (a clone not configured yet: the clone call takes no tags). Such a VM may well
/// be ours, and creating another would leave two.
pub fn unidentified_recorded_vm<'a>(
    resources: &'a [ClusterResource],
    recorded: Option<VmId>,
    request_id: &str,
    provider_id: &str,
) -> Option<&'a VmResource> {
    let recorded = recorded?;
    resources.iter().find_map(|r| match r {
        ClusterResource::Vm(vm)
            if vm.vmid == recorded
                && (vm.name.is_none()
                    || (vm.name.as_deref() == Some(request_id)
                        && !vm_config::listed_as_ours(vm, Some(request_id), provider_id))) =>
        {
            Some(vm)
        }
        _ => None,
    })
}

/// What the config of an unnamed recorded VM says.
enum Unnamed {
    Ours,
    /// Someone else's (or gone): the VMID is simply taken, choose another.
    NotOurs,
    /// Its node cannot be asked: wait, never replace it.
    CannotTell(String),
}

async fn identify_unnamed(
    ctx: &StepContext<'_>,
    vm: &VmResource,
    resources: &[ClusterResource],
) -> Result<Unnamed, StepError> {
    let online = resources.iter().any(|r| {
        matches!(r, ClusterResource::Node(n) if n.node == vm.node && n.status == NodeState::Online)
    });
    if !online {
        return Ok(Unnamed::CannotTell(format!(
            "VM {} recorded for this request is on node {}, which is not online, and the listing cannot say whose it is; waiting for the node rather than creating a second VM",
            vm.vmid, vm.node
        )));
    }
    let doing = format!(
        "reading the config of VM {} on {} to see whether it is this request's",
        vm.vmid, vm.node
    );
    let config = match ctx.services.pve.vm_config(&vm.node, vm.vmid).await {
        Ok(c) => c,
        Err(e) if e.is_not_found() => return Ok(Unnamed::NotOurs),
        Err(e) => return Err(StepError::proxmox(doing)(e)),
    };
    if config.get("template").as_deref() == Some("1") {
        return Ok(Unnamed::NotOurs);
    }
    if let Some(lock) = config.get("lock").filter(|l| !l.is_empty()) {
        // A create or clone still running: its config is not complete yet.
        return Ok(Unnamed::CannotTell(format!(
            "VM {} recorded for this request is locked ({lock}) on {}; waiting for it rather than creating a second VM",
            vm.vmid, vm.node
        )));
    }
    let tags = config
        .get("tags")
        .map(|t| parse_tags(&t))
        .unwrap_or_default();
    let tag_refs: Vec<&str> = tags.iter().map(String::as_str).collect();
    let configured = vm_config::has_tag(
        &tag_refs,
        &vm_config::provider_tag(&ctx.services.provider_id),
    );
    // A clone not configured yet still has the SMBIOS UUID Proxmox gave it at clone time; ours is
    // set by `configure_vm`, so it is checked only once the VM carries our tags.
    let ownership = vm_config::check_ownership_with_uuid(
        &config.get("name").unwrap_or_default(),
        &tags,
        &config.get("description").unwrap_or_default(),
        config.get("smbios1").as_deref(),
        configured.then_some(ctx.state.uuid.as_str()),
        &ctx.request.id,
        &ctx.services.provider_id,
    );
    Ok(match ownership {
        vm_config::Ownership::Ours => Unnamed::Ours,
        // The official provider's VM at the VMID its state records: the rule of `recorded_vm`, for a
        // listing that cannot show the name yet.
        vm_config::Ownership::Legacy if i64::from(vm.vmid.get()) == i64::from(ctx.state.vmid) => {
            Unnamed::Ours
        }
        vm_config::Ownership::Legacy | vm_config::Ownership::NotOurs(_) => Unnamed::NotOurs,
    })
}

/// The VM the state's `vmid` names, if it exists and is named after the request.
fn recorded_vm<'a>(
    resources: &'a [ClusterResource],
    vmid: i32,
    request_id: &str,
) -> Option<&'a VmResource> {
    resources.iter().find_map(|r| match r {
        ClusterResource::Vm(vm)
            if !vm.template
                && i64::from(vm.vmid.get()) == i64::from(vmid)
                && vm.name.as_deref() == Some(request_id) =>
        {
            Some(vm)
        }
        _ => None,
    })
}

/// How many VMIDs above `/cluster/nextid`'s answer to check before giving up.
const VMID_PROBES: u32 = 64;

/// The recorded VMID when it is still free, else the first VMID from `/cluster/nextid` on that no
/// request in flight and no earlier refusal uses. Proxmox decides what is free: the listing hides
/// guests the token may not audit, and only nextid knows the datacenter's `next-id` range.
async fn choose_vmid(
    ctx: &StepContext<'_>,
    resources: &[ClusterResource],
    refused: &[u32],
) -> Result<VmId, StepError> {
    let listed: std::collections::BTreeSet<u32> = resources
        .iter()
        .filter_map(|r| match r {
            ClusterResource::Vm(vm) | ClusterResource::Container(vm) => Some(vm.vmid.get()),
            _ => None,
        })
        .collect();
    let pve = &ctx.services.pve;
    let asking = "choosing a VMID (GET /cluster/nextid)";
    let usable = |id: u32| !listed.contains(&id) && !refused.contains(&id);
    let reserved = u32::try_from(ctx.state.reserved_vmid)
        .ok()
        .and_then(|id| VmId::new(id).ok())
        .filter(|id| usable(id.get()));
    if let Some(id) = reserved
        && pve
            .vmid_is_free(id)
            .await
            .map_err(StepError::proxmox(asking))?
        && take_vmid(ctx, id)
    {
        return Ok(id);
    }
    let first = pve.next_vmid().await.map_err(StepError::proxmox(asking))?;
    for id in (first.get()..=VmId::MAX).take(VMID_PROBES as usize) {
        let Ok(id) = VmId::new(id) else { break };
        if !usable(id.get()) || in_flight(ctx, id) {
            continue;
        }
        // nextid vouched for its own answer; any higher VMID is checked the same way.
        let free = id == first
            || pve
                .vmid_is_free(id)
                .await
                .map_err(StepError::proxmox(asking))?;
        if free && take_vmid(ctx, id) {
            return Ok(id);
        }
    }
    Err(StepError::Cluster(format!(
        "no free VMID among the {VMID_PROBES} from {first} on (Proxmox's next free VMID); \
         widen the datacenter's next-id range (Datacenter > Options > Next Free VMID Range)"
    )))
}

fn in_flight(ctx: &StepContext<'_>, id: VmId) -> bool {
    ctx.services.ledgers.vmid_in_flight(id.get())
}

/// Marks `id` as in flight; false when a concurrent request took it first.
fn take_vmid(ctx: &StepContext<'_>, id: VmId) -> bool {
    ctx.services.ledgers.take_vmid(id.get())
}

async fn create(
    ctx: &mut StepContext<'_>,
    node: &NodeName,
    vmid: VmId,
    resources: &[ClusterResource],
) -> Result<(), StepError> {
    let seed = upload_seed(ctx, node).await?;
    let target = target(ctx, node, vmid, resources, Some(seed))?;
    let identity = VmIdentity {
        request_id: &ctx.request.id,
        set_id: ctx.request.set_id.as_deref(),
        provider_id: &ctx.services.provider_id,
    };
    let params: Vec<(String, String)> = vm_config::render(&ctx.data, &identity, &target)
        .map_err(|e| StepError::Config(format!("cannot build the VM configuration: {e}")))?
        .into_iter()
        .filter(|(k, _)| k != "vmid")
        .collect();
    let doing = format!("creating VM {vmid} on {node}");
    ctx.report(doing.clone()).await;
    let pve = &ctx.services.pve;
    let task = pve
        .create_vm(node, vmid, params)
        .await
        .map_err(StepError::proxmox(doing.clone()))?;
    record_create_task(ctx, vmid, &task).await?;
    let pve = &ctx.services.pve;
    pve.wait_for_task(&task, ctx.services.timeouts.task)
        .await
        .map_err(StepError::proxmox(doing))?;
    Ok(())
}

async fn clone(
    ctx: &mut StepContext<'_>,
    node: &NodeName,
    vmid: VmId,
    resources: &[ClusterResource],
) -> Result<(), StepError> {
    let template_id = u32::try_from(ctx.state.template_vmid)
        .ok()
        .and_then(|v| VmId::new(v).ok())
        .ok_or_else(|| StepError::Cluster("no template recorded by prepare_image".into()))?;
    let template = resources
        .iter()
        .find_map(|r| match r {
            ClusterResource::Vm(vm) if vm.vmid == template_id => Some(vm),
            _ => None,
        })
        .ok_or_else(|| {
            StepError::Cluster(format!("template {template_id} is gone from the cluster"))
        })?;
    let storage = StorageId::new(ctx.state.storage.clone())
        .map_err(|e| StepError::Cluster(format!("recorded storage: {e}")))?;
    // Whether a clone of this template reaches `node` (and `storage`) was decided by the placement
    // rule (`rules::placement::clone_verdict`) in `pick_node` or `prepare_image`, before anything
    // was written.
    let identity = VmIdentity {
        request_id: &ctx.request.id,
        set_id: ctx.request.set_id.as_deref(),
        provider_id: &ctx.services.provider_id,
    };
    let params = vm_config::clone_params(
        &ctx.data,
        &identity,
        vmid.get(),
        node.as_str(),
        &storage,
        ctx.data.clone_mode,
    );
    let doing = format!(
        "cloning template {template_id} on {} to VM {vmid} on {node}",
        template.node
    );
    ctx.report(doing.clone()).await;
    let pve = &ctx.services.pve;
    let task = pve
        .clone_vm_with(&template.node, template_id, params)
        .await
        .map_err(StepError::proxmox(doing.clone()))?;
    record_create_task(ctx, vmid, &task).await?;
    let pve = &ctx.services.pve;
    pve.wait_for_task(&task, ctx.services.timeouts.task)
        .await
        .map_err(StepError::proxmox(doing))?;
    Ok(())
}

/// The create (or clone) task and its VMID, recorded as the official provider records them: when it
/// re-runs its VM step it checks this task instead of creating another VM.
async fn record_create_task(
    ctx: &mut StepContext<'_>,
    vmid: VmId,
    task: &crate::proxmox::types::Upid,
) -> Result<(), StepError> {
    ctx.state.vm_create_task = task.to_string();
    ctx.state.vmid = vmid.get() as i32;
    ctx.persist().await
}

/// Everything `vm_config::render` needs that earlier steps decided.
pub fn target(
    ctx: &StepContext<'_>,
    node: &NodeName,
    vmid: VmId,
    resources: &[ClusterResource],
    seed_iso: Option<IsoVolume>,
) -> Result<VmTarget, StepError> {
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        StepError::Cluster(format!("recorded {what} is not usable: {e}"))
    };
    let storage = StorageId::new(ctx.state.storage.clone()).map_err(|e| bad("storage", &e))?;
    let boot_iso = if ctx.state.boot_iso_volume.is_empty() {
        None
    } else {
        Some(IsoVolume::parse(&ctx.state.boot_iso_volume).map_err(|e| bad("boot ISO", &e))?)
    };
    let seed_iso = match seed_iso {
        Some(s) => s,
        None => IsoVolume::parse(&ctx.state.seed_iso_volume).map_err(|e| bad("seed ISO", &e))?,
    };
    let smbios_uuid = uuid::Uuid::parse_str(&ctx.state.uuid).map_err(|e| bad("SMBIOS UUID", &e))?;
    let mut additional_disk_storages = Vec::new();
    for (i, disk) in ctx.data.additional_disks.iter().enumerate() {
        additional_disk_storages.push(disk_storage(resources, node, disk, i)?);
    }
    Ok(VmTarget {
        vmid: vmid.get(),
        storage,
        additional_disk_storages,
        smbios_uuid,
        boot_iso,
        seed_iso,
        mac: None,
    })
}

/// The storage for an additional disk, by the disk's own selector, on the node placement picked.
fn disk_storage(
    resources: &[ClusterResource],
    node: &NodeName,
    disk: &super::provider_data::AdditionalDisk,
    index: usize,
) -> Result<StorageId, StepError> {
    let cluster = ClusterSnapshot::from_resources(resources);
    let choice = cluster.node(node.as_str()).map(|n| {
        storage::choose(
            n,
            &StorageNeed::additional_disk(&disk.storage_selector, disk.size_gb),
        )
    });
    if let Some(e) = choice.as_ref().and_then(|c| c.selector_error()) {
        return Err(StepError::Config(format!(
            "additional_disks[{index}].storage_selector: {e}"
        )));
    }
    match choice.and_then(|c| c.chosen) {
        Some(s) => StorageId::new(s.name).map_err(|e| StepError::Cluster(e.to_string())),
        None => Err(StepError::Cluster(format!(
            "additional_disks[{index}]: no storage on {node} matches `{}` with {} GB free",
            disk.storage_selector.expression(),
            disk.size_gb
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(json: serde_json::Value) -> Vec<ClusterResource> {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn adoption_finds_our_vm_whatever_the_case_of_its_tags() {
        // PVE stores tags lowercased by default: provider "Prox-A" finds "omni-provider.prox-a".
        let resources = listing(serde_json::json!([
            {"type": "qemu", "vmid": 104, "node": "pve1", "name": "Req-1",
             "tags": "omni-provider.prox-a;omni-request.req-1"},
            {"type": "qemu", "vmid": 105, "node": "pve1", "name": "Req-1", "template": 1,
             "tags": "omni-provider.prox-a"}
        ]));
        let found = find_own_vm(&resources, "Req-1", "Prox-A").map(|vm| vm.vmid.get());
        assert_eq!(found, Some(104));
        assert!(find_own_vm(&resources, "Req-1", "other").is_none());
    }

    #[test]
    fn a_recorded_vmid_listed_without_name_needs_its_config() {
        // pve-manager PVE/API2Tools.pm extract_vm_stats: no RRD data yet, no name.
        let resources = listing(serde_json::json!([
            {"type": "qemu", "vmid": 104, "node": "pve1", "status": "unknown",
             "tags": "omni-provider.proxmox"},
            {"type": "qemu", "vmid": 105, "node": "pve1", "name": "other"},
            {"type": "qemu", "vmid": 106, "node": "pve1", "name": "req-1"},
            {"type": "qemu", "vmid": 107, "node": "pve1", "name": "req-1",
             "tags": "omni-provider.proxmox"}
        ]));
        let at = |id| {
            unidentified_recorded_vm(&resources, VmId::new(id).ok(), "req-1", "proxmox")
                .map(|vm| vm.vmid.get())
        };
        assert_eq!(at(104), Some(104));
        assert_eq!(at(105), None, "named otherwise: the listing decides");
        assert_eq!(at(106), Some(106), "an untagged clone of this request");
        assert_eq!(at(107), None, "ours by the listing: adopted directly");
        assert_eq!(
            unidentified_recorded_vm(&resources, None, "req-1", "proxmox").map(|v| v.vmid),
            None
        );
    }
}

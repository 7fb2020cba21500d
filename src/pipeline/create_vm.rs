//! Step 3, `create_vm`: the VM exists exactly once, whatever crashes or races happen.
//!
//! - First look: a VM that already belongs to this request (named after it and carrying our provider
//!   tag) anywhere in the cluster is adopted, wherever it is now.
//! - Otherwise choose a VMID locally from the same `/cluster/resources` read (no `/cluster/nextid`
//!   round trip, and the in-flight set keeps concurrent requests apart), **record it in the provider
//!   state before the create call**, then create or clone. A crash at any instant leaves either no VM
//!   or a VM we find again by that VMID or by name.
//! - Proxmox answering "already exists" (someone else took the VMID between our read and the create)
//!   means: choose another.
//!
//! Boot mode `iso` creates the VM with its whole configuration in one call, so the NoCloud seed is
//! uploaded first; boot mode `clone` clones here and configures in the next step.

use super::configure_vm::upload_seed;
use super::pick_node::node_storages;
use super::step::{StepContext, StepError, StepOutcome};
use super::vm_config::{self, VmIdentity, VmTarget};
use crate::proxmox::property::{IsoVolume, PoolId, StorageId};
use crate::proxmox::types::{ClusterResource, NodeName, VmId, VmResource};

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
        ctx.services.release_vmid(vm.vmid.get());
        return Ok(StepOutcome::Done);
    }
    // The official provider records the VMID it created (named after the request, without our tag):
    // continuing its request, that VM is the request's, not a reason to create a second.
    if let Some(vm) = recorded_vm(&resources, ctx.state.vmid, &request_id) {
        tracing::info!(request = %request_id, vmid = %vm.vmid, node = %vm.node, "continuing with the VM the provider state records");
        ctx.state.node = vm.node.to_string();
        return Ok(StepOutcome::Done);
    }

    default_pool(ctx).await?;
    let mut refused: Vec<u32> = Vec::new();
    for _ in 0..VMID_ATTEMPTS {
        let vmid = choose_vmid(ctx, &resources, &refused)?;
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
                ctx.services.release_vmid(vmid.get());
                return Ok(StepOutcome::Done);
            }
            Err(StepError::Proxmox { source, .. }) if source.is_vmid_taken() => {
                tracing::info!(request = %request_id, %vmid, "VMID taken meanwhile; choosing another");
                ctx.services.release_vmid(vmid.get());
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
    let known = ctx
        .services
        .pools_created
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(pool.as_str());
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
        ctx.services
            .pools_created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pool.as_str().to_owned());
    }
    ctx.state.default_pool = pool.as_str().to_owned();
    ctx.data.pool = Some(pool);
    Ok(())
}

/// The VM this request made earlier, if any: named after the request and carrying our tag.
pub fn find_own_vm<'a>(
    resources: &'a [ClusterResource],
    request_id: &str,
    provider_id: &str,
) -> Option<&'a VmResource> {
    let tag = vm_config::provider_tag(provider_id);
    resources.iter().find_map(|r| match r {
        ClusterResource::Vm(vm)
            if !vm.template && vm.name.as_deref() == Some(request_id) && vm.has_tag(&tag) =>
        {
            Some(vm)
        }
        _ => None,
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

/// The recorded VMID when it is still free, else the lowest VMID no VM, no request in flight and no
/// earlier refusal uses.
fn choose_vmid(
    ctx: &StepContext<'_>,
    resources: &[ClusterResource],
    refused: &[u32],
) -> Result<VmId, StepError> {
    let used: std::collections::BTreeSet<u32> = resources
        .iter()
        .filter_map(|r| match r {
            ClusterResource::Vm(vm) | ClusterResource::Container(vm) => Some(vm.vmid.get()),
            _ => None,
        })
        .collect();
    let mut in_flight = ctx
        .services
        .vmids_in_flight
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let reserved = u32::try_from(ctx.state.reserved_vmid).unwrap_or(0);
    let free = |id: u32| !used.contains(&id) && !refused.contains(&id);
    let id = if reserved >= VmId::MIN && free(reserved) {
        Some(reserved)
    } else {
        (VmId::MIN..=VmId::MAX).find(|id| free(*id) && !in_flight.contains(id))
    };
    let vmid = id
        .and_then(|id| VmId::new(id).ok())
        .ok_or_else(|| StepError::Cluster("no free VMID left in the cluster".into()))?;
    in_flight.insert(vmid.get());
    Ok(vmid)
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
    if template.node != *node && !storage_is_shared(resources, node, &storage) {
        return Err(StepError::Cluster(format!(
            "template {template_id} is on {} but the VM goes to {node}, and Proxmox clones to another node only onto shared storage ({storage} is local to {node}); keep a copy of the template on {node}, pin `node: {}`, or select a shared storage with storage_selector",
            template.node, template.node
        )));
    }
    let identity = VmIdentity {
        request_id: &ctx.request.id,
        set_id: ctx.request.set_id.as_deref(),
        provider_id: &ctx.services.provider_id,
    };
    let params = vm_config::clone_params(&ctx.data, &identity, vmid.get(), node.as_str(), &storage);
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

fn storage_is_shared(resources: &[ClusterResource], node: &NodeName, storage: &StorageId) -> bool {
    resources.iter().any(|r| {
        matches!(r, ClusterResource::Storage(s)
            if s.node == *node && s.storage == storage.as_str() && s.shared)
    })
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

/// The storage for an additional disk: the first on the node (API order) that holds VM images, is
/// active, matches the disk's own selector and has room.
fn disk_storage(
    resources: &[ClusterResource],
    node: &NodeName,
    disk: &super::provider_data::AdditionalDisk,
    index: usize,
) -> Result<StorageId, StepError> {
    let needed = disk.size_gb.saturating_mul(1024 * 1024 * 1024);
    for s in node_storages(resources, node.as_str())
        .iter()
        .filter(|s| s.holds("images") && s.active && s.available >= needed)
    {
        let matches = disk
            .storage_selector
            .matches(&s.facts(node.as_str()))
            .map_err(|e| {
                StepError::Config(format!("additional_disks[{index}].storage_selector: {e}"))
            })?;
        if matches {
            return StorageId::new(s.name.clone()).map_err(|e| StepError::Cluster(e.to_string()));
        }
    }
    Err(StepError::Cluster(format!(
        "additional_disks[{index}]: no storage on {node} matches `{}` with {} GB free",
        disk.storage_selector.expression(),
        disk.size_gb
    )))
}

//! Step 3, `create_vm`: the VM exists exactly once, whatever crashes or races happen.
//!
//! - First look: a VM that already belongs to this request (by `model::identity`, the rule teardown
//!   uses too) is adopted, wherever it is now. The listing is read again for that only when a VMID
//!   was recorded: without one, no VM of the request can exist.
//! - Otherwise choose a VMID ([`crate::rules::vmid`]: the lowest free one of the datacenter's
//!   `next-id` range by the listing when the token sees every guest, else `/cluster/nextid`), step
//!   over VMIDs of requests in flight, **record it in the provider state before the create call**,
//!   then create or clone. A crash at any instant leaves either no VM or a VM we find again by that
//!   VMID or by name.
//! - Proxmox answering "already exists" (someone else took the VMID between our read and the create)
//!   means: choose another.
//!
//! Boot mode `iso` creates the VM with its whole configuration in one call, so the NoCloud seed is
//! uploaded first; boot mode `clone` clones here and configures in the next step, with the same
//! seed upload ([`upload_seed`]) and VM settings ([`target`]).

use super::context::{StepContext, recorded};
use super::error::StepError;
use super::identify::identify;
use super::prepare_image::download_storage;
use super::services::TASK_TIMEOUT;
use super::step::StepOutcome;
use crate::model::identity::{self, Claim, Ownership};
use crate::model::{ClusterSnapshot, Listing};
use crate::proxmox::client::UploadContent;
use crate::proxmox::property::{IsoFileName, IsoVolume, PoolId};
use crate::proxmox::types::{NodeName, VmId};
use crate::rules::cloud_init::{self, seed_iso, seed_iso_file_name};
use crate::rules::provider_data::{AdditionalDisk, BootMode};
use crate::rules::storage::{self, Content, StorageNeed};
use crate::rules::vm_config::{self, VmTarget};
use crate::rules::vmid::{self, VmidSource};
use std::collections::BTreeSet;

/// How long to wait before looking again at a recorded VM that cannot be identified yet.
const WAIT_FOR_IDENTITY: std::time::Duration = std::time::Duration::from_secs(5);

/// How many taken VMIDs to step over before giving up (each costs one refused create).
const VMID_ATTEMPTS: usize = 5;

pub async fn run(ctx: &mut StepContext<'_>, node: &NodeName) -> Result<StepOutcome, StepError> {
    ctx.state.uuid.get_or_insert_with(uuid::Uuid::new_v4);
    let request_id = &ctx.request.id;
    // A VM of this request can exist only if a VMID was recorded for it (ours is recorded before the
    // create call; the official provider records its own): only then must the listing be fresh to
    // adopt it. Otherwise the listing placement read moments ago in this reconcile will do, for
    // choosing a VMID too: one made since is refused by Proxmox, not overwritten.
    let must_be_fresh = ctx.state.recorded_vmid().is_some();
    let listing = ctx.cluster(must_be_fresh).await?;
    if let Some(outcome) = adopt(ctx, &listing).await? {
        return Ok(outcome);
    }

    let ledgers = &ctx.services.ledgers;
    ledgers.ip.seed_once(&ledgers.vmids, ctx.store).await?;
    default_pool(ctx).await?;
    // Field 12, for the official provider's teardown after a takeover.
    ctx.state.pool = ctx.data.pool.clone();
    // No create was ever sent for this request (none recorded a VMID): if the first one answers,
    // none can land later.
    let first_create_ever = ctx.state.recorded_vmid().is_none();
    let mut refused: Vec<u32> = Vec::new();
    for attempt in 0..VMID_ATTEMPTS {
        let vmid = choose_vmid(ctx, &listing, &refused).await?;
        ctx.state.reserved_vmid = Some(vmid);
        ctx.persist().await?;
        match make(ctx, node, vmid, &listing).await {
            Ok(()) => {
                ctx.services.ledgers.vmids.made(vmid.get());
                if first_create_ever && attempt == 0 {
                    ctx.services.ledgers.releases.created_cleanly(request_id);
                }
                ctx.state.vmid = Some(vmid);
                ctx.persist().await?;
                return Ok(StepOutcome::Done);
            }
            Err(StepError::Proxmox { source, .. }) if source.is_vmid_taken() => {
                // Taken by whom? A create of ours sent before a crash, whose answer never came, can
                // land just now at this very VMID: that VM is this request's, not a stranger's.
                let fresh = ctx.cluster(true).await?;
                if let Some(outcome) = adopt(ctx, &fresh).await? {
                    return Ok(outcome);
                }
                tracing::info!(request = %request_id, %vmid, "VMID taken meanwhile; choosing another");
                ctx.services.ledgers.vmids.refused();
                // The task was recorded as if it would make our VM; the VMID is someone else's.
                if ctx.state.vmid == Some(vmid) {
                    ctx.state.vmid = None;
                    ctx.state.vm_create_task = None;
                }
                ctx.services.ledgers.vmids.release(vmid.get());
                refused.push(vmid.get());
            }
            Err(e) => {
                // The VMID stays recorded for this request (its create may yet be applied); only
                // this process's in-flight mark goes, or the next attempt could not reuse it and
                // would pick another VMID, a second VM if the first create lands late.
                ctx.services.ledgers.vmids.release(vmid.get());
                // A create refused because the boot ISO or the set's pool went meanwhile made
                // nothing: put it back and create again (at the recorded VMID).
                if !super::prepare_image::put_back_if_missing(ctx, node, &e).await?
                    && !recreate_set_pool(ctx, &e).await?
                {
                    return Err(e);
                }
            }
        }
    }
    Err(StepError::Cluster(format!(
        "could not find a free VMID after {VMID_ATTEMPTS} tries (refused: {refused:?}); something else is creating VMs very fast"
    )))
}

/// Without a `pool` in the class, the VM goes into a pool named after its machine-request set, created
/// on demand (as the official provider does). Created once per set and process.
async fn default_pool(ctx: &mut StepContext<'_>) -> Result<(), StepError> {
    let (None, Some(set)) = (&ctx.data.pool, ctx.request.set_id.as_deref()) else {
        return Ok(());
    };
    let pool = match PoolId::new(set) {
        Ok(p) if set.starts_with(|c: char| c.is_ascii_alphabetic()) => p,
        _ => {
            tracing::info!(request = %ctx.request.id, set = %set, "set ID is not a valid pool name; no default pool");
            return Ok(());
        }
    };
    // Machines of a set starting together make its pool once: the others wait for the first.
    let locks = &ctx.services.ledgers.locks;
    let _one_create_per_pool = locks.hold(&format!("pool:{pool}")).await;
    if !ctx.services.ledgers.pools.known(pool.as_str()) {
        let doing = format!("creating pool {pool} for machine-request set {set}");
        make_set_pool(ctx, &pool, doing).await?;
    }
    ctx.state.default_pool = Some(pool.clone());
    ctx.data.keys.pool = Some(pool);
    Ok(())
}

/// The set's pool, known to this process as made, deleted behind its back (by hand, or by another
/// replica's teardown of the set's last VM): the create was refused before anything was made, so
/// the pool is made again and the create retried. `false` for any other error.
async fn recreate_set_pool(ctx: &StepContext<'_>, error: &StepError) -> Result<bool, StepError> {
    let (StepError::Proxmox { source, .. }, Some(pool)) = (error, &ctx.state.default_pool) else {
        return Ok(false);
    };
    if !source.is_pool_missing(pool.as_str()) {
        return Ok(false);
    }
    tracing::warn!(request = %ctx.request.id, %pool, "the machine set's pool is gone; creating it again");
    ctx.services.ledgers.pools.forget(pool.as_str());
    let doing = format!("creating pool {pool} again (it was deleted since it was made)");
    make_set_pool(ctx, pool, doing).await?;
    Ok(true)
}

/// Makes the set's pool with the comment that marks it as a provider's, saying `doing` meanwhile.
async fn make_set_pool(
    ctx: &StepContext<'_>,
    pool: &PoolId,
    doing: String,
) -> Result<(), StepError> {
    let pve = &ctx.services.pve;
    ctx.call(
        doing,
        pve.ensure_pool(pool.as_str(), identity::SET_POOL_COMMENT),
    )
    .await?;
    ctx.services.ledgers.pools.seen(pool.as_str());
    Ok(())
}

/// Takes over the VM made for this request earlier, if the cluster has one (made by us before a
/// crash, or by the official provider at the VMID its state records): `Some(Done)` once adopted,
/// `Some(Requeue)` while a candidate cannot be identified (its node is away, or it is locked), since
/// creating another would leave two. Ownership is `model::identity`'s, as for teardown.
async fn adopt(
    ctx: &mut StepContext<'_>,
    listing: &Listing,
) -> Result<Option<StepOutcome>, StepError> {
    let uuid = ctx.state.uuid.map(|u| u.to_string());
    let claim = Claim {
        request_id: &ctx.request.id,
        provider_id: &ctx.services.provider_id,
        recorded_vmid: ctx.state.recorded_vmid(),
        smbios_uuid: uuid.as_deref(),
    };
    for vm in identity::candidates(listing.vms(), &claim) {
        let doing = format!(
            "reading the config of VM {} on {} to see whether it is this request's",
            vm.vmid, vm.node
        );
        let why = match identify(&ctx.services.pve, listing, vm, &claim)
            .await
            .map_err(StepError::proxmox(doing))?
        {
            Ownership::Ours => {
                tracing::info!(request = %claim.request_id, vmid = %vm.vmid, node = %vm.node, "adopting the VM made for this request earlier");
                ctx.state.vmid = Some(vm.vmid);
                ctx.state.node = Some(vm.node.clone());
                ctx.services.ledgers.vmids.release(vm.vmid.get());
                return Ok(Some(StepOutcome::Done));
            }
            Ownership::NotOurs(reason) => {
                tracing::debug!(request = %claim.request_id, vmid = %vm.vmid, %reason, "not this request's VM");
                continue;
            }
            Ownership::Gone => continue,
            Ownership::NodeAway => format!(
                "VM {} may be this request's, but its node {} is not online and the listing cannot say whose it is; waiting for the node rather than creating a second VM",
                vm.vmid, vm.node
            ),
            Ownership::Locked(lock) => format!(
                "VM {} may be this request's, but it is locked ({lock}) on {}; waiting for it rather than creating a second VM",
                vm.vmid, vm.node
            ),
        };
        return Ok(Some(StepOutcome::Requeue {
            after: WAIT_FOR_IDENTITY,
            why,
        }));
    }
    Ok(None)
}

/// How many VMIDs above `/cluster/nextid`'s answer to ask Proxmox about before giving up (those
/// other requests of this process hold are stepped over without asking, and do not count).
const VMID_PROBES: u32 = 64;

/// The recorded VMID when it is still free, else a free one chosen as [`vmid::source`] says: the
/// lowest of the datacenter's range that neither the listing nor this process holds, or the first
/// from `/cluster/nextid` on that no request in flight and no earlier refusal uses.
async fn choose_vmid(
    ctx: &StepContext<'_>,
    listing: &Listing,
    refused: &[u32],
) -> Result<VmId, StepError> {
    let listed: BTreeSet<u32> = listing
        .vms()
        .chain(listing.containers())
        .map(|vm| vm.vmid.get())
        .collect();
    let usable = |id: u32| !listed.contains(&id) && !refused.contains(&id);
    let reserved = ctx.state.reserved_vmid.filter(|id| usable(id.get()));
    match ctx.services.ledgers.vmids.source(&ctx.services.pve).await {
        VmidSource::Listing(range) => {
            // A VMID recorded before a crash, still free as far as the listing shows: Proxmox
            // refuses the create if not, which chooses again.
            if let Some(id) = reserved
                && take_vmid(ctx, id)
            {
                return Ok(id);
            }
            let ledgers = &ctx.services.ledgers;
            loop {
                let held =
                    |id: u32| refused.contains(&id) || ledgers.vmids.held(id, &ctx.request.id);
                let id = vmid::lowest_free(&range, &listed, held).ok_or_else(|| {
                    StepError::Cluster(format!(
                        "no free VMID in the datacenter's next-id range {}..{}; widen it \
                         (Datacenter > Options > Next Free VMID Range)",
                        range.start, range.end
                    ))
                })?;
                // Another request may take the same one between the look and the mark.
                if take_vmid(ctx, id) {
                    return Ok(id);
                }
            }
        }
        VmidSource::AskProxmox(why) => {
            tracing::debug!(request = %ctx.request.id, why, "asking Proxmox for a VMID");
            ask_proxmox(ctx, reserved, &usable).await
        }
    }
}

/// [`choose_vmid`] by `/cluster/nextid`, which sees guests the token cannot list and honours the
/// datacenter's range.
async fn ask_proxmox(
    ctx: &StepContext<'_>,
    reserved: Option<VmId>,
    usable: &impl Fn(u32) -> bool,
) -> Result<VmId, StepError> {
    let pve = &ctx.services.pve;
    let asking = "choosing a VMID (GET /cluster/nextid)";
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
    let mut probes = 0;
    for id in first.get()..=VmId::MAX {
        let Ok(id) = VmId::new(id) else { break };
        if probes == VMID_PROBES {
            break;
        }
        // Taken before it is checked: requests choosing at the same moment (they got the same
        // answer from nextid) each check a different VMID, instead of all checking the same one,
        // one winning, and the rest checking the next.
        if !usable(id.get()) || !take_vmid(ctx, id) {
            continue;
        }
        // nextid vouched for its own answer; any higher VMID is checked the same way.
        if id == first {
            return Ok(id);
        }
        probes += 1;
        let free = pve.vmid_is_free(id).await;
        if free.as_ref().is_ok_and(|free| *free) {
            return Ok(id);
        }
        ctx.services.ledgers.vmids.release(id.get());
        free.map_err(StepError::proxmox(asking))?;
    }
    Err(StepError::Cluster(format!(
        "no free VMID among the {VMID_PROBES} from {first} on (Proxmox's next free VMID); \
         widen the datacenter's next-id range (Datacenter > Options > Next Free VMID Range)"
    )))
}

/// Marks `id` as in flight for this request; false when it is held by another.
fn take_vmid(ctx: &StepContext<'_>, id: VmId) -> bool {
    ctx.services.ledgers.vmids.take(id.get(), &ctx.request.id)
}

/// Creates the VM at `vmid` fully configured (boot modes `iso` and `image`), or clones the template
/// `prepare_image` recorded to it (`clone`), recording the task before it is waited for.
async fn make(
    ctx: &mut StepContext<'_>,
    node: &NodeName,
    vmid: VmId,
    listing: &Listing,
) -> Result<(), StepError> {
    let pve = &ctx.services.pve;
    let task = if ctx.data.boot == BootMode::Clone {
        let template_id = ctx
            .state
            .template_vmid
            .ok_or_else(|| StepError::Cluster("no template recorded by prepare_image".into()))?;
        let template = listing.vm(template_id).ok_or_else(|| {
            StepError::Cluster(format!("template {template_id} is gone from the cluster"))
        })?;
        // Whether a clone of this template reaches `node` (and the storage) was decided by the
        // placement rule (`rules::placement::clone_verdict`) in `pick_node` or `prepare_image`,
        // before anything was written.
        let params = vm_config::clone_params(
            &ctx.data,
            &ctx.identity(),
            vmid.get(),
            node.as_str(),
            &recorded(&ctx.state.storage, "storage for the boot disk")?,
            ctx.data.clone_mode,
        );
        let doing = format!(
            "cloning template {template_id} on {} to VM {vmid} on {node}",
            template.node
        );
        let call = pve.vm(&template.node, template_id).clone_with(params);
        ctx.start_task(doing, call).await?
    } else {
        let seed = upload_seed(ctx, node).await?;
        let target = target(ctx, node, vmid, listing, seed)?;
        let mut params = vm_config::render(&ctx.data, &ctx.identity(), &target)
            .map_err(|e| StepError::config(format!("cannot build the VM configuration: {e}")))?;
        params.retain(|(k, _)| k != "vmid");
        let call = pve.vm(node, vmid).create(params);
        ctx.start_task(format!("creating VM {vmid} on {node}"), call)
            .await?
    };
    // Recorded as the official provider records it: when it re-runs its VM step it checks this
    // task instead of creating another VM.
    ctx.state.vm_create_task = Some(task.upid.clone());
    ctx.state.vmid = Some(vmid);
    ctx.persist().await?;
    ctx.finish_task(task, TASK_TIMEOUT).await?;
    Ok(())
}

/// Everything `vm_config::render` needs that earlier steps decided.
pub fn target(
    ctx: &StepContext<'_>,
    node: &NodeName,
    vmid: VmId,
    listing: &Listing,
    seed_iso: IsoVolume,
) -> Result<VmTarget, StepError> {
    let storage = recorded(&ctx.state.storage, "storage for the boot disk")?;
    let smbios_uuid = recorded(&ctx.state.uuid, "SMBIOS UUID")?;
    let disks = ctx.data.additional_disks.iter().enumerate();
    let nics = match ctx.state.ip_allocations.len() {
        0 => 0,
        _ => 1 + ctx.data.additional_nics.len(),
    };
    let cluster = ClusterSnapshot::from_resources(listing);
    // An additional disk's storage, by the disk's own selector, on the node placement picked.
    let disk_storage = |(index, disk): (usize, &AdditionalDisk)| {
        let need = StorageNeed::boot_disk(&disk.storage_selector, disk.size_gb);
        let choice = cluster
            .node(node.as_str())
            .map(|n| storage::choose(n, &need));
        if let Some(e) = choice.as_ref().and_then(|c| c.selector_error()) {
            let key = format!("additional_disks[{index}].storage_selector");
            return Err(StepError::key(key, e));
        }
        match choice.and_then(|c| c.chosen) {
            Some(s) => Ok(s.name),
            None => Err(StepError::Cluster(format!(
                "additional_disks[{index}]: no storage on {node} matches `{}` with {} GB free",
                disk.storage_selector, disk.size_gb
            ))),
        }
    };
    let additional_disk_storages = disks.map(disk_storage).collect::<Result<_, _>>()?;
    Ok(VmTarget {
        vmid: vmid.get(),
        storage,
        additional_disk_storages,
        smbios_uuid,
        boot_iso: ctx.state.boot_iso.clone(),
        boot_image: ctx.state.boot_image.clone(),
        seed_iso,
        // Every NIC gets a deterministic MAC once one has a static address (the seed names each
        // NIC by its MAC); none otherwise (Proxmox chooses, as for the official provider).
        macs: (0..nics)
            .filter_map(|i| u8::try_from(i).ok())
            .map(|i| cloud_init::mac_for_nic(&ctx.request.id, i))
            .collect(),
    })
}

/// Builds and uploads this request's NoCloud seed ISO (label `cidata`: `user-data` = the join
/// config, `meta-data` = instance ID and hostname, `network-config`) to ISO storage on the VM's
/// node, once (the state records it), returning its volume. Boot mode `iso` needs it before the
/// create call, boot mode `clone` in the config write after the clone.
pub async fn upload_seed(
    ctx: &mut StepContext<'_>,
    node: &NodeName,
) -> Result<IsoVolume, StepError> {
    if let Some(v) = &ctx.state.seed_iso {
        return Ok(v.clone());
    }
    // Beside the boot ISO when there is one, else on the ISO storage the selector picks.
    let storage = match &ctx.state.boot_iso {
        Some(boot) => boot.storage.clone(),
        None => download_storage(ctx, node, Content::IsoImages).await?.0,
    };
    let instance_id = recorded(&ctx.state.uuid, "SMBIOS UUID")?;
    // DHCP, or every NIC by its MAC with the static addresses the provider state records.
    let network = cloud_init::network_config(
        &ctx.request.id,
        1 + ctx.data.additional_nics.len(),
        &ctx.state.ip_allocations,
        &ctx.services.config.ip_pools,
    )
    .map_err(|p| StepError::config(format!("the recorded static address: {p}")))?;
    let bytes = seed_iso::build_seed(ctx.join, instance_id, &ctx.request.id, &network)
        .map(UploadContent::Bytes)
        .map_err(|e| StepError::Cluster(e.to_string()))?;
    let file_name = seed_iso_file_name(&ctx.request.id);
    let file = IsoFileName::new(file_name.as_str()).map_err(|e| {
        StepError::Cluster(format!("seed ISO volume {storage}:iso/{file_name}: {e}"))
    })?;
    let volume = IsoVolume { storage, file };
    ctx.run_task(
        format!("uploading the NoCloud seed to {} on {node}", volume.storage),
        ctx.services
            .pve
            .upload_file(node, volume.storage.as_str(), "iso", &file_name, bytes),
    )
    .await?;
    ctx.state.seed_iso = Some(volume.clone());
    ctx.persist().await?;
    Ok(volume)
}

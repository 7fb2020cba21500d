//! Step 4, `configure_vm`: the VM's settings and its NoCloud seed.
//!
//! The seed ISO ([`super::create_vm::upload_seed`]: label `cidata`, `user-data` = the join config, `meta-data` = instance ID and
//! hostname, `network-config`) is built in memory and uploaded to ISO storage on the VM's node, then
//! attached as a CD-ROM. Boot mode `iso` needs the seed at creation, so `create_vm` uploads it and
//! creates the VM fully configured; this step then has nothing left to do. Boot mode `image` creates
//! it fully configured too, its boot disk the size of the Talos image: this step grows it to
//! `disk_size`. Boot mode `clone` sets everything here in one synchronous config write and grows the
//! cloned boot disk.

use super::context::{StartedTask, StepContext};
use super::create_vm::{target, upload_seed};
use super::error::StepError;
use super::services::TASK_TIMEOUT;
use super::step::StepOutcome;
use crate::model::vm::{BootDisk, cloud_init_drives};
use crate::proxmox::property::cdrom;
use crate::proxmox::types::{NodeName, VmConfig, VmId};
use crate::rules::provider_data::BootMode;
use crate::rules::vm_config;

pub async fn run(ctx: &mut StepContext<'_>) -> Result<StepOutcome, StepError> {
    let (ref node, vmid) = ctx.made()?;
    if ctx.data.boot == BootMode::Iso {
        if ctx.state.seed_iso.is_none() {
            // A VM the official provider created (its create step does not attach the join config;
            // its start step would): attach our NoCloud seed now.
            let seed = upload_seed(ctx, node).await?;
            let doing = format!("attaching the NoCloud seed to VM {vmid} on {node}");
            let params = vec![(vm_config::SEED_CDROM.to_string(), cdrom(&seed))];
            ctx.call(doing, ctx.services.pve.vm(node, vmid).update_config(params))
                .await?;
            return Ok(StepOutcome::Done);
        }
        ctx.report("configured at creation").await;
        return Ok(StepOutcome::Done);
    }
    if ctx.data.boot == BootMode::Image {
        // Created fully configured, its disk the size of the Talos image: only the growing is left.
        let current = read_config(ctx, node, vmid).await?;
        grow_boot_disk(ctx, node, vmid, BootDisk::of(&current)).await?;
        return Ok(StepOutcome::Done);
    }
    let seed = upload_seed(ctx, node).await?;
    let listing = ctx.cluster(false).await?;
    let target = target(ctx, node, vmid, &listing, seed)?;
    let pve = &ctx.services.pve;
    let current = read_config(ctx, node, vmid).await?;
    let boot = BootDisk::of(&current);
    let params = vm_config::render_after_clone(&ctx.data, &ctx.identity(), &target, boot.as_ref())
        .map_err(|e| StepError::config(format!("cannot build the VM configuration: {e}")))?;
    // A retry of this step (the first answer lost, a crash) must not allocate disks or MACs again.
    let mut params = vm_config::without_repeated_allocations(params, &current);
    // The template's own cloud-init drive would be a second `cidata` source: remove it (a slot we
    // set ourselves, e.g. the seed's, is simply replaced).
    let mut inherited = cloud_init_drives(&current);
    inherited.retain(|slot| !params.iter().any(|(k, _)| k == slot));
    if !inherited.is_empty() {
        params.push(("delete".into(), inherited.join(",")));
    }
    let doing = format!("configuring VM {vmid} on {node}");
    if params.iter().any(|(k, v)| vm_config::allocates(k, v)) {
        // Never replayed by the client: a second delivery would allocate a second time.
        ctx.run_task(doing, pve.vm(node, vmid).update_config_async(params))
            .await?;
    } else {
        ctx.call(doing, pve.vm(node, vmid).update_config(params))
            .await?;
    }

    grow_boot_disk(ctx, node, vmid, boot).await?;
    Ok(StepOutcome::Done)
}

async fn read_config(
    ctx: &StepContext<'_>,
    node: &NodeName,
    vmid: VmId,
) -> Result<VmConfig, StepError> {
    let doing = format!("reading VM {vmid} on {node}");
    let read = ctx.services.pve.vm(node, vmid).config().await;
    read.map_err(StepError::proxmox(doing))
}

/// Grows the boot disk (a cloned template's, or one made from the disk image) to `disk_size` when it
/// is smaller; never shrinks (Proxmox cannot).
async fn grow_boot_disk(
    ctx: &StepContext<'_>,
    node: &NodeName,
    vmid: VmId,
    boot: Option<BootDisk>,
) -> Result<(), StepError> {
    let wanted_gb = ctx.data.disk_size_gb;
    let current_gb = boot.as_ref().and_then(|b| size_gb(&b.drive)).unwrap_or(0);
    if wanted_gb <= current_gb {
        return Ok(());
    }
    let doing = format!("growing the boot disk of VM {vmid} to {wanted_gb} GB");
    let slot = boot.as_ref().map_or("scsi0", |b| b.slot.as_str());
    let size = format!("{wanted_gb}G");
    let resize = ctx.services.pve.vm(node, vmid).resize_disk(slot, &size);
    // Proxmox answers with a task only where the resize takes one (storage-dependent).
    if let Some(upid) = ctx.call(doing.clone(), resize).await? {
        ctx.finish_task(StartedTask { upid, doing }, TASK_TIMEOUT)
            .await?;
    }
    Ok(())
}

/// The `size=` of a drive string in whole GB (rounded up), if present.
pub fn size_gb(drive: &str) -> Option<u64> {
    let size = drive
        .split(',')
        .find_map(|p| p.trim().strip_prefix("size="))?;
    let (num, unit) = size.split_at(size.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = num.parse().ok()?;
    let gib = match unit {
        "K" => n / (1024.0 * 1024.0),
        "M" => n / 1024.0,
        "G" => n,
        "T" => n * 1024.0,
        _ => return None,
    };
    Some(gib.ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drive_parsing() {
        assert_eq!(size_gb("local-lvm:vm-1-disk-0,size=8G"), Some(8));
        assert_eq!(
            size_gb("local-lvm:vm-1-disk-0,iothread=1,size=512M"),
            Some(1)
        );
        assert_eq!(size_gb("x:y,size=1T"), Some(1024));
        assert_eq!(size_gb("x:y"), None);
    }
}

//! Step 5, `start_vm`: power on, wait for the start task, and register the VM with Proxmox HA and
//! its HA rules when the class asks for it ([`super::ha`]). Already running (a restart after the
//! start) is success; Proxmox says so in the task, so no status read is spent before starting.
//!
//! The boot ISO is not looked for before the start: `prepare_image` lists its storage only now and
//! then. A start that finds it gone (deleted by hand meanwhile) puts it back and starts again.

use super::context::StepContext;
use super::error::StepError;
use super::ledgers::image_presence_key;
use super::services::TASK_TIMEOUT;
use super::step::StepOutcome;
use crate::proxmox::types::{NodeName, VmId};

pub async fn run(ctx: &mut StepContext<'_>) -> Result<StepOutcome, StepError> {
    let (ref node, vmid) = ctx.made()?;
    if let Err(e) = start(ctx, node, vmid).await {
        if !super::prepare_image::put_back_if_missing(ctx, node, &e).await? {
            return Err(e);
        }
        start(ctx, node, vmid).await?;
    }
    // Started from it: the boot ISO is there.
    if let Some(volid) = &ctx.state.boot_iso {
        let key = image_presence_key(node.as_str(), &volid.to_string());
        ctx.services.ledgers.images.seen(&key);
    }
    // Like the official provider, the VM joins HA (and its HA rules) once it runs.
    super::ha::join(ctx, vmid).await?;
    Ok(StepOutcome::Done)
}

async fn start(ctx: &mut StepContext<'_>, node: &NodeName, vmid: VmId) -> Result<(), StepError> {
    let task = ctx
        .start_task(
            format!("starting VM {vmid} on {node}"),
            ctx.services.pve.vm(node, vmid).start(),
        )
        .await?;
    match ctx.finish_task(task, TASK_TIMEOUT).await {
        // Recorded like the official provider does: re-running its start step, it checks this task.
        // A task that failed because the VM already ran is not recorded (it would read as a failure).
        Ok(upid) => ctx.state.vm_start_task = Some(upid),
        // A retry after a lost answer: the VM was started by the earlier attempt.
        Err(StepError::Proxmox { source, .. }) if source.is_already_running() => {}
        Err(e) => return Err(e),
    }
    Ok(())
}

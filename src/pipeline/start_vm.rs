//! Step 5, `start_vm`: power on, wait for the start task, and register the VM with Proxmox HA and
//! its HA rules when the class asks for it ([`super::ha`]). Already running (a restart after the
//! start) is success; Proxmox says so in the task, so no status read is spent before starting.

use super::step::{StepContext, StepError, StepOutcome};

pub async fn run(ctx: &mut StepContext<'_>) -> Result<StepOutcome, StepError> {
    let node = ctx.node()?;
    let vmid = ctx.vmid()?;
    let pve = &ctx.services.pve;
    let task = ctx
        .start_task(
            format!("starting VM {vmid} on {node}"),
            pve.start_vm(&node, vmid),
        )
        .await?;
    match ctx.finish_task(task, ctx.services.timeouts.task).await {
        // Recorded like the official provider does: re-running its start step, it checks this task.
        // A task that failed because the VM already ran is not recorded (it would read as a failure).
        Ok(upid) => ctx.state.vm_start_task = Some(upid),
        // A retry after a lost answer: the VM was started by the earlier attempt.
        Err(StepError::Proxmox { source, .. }) if source.is_already_running() => {}
        Err(e) => return Err(e),
    }
    // Like the official provider, the VM joins HA (and its HA rules) once it runs.
    super::ha::join(ctx).await?;
    Ok(StepOutcome::Done)
}

//! Step 5, `start_vm`: power on and wait for the start task. Already running (a restart after the
//! start) is success; Proxmox says so in the task, so no status read is spent before starting.

use super::step::{StepContext, StepError, StepOutcome};

pub async fn run(ctx: &mut StepContext<'_>) -> Result<StepOutcome, StepError> {
    let node = ctx.node()?;
    let vmid = ctx.vmid()?;
    let pve = &ctx.services.pve;
    let doing = format!("starting VM {vmid} on {node}");
    ctx.report(doing.clone()).await;
    let task = pve
        .start_vm(&node, vmid)
        .await
        .map_err(StepError::proxmox(doing.clone()))?;
    match pve.wait_for_task(&task, ctx.services.timeouts.task).await {
        Ok(_) => Ok(StepOutcome::Done),
        // A retry after a lost answer: the VM was started by the earlier attempt.
        Err(e) if e.to_string().contains("already running") => Ok(StepOutcome::Done),
        Err(e) => Err(StepError::proxmox(doing)(e)),
    }
}

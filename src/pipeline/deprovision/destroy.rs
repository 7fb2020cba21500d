//! Shutting a VM down and destroying it with its disks, once it is known to be ours.

use futures_util::future::OptionFuture;

use super::error::Action;
use super::{
    DeprovisionError, DeprovisionOutcome, Run, SHUTDOWN_TIMEOUT, TEARDOWN_TASK_TIMEOUT,
    node_offline,
};
use crate::model::Listing;
use crate::model::identity;
use crate::proxmox::ProxmoxError;
use crate::proxmox::ha::vm_sid;
use crate::proxmox::types::{NodeName, VmId, VmResource};
use crate::rules::ha::rules_to_delete;

/// Shutdown (if running), destroy. The VM is known to be ours.
pub(super) async fn destroy(
    run: &Run<'_>,
    vm: &VmResource,
) -> Result<DeprovisionOutcome, DeprovisionError> {
    let (node, vmid) = (vm.node.clone(), vm.vmid);
    if !run.view.node_online(&node) {
        return Err(node_offline(run.view, vm));
    }
    if let Some(lock) = vm.lock.as_deref().filter(|l| blocks_destroy(l)) {
        return Err(DeprovisionError::Locked {
            node,
            vmid,
            lock: lock.to_owned(),
        });
    }
    if vm.hastate.is_some() {
        leave_ha(run, vm).await?;
    }
    if vm.status.as_deref() != Some("stopped")
        && let Some(gone) = shut_down(run, &node, vmid).await?
    {
        return Ok(gone);
    }
    match destroy_tolerating_offline_storage(run, &node, vmid).await {
        // The listing's status is what pvestatd reported up to ~10 s ago (or the HA manager started
        // the VM again meanwhile): qemu-server refuses to destroy a running VM, so shut it down and
        // destroy again, once.
        Err(DeprovisionError::Proxmox { source, .. }) if refused_as_running(&source) => {
            tracing::info!(%vmid, %node, "destroy refused: the VM is running after all; shutting it down first");
            if let Some(gone) = shut_down(run, &node, vmid).await? {
                return Ok(gone);
            }
            destroy_tolerating_offline_storage(run, &node, vmid).await
        }
        other => other,
    }
}

/// Whether a VM holding `lock` must wait: qemu-server src/PVE/QemuServer.pm `destroy_vm` refuses
/// every lock (`check_lock`) but `suspended`, the lock of a VM hibernated to disk, which it
/// destroys (the VM is stopped; its saved state goes with its disks).
fn blocks_destroy(lock: &str) -> bool {
    !lock.is_empty() && lock != "suspended"
}

/// Takes an HA-managed VM out of HA before it is shut down: the HA manager would otherwise start it
/// again, and an HA resource's shutdown is only a request to the HA manager (see [`shut_down`]).
///
/// First the set's own rules that would be left ineffective or empty go (`rules_to_delete`), then
/// the resource goes, which takes it out of every other rule (`purge` by default, pve-ha-manager
/// src/PVE/HA/Config.pm, `delete_service_from_config`). In that order a crash in between is
/// repaired by the next attempt: the VM is still HA-managed, so this runs again.
///
/// Under the process's HA-rules lock ([`DeprovisionOptions::ha_rules_lock`]), as rules are joined:
/// a machine of the set joining the rule between the read and the delete would be left outside any.
async fn leave_ha(run: &Run<'_>, vm: &VmResource) -> Result<(), DeprovisionError> {
    let (pve, view, node, vmid) = (run.pve, run.view, vm.node.clone(), vm.vmid);
    let fail = |source| DeprovisionError::proxmox(Action::RemoveFromHa, &node, vmid)(source);
    (run.progress)(&format!(
        "taking VM {vmid} out of Proxmox HA and its HA rules"
    ));
    let held = run.options.ha_rules_lock.as_ref().map(|lock| lock.lock());
    let _rules_held = OptionFuture::from(held).await;
    let tags = vm.tag_list();
    if let Some(set) = identity::tagged_set(&tags) {
        let rules = match pve.ha_rules().await {
            Ok(rules) => rules,
            // Proxmox VE 8 has no HA rules (501 for the path).
            Err(ProxmoxError::Api { status: 501, .. }) => Vec::new(),
            // Reading rules takes Sys.Audit on /, which a token made for `ha: {state: …}` alone may
            // lack: the purge below still takes the VM out of every rule; only a rule of the set
            // left with one VM stays (Proxmox flags it as ineffective).
            Err(e @ ProxmoxError::PermissionDenied { .. }) => {
                tracing::warn!(%vmid, error = %e, "cannot read the HA rules; leaving the set's rules to the purge");
                Vec::new()
            }
            Err(e) => return Err(fail(e)),
        };
        let sid = vm_sid(vmid);
        let listed = |view: &Listing, member: &str| view.vms().any(|vm| vm_sid(vm.vmid) == member);
        let mut delete = rules_to_delete(set, &sid, &rules, |m| listed(view, m));
        // A member the listing (read before the lock was taken) does not show may be a machine that
        // joined since, not a deleted one: look again before deleting a rule it is in.
        let unseen = rules
            .iter()
            .filter(|r| delete.contains(&r.rule))
            .flat_map(|r| r.resource_list())
            .any(|m| m != sid && !listed(view, m));
        if unseen {
            let fresh = pve.cluster_listing().await.map_err(fail)?;
            delete = rules_to_delete(set, &sid, &rules, |m| listed(&fresh, m));
        }
        for rule in delete {
            tracing::info!(%vmid, %rule, "deleting the machine set's HA rule: no VM would be left to keep");
            pve.delete_ha_rule(&rule).await.map_err(fail)?;
        }
    }
    pve.remove_ha_resource(vmid).await.map_err(fail)
}

/// Shuts the VM down (stopping it if the guest does not), taking it out of the HA manager first when
/// it is HA-managed. `Some` when the VM turned out to be gone.
///
/// qemu-server src/PVE/API2/Qemu.pm, `vm_shutdown`: for an HA-managed VM the API only asks the HA
/// manager to stop it (a `hastop` task that ends at once, the VM still running), and `destroy_vm`
/// then refuses a running VM. So on a `hastop` task the VM leaves HA (it keeps running; the destroy's
/// `purge` would have removed the resource anyway) and is shut down for real.
async fn shut_down(
    run: &Run<'_>,
    node: &NodeName,
    vmid: VmId,
) -> Result<Option<DeprovisionOutcome>, DeprovisionError> {
    let (pve, progress) = (run.pve, run.progress);
    let secs = u32::try_from(SHUTDOWN_TIMEOUT.as_secs()).unwrap_or(u32::MAX);
    progress(&format!(
        "shutting down VM {vmid} on {node} (stopped after {secs} s if the guest does not shut down)"
    ));
    let stopped = async {
        let mut task = pve.vm(node, vmid).shutdown(secs).await;
        if let Ok(upid) = &task
            && upid.task_type() == "hastop"
        {
            progress(&format!(
                "VM {vmid} is HA-managed: taking it out of HA so it can be shut down and destroyed"
            ));
            let left = pve.remove_ha_resource(vmid).await;
            left.map_err(|e| (Action::RemoveFromHa, e))?;
            task = pve.vm(node, vmid).shutdown(secs).await;
        }
        let timeout = SHUTDOWN_TIMEOUT + TEARDOWN_TASK_TIMEOUT;
        let shut_down = async { pve.wait_for_task(&task?, timeout).await };
        match shut_down.await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() || e.is_transient() => Err((Action::ShutDown, e)),
            // Paused VMs refuse a shutdown, a guest can make it fail: power off instead.
            Err(e) => {
                tracing::warn!(%vmid, %node, error = %e, "shutdown failed; stopping the VM");
                progress(&format!("stopping VM {vmid} on {node}"));
                let stop = async {
                    pve.wait_for_task(&pve.vm(node, vmid).stop().await?, TEARDOWN_TASK_TIMEOUT)
                        .await
                };
                stop.await.map_err(|e| (Action::Stop, e))
            }
        }
    };
    match stopped.await {
        Ok(()) => Ok(None),
        Err((_, e)) if e.is_not_found() => Ok(Some(DeprovisionOutcome::AlreadyGone)),
        Err((action, e)) => Err(DeprovisionError::proxmox(action, node, vmid)(e)),
    }
}

/// Destroys the VM with its disks, waited for: with `destroy-unreferenced-disks` (a disk Proxmox
/// lost track of goes too), and when an offline storage makes that fail, again without it.
///
/// qemu-server src/PVE/QemuServer.pm, `destroy_vm`: the referenced disks are freed first; then the
/// unreferenced-disk search lists every image storage of the cluster, and one that is offline fails
/// the task before the config is removed. Retried as is, the destroy would fail for as long as any
/// storage anywhere is down. The second call destroys the VM (its referenced disks are already
/// gone); a leftover on the offline storage is logged.
async fn destroy_tolerating_offline_storage(
    run: &Run<'_>,
    node: &NodeName,
    vmid: VmId,
) -> Result<DeprovisionOutcome, DeprovisionError> {
    let pve = run.pve;
    let mut unreferenced_disks = true;
    loop {
        (run.progress)(&format!("destroying VM {vmid} on {node} with its disks"));
        let delete = pve.vm(node, vmid).delete(unreferenced_disks).await;
        let destroyed = async { pve.wait_for_task(&delete?, TEARDOWN_TASK_TIMEOUT).await };
        match destroyed.await {
            Ok(_) => {
                return Ok(DeprovisionOutcome::Deleted {
                    node: node.clone(),
                    vmid,
                });
            }
            Err(e) if e.is_not_found() || task_says_gone(&e) => {
                return Ok(DeprovisionOutcome::AlreadyGone);
            }
            Err(e) if unreferenced_disks && e.is_storage_offline() => {
                tracing::warn!(%vmid, %node, error = %e,
                    "destroy with the search for unreferenced disks failed on an offline storage; destroying without it (a disk of this VM on that storage may be left behind)");
                unreferenced_disks = false;
            }
            Err(e) => return Err(DeprovisionError::proxmox(Action::Destroy, node, vmid)(e)),
        }
    }
}

/// qemu-server src/PVE/API2/Qemu.pm, `destroy_vm`'s early check: "VM <id> is running - destroy
/// failed".
fn refused_as_running(e: &ProxmoxError) -> bool {
    matches!(e, ProxmoxError::Api { message, .. } | ProxmoxError::TaskFailed { exit_status: message, .. }
        if message.contains("is running - destroy failed"))
}

/// A destroy task that failed because the VM vanished meanwhile.
fn task_says_gone(e: &ProxmoxError) -> bool {
    matches!(e, ProxmoxError::TaskFailed { exit_status, .. } if exit_status.contains("does not exist"))
}

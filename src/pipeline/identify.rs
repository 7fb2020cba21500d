//! The I/O half of "is this VM ours?": reads a VM's config when the listing cannot say
//! (`model::identity` decides; this only fetches what it needs). Adoption and teardown both come
//! through here, so they read the same evidence and wait on the same things.

use crate::model::identity::{self, Claim, Ownership};
use crate::proxmox::types::VmResource;
use crate::proxmox::{ProxmoxClient, ProxmoxError};

/// What we could learn about a candidate VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identified {
    Ours,
    NotOurs(String),
    /// Listed a moment ago, gone when its config was asked for.
    Gone,
    /// The listing cannot tell and the VM's node is not online to be asked: wait for it rather than
    /// act on a guess (a second VM, or leaving ours behind).
    NodeAway,
    /// The config does not show our marker, but the VM is locked (`create`, `clone`): its config may
    /// not be complete yet, so it cannot be ruled out.
    Locked(String),
}

/// Judges `vm` for `claim`: from the listing when that is conclusive (no request), else from the
/// config (one request): always from the config when a SMBIOS UUID was recorded, which only the
/// config shows. `node_online` is the listing's word on the VM's node.
pub async fn identify(
    pve: &ProxmoxClient,
    node_online: bool,
    vm: &VmResource,
    claim: &Claim<'_>,
) -> Result<Identified, ProxmoxError> {
    match identity::judge_listing_to_act(vm, claim) {
        Some(Ownership::Ours) => return Ok(Identified::Ours),
        Some(Ownership::NotOurs(reason)) => return Ok(Identified::NotOurs(reason)),
        None => {}
    }
    if !node_online {
        return Ok(Identified::NodeAway);
    }
    let config = match pve.vm(&vm.node, vm.vmid).config().await {
        Ok(c) => c,
        Err(e) if e.is_not_found() => return Ok(Identified::Gone),
        Err(e) => return Err(e),
    };
    Ok(match identity::judge_config(vm, &config, claim) {
        Ownership::Ours => Identified::Ours,
        Ownership::NotOurs(reason) => match config
            .get("lock")
            .filter(|l| !l.is_empty() && config.get("template").as_deref() != Some("1"))
        {
            Some(lock) => {
                tracing::debug!(vmid = %vm.vmid, %lock, %reason, "a locked VM's config does not show our marker yet");
                Identified::Locked(lock)
            }
            None => Identified::NotOurs(reason),
        },
    })
}

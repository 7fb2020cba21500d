//! The I/O half of "is this VM ours?": reads a VM's config when the listing cannot say
//! (`model::identity` decides; this only fetches what it needs). Adoption and teardown both come
//! through here, so they read the same evidence and wait on the same things.

use crate::model::Listing;
use crate::model::identity::{self, Claim, Ownership};
use crate::proxmox::types::VmResource;
use crate::proxmox::{ProxmoxClient, ProxmoxError};

/// Judges `vm` for `claim`: from the listing when that is conclusive (no request), else from the
/// config (one request): always from the config when a SMBIOS UUID was recorded, which only the
/// config shows. `listing` says whether the VM's node is online.
pub async fn identify(
    pve: &ProxmoxClient,
    listing: &Listing,
    vm: &VmResource,
    claim: &Claim<'_>,
) -> Result<Ownership, ProxmoxError> {
    if let Some(ownership) = identity::judge_listing_to_act(vm, claim) {
        return Ok(ownership);
    }
    if !listing.node_online(&vm.node) {
        return Ok(Ownership::NodeAway);
    }
    let config = match pve.vm(&vm.node, vm.vmid).config().await {
        Ok(c) => c,
        Err(e) if e.is_not_found() => return Ok(Ownership::Gone),
        Err(e) => return Err(e),
    };
    Ok(match identity::judge_config(vm, &config, claim) {
        Ownership::NotOurs(reason) => match config
            .get("lock")
            .filter(|l| !l.is_empty() && config.get("template").as_deref() != Some("1"))
        {
            Some(lock) => {
                tracing::debug!(vmid = %vm.vmid, %lock, %reason, "a locked VM's config does not show our marker yet");
                Ownership::Locked(lock)
            }
            None => Ownership::NotOurs(reason),
        },
        ours => ours,
    })
}

//! What can stop a deprovision, worded for the status text, and whether a retry can help.

use crate::proxmox::ProxmoxError;
use crate::proxmox::types::{NodeName, VmId};

#[derive(Debug, thiserror::Error)]
pub enum DeprovisionError {
    #[error("cannot list the Proxmox cluster to find the VM of request {request_id}: {source}")]
    Listing {
        request_id: String,
        #[source]
        source: ProxmoxError,
    },

    #[error(
        "Proxmox node {node} is {state}: VM {vmid} may still exist there; deprovisioning will be retried until the node is back"
    )]
    NodeOffline {
        node: NodeName,
        vmid: VmId,
        state: &'static str,
    },

    #[error(
        "VM {vmid} on {node} is locked ({lock}); deprovisioning will be retried (if the lock stays, clear it with `qm unlock {vmid}` on {node})"
    )]
    Locked {
        node: NodeName,
        vmid: VmId,
        lock: String,
    },

    #[error(
        "{} VMs are named {request_id:?} and carry our provider tag (VMIDs {}); refusing to guess which one to delete: delete the extra ones by hand",
        vmids.len(),
        vmids.iter().map(VmId::to_string).collect::<Vec<_>>().join(", ")
    )]
    Ambiguous {
        request_id: String,
        vmids: Vec<VmId>,
    },

    #[error(
        "cannot {} VM {vmid} on {node}: {source}{}",
        action.as_str(),
        if source.is_transient() { " (the VM may still exist; will retry)" } else { "" }
    )]
    Proxmox {
        action: Action,
        vmid: VmId,
        node: NodeName,
        #[source]
        source: ProxmoxError,
    },

    /// The VM part is done (deleted or already gone); only the seed ISO is left. Reported in
    /// [`super::Deprovisioned::leftover_seed_iso`], never returned as the deprovision's error.
    #[error("the VM is gone, but its seed ISO {volume} on {node} could not be deleted: {source}")]
    SeedIso {
        volume: String,
        node: NodeName,
        #[source]
        source: ProxmoxError,
    },

    /// The VM part is done; the seed ISO's node cannot be reached. Reported like
    /// [`DeprovisionError::SeedIso`].
    #[error("the VM is gone, but its seed ISO {volume} cannot be deleted: node {node} is {state}")]
    SeedIsoNodeOffline {
        volume: String,
        node: NodeName,
        state: &'static str,
    },
}

impl DeprovisionError {
    /// Proxmox failed the `action` on VM `vmid` on `node`.
    pub(super) fn proxmox(
        action: Action,
        node: &NodeName,
        vmid: VmId,
    ) -> impl FnOnce(ProxmoxError) -> Self {
        let node = node.clone();
        move |source| Self::Proxmox {
            action,
            vmid,
            node,
            source,
        }
    }
}

crate::proxmox::property::str_enum!(
    /// The step a [`DeprovisionError::Proxmox`] failed at, as its text names it.
    Action {
        ReadConfig = "read the config of",
        ShutDown = "shut down",
        RemoveFromHa = "take out of HA",
        Stop = "stop",
        Destroy = "destroy",
    }
);

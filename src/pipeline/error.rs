//! How a step fails: [`StepError`].

use crate::omni::state::StateError;
use crate::proxmox::ProxmoxError;

/// A step failure, worded for the person reading Omni's machine status. What happens next is the
/// controller's error policy's to decide, from the variant and the Proxmox or Omni error inside.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// Provider data or config that cannot work; retrying will not help until it changes.
    #[error("{0}")]
    Config(String),
    /// Proxmox refused or failed; `doing` says what we were doing ("cloning template 9000 to VM 104
    /// on pve2").
    #[error("{doing}: {source}")]
    Proxmox {
        doing: String,
        #[source]
        source: Box<ProxmoxError>,
    },
    #[error("{doing}: {source}")]
    Omni {
        doing: String,
        #[source]
        source: Box<StateError>,
    },
    /// The cluster is not in a state where the step can succeed (no template, no ISO storage, ...).
    #[error("{0}")]
    Cluster(String),
    /// The cluster has no room for the VM right now (nodes offline, memory or storage short) but may
    /// make room by itself: waited for, not a failure someone must fix.
    #[error("{0}")]
    Capacity(String),
    /// A static IP pool has no free address: FAILED until a machine on it goes away, and retried
    /// meanwhile, since a release heals it without anyone changing anything.
    #[error("{0}")]
    PoolFull(String),
}

impl StepError {
    pub fn proxmox(doing: impl Into<String>) -> impl FnOnce(ProxmoxError) -> StepError {
        let doing = doing.into();
        move |source| StepError::Proxmox {
            doing,
            source: Box::new(source),
        }
    }

    pub fn omni(doing: impl Into<String>) -> impl FnOnce(StateError) -> StepError {
        let doing = doing.into();
        move |source| StepError::Omni {
            doing,
            source: Box::new(source),
        }
    }
}

//! How a step fails: [`StepError`].

use crate::omni::state::StateError;
use crate::proxmox::ProxmoxError;
use crate::rules::ip_pool::PoolFull;
use crate::rules::placement::PlacementError;

/// A step failure, worded for the person reading Omni's machine status. What happens next is the
/// controller's error policy's to decide, from the variant and the Proxmox, Omni, placement or pool
/// error inside.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// Provider data or config that cannot work; retrying will not help until it changes. `key`
    /// names the provider-data key at fault, when one is.
    #[error("{}{problem}", key.as_ref().map(|k| format!("{k}: ")).unwrap_or_default())]
    Config {
        key: Option<String>,
        problem: String,
    },
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
    /// No node can take the VM. When the cluster may make room by itself (nodes offline, memory or
    /// storage short: [`PlacementError::may_heal`]) it is waited for, not a failure someone must
    /// fix; else the class or the cluster must change.
    #[error(transparent)]
    Placement(PlacementError),
    /// A static IP pool has no free address: FAILED until a machine on it goes away, and retried
    /// meanwhile, since a release heals it without anyone changing anything.
    #[error(
        "{0}; a machine on it must go away (or the pool grow in the config file) before this one gets an address"
    )]
    PoolFull(PoolFull),
}

impl StepError {
    /// Provider data or config that cannot work, about no one key.
    pub fn config(problem: impl Into<String>) -> StepError {
        StepError::Config {
            key: None,
            problem: problem.into(),
        }
    }

    /// The provider-data `key` cannot work: `problem` says why.
    pub fn key(key: impl Into<String>, problem: impl std::fmt::Display) -> StepError {
        StepError::Config {
            key: Some(key.into()),
            problem: problem.to_string(),
        }
    }

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

//! The provider's long-running duties towards Omni: registration, heartbeat, turning the
//! MachineRequest watch into reconcile work, and the work queue that schedules it.
//!
//! Provisioning itself plugs in later as the consumer of [`requests::RequestQueueEvent`]s; this
//! module only decides *what* needs attention, never *how* to provision it.

pub mod cache;
pub mod error_policy;
pub mod health;
pub mod provision;
pub mod registration;
pub mod requests;
pub mod runner;
pub mod teardown;
pub mod workqueue;

use crate::omni::join::JoinMode;
use crate::omni::resources::{PROVIDER_JOIN_CONFIG_DEFINITION_ID, ResourceDefinition};
use crate::omni::state::{StateClient, StateError};

/// Lists resource definitions: if Omni knows ProviderJoinConfigs, it is v2 mode.
pub async fn detect_join_mode(state: &StateClient) -> Result<JoinMode, StateError> {
    let defs = state.list(&ResourceDefinition, vec![]).await?;
    Ok(JoinMode::detect(
        defs.iter()
            .any(|d| d.id() == PROVIDER_JOIN_CONFIG_DEFINITION_ID),
    ))
}

//! Registering the provider with Omni (§3.1): name, description, icon, provider-data schema
//! and version, shown in Omni's UI and used to validate machine classes.

use base64::Engine as _;

use crate::omni::proto::specs::InfraProviderStatusSpec;
use crate::omni::resources::{INFRA_PROVIDER_STATUS, PHASE_RUNNING};
use crate::omni::state::{StateClient, StateError, Typed};

/// JSON schema of the provider data a machine class may carry (a test keeps it what the key
/// declarations generate).
pub const PROVIDER_DATA_SCHEMA: &str = include_str!("../../schema/provider-data.schema.json");

/// What Omni shows about the provider, as the flags name it.
pub struct ProviderInfo {
    pub id: String,
    pub name: String,
    pub description: String,
}

/// Creates `InfraProviderStatuses/<id>` (no owner) or, if it exists, replaces its spec, retrying
/// version conflicts: our name, description, icon, version, and the JSON schema of the provider
/// data a machine class may carry.
pub async fn register(state: &StateClient, info: &ProviderInfo) -> Result<(), StateError> {
    // Our icon, shipped in the repository, in unpadded standard base64 like the Go provider's.
    let spec = InfraProviderStatusSpec {
        schema: PROVIDER_DATA_SCHEMA.to_owned(),
        name: info.name.clone(),
        description: info.description.clone(),
        icon: base64::engine::general_purpose::STANDARD_NO_PAD
            .encode(include_str!("../../assets/icon.svg")),
        version: env!("CARGO_PKG_VERSION").to_owned(),
    };
    let fresh = Typed::fresh(&INFRA_PROVIDER_STATUS, &info.id, spec.clone());
    match state.create(&INFRA_PROVIDER_STATUS, &fresh, "").await {
        Err(StateError::AlreadyExists { .. }) => {}
        created => return created.map(drop),
    }
    // Updated as the Go library does (`safe.StateUpdateWithConflicts`): no owner, as the status
    // was created without one and COSI keeps an owner for good, and the running phase expected.
    state
        .modify(
            &INFRA_PROVIDER_STATUS,
            &info.id,
            "",
            Some(PHASE_RUNNING),
            |status| status.spec = spec.clone(),
        )
        .await
        .map(drop)
}

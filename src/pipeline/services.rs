//! What every reconcile shares: the clients, the config, the ledgers ([`Services`]), and the
//! MachineRequest as the steps read it ([`RequestInfo`]).

use std::sync::Arc;
use std::time::Duration;

use super::error::StepError;
use super::ledgers::Ledgers;
use crate::config::ProviderConfig;
use crate::omni::management::ManagementClient;
use crate::proxmox::ProxmoxClient;
use crate::rules::provider_data::{ProviderData, describe};
use crate::rules::schematic::SchematicRequest;

/// The MachineRequest as the steps need it.
#[derive(Debug, Clone)]
pub struct RequestInfo {
    pub id: String,
    pub set_id: Option<String>,
    pub talos_version: String,
    /// Extensions, kernel args, META values and overlay: what its boot image's schematic holds.
    pub schematic: SchematicRequest,
    pub provider_data: String,
    /// The Image Factory Omni uses for this Talos version when it is not the one in
    /// [`Services::image_factory_url`] (Omni's `TalosVersions` resource names it).
    pub image_factory: Option<String>,
}

impl RequestInfo {
    /// The factory this request's boot images come from: the one Omni made its schematic on.
    pub fn factory<'a>(&'a self, services: &'a Services) -> &'a str {
        self.image_factory
            .as_deref()
            .unwrap_or(&services.image_factory_url)
    }
}

/// Long-lived pieces every reconcile shares: clients, config, and the in-memory ledgers that make
/// concurrent requests behave.
pub struct Services {
    pub provider_id: String,
    pub pve: ProxmoxClient,
    pub management: ManagementClient,
    pub config: ProviderConfig,
    pub ledgers: Ledgers,
    /// Image factory base URL for boot ISOs.
    pub image_factory_url: String,
    /// HTTP client for the Image Factory (schematics on Omni before 1.8, and boot images from a
    /// factory that needs credentials).
    pub factory_http: reqwest::Client,
    /// Credentials of the factories that need them (`--image-factory-auth-file`).
    pub factory_auth: super::image_factory::FactoryAuth,
    /// How often to ask the guest agent while waiting for an address ([`AGENT_POLL`]).
    pub agent_poll: Duration,
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// How long a create, clone, config, upload or start task may take.
pub const TASK_TIMEOUT: Duration = Duration::from_secs(600);
/// How often the guest agent is asked while waiting for an address.
pub const AGENT_POLL: Duration = Duration::from_secs(5);

impl Services {
    /// Resolves provider data for `request`, with the chosen node's override once it is known.
    pub fn provider_data(
        &self,
        request: &RequestInfo,
        node: Option<&str>,
    ) -> Result<ProviderData, StepError> {
        let invalid = |problems: Vec<crate::rules::provider_data::Problem>| {
            StepError::config(format!("invalid provider data: {}", describe(&problems)))
        };
        let mut data = (self.config.layers)
            .resolve(&request.provider_data, node)
            .map_err(invalid)?;
        crate::rules::ip_pool::apply_networks(&mut data, &self.config.ip_pools).map_err(invalid)?;
        let refused = self.config.policy.check(&data);
        if !refused.is_empty() {
            return Err(invalid(refused));
        }
        Ok(data)
    }
}

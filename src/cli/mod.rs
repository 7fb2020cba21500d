//! One module per subcommand; `main.rs` only parses flags and dispatches here.

pub mod cluster;
pub mod omni_args;
pub mod orphans;
pub mod pools;
pub mod run;
pub mod validate;

/// What every subcommand returns; the error is printed with its whole source chain.
pub type CliResult = Result<(), BoxError>;

/// Any error a subcommand may end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `--output`: `table` for people, `json` for scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

impl OutputFormat {
    /// Prints `report` as pretty JSON, or as the text `table` makes of it.
    fn print<T: Serialize>(self, report: &T, table: impl FnOnce(&T) -> String) -> CliResult {
        match self {
            Self::Json => println!("{}", serde_json::to_string_pretty(report)?),
            Self::Table => print!("{}", table(report)),
        }
        Ok(())
    }
}

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use crate::config::ProviderConfig;
use crate::model::MachineState;
use crate::model::machine::IpAllocation;
use crate::omni::client::OmniClient;
use crate::omni::resources::{MACHINE_REQUEST, label, provider_machine};
use crate::omni::state::StateError;
use crate::omni::transport;
use crate::rules::provider_data::Problem;
use omni_args::OmniArgs;

/// Reads the config file: the config, its warnings joined by those of its `defaults:` and `nodes:`
/// (unknown keys with their "did you mean", a token and a password both set), and the problems of
/// its `defaults:` and `nodes:` as provider data.
fn read_config(path: &Path) -> Result<(ProviderConfig, Vec<Problem>), BoxError> {
    let mut config = ProviderConfig::load(path)?;
    let overrides = config.layers.check();
    config
        .warnings
        .extend(overrides.warnings.iter().map(ToString::to_string));
    Ok((config, overrides.problems))
}

/// Loads the config file for a command and logs, once, what it got wrong. Every command that reads
/// the file says so, so that a misspelt `insecureSkipVerify` is named instead of surfacing as a
/// certificate error.
pub fn load_config(path: &Path) -> Result<ProviderConfig, BoxError> {
    let (config, _) = read_config(path)?;
    for warning in &config.warnings {
        tracing::warn!("config file {}: {warning}", path.display());
    }
    Ok(config)
}

/// The static IP allocations of each provider state, by its request's ID.
type Allocations = Vec<(String, Vec<IpAllocation>)>;

/// What the commands that read Omni start with: the connection from the flags (refused with
/// `missing` when the endpoint or the key is not given), the config file, and what Omni holds of the
/// provider's machines: the IDs of its MachineRequests, whatever their phase (one being torn down is
/// the controller's to finish), and the static IP allocations of its provider states. `reads` name
/// the two reads in an error.
async fn omni_records(
    omni: &OmniArgs,
    config_file: &Path,
    missing: &str,
    reads: [&str; 2],
) -> Result<(ProviderConfig, BTreeSet<String>, Allocations), BoxError> {
    if !omni.is_set() {
        return Err(missing.into());
    }
    let (endpoint, key) = omni.connection()?;
    let config = load_config(config_file)?;
    transport::install_crypto_provider();
    let client = OmniClient::connect(&endpoint, Arc::new(key), &omni.id)?;
    let failed = |what: &str, e: StateError| {
        let why = crate::error_chain::render(&e);
        format!("cannot {what} of provider {} in Omni: {why}", omni.id)
    };
    let requests = client
        .state
        .list(&MACHINE_REQUEST, &[(label::INFRA_PROVIDER_ID, &omni.id)])
        .await;
    let requests = requests.map_err(|e| failed(reads[0], e))?;
    tracing::debug!(namespace = %MACHINE_REQUEST.namespace, count = requests.len(), "live machine requests");
    let states = client.state.list(&provider_machine(&omni.id), &[]).await;
    let states = states.map_err(|e| failed(reads[1], e))?;
    let allocations = states.iter().map(|m| {
        let state = MachineState::from_spec(&m.spec);
        (m.id().to_owned(), state.ip_allocations)
    });
    let live = requests.iter().map(|r| r.id().to_owned()).collect();
    Ok((config, live, allocations.collect()))
}

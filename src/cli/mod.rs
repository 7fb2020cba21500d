//! One module per subcommand; `main.rs` only parses flags and dispatches here.

pub mod cluster;
pub mod omni_args;
pub mod orphans;
pub mod pools;
pub mod run;
pub mod validate;

/// What every subcommand returns; the error is printed with its whole source chain.
pub type CliResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

pub use crate::error_chain::render as render_error;

use std::path::Path;

use crate::config::ProviderConfig;
use crate::rules::provider_data::ProviderDataSchema;

/// Loads the config file for a command and logs, once, what it got wrong without being refused:
/// unknown keys with their "did you mean" (in the file and in `defaults:` and `nodes:`), a token and
/// a password both set. Every command that reads the file says so, so that a misspelt
/// `insecureSkipVerify` is named instead of surfacing as a certificate error.
pub fn load_config(
    path: &Path,
) -> Result<(ProviderConfig, ProviderDataSchema), Box<dyn std::error::Error + Send + Sync>> {
    let config = ProviderConfig::load(path)?;
    let schema = ProviderDataSchema::new()?.strict(config.strict);
    let overrides = schema.check_config(&config.layers);
    for warning in &config.warnings {
        tracing::warn!("config file {}: {warning}", path.display());
    }
    for warning in &overrides.warnings {
        tracing::warn!("config file {}: {warning}", path.display());
    }
    Ok((config, schema))
}

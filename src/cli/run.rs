//! The default command: run the provider (connect to Omni, register, heartbeat, reconcile requests).
//!
//! Placeholder until the Omni connection lands; the flags are the official provider's.

use std::path::PathBuf;

use super::CliResult;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Provider config file (Proxmox connection, defaults, per-node overrides).
    #[arg(long, env = "CONFIG_FILE")]
    pub config_file: Option<PathBuf>,
}

pub async fn run(_args: RunArgs) -> CliResult {
    Err("running the provider is not implemented yet".into())
}

//! `cluster`: what the provider sees of the Proxmox cluster. Placeholder.

use std::path::PathBuf;

use super::CliResult;

#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// Provider config file with the `proxmox:` connection settings.
    #[arg(long)]
    pub config_file: PathBuf,
}

pub async fn run(_args: ClusterArgs) -> CliResult {
    Err("cluster is not implemented yet".into())
}

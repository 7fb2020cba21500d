//! `dev-omni`: an in-memory Omni state server for local development. Placeholder.

use super::CliResult;

#[derive(Debug, clap::Args)]
pub struct DevOmniArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
}

pub async fn run(_args: DevOmniArgs) -> CliResult {
    Err("dev-omni is not implemented yet".into())
}

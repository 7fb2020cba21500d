//! `validate`: check a machine class's provider data before using it.
//!
//! `omni-infra-provider-proxmox validate --config-file config.yaml class.yaml` (or `-` for stdin) runs
//! the checks of [`crate::validate`]: the schema and the pipeline's rules first, then the live cluster
//! from the config file, node by node. It prints every finding (key, node, what was found) and exits
//! non-zero on any problem, so it fits in CI beside the machine classes.
//!
//! `--output json` prints the [`Report`] for scripts (fields are only ever added):
//!
//! ```json
//! { "ok": false, "problems": 1, "warnings": 0,
//!   "findings": [ { "outcome": "problem", "key": "storage_selector", "node": "pve3",
//!                   "message": "`name == \"fast\"` matches no active storage ..." } ] }
//! ```
//! `outcome` is one of `pass`, `skipped`, `warning`, `problem`; `node` is `null` when the finding is
//! not about one node.

use std::path::{Path, PathBuf};

use super::{CliResult, OutputFormat};
use crate::config::ProviderConfig;
use crate::proxmox::ProxmoxClient;
use crate::validate::{Report, validate_class};

#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Provider config file: how to reach Proxmox, and the `defaults:`/`nodes:` the data is merged with.
    #[arg(long, env = "CONFIG_FILE")]
    pub config_file: PathBuf,
    /// `table` for people, `json` for scripts.
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
    /// The machine class's provider data (YAML), or `-` to read it from stdin.
    pub provider_data: PathBuf,
}

pub async fn run(args: ValidateArgs) -> CliResult {
    let path = &args.provider_data;
    let (shown, read) = if path == Path::new("-") {
        ("stdin".into(), std::io::read_to_string(std::io::stdin()))
    } else {
        (path.display().to_string(), std::fs::read_to_string(path))
    };
    let class_yaml = read.map_err(|e| format!("cannot read provider data from {shown}: {e}"))?;
    let config = ProviderConfig::load(&args.config_file)?;
    let client = ProxmoxClient::new(&config.proxmox)?;
    let report = validate_class(&client, &class_yaml, &config).await?;
    args.output.print(&report, Report::render_text)?;
    if report.ok {
        return Ok(());
    }
    let problems = report.problems;
    Err(format!("the provider data has {problems} problem(s); see the report").into())
}

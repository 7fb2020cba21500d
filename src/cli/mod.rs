//! One module per subcommand; `main.rs` only parses flags and dispatches here.

pub mod cluster;
pub mod dev_omni;
pub mod omni_args;
pub mod orphans;
pub mod pools;
pub mod run;
pub mod validate;

/// What every subcommand returns; the error is printed with its whole source chain.
pub type CliResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

pub use crate::error_chain::render as render_error;

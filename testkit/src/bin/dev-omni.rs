//! `dev-omni`: an in-memory Omni for local development and demos.
//!
//! It registers one provider, prints the address and the key that provider should use, and serves
//! until SIGINT/SIGTERM. Nothing is persisted.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use omni_infra_provider_proxmox::cli::{CliResult, run::shutdown_signal};
use omni_infra_provider_proxmox::error_chain::render as render_error;
use omni_infra_provider_proxmox::omni::transport;
use testkit::memstate::{MemState, OmniControllers};

/// Run an in-memory Omni state server for local development and tests.
#[derive(Debug, Parser)]
#[command(name = "dev-omni", version, long_about = None)]
pub struct DevOmniArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Provider ID to register (like `omnictl infraprovider create <id>`).
    #[arg(long, default_value = "proxmox")]
    pub provider_id: String,
    /// Serve TLS with this certificate (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum DevOmniError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot register provider {id:?}: {message}")]
    Register { id: String, message: String },
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(DevOmniArgs::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", render_error(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: DevOmniArgs) -> CliResult {
    transport::install_crypto_provider();
    let state = MemState::new();
    // Omni's own finalizers on statuses and config patch requests, as a real Omni holds them.
    let _controllers = state.run_omni_controllers(OmniControllers {
        drain: Duration::from_secs(1),
    });
    let key = state
        .register_provider(&args.provider_id)
        .map_err(|message| DevOmniError::Register {
            id: args.provider_id.clone(),
            message,
        })?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let read = |p: &PathBuf| {
                std::fs::read(p).map_err(|source| DevOmniError::Read {
                    path: p.clone(),
                    source,
                })
            };
            Some(tonic::transport::ServerTlsConfig::new().identity(
                tonic::transport::Identity::from_pem(read(cert)?, read(key)?),
            ))
        }
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|source| DevOmniError::Listen {
            addr: args.listen.clone(),
            source,
        })?;
    let addr = listener.local_addr()?;
    let server = state.serve(listener, tls)?;
    // Printing the key is the purpose of this command (a throwaway key for a throwaway Omni).
    println!("OMNI_ENDPOINT={scheme}://{addr}");
    if scheme == "http" {
        // A plaintext endpoint must be opted into by the provider; this Omni is local and throwaway.
        println!("OMNI_INSECURE_HTTP=true");
    }
    println!("OMNI_SERVICE_ACCOUNT_KEY={}", key.expose());
    println!("provider id: {}", args.provider_id);
    shutdown_signal().await;
    server.stop().await;
    Ok(())
}

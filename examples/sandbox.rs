//! A cluster to try the commands on, with no Proxmox and no Omni (`make sandbox`).
//!
//! Starts fakepve with a four-node Proxmox VE 9 cluster shaped after the files in `examples/` (see
//! `testkit/src/sandbox.rs`) and the in-memory Omni, writes `examples/config.yaml` pointed at the
//! fake cluster and the Omni connection into a directory (`tmp/sandbox` by default, or the first
//! argument), prints how to use them, and keeps running until Ctrl-C. Every example machine class
//! passes `validate` against it (`tests/sandbox.rs` checks).

mod stack;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use omni_infra_provider_proxmox::omni::transport;
use stack::PROVIDER;
use stack::fakepve::{self, FakePve};
use testkit::memstate::MemState;
use testkit::sandbox;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandbox FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "tmp/sandbox".into()),
    );
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    transport::install_crypto_provider();
    let pve = FakePve::try_start(sandbox::scenario(), 0.02)?;
    let omni = MemState::new();
    let key = omni.register_provider(PROVIDER)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = omni.serve(listener, None).map_err(|e| e.to_string())?;

    let ca = dir.join("pve-root-ca.pem");
    let config = dir.join("config.yaml");
    let env = dir.join("provider.env");
    std::fs::copy(&pve.pki.ca_pem, &ca).map_err(|e| e.to_string())?;
    let ca_shown = absolute(&ca);
    let text = sandbox::config_yaml(
        include_str!("config.yaml"),
        &pve.url,
        &ca_shown.display().to_string(),
    )?;
    write(&config, &text)?;
    write(
        &env,
        &format!(
            "OMNI_ENDPOINT=http://{addr}\nOMNI_INSECURE_HTTP=true\nOMNI_SERVICE_ACCOUNT_KEY={}\n",
            key.expose()
        ),
    )?;
    print_usage(&pve, &dir, &config, &env);
    omni_infra_provider_proxmox::cli::run::shutdown_signal().await;
    println!("\nstopping the sandbox");
    server.stop().await;
    drop(pve);
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// The provider binary built beside this example, as the user types it from the repository.
fn binary() -> String {
    match (testkit::provider_binary(), std::env::current_dir()) {
        (Ok(b), Ok(cwd)) => b
            .strip_prefix(&cwd)
            .map(Path::to_path_buf)
            .unwrap_or(b)
            .display()
            .to_string(),
        _ => "omni-infra-provider-proxmox".into(),
    }
}

fn print_usage(pve: &FakePve, dir: &Path, config: &Path, env: &Path) {
    let bin = binary();
    let (config, env) = (config.display(), env.display());
    println!(
        "\
Sandbox running: a fake Proxmox VE 9 cluster (fakepve) at {url}
  nodes pve1-pve4; storages local-lvm (every node), local-zfs (pve3), shared-nfs and ceph-vm
  (shared); bridges vmbr0 and vmbr1; template talos-template (VMID 9000); API token {token}
and an in-memory Omni (provider ID `{PROVIDER}`). Files in {dir}:
  {config}   examples/config.yaml pointed at the fake cluster
  {env}  OMNI_ENDPOINT and OMNI_SERVICE_ACCOUNT_KEY for this Omni

In another shell, from the repository:
  {bin} cluster --config-file {config}
  {bin} validate --config-file {config} examples/machine-classes/spread-set.yaml
  set -a; . {env}; set +a
  {bin} pools --config-file {config}
  {bin} orphans --config-file {config}
  {bin} --config-file {config}       # the provider itself: it connects and idles

Ctrl-C stops the sandbox (nothing is kept).",
        url = pve.url,
        token = fakepve::TOKEN_ID,
        dir = dir.display(),
    );
}

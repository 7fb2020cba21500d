//! The whole system on one machine, for the demo and the benchmark: fakepve (the fake Proxmox VE
//! API, test-only, from `.venv`) with three nodes and a template, the in-memory Omni served over real
//! gRPC, and the real provider binary connected to both.
#![allow(dead_code)]

#[path = "../../tests/support/certs.rs"]
pub mod certs;
pub mod chaos;
#[path = "../../tests/support/fakepve.rs"]
pub mod fakepve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use omni_infra_provider_proxmox::omni::memstate::{MemServer, MemState};
use omni_infra_provider_proxmox::omni::proto::specs::MachineRequestSpec;
use omni_infra_provider_proxmox::omni::resources::MachineRequest;
use omni_infra_provider_proxmox::omni::transport;

pub use fakepve::{FakePve, Login, Trust, three_node_scenario};

pub const PROVIDER: &str = "proxmox";

pub struct Stack {
    pub pve: FakePve,
    pub omni: MemState,
    server: Option<MemServer>,
    provider: Option<Child>,
    pub metrics: SocketAddr,
    pub log: PathBuf,
}

/// The provider binary built beside this example (`target/<profile>/omni-infra-provider-proxmox`).
fn provider_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe
        .parent()
        .and_then(|examples| examples.parent())
        .ok_or("cannot locate the target directory")?;
    let bin = dir.join("omni-infra-provider-proxmox");
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "{} is missing: build it first (`cargo build --release --bins --examples`, or use `make demo`)",
            bin.display()
        ))
    }
}

fn free_port() -> Result<SocketAddr, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map_err(|e| e.to_string())
}

impl Stack {
    /// Starts everything; `time_scale` is fakepve's real seconds per Proxmox second (0 = instant tasks).
    pub async fn start(time_scale: f64, extra_args: &[&str]) -> Result<Stack, String> {
        Self::start_with(three_node_scenario(), time_scale, extra_args).await
    }

    /// [`Stack::start`] with a fakepve scenario of one's own (see the launcher for its keys).
    pub async fn start_with(
        scenario: serde_json::Value,
        time_scale: f64,
        extra_args: &[&str],
    ) -> Result<Stack, String> {
        transport::install_crypto_provider();
        let binary = provider_binary()?;
        let pve = FakePve::start(scenario, time_scale)
            .ok_or("fakepve is not installed: run scripts/setup-test-env.sh")?;
        let omni = MemState::new();
        let key = omni.register_provider(PROVIDER)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let server = omni.serve(listener, None).map_err(|e| e.to_string())?;
        let config = pve.write_config(Login::Token, Trust::CaFile);
        let metrics = free_port()?;
        let log = pve.dir.path().join("provider.log");
        let log_file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let provider = Command::new(binary)
            .arg("--config-file")
            .arg(&config)
            .args([
                "--log-level",
                &std::env::var("PROVIDER_LOG_LEVEL").unwrap_or_else(|_| "info".into()),
            ])
            .args(
                (!extra_args.contains(&"--health-interval"))
                    .then_some(["--health-interval", "2s"])
                    .into_iter()
                    .flatten(),
            )
            .args(["--metrics-listen", &metrics.to_string()])
            .args(extra_args)
            .env("OMNI_ENDPOINT", format!("http://{addr}"))
            .env("OMNI_SERVICE_ACCOUNT_KEY", key.expose())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot start the provider: {e}"))?;
        let stack = Stack {
            pve,
            omni,
            server: Some(server),
            provider: Some(provider),
            metrics,
            log,
        };
        let up = stack
            .omni
            .wait_for(Duration::from_secs(20), |s| {
                s.get(
                    &omni_infra_provider_proxmox::omni::resources::InfraProviderHealthStatus,
                    PROVIDER,
                )
                .is_some()
            })
            .await;
        if !up {
            return Err(format!(
                "the provider did not connect; its log:\n{}",
                std::fs::read_to_string(&stack.log).unwrap_or_default()
            ));
        }
        Ok(stack)
    }

    pub fn request(&self, id: &str, set: &str, provider_data: &str) {
        let spec = MachineRequestSpec {
            talos_version: "v1.11.3".into(),
            provider_data: provider_data.into(),
            ..Default::default()
        };
        self.omni.create_machine_request(id, PROVIDER, set, &spec);
    }

    /// Omni tears the request down and deletes it once our finalizer is gone.
    pub fn tear_down(&self, id: &str) {
        self.omni.teardown(&MachineRequest, id);
    }

    /// Deletes released requests as Omni does; true when none of `ids` is left.
    pub fn all_released(&self, ids: &[String]) -> bool {
        self.omni.collect_torn_down(&MachineRequest);
        ids.iter()
            .all(|id| self.omni.get(&MachineRequest, id).is_none())
    }

    /// Resident memory of the provider process, in KiB.
    pub fn provider_rss_kib(&self) -> Option<u64> {
        let pid = self.provider.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Proxmox requests fakepve saw since the last reset, without the health checks (`GET /version`
    /// on the heartbeat's schedule), which are not machine work.
    pub fn proxmox_requests(&mut self) -> Vec<(String, String)> {
        self.pve
            .requests()
            .into_iter()
            .filter(|(m, p)| !(m == "GET" && p.ends_with("/version")))
            .collect()
    }

    /// Average duration of each pipeline step, in seconds, from the provider's own `/metrics`.
    pub async fn step_seconds(&self) -> Result<Vec<(String, f64, u64)>, String> {
        let http = omni_infra_provider_proxmox::pipeline::image_factory::http_client()?;
        let text = http
            .get(format!("http://{}/metrics", self.metrics))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        let value = |line: &str| line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        let mut steps: Vec<(String, f64, u64)> = Vec::new();
        for step in [
            "pick_node",
            "prepare_image",
            "create_vm",
            "configure_vm",
            "start_vm",
            "discover_ip",
        ] {
            let find = |suffix: &str| {
                let prefix =
                    format!("omni_proxmox_step_duration_seconds_{suffix}{{step=\"{step}\"}}");
                text.lines()
                    .find(|l| l.starts_with(&prefix))
                    .and_then(value)
            };
            if let (Some(sum), Some(count)) = (find("sum"), find("count")) {
                steps.push((step.to_owned(), sum, count as u64));
            }
        }
        Ok(steps)
    }

    pub fn reset_proxmox_requests(&mut self) {
        self.pve
            .control(serde_json::json!({"op": "reset_requests"}));
    }

    /// Stops the provider with SIGTERM (it must exit 0), then the servers.
    pub async fn stop(mut self) -> Result<(), String> {
        let mut result = Ok(());
        if let Some(mut child) = self.provider.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                match child.try_wait() {
                    Ok(Some(status)) if status.success() => break,
                    Ok(Some(status)) => {
                        result = Err(format!("the provider exited with {status}"));
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(20)).await
                    }
                    _ => {
                        let _ = child.kill();
                        result = Err("the provider did not stop on SIGTERM".into());
                        break;
                    }
                }
            }
        }
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
        // Keep the provider's log past the temporary directory, for a look after the run.
        let kept = std::env::temp_dir().join("omni-infra-provider-proxmox-last-run.log");
        if std::fs::copy(&self.log, &kept).is_ok() {
            println!("\nProvider log: {}", kept.display());
        }
        result
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Some(mut child) = self.provider.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

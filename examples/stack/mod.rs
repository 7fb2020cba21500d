//! The whole system on one machine, for the demo and the benchmark: fakepve (the fake Proxmox VE
//! API, test-only, from `.venv`) with three nodes and a template, the in-memory Omni served over real
//! gRPC, and the real provider binary connected to both.
#![allow(dead_code)]

pub mod chaos;
pub mod link;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use omni_infra_provider_proxmox::omni::proto::specs::MachineRequestSpec;
use omni_infra_provider_proxmox::omni::resources::MACHINE_REQUEST;
use omni_infra_provider_proxmox::omni::transport;
use omni_infra_provider_proxmox::pipeline::step::Step;
use testkit::memstate::{ControllersTask, MemServer, MemState, OmniControllers};

pub use testkit::fakepve::{self, FakePve, three_node_scenario};
use testkit::provider_binary;

pub const PROVIDER: &str = "proxmox";

/// How long Omni's cleanup controller holds a torn-down status unless a run sets another
/// ([`MemState::set_drain`]): a machine that never joined a cluster leaves quickly.
pub const DRAIN: Duration = Duration::from_millis(500);

pub struct Stack {
    pub pve: FakePve,
    pub omni: MemState,
    /// Omni's own controllers over `omni` (finalizers on statuses and patch requests).
    _controllers: ControllersTask,
    server: Option<MemServer>,
    /// The provider processes; the first is "the provider" of the single-process runs.
    pub replicas: Vec<Replica>,
    /// How the providers are started, to start them again ([`Stack::restart`]).
    launch: Launch,
}

/// One provider process of the stack.
pub struct Replica {
    pub name: String,
    child: Option<Child>,
    pub metrics: SocketAddr,
    pub log: PathBuf,
    /// Its own Proxmox API token, so fakepve's log of writes tells the replicas apart.
    pub token: String,
    config: PathBuf,
    /// Its claim file (one per replica: each stands for a host of its own).
    claim: PathBuf,
    /// Its own way to Omni, which a test can cut; `None`: straight to the in-memory Omni.
    pub link: Option<link::Link>,
    args: Vec<String>,
}

/// What starting a provider takes.
struct Launch {
    binary: PathBuf,
    omni_addr: SocketAddr,
    key: String,
    args: Vec<String>,
    config_extra: String,
}

fn free_port() -> Result<SocketAddr, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map_err(|e| e.to_string())
}

/// The Proxmox API token of replica `name` (the first replica uses the scenario's own).
fn replica_token(name: &str) -> String {
    if name == "a" {
        fakepve::TOKEN_ID.to_owned()
    } else {
        format!("omni@pve!replica-{name}")
    }
}

/// Names of the replicas a stack may start: `a` first.
const REPLICA_NAMES: &[&str] = &["a", "b", "c", "d"];

impl Replica {
    fn new(pve: &FakePve, name: &str, config_extra: &str, args: &[String]) -> Result<Self, String> {
        let token = replica_token(name);
        let dir = pve.dir.path();
        let config = dir.join(format!("provider-{name}.yaml"));
        let text = format!(
            "{}{config_extra}",
            pve.config_yaml(fakepve::Login::Token, fakepve::Trust::CaFile)
        )
        .replace(fakepve::TOKEN_ID, &token);
        std::fs::write(&config, text).map_err(|e| e.to_string())?;
        let log_name = if name == "a" {
            "provider.log".to_owned()
        } else {
            format!("provider-{name}.log")
        };
        Ok(Self {
            name: name.to_owned(),
            child: None,
            metrics: free_port()?,
            log: dir.join(log_name),
            token,
            config,
            claim: dir.join(format!("claim-{name}")),
            link: None,
            args: args.to_vec(),
        })
    }

    fn spawn(&mut self, launch: &Launch) -> Result<(), String> {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| e.to_string())?;
        let omni = self.link.as_ref().map_or(launch.omni_addr, |l| l.addr);
        let child = Command::new(&launch.binary)
            .arg("--config-file")
            .arg(&self.config)
            .args([
                "--log-level",
                &std::env::var("PROVIDER_LOG_LEVEL").unwrap_or_else(|_| "info".into()),
            ])
            .args(
                (!self.args.iter().any(|a| a == "--health-interval"))
                    .then_some(["--health-interval", "2s"])
                    .into_iter()
                    .flatten(),
            )
            .args(["--metrics-listen", &self.metrics.to_string()])
            .arg("--leader-elect-claim-file")
            .arg(&self.claim)
            .args(&self.args)
            .env("OMNI_ENDPOINT", format!("http://{omni}"))
            // The in-memory Omni speaks plaintext.
            .env("OMNI_INSECURE_HTTP", "true")
            .env("OMNI_SERVICE_ACCOUNT_KEY", &launch.key)
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot start the provider: {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        Some(self.child.as_ref()?.id())
    }

    /// SIGKILL: no shutdown, nothing flushed, work cut off wherever it was.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, without waiting.
    pub fn terminate(&self) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }

    /// The exit status once the process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// SIGTERM; an error unless it exits 0 within 20 s.
    async fn stop(&mut self) -> Result<(), String> {
        if self.child.is_none() {
            return Ok(());
        }
        if self.exited().is_none() {
            self.terminate();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.exited() {
                Some(status) if status.success() => {
                    self.child = None;
                    return Ok(());
                }
                Some(status) => {
                    self.child = None;
                    return Err(format!("provider {} exited with {status}", self.name));
                }
                None if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                None => {
                    self.kill();
                    return Err(format!("provider {} did not stop on SIGTERM", self.name));
                }
            }
        }
    }

    /// Its own `/metrics` text.
    pub async fn metrics_text(&self) -> Result<String, String> {
        get_text(&format!("http://{}/metrics", self.metrics)).await
    }

    /// `/readyz`: its status code and body.
    pub async fn readyz(&self) -> Result<(u16, String), String> {
        let http = omni_infra_provider_proxmox::pipeline::image_factory::http_client()?;
        let answer = http
            .get(format!("http://{}/readyz", self.metrics))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = answer.status().as_u16();
        Ok((status, answer.text().await.map_err(|e| e.to_string())?))
    }
}

async fn get_text(url: &str) -> Result<String, String> {
    let http = omni_infra_provider_proxmox::pipeline::image_factory::http_client()?;
    http.get(url)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())
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
        Self::start_configured(scenario, time_scale, extra_args, "").await
    }

    /// [`Stack::start_with`] with `config_extra` appended to the provider's config file (e.g.
    /// `ipPools:`).
    pub async fn start_configured(
        scenario: serde_json::Value,
        time_scale: f64,
        extra_args: &[&str],
        config_extra: &str,
    ) -> Result<Stack, String> {
        let mut stack = Self::start_servers(scenario, time_scale, extra_args, config_extra).await?;
        stack.add_replica(extra_args, false)?;
        stack.wait_for_a_leader().await?;
        Ok(stack)
    }

    /// fakepve and the in-memory Omni, with no provider yet ([`Stack::add_replica`] starts them).
    pub async fn start_servers(
        mut scenario: serde_json::Value,
        time_scale: f64,
        extra_args: &[&str],
        config_extra: &str,
    ) -> Result<Stack, String> {
        transport::install_crypto_provider();
        let binary = provider_binary()?;
        for name in REPLICA_NAMES {
            scenario["tokens"][replica_token(name)] = fakepve::TOKEN_SECRET.into();
        }
        let pve = FakePve::try_start(scenario, time_scale)?;
        let omni = MemState::new();
        let controllers = omni.run_omni_controllers(OmniControllers { drain: DRAIN });
        let key = omni.register_provider(PROVIDER)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let server = omni.serve(listener, None).map_err(|e| e.to_string())?;
        let launch = Launch {
            binary,
            omni_addr: addr,
            key: key.expose().to_owned(),
            args: extra_args.iter().map(|a| a.to_string()).collect(),
            config_extra: config_extra.to_owned(),
        };
        Ok(Stack {
            pve,
            omni,
            _controllers: controllers,
            server: Some(server),
            replicas: Vec::new(),
            launch,
        })
    }

    /// Starts one more provider process with `args`, behind a link a test can cut when `linked`;
    /// returns its index.
    pub fn add_replica(&mut self, args: &[&str], linked: bool) -> Result<usize, String> {
        let name = REPLICA_NAMES
            .get(self.replicas.len())
            .ok_or("no more replica names")?;
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let mut replica = Replica::new(&self.pve, name, &self.launch.config_extra, &args)?;
        if linked {
            replica.link = Some(link::Link::start(self.launch.omni_addr)?);
        }
        replica.spawn(&self.launch)?;
        self.replicas.push(replica);
        Ok(self.replicas.len() - 1)
    }

    /// Gives replica `index` the claim file of replica `of` from its next start on: two processes
    /// of one host.
    pub fn share_claim(&mut self, index: usize, of: usize) {
        let claim = self.replicas[of].claim.clone();
        self.replicas[index].claim = claim;
    }

    /// Waits until some replica has written the provider's health status (only a leader does).
    pub async fn wait_for_a_leader(&self) -> Result<(), String> {
        let up = self
            .omni
            .wait_for(Duration::from_secs(20), |s| {
                s.get(
                    &omni_infra_provider_proxmox::omni::resources::INFRA_PROVIDER_HEALTH_STATUS,
                    PROVIDER,
                )
                .is_some()
            })
            .await;
        if up {
            return Ok(());
        }
        let logs: Vec<String> = self
            .replicas
            .iter()
            .map(|r| {
                format!(
                    "--- {}:\n{}",
                    r.name,
                    std::fs::read_to_string(&r.log).unwrap_or_default()
                )
            })
            .collect();
        Err(format!(
            "no provider connected; their logs:\n{}",
            logs.join("\n")
        ))
    }

    /// The first replica's metrics address.
    pub fn metrics(&self) -> SocketAddr {
        self.replicas[0].metrics
    }

    /// The first replica's log.
    pub fn log(&self) -> &std::path::Path {
        &self.replicas[0].log
    }

    /// The leader lease as the in-memory Omni holds it.
    pub fn lease(&self) -> Option<omni_infra_provider_proxmox::omni::proto::provider::LeaseSpec> {
        use omni_infra_provider_proxmox::omni::resources::{LEASE_ID, provider_lease};
        self.omni
            .get(&provider_lease(PROVIDER), LEASE_ID)
            .map(|l| l.spec)
    }

    /// The replica the lease names, if it is one of this stack's running ones.
    pub fn leader(&self) -> Option<usize> {
        let holder = self.lease()?.holder;
        let pid: u32 = holder.split('/').nth(1)?.parse().ok()?;
        self.replicas.iter().position(|r| r.pid() == Some(pid))
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
        self.omni.teardown(&MACHINE_REQUEST, id);
    }

    /// Deletes released requests as Omni does; true when none of `ids` is left.
    pub fn all_released(&self, ids: &[String]) -> bool {
        self.omni.collect_torn_down(&MACHINE_REQUEST);
        ids.iter()
            .all(|id| self.omni.get(&MACHINE_REQUEST, id).is_none())
    }

    /// Resident memory of the provider process, in KiB.
    pub fn provider_rss_kib(&self) -> Option<u64> {
        proc_status_kib(self.provider_pid()?, "VmRSS:")
    }

    /// The provider's peak resident memory since it started, in KiB.
    pub fn provider_peak_rss_kib(&self) -> Option<u64> {
        proc_status_kib(self.provider_pid()?, "VmHWM:")
    }

    /// CPU time (user + system) the provider has used since it started.
    pub fn provider_cpu(&self) -> Option<Duration> {
        cpu_time(self.provider_pid()?)
    }

    /// CPU time (user + system) fakepve has used since it started: the fake's own cost, to tell
    /// apart from the provider's.
    pub fn fakepve_cpu(&self) -> Option<Duration> {
        cpu_time(self.pve.pid())
    }

    /// Open file descriptors of the provider.
    pub fn provider_fds(&self) -> Option<usize> {
        let pid = self.provider_pid()?;
        Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
    }

    pub fn provider_pid(&self) -> Option<u32> {
        self.replicas.first()?.pid()
    }

    /// Stops the provider (SIGTERM; it must exit 0) and starts it again with `args` instead of the
    /// arguments it had; returns once its `/readyz` answers 200 (connected to Omni, Proxmox
    /// answering), with how long that took from the start of the new process.
    pub async fn restart(&mut self, args: &[&str]) -> Result<Duration, String> {
        let replica = self.replicas.first_mut().ok_or("no provider")?;
        replica.stop().await?;
        replica.args = args.iter().map(|a| a.to_string()).collect();
        replica.metrics = free_port()?;
        let started = Instant::now();
        replica.spawn(&self.launch)?;
        let http = omni_infra_provider_proxmox::pipeline::image_factory::http_client()?;
        let url = format!("http://{}/readyz", replica.metrics);
        while started.elapsed() < Duration::from_secs(60) {
            if let Ok(answer) = http.get(&url).send().await
                && answer.status().is_success()
            {
                return Ok(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(format!(
            "the restarted provider was not ready within a minute; its log: {}",
            replica.log.display()
        ))
    }

    /// Starts replica `index` again, as it was started, its log appended to the same file; with
    /// `new_key`, under a key registered anew (as `omnictl infraprovider` would hand out).
    pub fn respawn(&mut self, index: usize, new_key: bool) -> Result<(), String> {
        if new_key {
            self.launch.key = self.omni.register_provider(PROVIDER)?.expose().to_owned();
        }
        let replica = self.replicas.get_mut(index).ok_or("no such replica")?;
        replica.kill();
        replica.spawn(&self.launch)
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
            .get(format!("http://{}/metrics", self.metrics()))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        let value = |line: &str| line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        let mut steps: Vec<(String, f64, u64)> = Vec::new();
        for step in Step::ALL.iter().map(|s| s.as_str()) {
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

    /// How many requests fakepve recorded since the last reset (the health checks included: they
    /// are rare with a long `--health-interval`), without transferring them.
    pub fn request_count(&mut self) -> usize {
        self.pve
            .control(serde_json::json!({"op": "request_count"}))
            .as_u64()
            .map_or(0, |n| n as usize)
    }

    /// Requests waiting or being worked on in the provider, from its `/metrics`.
    pub async fn queue_depth(&self) -> Option<u64> {
        let http = omni_infra_provider_proxmox::pipeline::image_factory::http_client().ok()?;
        let text = http
            .get(format!("http://{}/metrics", self.metrics()))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find(|l| l.starts_with("omni_proxmox_machine_requests_in_flight "))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map(|v| v as u64)
    }

    /// What the provider left behind that does not belong to one of `kept` (request IDs): VMs (a
    /// provider's VM is named after its request; the scenario's template and foreign VM are not
    /// counted), seed ISOs on any storage, and Omni requests, statuses and provider states.
    pub fn leftovers(&mut self, kept: &[String]) -> Vec<String> {
        use omni_infra_provider_proxmox::omni::resources::{
            MACHINE_REQUEST_STATUS, provider_machine,
        };
        let kept: std::collections::HashSet<&str> = kept.iter().map(String::as_str).collect();
        let mut found = Vec::new();
        let vms = self.pve.control(serde_json::json!({"op": "vms"}));
        for vm in vms.as_array().into_iter().flatten() {
            let name = vm["name"].as_str().unwrap_or_default();
            let scenario = vm["vmid"] == 9000 || vm["vmid"] == 100;
            if !scenario && !kept.contains(name) {
                found.push(format!("VM {} ({name}) on {}", vm["vmid"], vm["node"]));
            }
        }
        for storage in ["local", "shared-nfs"] {
            let volumes = self
                .pve
                .control(serde_json::json!({"op": "storage_volumes", "storage": storage}));
            for volume in volumes.as_array().into_iter().flatten() {
                let volume = volume.as_str().unwrap_or_default();
                let seed_of = volume
                    .rsplit('/')
                    .next()
                    .and_then(|f| f.strip_prefix("omni-seed-"))
                    .and_then(|f| f.strip_suffix(".iso"));
                if seed_of.is_some_and(|id| !kept.contains(id)) {
                    found.push(format!("seed ISO {storage}:{volume}"));
                }
            }
        }
        let omni = [
            (
                "MachineRequest",
                self.omni
                    .list(&MACHINE_REQUEST)
                    .iter()
                    .map(|r| r.id().to_owned())
                    .collect::<Vec<_>>(),
            ),
            (
                "MachineRequestStatus",
                self.omni
                    .list(&MACHINE_REQUEST_STATUS)
                    .iter()
                    .map(|r| r.id().to_owned())
                    .collect(),
            ),
            (
                "provider state",
                self.omni
                    .list(&provider_machine(PROVIDER))
                    .iter()
                    .map(|r| r.id().to_owned())
                    .collect(),
            ),
        ];
        for (kind, ids) in omni {
            for id in ids.iter().filter(|id| !kept.contains(id.as_str())) {
                found.push(format!("{kind} {id}"));
            }
        }
        found
    }

    pub fn reset_proxmox_requests(&mut self) {
        self.pve
            .control(serde_json::json!({"op": "reset_requests"}));
    }

    /// Stops every provider with SIGTERM (each must exit 0), then the servers.
    pub async fn stop(mut self) -> Result<(), String> {
        let mut result = Ok(());
        for replica in &mut self.replicas {
            if let Err(e) = replica.stop().await {
                result = result.and(Err(e));
            }
        }
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
        // Keep the provider's log past the temporary directory, for a look after the run.
        let kept = std::env::temp_dir().join("omni-infra-provider-proxmox-last-run.log");
        if std::fs::copy(self.log(), &kept).is_ok() {
            println!("\nProvider log: {}", kept.display());
        }
        result
    }
}

fn proc_status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// utime + stime of a process, from `/proc/<pid>/stat` (in clock ticks of 1/100 s, as Linux
/// reports them to user space on every common architecture).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: the fields are counted after its closing parenthesis.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

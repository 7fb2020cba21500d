//! The default command: run the provider.
//!
//! Start-up checks everything a user can get wrong before touching Omni (config file, key, flags),
//! then connects, registers, and runs until SIGTERM/SIGINT: the heartbeat, the MachineRequest watch
//! feeding the reconcile workers, and the loop keeping topology labels in step with the VMs.
//! Flags and environment variables are the official provider's, plus a few of ours.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::pipeline::image_factory::FactoryAuth;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::omni_args::OmniArgs;
use super::{BoxError, CliResult};
use crate::config::ProviderConfig;
use crate::controller::context::Context;
use crate::controller::health;
use crate::controller::leader::identity::default_claim_path;
use crate::controller::leader::{Election, Timings};
use crate::controller::registration::{self, ProviderInfo};
use crate::controller::runner::{self, Controller};
use crate::fence::Fence;
use crate::metrics::Metrics;
use crate::omni::auth::ProviderKey;
use crate::omni::client::OmniClient;
use crate::omni::state::{StateClient, StateError};
use crate::omni::transport::{self, OmniEndpoint};
use crate::pipeline::step::{AGENT_POLL, Services};
use crate::proxmox::ProxmoxClient;
use crate::telemetry::{self, LogFormat};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Provider config file (Proxmox connection, defaults, per-node overrides).
    #[arg(long, env = "CONFIG_FILE")]
    pub config_file: Option<PathBuf>,
    #[command(flatten)]
    pub omni: OmniArgs,
    /// Provider name shown in Omni.
    #[arg(long, default_value = "Proxmox")]
    pub provider_name: String,
    /// Provider description shown in Omni.
    #[arg(long, default_value = "Proxmox infrastructure provider")]
    pub provider_description: String,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Log level or filter (RUST_LOG overrides it).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Interval between heartbeats to Omni (Omni shows the provider disconnected after 31 s).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub health_interval: Duration,
    /// How often the Kubernetes topology labels (provider data `topology_labels`) are checked against
    /// where each VM runs; a migrated VM is relabelled within this time.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub topology_interval: Duration,
    /// How many machine requests work on each Proxmox node at once, and how many are being placed at
    /// once (each request's Proxmox calls stay sequential). Per node, so that a slow node slows only
    /// the machines on it.
    #[arg(long, env = "CONCURRENCY", default_value_t = crate::controller::context::DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// Serve /metrics, /healthz and /readyz on this address (e.g. 0.0.0.0:9100); off by default.
    #[arg(long, env = "METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Image Factory that serves the Talos boot ISOs (boot mode `iso`).
    #[arg(
        long,
        env = "IMAGE_FACTORY_URL",
        default_value = "https://factory.talos.dev"
    )]
    pub image_factory_url: String,
    /// A YAML file with the credentials of Image Factories that ask for them, by factory URL
    /// (`https://factory.example.com: {username: …, password: …}`), as Omni's ImageFactoryAuth
    /// resources hold them (an infra provider may not read those). Boot images from such a factory
    /// are downloaded by the provider and streamed into the storage.
    #[arg(long, env = "IMAGE_FACTORY_AUTH_FILE")]
    pub image_factory_auth_file: Option<PathBuf>,
    /// Run as one of any number of replicas: only the one holding the leader lease in Omni works,
    /// the others stand by and take over when it stops. `--leader-elect=false` runs without the
    /// lease, as a single process must then be the only one.
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// How long a standby waits, from the last change it saw to the lease, before taking it over.
    #[arg(long, env = "LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader may go without renewing the lease before it stops every write to
    /// Proxmox and Omni (shorter than the lease duration).
    #[arg(long, env = "LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often a standby looks at the lease.
    #[arg(long, env = "LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// The file a replica keeps locked while it runs, so that after a crash the next process on
    /// the same host or container takes the lease back at once (default: in the temporary
    /// directory; in Kubernetes put it on an `emptyDir`).
    #[arg(long, env = "LEADER_ELECT_CLAIM_FILE")]
    pub leader_elect_claim_file: Option<PathBuf>,
}

/// `10s`, `500ms`, `1m`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 10s, 500ms or 1m"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s or m)")),
    };
    if d.is_zero() {
        return Err("the interval must be greater than zero".into());
    }
    Ok(d)
}

/// Everything the provider needs, checked; built before any network call.
struct Settings {
    args: RunArgs,
    config: ProviderConfig,
    factory_auth: FactoryAuth,
    endpoint: OmniEndpoint,
    key: Arc<ProviderKey>,
    info: ProviderInfo,
    /// The lease's timings; `None` with `--leader-elect=false`.
    leader_election: Option<Timings>,
}

impl Settings {
    fn from_args(args: RunArgs) -> Result<Self, BoxError> {
        let path = (args.config_file.as_ref()).ok_or(
            "--config-file (or CONFIG_FILE) is required: the provider needs the Proxmox connection settings",
        )?;
        let (config, problems) = super::read_config(path)?;
        if !problems.is_empty() {
            let problems = crate::rules::provider_data::describe(&problems);
            return Err(format!("config file {}: {problems}", path.display()).into());
        }
        let (endpoint, key) = args.omni.connection()?;
        let timings = Timings {
            lease_duration: args.leader_elect_lease_duration,
            renew_deadline: args.leader_elect_renew_deadline,
            retry_period: args.leader_elect_retry_period,
        };
        let leader_election = args.leader_elect.then_some(timings);
        leader_election.as_ref().map(Timings::check).transpose()?;
        Ok(Self {
            config,
            factory_auth: (args.image_factory_auth_file.as_deref())
                .map(FactoryAuth::read)
                .transpose()?
                .unwrap_or_default(),
            endpoint,
            key: Arc::new(key),
            info: ProviderInfo {
                id: args.omni.id.clone(),
                name: args.provider_name.clone(),
                description: args.provider_description.clone(),
            },
            leader_election,
            args,
        })
    }
}

pub async fn run(args: RunArgs) -> CliResult {
    telemetry::init_logging(args.log_format, &args.log_level)?;
    transport::install_crypto_provider();
    let settings = Settings::from_args(args)?;
    for warning in settings.args.omni.warnings() {
        tracing::warn!("{warning}");
    }
    let pve = ProxmoxClient::new(&settings.config.proxmox)?;
    let reach = pve.clone();
    tokio::spawn(async move {
        if let Some(warning) = crate::validate::root_reach_warning(&reach).await {
            tracing::warn!("{warning}");
        }
    });
    run_with(settings, pve).await
}

/// The heartbeat's health check: the last result of checks that run on their own schedule, so a
/// slow or unreachable Proxmox never delays a heartbeat (Omni marks a provider disconnected after
/// 31 s without one). Every interval: the Proxmox API answers and accepts our credentials. Every few
/// minutes (and at start): the config's `defaults:` and `nodes:` still fit the cluster (storages,
/// bridges, template), which costs a few more requests.
fn proxmox_health(pve: ProxmoxClient, settings: &Settings) -> watch::Receiver<Option<String>> {
    const DEFAULTS_EVERY: Duration = Duration::from_secs(300);
    let (config, interval) = (settings.config.clone(), settings.args.health_interval);
    let (writer, last) = watch::channel(None);
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let limit = interval.max(Duration::from_secs(5));
        let mut defaults_problem: Option<String> = None;
        let mut defaults_checked: Option<tokio::time::Instant> = None;
        loop {
            ticker.tick().await;
            let api = (tokio::time::timeout(limit, pve.health()).await).unwrap_or_else(|_| {
                Some(format!("Proxmox API at {} does not answer", pve.api_url()))
            });
            if api.is_none() && defaults_checked.is_none_or(|t| t.elapsed() >= DEFAULTS_EVERY) {
                defaults_problem =
                    tokio::time::timeout(limit * 3, crate::validate::check_defaults(&pve, &config))
                        .await
                        .unwrap_or(None);
                if let Some(p) = &defaults_problem {
                    tracing::warn!(problem = %p, "the config's defaults do not fit the cluster");
                }
                defaults_checked = Some(tokio::time::Instant::now());
            }
            writer.send_replace(api.or(defaults_problem.clone()));
        }
    });
    last
}

async fn run_with(settings: Settings, pve: ProxmoxClient) -> CliResult {
    let health_check = proxmox_health(pve.clone(), &settings);
    tracing::info!(
        endpoint = %settings.endpoint.url,
        provider_id = %settings.info.id,
        identity = settings.key.identity(),
        proxmox = %settings.config.proxmox.api_url,
        leader_election = settings.leader_election.is_some(),
        "starting"
    );
    for warning in &settings.config.warnings {
        tracing::warn!("config file: {warning}");
    }
    let provider_id = settings.info.id.clone();
    let omni = OmniClient::connect(&settings.endpoint, settings.key.clone(), &provider_id)?;
    // Polled from here on, so a SIGTERM during the start stops the provider cleanly too.
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let detect = until_reachable("detecting Omni's join mode", || {
        crate::omni::join::JoinMode::detect(&omni.state)
    });
    let mode = tokio::select! {
        mode = detect => mode?,
        () = &mut shutdown => {
            tracing::info!("stopped before the start was complete");
            return Ok(());
        }
    };
    tracing::info!(?mode, "detected Omni join mode");
    let image_factory_url = crate::pipeline::image_factory::resolve_factory(
        &omni.state,
        &settings.args.image_factory_url,
    )
    .await;
    let factory_http = crate::pipeline::image_factory::http_client()?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let (metrics, metrics_server) = start_metrics(&pve, settings.args.metrics_listen, &stop_rx);
    let fence = (settings.leader_election).map_or_else(Fence::default, |_| Fence::shut());
    pve.set_fence(fence.clone());
    let state = omni.state.fenced(fence.clone());
    let (leading, part) = take_part(&settings, &omni.state, fence, &metrics, &stop_rx);
    let heartbeat = health::Heartbeat {
        state: state.clone(),
        provider_id,
        interval: settings.args.health_interval,
        check: health_check,
        metrics: metrics.clone(),
    };
    let heartbeat = tokio::spawn(heartbeat.run(stop_rx, leading.clone()));
    // Each term of leadership starts with fresh ledgers and caches: another replica may have
    // changed anything meanwhile.
    let term_context = || -> Context {
        let services = Services {
            provider_id: settings.info.id.clone(),
            pve: pve.clone(),
            management: omni.management.clone(),
            config: settings.config.clone(),
            ledgers: Default::default(),
            image_factory_url: image_factory_url.clone(),
            factory_http: factory_http.clone(),
            factory_auth: settings.factory_auth.clone(),
            agent_poll: AGENT_POLL,
            metrics: metrics.clone(),
        };
        Context::new(Arc::new(services), state.clone(), mode)
    };
    let outcome = while_leading(&settings, &state, leading, &mut shutdown, term_context).await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    join_all([heartbeat].into_iter().chain(part).chain(metrics_server)).await;
    tracing::info!("stopped");
    outcome
}

/// This process's part until `stop`: a replica in the leader election (its role changes as the
/// lease goes), or with `--leader-elect=false` the leader for good (a role whose channel is closed
/// at once: no task keeps it, and a closed channel ends no term).
fn take_part(
    settings: &Settings,
    unfenced: &StateClient,
    fence: Fence,
    metrics: &Arc<Metrics>,
    stop: &watch::Receiver<bool>,
) -> (watch::Receiver<bool>, Option<JoinHandle<()>>) {
    let Some(timings) = settings.leader_election else {
        metrics.leader.set(1);
        return (watch::channel(true).1, None);
    };
    let args = &settings.args;
    let claim_file =
        (args.leader_elect_claim_file.clone()).unwrap_or_else(|| default_claim_path(&args.omni.id));
    let (election, leading) = Election::new(
        unfenced.clone(),
        &settings.info.id,
        timings,
        Some(&claim_file),
        fence,
        metrics.clone(),
    );
    (leading, Some(tokio::spawn(election.run(stop.clone()))))
}

/// Works through every term of leadership until `shutdown`: registers, then reconciles and keeps
/// the topology labels, each term with the context `term_context` makes, stopped when the lease is
/// lost (a role channel closed while leading, as without an election, loses nothing).
async fn while_leading(
    settings: &Settings,
    state: &StateClient,
    mut leading: watch::Receiver<bool>,
    shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    term_context: impl Fn() -> Context,
) -> CliResult {
    loop {
        tokio::select! {
            led = leading.wait_for(|l| *l) => if led.is_err() { return Ok(()) },
            () = &mut *shutdown => return Ok(()),
        }
        let register = until_reachable("registering the provider status", || {
            registration::register(state, &settings.info)
        });
        let registered = tokio::select! {
            r = register => r,
            Ok(_) = leading.wait_for(|l| !l) => continue,
            () = &mut *shutdown => return Ok(()),
        };
        match registered {
            Ok(()) => tracing::info!("registered provider status"),
            Err(StateError::Fenced { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
        // The term: the reconcile workers and the housekeeping round, until `stop`.
        let context = Arc::new(term_context().with_concurrency(settings.args.concurrency));
        let (stop, stop_rx) = watch::channel(false);
        // With replicas, a standby waits for this one's in-flight work: it gets a moment to
        // finish, then stops where it is, and the next leader resumes it from the provider state.
        let grace = (settings.leader_election).map_or(runner::SHUTDOWN_GRACE, |_| HANDOVER_GRACE);
        let controller = Controller::with_shutdown_grace(grace);
        let topology = tokio::spawn(crate::controller::housekeeping::run(
            context.clone(),
            settings.args.topology_interval,
            stop_rx.clone(),
        ));
        let reconciling = tokio::spawn(controller.run(context, stop_rx));
        tracing::info!(
            concurrency = settings.args.concurrency,
            "watching machine requests"
        );
        let done = tokio::select! {
            Ok(_) = leading.wait_for(|l| !l) => false,
            () = &mut *shutdown => true,
        };
        // Reconciles in flight finish within the runner's grace (a fenced write fails at once,
        // which is where a term that lost the lease stops), then the term's state goes.
        let _ = stop.send(true);
        join_all([reconciling, topology]).await;
        if done {
            return Ok(());
        }
    }
}

/// How long a leader's in-flight reconciles may run on when it stops leading or shuts down, before
/// they are cut short and the lease goes to a standby.
const HANDOVER_GRACE: Duration = Duration::from_secs(1);

/// Longest wait between two tries to reach Omni at start.
const START_RETRY_MAX: Duration = Duration::from_secs(30);

/// Omni out of reach at start (Omni restarting, a load balancer, a network blip) is waited out,
/// a second doubling to half a minute between tries, instead of ending the process: once running,
/// the provider rides out the same trouble. Any other answer (a refused key, a missing permission)
/// ends the start with its error.
async fn until_reachable<T>(
    doing: &str,
    mut call: impl AsyncFnMut() -> Result<T, StateError>,
) -> Result<T, StateError> {
    let mut delay = Duration::from_secs(1);
    loop {
        match call().await {
            Err(e @ StateError::Transport { .. }) => {
                tracing::warn!(error = %e, retry_in = ?delay, "{doing}: Omni is out of reach; trying again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(START_RETRY_MAX);
            }
            other => return other,
        }
    }
}

/// The metrics every part counts into, with each Proxmox request observed from here on, and the
/// server of `/metrics` and the health endpoints when `--metrics-listen` is set: it stops when
/// `stop` turns true, and its task is awaited at shutdown.
fn start_metrics(
    pve: &ProxmoxClient,
    listen: Option<SocketAddr>,
    stop: &watch::Receiver<bool>,
) -> (Arc<Metrics>, Option<JoinHandle<()>>) {
    let metrics = Arc::new(Metrics::default());
    let observer = metrics.clone();
    pve.set_observer(Arc::new(move |method, status, took| {
        observer.proxmox_request(method, status, took)
    }));
    let server = listen.map(|listen| {
        let mut stop = stop.clone();
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let serving = crate::metrics::serve(listen, metrics.clone(), shutdown);
        tokio::spawn(async move {
            if let Err(e) = serving.await {
                tracing::error!(%listen, error = %e, "cannot serve metrics");
            }
        })
    });
    (metrics, server)
}

/// Resolves on SIGTERM or SIGINT (on SIGINT only where SIGTERM cannot be listened for).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        return;
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("10h").is_err());
    }
}

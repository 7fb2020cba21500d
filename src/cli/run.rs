//! The default command: run the provider.
//!
//! Start-up checks everything a user can get wrong before touching Omni (config file, key, flags),
//! then connects, registers, and runs until SIGTERM/SIGINT: the heartbeat, the MachineRequest watch
//! feeding the reconcile workers, and the loop keeping topology labels in step with the VMs.
//! Flags and environment variables are the official provider's, plus a few of ours.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::CliResult;
use super::omni_args::OmniArgs;
use crate::config::ProviderConfig;
use crate::controller::context::Context;
use crate::controller::health::{self, HealthCheck};
use crate::controller::registration::{self, ProviderInfo};
use crate::controller::runner::{self, Controller};
use crate::metrics::Metrics;
use crate::omni::auth::ProviderKey;
use crate::omni::client::OmniClient;
use crate::omni::state::StateError;
use crate::omni::transport::{self, OmniEndpoint, OmniTls};
use crate::pipeline::step::{Services, Timeouts};
use crate::proxmox::ProxmoxClient;
use crate::rules::provider_data::{ProviderDataSchema, SchemaError};
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
}

/// `10s`, `500ms`, `1m`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 10s, 500ms or 1m"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s or m)")),
    };
    if d.is_zero() {
        return Err("the interval must be greater than zero".into());
    }
    Ok(d)
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(
        "--config-file (or CONFIG_FILE) is required: the provider needs the Proxmox connection settings"
    )]
    NoConfigFile,
}

/// Everything the provider needs, checked; built before any network call.
pub struct Settings {
    pub config: ProviderConfig,
    pub metrics_listen: Option<std::net::SocketAddr>,
    pub concurrency: usize,
    pub image_factory_url: String,
    pub endpoint: OmniEndpoint,
    pub key: Arc<ProviderKey>,
    pub info: ProviderInfo,
    pub health_interval: Duration,
    pub topology_interval: Duration,
}

impl Settings {
    pub fn from_args(args: &RunArgs) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let path = args.config_file.as_ref().ok_or(RunError::NoConfigFile)?;
        let config = ProviderConfig::load(path)?;
        let schema = ProviderDataSchema::new()?.strict(config.strict);
        let problems = schema.check_config(&config.layers).problems;
        if !problems.is_empty() {
            return Err(format!(
                "config file {}: {}",
                path.display(),
                crate::rules::provider_data::describe(&problems)
            )
            .into());
        }
        let (endpoint, key) = args.omni.connection()?;
        Ok(Self {
            config,
            concurrency: args.concurrency,
            metrics_listen: args.metrics_listen,
            image_factory_url: args.image_factory_url.clone(),
            endpoint,
            key: Arc::new(key),
            info: ProviderInfo::new(
                &args.omni.id,
                &args.provider_name,
                &args.provider_description,
            ),
            health_interval: args.health_interval,
            topology_interval: args.topology_interval,
        })
    }
}

pub async fn run(args: RunArgs) -> CliResult {
    telemetry::init_logging(args.log_format, &args.log_level)?;
    transport::install_crypto_provider();
    let settings = Settings::from_args(&args)?;
    for warning in args.omni.warnings() {
        tracing::warn!("{warning}");
    }
    let pve = ProxmoxClient::new(&settings.config.proxmox)?;
    let reach = pve.clone();
    tokio::spawn(async move {
        if let Some(warning) = crate::validate::root_reach_warning(&reach).await {
            tracing::warn!("{warning}");
        }
    });
    let health_check = proxmox_health(
        pve.clone(),
        settings.config.clone(),
        settings.health_interval,
    );
    run_with(settings, pve, health_check, shutdown_signal()).await
}

/// The heartbeat's health check: the last result of checks that run on their own schedule, so a
/// slow or unreachable Proxmox never delays a heartbeat (Omni marks a provider disconnected after
/// 31 s without one). Every interval: the Proxmox API answers and accepts our credentials. Every few
/// minutes (and at start): the config's `defaults:` and `nodes:` still fit the cluster (storages,
/// bridges, template), which costs a few more requests.
fn proxmox_health(pve: ProxmoxClient, config: ProviderConfig, interval: Duration) -> HealthCheck {
    const DEFAULTS_EVERY: Duration = Duration::from_secs(300);
    let last: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let writer = last.clone();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let limit = interval.max(Duration::from_secs(5));
        let mut defaults_problem: Option<String> = None;
        let mut defaults_checked: Option<tokio::time::Instant> = None;
        loop {
            ticker.tick().await;
            let api = match tokio::time::timeout(limit, pve.health()).await {
                Ok(r) => r,
                Err(_) => Some(format!("Proxmox API at {} does not answer", pve.api_url())),
            };
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
            *writer.lock().unwrap_or_else(|p| p.into_inner()) = api.or(defaults_problem.clone());
        }
    });
    health::health_check(move || {
        let last = last.clone();
        async move { last.lock().unwrap_or_else(|p| p.into_inner()).clone() }
    })
}

pub async fn run_with(
    settings: Settings,
    pve: ProxmoxClient,
    health_check: HealthCheck,
    shutdown: impl std::future::Future<Output = ()>,
) -> CliResult {
    if settings.endpoint.tls == OmniTls::InsecureSkipVerify {
        tracing::warn!(
            "TLS verification of the Omni endpoint is disabled (--insecure-skip-verify)"
        );
    }
    let provider_id = settings.info.id.clone();
    tracing::info!(
        endpoint = %settings.endpoint.url,
        provider_id = %provider_id,
        identity = settings.key.identity(),
        proxmox = %settings.config.proxmox.api_url,
        "starting"
    );
    let schema = provider_data_schema(&settings.config)?;
    let omni = OmniClient::connect(&settings.endpoint, settings.key.clone(), &provider_id)?;
    // Polled from here on, so a SIGTERM during the start stops the provider cleanly too.
    tokio::pin!(shutdown);
    let start = async {
        let mode = until_reachable("detecting Omni's join mode", || {
            crate::controller::detect_join_mode(&omni.state)
        })
        .await?;
        tracing::info!(?mode, "detected Omni join mode");
        until_reachable("registering the provider status", || {
            registration::register(&omni.state, &settings.info)
        })
        .await?;
        tracing::info!("registered provider status");
        Ok::<_, StateError>(mode)
    };
    let mode = tokio::select! {
        mode = start => mode?,
        () = &mut shutdown => {
            tracing::info!("stopped before the start was complete");
            return Ok(());
        }
    };
    let image_factory_url =
        crate::pipeline::image_factory::resolve_factory(&omni.state, &settings.image_factory_url)
            .await;

    let (stop_tx, stop_rx) = watch::channel(false);
    let (metrics, metrics_server) = start_metrics(&pve, settings.metrics_listen, &stop_rx);
    let heartbeat = tokio::spawn(health::run(
        omni.state.clone(),
        provider_id.clone(),
        settings.health_interval,
        health_check,
        stop_rx.clone(),
        metrics.clone(),
    ));
    let services = Arc::new(Services {
        provider_id: provider_id.clone(),
        pve,
        management: omni.management.clone(),
        schema,
        config: settings.config,
        ledgers: Default::default(),
        image_factory_url,
        factory_http: crate::pipeline::image_factory::http_client()?,
        timeouts: Timeouts::default(),
        metrics,
    });
    let context = Arc::new(
        Context::new(services, omni.state.clone(), mode).with_concurrency(settings.concurrency),
    );
    let controller = Controller::new(context.clone(), runner::MAX_IN_FLIGHT);
    let topology = tokio::spawn(crate::controller::topology::run(
        context.clone(),
        settings.topology_interval,
        stop_rx.clone(),
    ));
    let reconciling = tokio::spawn(controller.run(stop_rx.clone()));
    tracing::info!(
        concurrency = settings.concurrency,
        "watching machine requests"
    );
    (&mut shutdown).await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    let _ = reconciling.await;
    let _ = topology.await;
    let _ = heartbeat.await;
    if let Some(server) = metrics_server {
        let _ = server.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Longest wait between two tries to reach Omni at start.
const START_RETRY_MAX: Duration = Duration::from_secs(30);

/// Omni out of reach at start (Omni restarting, a load balancer, a network blip) is waited out,
/// a second doubling to half a minute between tries, instead of ending the process: once running,
/// the provider rides out the same trouble. Any other answer (a refused key, a missing permission)
/// ends the start with its error.
async fn until_reachable<T, F, Fut>(doing: &str, mut call: F) -> Result<T, StateError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StateError>>,
{
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

/// The schema provider data is checked against, with `strict:` from the config. What the config
/// file got wrong without stopping the provider (unknown keys in it or in `defaults:` and `nodes:`,
/// a token and a password both set) is logged once, here at start.
fn provider_data_schema(config: &ProviderConfig) -> Result<ProviderDataSchema, SchemaError> {
    let schema = ProviderDataSchema::new()?.strict(config.strict);
    for warning in &config.warnings {
        tracing::warn!("config file: {warning}");
    }
    let overrides = schema.check_config(&config.layers);
    for warning in &overrides.warnings {
        tracing::warn!("config file: {warning}");
    }
    Ok(schema)
}

/// The metrics every part counts into, with each Proxmox request observed from here on, and the
/// server of `/metrics` and the health endpoints when `--metrics-listen` is set: it stops when
/// `stop` turns true, and its task is awaited at shutdown.
fn start_metrics(
    pve: &ProxmoxClient,
    listen: Option<SocketAddr>,
    stop: &watch::Receiver<bool>,
) -> (Arc<Metrics>, Option<JoinHandle<()>>) {
    let metrics = Arc::new(Metrics::new());
    {
        let metrics = metrics.clone();
        pve.set_observer(Arc::new(move |method, status, took| {
            metrics.proxmox_request(method, status, took)
        }));
    }
    let server = listen.map(|listen| {
        let mut stop = stop.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if let Err(e) = crate::metrics::serve(listen, metrics, shutdown).await {
                tracing::error!(%listen, error = %e, "cannot serve metrics");
            }
        })
    });
    (metrics, server)
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
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

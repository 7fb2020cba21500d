//! Metrics and health endpoints (`--metrics-listen`): `/metrics` (Prometheus text), `/healthz` (the
//! process is alive) and `/readyz` (connected to Omni and Proxmox answering).
//!
//! One explicit registry, no globals: the pieces that count things hold an `Arc<Metrics>`. Label sets
//! are small and bounded (outcome, step, HTTP method and status), so the series count stays fixed no
//! matter how many machines come and go.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The labels of a family with one label: its name and value (`outcome`, `kind`, `step`, `method`).
type Label = [(&'static str, &'static str); 1];

type HistogramFamily = Family<Label, Histogram, fn() -> Histogram>;

/// Declares each metric once: its field, its name (after the `omni_proxmox` prefix), its help text,
/// how it starts and, for a counter family with one label, the method that counts one more by that
/// label's value; `Metrics::default` registers them all.
macro_rules! metrics {
    ($($(#[$doc:meta])* $field:ident: $ty:ty = $name:literal, $help:literal, $init:expr
        $(, $count:ident($label:literal))?;)*) => {
        pub struct Metrics {
            registry: Registry,
            $($(#[$doc])* pub $field: $ty,)*
            /// Whether the last Proxmox health check passed, for `/readyz` (Omni's side is
            /// `omni_connected`).
            proxmox_ok: AtomicBool,
        }

        impl Default for Metrics {
            fn default() -> Self {
                let mut registry = Registry::with_prefix("omni_proxmox");
                $(
                    let $field: $ty = $init;
                    registry.register($name, $help, $field.clone());
                )*
                Self { registry, $($field,)* proxmox_ok: AtomicBool::new(false) }
            }
        }

        impl Metrics {
            $($(
                /// Counts one more, by the value of the family's one label.
                pub fn $count(&self, value: &'static str) {
                    self.$field.get_or_create(&[($label, value)]).inc();
                }
            )?)*
        }
    };
}

metrics! {
    provisions: Family<Label, Counter> = "provisions",
        "Machine requests provisioned (success) or failed in a step (failure)", Family::default(),
        provision("outcome");
    deprovisions: Family<Label, Counter> = "deprovisions",
        "Machine requests torn down (success) or failing to tear down (failure)", Family::default(),
        deprovision("outcome");
    /// What a finished teardown left behind (see the `orphans` command).
    leftovers: Family<Label, Counter> = "teardown_leftovers",
        "Things a finished teardown had to leave behind (kind=seed_iso: its delete failed); the `orphans` command lists and deletes them",
        Family::default(), leftover("kind");
    step_seconds: HistogramFamily = "step_duration_seconds",
        "Time spent in each pipeline step run",
        Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.005, 2.0, 16)));
    /// Failed step runs (and `provision("failure")` counts each as a failed attempt).
    step_failures: Family<Label, Counter> = "step_failures",
        "Provisioning step runs that failed, by step (each failure is retried with backoff)",
        Family::default(), step_failure("step");
    /// By `method`, and `status` (the HTTP status, or `error` when there was no answer).
    proxmox_requests: Family<[(&'static str, String); 2], Counter> = "proxmox_api_requests",
        "Proxmox API requests by method and HTTP status", Family::default();
    proxmox_seconds: HistogramFamily = "proxmox_api_request_duration_seconds",
        "Proxmox API request latency",
        Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 16)));
    requests_in_flight: Gauge = "machine_requests_in_flight",
        "Machine requests waiting for or in a reconcile", Gauge::default();
    /// Whether Omni answered the last call that tells (a heartbeat, or a standby's look at the
    /// leader lease).
    omni_connected: Gauge = "omni_connected", "1 when the last heartbeat reached Omni",
        Gauge::default();
    last_heartbeat: Gauge = "last_heartbeat_timestamp_seconds",
        "Unix time of the last heartbeat Omni accepted", Gauge::default();
    /// 1 while this replica holds the leader lease (always with `--leader-elect=false`).
    leader: Gauge = "leader",
        "1 while this replica holds the leader lease and does the work, 0 while it stands by",
        Gauge::default();
    /// How often this replica became leader or stopped being it.
    leader_transitions: Counter = "leader_transitions",
        "How often this replica became the leader or stopped being it", Counter::default();
}

impl Metrics {
    /// Records one Proxmox API request (the client's observer).
    pub fn proxmox_request(&self, method: &'static str, status: Option<u16>, took: Duration) {
        let status = status.map_or_else(|| "error".to_owned(), |s| s.to_string());
        let labels = [("method", method.to_owned()), ("status", status)];
        self.proxmox_requests.get_or_create(&labels).inc();
        (self.proxmox_seconds.get_or_create(&[("method", method)])).observe(took.as_secs_f64());
    }

    pub fn step(&self, step: &'static str, took: Duration) {
        (self.step_seconds.get_or_create(&[("step", step)])).observe(took.as_secs_f64());
    }

    /// Called after every heartbeat: did Omni take it, and did the Proxmox check pass?
    pub fn heartbeat(&self, omni_ok: bool, proxmox_ok: bool) {
        self.omni_connected.set(i64::from(omni_ok));
        self.proxmox_checked(proxmox_ok);
        if omni_ok {
            let now = SystemTime::now().duration_since(UNIX_EPOCH);
            self.last_heartbeat
                .set(now.unwrap_or_default().as_secs() as i64);
        }
    }

    /// Whether the last Proxmox health check passed.
    pub fn proxmox_checked(&self, ok: bool) {
        self.proxmox_ok.store(ok, Ordering::Relaxed);
    }

    /// `None` when ready, else why not.
    pub fn not_ready(&self) -> Option<String> {
        let omni = (self.omni_connected.get() != 1)
            .then_some("not connected to Omni (no heartbeat accepted yet, or the last one failed)");
        let proxmox = (!self.proxmox_ok.load(Ordering::Relaxed))
            .then_some("the Proxmox API does not answer or refuses the credentials");
        let why: Vec<&str> = [omni, proxmox].into_iter().flatten().collect();
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        out
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` until `stop` resolves.
pub async fn serve(
    listen: SocketAddr,
    metrics: Arc<Metrics>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), std::io::Error> {
    use axum::{Router, extract::State, http::StatusCode, http::header, routing::get};

    const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    async fn metrics_text(State(m): State<Arc<Metrics>>) -> impl axum::response::IntoResponse {
        ([(header::CONTENT_TYPE, OPENMETRICS)], m.encode())
    }
    async fn ready(State(m): State<Arc<Metrics>>) -> (StatusCode, String) {
        let leading = m.leader.get() == 1;
        let role = if leading { "leader" } else { "standby" };
        let Some(why) = m.not_ready() else {
            return (StatusCode::OK, format!("ready ({role})\n"));
        };
        let status = StatusCode::SERVICE_UNAVAILABLE;
        (status, format!("not ready ({role}): {why}\n"))
    }
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(metrics);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(address = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_readiness() {
        let m = Metrics::default();
        m.proxmox_request("GET", Some(200), Duration::from_millis(3));
        m.proxmox_request("POST", None, Duration::from_millis(3));
        m.provision("success");
        m.step("create_vm", Duration::from_millis(40));
        let text = m.encode();
        assert!(
            text.contains(
                r#"omni_proxmox_proxmox_api_requests_total{method="GET",status="200"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains(r#"status="error""#), "{text}");
        assert!(
            text.contains(r#"omni_proxmox_provisions_total{outcome="success"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"omni_proxmox_step_duration_seconds_count{step="create_vm"} 1"#),
            "{text}"
        );
        assert!(m.not_ready().is_some());
        m.heartbeat(true, true);
        assert!(m.not_ready().is_none());
        m.heartbeat(true, false);
        assert!(m.not_ready().unwrap().contains("Proxmox"));
    }
}

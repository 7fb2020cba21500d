//! Transport for the Proxmox VE API: TLS, authentication, retries, error mapping, tracing.
//!
//! Shaped by what goes wrong in long-running daemons that talk to Proxmox:
//! - Password logins expire after two hours (the official provider needs a restart then). We renew the
//!   ticket well before that, and a 401 triggers one transparent re-login and replay.
//! - Networks and pveproxy hiccup. Reads and other idempotent calls are retried with jittered
//!   exponential backoff; a POST that may already have taken effect (create, clone, start) is retried
//!   only when the request provably never left (connect error), so nothing is ever done twice.
//! - Errors must say what to fix, so every error names the call and carries Proxmox's message and its
//!   per-parameter `errors`.
//!
//! Secrets (token secret, password, ticket, CSRF token) live only in sensitive header values and
//! [`Secret`](crate::secret::Secret)s; nothing here logs a request body.

mod auth;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use reqwest::multipart::{Form, Part};
use rustls::pki_types::{CertificateDer, pem::PemObject};
use serde::de::DeserializeOwned;

use super::error::{Call, ProxmoxError, Result, reason_phrase, status_error, transport_error};
use crate::secret::Secret;
use crate::tls::AcceptAnyServerCert;
use auth::{Auth, Session};

/// A cheap-to-clone handle to one Proxmox VE API endpoint.
#[derive(Clone)]
pub struct ProxmoxClient {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    http: reqwest::Client,
    /// The connections for answers that grow with the cluster ([`Pool::Large`]).
    large: reqwest::Client,
    base: url::Url,
    auth: Auth,
    retry: RetryPolicy,
    observer: std::sync::OnceLock<RequestObserver>,
    /// Asked before every write; unset, every write may start.
    fence: std::sync::OnceLock<crate::fence::Fence>,
    /// The last full `/cluster/resources` listing and when its request was sent: concurrent
    /// readers share one ([`ProxmoxClient::cluster_listing`]).
    pub(super) listing: tokio::sync::Mutex<Option<super::listing::Listing>>,
    /// How long tasks took lately, by node and task type: a moving average that
    /// [`ProxmoxClient::wait_for_task`] times its polls by.
    pub(super) task_times: TaskTimes,
}

/// The methods of the API, for the calls the areas make.
pub(crate) const POST: Method = Method::POST;
pub(crate) const PUT: Method = Method::PUT;
pub(crate) const DELETE: Method = Method::DELETE;

/// How long tasks took lately, by node and task type.
pub(crate) type TaskTimes = std::sync::Mutex<HashMap<(String, String), Duration>>;

/// Which connections a call goes over.
///
/// hyper reads an HTTP/1 answer into its connection's buffer, and a buffer that grew for a large
/// answer (the cluster listing: some 300 KiB with a thousand guests) stays that size for the
/// connection's life, in hyper and in the `bytes` buffers it hands out. Were every answer to use
/// one pool, each of the dozens of connections a burst keeps open would soon hold such a buffer
/// (measured with a thousand machines at `--concurrency 16`: 40 connections, 7.5 MiB of buffers);
/// answers that grow with the cluster go over connections of their own, few because those reads
/// are few and mostly shared, and the connections that carry the many small answers stay small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pool {
    /// Small answers: task status, a VM's config, a create's task ID.
    Small,
    /// Answers whose size grows with the number of guests or volumes: the cluster listing, a
    /// storage's content.
    Large,
}

/// Called after every HTTP request with its method, status (`None`: no answer) and duration.
pub type RequestObserver = Arc<dyn Fn(&'static str, Option<u16>, Duration) + Send + Sync>;

// What the client needs to reach and log in to the Proxmox VE API. The config file's `proxmox:`
// section is read into these (`config::proxmox`); the client depends on them, not on the config.

/// How to reach and log in to the Proxmox VE API.
#[derive(Debug, Clone)]
pub struct ProxmoxSettings {
    /// Base URL ending in `/api2/json`, whatever the user wrote.
    pub api_url: url::Url,
    pub auth: ProxmoxAuth,
    pub tls: TlsTrust,
}

#[derive(Debug, Clone)]
pub enum ProxmoxAuth {
    /// `Authorization: PVEAPIToken=<id>=<secret>`; no CSRF token, never expires.
    Token { id: String, secret: Secret },
    /// Ticket login at `/access/ticket` as `<username>@<realm>`.
    Password { username: String, password: Secret },
}

/// Which server certificates to accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsTrust {
    /// Public web PKI roots.
    WebPki,
    /// Public roots plus the certificates in this PEM file (a private CA or a pinned self-signed cert).
    CaFile(std::path::PathBuf),
    /// No verification at all (`insecureSkipVerify: true`); logged as a warning at start.
    InsecureSkipVerify,
}

/// How often and how patiently to retry transient failures.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Total tries, the first included.
    pub attempts: u32,
    pub initial_delay: Duration,
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// Full jitter around an exponential curve: spreads retries of many workers apart.
    fn delay(&self, attempt: u32) -> Duration {
        let exp = self
            .initial_delay
            .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)))
            .min(self.max_delay);
        let factor = 0.5 + rand::random::<f64>() * 0.5;
        exp.mul_f64(factor)
    }
}

/// Whether a call may be sent again after a failure that might have reached Proxmox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Reads, and writes that set absolute values: repeating them changes nothing.
    Safe,
    /// Creates, clones, starts, deletes: only retried when the request never left.
    OnlyIfUnsent,
    /// A streamed upload: its body is gone once sent, so the caller starts over.
    Never,
}

/// Parameters of a call: query string for GET/DELETE, form body for POST/PUT.
#[derive(Debug, Clone, Default)]
pub struct Params(pub Vec<(String, String)>);

impl Params {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, key: &str, value: impl ToString) -> Self {
        self.0.push((key.to_owned(), value.to_string()));
        self
    }

    pub fn with_opt(self, key: &str, value: Option<impl ToString>) -> Self {
        let Some(value) = value else { return self };
        self.with(key, value)
    }

    pub fn extend(mut self, pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        self.0.extend(pairs);
        self
    }
}

/// The bytes of a file sent as `multipart/form-data` (storage upload).
pub enum UploadContent {
    Bytes(Vec<u8>),
    /// A file streamed into a storage as it arrives from elsewhere (a boot image from a factory
    /// that needs credentials): sent once, never held whole in memory, so never replayed.
    /// pveproxy takes no chunked body, so the length is known before the upload starts.
    Stream {
        body: std::sync::Mutex<Option<reqwest::Body>>,
        length: u64,
    },
}

impl UploadContent {
    pub fn stream(body: reqwest::Body, length: u64) -> Self {
        let body = std::sync::Mutex::new(Some(body));
        Self::Stream { body, length }
    }
}

pub(super) enum Body<'a> {
    Params(&'a Params),
    /// The content type of the storage's directory it goes to (`iso`, `import`), the file's
    /// name, and its bytes.
    Upload(&'a str, &'a str, &'a UploadContent),
}

#[derive(serde::Deserialize)]
struct Envelope<T> {
    data: T,
}

/// How long a streamed upload may take in all: a boot image of some hundred megabytes over a slow
/// link, the time a node is given for its own downloads.
const STREAMED_UPLOAD_TIMEOUT: Duration = Duration::from_secs(1800);

/// Below pveproxy's 5 s keep-alive timeout.
pub(crate) const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

impl ProxmoxClient {
    pub fn new(settings: &ProxmoxSettings) -> Result<Self> {
        let retry = RetryPolicy {
            attempts: 5,
            initial_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
        };
        Self::with_retry(settings, retry)
    }

    pub fn with_retry(settings: &ProxmoxSettings, retry: RetryPolicy) -> Result<Self> {
        let tls = tls_config(&settings.tls)?;
        if settings.tls == TlsTrust::InsecureSkipVerify {
            tracing::warn!(
                url = %settings.api_url,
                "TLS certificate verification of the Proxmox API is OFF (proxmox.insecureSkipVerify); \
                 prefer proxmox.caFile with the cluster's CA"
            );
        }
        let http = http_client(tls.clone())?;
        let large = http_client(tls)?;
        let auth = Auth::from_settings(&settings.auth)?;
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                large,
                base: settings.api_url.clone(),
                auth,
                retry,
                observer: std::sync::OnceLock::new(),
                fence: std::sync::OnceLock::new(),
                listing: tokio::sync::Mutex::new(None),
                task_times: Default::default(),
            }),
        })
    }

    /// The API base URL (ending in `/api2/json`).
    pub fn api_url(&self) -> &url::Url {
        &self.inner.base
    }

    /// Reports every request to `observer` (metrics). Set once; later calls are ignored.
    pub fn set_observer(&self, observer: RequestObserver) {
        let _ = self.inner.observer.set(observer);
    }

    /// Sends writes (anything but GET) only while `fence` is open. Set once; later calls are
    /// ignored.
    pub fn set_fence(&self, fence: crate::fence::Fence) {
        let _ = self.inner.fence.set(fence);
    }

    /// `GET <path>`, read into `T`.
    pub async fn get<T: DeserializeOwned>(&self, path: &[&str], params: Params) -> Result<T> {
        self.get_over(Pool::Small, path, params).await
    }

    /// [`Self::get`] over the connections of `pool`.
    pub(crate) async fn get_over<T: DeserializeOwned>(
        &self,
        pool: Pool,
        path: &[&str],
        params: Params,
    ) -> Result<T> {
        self.call(pool, Method::GET, path, Body::Params(&params), Replay::Safe)
            .await
    }

    /// A write (POST, PUT, DELETE) retried as `replay` allows. A DELETE may be [`Replay::Safe`]
    /// where a second delete of something already gone is answered "does not exist", which the
    /// caller counts as done.
    pub(crate) async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &[&str],
        params: Params,
        replay: Replay,
    ) -> Result<T> {
        let body = Body::Params(&params);
        self.call(Pool::Small, method, path, body, replay).await
    }

    /// [`Self::send`] for a call whose answer nobody reads.
    pub(crate) async fn write(
        &self,
        method: Method,
        path: &[&str],
        params: Params,
        replay: Replay,
    ) -> Result<()> {
        let answer = self.send::<serde_json::Value>(method, path, params, replay);
        answer.await.map(drop)
    }

    pub(super) async fn call<T: DeserializeOwned>(
        &self,
        pool: Pool,
        method: Method,
        path: &[&str],
        body: Body<'_>,
        replay: Replay,
    ) -> Result<T> {
        let call = Call {
            method: method_name(&method),
            path: format!("/{}", path.join("/")),
        };
        let mut attempt = 1;
        let mut relogged = false;
        loop {
            let session = self.session(&call).await?;
            match self
                .send_once(pool, &method, path, &body, &call, session.as_deref())
                .await
            {
                Err(ProxmoxError::Unauthorized { .. })
                    if !relogged && matches!(self.inner.auth, Auth::Ticket(_)) =>
                {
                    // The ticket expired or was revoked: log in again and replay once. A 401 means
                    // Proxmox did not act on the request, so even a POST is safe to replay.
                    relogged = true;
                    tracing::info!(%call, "Proxmox ticket refused; logging in again");
                    self.invalidate(session.as_ref()).await;
                }
                Err(e) if attempt < self.inner.retry.attempts && may_retry(&e, replay) => {
                    let delay = self.inner.retry.delay(attempt);
                    tracing::debug!(%call, attempt, ?delay, error = %e, "retrying Proxmox call");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn send_once<T: DeserializeOwned>(
        &self,
        pool: Pool,
        method: &Method,
        path: &[&str],
        body: &Body<'_>,
        call: &Call,
        session: Option<&Session>,
    ) -> Result<T> {
        if *method != Method::GET
            && let Some(Err(source)) = self.inner.fence.get().map(crate::fence::Fence::check)
        {
            let call = call.clone();
            return Err(ProxmoxError::Fenced { call, source });
        }
        let url = self.url(path);
        let http = match pool {
            Pool::Small => &self.inner.http,
            Pool::Large => &self.inner.large,
        };
        let mut req = http.request(method.clone(), url);
        if let Auth::Token(header) = &self.inner.auth {
            req = req.header(reqwest::header::AUTHORIZATION, header.clone());
        }
        // Only a ticket login has a session.
        if let Some(s) = session {
            req = req.header(reqwest::header::COOKIE, s.cookie.clone());
            if method != Method::GET {
                req = req.header("CSRFPreventionToken", s.csrf.clone());
            }
        }
        req = match body {
            Body::Params(p) if *method == Method::GET || *method == Method::DELETE => {
                req.query(&p.0)
            }
            Body::Params(p) => req.form(&p.0),
            Body::Upload(content, file_name, body) => {
                let part = match body {
                    UploadContent::Bytes(bytes) => Part::bytes(bytes.clone()),
                    UploadContent::Stream { body, length } => {
                        let taken = body.lock().unwrap_or_else(|p| p.into_inner()).take();
                        let Some(stream) = taken else {
                            return Err(ProxmoxError::Setup(format!(
                                "{call}: the streamed upload of {file_name} was sent already"
                            )));
                        };
                        req = req.timeout(STREAMED_UPLOAD_TIMEOUT);
                        Part::stream_with_length(stream, *length)
                    }
                };
                let part = part
                    .file_name(file_name.to_string())
                    .mime_str("application/octet-stream")
                    .map_err(|e| ProxmoxError::Setup(format!("multipart: {e}")))?;
                let form = Form::new().text("content", content.to_string());
                req.multipart(form.part("filename", part))
            }
        };
        self.execute(req, call).await
    }

    async fn execute<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        call: &Call,
    ) -> Result<T> {
        let started = Instant::now();
        let response = req.send().await;
        let elapsed = started.elapsed();
        let elapsed_ms = elapsed.as_millis() as u64;
        if let Some(observe) = self.inner.observer.get() {
            let status = response.as_ref().ok().map(|r| r.status().as_u16());
            observe(call.method, status, elapsed);
        }
        let response = response.map_err(|e| {
            tracing::debug!(method = call.method, path = %call.path, elapsed_ms, error = %e, "proxmox request failed");
            transport_error(call, &e)
        })?;
        let status = response.status();
        tracing::debug!(method = call.method, path = %call.path, status = status.as_u16(), elapsed_ms, "proxmox request");
        let reason = reason_phrase(&response);
        let bytes = response
            .bytes()
            .await
            .map_err(|e| transport_error(call, &e))?;
        if status.is_success() {
            return serde_json::from_slice::<Envelope<T>>(&bytes)
                .map(|env| env.data)
                .map_err(|e| ProxmoxError::Decode {
                    call: call.clone(),
                    message: e.to_string(),
                });
        }
        Err(status_error(call, status.as_u16(), &reason, &bytes))
    }

    fn url(&self, path: &[&str]) -> url::Url {
        let mut url = self.inner.base.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().extend(path);
        }
        url
    }
}

fn http_client(tls: rustls::ClientConfig) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(120))
        // pveproxy closes a keep-alive connection after 5 s idle (pve-http-server
        // APIServer/AnyEvent.pm, default `timeout`); reusing one just as it closes fails the
        // request, so we drop idle connections first.
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .user_agent(concat!(
            "omni-infra-provider-proxmox/",
            env!("CARGO_PKG_VERSION")
        ))
        .build()
        .map_err(|e| ProxmoxError::Setup(format!("cannot build the HTTP client: {e}")))
}

// Which Proxmox certificates to trust: public roots, a private CA, or (warned about) none.

/// The rustls configuration for a trust setting (also used for the Image Factory).
pub(crate) fn tls_config(trust: &TlsTrust) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ProxmoxError::Setup(format!("TLS setup failed: {e}")))?;
    let webpki =
        || rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let config = match trust {
        TlsTrust::WebPki => builder
            .with_root_certificates(webpki())
            .with_no_client_auth(),
        TlsTrust::CaFile(path) => {
            let shown = path.display();
            let wrong =
                |what: String| ProxmoxError::Setup(format!("proxmox.caFile {shown} {what}"));
            let mut roots = webpki();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| {
                    ProxmoxError::Setup(format!("cannot read proxmox.caFile {shown}: {e}"))
                })?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| wrong(format!("is not valid PEM: {e}")))?;
            if certs.is_empty() {
                let what = "contains no PEM certificate (expected -----BEGIN CERTIFICATE-----)";
                return Err(wrong(what.into()));
            }
            for cert in certs {
                let unusable = "holds a certificate rustls cannot use as a trust anchor";
                roots
                    .add(cert)
                    .map_err(|e| wrong(format!("{unusable}: {e}")))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        TlsTrust::InsecureSkipVerify => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCert(provider)))
            .with_no_client_auth(),
    };
    Ok(config)
}

fn method_name(m: &Method) -> &'static str {
    ["GET", "POST", "PUT", "DELETE"]
        .into_iter()
        .find(|name| *name == m.as_str())
        .unwrap_or("OTHER")
}

fn may_retry(e: &ProxmoxError, replay: Replay) -> bool {
    let ProxmoxError::Transient { request_sent, .. } = e else {
        return false;
    };
    replay == Replay::Safe || (replay == Replay::OnlyIfUnsent && !request_sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> Call {
        Call {
            method: "GET",
            path: "/x".into(),
        }
    }

    #[test]
    fn idle_connections_are_dropped_before_pveproxy_closes_them() {
        // pve-http-server APIServer/AnyEvent.pm: keep-alive connections idle for 5 s are closed.
        assert!(POOL_IDLE_TIMEOUT < Duration::from_secs(5));
    }

    #[test]
    fn replay_rules() {
        let sent = ProxmoxError::Transient {
            call: call(),
            status: Some(503),
            message: String::new(),
            request_sent: true,
        };
        let unsent = ProxmoxError::Transient {
            call: call(),
            status: None,
            message: String::new(),
            request_sent: false,
        };
        assert!(may_retry(&sent, Replay::Safe));
        assert!(!may_retry(&sent, Replay::OnlyIfUnsent));
        assert!(may_retry(&unsent, Replay::OnlyIfUnsent));
        // A streamed body is gone once sent, even when the connection failed before it left.
        assert!(!may_retry(&unsent, Replay::Never));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            attempts: 10,
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(800),
        };
        assert!(p.delay(1) <= Duration::from_millis(100));
        assert!(p.delay(1) >= Duration::from_millis(50));
        assert!(p.delay(9) <= Duration::from_millis(800));
        assert!(p.delay(9) >= Duration::from_millis(400));
    }

    #[test]
    fn lock_timeouts_are_transient_and_safe_to_resend() {
        let e = crate::proxmox::error::status_error(
            &call(),
            500,
            "",
            br#"{"data":null,"message":"can't lock file '/var/lock/qemu-server/lock-104.conf' - got timeout\n"}"#,
        );
        assert!(may_retry(&e, Replay::OnlyIfUnsent), "{e:?}");
    }
}

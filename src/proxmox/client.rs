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
//! [`Secret`]s; nothing here logs a request body.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::header::HeaderValue;
use reqwest::{Method, StatusCode};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde::de::DeserializeOwned;
use tokio::sync::{Mutex, RwLock};

use super::error::{Call, ProxmoxError};
use crate::config::{ProxmoxAuth, ProxmoxSettings, TlsTrust};
use crate::secret::Secret;
use crate::tls::AcceptAnyServerCert;

/// A cheap-to-clone handle to one Proxmox VE API endpoint.
#[derive(Clone)]
pub struct ProxmoxClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ProxmoxClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxmoxClient")
            .field("api_url", &self.inner.base.as_str())
            .finish_non_exhaustive()
    }
}

struct Inner {
    http: reqwest::Client,
    base: url::Url,
    auth: Auth,
    retry: RetryPolicy,
    requests: AtomicU64,
    observer: std::sync::OnceLock<RequestObserver>,
}

/// Called after every HTTP request with its method, status (`None`: no answer) and duration.
pub type RequestObserver = Arc<dyn Fn(&'static str, Option<u16>, Duration) + Send + Sync>;

enum Auth {
    Token(HeaderValue),
    Ticket(TicketAuth),
}

struct TicketAuth {
    username: String,
    password: Secret,
    session: RwLock<Option<Arc<Session>>>,
    /// One login at a time: a burst of requests after expiry must not log in fifty times.
    login: Mutex<()>,
    renew_after: Duration,
}

struct Session {
    cookie: HeaderValue,
    csrf: HeaderValue,
    obtained: Instant,
}

/// How often and how patiently to retry transient failures.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Total tries, the first included.
    pub attempts: u32,
    pub initial_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 5,
            initial_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
        }
    }
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
        match value {
            Some(v) => self.with(key, v),
            None => self,
        }
    }

    pub fn extend(mut self, pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        self.0.extend(pairs);
        self
    }
}

/// A file sent as `multipart/form-data` (storage upload).
#[derive(Debug, Clone)]
pub struct Upload {
    pub fields: Vec<(String, String)>,
    pub file_name: String,
    pub bytes: Vec<u8>,
}

enum Body<'a> {
    Params(&'a Params),
    Upload(&'a Upload),
}

#[derive(serde::Deserialize)]
struct Envelope<T> {
    data: T,
}

#[derive(serde::Deserialize, Default)]
struct ErrorBody {
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    errors: Option<BTreeMap<String, serde_json::Value>>,
}

#[derive(serde::Deserialize)]
struct TicketAnswer {
    ticket: String,
    #[serde(rename = "CSRFPreventionToken")]
    csrf: String,
    /// Set for users with a second factor (TOTP, WebAuthn, …): the ticket is only a half-ticket that
    /// pve-access-control (AccessControl.pm, create_ticket) accepts for nothing but the TFA challenge.
    #[serde(rename = "NeedTFA", default)]
    need_tfa: Option<serde_json::Value>,
}

const TICKET_RENEW_AFTER: Duration = Duration::from_secs(90 * 60);

/// Below pveproxy's 5 s keep-alive timeout.
pub(crate) const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

impl ProxmoxClient {
    pub fn new(settings: &ProxmoxSettings) -> Result<Self, ProxmoxError> {
        Self::with_retry(settings, RetryPolicy::default())
    }

    pub fn with_retry(
        settings: &ProxmoxSettings,
        retry: RetryPolicy,
    ) -> Result<Self, ProxmoxError> {
        let tls = tls_config(&settings.tls)?;
        if settings.tls == TlsTrust::InsecureSkipVerify {
            tracing::warn!(
                url = %settings.api_url,
                "TLS certificate verification of the Proxmox API is OFF (proxmox.insecureSkipVerify); \
                 prefer proxmox.caFile with the cluster's CA"
            );
        }
        let http = reqwest::Client::builder()
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
            .map_err(|e| ProxmoxError::Setup(format!("cannot build the HTTP client: {e}")))?;
        let auth = match &settings.auth {
            ProxmoxAuth::Token { id, secret } => {
                let mut v =
                    HeaderValue::from_str(&format!("PVEAPIToken={id}={}", secret.expose()))
                        .map_err(|_| {
                            ProxmoxError::Setup(
                                "proxmox.tokenID or proxmox.tokenSecret contains characters not allowed in an HTTP header"
                                    .into(),
                            )
                        })?;
                v.set_sensitive(true);
                Auth::Token(v)
            }
            ProxmoxAuth::Password { username, password } => Auth::Ticket(TicketAuth {
                username: username.clone(),
                password: password.clone(),
                session: RwLock::new(None),
                login: Mutex::new(()),
                renew_after: TICKET_RENEW_AFTER,
            }),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                base: settings.api_url.clone(),
                auth,
                retry,
                requests: AtomicU64::new(0),
                observer: std::sync::OnceLock::new(),
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

    /// HTTP requests sent so far (logins and retries included): the benchmark's cost measure.
    pub fn request_count(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        path: &[&str],
        params: Params,
    ) -> Result<T, ProxmoxError> {
        self.call(Method::GET, path, Body::Params(&params), Replay::Safe)
            .await
    }

    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        path: &[&str],
        params: Params,
        replay: Replay,
    ) -> Result<T, ProxmoxError> {
        self.call(Method::POST, path, Body::Params(&params), replay)
            .await
    }

    pub(crate) async fn put<T: DeserializeOwned>(
        &self,
        path: &[&str],
        params: Params,
        replay: Replay,
    ) -> Result<T, ProxmoxError> {
        self.call(Method::PUT, path, Body::Params(&params), replay)
            .await
    }

    pub(crate) async fn delete<T: DeserializeOwned>(
        &self,
        path: &[&str],
        params: Params,
    ) -> Result<T, ProxmoxError> {
        self.call(
            Method::DELETE,
            path,
            Body::Params(&params),
            Replay::OnlyIfUnsent,
        )
        .await
    }

    pub(crate) async fn upload<T: DeserializeOwned>(
        &self,
        path: &[&str],
        upload: &Upload,
    ) -> Result<T, ProxmoxError> {
        self.call(
            Method::POST,
            path,
            Body::Upload(upload),
            Replay::OnlyIfUnsent,
        )
        .await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &[&str],
        body: Body<'_>,
        replay: Replay,
    ) -> Result<T, ProxmoxError> {
        let call = Call {
            method: method_name(&method),
            path: format!("/{}", path.join("/")),
        };
        let mut attempt = 1;
        let mut relogged = false;
        loop {
            let session = self.session(&call).await?;
            match self
                .send_once(&method, path, &body, &call, session.as_deref())
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
        method: &Method,
        path: &[&str],
        body: &Body<'_>,
        call: &Call,
        session: Option<&Session>,
    ) -> Result<T, ProxmoxError> {
        let url = self.url(path);
        let mut req = self.inner.http.request(method.clone(), url);
        match &self.inner.auth {
            Auth::Token(header) => {
                req = req.header(reqwest::header::AUTHORIZATION, header.clone());
            }
            Auth::Ticket(_) => {
                if let Some(s) = session {
                    req = req.header(reqwest::header::COOKIE, s.cookie.clone());
                    if method != Method::GET {
                        req = req.header("CSRFPreventionToken", s.csrf.clone());
                    }
                }
            }
        }
        req = match body {
            Body::Params(p) if *method == Method::GET || *method == Method::DELETE => {
                req.query(&p.0)
            }
            Body::Params(p) => req.form(&p.0),
            Body::Upload(u) => {
                let mut form = reqwest::multipart::Form::new();
                for (k, v) in &u.fields {
                    form = form.text(k.clone(), v.clone());
                }
                let part = reqwest::multipart::Part::bytes(u.bytes.clone())
                    .file_name(u.file_name.clone())
                    .mime_str("application/octet-stream")
                    .map_err(|e| ProxmoxError::Setup(format!("multipart: {e}")))?;
                req.multipart(form.part("filename", part))
            }
        };
        self.execute(req, call).await
    }

    async fn execute<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        call: &Call,
    ) -> Result<T, ProxmoxError> {
        let started = Instant::now();
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        let response = req.send().await;
        let elapsed = started.elapsed();
        let elapsed_ms = elapsed.as_millis() as u64;
        if let Some(observe) = self.inner.observer.get() {
            observe(
                call.method,
                response.as_ref().ok().map(|r| r.status().as_u16()),
                elapsed,
            );
        }
        let response = match response {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(method = call.method, path = %call.path, elapsed_ms, error = %e, "proxmox request failed");
                return Err(transport_error(call, &e));
            }
        };
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
        Err(status_error(call, status, &reason, &bytes))
    }

    fn url(&self, path: &[&str]) -> url::Url {
        let mut url = self.inner.base.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().extend(path);
        }
        url
    }

    /// The current ticket session, logging in (or renewing) first when needed.
    async fn session(&self, call: &Call) -> Result<Option<Arc<Session>>, ProxmoxError> {
        let Auth::Ticket(t) = &self.inner.auth else {
            return Ok(None);
        };
        if let Some(s) = t.session.read().await.as_ref()
            && s.obtained.elapsed() < t.renew_after
        {
            return Ok(Some(s.clone()));
        }
        let _one_login = t.login.lock().await;
        // Another task may have logged in while we waited.
        if let Some(s) = t.session.read().await.as_ref()
            && s.obtained.elapsed() < t.renew_after
        {
            return Ok(Some(s.clone()));
        }
        let session = Arc::new(self.login(t, call).await?);
        *t.session.write().await = Some(session.clone());
        Ok(Some(session))
    }

    async fn invalidate(&self, used: Option<&Arc<Session>>) {
        if let Auth::Ticket(t) = &self.inner.auth {
            let mut guard = t.session.write().await;
            // Only drop the session that failed; a newer one from a concurrent login stays.
            if let (Some(current), Some(used)) = (guard.as_ref(), used)
                && Arc::ptr_eq(current, used)
            {
                *guard = None;
            }
        }
    }

    async fn login(&self, t: &TicketAuth, during: &Call) -> Result<Session, ProxmoxError> {
        let call = Call {
            method: "POST",
            path: "/access/ticket".into(),
        };
        tracing::debug!(user = %t.username, during = %during, "logging in to Proxmox");
        let form = [
            ("username", t.username.as_str()),
            ("password", t.password.expose()),
        ];
        let req = self
            .inner
            .http
            .post(self.url(&["access", "ticket"]))
            .form(&form);
        let answer: TicketAnswer = match self.execute(req, &call).await {
            Ok(a) => a,
            Err(ProxmoxError::Unauthorized { call, message }) => {
                return Err(ProxmoxError::Unauthorized {
                    call,
                    message: format!("login as {} failed: {message}", t.username),
                });
            }
            Err(e) => return Err(e),
        };
        if answer.need_tfa.as_ref().is_some_and(|v| {
            v.as_u64() == Some(1) || v.as_bool() == Some(true) || v.as_str() == Some("1")
        }) {
            return Err(ProxmoxError::Unauthorized {
                call,
                message: format!(
                    "{} has two-factor authentication (TOTP/WebAuthn), which a daemon cannot answer; \
                     use an API token (proxmox.tokenID/tokenSecret) or a user without a second factor",
                    t.username
                ),
            });
        }
        let sensitive = |v: String| {
            HeaderValue::from_str(&v)
                .map(|mut h| {
                    h.set_sensitive(true);
                    h
                })
                .map_err(|_| ProxmoxError::Decode {
                    call: call.clone(),
                    message: "the ticket contains characters not allowed in a header".into(),
                })
        };
        Ok(Session {
            cookie: sensitive(format!("PVEAuthCookie={}", answer.ticket))?,
            csrf: sensitive(answer.csrf)?,
            obtained: Instant::now(),
        })
    }
}

fn method_name(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        _ => "OTHER",
    }
}

fn may_retry(e: &ProxmoxError, replay: Replay) -> bool {
    match e {
        ProxmoxError::Transient { request_sent, .. } => replay == Replay::Safe || !request_sent,
        _ => false,
    }
}

fn transport_error(call: &Call, e: &reqwest::Error) -> ProxmoxError {
    let message = crate::error_chain::render(e);
    if e.is_decode() {
        return ProxmoxError::Decode {
            call: call.clone(),
            message,
        };
    }
    ProxmoxError::Transient {
        call: call.clone(),
        status: None,
        message,
        request_sent: !e.is_connect(),
    }
}

/// The HTTP reason phrase as Proxmox sent it. PVE puts its error message there; PVE 8 before
/// pve-http-server's fix #6503 (January 2025) put it *only* there, answering `{"data":null}`.
fn reason_phrase(response: &reqwest::Response) -> String {
    response
        .extensions()
        .get::<hyper::ext::ReasonPhrase>()
        .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
        .or_else(|| response.status().canonical_reason().map(str::to_owned))
        .unwrap_or_default()
}

/// Maps a non-2xx answer to the error kind the caller acts on.
fn status_error(call: &Call, status: StatusCode, reason: &str, body: &[u8]) -> ProxmoxError {
    let json: Option<ErrorBody> = serde_json::from_slice(body).ok();
    let is_json = json.is_some();
    let parsed = json.unwrap_or_default();
    let message = parsed
        .message
        .map(|m| m.trim().to_owned())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            // A JSON body without `message` (old PVE 8) has its text in the reason phrase; so has
            // an empty or HTML answer.
            if is_json || text.is_empty() || text.starts_with('<') || text.len() > 300 {
                reason.trim().to_owned()
            } else {
                text.to_owned()
            }
        });
    let call = call.clone();
    match status.as_u16() {
        401 => ProxmoxError::Unauthorized { call, message },
        403 => {
            let message = match unnamed_privilege(&call, &message) {
                Some(hint) => format!("{message} ({hint})"),
                None => message,
            };
            ProxmoxError::PermissionDenied { call, message }
        }
        404 => ProxmoxError::NotFound { call, message },
        // 595/596: pveproxy could not reach the node (offline, network) — the node may come back.
        code @ (408 | 429 | 502 | 503 | 504 | 595 | 596) => ProxmoxError::Transient {
            call,
            status: Some(code),
            message,
            request_sent: true,
        },
        500 if is_missing(&message) => ProxmoxError::NotFound { call, message },
        // Another worker held the guest's or storage's lock past PVE's wait (`lock_file` dies with
        // "got timeout" before the handler changed anything): nothing happened, so sending it again
        // is safe even for a create, and mature clients do exactly that.
        500 if is_lock_timeout(&message) => ProxmoxError::Transient {
            call,
            status: Some(500),
            message,
            request_sent: false,
        },
        code => ProxmoxError::Api {
            call,
            status: code,
            message,
            field_errors: parsed
                .errors
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| {
                    let text = match v {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (k, text.trim().to_owned())
                })
                .collect(),
        },
    }
}

/// What to do about a refusal whose text does not say it: qemu-server's create_vm ends its VM.Allocate
/// check with a bare "Permission check failed", so does any failed "or" of privileges (download-url's
/// network access), and a tag refusal names Sys.Modify but not the datacenter option that decides it.
fn unnamed_privilege(call: &Call, message: &str) -> Option<&'static str> {
    // pve-guest-common GuestHelpers.pm, assert_tag_permissions: "(/, Sys.Modify for modifying tag 'x')".
    if message.contains("modifying tag") {
        return Some(
            "the datacenter's user-tag-access (Datacenter > Options > User Tag Access) does not let this \
             token set that tag, or it is a registered tag: allow it there, or grant Sys.Modify on /",
        );
    }
    if message.contains(',') {
        return None; // "Permission check failed (/path, Privilege)": PVE named it
    }
    let segments: Vec<&str> = call.path.trim_matches('/').split('/').collect();
    match (call.method, segments.as_slice()) {
        ("POST", ["nodes", _, "qemu"]) => {
            Some("creating a VM needs VM.Allocate on /vms/<vmid> or on the pool it goes to")
        }
        ("POST", ["nodes", _, "storage", _, "download-url"]) => Some(
            "download-url needs Sys.AccessNetwork on /nodes/<node>, or Sys.Audit and Sys.Modify on /",
        ),
        ("POST", ["nodes", _, "qemu", _, "clone"]) => Some(
            "cloning needs VM.Clone on the template and VM.Allocate on the new VMID or its pool",
        ),
        _ => None,
    }
}

/// pve-common Tools.pm `lock_file_full` / `run_with_timeout`: "can't lock file '…' - got timeout".
fn is_lock_timeout(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("got timeout") && (m.contains("lock") || m.contains("can't"))
}

/// Proxmox reports missing objects as 500 with one of these texts.
fn is_missing(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("does not exist")
        || m.contains("no such vm")
        || m.contains("no such node")
        || (m.contains("hostname lookup") && m.contains("failed"))
}

/// The rustls configuration for a trust setting (also used for the Image Factory).
pub(crate) fn tls_config(trust: &TlsTrust) -> Result<rustls::ClientConfig, ProxmoxError> {
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
            let mut roots = webpki();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| {
                    ProxmoxError::Setup(format!("cannot read proxmox.caFile {shown}: {e}"))
                })?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    ProxmoxError::Setup(format!("proxmox.caFile {shown} is not valid PEM: {e}"))
                })?;
            if certs.is_empty() {
                return Err(ProxmoxError::Setup(format!(
                    "proxmox.caFile {shown} contains no PEM certificate (expected -----BEGIN CERTIFICATE-----)"
                )));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    ProxmoxError::Setup(format!(
                        "proxmox.caFile {shown} holds a certificate rustls cannot use as a trust anchor: {e}"
                    ))
                })?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        TlsTrust::InsecureSkipVerify => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCert::new(provider)))
            .with_no_client_auth(),
    };
    Ok(config)
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
    fn status_mapping() {
        let e = status_error(
            &call(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "",
            br#"{"data":null,"message":"Configuration file 'nodes/pve1/qemu-server/9999.conf' does not exist\n"}"#,
        );
        assert!(e.is_not_found(), "{e}");
        let e = status_error(
            &call(),
            StatusCode::from_u16(595).unwrap(),
            "No route to host",
            b"",
        );
        assert!(e.is_transient(), "{e}");
        assert!(e.to_string().contains("No route to host"));
        let e = status_error(
            &call(),
            StatusCode::BAD_REQUEST,
            "Parameter verification failed.",
            br#"{"data":null,"message":"Parameter verification failed.\n","errors":{"vmid":"invalid"}}"#,
        );
        assert!(
            matches!(&e, ProxmoxError::Api { status: 400, field_errors, .. } if field_errors["vmid"] == "invalid")
        );
        let e = status_error(
            &call(),
            StatusCode::UNAUTHORIZED,
            "authentication failure",
            b"",
        );
        assert!(
            matches!(e, ProxmoxError::Unauthorized { ref message, .. } if message == "authentication failure")
        );
    }

    #[test]
    fn old_pve8_error_text_comes_from_the_reason_phrase() {
        // PVE 8 before pve-http-server's fix #6503: `{"data":null}` and the text in the status line.
        let e = status_error(
            &Call {
                method: "POST",
                path: "/pools".into(),
            },
            StatusCode::INTERNAL_SERVER_ERROR,
            "pool 'workers' already exists",
            br#"{"data":null}"#,
        );
        assert!(
            matches!(&e, ProxmoxError::Api { message, .. } if message == "pool 'workers' already exists"),
            "{e:?}"
        );
        let e = status_error(
            &call(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "Configuration file 'nodes/pve1/qemu-server/9.conf' does not exist",
            br#"{"data":null}"#,
        );
        assert!(e.is_not_found(), "{e:?}");
    }

    #[test]
    fn lock_timeouts_are_transient_and_safe_to_resend() {
        let e = status_error(
            &call(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "",
            br#"{"data":null,"message":"can't lock file '/var/lock/qemu-server/lock-104.conf' - got timeout\n"}"#,
        );
        assert!(may_retry(&e, Replay::OnlyIfUnsent), "{e:?}");
    }

    #[test]
    fn refusals_that_do_not_name_the_privilege_get_it_named() {
        let create = Call {
            method: "POST",
            path: "/nodes/pve1/qemu".into(),
        };
        let e = status_error(
            &create,
            StatusCode::FORBIDDEN,
            "",
            br#"{"data":null,"message":"Permission check failed\n"}"#,
        );
        assert!(e.to_string().contains("VM.Allocate"), "{e}");
        let e = status_error(
            &create,
            StatusCode::FORBIDDEN,
            "",
            br#"{"data":null,"message":"Permission check failed (/, Sys.Modify for modifying tag 'talos')\n"}"#,
        );
        assert!(e.to_string().contains("user-tag-access"), "{e}");
        let e = status_error(
            &create,
            StatusCode::FORBIDDEN,
            "",
            br#"{"data":null,"message":"Permission check failed (/storage/local, Datastore.AllocateSpace)\n"}"#,
        );
        assert!(!e.to_string().contains("VM.Allocate"), "{e}");
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
}

//! Dialing Omni and signing every call on the way out.
//!
//! Signing is a tonic interceptor ([`Signer`]): the signed payload names the full gRPC method, which
//! the generated clients put in every request's extensions ([`GrpcMethod`]). Every generated client
//! (State, Management) is built on a [`SignedChannel`], so no call can leave unsigned, and streams
//! are signed at their start like unary calls.
//!
//! The channel is lazy: it connects on first use and reconnects by itself after a failure; callers
//! that hold long streams (watch) add their own backoff on top.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tonic::service::{Interceptor, interceptor::InterceptedService};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{GrpcMethod, Status};

use super::auth::{PAYLOAD_HEADER, ProviderKey, SIGNATURE_HEADER, TIMESTAMP_HEADER};

/// Largest message accepted either way (Omni's `GRPCMaxMessageSize`).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;
/// Metadata key the Omni COSI client adds to every State call.
pub const PROVIDER_ID_HEADER: &str = "providerid";

/// Installs rustls' ring crypto provider once per process; harmless when already installed.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// How to reach Omni.
#[derive(Debug, Clone)]
pub struct OmniEndpoint {
    pub url: String,
    pub tls: OmniTls,
}

/// Which server certificates to accept on `https://`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OmniTls {
    /// The system's CA store plus the public web PKI roots bundled with us. The system store is
    /// what the official Go provider trusts (Go's crypto/x509 system pool, which honours
    /// `SSL_CERT_FILE` and `SSL_CERT_DIR`), so an Omni behind a company CA installed on the host
    /// works without extra flags; the bundled roots keep a bare container working.
    SystemAndPublicRoots,
    /// Those roots plus the certificates in this PEM file (a private CA).
    CaFile(PathBuf),
    /// Accept any certificate (`--insecure-skip-verify`).
    InsecureSkipVerify,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("Omni endpoint {url:?} is not a URL: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("cannot read Omni CA file {path}: {source}")]
    CaFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot set up the connection to {url}: {source}")]
    Transport {
        url: String,
        source: tonic::transport::Error,
    },
}

/// The gRPC address of an Omni URL (`https://omni.example/any/path`, `http://127.0.0.1:8080`,
/// `grpc://host:port`): the path is ignored, `http` and `grpc` mean plaintext h2c. With it, for
/// `https`, the name TLS checks: the host without IPv6 brackets.
pub fn target(raw: &str) -> Result<(String, Option<String>), String> {
    let url = url::Url::parse(raw).map_err(|e| e.to_string())?;
    let (scheme, port) = match url.scheme() {
        "https" => ("https", 443),
        "http" | "grpc" => ("http", 80),
        other => {
            return Err(format!(
                "unsupported scheme {other:?} (use https, http or grpc)"
            ));
        }
    };
    let host = url.host_str().filter(|h| !h.is_empty()).ok_or("no host")?;
    let address = format!("{scheme}://{host}:{}", url.port().unwrap_or(port));
    let server_name = (scheme == "https").then(|| host.trim_matches(['[', ']']).to_owned());
    Ok((address, server_name))
}

/// Builds a lazily connecting channel to Omni.
pub fn channel(endpoint: &OmniEndpoint) -> Result<Channel, ConnectError> {
    let (address, server_name) = target(&endpoint.url).map_err(|reason| ConnectError::BadUrl {
        url: endpoint.url.clone(),
        reason,
    })?;
    let transport = |source| ConnectError::Transport {
        url: endpoint.url.clone(),
        source,
    };
    let mut ep = Endpoint::from_shared(address)
        .map_err(transport)?
        .connect_timeout(Duration::from_secs(10))
        .tcp_keepalive(Some(Duration::from_secs(60)))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(60))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true)
        .user_agent(concat!(
            "omni-infra-provider-proxmox/",
            env!("CARGO_PKG_VERSION")
        ))
        .map_err(transport)?;
    if let Some(server_name) = server_name {
        let base = ClientTlsConfig::new()
            .domain_name(server_name)
            .assume_http2(true);
        let roots = || (base.clone().with_webpki_roots()).trust_anchors(system_trust_anchors());
        ep = match &endpoint.tls {
            OmniTls::SystemAndPublicRoots => ep.tls_config(roots()),
            OmniTls::CaFile(path) => {
                let pem = std::fs::read(path).map_err(|source| ConnectError::CaFile {
                    path: path.clone(),
                    source,
                })?;
                ep.tls_config(roots().ca_certificate(Certificate::from_pem(pem)))
            }
            OmniTls::InsecureSkipVerify => ep.tls_config_with_verifier(
                base,
                Arc::new(crate::tls::AcceptAnyServerCert(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))),
            ),
        }
        .map_err(transport)?;
    }
    Ok(ep.connect_lazy())
}

/// The system's CA certificates: `SSL_CERT_FILE` / `SSL_CERT_DIR` when set, else the distribution's
/// bundle (as found by openssl-probe). Unreadable or unparsable entries are skipped with a warning,
/// never fatal: the bundled public roots remain.
fn system_trust_anchors() -> Vec<rustls::pki_types::TrustAnchor<'static>> {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::warn!(error = %e, "cannot read a system CA certificate for the Omni connection; skipping it");
    }
    let mut store = rustls::RootCertStore::empty();
    let (added, ignored) = store.add_parsable_certificates(found.certs);
    tracing::debug!(
        added,
        ignored,
        "system CA certificates for the Omni connection"
    );
    store.roots
}

/// Signs every call with the provider key and, for COSI calls, adds the `providerid` header.
#[derive(Clone)]
pub struct Signer {
    pub key: Arc<ProviderKey>,
    /// Sent as `providerid` (State calls; the management calls carry none).
    pub provider_id: Option<String>,
}

/// A channel to Omni whose every call is signed.
pub type SignedChannel = InterceptedService<Channel, Signer>;

impl Interceptor for Signer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        let method = req
            .extensions()
            .get::<GrpcMethod<'static>>()
            .map(|m| format!("/{}/{}", m.service(), m.method()))
            .ok_or_else(|| Status::unknown("cannot sign a call that names no gRPC method"))?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let (payload, signature) = self.key.sign_call(&method, now)?;
        let headers = [
            (TIMESTAMP_HEADER, now.to_string()),
            (PAYLOAD_HEADER, payload),
            (SIGNATURE_HEADER, signature),
        ];
        let provider_id = self.provider_id.clone().map(|id| (PROVIDER_ID_HEADER, id));
        for (name, value) in headers.into_iter().chain(provider_id) {
            let value = value
                .parse()
                .map_err(|_| Status::unknown(format!("cannot send the {name} header")))?;
            // `insert` replaces whatever the request carried under this name.
            req.metadata_mut().insert(name, value);
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_ignores_path_and_maps_schemes() {
        let https = (
            String::from("https://omni.example.com:443"),
            Some("omni.example.com".into()),
        );
        assert_eq!(target("https://omni.example.com/some/path").unwrap(), https);
        let http = target("http://127.0.0.1:8080").unwrap();
        assert_eq!(http, ("http://127.0.0.1:8080".into(), None));
        assert_eq!(target("grpc://omni").unwrap().0, "http://omni:80");
        let v6 = target("https://[fd00::1]:8443").unwrap();
        assert_eq!(
            v6,
            ("https://[fd00::1]:8443".into(), Some("fd00::1".into()))
        );
        assert!(target("ftp://x").is_err());
        assert!(target("not a url").is_err());
    }
}

//! Which Image Factory boot ISOs come from, and talking to it directly for Omni older than 1.8 (no
//! `CreateSchematicFromRaw`).
//!
//! Schematics are created through Omni, on the factory *Omni* is configured with. The ISO must be
//! downloaded from that same factory, or a private factory's schematic is unknown where the node looks
//! for it. Omni publishes its factory in its features configuration, which every signed caller,
//! infra providers included, may read; `--image-factory-url` is the fallback when Omni does not say
//! (older Omni, or the read fails). A Talos version Omni serves from its secondary factory names that
//! factory in its `TalosVersions` resource, and Omni makes the schematic there
//! ([`factory_for_version`]). A factory that needs credentials for downloads is fetched from by the
//! provider itself ([`FactoryAuth`], [`download`]).
//!
//! The direct fallback is what the older Go library did: `POST <factory>/schematics` with the YAML,
//! answered with `{"id": "..."}`.
//!
//! Omni keeps a factory's credentials in an `ImageFactoryAuth` resource, and an infra provider cannot
//! read it: the resource needs the Reader role, and the InfraProvider role ranks below Reader
//! (siderolabs/omni `internal/backend/runtime/omni/state_access.go`, `client/pkg/access/role/role.go`;
//! `client/pkg/imagefactory/clients.go` `credentialsAllowingDenied` expects exactly that denial). So
//! the operator gives the provider the same credentials in a file, `--image-factory-auth-file`, shaped
//! like those resources: the factory URL, then its username and password.
//!
//! Proxmox's `download-url` sends no header, and credentials in the URL would stay in the node's
//! task log. For such a factory the provider downloads the image itself and streams it into the
//! storage through the upload call, so the credentials go to the factory only and the image is never
//! held in memory. Credentials go only to the factory they are given for, and never in clear text
//! over the network: an `http://` factory gets them only on a loopback address.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use reqwest::{RequestBuilder, Response};
use tokio::io::AsyncWriteExt;

use crate::omni::resources::{FEATURES_CONFIG, FEATURES_CONFIG_ID, TALOS_VERSION};
use crate::omni::state::{StateClient, StateError};
use crate::proxmox::client::UploadContent;
use crate::secret::Secret;

/// How long a boot image download from the factory (by the node, or by the provider) may take.
pub const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(1800);

#[derive(Debug, thiserror::Error)]
pub enum FactoryError {
    #[error("cannot reach the Image Factory at {url}: {message}")]
    Unreachable { url: String, message: String },
    #[error("the Image Factory at {url} refused the schematic: {status} {body}")]
    Refused {
        url: String,
        status: u16,
        body: String,
    },
    #[error("unexpected answer from the Image Factory at {url}: {message}")]
    Decode { url: String, message: String },
}

/// The factory Omni uses for `talos_version`, when its `TalosVersions` resource names one.
/// siderolabs/omni `client/pkg/imagefactory/clients.go`, `ForTalosVersion` (what
/// `CreateSchematicFromRaw` uses): the resource's ID is the version without a leading `v`, and its
/// `image_factory_url` picks the primary or the secondary factory; an absent resource or an empty
/// URL means the primary. A failed read falls back to the primary too, and says so.
pub async fn factory_for_version(state: &StateClient, talos_version: &str) -> Option<String> {
    let id = talos_version.trim_start_matches('v');
    let read = state.find(&TALOS_VERSION, id).await;
    let warn = |e: &StateError| {
        tracing::warn!(error = %e, talos_version, "cannot read Omni's Talos version; using its primary Image Factory");
    };
    let found = read.inspect_err(warn).ok()??;
    let url = found.spec.image_factory_url.trim().trim_end_matches('/');
    (!url.is_empty()).then(|| url.to_owned())
}

/// Reads Omni's features configuration and chooses the factory: Omni's when it publishes one, else
/// the flag's, saying in the log which one and why.
pub async fn resolve_factory(state: &StateClient, flag: &str) -> String {
    let read = state.find(&FEATURES_CONFIG, FEATURES_CONFIG_ID).await;
    let warn = |e: &StateError| {
        tracing::warn!(error = %e, "cannot read Omni's features configuration; using --image-factory-url");
    };
    let published = read.inspect_err(warn).ok().flatten();
    let published = published.map(|f| f.spec.image_factory_base_url);
    let published = published
        .as_deref()
        .map(str::trim)
        .filter(|u| !u.is_empty());
    let url = published.unwrap_or(flag).trim_end_matches('/');
    if published.is_some() {
        tracing::info!(image_factory = %url, "boot ISOs come from the Image Factory Omni is configured with (its features configuration)");
    } else {
        tracing::info!(image_factory = %url, "Omni does not publish its Image Factory; boot ISOs come from --image-factory-url");
    }
    url.to_owned()
}

/// A client for the factory, with the public web PKI roots.
pub fn http_client() -> Result<reqwest::Client, String> {
    let tls = crate::proxmox::client::tls_config(&crate::config::TlsTrust::WebPki)
        .map_err(|e| e.to_string())?;
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(Duration::from_secs(30))
        .user_agent(concat!(
            "omni-infra-provider-proxmox/",
            env!("CARGO_PKG_VERSION")
        ))
        .build()
        .map_err(|e| e.to_string())
}

/// How a failed call to the factory at `url` reads.
fn unreachable(url: &str) -> impl FnOnce(reqwest::Error) -> FactoryError + '_ {
    move |e| FactoryError::Unreachable {
        url: url.to_owned(),
        message: crate::error_chain::render(&e),
    }
}

/// Sends `request` to the factory at `url`: its answer when successful, else the error status and
/// the start of the body.
async fn send(url: &str, request: RequestBuilder) -> Result<Response, FactoryError> {
    let response = request.send().await.map_err(unreachable(url))?;
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    Err(FactoryError::Refused {
        url: url.to_owned(),
        status,
        body: body.chars().take(300).collect(),
    })
}

pub async fn create_schematic(
    http: &reqwest::Client,
    factory_url: &str,
    yaml: &str,
) -> Result<String, FactoryError> {
    #[derive(serde::Deserialize)]
    struct Answer {
        id: String,
    }
    let url = format!("{}/schematics", factory_url.trim_end_matches('/'));
    let request = http
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/yaml")
        .body(yaml.to_owned());
    let response = send(&url, request).await?;
    let body = response.text().await.unwrap_or_default();
    let answer: Answer = serde_json::from_str(&body).map_err(|e| FactoryError::Decode {
        url: url.clone(),
        message: e.to_string(),
    })?;
    if answer.id.is_empty() || !answer.id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(FactoryError::Decode {
            url,
            message: format!("schematic id {:?} is not a hex digest", answer.id),
        });
    }
    Ok(answer.id)
}

/// Username and password of one factory.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Credentials {
    username: String,
    password: Secret,
}

/// The credentials of each factory that needs them, by URL (without a trailing `/`, as Omni
/// compares factory URLs).
#[derive(Debug, Clone, Default)]
pub struct FactoryAuth(BTreeMap<String, Credentials>);

impl FactoryAuth {
    /// Reads the file: a map from factory URL to `username` and `password`. An error names the
    /// file and what to change, never a password.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string());
        let auth = text.and_then(|text| Self::parse(&text));
        auth.map_err(|message| format!("--image-factory-auth-file {}: {message}", path.display()))
    }

    fn parse(text: &str) -> Result<Self, String> {
        const SHAPE: &str = "expected a map from factory URL to `username` and `password`";
        let value = crate::yaml::from_str(text).map_err(|e| format!("{SHAPE}: {e}"))?;
        // serde's type errors quote the value they met, which may be a password: only the ones
        // about keys are passed on.
        let entries: BTreeMap<String, Credentials> =
            serde_json::from_value(value).map_err(|e| match e.to_string() {
                about_a_key if about_a_key.starts_with("unknown field") => {
                    format!("{SHAPE}: {about_a_key}")
                }
                _ => format!("{SHAPE}, each a string"),
            })?;
        let mut auth = BTreeMap::new();
        for (url, credentials) in entries {
            let parsed =
                url::Url::parse(&url).map_err(|e| format!("`{url}` is not a factory URL: {e}"))?;
            if !sends_safely(&parsed) {
                return Err(format!(
                    "`{url}`: credentials go only over https (or http to a loopback address)"
                ));
            }
            if credentials.password.is_empty() {
                return Err(format!("`{url}`: the password is empty"));
            }
            auth.insert(url.trim_end_matches('/').to_owned(), credentials);
        }
        Ok(Self(auth))
    }

    /// The basic `Authorization` header Omni sends the factory at `factory_url` too, if that
    /// factory needs credentials.
    pub fn for_factory(&self, factory_url: &str) -> Option<Vec<(String, Secret)>> {
        use base64::Engine;
        let credentials = self.0.get(factory_url.trim_end_matches('/'))?;
        let pair = format!("{}:{}", credentials.username, credentials.password.expose());
        let basic = base64::engine::general_purpose::STANDARD.encode(pair);
        Some(vec![(
            "Authorization".into(),
            Secret::new(format!("Basic {basic}")),
        )])
    }
}

/// Whether credentials may travel to `url`: encrypted, or not leaving the machine.
fn sends_safely(url: &url::Url) -> bool {
    match url.scheme() {
        "https" => true,
        "http" => match url.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            Some(url::Host::Domain(d)) => d == "localhost",
            None => false,
        },
        _ => false,
    }
}

/// Starts downloading `url` with `headers`: the image as the upload streams it on, read as it goes.
pub async fn download(
    http: &reqwest::Client,
    url: &str,
    headers: &[(String, Secret)],
) -> Result<UploadContent, FactoryError> {
    let mut request = http.get(url).timeout(DOWNLOAD_TIMEOUT);
    for (name, value) in headers {
        request = request.header(name.as_str(), value.expose());
    }
    let mut response = send(url, request).await?;
    if let Some(length) = response.content_length() {
        let body = reqwest::Body::wrap_stream(response.bytes_stream());
        return Ok(UploadContent::stream(body, length));
    }
    // pveproxy takes no chunked upload (pve-http-server `src/PVE/APIServer/AnyEvent.pm`: 501
    // "chunked transfer encoding not supported"), so an image of unknown length goes to a file
    // first, never into memory.
    let path = std::env::temp_dir().join(format!(
        "omni-infra-provider-proxmox-{}.image",
        uuid::Uuid::new_v4()
    ));
    let local = |e: std::io::Error| FactoryError::Unreachable {
        url: url.to_owned(),
        message: format!("keeping the image in {}: {e}", path.display()),
    };
    let mut file = tokio::fs::File::create(&path).await.map_err(local)?;
    // Read through a second handle and unlinked at once: the data lives as long as the handles do,
    // and nothing is left behind, whatever happens next (a failed download, a crash).
    let reader = tokio::fs::File::open(&path).await;
    let _ = std::fs::remove_file(&path);
    let reader = reader.map_err(local)?;
    let mut length = 0u64;
    while let Some(chunk) = response.chunk().await.map_err(unreachable(url))? {
        file.write_all(&chunk).await.map_err(local)?;
        length += chunk.len() as u64;
    }
    file.flush().await.map_err(local)?;
    Ok(UploadContent::stream(reqwest::Body::from(reader), length))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wiremock::matchers::{body_string, header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    #[tokio::test]
    async fn posts_the_yaml_and_reads_the_id() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/schematics"))
            .and(header("content-type", "application/yaml"))
            .and(body_string("customization: {}\n"))
            .respond_with(
                ResponseTemplate::new(201).set_body_json(serde_json::json!({"id": "abc123"})),
            )
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/bad/schematics"))
            .respond_with(ResponseTemplate::new(400).set_body_string("unknown extension"))
            .mount(&server)
            .await;
        let http = http_client().unwrap();
        let id = create_schematic(&http, &server.uri(), "customization: {}\n")
            .await
            .unwrap();
        assert_eq!(id, "abc123");
        let e = create_schematic(&http, &format!("{}/bad", server.uri()), "x")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("400 unknown extension"), "{e}");
    }

    #[test]
    fn credentials_are_kept_per_factory_and_never_printed() {
        let auth = FactoryAuth::parse(
            "https://factory.example.com/:\n  username: omni\n  password: hunter2\n\
             http://127.0.0.1:8080:\n  username: dev\n  password: local\n",
        )
        .unwrap();
        let found = auth.for_factory("https://factory.example.com").unwrap();
        // base64 of `omni:hunter2`
        assert_eq!(found[0].0, "Authorization");
        assert_eq!(found[0].1.expose(), "Basic b21uaTpodW50ZXIy");
        assert!(auth.for_factory("http://127.0.0.1:8080/").is_some());
        assert!(auth.for_factory("https://factory.talos.dev").is_none());
        assert!(!format!("{auth:?}").contains("hunter2"));
    }

    #[test]
    fn a_bad_file_says_what_to_change_without_quoting_passwords() {
        let clear =
            FactoryAuth::parse("http://factory.example.com:\n  username: u\n  password: hunter2\n")
                .unwrap_err();
        assert!(clear.contains("only over https"), "{clear}");
        let typo = FactoryAuth::parse("https://f.example:\n  username: u\n  pasword: hunter2\n")
            .unwrap_err();
        assert!(typo.contains("map from factory URL"), "{typo}");
        assert!(!typo.contains("hunter2"), "{typo}");
        let empty =
            FactoryAuth::parse("https://f.example:\n  username: u\n  password: ''\n").unwrap_err();
        assert!(empty.contains("password is empty"), "{empty}");
    }
}

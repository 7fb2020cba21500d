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
//! provider itself ([`super::factory_auth`]).
//!
//! The direct fallback is what the older Go library did: `POST <factory>/schematics` with the YAML,
//! answered with `{"id": "..."}`.

use crate::omni::resources::{FEATURES_CONFIG, FEATURES_CONFIG_ID, TALOS_VERSION};
use crate::omni::state::{StateClient, StateError};

use std::time::Duration;

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
    let Some(url) = published
        .as_deref()
        .map(str::trim)
        .filter(|u| !u.is_empty())
    else {
        let url = flag.trim_end_matches('/');
        tracing::info!(image_factory = %url, "Omni does not publish its Image Factory; boot ISOs come from --image-factory-url");
        return url.to_owned();
    };
    let url = url.trim_end_matches('/');
    tracing::info!(image_factory = %url, "boot ISOs come from the Image Factory Omni is configured with (its features configuration)");
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
pub(super) fn unreachable(url: &str) -> impl FnOnce(reqwest::Error) -> FactoryError + '_ {
    move |e| FactoryError::Unreachable {
        url: url.to_owned(),
        message: crate::error_chain::render(&e),
    }
}

/// The factory at `url` answered `response` with an error status: its status and the start of its
/// body.
pub(super) async fn refused(url: &str, response: reqwest::Response) -> FactoryError {
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    FactoryError::Refused {
        url: url.to_owned(),
        status,
        body: body.chars().take(300).collect(),
    }
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
    let response = http
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/yaml")
        .body(yaml.to_owned())
        .send()
        .await
        .map_err(unreachable(&url))?;
    if !response.status().is_success() {
        return Err(refused(&url, response).await);
    }
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
}

//! Talking to the Image Factory directly, for Omni older than 1.8 (no `CreateSchematicFromRaw`).
//!
//! Newer Omni creates schematics itself (and knows about on-prem or authenticated factories), so this
//! is only the fallback the older Go library used: `POST <factory>/schematics` with the YAML, answered
//! with `{"id": "..."}`.

use std::time::Duration;

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
        .map_err(|e| FactoryError::Unreachable {
            url: url.clone(),
            message: crate::cli::render_error(&e),
        })?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    if !status.is_success() {
        return Err(FactoryError::Refused {
            url,
            status: status.as_u16(),
            body: body.chars().take(300).collect(),
        });
    }
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

//! Image Factories that ask for credentials, and boot images fetched from them by the provider.
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

use tokio::io::AsyncWriteExt;

use super::image_factory::{DOWNLOAD_TIMEOUT, FactoryError, refused, unreachable};
use crate::secret::Secret;

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

/// An image on its way from the factory: the body to stream on, and its length.
pub struct Download {
    pub body: reqwest::Body,
    pub length: u64,
}

/// Starts downloading `url` with `headers`; the body is read as the upload sends it on.
pub async fn download(
    http: &reqwest::Client,
    url: &str,
    headers: &[(String, Secret)],
) -> Result<Download, FactoryError> {
    let mut request = http.get(url).timeout(DOWNLOAD_TIMEOUT);
    for (name, value) in headers {
        request = request.header(name.as_str(), value.expose());
    }
    let mut response = request.send().await.map_err(unreachable(url))?;
    if !response.status().is_success() {
        return Err(refused(url, response).await);
    }
    if let Some(length) = response.content_length() {
        return Ok(Download {
            body: reqwest::Body::wrap_stream(response.bytes_stream()),
            length,
        });
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
    Ok(Download {
        body: reqwest::Body::from(reader),
        length,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

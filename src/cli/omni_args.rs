//! The Omni connection flags, shared by every command that talks to Omni (the provider itself and
//! `orphans`): the official provider's names and environment variables, plus our `--omni-ca-file`.

use std::path::PathBuf;

use super::BoxError;
use crate::omni::auth::ProviderKey;
use crate::omni::transport::{OmniEndpoint, OmniTls};
use crate::secret::Secret;

#[derive(Debug, clap::Args)]
pub struct OmniArgs {
    /// Omni API endpoint, e.g. `https://omni.example.com` (any path is ignored).
    #[arg(long, env = "OMNI_ENDPOINT")]
    pub omni_api_endpoint: Option<String>,
    /// Infra provider key printed by `omnictl infraprovider create <id>` (or made in the Omni UI).
    #[arg(long, env = "OMNI_SERVICE_ACCOUNT_KEY", hide_env_values = true, value_parser = parse_secret)]
    pub omni_service_account_key: Option<Secret>,
    /// `SIDERO_SERVICE_ACCOUNT_KEY`, used when neither the flag nor `OMNI_SERVICE_ACCOUNT_KEY` gives
    /// a key: the Go client library reads it too (go-api-signature
    /// pkg/serviceaccount/serviceaccount.go, GetFromEnv), so a deployment made for the official
    /// provider may carry the key there.
    #[arg(skip = std::env::var("SIDERO_SERVICE_ACCOUNT_KEY").ok().map(Secret::new))]
    pub sidero_service_account_key: Option<Secret>,
    /// A file holding the key (ours): a Docker or Kubernetes secret mounted as a file keeps the
    /// key out of `ps`, `docker inspect` and the environment. Read once, at start.
    #[arg(long, env = "OMNI_SERVICE_ACCOUNT_KEY_FILE")]
    pub omni_service_account_key_file: Option<PathBuf>,
    /// Provider ID; must match the ID the key was created for.
    #[arg(long, default_value = "proxmox")]
    pub id: String,
    /// Skip TLS verification of the Omni endpoint.
    #[arg(long)]
    pub insecure_skip_verify: bool,
    /// PEM file with extra CA certificates to trust for the Omni endpoint (ours).
    #[arg(long, env = "OMNI_CA_FILE")]
    pub omni_ca_file: Option<PathBuf>,
    /// Accept a plaintext `http://` or `grpc://` Omni endpoint (ours; for a local test Omni only):
    /// whoever sits on the path then reads the signed requests and can forge Omni's answers, such
    /// as the machine requests the provider deletes VMs for.
    #[arg(long, env = "OMNI_INSECURE_HTTP")]
    pub omni_insecure_http: bool,
}

fn parse_secret(s: &str) -> Result<Secret, std::convert::Infallible> {
    Ok(Secret::new(s))
}

impl OmniArgs {
    /// The endpoint and the parsed key, with every mistake in the flags reported clearly.
    pub fn connection(&self) -> Result<(OmniEndpoint, ProviderKey), BoxError> {
        let url = (self.endpoint().map(str::to_owned))
            .ok_or("--omni-api-endpoint (or OMNI_ENDPOINT) is required")?;
        if self.is_plaintext() && !self.omni_insecure_http {
            return Err(format!("the Omni endpoint {url:?} is plaintext: the provider's signed requests and Omni's answers (which decide what VMs are deleted) would cross the network unprotected; use https://, or pass --omni-insecure-http (OMNI_INSECURE_HTTP=true) for a local test Omni").into());
        }
        let key = ProviderKey::parse(&self.key()?)?;
        if let Some(key_id) = key.provider_id()
            && key_id != self.id
        {
            return Err(format!("the key was made for provider {key_id:?} but --id is {flag_id:?}; run with --id {key_id} or create a key for {flag_id:?} with `omnictl infraprovider create {flag_id}`", flag_id = self.id).into());
        }
        let tls = match (&self.omni_ca_file, self.insecure_skip_verify) {
            (Some(_), true) => {
                Err("--insecure-skip-verify and --omni-ca-file cannot be used together")?
            }
            (Some(p), false) => OmniTls::CaFile(p.clone()),
            (None, true) => OmniTls::InsecureSkipVerify,
            (None, false) => OmniTls::SystemAndPublicRoots,
        };
        Ok((OmniEndpoint { url, tls }, key))
    }

    /// Whether both the endpoint and the key were given (commands that can refuse early).
    pub fn is_set(&self) -> bool {
        let key = self.omni_service_account_key_file.is_some() || self.inline_key().is_some();
        self.endpoint().is_some() && key
    }

    fn endpoint(&self) -> Option<&str> {
        self.omni_api_endpoint.as_deref().filter(|u| !u.is_empty())
    }

    /// Whether the endpoint is plaintext (`http://`, `grpc://`).
    fn is_plaintext(&self) -> bool {
        let target = self.endpoint().map(crate::omni::transport::target);
        target.is_some_and(|t| t.is_ok_and(|(_, server_name)| server_name.is_none()))
    }

    /// What start-up says every time about an endpoint accepted against the default.
    pub fn warnings(&self) -> Vec<&'static str> {
        let plaintext = self.is_plaintext() && self.omni_insecure_http;
        let plaintext = plaintext.then_some("the Omni endpoint is plaintext (--omni-insecure-http): anyone on the network path can read the provider's requests and forge Omni's answers; use https:// outside a test setup");
        let unverified = self.insecure_skip_verify.then_some("--insecure-skip-verify: Omni's certificate is not checked, so anyone on the network path can pose as Omni");
        [plaintext, unverified].into_iter().flatten().collect()
    }

    /// The key to use: from the key file, else the flag or `OMNI_SERVICE_ACCOUNT_KEY`, else
    /// `SIDERO_SERVICE_ACCOUNT_KEY`, else empty (which the key parser refuses). The file is read
    /// here, once per call: callers call once.
    fn key(&self) -> Result<Secret, String> {
        let Some(path) = &self.omni_service_account_key_file else {
            return Ok(self.inline_key().cloned().unwrap_or_default());
        };
        let inline = self.omni_service_account_key.as_ref();
        if inline.is_some_and(|k| !k.is_empty()) {
            return Err("the Omni key is given twice: use either --omni-service-account-key (OMNI_SERVICE_ACCOUNT_KEY) or --omni-service-account-key-file (OMNI_SERVICE_ACCOUNT_KEY_FILE)".into());
        }
        crate::secret::read_file(path)
            .map_err(|e| format!("cannot read the Omni key file {}: {e}", path.display()))
    }

    fn inline_key(&self) -> Option<&Secret> {
        let keys = [
            &self.omni_service_account_key,
            &self.sidero_service_account_key,
        ];
        keys.into_iter().flatten().find(|k| !k.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::omni::auth::KeyError;
    use testkit::keys::NewKey;

    fn args(omni: Option<&Secret>, sidero: Option<&Secret>, id: &str) -> OmniArgs {
        OmniArgs {
            omni_api_endpoint: Some("https://omni.example".into()),
            omni_service_account_key: omni.cloned(),
            sidero_service_account_key: sidero.cloned(),
            omni_service_account_key_file: None,
            id: id.into(),
            insecure_skip_verify: false,
            omni_ca_file: None,
            omni_insecure_http: false,
        }
    }

    /// go-api-signature pkg/serviceaccount/serviceaccount.go, GetFromEnv, is only consulted when no
    /// key was passed explicitly, and the official provider always passes its flag (defaulting to
    /// OMNI_SERVICE_ACCOUNT_KEY): SIDERO_SERVICE_ACCOUNT_KEY is the fallback.
    #[test]
    fn sidero_service_account_key_is_the_fallback() {
        let a = Secret::new(NewKey::generate("a").encoded());
        let b = Secret::new(NewKey::generate("b").encoded());
        let (_, key) = args(None, Some(&b), "b").connection().unwrap();
        assert_eq!(key.provider_id(), Some("b"));
        let (_, key) = args(Some(&a), Some(&b), "a").connection().unwrap();
        assert_eq!(key.provider_id(), Some("a"));
        let (_, key) = args(Some(&Secret::new("")), Some(&b), "b")
            .connection()
            .unwrap();
        assert_eq!(key.provider_id(), Some("b"));
        assert!(args(None, Some(&b), "b").is_set());
        let err = args(None, None, "b").connection().unwrap_err();
        assert!(matches!(err.downcast_ref(), Some(KeyError::Empty)), "{err}");
    }

    #[test]
    fn a_ui_made_key_is_checked_against_the_id() {
        let ui = Secret::new(NewKey::generate("proxmox").encoded_as("proxmox"));
        assert!(args(Some(&ui), None, "proxmox").connection().is_ok());
        let err = args(Some(&ui), None, "other").connection().unwrap_err();
        let wanted = "the key was made for provider \"proxmox\" but --id is \"other\"";
        assert!(err.to_string().starts_with(wanted), "{err}");
    }

    #[test]
    fn a_plaintext_endpoint_needs_the_opt_in_and_is_warned_about() {
        let key = Secret::new(NewKey::generate("a").encoded());
        for url in ["http://127.0.0.1:8080", "grpc://omni.example:8090"] {
            let mut a = args(Some(&key), None, "a");
            a.omni_api_endpoint = Some(url.into());
            let err = a.connection().unwrap_err();
            assert!(err.to_string().contains("is plaintext"), "{err}");
            assert!(err.to_string().contains("--omni-insecure-http"), "{err}");
            assert!(a.warnings().is_empty());
            a.omni_insecure_http = true;
            assert!(a.connection().is_ok());
            assert!(a.warnings()[0].contains("plaintext"), "{:?}", a.warnings());
        }
        assert!(args(Some(&key), None, "a").connection().is_ok());
    }

    #[test]
    fn the_key_comes_from_a_file_once_and_never_into_a_message() {
        let key = Secret::new(NewKey::generate("a").encoded());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omni-key");
        std::fs::write(&path, format!("{}\n", key.expose())).unwrap();
        let mut a = args(None, None, "a");
        a.omni_service_account_key_file = Some(path.clone());
        assert!(a.is_set());
        let (_, parsed) = a.connection().unwrap();
        assert_eq!(parsed.provider_id(), Some("a"));

        a.omni_service_account_key = Some(key.clone());
        let err = a.connection().unwrap_err().to_string();
        assert!(err.contains("the Omni key is given twice"), "{err}");

        a.omni_service_account_key = None;
        a.omni_service_account_key_file = Some(dir.path().join("missing"));
        let err = a.connection().unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");

        std::fs::write(&path, "not-a-key-s3cr3t").unwrap();
        a.omni_service_account_key_file = Some(path);
        let err = a.connection().unwrap_err().to_string();
        assert!(!err.contains("s3cr3t"), "{err}");
    }
}

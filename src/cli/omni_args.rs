//! The Omni connection flags, shared by every command that talks to Omni (the provider itself and
//! `orphans`): the official provider's names and environment variables, plus our `--omni-ca-file`.

use std::path::PathBuf;

use crate::omni::auth::{KeyError, ProviderKey};
use crate::omni::transport::{OmniEndpoint, OmniTls};
use crate::secret::Secret;

#[derive(Debug, clap::Args)]
pub struct OmniArgs {
    /// Omni API endpoint, e.g. https://omni.example.com (any path is ignored).
    #[arg(long, env = "OMNI_ENDPOINT")]
    pub omni_api_endpoint: Option<String>,
    /// Infra provider key printed by `omnictl infraprovider create <id>`.
    #[arg(long, env = "OMNI_SERVICE_ACCOUNT_KEY", hide_env_values = true, value_parser = parse_secret)]
    pub omni_service_account_key: Option<Secret>,
    /// Provider ID; must match the ID the key was created for.
    #[arg(long, default_value = "proxmox")]
    pub id: String,
    /// Skip TLS verification of the Omni endpoint.
    #[arg(long)]
    pub insecure_skip_verify: bool,
    /// PEM file with extra CA certificates to trust for the Omni endpoint (ours).
    #[arg(long, env = "OMNI_CA_FILE")]
    pub omni_ca_file: Option<PathBuf>,
}

fn parse_secret(s: &str) -> Result<Secret, std::convert::Infallible> {
    Ok(Secret::new(s))
}

#[derive(Debug, thiserror::Error)]
pub enum OmniArgsError {
    #[error("--omni-api-endpoint (or OMNI_ENDPOINT) is required")]
    NoEndpoint,
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(
        "the key was made for provider {key_id:?} but --id is {flag_id:?}; run with --id {key_id} or create a key for {flag_id:?} with `omnictl infraprovider create {flag_id}`"
    )]
    IdMismatch { key_id: String, flag_id: String },
    #[error("--insecure-skip-verify and --omni-ca-file cannot be used together")]
    TlsFlags,
}

impl OmniArgs {
    /// The endpoint and the parsed key, with every mistake in the flags reported clearly.
    pub fn connection(&self) -> Result<(OmniEndpoint, ProviderKey), OmniArgsError> {
        let url = self
            .omni_api_endpoint
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or(OmniArgsError::NoEndpoint)?;
        let key = ProviderKey::parse(&self.omni_service_account_key.clone().unwrap_or_default())?;
        if let Some(key_id) = key.provider_id()
            && key_id != self.id
        {
            return Err(OmniArgsError::IdMismatch {
                key_id: key_id.to_owned(),
                flag_id: self.id.clone(),
            });
        }
        let tls = match (&self.omni_ca_file, self.insecure_skip_verify) {
            (Some(_), true) => return Err(OmniArgsError::TlsFlags),
            (Some(p), false) => OmniTls::CaFile(p.clone()),
            (None, true) => OmniTls::InsecureSkipVerify,
            (None, false) => OmniTls::WebPki,
        };
        Ok((OmniEndpoint { url, tls }, key))
    }

    /// Whether both the endpoint and the key were given (commands that can refuse early).
    pub fn is_set(&self) -> bool {
        self.omni_api_endpoint
            .as_deref()
            .is_some_and(|u| !u.is_empty())
            && self
                .omni_service_account_key
                .as_ref()
                .is_some_and(|k| !k.is_empty())
    }
}

//! The `proxmox:` section: where the API is, how to log in, which certificates to trust. The keys
//! and the choice between a token and a password login are the official provider's, so a file that
//! works there connects the same way here.

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use super::read::{Expecting, Found, kind, value_type};
use crate::secret::Secret;

pub use crate::proxmox::client::{ProxmoxAuth, ProxmoxSettings, TlsTrust};

/// The `proxmox:` section as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ProxmoxFile {
    url: Option<Text>,
    #[serde(rename = "tokenID")]
    token_id: Option<Text>,
    token_secret: Option<Text>,
    /// A file holding the token secret (a Docker or Kubernetes secret mounted as a file).
    token_secret_file: Option<Text>,
    username: Option<Text>,
    password: Option<Text>,
    password_file: Option<Text>,
    realm: Option<Text>,
    insecure_skip_verify: Option<bool>,
    ca_file: Option<Text>,
    /// Allows a plaintext `http://` URL (a test setup).
    #[serde(rename = "insecureHTTP")]
    insecure_http: Option<bool>,
}

impl Expecting for ProxmoxFile {
    const EXPECTING: &'static str = "a mapping of connection settings";
}

value_type!(
    /// A string setting; blank is unset. YAML turns `password: 1234` into a number: the user meant
    /// the text.
    Text(Option<String>),
    |v| match v {
        Value::String(s) => Ok(Some(s).filter(|s| !s.trim().is_empty())),
        Value::Number(n) => Ok(Some(n.to_string())),
        other => Err(format!(" must be a string, found {}", kind(&other))),
    }
);

fn text(t: Option<Text>) -> Option<String> {
    t.and_then(|t| t.0)
}

impl ProxmoxFile {
    /// The settings, or `None` with what is wrong in `found`.
    pub(super) fn check(self, found: &mut Found) -> Option<ProxmoxSettings> {
        let Found {
            problems, warnings, ..
        } = found;
        let before = problems.len();
        let token_secret = secret(
            self.token_secret,
            self.token_secret_file,
            "tokenSecret",
            problems,
        );
        let password = secret(self.password, self.password_file, "password", problems);
        let insecure_http = self.insecure_http.unwrap_or(false);
        let api_url = api_url(text(self.url), insecure_http, warnings, problems);
        let token = (text(self.token_id), token_secret);
        let auth = login(
            token,
            (text(self.username), password),
            text(self.realm),
            warnings,
            problems,
        );
        let tls = match (
            self.insecure_skip_verify.unwrap_or(false),
            text(self.ca_file),
        ) {
            (true, Some(_)) => {
                problems.push("`proxmox.insecureSkipVerify: true` and `proxmox.caFile` contradict each other: with a CA file, verification can stay on".into());
                None
            }
            (true, None) => Some(TlsTrust::InsecureSkipVerify),
            (false, Some(path)) => Some(TlsTrust::CaFile(PathBuf::from(path))),
            (false, None) => Some(TlsTrust::WebPki),
        };
        if problems.len() > before {
            return None;
        }
        Some(ProxmoxSettings {
            api_url: api_url?,
            auth: auth?,
            tls: tls?,
        })
    }
}

/// A secret written inline (`tokenSecret`) or kept in a file (`tokenSecretFile`), read here, once.
/// Messages name the key and the file, never what either holds.
fn secret(
    inline: Option<Text>,
    file: Option<Text>,
    key: &str,
    problems: &mut Vec<String>,
) -> Option<Secret> {
    let Some(path) = text(file) else {
        return text(inline).map(Secret::new);
    };
    let file_key = format!("{key}File");
    if text(inline).is_some() {
        problems.push(format!(
            "`proxmox.{key}` and `proxmox.{file_key}` are both set: keep one"
        ));
        return None;
    }
    crate::secret::read_file(std::path::Path::new(&path))
        .map_err(|e| problems.push(format!("cannot read `proxmox.{file_key}` {path}: {e}")))
        .ok()
}

/// The API URL; a plaintext one only with `insecureHTTP: true`, and with a warning.
fn api_url(
    url: Option<String>,
    insecure_http: bool,
    warnings: &mut Vec<String>,
    problems: &mut Vec<String>,
) -> Option<url::Url> {
    let Some(raw) = url else {
        problems
            .push("`proxmox.url` is required, e.g. \"https://pve.example:8006/api2/json\"".into());
        return None;
    };
    let u = normalize_api_url(&raw)
        .map_err(|why| problems.push(format!("`proxmox.url` {raw:?} {why}")))
        .ok()?;
    if u.scheme() == "http" {
        if insecure_http {
            warnings.push(format!("`proxmox.url` {:?} is plaintext (`insecureHTTP: true`): the token secret or password crosses the network readable by anyone on the path; use https:// outside a test setup", u.as_str()));
        } else {
            problems.push(format!("`proxmox.url` {:?} is plaintext http://: the token secret or password would cross the network in clear; use https:// (Proxmox VE listens on https://HOST:8006), or set `proxmox.insecureHTTP: true` for a test setup", u.as_str()));
        }
    }
    Some(u)
}

/// The login the keys make, chosen as the official provider chooses: username and password both set
/// win, else the token pair; the realm only goes with the password.
fn login(
    (token_id, token_secret): (Option<String>, Option<Secret>),
    (username, password): (Option<String>, Option<Secret>),
    realm: Option<String>,
    warnings: &mut Vec<String>,
    problems: &mut Vec<String>,
) -> Option<ProxmoxAuth> {
    let mut missing = |set: &str, missing: &str| {
        problems.push(format!(
            "`proxmox.{set}` is set but `proxmox.{missing}` is missing"
        ));
        None
    };
    match (token_id, token_secret, username, password) {
        (id, secret, Some(user), Some(password)) => {
            if id.is_some() || secret.is_some() {
                warnings.push("`proxmox` has both an API token (`tokenID`/`tokenSecret`) and a password login (`username`/`password`): using the password login, as the official provider does; remove the one you do not want".into());
            }
            // Upstream takes `username` and `realm` separately; accept "root@pam" too.
            let username = match (user.contains('@'), realm) {
                (true, None) => user,
                (true, Some(r)) => {
                    problems.push(format!("`proxmox.username` {user:?} already names a realm, and `proxmox.realm` is {r:?}: keep only one"));
                    user
                }
                (false, r) => format!("{user}@{}", r.unwrap_or_else(|| "pam".into())),
            };
            Some(ProxmoxAuth::Password { username, password })
        }
        (Some(id), Some(secret), user, password) => {
            // Only one of username and password (both is the arm above).
            let set = [
                ("username", user.is_some(), "password"),
                ("password", password.is_some(), "username"),
            ];
            for (set, _, missing) in set.into_iter().filter(|(_, is_set, _)| *is_set) {
                warnings.push(format!("`proxmox.{set}` is ignored without `proxmox.{missing}`: using the API token, as the official provider does"));
            }
            if !id.contains('!') || !id.contains('@') {
                problems.push(format!(
                    "`proxmox.tokenID` {id:?} must look like user@realm!tokenname, e.g. \"omni@pve!provider\""
                ));
            }
            if realm.is_some() {
                // The official provider ignores it too, so a file that works there is not refused.
                warnings.push("`proxmox.realm` is ignored with an API token: the token's realm is part of `tokenID`".into());
            }
            Some(ProxmoxAuth::Token { id, secret })
        }
        (Some(_), None, _, _) => missing("tokenID", "tokenSecret"),
        (None, Some(_), _, _) => missing("tokenSecret", "tokenID"),
        (None, None, Some(_), None) => missing("username", "password"),
        (None, None, None, Some(_)) => missing("password", "username"),
        (None, None, None, None) => {
            problems.push("`proxmox` needs credentials: `tokenID` + `tokenSecret` (recommended) or `username` + `password` (+ `realm`, default pam)".into());
            None
        }
    }
}

/// Accepts `https://host:8006`, `https://host:8006/`, `https://host:8006/api2/json[/]`.
pub fn normalize_api_url(raw: &str) -> Result<url::Url, String> {
    let mut u = url::Url::parse(raw.trim()).map_err(|e| format!("is not a URL: {e}"))?;
    if u.scheme() != "https" && u.scheme() != "http" {
        return Err(format!(
            "must start with https:// (found scheme {:?})",
            u.scheme()
        ));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err("has no host".into());
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err("must not have a query or fragment".into());
    }
    let path = u.path().trim_end_matches('/');
    let path = path.strip_suffix("/api2/json").unwrap_or(path).to_owned();
    u.set_path(&format!("{path}/api2/json"));
    Ok(u)
}

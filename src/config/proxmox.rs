//! The `proxmox:` section: where the API is, how to log in, which certificates to trust. The keys
//! and the choice between a token and a password login are the official provider's, so a file that
//! works there connects the same way here.

use std::path::PathBuf;

use serde_json::{Map, Value};

use super::{Found, kind};
use crate::secret::Secret;

pub use crate::proxmox::settings::{ProxmoxAuth, ProxmoxSettings, TlsTrust};

pub(super) const PROXMOX_KEYS: &[&str] = &[
    "url",
    "tokenID",
    "tokenSecret",
    "username",
    "password",
    "realm",
    "insecureSkipVerify",
    "caFile",
    "tokenSecretFile",
    "passwordFile",
    "insecureHTTP",
];

impl ProxmoxSettings {
    pub(super) fn from_map(p: &Map<String, Value>, found: &mut Found) -> Option<Self> {
        found.check_keys(p, PROXMOX_KEYS, "proxmox.");
        let Found {
            problems, warnings, ..
        } = found;
        let before = problems.len();
        let s = |k: &str, problems: &mut Vec<String>| string_key(p, k, problems);
        let url = s("url", problems);
        let credentials = Credentials {
            token_id: s("tokenID", problems),
            token_secret: secret_key(p, "tokenSecret", problems),
            username: s("username", problems),
            password: secret_key(p, "password", problems),
            realm: s("realm", problems),
        };
        let ca_file = s("caFile", problems);
        let insecure = flag(p, "insecureSkipVerify", problems);
        let insecure_http = flag(p, "insecureHTTP", problems);

        let api_url = api_url(url.as_deref(), problems);
        if let Some(u) = api_url.as_ref().filter(|u| u.scheme() == "http") {
            if insecure_http {
                warnings.push(format!("`proxmox.url` {:?} is plaintext (`insecureHTTP: true`): the token secret or password crosses the network readable by anyone on the path; use https:// outside a test setup", u.as_str()));
            } else {
                problems.push(format!("`proxmox.url` {:?} is plaintext http://: the token secret or password would cross the network in clear; use https:// (Proxmox VE listens on https://HOST:8006), or set `proxmox.insecureHTTP: true` for a test setup", u.as_str()));
            }
        }
        let auth = credentials.login(warnings, problems);
        let tls = tls_trust(insecure, ca_file, problems);
        if problems.len() > before {
            return None;
        }
        Some(Self {
            api_url: api_url?,
            auth: auth?,
            tls: tls?,
        })
    }
}

fn flag(p: &Map<String, Value>, key: &str, problems: &mut Vec<String>) -> bool {
    match p.get(key) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            problems.push(format!(
                "`proxmox.{key}` must be true or false, found {}",
                kind(other)
            ));
            false
        }
    }
}

/// A secret written inline (`tokenSecret`) or kept in a file (`tokenSecretFile`: a Docker or
/// Kubernetes secret mounted as a file), read here, once. Messages name the key and the file,
/// never what either holds.
fn secret_key(p: &Map<String, Value>, key: &str, problems: &mut Vec<String>) -> Option<String> {
    let inline = string_key(p, key, problems);
    let file_key = format!("{key}File");
    let Some(path) = string_key(p, &file_key, problems) else {
        return inline;
    };
    if inline.is_some() {
        problems.push(format!(
            "`proxmox.{key}` and `proxmox.{file_key}` are both set: keep one"
        ));
        return None;
    }
    match crate::secret::read_file(std::path::Path::new(&path)) {
        Ok(secret) => Some(secret.expose().to_owned()),
        Err(e) => {
            problems.push(format!("cannot read `proxmox.{file_key}` {path}: {e}"));
            None
        }
    }
}

fn api_url(url: Option<&str>, problems: &mut Vec<String>) -> Option<url::Url> {
    match url {
        None => {
            problems.push(
                "`proxmox.url` is required, e.g. \"https://pve.example:8006/api2/json\"".into(),
            );
            None
        }
        Some(raw) => match normalize_api_url(raw) {
            Ok(u) => Some(u),
            Err(why) => {
                problems.push(format!("`proxmox.url` {raw:?} {why}"));
                None
            }
        },
    }
}

/// The login keys as written; which login they make is decided together, as upstream decides it.
struct Credentials {
    token_id: Option<String>,
    token_secret: Option<String>,
    username: Option<String>,
    password: Option<String>,
    realm: Option<String>,
}

impl Credentials {
    fn login(self, warnings: &mut Vec<String>, problems: &mut Vec<String>) -> Option<ProxmoxAuth> {
        let Self {
            token_id,
            token_secret,
            username,
            password,
            realm,
        } = self;
        match (token_id, token_secret, username, password) {
            // The official provider logs in with the password whenever username and password are both
            // set, and only otherwise uses the token; do the same so either provider behaves alike.
            (id, secret, Some(user), Some(password)) if id.is_some() || secret.is_some() => {
                warnings.push("`proxmox` has both an API token (`tokenID`/`tokenSecret`) and a password login (`username`/`password`): using the password login, as the official provider does; remove the one you do not want".into());
                password_login(user, password, realm, problems)
            }
            (Some(id), Some(secret), user, password) => {
                // Only one of username and password (both is the arm above).
                if user.is_some() || password.is_some() {
                    let (set, missing) = if user.is_some() {
                        ("username", "password")
                    } else {
                        ("password", "username")
                    };
                    warnings.push(format!("`proxmox.{set}` is ignored without `proxmox.{missing}`: using the API token, as the official provider does"));
                }
                token_login(id, secret, realm, warnings, problems)
            }
            (Some(_), None, _, _) => {
                problems
                    .push("`proxmox.tokenID` is set but `proxmox.tokenSecret` is missing".into());
                None
            }
            (None, Some(_), _, _) => {
                problems
                    .push("`proxmox.tokenSecret` is set but `proxmox.tokenID` is missing".into());
                None
            }
            (None, None, Some(user), Some(password)) => {
                password_login(user, password, realm, problems)
            }
            (None, None, Some(_), None) => {
                problems.push("`proxmox.username` is set but `proxmox.password` is missing".into());
                None
            }
            (None, None, None, Some(_)) => {
                problems.push("`proxmox.password` is set but `proxmox.username` is missing".into());
                None
            }
            (None, None, None, None) => {
                problems.push("`proxmox` needs credentials: `tokenID` + `tokenSecret` (recommended) or `username` + `password` (+ `realm`, default pam)".into());
                None
            }
        }
    }
}

fn tls_trust(
    insecure: bool,
    ca_file: Option<String>,
    problems: &mut Vec<String>,
) -> Option<TlsTrust> {
    match (insecure, ca_file) {
        (true, Some(_)) => {
            problems.push("`proxmox.insecureSkipVerify: true` and `proxmox.caFile` contradict each other: with a CA file, verification can stay on".into());
            None
        }
        (true, None) => Some(TlsTrust::InsecureSkipVerify),
        (false, Some(path)) => Some(TlsTrust::CaFile(PathBuf::from(path))),
        (false, None) => Some(TlsTrust::WebPki),
    }
}

fn token_login(
    id: String,
    secret: String,
    realm: Option<String>,
    warnings: &mut Vec<String>,
    problems: &mut Vec<String>,
) -> Option<ProxmoxAuth> {
    if !id.contains('!') || !id.contains('@') {
        problems.push(format!(
            "`proxmox.tokenID` {id:?} must look like user@realm!tokenname, e.g. \"omni@pve!provider\""
        ));
    }
    if realm.is_some() {
        // The official provider ignores it too, so a file that works there is not refused.
        warnings.push(
            "`proxmox.realm` is ignored with an API token: the token's realm is part of `tokenID`"
                .into(),
        );
    }
    Some(ProxmoxAuth::Token {
        id,
        secret: Secret::new(secret),
    })
}

fn password_login(
    user: String,
    password: String,
    realm: Option<String>,
    problems: &mut Vec<String>,
) -> Option<ProxmoxAuth> {
    // Upstream takes `username` and `realm` separately; accept "root@pam" too.
    let username = match (user.contains('@'), realm) {
        (true, None) => user,
        (true, Some(r)) => {
            problems.push(format!("`proxmox.username` {user:?} already names a realm, and `proxmox.realm` is {r:?}: keep only one"));
            user
        }
        (false, r) => format!("{user}@{}", r.unwrap_or_else(|| "pam".into())),
    };
    Some(ProxmoxAuth::Password {
        username,
        password: Secret::new(password),
    })
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

fn string_key(map: &Map<String, Value>, key: &str, problems: &mut Vec<String>) -> Option<String> {
    match map.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => Some(s.clone()),
        // YAML turns `password: 1234` into a number; the user meant the text.
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(other) => {
            problems.push(format!(
                "`proxmox.{key}` must be a string, found {}",
                kind(other)
            ));
            None
        }
    }
}

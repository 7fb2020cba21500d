//! The provider config file (`--config-file`).
//!
//! It keeps the official provider's keys so an existing file works unchanged:
//!
//! ```yaml
//! proxmox:
//!   url: "https://pve.example:8006/api2/json"   # with or without /api2/json
//!   tokenID: "omni@pve!provider"                 # API token ...
//!   tokenSecret: "…"
//!   username: root                               # ... or user + password + realm (ticket login)
//!   password: "…"
//!   realm: pam
//!   insecureSkipVerify: false
//!   caFile: /etc/omni-proxmox/ca.pem             # ours: trust a private CA
//! ```
//!
//! plus our additions (`defaults:` and per-node `nodes:` overrides for provider data). The file is
//! validated completely on load: every problem names its key, and an unknown key gets a suggestion,
//! because a misspelled `insecureSkipVerify` silently ignored is worse than a refusal to start.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::did_you_mean;
use crate::secret::Secret;

/// Everything in the config file, validated.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub proxmox: ProxmoxSettings,
    /// `defaults:`: provider-data keys applied to every machine class (lowest precedence above built-ins).
    pub defaults: Map<String, Value>,
    /// `nodes:`: per-node provider-data overrides, applied after the node is chosen.
    pub nodes: Map<String, Value>,
}

/// How to reach and log in to the Proxmox VE API.
#[derive(Debug, Clone)]
pub struct ProxmoxSettings {
    /// Base URL ending in `/api2/json`, whatever the user wrote.
    pub api_url: url::Url,
    pub auth: ProxmoxAuth,
    pub tls: TlsTrust,
}

#[derive(Debug, Clone)]
pub enum ProxmoxAuth {
    /// `Authorization: PVEAPIToken=<id>=<secret>`; no CSRF token, never expires.
    Token { id: String, secret: Secret },
    /// Ticket login at `/access/ticket` as `<username>@<realm>`.
    Password { username: String, password: Secret },
}

/// Which server certificates to accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsTrust {
    /// Public web PKI roots.
    WebPki,
    /// Public roots plus the certificates in this PEM file (a private CA or a pinned self-signed cert).
    CaFile(PathBuf),
    /// No verification at all (`insecureSkipVerify: true`); logged as a warning at start.
    InsecureSkipVerify,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid YAML: {message}")]
    Yaml { path: PathBuf, message: String },
    #[error("config file {path}: {}", problems.join("; "))]
    Invalid {
        path: PathBuf,
        problems: Vec<String>,
    },
}

const TOP_KEYS: &[&str] = &["proxmox", "defaults", "nodes"];
const PROXMOX_KEYS: &[&str] = &[
    "url",
    "tokenID",
    "tokenSecret",
    "username",
    "password",
    "realm",
    "insecureSkipVerify",
    "caFile",
];

impl ProviderConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ParseError::Yaml(message) => ConfigError::Yaml {
                path: path.to_owned(),
                message,
            },
            ParseError::Invalid(problems) => ConfigError::Invalid {
                path: path.to_owned(),
                problems,
            },
        })
    }

    /// Parses the text of a config file; all problems are reported together.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let root: Value = crate::yaml::from_str(text).map_err(ParseError::Yaml)?;
        let mut problems = Vec::new();
        let root = match root {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => {
                return Err(ParseError::Invalid(vec![format!(
                    "the file must be a mapping with a `proxmox:` section, found {}",
                    kind(&other)
                )]));
            }
        };
        check_keys(&root, TOP_KEYS, "", &mut problems);
        let proxmox = match root.get("proxmox") {
            Some(Value::Object(p)) => ProxmoxSettings::from_map(p, &mut problems),
            Some(other) => {
                problems.push(format!(
                    "`proxmox` must be a mapping of connection settings, found {}",
                    kind(other)
                ));
                None
            }
            None => {
                problems.push(
                    "missing `proxmox:` section (needs at least `url` and either `tokenID`+`tokenSecret` or `username`+`password`)"
                        .to_owned(),
                );
                None
            }
        };
        let defaults = optional_map(&root, "defaults", &mut problems);
        let nodes = optional_map(&root, "nodes", &mut problems);
        match (proxmox, problems.is_empty()) {
            (Some(proxmox), true) => Ok(Self {
                proxmox,
                defaults,
                nodes,
            }),
            _ => Err(ParseError::Invalid(problems)),
        }
    }
}

#[derive(Debug)]
pub enum ParseError {
    Yaml(String),
    Invalid(Vec<String>),
}

impl ProxmoxSettings {
    fn from_map(p: &Map<String, Value>, problems: &mut Vec<String>) -> Option<Self> {
        let before = problems.len();
        check_keys(p, PROXMOX_KEYS, "proxmox.", problems);
        let s = |k: &str, problems: &mut Vec<String>| string_key(p, k, problems);
        let url = s("url", problems);
        let token_id = s("tokenID", problems);
        let token_secret = s("tokenSecret", problems);
        let username = s("username", problems);
        let password = s("password", problems);
        let realm = s("realm", problems);
        let ca_file = s("caFile", problems);
        let insecure = match p.get("insecureSkipVerify") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                problems.push(format!(
                    "`proxmox.insecureSkipVerify` must be true or false, found {}",
                    kind(other)
                ));
                false
            }
        };

        let api_url = match url.as_deref() {
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
        };

        let auth = match (token_id, token_secret, username, password) {
            (Some(_), Some(_), Some(_), _) | (Some(_), Some(_), _, Some(_)) => {
                problems.push("`proxmox` has both an API token (`tokenID`/`tokenSecret`) and a password login (`username`/`password`): keep only one".into());
                None
            }
            (Some(id), Some(secret), None, None) => {
                if !id.contains('!') || !id.contains('@') {
                    problems.push(format!(
                        "`proxmox.tokenID` {id:?} must look like user@realm!tokenname, e.g. \"omni@pve!provider\""
                    ));
                }
                if realm.is_some() {
                    problems.push("`proxmox.realm` applies to password login only; the realm of an API token is part of `tokenID`".into());
                }
                Some(ProxmoxAuth::Token {
                    id,
                    secret: Secret::new(secret),
                })
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
        };

        let tls = match (insecure, ca_file) {
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
        Some(Self {
            api_url: api_url?,
            auth: auth?,
            tls: tls?,
        })
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

fn check_keys(map: &Map<String, Value>, known: &[&str], prefix: &str, problems: &mut Vec<String>) {
    for key in map.keys() {
        if !known.contains(&key.as_str()) {
            problems.push(format!(
                "unknown key `{prefix}{key}`{}",
                did_you_mean::hint(key, known)
            ));
        }
    }
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

fn optional_map(
    root: &Map<String, Value>,
    key: &str,
    problems: &mut Vec<String>,
) -> Map<String, Value> {
    match root.get(key) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            problems.push(format!("`{key}` must be a mapping, found {}", kind(other)));
            Map::new()
        }
    }
}

/// A short name for a JSON value's type, for error messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<String> {
        match ProviderConfig::parse(text) {
            Err(ParseError::Invalid(p)) => p,
            other => panic!("expected problems, got {other:?}"),
        }
    }

    #[test]
    fn upstream_password_config_loads() {
        let c = ProviderConfig::parse(
            "proxmox:\n  url: https://pve:8006/api2/json\n  username: root\n  password: s3cret\n  realm: pam\n  insecureSkipVerify: true\n",
        )
        .unwrap();
        assert_eq!(c.proxmox.api_url.as_str(), "https://pve:8006/api2/json");
        assert!(
            matches!(&c.proxmox.auth, ProxmoxAuth::Password { username, .. } if username == "root@pam")
        );
        assert_eq!(c.proxmox.tls, TlsTrust::InsecureSkipVerify);
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn token_config_and_url_without_suffix() {
        let c = ProviderConfig::parse(
            "proxmox:\n  url: https://pve:8006/\n  tokenID: omni@pve!p\n  tokenSecret: abc\n  caFile: /ca.pem\n",
        )
        .unwrap();
        assert_eq!(c.proxmox.api_url.as_str(), "https://pve:8006/api2/json");
        assert_eq!(c.proxmox.tls, TlsTrust::CaFile("/ca.pem".into()));
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let p = problems(
            "proxmox:\n  url: ftp://x\n  tokenId: a@b!c\n  username: root\n  insecureSkipVerify: yes please\n",
        );
        let all = p.join("\n");
        assert!(
            all.contains("unknown key `proxmox.tokenId` (did you mean `tokenID`?)"),
            "{all}"
        );
        assert!(all.contains("`proxmox.url`"), "{all}");
        assert!(all.contains("`proxmox.password` is missing"), "{all}");
        assert!(all.contains("insecureSkipVerify"), "{all}");
    }

    #[test]
    fn contradictions_are_refused() {
        let all = problems(
            "proxmox:\n  url: https://x\n  tokenID: a@b!c\n  tokenSecret: s\n  username: u\n  password: p\n  insecureSkipVerify: true\n  caFile: /x\n",
        )
        .join("\n");
        assert!(all.contains("keep only one"), "{all}");
        assert!(all.contains("contradict"), "{all}");
        assert!(problems("").join("").contains("missing `proxmox:`"));
    }
}

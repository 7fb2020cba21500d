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
//! plus our additions (`defaults:` and per-node `nodes:` overrides for provider data, `strict:`,
//! `placement:` with the overcommit limits automatic placement keeps to:
//! `placement: {cpuOvercommit: 4.0, memoryOvercommit: 1.0}`, those being the defaults, and
//! `ipPools:`, the static IP pools provider data names with `ip_pool`, see [`ip_pools`]).
//! The file is validated completely on load: every problem names its key. An unknown key is a
//! warning with a suggestion (the official provider ignores it silently, so a file that works there
//! must load here); `strict: true` at the top of the file makes unknown keys errors, here and in
//! provider data.

mod ip_pools;
mod policy;
mod proxmox;
mod read;

use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::rules::ip_pool::IpPool;
use crate::rules::placement::PlacementLimits;
use crate::rules::provider_data::ConfigLayers;
use ip_pools::Pools;
use policy::Policy;
use proxmox::ProxmoxFile;
pub use proxmox::{ProxmoxSettings, TlsTrust};

use read::{Expecting, Found, Section, kind, value_type};

/// Everything in the config file, validated.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub proxmox: ProxmoxSettings,
    /// `defaults:`: provider-data keys applied to every machine class (lowest precedence above built-ins).
    pub defaults: Map<String, Value>,
    /// `nodes:`: per-node provider-data overrides, applied after the node is chosen.
    pub nodes: Map<String, Value>,
    /// `defaults:` and `nodes:` read into typed provider-data layers once, here, so that resolving a
    /// request's provider data only reads the machine class; with `strict: true` (unknown keys, here
    /// and in provider data, are errors, not warnings).
    pub layers: ConfigLayers,
    /// `placement:`: how far automatic placement may commit a node's CPUs and memory.
    pub placement: PlacementLimits,
    /// `ipPools:`: the static IP pools provider data may name (`ip_pool`), checked.
    pub ip_pools: Vec<IpPool>,
    /// `policy:`: what machine classes may ask for.
    pub policy: Policy,
    /// What was ignored or chosen for the user (unknown keys, a token and a password both set): logged
    /// at start and shown by `validate`.
    pub warnings: Vec<String>,
}

/// What is wrong with the text of a config file, worded to follow its path.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error(" is not valid YAML: {0}")]
    Yaml(String),
    #[error(": {}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// The file as written: each key of the file is a field here or in a section's struct.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    proxmox: Option<Section<ProxmoxFile>>,
    defaults: Option<Map<String, Value>>,
    nodes: Option<Map<String, Value>>,
    /// Unknown keys, here and in provider data, are errors rather than warnings.
    strict: Option<bool>,
    placement: Option<Section<PlacementFile>>,
    ip_pools: Option<Section<Pools>>,
    policy: Option<Section<Policy>>,
}

/// `placement:` as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PlacementFile {
    cpu_overcommit: Option<CpuOvercommit>,
    memory_overcommit: Option<MemoryOvercommit>,
}

impl Expecting for PlacementFile {
    const EXPECTING: &'static str =
        "a mapping, e.g. `placement: {cpuOvercommit: 4.0, memoryOvercommit: 1.0}`";
}

value_type!(CpuOvercommit(f64), |v| overcommit(
    v,
    "vCPUs given to VMs per CPU of the node, e.g. 4.0"
));
value_type!(MemoryOvercommit(f64), |v| overcommit(
    v,
    "memory given to VMs per byte of the node's memory, e.g. 1.0 to never overcommit"
));

/// No cluster runs usefully at more vCPUs per CPU than this; a larger value is a typo.
const MAX_OVERCOMMIT: f64 = 64.0;

/// How much of a node's CPUs or memory (`what`) VMs may be given, per unit the node has.
fn overcommit(v: Value, what: &str) -> Result<f64, String> {
    match v.as_f64() {
        Some(r) if r > 0.0 && r <= MAX_OVERCOMMIT => Ok(r),
        _ => Err(format!(
            " must be a number above 0 and at most {MAX_OVERCOMMIT} ({what}), found {}",
            match &v {
                Value::Number(n) => n.to_string(),
                other => kind(other).to_owned(),
            }
        )),
    }
}

impl ProviderConfig {
    pub fn load(path: &Path) -> Result<Self, String> {
        let shown = path.display();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config file {shown}: {e}"))?;
        Self::parse(&text).map_err(|error| format!("config file {shown}{error}"))
    }

    /// Parses the text of a config file; all problems are reported together.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let root = match crate::yaml::from_str(text).map_err(ParseError::Yaml)? {
            Value::Null => Value::Object(Map::new()),
            root @ Value::Object(_) => root,
            other => {
                return Err(ParseError::Invalid(vec![format!(
                    "the file must be a mapping with a `proxmox:` section, found {}",
                    kind(&other)
                )]));
            }
        };
        let mut found = Found::default();
        found.strict = root["strict"] == true;
        let file: Option<File> = found.read(root);
        match file.and_then(|f| f.check(&mut found)) {
            Some(config) if found.problems.is_empty() => Ok(Self {
                warnings: found.warnings,
                ..config
            }),
            // What was ignored often explains what is missing (`tokenId` for `tokenID`).
            _ => Err(ParseError::Invalid(
                found.problems.into_iter().chain(found.warnings).collect(),
            )),
        }
    }
}

impl File {
    /// The cross-key rules, every problem into `found`; the config when there is none.
    fn check(self, found: &mut Found) -> Option<ProviderConfig> {
        let proxmox = match self.proxmox {
            Some(p) => p.0.check(found),
            None if found.failed.contains("proxmox") => None,
            None => {
                found.problems.push(
                    "missing `proxmox:` section (needs at least `url` and either `tokenID`+`tokenSecret` or `username`+`password`)"
                        .to_owned(),
                );
                None
            }
        };
        let defaults = self.defaults.unwrap_or_default();
        let nodes = self.nodes.unwrap_or_default();
        let ip_pools = self
            .ip_pools
            .map(|p| ip_pools::check(p.0, found))
            .unwrap_or_default();
        ip_pools::check_references(&defaults, &nodes, &ip_pools, found);
        let base = PlacementLimits::default();
        let placement = self.placement.map_or(base, |Section(p)| PlacementLimits {
            cpu_overcommit: p.cpu_overcommit.map_or(base.cpu_overcommit, |r| r.0),
            memory_overcommit: p.memory_overcommit.map_or(base.memory_overcommit, |r| r.0),
        });
        Some(ProviderConfig {
            proxmox: proxmox?,
            placement,
            ip_pools,
            policy: self.policy.map(|p| p.0).unwrap_or_default(),
            layers: ConfigLayers::read(&defaults, &nodes, self.strict.unwrap_or(false)),
            defaults,
            nodes,
            warnings: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ip_pools::PoolFile;
    use super::proxmox::ProxmoxAuth;
    use super::*;

    // The keys a derived struct reads, as the file writes them.
    use crate::rules::provider_data::schema::field_names as keys_of;

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
            "strict: true\nproxmox:\n  url: ftp://x\n  tokenId: a@b!c\n  username: root\n  insecureSkipVerify: yes please\n",
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
            "proxmox:\n  url: https://x\n  username: u@pve\n  realm: pam\n  password: p\n  insecureSkipVerify: true\n  caFile: /x\n",
        )
        .join("\n");
        assert!(all.contains("keep only one"), "{all}");
        assert!(all.contains("contradict"), "{all}");
        assert!(problems("").join("").contains("missing `proxmox:`"));
    }

    /// The official provider decodes its config with a plain yaml.Decoder (no KnownFields), so an
    /// unknown key is ignored there (omni-infra-provider-proxmox cmd/omni-infra-provider-proxmox/
    /// main.go, the root command's RunE; internal/pkg/config/config.go). It must load here too, with
    /// a warning; `strict: true` refuses it.
    #[test]
    fn unknown_keys_are_warnings_unless_strict() {
        let text = "proxmox:\n  url: https://pve:8006\n  tokenID: omni@pve!p\n  tokenSecret: abc\n  insecureSkipVerfy: true\nlogLevel: debug\n";
        let c = ProviderConfig::parse(text).unwrap();
        assert!(!c.layers.strict);
        assert_eq!(
            c.warnings,
            vec![
                "unknown key `logLevel` is ignored".to_string(),
                "unknown key `proxmox.insecureSkipVerfy` is ignored (did you mean `insecureSkipVerify`?)"
                    .to_string(),
            ]
        );
        assert_eq!(c.proxmox.tls, TlsTrust::WebPki);
        let all = problems(&format!("strict: true\n{text}")).join("\n");
        assert!(
            all.contains(
                "unknown key `proxmox.insecureSkipVerfy` (did you mean `insecureSkipVerify`?)"
            ),
            "{all}"
        );
        assert!(all.contains("unknown key `logLevel`"), "{all}");
        assert!(ProviderConfig::parse(&format!("strict: true\n{text}")).is_err());
        let strict_ok = ProviderConfig::parse(
            "strict: true\nproxmox:\n  url: https://pve:8006\n  tokenID: omni@pve!p\n  tokenSecret: abc\n",
        )
        .unwrap();
        assert!(strict_ok.layers.strict && strict_ok.warnings.is_empty());
        assert!(problems("strict: yes please\nproxmox:\n  url: https://x\n  tokenID: a@b!c\n  tokenSecret: s\n")
            .join("")
            .contains("`strict` must be true or false"));
    }

    #[test]
    fn placement_limits_default_and_are_checked() {
        let base = "proxmox:\n  url: https://pve:8006\n  tokenID: omni@pve!p\n  tokenSecret: abc\n";
        let c = ProviderConfig::parse(base).unwrap();
        assert_eq!(c.placement, PlacementLimits::default());
        assert_eq!(
            (c.placement.cpu_overcommit, c.placement.memory_overcommit),
            (4.0, 1.0)
        );
        let c = ProviderConfig::parse(&format!(
            "{base}placement:\n  cpuOvercommit: 2\n  memoryOvercommit: 1.5\n"
        ))
        .unwrap();
        assert_eq!(
            (c.placement.cpu_overcommit, c.placement.memory_overcommit),
            (2.0, 1.5)
        );
        let all = problems(&format!(
            "{base}placement:\n  cpuOvercommit: 0\n  memoryOvercommit: lots\n  cpuOvercomit: 3\n"
        ))
        .join("\n");
        assert!(
            all.contains("`placement.cpuOvercommit` must be a number above 0 and at most 64 (vCPUs given to VMs per CPU of the node, e.g. 4.0), found 0"),
            "{all}"
        );
        assert!(
            all.contains("`placement.memoryOvercommit` must be a number above 0")
                && all.contains("found a string"),
            "{all}"
        );
        assert!(
            all.contains(
                "unknown key `placement.cpuOvercomit` is ignored (did you mean `cpuOvercommit`?)"
            ),
            "{all}"
        );
        assert!(
            problems(&format!("{base}placement: 4\n"))
                .join("")
                .contains("`placement` must be a mapping")
        );
    }

    /// The official provider's credential choice (cmd/omni-infra-provider-proxmox/main.go, the switch
    /// before building the Proxmox client): username and password both set win, else the token pair;
    /// the realm is only used with the password. Same choice here, with a warning.
    #[test]
    fn token_and_password_choose_what_the_official_provider_chooses() {
        let base = "proxmox:\n  url: https://pve:8006\n";
        let c = ProviderConfig::parse(&format!(
            "{base}  tokenID: omni@pve!p\n  tokenSecret: s3cr3t-tok\n  username: root\n  password: s3cr3t-pw\n  realm: pve\n"
        ))
        .unwrap();
        assert!(
            matches!(&c.proxmox.auth, ProxmoxAuth::Password { username, .. } if username == "root@pve"),
            "{:?}",
            c.proxmox.auth
        );
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(
            c.warnings[0].contains("using the password login"),
            "{:?}",
            c.warnings
        );
        assert!(!c.warnings[0].contains("s3cr3t"));

        // A token ID without its secret does not stop a complete password login either.
        let c = ProviderConfig::parse(&format!(
            "{base}  tokenID: omni@pve!p\n  username: root\n  password: pw\n"
        ))
        .unwrap();
        assert!(matches!(c.proxmox.auth, ProxmoxAuth::Password { .. }));
        assert_eq!(c.warnings.len(), 1);

        let c = ProviderConfig::parse(&format!(
            "{base}  tokenID: omni@pve!p\n  tokenSecret: tok\n  username: root\n  realm: pam\n"
        ))
        .unwrap();
        assert!(
            matches!(&c.proxmox.auth, ProxmoxAuth::Token { id, .. } if id == "omni@pve!p"),
            "{:?}",
            c.proxmox.auth
        );
        let all = c.warnings.join("\n");
        assert!(all.contains("`proxmox.username` is ignored"), "{all}");
        assert!(all.contains("`proxmox.realm` is ignored"), "{all}");
    }

    /// As in provider data: an empty key is shown quoted, since "unknown key ``" would name no key.
    #[test]
    fn an_empty_key_is_named_quoted() {
        let p = problems(
            "strict: true\n\"\": 1\nproxmox:\n  url: https://pve:8006\n  tokenID: a@pve!b\n  tokenSecret: c\n  \"\": 2\n",
        );
        assert_eq!(
            p,
            [
                "unknown key `\"\"` (refused because of `strict: true`)",
                "unknown key `proxmox.\"\"` (refused because of `strict: true`)"
            ]
        );
    }

    /// A YAML mistake near the secret: the parser's own message quotes the lines around it.
    #[test]
    fn a_yaml_typo_names_line_and_column_and_never_prints_the_secret() {
        let text = "proxmox:\n  url: https://pve:8006\n  tokenID: omni@pve!p\n  tokenSecret: 0c3b-s3cret-9f2e\n  caFile: [/ca.pem\n";
        let Err(ParseError::Yaml(message)) = ProviderConfig::parse(text) else {
            panic!("a YAML error");
        };
        assert!(message.contains("line 5, column 11"), "{message}");
        assert!(!message.contains("s3cret"), "{message}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, text).unwrap();
        let err = ProviderConfig::load(&path).unwrap_err().to_string();
        assert!(!err.contains("s3cret") && err.contains("line 5"), "{err}");
    }

    #[test]
    fn secrets_come_from_files_read_once_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "tok-s3cret\n").unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "pw-s3cret").unwrap();
        let c = ProviderConfig::parse(&format!(
            "proxmox:\n  url: https://pve:8006\n  tokenID: omni@pve!p\n  tokenSecretFile: {}\n",
            token.display()
        ))
        .unwrap();
        assert!(
            matches!(&c.proxmox.auth, ProxmoxAuth::Token { secret, .. } if secret.expose() == "tok-s3cret")
        );
        assert!(!format!("{c:?}").contains("s3cret"));
        let c = ProviderConfig::parse(&format!(
            "proxmox:\n  url: https://pve:8006\n  username: root\n  passwordFile: {}\n",
            password.display()
        ))
        .unwrap();
        assert!(
            matches!(&c.proxmox.auth, ProxmoxAuth::Password { password, .. } if password.expose() == "pw-s3cret")
        );
        let both = problems(&format!(
            "proxmox:\n  url: https://pve:8006\n  tokenID: omni@pve!p\n  tokenSecret: inline-s3cret\n  tokenSecretFile: {}\n",
            token.display()
        ))
        .join("\n");
        assert!(
            both.contains("keep one") && !both.contains("s3cret"),
            "{both}"
        );
        let missing = problems(
            "proxmox:\n  url: https://pve:8006\n  username: root\n  passwordFile: /nonexistent/pw\n",
        )
        .join("\n");
        assert!(
            missing.contains("`proxmox.passwordFile` /nonexistent/pw"),
            "{missing}"
        );
    }

    #[test]
    fn a_plaintext_proxmox_url_needs_the_opt_in_and_is_warned_about() {
        let base = "proxmox:\n  url: http://pve:8006\n  tokenID: omni@pve!p\n  tokenSecret: abc\n";
        let refused = problems(base).join("\n");
        assert!(
            refused.contains("plaintext") && refused.contains("insecureHTTP"),
            "{refused}"
        );
        let c = ProviderConfig::parse(&format!("{base}  insecureHTTP: true\n")).unwrap();
        assert_eq!(c.proxmox.api_url.scheme(), "http");
        assert!(
            c.warnings.iter().any(|w| w.contains("plaintext")),
            "{:?}",
            c.warnings
        );
    }

    #[test]
    fn the_policy_section_is_read_and_checked_by_key() {
        let base = "proxmox:\n  url: https://pve:8006\n  tokenID: omni@pve!p\n  tokenSecret: abc\n";
        let c = ProviderConfig::parse(&format!(
            "{base}policy:\n  bridges: [vmbr0]\n  vlans: [0, 100-199, '300']\n  templates: [9000, talos]\n"
        ))
        .unwrap();
        assert_eq!(
            format!("{:?}", c.policy),
            r#"Policy { bridges: Some([Name("vmbr0")]), vlans: Some([VlanRange((0, 0)), VlanRange((100, 199)), VlanRange((300, 300))]), pools: None, templates: Some([Name("9000"), Name("talos")]), mappings: None, ha_rules: None }"#
        );
        let all = problems(&format!(
            "{base}policy:\n  bridges: vmbr0\n  vlans: [5000, 9-3]\n  pools: [{{a: 1}}]\n  bridgez: []\n"
        ))
        .join("\n");
        for needle in [
            "`policy.bridges` must be a list",
            "`policy.vlans[0]`",
            "`policy.vlans[1]`",
            "`policy.pools[0]`",
            "`policy.bridgez`",
        ] {
            assert!(all.contains(needle), "{needle} in {all}");
        }
    }

    /// A refused value is left out and the file read again, so every later problem is found too,
    /// list items keep the index they have in the file, and a section written as a list (which
    /// serde would read by position) is refused as not a mapping.
    #[test]
    fn every_refused_value_is_named_where_the_file_has_it() {
        let base = "proxmox:\n  url: https://pve:8006\n  tokenID: omni@pve!p\n  tokenSecret: abc\n";
        let all = problems(&format!(
            "{base}policy:\n  vlans: [x, 7, 5-3, {{}}, 9, y]\n  bridges: [vmbr0, []]\nplacement: [2, 1]\n"
        ));
        assert_eq!(
            all,
            [
                "`placement` must be a mapping, e.g. `placement: {cpuOvercommit: 4.0, memoryOvercommit: 1.0}`, found a list",
                "`policy.bridges[1]` must be a name, found a list",
                "`policy.vlans[0]` \"x\" is not a VLAN tag (0-4094, 0 for untagged) or a range such as 100-199",
                "`policy.vlans[2]` \"5-3\" is not a VLAN tag (0-4094, 0 for untagged) or a range such as 100-199",
                "`policy.vlans[3]` must be a VLAN tag or a range such as 100-199, found a mapping",
                "`policy.vlans[5]` \"y\" is not a VLAN tag (0-4094, 0 for untagged) or a range such as 100-199",
            ]
        );
        assert_eq!(
            problems("proxmox: [https://pve:8006, omni@pve!p, abc]\n"),
            ["`proxmox` must be a mapping of connection settings, found a list"]
        );
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn junk() -> impl Strategy<Value = Value> {
            let leaf = testkit::junk::junk_scalar(vec![
                "",
                " ",
                "https://pve:8006",
                "https://pve:8006/api2/json",
                "http://x",
                "ftp://x",
                "pve:8006",
                "https://[::1",
                "root",
                "root@pam",
                "omni@pve!p",
                "secret",
                "pam",
                "pve",
                "/ca.pem",
                "true",
                "yes",
                "4.0",
                "0",
                "-1",
                "1e400",
                "ünïcødé",
                "10.0.0.0/24",
                "10.0.0.5-10.0.0.9",
                "10.0.0.1",
                "fd00::/64",
                "fd00::1-fd00::9",
                "0.0.0.0/0",
                "::/0",
            ]);
            leaf.prop_recursive(2, 16, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                    prop::collection::btree_map("[a-z]{0,4}", inner, 0..3)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn section(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
            let key = prop_oneof![
                4 => prop::sample::select(keys).prop_map(str::to_string),
                1 => prop_oneof![Just(String::new()), "[a-zA-Z]{1,8}"],
            ];
            prop_oneof![
                4 => prop::collection::btree_map(key, junk(), 0..8)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
                1 => junk(),
            ]
        }

        /// A config file: the known sections and keys with values of any type, unknown keys.
        fn config() -> impl Strategy<Value = Map<String, Value>> {
            (
                prop::option::of(section(keys_of::<ProxmoxFile>())),
                prop::option::of(section(keys_of::<PlacementFile>())),
                prop::option::of(prop_oneof![
                    3 => prop::collection::btree_map("[a-z.-]{0,5}", section(keys_of::<PoolFile>()), 0..3)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                    1 => junk(),
                ]),
                prop::option::of(junk()),
                prop::option::of(junk()),
                prop::option::of(prop_oneof![any::<bool>().prop_map(Value::from), junk()]),
                prop::collection::btree_map(
                    prop_oneof![Just(String::new()), "[a-z]{1,8}"],
                    junk(),
                    0..2,
                ),
            )
                .prop_map(
                    |(proxmox, placement, pools, defaults, nodes, strict, extra)| {
                        let mut m: Map<String, Value> = extra.into_iter().collect();
                        for (k, v) in [
                            ("proxmox", proxmox),
                            ("placement", placement),
                            ("ipPools", pools),
                            ("defaults", defaults),
                            ("nodes", nodes),
                            ("strict", strict),
                        ] {
                            if let Some(v) = v {
                                m.insert(k.to_string(), v);
                            }
                        }
                        m
                    },
                )
        }

        /// The spans of a message in backquotes.
        fn quoted(message: &str) -> Vec<&str> {
            message.split('`').skip(1).step_by(2).collect()
        }

        /// A key path the file can have: a known one, or an unknown one as it is written.
        fn is_key(path: &str, file: &Map<String, Value>) -> bool {
            let path = path.trim_end_matches(':');
            if path.is_empty() || path.ends_with('.') {
                return false;
            }
            let (section, key) = match path.split_once('.') {
                Some((s, k)) => (s, Some(k)),
                None => (path, None),
            };
            let written = |map: Option<&Map<String, Value>>, k: &str| {
                let k = if k == "\"\"" { "" } else { k };
                map.is_some_and(|m| m.contains_key(k))
            };
            match key {
                None => keys_of::<File>().contains(&section) || written(Some(file), section),
                Some(k) => {
                    let known: &[&str] = match section {
                        "proxmox" => keys_of::<ProxmoxFile>(),
                        "placement" => keys_of::<PlacementFile>(),
                        // A pool's name is any key of `ipPools`.
                        "ipPools" => return true,
                        _ => return false,
                    };
                    known.contains(&k) || written(file.get(section).and_then(Value::as_object), k)
                }
            }
        }

        /// The line holding `secret` under `key`, broken the way `mutation` says (a hand edit's
        /// usual slips), inside a config that is otherwise fine.
        fn secret_config(key: &str, secret: &str, mutation: u8, garbage: &str) -> String {
            let login = if key == "password" {
                "  username: root\n"
            } else {
                "  tokenID: omni@pve!p\n"
            };
            let line = match mutation {
                1 => format!("  {key} {secret}\n"),
                2 => format!("  {key}: \"{secret}\n"),
                3 => format!("  {key}: '{secret}\n"),
                4 => format!("\t{key}: {secret}\n"),
                5 => format!(" {key}: {secret}\n"),
                6 => format!("  {key}: {secret}: x\n"),
                7 => format!("  {key}: {secret}\n  {key}: {secret}\n"),
                8 => format!("  {key}: {secret}\n  caFile: [x\n"),
                9 => format!("  {key}:\n    {secret}\n"),
                10 => format!("  {key}: {garbage}{secret}\n"),
                11 => format!("  {key}: {{{secret}\n"),
                12 => format!("  {key}= {secret}: x\n"),
                13 => format!("  {key}{garbage}: {secret}\n"),
                14 => format!("  {garbage}{key}: {secret}{garbage}\n"),
                _ => format!("  {key}: {secret}\n"),
            };
            format!("proxmox:\n  url: https://pve:8006\n{login}{line}  realm: pam\n")
        }

        /// Everything a parse can put in front of a person: the error, the problems, the warnings,
        /// the Debug output of what was read.
        fn everything_said(text: &str) -> String {
            match ProviderConfig::parse(text) {
                Ok(c) => format!("{:?}\n{}", c, c.warnings.join("\n")),
                Err(ParseError::Yaml(e)) => e,
                Err(ParseError::Invalid(problems)) => problems.join("\n"),
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// The secret paths of the config file (inline, from a file, with the YAML around them
            /// broken): no piece of the secret is in any message or Debug output.
            #[test]
            fn no_secret_in_any_message(
                secret in "[A-Za-z0-9]{24}",
                key in prop::sample::select(vec!["tokenSecret", "password"]),
                in_file in any::<bool>(),
                mutation in 0u8..16,
                garbage in "[^\\n]{0,4}",
            ) {
                let dir = tempfile::tempdir().unwrap();
                let text = if in_file {
                    let path = dir.path().join("secret");
                    std::fs::write(&path, format!("{secret}\n")).unwrap();
                    let file_key = format!("{key}File");
                    secret_config(&file_key, &path.display().to_string(), mutation, &garbage)
                } else {
                    secret_config(key, &secret, mutation, &garbage)
                };
                let said = everything_said(&text);
                for piece in secret.as_bytes().windows(6) {
                    let piece = std::str::from_utf8(piece).unwrap();
                    prop_assert!(!said.contains(piece), "{piece:?} of the secret in: {said}\nfrom: {text}");
                }
            }

            /// Any text: parsed or refused, never a panic.
            #[test]
            fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
                let _ = ProviderConfig::parse(&text);
            }

            /// Known keys with values of any type, unknown keys (empty ones too): every problem (and
            /// warning) names a key of the file in backquotes.
            #[test]
            fn config_junk_is_refused_by_key(file in config()) {
                let text = Value::Object(file.clone()).to_string();
                let messages = match ProviderConfig::parse(&text) {
                    Ok(c) => c.warnings,
                    Err(ParseError::Invalid(problems)) => {
                        prop_assert!(!problems.is_empty());
                        problems
                    }
                    Err(ParseError::Yaml(e)) => {
                        prop_assert!(false, "JSON is YAML, yet: {e}");
                        unreachable!()
                    }
                };
                for m in &messages {
                    prop_assert!(
                        quoted(m).iter().any(|q| is_key(q, &file)),
                        "{m:?} names no key of {text}"
                    );
                }
            }
        }
    }
}

//! What a Talos machine needs to join Omni: the extended join token, the kernel arguments and the
//! three-document join config.
//!
//! Omni checks the token's signature by re-marshalling the extra data with Go's `encoding/json` and
//! comparing MACs, so the bytes we sign must equal Go's output exactly (sorted keys, compact, Go's HTML
//! escaping). That is why the JSON here is written by hand instead of with serde_json, whose escaping
//! differs. Everything that embeds the token (kernel args, join config) is a [`Secret`], so none of it
//! can reach a log line or a `Debug` dump.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::secret::Secret;

/// Extra-data key carrying our provider ID; Omni labels the machine's Link with it.
pub const PROVIDER_ID_KEY: &str = "omni.sidero.dev/infra-provider-id";
/// Extra-data key carrying the MachineRequest ID ("encode request IDs into tokens").
pub const MACHINE_REQUEST_KEY: &str = "omni.sidero.dev/machine-request";

/// First host of the SideroLink ULA /64 for an empty installation ID: where Talos sends events and logs.
const SIDEROLINK_HOST: &str = "fdae:41e4:649b:9303::1";

/// Which join-token flavour Omni expects.
///
/// Omni 1.0 and later have a per-provider join token (the `ProviderJoinConfig` resource) and accept
/// `v2:` tokens signed with it; older Omni only has the cluster-wide token in `ConnectionParams` and
/// wants `v1:` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinMode {
    /// `ProviderJoinConfigs/<id>` + `SiderolinkAPIConfigs/siderolink-config`, token prefix `v2:`.
    V2,
    /// `ConnectionParams/siderolink-config`, token prefix `v1:`.
    Legacy,
}

impl JoinMode {
    /// The Go library's rule: v2 exactly when the resource definition
    /// `providerjoinconfigs.omni.sidero.dev` exists in namespace `meta`.
    pub fn detect(provider_join_config_definition_exists: bool) -> Self {
        if provider_join_config_definition_exists {
            JoinMode::V2
        } else {
            JoinMode::Legacy
        }
    }

    fn token_prefix(self) -> &'static str {
        match self {
            JoinMode::V2 => "v2:",
            JoinMode::Legacy => "v1:",
        }
    }
}

/// Everything the connection parameters are made of, as read from Omni and the MachineRequest.
#[derive(Debug, Clone)]
pub struct JoinInputs {
    pub mode: JoinMode,
    /// The plain join token (or an already extended `v1:`/`v2:` one, used unchanged).
    pub join_token: Secret,
    /// The machine API URL (`machine_api_advertised_url` or `ConnectionParams.api_endpoint`).
    pub api_url: String,
    pub events_port: u32,
    pub logs_port: u32,
    /// `MachineRequest.grpc_tunnel == ENABLED`.
    pub grpc_tunnel: bool,
    pub provider_id: String,
    /// Set to encode the request ID into the token (we always do, like the official provider).
    pub request_id: Option<String>,
}

/// Why connection parameters cannot be built. Never contains the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    #[error("the join token from Omni is empty")]
    EmptyToken,
    #[error("the machine API URL from Omni is empty")]
    EmptyApiUrl,
    #[error("the machine API URL from Omni ({url:?}) is not a valid URL: {reason}")]
    InvalidApiUrl { url: String, reason: String },
    #[error("the SideroLink events port from Omni is 0")]
    ZeroEventsPort,
    #[error("the SideroLink logs port from Omni is 0")]
    ZeroLogsPort,
    #[error("the {which} port from Omni ({port}) is larger than 65535")]
    PortOutOfRange { which: &'static str, port: u32 },
    #[error("the infra provider ID is empty")]
    EmptyProviderId,
}

/// The rendered connection parameters. All of it contains the join token, hence all of it is secret.
#[derive(Clone)]
pub struct ConnectionParams {
    /// The extended (`v1:`/`v2:`) join token.
    pub join_token: Secret,
    /// `siderolink.api=…`, `talos.events.sink=…`, `talos.logging.kernel=…`, in that order.
    pub kernel_args: Vec<Secret>,
    /// The multi-document Talos config, delivered as NoCloud user-data.
    pub join_config: Secret,
}

impl fmt::Debug for ConnectionParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionParams")
            .field("join_token", &self.join_token)
            .field("kernel_args", &self.kernel_args.len())
            .field("join_config", &self.join_config)
            .finish()
    }
}

/// Builds the join token, kernel args and join config (§4).
pub fn connection_params(inputs: &JoinInputs) -> Result<ConnectionParams, JoinError> {
    if inputs.join_token.is_empty() {
        return Err(JoinError::EmptyToken);
    }
    if inputs.api_url.trim().is_empty() {
        return Err(JoinError::EmptyApiUrl);
    }
    if inputs.provider_id.is_empty() {
        return Err(JoinError::EmptyProviderId);
    }
    let events_port = check_port(inputs.events_port, "events")?;
    let logs_port = check_port(inputs.logs_port, "logs")?;
    if let Err(e) = url::Url::parse(&inputs.api_url) {
        return Err(JoinError::InvalidApiUrl {
            url: inputs.api_url.clone(),
            reason: e.to_string(),
        });
    }

    let mut extra = BTreeMap::new();
    extra.insert(PROVIDER_ID_KEY.to_string(), inputs.provider_id.clone());
    if let Some(request_id) = &inputs.request_id {
        extra.insert(MACHINE_REQUEST_KEY.to_string(), request_id.clone());
    }
    let token = extended_token(inputs.mode, &inputs.join_token, &extra);

    let api_url = siderolink_api_url(&inputs.api_url, &token, inputs.grpc_tunnel);
    let events_sink = format!("[{SIDEROLINK_HOST}]:{events_port}");
    let logs_url = format!("tcp://[{SIDEROLINK_HOST}]:{logs_port}");

    let kernel_args = vec![
        Secret::new(format!("siderolink.api={api_url}")),
        Secret::new(format!("talos.events.sink={events_sink}")),
        Secret::new(format!("talos.logging.kernel={logs_url}")),
    ];
    let join_config = Secret::new(render_join_config(&api_url, &events_sink, &logs_url));

    Ok(ConnectionParams {
        join_token: token,
        kernel_args,
        join_config,
    })
}

fn check_port(port: u32, which: &'static str) -> Result<u16, JoinError> {
    if port == 0 {
        return Err(if which == "events" {
            JoinError::ZeroEventsPort
        } else {
            JoinError::ZeroLogsPort
        });
    }
    u16::try_from(port).map_err(|_| JoinError::PortOutOfRange { which, port })
}

/// `<prefix><base64({"extra_data":{…},"signature":"…"})>`; a token already carrying a `v1:`/`v2:`
/// prefix is returned unchanged, as the Go library does.
pub fn extended_token(
    mode: JoinMode,
    plain: &Secret,
    extra_data: &BTreeMap<String, String>,
) -> Secret {
    let plain_text = plain.expose();
    if plain_text.starts_with("v1:") || plain_text.starts_with("v2:") {
        return plain.clone();
    }
    let extra_json = go_json_string_map(extra_data);
    let signature = BASE64.encode(sign(plain_text.as_bytes(), extra_json.as_bytes()));
    let body = format!(
        "{{\"extra_data\":{extra_json},\"signature\":{}}}",
        go_json_string(&signature)
    );
    Secret::new(format!("{}{}", mode.token_prefix(), BASE64.encode(body)))
}

fn sign(key: &[u8], message: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length, so construction cannot fail.
    let mut mac = match <Hmac<Sha256> as Mac>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC-SHA256 accepts keys of every length"),
    };
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

/// Go's `json.Marshal(map[string]string)`: keys sorted by bytes (a BTreeMap already is), compact.
fn go_json_string_map(map: &BTreeMap<String, String>) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in map.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&go_json_string(k));
        out.push(':');
        out.push_str(&go_json_string(v));
    }
    out.push('}');
    out
}

/// A JSON string literal escaped the way Go's `encoding/json` does (HTML-safe, Go ≥ 1.22).
fn go_json_string(s: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c if (c as u32) < 0x20 => {
                let b = c as u8;
                out.push_str("\\u00");
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 0xf)] as char);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The API URL with `jointoken` (and `grpc_tunnel=true`) added to its query, re-encoded the way Go's
/// `url.Values.Encode` does (keys sorted, form escaping); everything before the query is kept verbatim.
fn siderolink_api_url(api_url: &str, token: &Secret, grpc_tunnel: bool) -> String {
    let (without_fragment, fragment) = match api_url.split_once('#') {
        Some((a, f)) => (a, Some(f)),
        None => (api_url, None),
    };
    let (base, query) = match without_fragment.split_once('?') {
        Some((b, q)) => (b, q),
        None => (without_fragment, ""),
    };
    let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        values
            .entry(query_unescape(k))
            .or_default()
            .push(query_unescape(v));
    }
    values
        .entry("jointoken".into())
        .or_default()
        .push(token.expose().to_string());
    if grpc_tunnel {
        values
            .entry("grpc_tunnel".into())
            .or_default()
            .push("true".into());
    }
    let encoded: Vec<String> = values
        .iter()
        .flat_map(|(k, vs)| {
            vs.iter()
                .map(move |v| format!("{}={}", query_escape(k), query_escape(v)))
        })
        .collect();
    let mut out = format!("{base}?{}", encoded.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// Go's `url.QueryEscape`.
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Go's `url.QueryUnescape`, lenient: a malformed escape is kept as written.
fn query_unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len()
                && bytes[i + 1].is_ascii_hexdigit()
                && bytes[i + 2].is_ascii_hexdigit() =>
            {
                out.push(hex_value(bytes[i + 1]) << 4 | hex_value(bytes[i + 2]));
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_value(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        b'A'..=b'F' => b - b'A' + 10,
        _ => 0,
    }
}

/// The three Talos documents, apiVersion and kind first, `---` between them, trailing newline.
fn render_join_config(api_url: &str, events_sink: &str, logs_url: &str) -> String {
    format!(
        "apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: {}\n---\n\
         apiVersion: v1alpha1\nkind: EventSinkConfig\nendpoint: {}\n---\n\
         apiVersion: v1alpha1\nkind: KmsgLogConfig\nname: omni-kmsg\nurl: {}\n",
        yaml_scalar(api_url),
        yaml_scalar(events_sink),
        yaml_scalar(logs_url)
    )
}

/// A YAML scalar: plain when it is unambiguous, else single-quoted (as the Go emitter does for
/// `[fdae:…]:port`, which would otherwise start a flow sequence).
fn yaml_scalar(s: &str) -> String {
    let plain_safe = !s.is_empty()
        && s.chars().all(|c| c.is_ascii_graphic())
        && !s.starts_with(|c: char| "[]{}!&*#|>'\"%@`,?:-".contains(c))
        && !s.contains(": ")
        && !s.contains(" #")
        && !s.ends_with(':');
    if plain_safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}

/// A decoded extended token, for checks and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedToken {
    pub version: u8,
    pub extra_data: BTreeMap<String, String>,
    /// Base64 of the 32-byte MAC.
    pub signature: String,
}

/// Decodes an extended token (not its signature check: see [`verify`]).
pub fn decode(token: &Secret) -> Option<DecodedToken> {
    let text = token.expose();
    let (version, rest) = if let Some(r) = text.strip_prefix("v1:") {
        (1, r)
    } else if let Some(r) = text.strip_prefix("v2:") {
        (2, r)
    } else {
        return None;
    };
    let json = BASE64.decode(rest).ok()?;
    #[derive(serde::Deserialize)]
    struct Body {
        extra_data: BTreeMap<String, String>,
        signature: String,
    }
    let body: Body = serde_json::from_slice(&json).ok()?;
    Some(DecodedToken {
        version,
        extra_data: body.extra_data,
        signature: body.signature,
    })
}

/// Whether the token's MAC matches `plain` as key, the way Omni checks it.
pub fn verify(token: &Secret, plain: &Secret) -> bool {
    let Some(decoded) = decode(token) else {
        return false;
    };
    let expected = BASE64.encode(sign(
        plain.expose().as_bytes(),
        go_json_string_map(&decoded.extra_data).as_bytes(),
    ));
    expected == decoded.signature
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn inputs() -> JoinInputs {
        JoinInputs {
            mode: JoinMode::V2,
            join_token: Secret::new("abcd"),
            api_url: "https://127.0.0.1:8099".into(),
            events_port: 8091,
            logs_port: 8092,
            grpc_tunnel: false,
            provider_id: "test".into(),
            request_id: None,
        }
    }

    fn json_of(token: &Secret) -> String {
        let text = token.expose();
        String::from_utf8(BASE64.decode(&text[3..]).unwrap()).unwrap()
    }

    #[test]
    fn reference_vector_provider_only() {
        let params = connection_params(&inputs()).unwrap();
        assert!(params.join_token.expose().starts_with("v2:"));
        assert_eq!(
            json_of(&params.join_token),
            r#"{"extra_data":{"omni.sidero.dev/infra-provider-id":"test"},"signature":"Y3igo9WlIIVNYjWfh2ZX96zgYnTB9pY27dBZVrp42Lg="}"#
        );
    }

    #[test]
    fn reference_vector_with_request_id() {
        let params = connection_params(&JoinInputs {
            request_id: Some("request1".into()),
            ..inputs()
        })
        .unwrap();
        let decoded = decode(&params.join_token).unwrap();
        assert_eq!(
            decoded.signature,
            "zYkLTp9EHjypLlkdmff5vgP5HDWFKTQpFGo5DJvL5x0="
        );
        assert_eq!(
            decoded
                .extra_data
                .get(MACHINE_REQUEST_KEY)
                .map(String::as_str),
            Some("request1")
        );
        assert!(verify(&params.join_token, &Secret::new("abcd")));
        assert!(!verify(&params.join_token, &Secret::new("abce")));
    }

    #[test]
    fn legacy_mode_uses_v1() {
        let params = connection_params(&JoinInputs {
            mode: JoinMode::Legacy,
            ..inputs()
        })
        .unwrap();
        assert!(params.join_token.expose().starts_with("v1:"));
        assert_eq!(decode(&params.join_token).unwrap().version, 1);
        assert_eq!(JoinMode::detect(true), JoinMode::V2);
        assert_eq!(JoinMode::detect(false), JoinMode::Legacy);
    }

    #[test]
    fn prefixed_tokens_are_used_unchanged() {
        for t in ["v1:already", "v2:eyJ4Ijp9"] {
            let params = connection_params(&JoinInputs {
                join_token: Secret::new(t),
                request_id: Some("r".into()),
                ..inputs()
            })
            .unwrap();
            assert_eq!(params.join_token.expose(), t);
        }
    }

    #[test]
    fn go_escaping() {
        assert_eq!(
            go_json_string("a<b>&c\u{2028}\u{2029}/"),
            r#""a\u003cb\u003e\u0026c\u2028\u2029/""#
        );
        assert_eq!(
            go_json_string("q\"\\\n\r\t\u{1}\u{8}\u{c}"),
            r#""q\"\\\n\r\t\u0001\b\f""#
        );
        assert_eq!(go_json_string("é"), "\"é\"");
    }

    #[test]
    fn kernel_args_follow_go_query_encoding() {
        let params = connection_params(&JoinInputs {
            api_url: "https://omni.example.com:8090/some/path?b=x y&a=1".into(),
            grpc_tunnel: true,
            ..inputs()
        })
        .unwrap();
        let token = params.join_token.expose().to_string();
        let api = params.kernel_args[0].expose();
        let escaped: String = query_escape(&token);
        assert_eq!(
            api,
            format!(
                "siderolink.api=https://omni.example.com:8090/some/path?a=1&b=x+y&grpc_tunnel=true&jointoken={escaped}"
            )
        );
        assert!(escaped.starts_with("v2%3A"));
        assert_eq!(
            params.kernel_args[1].expose(),
            "talos.events.sink=[fdae:41e4:649b:9303::1]:8091"
        );
        assert_eq!(
            params.kernel_args[2].expose(),
            "talos.logging.kernel=tcp://[fdae:41e4:649b:9303::1]:8092"
        );
    }

    #[test]
    fn join_config_has_three_documents() {
        let params = connection_params(&inputs()).unwrap();
        let text = params.join_config.expose();
        let docs: Vec<&str> = text.split("\n---\n").collect();
        assert_eq!(docs.len(), 3);
        assert!(text.ends_with('\n'));
        assert!(docs[0].starts_with("apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: https://127.0.0.1:8099?jointoken=v2%3A"));
        assert_eq!(
            docs[1],
            "apiVersion: v1alpha1\nkind: EventSinkConfig\nendpoint: '[fdae:41e4:649b:9303::1]:8091'"
        );
        assert_eq!(
            docs[2],
            "apiVersion: v1alpha1\nkind: KmsgLogConfig\nname: omni-kmsg\nurl: tcp://[fdae:41e4:649b:9303::1]:8092\n"
        );
        // Parses as YAML documents with the values we meant.
        let first = crate::yaml::from_str(docs[0]).unwrap();
        assert_eq!(
            first["apiUrl"].as_str().unwrap(),
            params.kernel_args[0]
                .expose()
                .trim_start_matches("siderolink.api=")
        );
        let second = crate::yaml::from_str(docs[1]).unwrap();
        assert_eq!(second["endpoint"], "[fdae:41e4:649b:9303::1]:8091");
    }

    #[test]
    fn validation_errors() {
        let bad = |f: fn(&mut JoinInputs)| {
            let mut i = inputs();
            f(&mut i);
            connection_params(&i).unwrap_err()
        };
        assert_eq!(
            bad(|i| i.join_token = Secret::new("")),
            JoinError::EmptyToken
        );
        assert_eq!(bad(|i| i.api_url = String::new()), JoinError::EmptyApiUrl);
        assert_eq!(bad(|i| i.events_port = 0), JoinError::ZeroEventsPort);
        assert_eq!(bad(|i| i.logs_port = 0), JoinError::ZeroLogsPort);
        assert_eq!(
            bad(|i| i.provider_id = String::new()),
            JoinError::EmptyProviderId
        );
        assert!(matches!(
            bad(|i| i.api_url = "not a url".into()),
            JoinError::InvalidApiUrl { .. }
        ));
        assert!(matches!(
            bad(|i| i.logs_port = 70000),
            JoinError::PortOutOfRange { .. }
        ));
    }

    #[test]
    fn secrets_stay_out_of_debug() {
        let params = connection_params(&JoinInputs {
            join_token: Secret::new("hunter2hunter2"),
            ..inputs()
        })
        .unwrap();
        let dump = format!("{params:?} {:?}", inputs());
        assert!(!dump.contains("hunter2"));
        assert!(!dump.contains(&params.join_token.expose()[3..20]));
    }

    proptest! {
        #[test]
        fn any_extra_data_signs_and_verifies(
            key in "[ -~]{1,40}",
            entries in proptest::collection::btree_map("[\\PC<>&\u{2028}]{0,12}", "[\\PC<>&\u{2029}\n]{0,12}", 0..4),
        ) {
            prop_assume!(!key.starts_with("v1:") && !key.starts_with("v2:"));
            let token = extended_token(JoinMode::V2, &Secret::new(key.clone()), &entries);
            let decoded = decode(&token).unwrap();
            prop_assert_eq!(&decoded.extra_data, &entries);
            prop_assert!(verify(&token, &Secret::new(key)));
        }

        #[test]
        fn query_escape_round_trips(s in "\\PC{0,30}") {
            prop_assert_eq!(query_unescape(&query_escape(&s)), s);
        }
    }
}

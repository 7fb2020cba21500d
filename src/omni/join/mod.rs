//! What a Talos machine needs to join Omni: the three-document join config, which carries the
//! extended join token in its SideroLink API URL.
//!
//! Omni checks the token's signature by re-marshalling the extra data with Go's `encoding/json` and
//! comparing MACs, so the bytes we sign must equal Go's output exactly (sorted keys, compact, Go's HTML
//! escaping). That is why the JSON here is serde_json's with Go's HTML escaping added. The join
//! config embeds the token, so it is a [`Secret`] and cannot reach a log line or a `Debug` dump.

mod render;

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::resources::{PROVIDER_JOIN_CONFIG_DEFINITION_ID, RESOURCE_DEFINITION, label};
use super::state::{StateClient, StateError};
use crate::secret::Secret;
use render::{render_join_config, siderolink_api_url};

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
    pub async fn detect(state: &StateClient) -> Result<Self, StateError> {
        let defs = state.list(&RESOURCE_DEFINITION, &[]).await?;
        let v2 = (defs.iter()).any(|d| d.id() == PROVIDER_JOIN_CONFIG_DEFINITION_ID);
        Ok(if v2 { JoinMode::V2 } else { JoinMode::Legacy })
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
    /// Encoded into the token, as the official provider does.
    pub request_id: String,
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
    #[error("the SideroLink {which} port from Omni is 0")]
    ZeroPort { which: &'static str },
    #[error("the {which} port from Omni ({port}) is larger than 65535")]
    PortOutOfRange { which: &'static str, port: u32 },
    #[error("the infra provider ID is empty")]
    EmptyProviderId,
}

/// Builds the join token and the join config that carries it (§4): the multi-document Talos config,
/// delivered as NoCloud user-data, secret because of the token.
pub fn connection_params(inputs: &JoinInputs) -> Result<Secret, JoinError> {
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
    url::Url::parse(&inputs.api_url).map_err(|e| JoinError::InvalidApiUrl {
        url: inputs.api_url.clone(),
        reason: e.to_string(),
    })?;

    // The extra data carries our provider ID (Omni labels the machine's Link with it) and the
    // MachineRequest ID ("encode request IDs into tokens"), under the label keys.
    let extra = BTreeMap::from([
        (
            label::INFRA_PROVIDER_ID.to_owned(),
            inputs.provider_id.clone(),
        ),
        (label::MACHINE_REQUEST.to_owned(), inputs.request_id.clone()),
    ]);
    let token = extended_token(inputs.mode, &inputs.join_token, &extra);

    let api_url = siderolink_api_url(&inputs.api_url, &token, inputs.grpc_tunnel);
    Ok(render_join_config(&api_url, events_port, logs_port))
}

fn check_port(port: u32, which: &'static str) -> Result<u16, JoinError> {
    match u16::try_from(port) {
        Ok(0) => Err(JoinError::ZeroPort { which }),
        Ok(port) => Ok(port),
        Err(_) => Err(JoinError::PortOutOfRange { which, port }),
    }
}

// ---- the extended join token: the plain token's HMAC over the extra data, marshalled exactly as
// Go's `encoding/json` marshals it, because Omni checks the MAC over its own re-marshalling.

/// `<prefix><base64({"extra_data":{…},"signature":"…"})>`; a token already carrying a `v1:`/`v2:`
/// prefix is returned unchanged, as the Go library does.
fn extended_token(mode: JoinMode, plain: &Secret, extra_data: &BTreeMap<String, String>) -> Secret {
    let plain_text = plain.expose();
    if plain_text.starts_with("v1:") || plain_text.starts_with("v2:") {
        return plain.clone();
    }
    let extra_json = go_json(extra_data);
    let signature = BASE64.encode(sign(plain_text.as_bytes(), extra_json.as_bytes()));
    let body = go_json(&Body {
        extra_data: extra_data.clone(),
        signature,
    });
    let prefix = match mode {
        JoinMode::V2 => "v2:",
        JoinMode::Legacy => "v1:",
    };
    Secret::new(format!("{prefix}{}", BASE64.encode(body)))
}

/// The token's JSON body; fields in Go's order (the struct's, which is also sorted).
#[derive(serde::Serialize)]
#[cfg_attr(test, derive(serde::Deserialize))]
struct Body {
    extra_data: BTreeMap<String, String>,
    signature: String,
}

fn sign(key: &[u8], message: &[u8]) -> Vec<u8> {
    let Ok(mac) = <Hmac<Sha256> as Mac>::new_from_slice(key) else {
        unreachable!("HMAC-SHA256 accepts keys of every length")
    };
    mac.chain_update(message).finalize().into_bytes().to_vec()
}

/// `value` as Go's `json.Marshal` writes it (Go ≥ 1.22): compact, map keys sorted (a BTreeMap
/// already is), and HTML-safe. serde_json escapes control characters as Go does (`\b`, `\f`, `\n`,
/// `\u00XX` in lower-case hex) but leaves `<`, `>`, `&`, U+2028 and U+2029 as they are, which Go
/// escapes; they can only occur inside strings, so escaping them afterwards is exact.
fn go_json(value: &impl serde::Serialize) -> String {
    let json = serde_json::to_string(value).unwrap_or_default();
    ['<', '>', '&', '\u{2028}', '\u{2029}']
        .into_iter()
        .fold(json, |json, c| {
            json.replace(c, &format!("\\u{:04x}", c as u32))
        })
}

/// Reading a token back, the way Omni does: only the tests check our tokens with it.
#[cfg(test)]
mod decoding {
    use super::*;

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
        let (version, rest) = [(1, "v1:"), (2, "v2:")]
            .into_iter()
            .find_map(|(version, prefix)| Some((version, text.strip_prefix(prefix)?)))?;
        let json = BASE64.decode(rest).ok()?;
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
            go_json(&decoded.extra_data).as_bytes(),
        ));
        expected == decoded.signature
    }
}

#[cfg(test)]
mod tests {
    use super::decoding::{decode, verify};
    use super::render::query_escape;
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
            request_id: "request1".into(),
        }
    }

    /// The SideroLink API URL of the join config.
    fn api_url(join_config: &Secret) -> String {
        let text = join_config.expose();
        let first = crate::yaml::from_str(text.split("\n---\n").next().unwrap()).unwrap();
        first["apiUrl"].as_str().unwrap().to_owned()
    }

    /// The extended token in the join config.
    fn token(params: &Secret) -> Secret {
        let url = url::Url::parse(&api_url(params)).unwrap();
        let (_, token) = url.query_pairs().find(|(k, _)| k == "jointoken").unwrap();
        Secret::new(token.into_owned())
    }

    fn json_of(token: &Secret) -> String {
        let text = token.expose();
        String::from_utf8(BASE64.decode(&text[3..]).unwrap()).unwrap()
    }

    #[test]
    fn reference_vector_provider_only() {
        let extra = BTreeMap::from([(label::INFRA_PROVIDER_ID.to_owned(), "test".to_owned())]);
        let token = extended_token(JoinMode::V2, &Secret::new("abcd"), &extra);
        assert!(token.expose().starts_with("v2:"));
        assert_eq!(
            json_of(&token),
            r#"{"extra_data":{"omni.sidero.dev/infra-provider-id":"test"},"signature":"Y3igo9WlIIVNYjWfh2ZX96zgYnTB9pY27dBZVrp42Lg="}"#
        );
    }

    #[test]
    fn reference_vector_with_request_id() {
        let token = token(&connection_params(&inputs()).unwrap());
        let decoded = decode(&token).unwrap();
        assert_eq!(
            decoded.signature,
            "zYkLTp9EHjypLlkdmff5vgP5HDWFKTQpFGo5DJvL5x0="
        );
        assert_eq!(
            decoded
                .extra_data
                .get(label::MACHINE_REQUEST)
                .map(String::as_str),
            Some("request1")
        );
        assert!(verify(&token, &Secret::new("abcd")));
        assert!(!verify(&token, &Secret::new("abce")));
    }

    #[test]
    fn legacy_mode_uses_v1() {
        let params = connection_params(&JoinInputs {
            mode: JoinMode::Legacy,
            ..inputs()
        })
        .unwrap();
        assert!(token(&params).expose().starts_with("v1:"));
        assert_eq!(decode(&token(&params)).unwrap().version, 1);
    }

    #[test]
    fn prefixed_tokens_are_used_unchanged() {
        for t in ["v1:already", "v2:eyJ4Ijp9"] {
            let params = connection_params(&JoinInputs {
                join_token: Secret::new(t),
                ..inputs()
            })
            .unwrap();
            assert_eq!(token(&params).expose(), t);
        }
    }

    #[test]
    fn kernel_args_follow_go_query_encoding() {
        let params = connection_params(&JoinInputs {
            api_url: "https://omni.example.com:8090/some/path?b=x y&a=1".into(),
            grpc_tunnel: true,
            ..inputs()
        })
        .unwrap();
        let escaped: String = query_escape(token(&params).expose());
        assert_eq!(
            api_url(&params),
            format!(
                "https://omni.example.com:8090/some/path?a=1&b=x+y&grpc_tunnel=true&jointoken={escaped}"
            )
        );
        assert!(escaped.starts_with("v2%3A"));
    }

    #[test]
    fn join_config_has_three_documents() {
        let params = connection_params(&inputs()).unwrap();
        let text = params.expose();
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
        assert!(api_url(&params).starts_with("https://127.0.0.1:8099?jointoken=v2%3A"));
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
        let zero = |which| JoinError::ZeroPort { which };
        assert_eq!(bad(|i| i.events_port = 0), zero("events"));
        assert_eq!(bad(|i| i.logs_port = 0), zero("logs"));
        assert_eq!(
            zero("events").to_string(),
            "the SideroLink events port from Omni is 0"
        );
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
        assert!(!dump.contains(&token(&params).expose()[3..20]));
    }

    #[test]
    fn go_escaping() {
        assert_eq!(
            go_json(&"a<b>&c\u{2028}\u{2029}/"),
            r#""a\u003cb\u003e\u0026c\u2028\u2029/""#
        );
        assert_eq!(
            go_json(&"q\"\\\n\r\t\u{1}\u{8}\u{c}"),
            r#""q\"\\\n\r\t\u0001\b\f""#
        );
        assert_eq!(go_json(&"é"), "\"é\"");
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
    }
}

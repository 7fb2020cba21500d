//! The extended join token: the plain token's HMAC over the extra data, marshalled exactly as Go's
//! `encoding/json` marshals it, because Omni checks the MAC over its own re-marshalling.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::JoinMode;
use crate::secret::Secret;

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

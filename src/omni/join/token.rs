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
    let extra_json = go_json(extra_data);
    let signature = BASE64.encode(sign(plain_text.as_bytes(), extra_json.as_bytes()));
    let body = go_json(&Body {
        extra_data: extra_data.clone(),
        signature,
    });
    Secret::new(format!("{}{}", mode.token_prefix(), BASE64.encode(body)))
}

/// The token's JSON body; fields in Go's order (the struct's, which is also sorted).
#[derive(serde::Serialize)]
#[cfg_attr(test, derive(serde::Deserialize))]
struct Body {
    extra_data: BTreeMap<String, String>,
    signature: String,
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

/// `value` as Go's `json.Marshal` writes it (Go ≥ 1.22): compact, map keys sorted (a BTreeMap
/// already is), and HTML-safe. serde_json escapes control characters as Go does (`\b`, `\f`, `\n`,
/// `\u00XX` in lower-case hex) but leaves `<`, `>`, `&`, U+2028 and U+2029 as they are, which Go
/// escapes; they can only occur inside strings, so escaping them afterwards is exact.
fn go_json(value: &impl serde::Serialize) -> String {
    let json = serde_json::to_string(value).unwrap_or_default();
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

/// Reading a token back, the way Omni does: only the tests check our tokens with it.
#[cfg(test)]
pub(super) mod decoding {
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
    use super::*;
    use proptest::prelude::*;

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

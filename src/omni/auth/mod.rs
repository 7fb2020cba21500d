//! The infra-provider key and Omni's per-call request signature.
//!
//! Omni authenticates every gRPC call by an OpenPGP detached signature over a small JSON payload that
//! names the method and ten metadata headers. [`ProviderKey`] parses the key the user got from
//! `omnictl infraprovider create` and produces the three signature headers. The server half, Omni's
//! check, lives with the in-memory Omni in the `testkit` crate and builds the payload with the same
//! [`payload_json`], so a mismatch between the halves cannot hide a bug in one: the tests also check
//! our signatures with `gpg`.
//!
//! The key never leaves this module in printable form: [`ProviderKey`]'s `Debug` shows only the
//! identity and fingerprint, and no error carries key bytes or the key JSON.

mod key;
mod sign;

use std::collections::BTreeMap;

pub use key::{
    INFRA_PROVIDER_EMAIL_DOMAIN, INFRA_PROVIDER_NAME_PREFIX, KeyError, ProviderKey,
    encode_key_json, generate_key,
};
pub use sign::SignedHeaders;

/// Metadata key carrying the signing time (Unix seconds).
pub const TIMESTAMP_HEADER: &str = "x-sidero-timestamp";
/// Metadata key carrying the signed JSON payload, verbatim.
pub const PAYLOAD_HEADER: &str = "x-sidero-payload";
/// Metadata key carrying `siderov1 <identity> <fingerprint> <base64 signature>`.
pub const SIGNATURE_HEADER: &str = "x-sidero-signature";
/// The only signature scheme Omni knows.
pub const SIGNATURE_VERSION: &str = "siderov1";

/// The ten metadata keys whose values are part of the signed payload.
///
/// Go serialises the payload's header map with sorted keys; this list is in that order so the
/// payload we sign is byte-identical to the Go client's.
pub const SIGNED_HEADERS: [&str; 10] = [
    "authorization",
    "cluster",
    "context",
    "fieldSelectors",
    "namespace",
    "nodes",
    "runtime",
    "selectors",
    "uid",
    TIMESTAMP_HEADER,
];

/// Could not produce a signature (never expected with a key that parsed; reported, not panicked on).
#[derive(Debug, thiserror::Error)]
#[error("cannot sign the Omni request: {0}")]
pub struct SignError(String);

/// The signed payload: compact JSON, `headers` keys sorted, absent headers as `null` (never `[]`,
/// which Omni rejects), then `method`. Pure, shared by the signer and the verifier's tests.
pub fn payload_json(method: &str, present: &BTreeMap<&str, Vec<String>>) -> String {
    let headers: BTreeMap<&str, Option<&Vec<String>>> = SIGNED_HEADERS
        .iter()
        .map(|&k| (k, present.get(k).filter(|v| !v.is_empty())))
        .collect();
    serde_json::json!({ "headers": headers, "method": method }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_matches_go_layout() {
        let mut h = BTreeMap::new();
        h.insert(TIMESTAMP_HEADER, vec!["1767225600".to_owned()]);
        assert_eq!(
            payload_json("/cosi.resource.State/List", &h),
            r#"{"headers":{"authorization":null,"cluster":null,"context":null,"fieldSelectors":null,"namespace":null,"nodes":null,"runtime":null,"selectors":null,"uid":null,"x-sidero-timestamp":["1767225600"]},"method":"/cosi.resource.State/List"}"#
        );
    }
}

//! The infra-provider key and Omni's per-call request signature.
//!
//! Omni authenticates every gRPC call by an OpenPGP detached signature over a small JSON payload that
//! names the method and ten metadata headers. [`ProviderKey`] parses the key the user got from
//! `omnictl infraprovider create` and signs the payload of each call. The server half, Omni's
//! check, lives with the in-memory Omni in the `testkit` crate and reads the payload as Omni does;
//! the tests also check our signatures with `gpg`.
//!
//! The key never leaves this module in printable form: [`ProviderKey`]'s `Debug` shows only the
//! identity and fingerprint, and no error carries key bytes or the key JSON.

mod key;

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use pgp::composed::DetachedSignature;
use pgp::crypto::hash::HashAlgorithm;
use pgp::ser::Serialize as _;
use pgp::types::Password;
use tonic::Status;

pub use key::{KeyError, ProviderKey};

/// Metadata key carrying the signing time (Unix seconds).
pub const TIMESTAMP_HEADER: &str = "x-sidero-timestamp";
/// Metadata key carrying the signed JSON payload, verbatim.
pub const PAYLOAD_HEADER: &str = "x-sidero-payload";
/// Metadata key carrying `siderov1 <identity> <fingerprint> <base64 signature>`.
pub const SIGNATURE_HEADER: &str = "x-sidero-signature";
/// The only signature scheme Omni knows.
pub const SIGNATURE_VERSION: &str = "siderov1";

impl ProviderKey {
    /// The `x-sidero-signature` value for an exact payload string: a binary detached signature
    /// (SHA-512 like gopenpgp: the server accepts any SHA-2, we pick the gopenpgp v2 default).
    /// Failing to sign is never expected with a key that parsed: reported as the call's failure,
    /// not panicked on.
    pub fn signature_header(&self, payload: &str) -> Result<String, Status> {
        let sig = DetachedSignature::sign_binary_data(
            rand::rngs::OsRng,
            &self.key.primary_key,
            &Password::empty(),
            HashAlgorithm::Sha512,
            payload.as_bytes(),
        )
        .and_then(|sig| sig.to_bytes())
        .map_err(|e| Status::unknown(format!("cannot sign the Omni request: {e}")))?;
        Ok(format!(
            "{SIGNATURE_VERSION} {} {} {}",
            self.identity,
            self.fingerprint,
            STANDARD.encode(sig)
        ))
    }

    /// Signs a call to `method` (full gRPC path) made at `unix_secs`, whose only signed header is the
    /// timestamp (a provider never sends the other nine): the payload and the signature headers.
    pub fn sign_call(&self, method: &str, unix_secs: i64) -> Result<(String, String), Status> {
        let payload = payload_json(method, unix_secs);
        let signature = self.signature_header(&payload)?;
        Ok((payload, signature))
    }
}

/// The signed payload: compact JSON, `headers` then `method`. The headers are the ten Omni signs,
/// keys sorted as Go serialises a map, the nine a provider never sends as `null` (never `[]`, which
/// Omni rejects).
fn payload_json(method: &str, unix_secs: i64) -> String {
    let absent =
        "authorization cluster context fieldSelectors namespace nodes runtime selectors uid";
    let mut headers: BTreeMap<&str, serde_json::Value> = (absent.split(' '))
        .map(|k| (k, serde_json::Value::Null))
        .collect();
    headers.insert(TIMESTAMP_HEADER, [unix_secs.to_string()].into());
    serde_json::json!({ "headers": headers, "method": method }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_matches_go_layout() {
        assert_eq!(
            payload_json("/cosi.resource.State/List", 1767225600),
            r#"{"headers":{"authorization":null,"cluster":null,"context":null,"fieldSelectors":null,"namespace":null,"nodes":null,"runtime":null,"selectors":null,"uid":null,"x-sidero-timestamp":["1767225600"]},"method":"/cosi.resource.State/List"}"#
        );
    }
}

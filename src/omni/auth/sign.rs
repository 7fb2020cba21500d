//! The client half of Omni's request signature: the three headers that authenticate one call.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use pgp::composed::DetachedSignature;
use pgp::crypto::hash::HashAlgorithm;
use pgp::ser::Serialize as _;
use pgp::types::Password;

use super::{ProviderKey, SIGNATURE_VERSION, SignError, TIMESTAMP_HEADER, payload_json};

/// The three headers that authenticate one call.
#[derive(Clone)]
pub struct SignedHeaders {
    pub timestamp: String,
    pub payload: String,
    pub signature: String,
}

impl fmt::Debug for SignedHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignedHeaders")
            .field("timestamp", &self.timestamp)
            .finish_non_exhaustive()
    }
}

impl ProviderKey {
    /// The `x-sidero-signature` value for an exact payload string: a binary detached signature
    /// (SHA-512 like gopenpgp: the server accepts any SHA-2, we pick the gopenpgp v2 default).
    pub fn signature_header(&self, payload: &str) -> Result<String, SignError> {
        let sig = DetachedSignature::sign_binary_data(
            rand::rngs::OsRng,
            &self.key.primary_key,
            &Password::empty(),
            HashAlgorithm::Sha512,
            payload.as_bytes(),
        )
        .and_then(|sig| sig.to_bytes())
        .map_err(|e| SignError(e.to_string()))?;
        Ok(format!(
            "{SIGNATURE_VERSION} {} {} {}",
            self.identity,
            self.fingerprint,
            STANDARD.encode(sig)
        ))
    }

    /// Signs a call to `method` (full gRPC path) made at `unix_secs`, whose only signed header is the
    /// timestamp (a provider never sends the other nine).
    pub fn sign_call(&self, method: &str, unix_secs: i64) -> Result<SignedHeaders, SignError> {
        let timestamp = unix_secs.to_string();
        let mut headers = BTreeMap::new();
        headers.insert(TIMESTAMP_HEADER, vec![timestamp.clone()]);
        let payload = payload_json(method, &headers);
        let signature = self.signature_header(&payload)?;
        Ok(SignedHeaders {
            timestamp,
            payload,
            signature,
        })
    }
}

//! The server half of Omni's request signature, re-implementing Omni's checks so the in-memory
//! Omni rejects exactly what the real one rejects.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use pgp::composed::{Deserializable, DetachedSignature, SignedPublicKey};
use pgp::crypto::hash::HashAlgorithm;
use pgp::types::KeyDetails;
use tonic::metadata::MetadataMap;

use omni_infra_provider_proxmox::omni::auth::{
    KeyError, PAYLOAD_HEADER, SIGNATURE_HEADER, SIGNATURE_VERSION, TIMESTAMP_HEADER,
};

/// The ten metadata keys whose values are part of the signed payload (`docs/omni-protocol.md`).
const SIGNED_HEADERS: [&str; 10] = [
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

/// Timestamps and signature creation times may be this far from the server clock.
pub const MAX_CLOCK_SKEW_SECS: i64 = 5 * 60;

/// Why the server refused a call's signature. All but `Malformed` map to `Unauthenticated`
/// "invalid signature", as Omni answers; the variant is for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("invalid signature: missing {0} header")]
    Missing(&'static str),
    /// Fewer than four parts: Omni panics and answers `Internal`.
    #[error("malformed signature header")]
    Malformed,
    #[error("invalid signature: {0}")]
    Invalid(String),
}

impl From<VerifyError> for tonic::Status {
    fn from(e: VerifyError) -> Self {
        match e {
            VerifyError::Malformed => tonic::Status::internal("malformed signature header"),
            _ => tonic::Status::unauthenticated("invalid signature"),
        }
    }
}

/// A public key Omni knows, with the identity it authenticates as.
#[derive(Clone, Debug)]
pub struct RegisteredKey {
    pub identity: String,
    pub key: SignedPublicKey,
}

/// Omni's server-side check against a set of registered public keys.
#[derive(Clone, Debug, Default)]
pub struct Verifier {
    keys: BTreeMap<String, RegisteredKey>,
}

impl Verifier {
    /// Registers an armored public key for `identity` (e.g. `infra-provider:proxmox`); returns its
    /// fingerprint.
    pub fn register(&mut self, identity: &str, armored_public: &str) -> Result<String, KeyError> {
        let (key, _) = SignedPublicKey::from_string(armored_public)
            .map_err(|e| KeyError::InvalidKey(e.to_string()))?;
        let fingerprint = format!("{:x}", key.primary_key.fingerprint());
        self.keys.insert(
            fingerprint.clone(),
            RegisteredKey {
                identity: identity.to_owned(),
                key,
            },
        );
        Ok(fingerprint)
    }

    /// Checks the signature of a call to `method` received at `now_unix`; returns the identity of
    /// the registered key that made it.
    pub fn verify(
        &self,
        method: &str,
        metadata: &MetadataMap,
        now_unix: i64,
    ) -> Result<String, VerifyError> {
        let header = |name: &'static str| -> Result<&str, VerifyError> {
            metadata
                .get(name)
                .ok_or(VerifyError::Missing(name))?
                .to_str()
                .map_err(|_| VerifyError::Invalid(format!("{name} is not ASCII")))
        };
        let signature = header(SIGNATURE_HEADER)?;
        let parts: Vec<&str> = signature.split(' ').collect();
        if parts.len() < 4 {
            return Err(VerifyError::Malformed);
        }
        if parts[0] != SIGNATURE_VERSION {
            return Err(VerifyError::Invalid("unknown signature version".into()));
        }
        let fingerprint = parts[2];
        let sig_bytes = STANDARD
            .decode(parts[3])
            .map_err(|_| VerifyError::Invalid("signature is not base64".into()))?;

        let ts: i64 = header(TIMESTAMP_HEADER)?
            .parse()
            .map_err(|_| VerifyError::Invalid("timestamp is not an integer".into()))?;
        if (now_unix - ts).abs() > MAX_CLOCK_SKEW_SECS {
            return Err(VerifyError::Invalid(format!(
                "timestamp {ts} is more than {MAX_CLOCK_SKEW_SECS}s from server time {now_unix}"
            )));
        }

        let payload = header(PAYLOAD_HEADER)?;
        check_payload(method, payload, metadata)?;

        let registered = self
            .keys
            .get(fingerprint)
            .ok_or_else(|| VerifyError::Invalid(format!("unknown key {fingerprint}")))?;
        check_pgp_signature(&registered.key, &sig_bytes, payload.as_bytes(), now_unix)?;
        Ok(registered.identity.clone())
    }
}

/// The payload must name the called method and carry, for each signed header, exactly the values
/// the call carries (`null` or omitted ⇔ absent; `[]` is not absent).
fn check_payload(method: &str, payload: &str, metadata: &MetadataMap) -> Result<(), VerifyError> {
    let value: serde_json::Value = serde_json::from_str(payload)
        .map_err(|_| VerifyError::Invalid("payload is not JSON".into()))?;
    let obj = value
        .as_object()
        .ok_or_else(|| VerifyError::Invalid("payload is not an object".into()))?;
    // Go's encoding/json matches struct fields case-insensitively.
    let field = |name: &str| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    };
    let signed_method = field("method").and_then(|m| m.as_str()).unwrap_or("");
    if signed_method != method {
        return Err(VerifyError::Invalid(format!(
            "payload method {signed_method:?} does not match {method:?}"
        )));
    }
    let empty = serde_json::Map::new();
    let headers = match field("headers") {
        None | Some(serde_json::Value::Null) => &empty,
        Some(serde_json::Value::Object(h)) => h,
        Some(_) => return Err(VerifyError::Invalid("payload headers not an object".into())),
    };
    for key in SIGNED_HEADERS {
        let signed: Option<Vec<String>> = match headers.get(key) {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Array(items)) => Some(
                items
                    .iter()
                    .map(|i| i.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        VerifyError::Invalid(format!("payload header {key} not strings"))
                    })?,
            ),
            Some(_) => {
                return Err(VerifyError::Invalid(format!(
                    "payload header {key} not an array"
                )));
            }
        };
        // Omni looks `fieldSelectors` up with its camel-case name in lower-cased metadata, so it is
        // always absent there.
        let actual: Option<Vec<String>> = if key == "fieldSelectors" {
            None
        } else {
            let values: Vec<String> = metadata
                .get_all(key)
                .iter()
                .filter_map(|v| v.to_str().ok().map(str::to_owned))
                .collect();
            (!values.is_empty()).then_some(values)
        };
        if signed != actual {
            return Err(VerifyError::Invalid(format!(
                "payload header {key} does not match the request"
            )));
        }
    }
    Ok(())
}

fn check_pgp_signature(
    key: &SignedPublicKey,
    sig_bytes: &[u8],
    data: &[u8],
    now_unix: i64,
) -> Result<(), VerifyError> {
    let sig = DetachedSignature::from_bytes(sig_bytes)
        .map_err(|_| VerifyError::Invalid("not an OpenPGP signature".into()))?;
    let s = &sig.signature;
    if s.issuer_key_id().is_empty() && s.issuer_fingerprint().is_empty() {
        return Err(VerifyError::Invalid(
            "signature doesn't have an issuer".into(),
        ));
    }
    match s.hash_alg() {
        Some(
            HashAlgorithm::Sha224
            | HashAlgorithm::Sha256
            | HashAlgorithm::Sha384
            | HashAlgorithm::Sha512
            | HashAlgorithm::Sha3_256
            | HashAlgorithm::Sha3_512,
        ) => {}
        other => {
            return Err(VerifyError::Invalid(format!(
                "hash algorithm {other:?} not accepted"
            )));
        }
    }
    if let Some(created) = s.created()
        && i64::from(created.as_secs()) > now_unix + MAX_CLOCK_SKEW_SECS
    {
        return Err(VerifyError::Invalid("signature made in the future".into()));
    }
    let by_primary = sig.verify(&key.primary_key, data).is_ok();
    let by_subkey = || {
        key.public_subkeys
            .iter()
            .any(|sk| sig.verify(&sk.key, data).is_ok())
    };
    if by_primary || by_subkey() {
        Ok(())
    } else {
        Err(VerifyError::Invalid("signature does not verify".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::NewKey;

    #[test]
    fn generated_key_round_trips_signs_and_verifies() {
        let key = NewKey::generate("proxmox");
        let parsed = key.parsed();
        assert_eq!(parsed.provider_id(), Some("proxmox"));
        assert_eq!(key.fingerprint().len(), 40);
        assert!(!format!("{parsed:?}").contains("PRIVATE"));

        let mut verifier = Verifier::default();
        let registered = verifier
            .register("infra-provider:proxmox", &key.public_armored())
            .unwrap();
        assert_eq!(registered, key.fingerprint());
        let method = "/cosi.resource.State/Get";
        let t0 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let (payload, signature) = parsed.sign_call(method, t0).unwrap();
        assert_eq!(
            signature.split(' ').nth(2),
            Some(key.fingerprint().as_str())
        );
        let mut md = MetadataMap::new();
        md.insert(TIMESTAMP_HEADER, t0.to_string().parse().unwrap());
        md.insert(PAYLOAD_HEADER, payload.parse().unwrap());
        md.insert(SIGNATURE_HEADER, signature.parse().unwrap());
        assert_eq!(
            verifier.verify(method, &md, t0 + 10).unwrap(),
            "infra-provider:proxmox"
        );
        // wrong method, skewed clock
        assert!(
            verifier
                .verify("/cosi.resource.State/List", &md, t0 + 10)
                .is_err()
        );
        assert!(verifier.verify(method, &md, t0 + 301).is_err());
        assert!(verifier.verify(method, &md, t0 + 300).is_ok());
        // an extra signed header present in the metadata but null in the payload
        let mut md2 = md.clone();
        md2.insert("cluster", "c1".parse().unwrap());
        assert!(verifier.verify(method, &md2, t0 + 10).is_err());
    }
}

//! The infra-provider key and Omni's per-call request signature, both directions.
//!
//! Omni authenticates every gRPC call by an OpenPGP detached signature over a small JSON payload that
//! names the method and ten metadata headers. The client half ([`ProviderKey`]) parses the key the
//! user got from `omnictl infraprovider create` and produces the three signature headers; the server
//! half ([`Verifier`]) re-implements Omni's checks so the in-memory Omni rejects exactly what the real
//! one rejects. Both halves share [`payload_json`], so a mismatch between them cannot hide a bug in
//! one: the tests also check our signatures with `gpg`.
//!
//! The key never leaves this module in printable form: [`ProviderKey`]'s `Debug` shows only the
//! identity and fingerprint, and no error carries key bytes or the key JSON.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use pgp::composed::{
    ArmorOptions, Deserializable, DetachedSignature, EncryptionCaps, KeyType,
    SecretKeyParamsBuilder, SignedPublicKey, SignedSecretKey, SubkeyParamsBuilder,
};
use pgp::crypto::ecc_curve::ECCCurve;
use pgp::crypto::hash::HashAlgorithm;
use pgp::ser::Serialize as _;
use pgp::types::{KeyDetails, Password};
use tonic::metadata::MetadataMap;

use crate::secret::Secret;

/// Metadata key carrying the signing time (Unix seconds).
pub const TIMESTAMP_HEADER: &str = "x-sidero-timestamp";
/// Metadata key carrying the signed JSON payload, verbatim.
pub const PAYLOAD_HEADER: &str = "x-sidero-payload";
/// Metadata key carrying `siderov1 <identity> <fingerprint> <base64 signature>`.
pub const SIGNATURE_HEADER: &str = "x-sidero-signature";
/// The only signature scheme Omni knows.
pub const SIGNATURE_VERSION: &str = "siderov1";
/// Timestamps and signature creation times may be this far from the server clock.
pub const MAX_CLOCK_SKEW_SECS: i64 = 5 * 60;

/// Prefix of the service-account name of an infra-provider key as `omnictl infraprovider create`
/// writes it (`infra-provider:<id>`).
pub const INFRA_PROVIDER_NAME_PREFIX: &str = "infra-provider:";
/// Domain of the e-mail in an infra-provider key's OpenPGP user ID (`<id>@<this>`), the same from
/// `omnictl` and from the Omni UI.
pub const INFRA_PROVIDER_EMAIL_DOMAIN: &str = "infra-provider.serviceaccount.omni.sidero.dev";

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

/// Why an infra-provider key was refused. The messages say what to do; none carries key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "the Omni service account key is empty: pass --omni-service-account-key or set OMNI_SERVICE_ACCOUNT_KEY (or SIDERO_SERVICE_ACCOUNT_KEY) to the key printed by `omnictl infraprovider create`"
    )]
    Empty,
    #[error(
        "the Omni service account key is not base64 (it must be the single-line key printed by `omnictl infraprovider create`, not the armored PGP key itself)"
    )]
    NotBase64,
    #[error(
        "the Omni service account key decodes from base64 but is not the expected JSON object with `name` and `pgp_key` ({0})"
    )]
    NotJson(String),
    #[error(
        "the Omni service account key has no `name` (expected `infra-provider:<id>`, or `<id>` for a key made in the Omni UI)"
    )]
    NoName,
    #[error("the Omni service account key has no `pgp_key`")]
    NoKey,
    #[error(
        "the Omni service account key holds a public key only; the provider needs the private key `omnictl infraprovider create` printed"
    )]
    PublicOnly,
    #[error(
        "the Omni service account key is passphrase-protected; Omni keys are unprotected, export it without a passphrase"
    )]
    PassphraseProtected,
    #[error("the Omni service account key's `pgp_key` is not a usable OpenPGP private key: {0}")]
    InvalidKey(String),
}

/// Could not produce a signature (never expected with a key that parsed; reported, not panicked on).
#[derive(Debug, thiserror::Error)]
#[error("cannot sign the Omni request: {0}")]
pub struct SignError(String);

/// The parsed infra-provider key: identity (`infra-provider:<id>` from `omnictl`, the bare `<id>`
/// from the Omni UI) and the OpenPGP private key.
#[derive(Clone)]
pub struct ProviderKey {
    identity: String,
    key: SignedSecretKey,
    fingerprint: String,
    /// The e-mail of the key's primary OpenPGP user ID, which says what kind of account made it.
    email: Option<String>,
}

impl fmt::Debug for ProviderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderKey")
            .field("identity", &self.identity)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

#[derive(serde::Deserialize)]
struct KeyJson {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    pgp_key: Option<String>,
}

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
    /// Parses the key as `omnictl` prints it: base64 of `{"name": ..., "pgp_key": "<armored>"}`.
    pub fn parse(encoded: &Secret) -> Result<Self, KeyError> {
        let text = encoded.expose().trim();
        if text.is_empty() {
            return Err(KeyError::Empty);
        }
        let raw = STANDARD
            .decode(text)
            .or_else(|_| STANDARD_NO_PAD.decode(text.trim_end_matches('=')))
            .map_err(|_| KeyError::NotBase64)?;
        // serde_json's messages quote offending values; report only the category and position.
        let json: KeyJson = serde_json::from_slice(&raw).map_err(|e| {
            KeyError::NotJson(format!(
                "{:?} error at line {} column {}",
                e.classify(),
                e.line(),
                e.column()
            ))
        })?;
        let identity = json
            .name
            .filter(|n| !n.is_empty())
            .ok_or(KeyError::NoName)?;
        let armored = json
            .pgp_key
            .filter(|k| !k.trim().is_empty())
            .ok_or(KeyError::NoKey)?;
        Self::from_armored(identity, &armored)
    }

    /// Builds a key from an identity and an armored private key.
    pub fn from_armored(identity: String, armored: &str) -> Result<Self, KeyError> {
        if armored.contains("BEGIN PGP PUBLIC KEY BLOCK") {
            return Err(KeyError::PublicOnly);
        }
        let (key, _) = SignedSecretKey::from_string(armored).map_err(|e| {
            if SignedPublicKey::from_string(armored).is_ok() {
                KeyError::PublicOnly
            } else {
                KeyError::InvalidKey(e.to_string())
            }
        })?;
        if key.primary_key.secret_params().is_encrypted() {
            return Err(KeyError::PassphraseProtected);
        }
        let fingerprint = format!("{:x}", key.primary_key.fingerprint());
        let email = primary_email(&key);
        Ok(Self {
            identity,
            key,
            fingerprint,
            email,
        })
    }

    /// The name the key was issued under: `infra-provider:<id>` from `omnictl`, `<id>` from the UI.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The provider ID the key was made for, if it is an infra-provider key.
    ///
    /// `omnictl infraprovider create` names the key `infra-provider:<id>`; the Omni UI names it
    /// `<id>` and only the OpenPGP user ID (`<id>@infra-provider.serviceaccount.omni.sidero.dev`)
    /// says it belongs to an infra provider (omni frontend/src/methods/user.ts,
    /// createServiceAccount). Omni itself authenticates by fingerprint and takes the provider ID
    /// from the account the key was registered for, which is `infra-provider:<name>` either way.
    pub fn provider_id(&self) -> Option<&str> {
        if let Some(id) = self.identity.strip_prefix(INFRA_PROVIDER_NAME_PREFIX) {
            return Some(id);
        }
        let domain = self.email.as_deref()?.rsplit_once('@')?.1;
        (domain == INFRA_PROVIDER_EMAIL_DOMAIN).then_some(self.identity.as_str())
    }

    /// Lower-case hex v4 fingerprint of the primary key, as sent in the signature header.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The armored public key, as Omni stores it in its `PublicKeys` resource.
    pub fn public_key_armored(&self) -> Result<String, SignError> {
        SignedPublicKey::from(self.key.clone())
            .to_armored_string(ArmorOptions::default())
            .map_err(|e| SignError(e.to_string()))
    }

    /// A binary detached signature over `data` (SHA-512 like gopenpgp: the server accepts any
    /// SHA-2, we pick the gopenpgp v2 default).
    pub fn detached_signature(&self, data: &[u8]) -> Result<Vec<u8>, SignError> {
        let sig = DetachedSignature::sign_binary_data(
            rand::rngs::OsRng,
            &self.key.primary_key,
            &Password::empty(),
            HashAlgorithm::Sha512,
            data,
        )
        .map_err(|e| SignError(e.to_string()))?;
        sig.to_bytes().map_err(|e| SignError(e.to_string()))
    }

    /// The `x-sidero-signature` value for an exact payload string.
    pub fn signature_header(&self, payload: &str) -> Result<String, SignError> {
        let sig = self.detached_signature(payload.as_bytes())?;
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

    /// Generates a key the way `omnictl infraprovider create` does: EdDSA (Ed25519, legacy EdDSA)
    /// signing primary key plus a cv25519 encryption subkey, no passphrase; user ID
    /// `<id> (<os>/<arch>) <id>@infra-provider.serviceaccount.omni.sidero.dev`.
    pub fn generate(provider_id: &str) -> Result<Self, SignError> {
        let identity = format!("infra-provider:{provider_id}");
        let uid = format!(
            "{provider_id} ({}/{}) <{provider_id}@infra-provider.serviceaccount.omni.sidero.dev>",
            std::env::consts::OS,
            std::env::consts::ARCH
        );
        let key = generate_key(&uid, None)?;
        let fingerprint = format!("{:x}", key.primary_key.fingerprint());
        let email = primary_email(&key);
        Ok(Self {
            identity,
            key,
            fingerprint,
            email,
        })
    }

    /// The key in `omnictl`'s transport form: base64 of `{"name", "pgp_key"}`.
    pub fn to_encoded(&self) -> Result<Secret, SignError> {
        self.to_encoded_as(&self.identity)
    }

    /// The same key in transport form under another `name`: the Omni UI writes the bare provider
    /// ID where `omnictl` writes `infra-provider:<id>`.
    pub fn to_encoded_as(&self, name: &str) -> Result<Secret, SignError> {
        let armored = self
            .key
            .to_armored_string(ArmorOptions::default())
            .map_err(|e| SignError(e.to_string()))?;
        Ok(Secret::new(encode_key_json(name, &armored)))
    }
}

/// The e-mail of the first user ID (`Name (comment) <e-mail>` or a bare `<e-mail>`), if any.
fn primary_email(key: &SignedSecretKey) -> Option<String> {
    let uid = String::from_utf8_lossy(key.details.users.first()?.id.id()).into_owned();
    let email = match (uid.rfind('<'), uid.rfind('>')) {
        (Some(open), Some(close)) if open < close => &uid[open + 1..close],
        _ => uid.trim(),
    };
    email.contains('@').then(|| email.to_owned())
}

/// base64 of the key JSON; also used by tests to build deliberately broken keys.
pub fn encode_key_json(name: &str, armored: &str) -> String {
    let json = serde_json::json!({ "name": name, "pgp_key": armored });
    STANDARD.encode(json.to_string())
}

/// Generates an Ed25519 (legacy EdDSA) signing key with a cv25519 encryption subkey, optionally
/// passphrase-protected (tests use that to check the refusal).
pub fn generate_key(uid: &str, passphrase: Option<&str>) -> Result<SignedSecretKey, SignError> {
    let err = |e: &dyn fmt::Display| SignError(format!("key generation failed: {e}"));
    let mut encrypt = SubkeyParamsBuilder::default();
    encrypt
        .key_type(KeyType::ECDH(ECCCurve::Curve25519Legacy))
        .can_sign(false)
        .can_encrypt(EncryptionCaps::All)
        .passphrase(passphrase.map(str::to_owned));
    let mut params = SecretKeyParamsBuilder::default();
    params
        .key_type(KeyType::Ed25519Legacy)
        .can_certify(true)
        .can_sign(true)
        .primary_user_id(uid.to_owned())
        .passphrase(passphrase.map(str::to_owned))
        .subkeys(vec![encrypt.build().map_err(|e| err(&e))?]);
    let params = params.build().map_err(|e| err(&e))?;
    params.generate(rand::rngs::OsRng).map_err(|e| err(&e))
}

/// The signed payload: compact JSON, `headers` keys sorted, absent headers as `null` (never `[]`,
/// which Omni rejects), then `method`. Pure, shared by the signer and the verifier's tests.
pub fn payload_json(method: &str, present: &BTreeMap<&str, Vec<String>>) -> String {
    let headers: BTreeMap<&str, Option<&Vec<String>>> = SIGNED_HEADERS
        .iter()
        .map(|&k| (k, present.get(k).filter(|v| !v.is_empty())))
        .collect();
    serde_json::json!({ "headers": headers, "method": method }).to_string()
}

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

    #[test]
    fn payload_matches_go_layout() {
        let mut h = BTreeMap::new();
        h.insert(TIMESTAMP_HEADER, vec!["1767225600".to_owned()]);
        assert_eq!(
            payload_json("/cosi.resource.State/List", &h),
            r#"{"headers":{"authorization":null,"cluster":null,"context":null,"fieldSelectors":null,"namespace":null,"nodes":null,"runtime":null,"selectors":null,"uid":null,"x-sidero-timestamp":["1767225600"]},"method":"/cosi.resource.State/List"}"#
        );
    }

    #[test]
    fn key_errors_are_distinct() {
        assert!(matches!(
            ProviderKey::parse(&Secret::new("not base64 !!")),
            Err(KeyError::NotBase64)
        ));
        let not_json = STANDARD.encode("hello");
        assert!(matches!(
            ProviderKey::parse(&Secret::new(not_json)),
            Err(KeyError::NotJson(_))
        ));
        let no_key = STANDARD.encode(r#"{"name":"infra-provider:x"}"#);
        assert!(matches!(
            ProviderKey::parse(&Secret::new(no_key)),
            Err(KeyError::NoKey)
        ));
        let garbage = encode_key_json(
            "infra-provider:x",
            "-----BEGIN PGP PRIVATE KEY BLOCK-----\nxx",
        );
        assert!(matches!(
            ProviderKey::parse(&Secret::new(garbage)),
            Err(KeyError::InvalidKey(_))
        ));
    }

    /// omni frontend/src/methods/user.ts, createServiceAccount: the UI names the key with the bare
    /// name and gives the OpenPGP key only an e-mail user ID, `<name>@infra-provider.<domain>` for
    /// the InfraProvider role and `<name>@serviceaccount.omni.sidero.dev` otherwise.
    #[test]
    fn ui_made_keys_have_a_bare_name_and_still_name_their_provider() {
        let ui_key = |email: &str| {
            let key = generate_key(&format!("<{email}>"), None).unwrap();
            let armored = key.to_armored_string(ArmorOptions::default()).unwrap();
            ProviderKey::parse(&Secret::new(encode_key_json("proxmox", &armored))).unwrap()
        };
        let provider = ui_key("proxmox@infra-provider.serviceaccount.omni.sidero.dev");
        assert_eq!(provider.identity(), "proxmox");
        assert_eq!(provider.provider_id(), Some("proxmox"));
        let plain = ui_key("proxmox@serviceaccount.omni.sidero.dev");
        assert_eq!(plain.provider_id(), None);
        // An omnictl key keeps working, and renaming it as the UI does changes nothing.
        let omnictl = ProviderKey::generate("proxmox").unwrap();
        let renamed = ProviderKey::parse(&omnictl.to_encoded_as("proxmox").unwrap()).unwrap();
        assert_eq!(renamed.identity(), "proxmox");
        assert_eq!(renamed.provider_id(), Some("proxmox"));
    }

    #[test]
    fn generated_key_round_trips_signs_and_verifies() {
        let key = ProviderKey::generate("proxmox").unwrap();
        let encoded = key.to_encoded().unwrap();
        let parsed = ProviderKey::parse(&encoded).unwrap();
        assert_eq!(parsed.fingerprint(), key.fingerprint());
        assert_eq!(parsed.provider_id(), Some("proxmox"));
        assert_eq!(parsed.fingerprint().len(), 40);
        assert!(!format!("{parsed:?}").contains("PRIVATE"));

        let mut verifier = Verifier::default();
        verifier
            .register("infra-provider:proxmox", &key.public_key_armored().unwrap())
            .unwrap();
        let method = "/cosi.resource.State/Get";
        let t0 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let signed = parsed.sign_call(method, t0).unwrap();
        let mut md = MetadataMap::new();
        md.insert(TIMESTAMP_HEADER, signed.timestamp.parse().unwrap());
        md.insert(PAYLOAD_HEADER, signed.payload.parse().unwrap());
        md.insert(SIGNATURE_HEADER, signed.signature.parse().unwrap());
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

    #[test]
    fn passphrase_and_public_only_keys_refused() {
        let protected = generate_key("x <x@example.com>", Some("pw")).unwrap();
        let armored = protected
            .to_armored_string(ArmorOptions::default())
            .unwrap();
        assert!(matches!(
            ProviderKey::parse(&Secret::new(encode_key_json("infra-provider:x", &armored))),
            Err(KeyError::PassphraseProtected)
        ));
        let key = ProviderKey::generate("x").unwrap();
        let public = key.public_key_armored().unwrap();
        assert!(matches!(
            ProviderKey::parse(&Secret::new(encode_key_json("infra-provider:x", &public))),
            Err(KeyError::PublicOnly)
        ));
    }
}

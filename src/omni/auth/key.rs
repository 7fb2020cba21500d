//! Loading the infra-provider key as `omnictl` and the Omni UI hand it out, and generating one the
//! way `omnictl` does. Every refusal says what to do and none carries key material.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use pgp::composed::{
    ArmorOptions, Deserializable, EncryptionCaps, KeyType, SecretKeyParamsBuilder, SignedPublicKey,
    SignedSecretKey, SubkeyParamsBuilder,
};
use pgp::crypto::ecc_curve::ECCCurve;
use pgp::types::KeyDetails;

use super::SignError;
use crate::secret::Secret;

/// Prefix of the service-account name of an infra-provider key as `omnictl infraprovider create`
/// writes it (`infra-provider:<id>`).
pub const INFRA_PROVIDER_NAME_PREFIX: &str = "infra-provider:";
/// Domain of the e-mail in an infra-provider key's OpenPGP user ID (`<id>@<this>`), the same from
/// `omnictl` and from the Omni UI.
pub const INFRA_PROVIDER_EMAIL_DOMAIN: &str = "infra-provider.serviceaccount.omni.sidero.dev";

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

/// The parsed infra-provider key: identity (`infra-provider:<id>` from `omnictl`, the bare `<id>`
/// from the Omni UI) and the OpenPGP private key.
#[derive(Clone)]
pub struct ProviderKey {
    pub(super) identity: String,
    pub(super) key: SignedSecretKey,
    pub(super) fingerprint: String,
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
    name: Option<String>,
    pgp_key: Option<String>,
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
        Ok(Self::from_key(identity, key))
    }

    fn from_key(identity: String, key: SignedSecretKey) -> Self {
        Self {
            identity,
            fingerprint: format!("{:x}", key.primary_key.fingerprint()),
            email: primary_email(&key),
            key,
        }
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
        Ok(Self::from_key(identity, generate_key(&uid, None)?))
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

#[cfg(test)]
mod tests {
    use super::*;

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

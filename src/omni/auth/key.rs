//! Loading the infra-provider key as `omnictl` and the Omni UI hand it out. Every refusal says what
//! to do and none carries key material.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use pgp::composed::{Deserializable, SignedPublicKey, SignedSecretKey};
use pgp::types::KeyDetails;

use crate::secret::Secret;

/// Prefix of the service-account name of an infra-provider key as `omnictl infraprovider create`
/// writes it (`infra-provider:<id>`).
const INFRA_PROVIDER_NAME_PREFIX: &str = "infra-provider:";
/// Domain of the e-mail in an infra-provider key's OpenPGP user ID (`<id>@<this>`), the same from
/// `omnictl` and from the Omni UI.
const INFRA_PROVIDER_EMAIL_DOMAIN: &str = "infra-provider.serviceaccount.omni.sidero.dev";

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
        if armored.contains("BEGIN PGP PUBLIC KEY BLOCK") {
            return Err(KeyError::PublicOnly);
        }
        let (key, _) = SignedSecretKey::from_string(&armored).map_err(|e| {
            if SignedPublicKey::from_string(&armored).is_ok() {
                KeyError::PublicOnly
            } else {
                KeyError::InvalidKey(e.to_string())
            }
        })?;
        if key.primary_key.secret_params().is_encrypted() {
            return Err(KeyError::PassphraseProtected);
        }
        Ok(Self {
            identity,
            fingerprint: format!("{:x}", key.primary_key.fingerprint()),
            email: primary_email(&key),
            key,
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
        let garbage = testkit::keys::encode_key_json(
            "infra-provider:x",
            "-----BEGIN PGP PRIVATE KEY BLOCK-----\nxx",
        );
        assert!(matches!(
            ProviderKey::parse(&Secret::new(garbage)),
            Err(KeyError::InvalidKey(_))
        ));
    }
}

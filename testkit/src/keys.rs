//! Infra-provider keys made the way `omnictl infraprovider create` makes them. The provider only
//! reads keys ([`ProviderKey::parse`]); the in-memory Omni and the tests make them.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use omni_infra_provider_proxmox::omni::auth::ProviderKey;
use omni_infra_provider_proxmox::secret::Secret;
use pgp::composed::{
    ArmorOptions, Deserializable, EncryptionCaps, KeyType, SecretKeyParamsBuilder, SignedPublicKey,
    SignedSecretKey, SubkeyParamsBuilder,
};
use pgp::crypto::ecc_curve::ECCCurve;
use pgp::types::KeyDetails;

/// A freshly made infra-provider key.
pub struct NewKey {
    pub provider_id: String,
    pub key: SignedSecretKey,
}

impl NewKey {
    /// A key as `omnictl infraprovider create` makes it: EdDSA (Ed25519, legacy EdDSA) signing
    /// primary key plus a cv25519 encryption subkey, no passphrase; user ID
    /// `<id> (<os>/<arch>) <id>@infra-provider.serviceaccount.omni.sidero.dev`.
    pub fn generate(provider_id: &str) -> Self {
        let uid = format!(
            "{provider_id} ({}/{}) <{provider_id}@infra-provider.serviceaccount.omni.sidero.dev>",
            std::env::consts::OS,
            std::env::consts::ARCH
        );
        Self {
            provider_id: provider_id.to_owned(),
            key: generate_key(&uid, None),
        }
    }

    /// The key in `omnictl`'s transport form: base64 of `{"name": "infra-provider:<id>", "pgp_key"}`.
    pub fn encoded(&self) -> String {
        self.encoded_as(&format!("infra-provider:{}", self.provider_id))
    }

    /// The same key in transport form under another `name`: the Omni UI writes the bare provider
    /// ID where `omnictl` writes `infra-provider:<id>`.
    pub fn encoded_as(&self, name: &str) -> String {
        let armored = self.key.to_armored_string(ArmorOptions::default()).unwrap();
        encode_key_json(name, &armored)
    }

    /// The key as the provider reads it.
    pub fn parsed(&self) -> ProviderKey {
        ProviderKey::parse(&Secret::new(self.encoded())).unwrap()
    }

    /// The armored public key, as Omni stores it in its `PublicKeys` resource.
    pub fn public_armored(&self) -> String {
        SignedPublicKey::from(self.key.clone())
            .to_armored_string(ArmorOptions::default())
            .unwrap()
    }

    /// Lower-case hex v4 fingerprint of the primary key, as sent in the signature header.
    pub fn fingerprint(&self) -> String {
        format!("{:x}", self.key.primary_key.fingerprint())
    }
}

/// The name and the armored private key of a key in transport form.
fn decode(encoded: &str) -> Result<(String, String), String> {
    let json: serde_json::Value =
        serde_json::from_slice(&STANDARD.decode(encoded).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    match (json["name"].as_str(), json["pgp_key"].as_str()) {
        (Some(name), Some(armored)) => Ok((name.to_owned(), armored.to_owned())),
        _ => Err("not a key in transport form".into()),
    }
}

/// The name and the armored public key of a key in transport form.
pub fn public_of(encoded: &str) -> Result<(String, String), String> {
    let (name, armored) = decode(encoded)?;
    let (key, _) = SignedSecretKey::from_string(&armored).map_err(|e| e.to_string())?;
    let public = SignedPublicKey::from(key)
        .to_armored_string(ArmorOptions::default())
        .map_err(|e| e.to_string())?;
    Ok((name, public))
}

/// A key in transport form under another `name`, as the Omni UI writes it (the bare provider ID).
pub fn renamed(encoded: &str, name: &str) -> String {
    encode_key_json(name, &decode(encoded).unwrap().1)
}

/// base64 of the key JSON; the tests also build deliberately broken keys with it.
pub fn encode_key_json(name: &str, armored: &str) -> String {
    let json = serde_json::json!({ "name": name, "pgp_key": armored });
    STANDARD.encode(json.to_string())
}

/// An Ed25519 (legacy EdDSA) signing key with a cv25519 encryption subkey, optionally
/// passphrase-protected (tests use that to check the refusal).
pub fn generate_key(uid: &str, passphrase: Option<&str>) -> SignedSecretKey {
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
        .subkeys(vec![encrypt.build().unwrap()]);
    params.build().unwrap().generate(rand::rngs::OsRng).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use omni_infra_provider_proxmox::omni::auth::KeyError;

    /// omni frontend/src/methods/user.ts, createServiceAccount: the UI names the key with the bare
    /// name and gives the OpenPGP key only an e-mail user ID, `<name>@infra-provider.<domain>` for
    /// the InfraProvider role and `<name>@serviceaccount.omni.sidero.dev` otherwise.
    #[test]
    fn ui_made_keys_have_a_bare_name_and_still_name_their_provider() {
        let ui_key = |email: &str| {
            let key = generate_key(&format!("<{email}>"), None);
            let armored = key.to_armored_string(ArmorOptions::default()).unwrap();
            ProviderKey::parse(&Secret::new(encode_key_json("proxmox", &armored))).unwrap()
        };
        let provider = ui_key("proxmox@infra-provider.serviceaccount.omni.sidero.dev");
        assert_eq!(provider.identity(), "proxmox");
        assert_eq!(provider.provider_id(), Some("proxmox"));
        let plain = ui_key("proxmox@serviceaccount.omni.sidero.dev");
        assert_eq!(plain.provider_id(), None);
        // An omnictl key keeps working, and renaming it as the UI does changes nothing.
        let omnictl = NewKey::generate("proxmox");
        let renamed = ProviderKey::parse(&Secret::new(omnictl.encoded_as("proxmox"))).unwrap();
        assert_eq!(renamed.identity(), "proxmox");
        assert_eq!(renamed.provider_id(), Some("proxmox"));
    }

    #[test]
    fn passphrase_and_public_only_keys_refused() {
        let protected = generate_key("x <x@example.com>", Some("pw"));
        let armored = protected
            .to_armored_string(ArmorOptions::default())
            .unwrap();
        assert!(matches!(
            ProviderKey::parse(&Secret::new(encode_key_json("infra-provider:x", &armored))),
            Err(KeyError::PassphraseProtected)
        ));
        let public = NewKey::generate("x").public_armored();
        assert!(matches!(
            ProviderKey::parse(&Secret::new(encode_key_json("infra-provider:x", &public))),
            Err(KeyError::PublicOnly)
        ));
        let encoded = NewKey::generate("y").encoded();
        assert_eq!(public_of(&encoded).unwrap().0, "infra-provider:y");
    }
}

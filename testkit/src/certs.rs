//! Test certificates: a private CA and a server certificate for 127.0.0.1/localhost signed by it.

use std::path::{Path, PathBuf};

pub struct TestPki {
    /// The CA certificate (what a client trusts with `caFile` / `--omni-ca-file`).
    pub ca_pem: PathBuf,
    /// Server certificate followed by the CA (the chain a server presents).
    pub chain_pem: PathBuf,
    pub key_pem: PathBuf,
}

impl TestPki {
    pub fn create(dir: &Path) -> TestPki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "omni-infra-provider-proxmox test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let mut leaf_params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
        let pki = TestPki {
            ca_pem: dir.join("ca.pem"),
            chain_pem: dir.join("server-chain.pem"),
            key_pem: dir.join("server-key.pem"),
        };
        std::fs::write(&pki.ca_pem, ca_cert.pem()).unwrap();
        std::fs::write(&pki.chain_pem, format!("{}{}", leaf.pem(), ca_cert.pem())).unwrap();
        std::fs::write(&pki.key_pem, leaf_key.serialize_pem()).unwrap();
        pki
    }
}

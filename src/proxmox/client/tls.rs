//! Which Proxmox certificates to trust: public roots, a private CA, or (warned about) none.

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::proxmox::error::{ProxmoxError, Result};
use crate::proxmox::settings::TlsTrust;
use crate::tls::AcceptAnyServerCert;

/// The rustls configuration for a trust setting (also used for the Image Factory).
pub(crate) fn tls_config(trust: &TlsTrust) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ProxmoxError::Setup(format!("TLS setup failed: {e}")))?;
    let webpki =
        || rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let config = match trust {
        TlsTrust::WebPki => builder
            .with_root_certificates(webpki())
            .with_no_client_auth(),
        TlsTrust::CaFile(path) => {
            let shown = path.display();
            let wrong =
                |what: String| ProxmoxError::Setup(format!("proxmox.caFile {shown} {what}"));
            let mut roots = webpki();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| {
                    ProxmoxError::Setup(format!("cannot read proxmox.caFile {shown}: {e}"))
                })?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| wrong(format!("is not valid PEM: {e}")))?;
            if certs.is_empty() {
                let what = "contains no PEM certificate (expected -----BEGIN CERTIFICATE-----)";
                return Err(wrong(what.into()));
            }
            for cert in certs {
                let unusable = "holds a certificate rustls cannot use as a trust anchor";
                roots
                    .add(cert)
                    .map_err(|e| wrong(format!("{unusable}: {e}")))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        TlsTrust::InsecureSkipVerify => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCert(provider)))
            .with_no_client_auth(),
    };
    Ok(config)
}

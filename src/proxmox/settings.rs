//! What the client needs to reach and log in to the Proxmox VE API. The config file's `proxmox:`
//! section is read into these (`config::proxmox`); the client depends on them, not on the config.

use std::path::PathBuf;

use crate::secret::Secret;

/// How to reach and log in to the Proxmox VE API.
#[derive(Debug, Clone)]
pub struct ProxmoxSettings {
    /// Base URL ending in `/api2/json`, whatever the user wrote.
    pub api_url: url::Url,
    pub auth: ProxmoxAuth,
    pub tls: TlsTrust,
}

#[derive(Debug, Clone)]
pub enum ProxmoxAuth {
    /// `Authorization: PVEAPIToken=<id>=<secret>`; no CSRF token, never expires.
    Token { id: String, secret: Secret },
    /// Ticket login at `/access/ticket` as `<username>@<realm>`.
    Password { username: String, password: Secret },
}

/// Which server certificates to accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsTrust {
    /// Public web PKI roots.
    WebPki,
    /// Public roots plus the certificates in this PEM file (a private CA or a pinned self-signed cert).
    CaFile(PathBuf),
    /// No verification at all (`insecureSkipVerify: true`); logged as a warning at start.
    InsecureSkipVerify,
}

//! How calls authenticate: an API token header, or a ticket session from a password login, renewed
//! well before Proxmox's two-hour expiry and re-established after a 401.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::HeaderValue;
use tokio::sync::Mutex;

use super::{ProxmoxAuth, ProxmoxClient};
use crate::proxmox::error::{Call, ProxmoxError, Result};
use crate::proxmox::types::lenient;
use crate::secret::Secret;

pub(super) enum Auth {
    Token(HeaderValue),
    Ticket(TicketAuth),
}

pub(super) struct TicketAuth {
    username: String,
    password: Secret,
    /// Held across a login: a burst of requests after expiry must not log in fifty times.
    session: Mutex<Option<Arc<Session>>>,
}

pub(super) struct Session {
    pub(super) cookie: HeaderValue,
    pub(super) csrf: HeaderValue,
    obtained: Instant,
}

#[derive(serde::Deserialize)]
struct TicketAnswer {
    ticket: String,
    #[serde(rename = "CSRFPreventionToken")]
    csrf: String,
    /// Set for users with a second factor (TOTP, WebAuthn, …): the ticket is only a half-ticket that
    /// pve-access-control (AccessControl.pm, create_ticket) accepts for nothing but the TFA challenge.
    #[serde(rename = "NeedTFA", default, deserialize_with = "lenient::bool")]
    need_tfa: bool,
}

/// A header value no request dump shows, if it is one HTTP allows.
fn sensitive(value: &str) -> Option<HeaderValue> {
    let mut header = HeaderValue::from_str(value).ok()?;
    header.set_sensitive(true);
    Some(header)
}

const TICKET_RENEW_AFTER: Duration = Duration::from_secs(90 * 60);

impl Auth {
    /// The token header is built once and marked sensitive, so no request dump can show it.
    pub(super) fn from_settings(auth: &ProxmoxAuth) -> Result<Self> {
        Ok(match auth {
            ProxmoxAuth::Token { id, secret } => {
                let bad = "proxmox.tokenID or proxmox.tokenSecret contains characters not allowed in an HTTP header";
                let header = sensitive(&format!("PVEAPIToken={id}={}", secret.expose()));
                Auth::Token(header.ok_or_else(|| ProxmoxError::Setup(bad.into()))?)
            }
            ProxmoxAuth::Password { username, password } => Auth::Ticket(TicketAuth {
                username: username.clone(),
                password: password.clone(),
                session: Mutex::new(None),
            }),
        })
    }
}

impl ProxmoxClient {
    /// The current ticket session, logging in (or renewing) first when needed.
    pub(super) async fn session(&self, call: &Call) -> Result<Option<Arc<Session>>> {
        let Auth::Ticket(t) = &self.inner.auth else {
            return Ok(None);
        };
        let mut current = t.session.lock().await;
        if let Some(s) = current.as_ref()
            && s.obtained.elapsed() < TICKET_RENEW_AFTER
        {
            return Ok(Some(s.clone()));
        }
        let session = Arc::new(self.login(t, call).await?);
        *current = Some(session.clone());
        Ok(Some(session))
    }

    pub(super) async fn invalidate(&self, used: Option<&Arc<Session>>) {
        if let Auth::Ticket(t) = &self.inner.auth {
            let mut guard = t.session.lock().await;
            // Only drop the session that failed; a newer one from a concurrent login stays.
            if let (Some(current), Some(used)) = (guard.as_ref(), used)
                && Arc::ptr_eq(current, used)
            {
                *guard = None;
            }
        }
    }

    async fn login(&self, t: &TicketAuth, during: &Call) -> Result<Session> {
        let call = Call {
            method: "POST",
            path: "/access/ticket".into(),
        };
        let user = &t.username;
        tracing::debug!(%user, during = %during, "logging in to Proxmox");
        let form = [
            ("username", user.as_str()),
            ("password", t.password.expose()),
        ];
        let url = self.url(&["access", "ticket"]);
        let req = self.inner.http.post(url).form(&form);
        let answer: TicketAnswer = self.execute(req, &call).await.map_err(|e| match e {
            ProxmoxError::Unauthorized { call, message } => {
                let message = format!("login as {user} failed: {message}");
                ProxmoxError::Unauthorized { call, message }
            }
            e => e,
        })?;
        if answer.need_tfa {
            let message = format!(
                "{user} has two-factor authentication (TOTP/WebAuthn), which a daemon cannot answer; \
                 use an API token (proxmox.tokenID/tokenSecret) or a user without a second factor"
            );
            return Err(ProxmoxError::Unauthorized { call, message });
        }
        let unusable = || ProxmoxError::Decode {
            call: call.clone(),
            message: "the ticket contains characters not allowed in a header".into(),
        };
        Ok(Session {
            cookie: sensitive(&format!("PVEAuthCookie={}", answer.ticket)).ok_or_else(unusable)?,
            csrf: sensitive(&answer.csrf).ok_or_else(unusable)?,
            obtained: Instant::now(),
        })
    }
}

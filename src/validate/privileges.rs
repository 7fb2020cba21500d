//! The token's reach: the read behind the warning of [`crate::rules::privileges`].

use crate::proxmox::ProxmoxClient;
use crate::rules::privileges::root_warning;

/// The warning about what the token holds on `/` beyond the provider's need, if any. A token
/// whose privileges cannot be read gets no warning: the calls that need them say what is missing.
pub async fn root_reach_warning(pve: &ProxmoxClient) -> Option<String> {
    match pve.effective_privileges().await {
        Ok(privileges) => root_warning(privileges.on("/")),
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the token's privileges");
            None
        }
    }
}

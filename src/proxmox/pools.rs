//! Resource pools: the official provider puts each machine-request set's VMs in a pool named after
//! the set unless the class names one, creates it on demand and removes it once empty. We do the same.

use super::client::Replay::OnlyIfUnsent;
use super::client::{DELETE, POST, Params, ProxmoxClient};
use super::error::{ProxmoxError, Result};

impl ProxmoxClient {
    /// `POST /pools`. A pool that already exists is success.
    pub async fn ensure_pool(&self, pool: &str, comment: &str) -> Result<()> {
        let params = Params::new().with("poolid", pool).with("comment", comment);
        match self.write(POST, &["pools"], params, OnlyIfUnsent).await {
            Err(ProxmoxError::Api { message, .. }) if message.contains("already exists") => Ok(()),
            other => other,
        }
    }

    /// The comment of `pool` from `GET /pools` (each pool's ID and comment; pve-manager Pool.pm
    /// `index`), `None` when there is no such pool or it has no comment.
    pub async fn pool_comment(&self, pool: &str) -> Result<Option<String>> {
        #[derive(serde::Deserialize)]
        struct Pool {
            poolid: String,
            comment: Option<String>,
        }
        let pools: Vec<Pool> = self.get(&["pools"], Params::new()).await?;
        let pool = pools.into_iter().find(|p| p.poolid == pool);
        Ok(pool.and_then(|p| p.comment))
    }

    /// `DELETE /pools?poolid=…` (PVE 8.1 and later), else `DELETE /pools/{poolid}`, which older PVE
    /// have (pve-manager Pool.pm: the query form came with nested pools and answers 501 before).
    /// Returns false when the pool is not empty or already gone, which is not an error for someone
    /// cleaning up.
    pub async fn delete_pool_if_empty(&self, pool: &str) -> Result<bool> {
        let by_query = Params::new().with("poolid", pool);
        let answer = match self.write(DELETE, &["pools"], by_query, OnlyIfUnsent).await {
            Err(ProxmoxError::Api { status: 501, .. }) => {
                let path = ["pools", pool];
                self.write(DELETE, &path, Params::new(), OnlyIfUnsent).await
            }
            other => other,
        };
        match answer {
            Ok(()) => Ok(true),
            Err(ProxmoxError::Api { message, .. })
                if message.contains("not empty") || message.contains("does not exist") =>
            {
                Ok(false)
            }
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }
}

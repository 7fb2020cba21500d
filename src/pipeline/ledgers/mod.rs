//! What concurrent requests in this process must know of each other before Proxmox or Omni shows
//! it, and the cluster facts read once for all of them: one ledger per concern, gathered in
//! [`Ledgers`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::proxmox::{ProxmoxClient, ProxmoxError};

mod ip;
mod placements;
mod releases;
mod vmids;

pub use ip::IpLedgers;
pub use placements::Placements;
pub use releases::Releases;
pub use vmids::Vmids;

/// The ledgers of one process. Lost at a restart by design: each entry is either visible in
/// Proxmox by then or redone, except the IP allocations and recorded VMIDs, which are seeded from
/// the provider states ([`IpLedgers::seed_once`]).
#[derive(Default)]
pub struct Ledgers {
    pub ip: IpLedgers,
    pub placements: Placements,
    pub vmids: Vmids,
    /// Default pools (named after machine-request sets) this process made sure exist; made again
    /// on demand if its set comes back.
    pub pools: Known<{ u64::MAX }>,
    pub locks: Locks,
    /// Boot ISOs (by [`image_presence_key`]) this process saw in their storage: the storage is not
    /// listed again for each VM while they are trusted ([`IMAGE_TRUSTED_FOR`]).
    pub images: Known<{ IMAGE_TRUSTED_FOR.as_secs() }>,
    pub releases: Releases,
    pub facts: PveFacts,
}

/// A poisoned ledger is still right: every update is a single insert or remove.
pub(crate) fn entry<T>(ledger: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    ledger.lock().unwrap_or_else(|p| p.into_inner())
}

/// The key of [`Ledgers::images`] for a boot ISO on a node.
pub fn image_presence_key(node: &str, volid: &str) -> String {
    format!("{node}/{volid}")
}

/// How long a boot ISO seen in its storage is trusted to be there without listing the storage again.
/// Only an operator deletes one (neither provider does), and a create or start that then finds it
/// missing puts it back ([`Known::forget`]), so this bounds how long such a deletion goes unnoticed
/// by requests that have not started yet, not whether it is repaired.
pub const IMAGE_TRUSTED_FOR: Duration = Duration::from_secs(600);

/// The key of [`Locks::exclusive`] for HA rule changes: every rule lives in one file with one
/// digest, so two changes at once would make one of them fail and read again.
pub const HA_RULES_LOCK: &str = "ha-rules";

/// How long a Proxmox VE version read is trusted: an upgrade is noticed within this time.
pub const PVE_VERSION_MAX_AGE: Duration = Duration::from_secs(600);

/// Keys this process knows to exist (a pool, a boot ISO in its storage), each trusted for `SECS`
/// seconds after it was last seen, unless found gone meanwhile.
#[derive(Default)]
pub struct Known<const SECS: u64>(Mutex<HashMap<String, Instant>>);

impl<const SECS: u64> Known<SECS> {
    /// Whether `key` was seen within `SECS` seconds and not found gone since.
    pub fn known(&self, key: &str) -> bool {
        entry(&self.0)
            .get(key)
            .is_some_and(|at| at.elapsed() < Duration::from_secs(SECS))
    }

    /// `key` exists: made, listed, downloaded, or a VM just started from it.
    pub fn seen(&self, key: &str) {
        entry(&self.0).insert(key.to_owned(), Instant::now());
    }

    /// `key` was found missing (deleted behind this process's back), or is going.
    pub fn forget(&self, key: &str) {
        entry(&self.0).remove(key);
    }
}

/// One async lock per key, for work that must not run twice at once.
#[derive(Default)]
pub struct Locks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl Locks {
    /// A lock shared by everyone handling this key: concurrent requests for one image download it
    /// once, this process edits HA rules one change at a time
    /// ([`HA_RULES_LOCK`]), and the machines of a set in HA rules are checked and placed one at a
    /// time. Entries live as long as the process (a handful: one per image and node, one per such
    /// set).
    pub fn exclusive(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        entry(&self.0).entry(key.to_owned()).or_default().clone()
    }

    /// Waits for the lock of `key` ([`Locks::exclusive`]) and holds it until the guard is dropped.
    pub async fn hold(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.exclusive(key).lock_owned().await
    }
}

/// Facts about the Proxmox cluster read once for every request.
#[derive(Default)]
pub struct PveFacts {
    /// The Proxmox VE version last read, and when: keys that need a release check it on every
    /// reconcile, which must not cost a request each time.
    version: Mutex<Option<(String, Instant)>>,
    /// The Proxmox cluster's name (`None`: a standalone node, or not readable), read once: a
    /// Proxmox cluster cannot be renamed.
    name: tokio::sync::OnceCell<Option<String>>,
}

impl PveFacts {
    /// The Proxmox VE version (`GET /version`), read again after [`PVE_VERSION_MAX_AGE`].
    pub async fn pve_version(&self, pve: &ProxmoxClient) -> Result<String, ProxmoxError> {
        if let Some((version, at)) = &*entry(&self.version)
            && at.elapsed() < PVE_VERSION_MAX_AGE
        {
            return Ok(version.clone());
        }
        let version = pve.version().await?.version;
        *entry(&self.version) = Some((version.clone(), Instant::now()));
        Ok(version)
    }

    /// The Proxmox cluster's name (`GET /cluster/status`), read once per process. A token without
    /// `Sys.Audit` on `/` cannot read it: that is remembered as no name (a warning says why, once),
    /// so the topology labels go without the region instead of failing every round.
    pub async fn cluster_name(&self, pve: &ProxmoxClient) -> Result<Option<String>, ProxmoxError> {
        self.name
            .get_or_try_init(|| async {
                match pve.cluster_health().await.map(|h| h.name) {
                    Err(ProxmoxError::PermissionDenied { message, .. }) => {
                        tracing::warn!(%message, "cannot read the cluster name (GET /cluster/status needs Sys.Audit on /): topology labels go without the region");
                        Ok(None)
                    }
                    other => other,
                }
            })
            .await
            .cloned()
    }
}

//! Who a replica is, and whether the replica the lease names is a dead predecessor of this one.
//!
//! A replica that comes back after a crash should not wait a whole lease duration for a lease that
//! names the process it replaces. It takes the lease back at once only when it can prove that
//! process is gone, and the proof is a file lock: every replica holds an exclusive lock on its
//! claim file for as long as it runs and writes its identity there. The kernel drops the lock only
//! when the process that took it exits. So when a new process gets the lock and the file names the
//! lease's holder, that holder has exited:
//!
//! - the same container restarted (its file system, and so the file, survives a restart) or the
//!   same host's service restarted: the file names the old process, the lock is free, the lease is
//!   taken back at once;
//! - a second copy started beside a running one (same host, same container, or the same mounted
//!   directory): the running one holds the lock, so the newcomer has no predecessor and waits like
//!   any standby;
//! - a replica in another container or on another host: another file, which never names this
//!   lease's holder unless that holder ran there, so it waits out the lease.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// This process as the lease records it.
pub struct Holder {
    pub host: String,
    pub pid: u32,
    /// Random, so that a PID reused on the same host is still another holder.
    pub nonce: String,
}

impl Holder {
    /// This process: the host name (a container's ID in Docker, the pod name in Kubernetes), the
    /// process ID and a random part.
    pub fn this_process() -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "unknown-host".to_owned());
        Self {
            host,
            pid: std::process::id(),
            nonce: format!("{:08x}", rand::random::<u32>()),
        }
    }

    /// The identity written in the lease: `host/pid/nonce`.
    pub fn id(&self) -> String {
        format!("{}/{}/{}", self.host, self.pid, self.nonce)
    }
}

/// The default claim file: one per provider ID in the temporary directory, which survives a
/// container's restart (not its re-creation; in Kubernetes mount an `emptyDir` there).
pub fn default_claim_path(provider_id: &str) -> PathBuf {
    std::env::temp_dir().join(format!("omni-infra-provider-proxmox.{provider_id}.leader"))
}

/// The claim file, locked for the life of the process (the lock goes with the open file). The
/// default is no claim file: no fast takeover after a restart.
#[derive(Debug, Default)]
pub struct LocalClaim {
    _file: Option<File>,
    /// The identity of the process that held this claim before and has exited.
    pub predecessor: Option<String>,
}

impl LocalClaim {
    /// Locks `path` and records `me` in it. Without the lock (another replica here holds it) or
    /// without the file (a read-only file system), there is no predecessor: the replica waits
    /// out a lease like any other.
    pub fn take(path: &Path, me: &Holder) -> Self {
        Self::try_take(path, me).unwrap_or_else(|why| {
            tracing::info!(
                path = %path.display(),
                "{why}: a lease this replica held before a restart is waited out, not taken back at once"
            );
            Self::default()
        })
    }

    fn try_take(path: &Path, me: &Holder) -> Result<Self, String> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| format!("cannot open the claim file: {e}"))?;
        file.try_lock().map_err(|e| match e {
            TryLockError::WouldBlock => "another replica on this host holds the claim file".into(),
            TryLockError::Error(e) => format!("cannot lock the claim file: {e}"),
        })?;
        let mut before = String::new();
        file.read_to_string(&mut before)
            .map_err(|e| format!("cannot read the claim file: {e}"))?;
        let predecessor = Some(before.trim().to_owned()).filter(|p| !p.is_empty());
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(me.id().as_bytes()))
            .and_then(|()| file.sync_all())
            .map_err(|e| format!("cannot write the claim file: {e}"))?;
        Ok(Self {
            _file: Some(file),
            predecessor,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pid: u32) -> Holder {
        Holder {
            host: "h".into(),
            pid,
            nonce: "n".into(),
        }
    }

    #[test]
    fn the_claim_names_the_process_that_held_it_once_that_one_has_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claim");
        let first = LocalClaim::take(&path, &holder(1));
        assert_eq!(first.predecessor, None);
        // A second copy while the first runs: the lock is held, so no predecessor is claimed.
        let beside = LocalClaim::take(&path, &holder(2));
        assert_eq!(beside.predecessor, None);
        drop(beside);
        // The first exits (its open file, and so its lock, goes): the next one names it.
        drop(first);
        let next = LocalClaim::take(&path, &holder(3));
        assert_eq!(next.predecessor.as_deref(), Some("h/1/n"));
        drop(next);
        let after = LocalClaim::take(&path, &holder(4));
        assert_eq!(after.predecessor.as_deref(), Some("h/3/n"));
    }

    #[test]
    fn no_claim_file_means_no_predecessor() {
        let claim = LocalClaim::take(Path::new("/nonexistent-dir/claim"), &holder(1));
        assert_eq!(claim.predecessor, None);
    }

    #[test]
    fn identities_differ_between_processes_on_one_host() {
        let a = Holder::this_process();
        let b = Holder::this_process();
        assert_eq!(a.host, b.host);
        assert_ne!(a.id(), b.id(), "the random part tells two holders apart");
    }
}

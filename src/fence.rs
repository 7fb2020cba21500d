//! The fence between this process and the systems it changes.
//!
//! With several replicas, only the one holding the leader lease may change Proxmox or Omni. The
//! fence is open until a deadline that every successful renew of the lease pushes forward (the
//! instant the renew was sent plus the renew deadline), and shut at once when the lease is lost or
//! released. The Proxmox client and the Omni State client ask it before every write they send, so a
//! leader cut off from Omni goes quiet on Proxmox by itself, on its own monotonic clock, before any
//! other replica may take the lease over (the lease duration is longer than the renew deadline).

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The instant until which writes may start (`None`: shut), shared by every clone; no gate at all
/// for a fence that never shuts, the default (single-process mode: `--leader-elect=false`, the
/// one-shot commands and the tests of a single process have nothing to coordinate with).
#[derive(Clone, Debug, Default)]
pub struct Fence(Option<Arc<Mutex<Option<Instant>>>>);

/// A write refused because this process does not hold the leader lease (any more).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not sent: this replica does not hold the leader lease")]
pub struct Fenced;

impl Fence {
    /// A fence that stays shut until the lease is acquired.
    pub fn shut() -> Self {
        Self(Some(Arc::default()))
    }

    /// Lets writes start until `until`, or refuses every write from now on (`None`); an
    /// always-open fence stays open.
    pub fn set(&self, until: Option<Instant>) {
        if let Some(gate) = &self.0 {
            *gate.lock().unwrap_or_else(|p| p.into_inner()) = until;
        }
    }

    /// Whether a write may start now.
    pub fn check(&self) -> Result<(), Fenced> {
        let Some(gate) = &self.0 else {
            return Ok(());
        };
        match *gate.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(deadline) if Instant::now() < deadline => Ok(()),
            _ => Err(Fenced),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_fence_opens_until_its_deadline_and_shuts_on_demand() {
        let fence = Fence::shut();
        assert_eq!(fence.check(), Err(Fenced));
        fence.set(Some(Instant::now() + Duration::from_secs(60)));
        assert_eq!(fence.check(), Ok(()));
        fence.set(None);
        assert_eq!(fence.check(), Err(Fenced));
        fence.set(Some(Instant::now()));
        assert_eq!(fence.check(), Err(Fenced), "the deadline is exclusive");
        let clone = fence.clone();
        clone.set(Some(Instant::now() + Duration::from_secs(60)));
        assert_eq!(fence.check(), Ok(()), "clones share one gate");
    }

    #[test]
    fn an_open_fence_never_shuts() {
        let fence = Fence::default();
        fence.set(None);
        fence.set(Some(Instant::now()));
        assert_eq!(fence.check(), Ok(()));
    }
}

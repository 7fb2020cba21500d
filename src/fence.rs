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

#[derive(Clone, Debug)]
pub struct Fence(Arc<Mutex<Gate>>);

#[derive(Debug, Clone, Copy)]
enum Gate {
    /// Single-process mode: nothing to coordinate with.
    AlwaysOpen,
    /// Writes may start until this instant.
    OpenUntil(Instant),
    Shut,
}

/// A write refused because this process does not hold the leader lease (any more).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not sent: this replica does not hold the leader lease")]
pub struct Fenced;

impl Fence {
    /// A fence that never shuts: `--leader-elect=false`, the one-shot commands and the tests of a
    /// single process.
    pub fn open() -> Self {
        Self(Arc::new(Mutex::new(Gate::AlwaysOpen)))
    }

    /// A fence that stays shut until the lease is acquired.
    pub fn shut() -> Self {
        Self(Arc::new(Mutex::new(Gate::Shut)))
    }

    fn gate(&self) -> std::sync::MutexGuard<'_, Gate> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets writes start until `deadline`; an always-open fence stays open.
    pub fn open_until(&self, deadline: Instant) {
        let mut gate = self.gate();
        if !matches!(*gate, Gate::AlwaysOpen) {
            *gate = Gate::OpenUntil(deadline);
        }
    }

    /// Refuses every write from now on (until the next [`Fence::open_until`]).
    pub fn shut_now(&self) {
        let mut gate = self.gate();
        if !matches!(*gate, Gate::AlwaysOpen) {
            *gate = Gate::Shut;
        }
    }

    /// Whether a write may start now.
    pub fn check(&self) -> Result<(), Fenced> {
        match *self.gate() {
            Gate::AlwaysOpen => Ok(()),
            Gate::OpenUntil(deadline) if Instant::now() < deadline => Ok(()),
            Gate::OpenUntil(_) | Gate::Shut => Err(Fenced),
        }
    }
}

impl Default for Fence {
    fn default() -> Self {
        Self::open()
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
        fence.open_until(Instant::now() + Duration::from_secs(60));
        assert_eq!(fence.check(), Ok(()));
        fence.shut_now();
        assert_eq!(fence.check(), Err(Fenced));
        fence.open_until(Instant::now());
        assert_eq!(fence.check(), Err(Fenced), "the deadline is exclusive");
        let clone = fence.clone();
        clone.open_until(Instant::now() + Duration::from_secs(60));
        assert_eq!(fence.check(), Ok(()), "clones share one gate");
    }

    #[test]
    fn an_open_fence_never_shuts() {
        let fence = Fence::open();
        fence.shut_now();
        fence.open_until(Instant::now());
        assert_eq!(fence.check(), Ok(()));
    }
}

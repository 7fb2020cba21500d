//! The static IP allocations this process knows of, and what running VMs report.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::entry;
use super::vmids::Vmids;
use crate::model::machine::IpAllocation;
use crate::pipeline::context::StatePort;
use crate::pipeline::error::StepError;

/// What this process knows is allocated, by address: seeded once from every provider state in
/// Omni, then kept by the allocations and releases of this process. Lost at a restart by design:
/// the provider states hold every allocation that anything depends on, and the next process reads
/// them again before it allocates.
#[derive(Default)]
pub struct IpLedger {
    /// Address → (request ID, NIC).
    held: BTreeMap<IpAddr, (String, u8)>,
}

impl IpLedger {
    /// Counts `request`'s recorded allocations.
    pub fn hold(&mut self, request: &str, allocations: &[IpAllocation]) {
        for a in allocations {
            self.held.insert(a.address, (request.to_owned(), a.nic));
        }
    }

    /// Every address held, by anyone.
    pub fn taken(&self) -> BTreeSet<IpAddr> {
        self.held.keys().copied().collect()
    }

    /// What `request` holds, by NIC.
    pub fn of(&self, request: &str) -> Vec<(u8, IpAddr)> {
        self.held
            .iter()
            .filter(|(_, (r, _))| r == request)
            .map(|(a, (_, n))| (*n, *a))
            .collect()
    }

    /// Forgets `request`'s allocations (its provider state is gone).
    pub fn release(&mut self, request: &str) {
        self.held.retain(|_, (r, _)| r != request);
    }

    /// Forgets one NIC's allocation of `request` (replaced before its VM existed).
    pub fn release_nic(&mut self, request: &str, nic: u8) {
        self.held.retain(|_, (r, n)| !(r == request && *n == nic));
    }
}

/// When the guest agents were asked, and what each VM (by VMID) reported.
pub type AgentAnswers = (Instant, BTreeMap<u32, Vec<IpAddr>>);

/// The static IP allocations this process knows of, and what running VMs report.
///
/// Unlike the other ledgers this one must not start empty: an address recorded in a provider state
/// before a restart is still taken. It is seeded once per process from every provider state in Omni
/// (lazily, by the first request that needs an address, so a provider without pools never lists
/// them), then kept by this process's own allocations and releases. An allocation is recorded here
/// under the same lock it is decided with, so two requests at once never get the same address, and
/// written to the request's provider state before anything depends on it.
#[derive(Default)]
pub struct IpLedgers {
    held: Mutex<IpLedger>,
    /// Set once the ledger holds every provider state's allocations.
    seeded: tokio::sync::OnceCell<()>,
    /// Requests released before the ledger was seeded: a listing read before their state was
    /// destroyed must not bring their addresses back.
    released_before_seed: Mutex<HashSet<String>>,
    /// Addresses running VMs reported through their guest agent, by VMID, and when they were read;
    /// locked while they are read again.
    pub agent: tokio::sync::Mutex<Option<AgentAnswers>>,
    /// Requests that found their pool full, to be looked at again as soon as an address is freed
    /// (instead of at their next backoff, which may be minutes away).
    waiting: Mutex<BTreeSet<String>>,
    /// Signalled when an address is freed while requests wait.
    freed_signal: tokio::sync::Notify,
}

impl IpLedgers {
    /// The allocations, locked: an address is decided and held under this one lock.
    pub fn held(&self) -> MutexGuard<'_, IpLedger> {
        entry(&self.held)
    }

    /// Fills this ledger, and `vmids`, from every provider state in Omni, once per process (the
    /// first request that needs them pays one listing of `store`): the static IP allocations, and the
    /// VMIDs the states record (a create sent before a restart may still be applied at its VMID,
    /// which nothing in the cluster shows until then).
    pub async fn seed_once(&self, vmids: &Vmids, store: &dyn StatePort) -> Result<(), StepError> {
        self.seeded
            .get_or_try_init(|| async {
                let states = store.machine_states().await.map_err(StepError::omni(
                    "reading every provider state (the IP addresses and VMIDs they hold)",
                ))?;
                let released = entry(&self.released_before_seed).clone();
                let mut held = entry(&self.held);
                for (request, state) in states.iter().filter(|(r, _)| !released.contains(r)) {
                    held.hold(request, &state.ip_allocations);
                }
                vmids.seed(states.iter().flat_map(|(request, state)| {
                    [state.vmid, state.reserved_vmid]
                        .into_iter()
                        .flatten()
                        .map(move |id| (id.get(), request.clone()))
                }));
                tracing::info!(
                    allocations = held.held.len(),
                    states = states.len(),
                    "IP and VMID ledgers loaded from the provider states"
                );
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Forgets `request`'s allocations: its provider state was destroyed after its VM was.
    pub fn release(&self, request: &str) {
        if !self.seeded.initialized() {
            entry(&self.released_before_seed).insert(request.to_owned());
        }
        let had = !entry(&self.held).of(request).is_empty();
        entry(&self.held).release(request);
        entry(&self.waiting).remove(request);
        if had && !entry(&self.waiting).is_empty() {
            self.freed_signal.notify_one();
        }
    }

    /// `request` found its pool full.
    pub(crate) fn wait_for_address(&self, request: &str) {
        entry(&self.waiting).insert(request.to_owned());
    }

    /// `request` has its addresses (or is gone): nothing to wake it for.
    pub(crate) fn stop_waiting(&self, request: &str) {
        entry(&self.waiting).remove(request);
    }

    /// Resolves when an address was freed while requests waited (at once if that happened since
    /// the last call).
    pub async fn freed(&self) {
        self.freed_signal.notified().await;
    }

    /// The requests waiting for an address, no longer waiting: their reconcile decides again.
    pub fn take_waiting(&self) -> Vec<String> {
        std::mem::take(&mut *entry(&self.waiting))
            .into_iter()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_holds_releases_and_answers_by_request() {
        let mut l = IpLedger::default();
        let a = |nic, addr: &str| IpAllocation {
            nic,
            pool: "p".into(),
            address: addr.parse().unwrap(),
        };
        l.hold("r1", &[a(0, "10.0.0.1"), a(1, "10.0.1.1")]);
        l.hold("r2", &[a(0, "10.0.0.2")]);
        assert_eq!(l.held.len(), 3);
        assert_eq!(l.of("r2"), [(0, "10.0.0.2".parse().unwrap())]);
        assert_eq!(l.of("r1").len(), 2);
        l.release_nic("r1", 1);
        assert_eq!(l.of("r1").len(), 1);
        l.release("r1");
        assert_eq!(l.taken(), BTreeSet::from(["10.0.0.2".parse().unwrap()]));
    }
}

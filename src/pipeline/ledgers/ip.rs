//! The static IP allocations this process knows of, and what running VMs report.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::entry;
use super::vmids::Vmids;
use crate::model::MachineState;
use crate::rules::ip_pool::IpLedger;

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
    /// first request that needs them pays one listing, `load`): the static IP allocations, and the
    /// VMIDs the states record (a create sent before a restart may still be applied at its VMID,
    /// which nothing in the cluster shows until then).
    pub async fn seed_once<E>(
        &self,
        vmids: &Vmids,
        load: impl Future<Output = Result<Vec<(String, MachineState)>, E>>,
    ) -> Result<(), E> {
        self.seeded
            .get_or_try_init(|| async {
                let states = load.await?;
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
                    allocations = held.len(),
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

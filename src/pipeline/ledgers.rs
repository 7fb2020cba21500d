//! What concurrent requests in this process must know of each other before Proxmox or Omni shows
//! it, and the cluster facts read once for all of them: [`Ledgers`] and [`IpLedgers`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::pipeline::deprovision::DeprovisionTarget;
use crate::pipeline::step::{StepContext, StepError};
use crate::proxmox::{ProxmoxClient, ProxmoxError};
use crate::rules::placement::{Placement, PlacementError, Reservations};
use crate::rules::vmid::{self, VmidFacts, VmidSource};

/// What concurrent requests in this process must know of each other before Proxmox shows it: the
/// placements not yet visible as VMs, the VMIDs being created, the pools made, the images being
/// fetched. Lost at a restart by design: each entry is either visible in Proxmox by then or redone.
#[derive(Default)]
pub struct Ledgers {
    /// Static IP allocations: unlike the rest, filled from the provider states, which hold them (see
    /// [`IpLedgers`]).
    pub ip: IpLedgers,
    reservations: Mutex<Reservations>,
    /// When a placement reservation was last dropped: a listing sent before then may lack the VM it
    /// stood for, so it is not shared with a reconcile starting after it.
    reservation_dropped: Mutex<Option<std::time::Instant>>,
    /// VMIDs chosen by requests in flight, made lately and perhaps not yet in the listing a
    /// request chooses from, or recorded in a request's provider state.
    vmids: Mutex<VmidLedger>,
    /// How VMIDs are chosen ([`Ledgers::vmid_source`]), read at most every [`PVE_VERSION_MAX_AGE`];
    /// the lock is held while they are read, so a burst of requests reads them once.
    vmid_facts: tokio::sync::Mutex<Option<(Option<VmidFacts>, std::time::Instant)>>,
    /// Default pools (named after machine-request sets) this process made sure exist.
    pools_created: Mutex<HashSet<String>>,
    /// One async lock per key, for work that must not run twice at once: see [`Ledgers::exclusive`].
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The Proxmox VE version last read, and when: keys that need a release check it on every
    /// reconcile, which must not cost a request each time.
    pve_version: Mutex<Option<(String, std::time::Instant)>>,
    /// The Proxmox cluster's name (`None`: a standalone node, or not readable), read once: a
    /// Proxmox cluster cannot be renamed.
    cluster_name: tokio::sync::OnceCell<Option<String>>,
    /// Boot ISOs (by [`image_presence_key`]) this process saw in their storage, and when: the
    /// storage is not listed again for each VM while they are trusted ([`Ledgers::image_present`]).
    images_seen: Mutex<HashMap<String, std::time::Instant>>,
    /// Requests released by this process, with what their VM was and when they went: a create
    /// Proxmox applies late (sent before a crash, its answer never read) can make the VM again after
    /// the teardown; see [`Ledgers::recently_released`].
    released: Mutex<HashMap<String, Released>>,
    /// Requests whose VM this process is deprovisioning now.
    tearing_down: Mutex<HashSet<String>>,
    /// Requests whose only create ever was sent by this process and answered: no create of theirs
    /// can still be on its way to Proxmox, so their release needs no watching for a late VM.
    created_cleanly: Mutex<HashSet<String>>,
}

/// The VMIDs this process holds (see [`Ledgers::take_vmid`], [`Ledgers::vmid_made`]).
#[derive(Default)]
struct VmidLedger {
    in_flight: BTreeSet<u32>,
    made: HashMap<u32, std::time::Instant>,
    refused_at: Option<std::time::Instant>,
    /// VMID -> the request whose provider state records it (its `vmid` or `reserved_vmid`). A
    /// create sent before a crash can still make that VM (Proxmox applies it late), and the listing
    /// shows nothing of it until then: no other request may choose it.
    recorded: HashMap<u32, String>,
}

impl VmidLedger {
    /// Far longer than any listing a request chooses from is kept (a few seconds).
    const MADE_HELD_FOR: Duration = Duration::from_secs(600);
    /// Whoever made the VMID Proxmox refused (a guest the token cannot see, another client) may be
    /// making more.
    const ASK_AFTER_REFUSAL_FOR: Duration = Duration::from_secs(600);

    /// Whether `vmid` is not `request`'s to take: in flight, made lately, or recorded by another
    /// request.
    fn holds(&self, vmid: u32, request: &str) -> bool {
        self.in_flight.contains(&vmid)
            || self
                .made
                .get(&vmid)
                .is_some_and(|at| at.elapsed() < Self::MADE_HELD_FOR)
            || self.recorded.get(&vmid).is_some_and(|r| r != request)
    }
}

/// The token's view and the datacenter's range, for [`vmid::source`]; `None` when the privileges
/// cannot be read. Without `Sys.Audit` on `/` the range is not asked for: `/cluster/options` then
/// answers without it as if it were unset.
async fn read_vmid_facts(pve: &ProxmoxClient) -> Option<VmidFacts> {
    let privileges = match pve.effective_privileges().await {
        Ok(p) => p,
        Err(e) => {
            tracing::info!(error = %e, "cannot read the token's privileges; VMIDs come from /cluster/nextid");
            return None;
        }
    };
    let range = if privileges.holds("/", "Sys.Audit") {
        match pve.next_id_range().await {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::info!(error = %e, "cannot read the datacenter's next-id range; VMIDs come from /cluster/nextid");
                None
            }
        }
    } else {
        None
    };
    Some(VmidFacts {
        audits_every_guest: privileges.holds("/vms", "VM.Audit"),
        range,
    })
}

/// A request released by this process (see [`Ledgers::recently_released`]).
struct Released {
    target: DeprovisionTarget,
    at: std::time::Instant,
    leftover: bool,
}

/// A poisoned ledger is still right: every update is a single insert or remove.
pub(crate) fn entry<T>(ledger: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    ledger.lock().unwrap_or_else(|p| p.into_inner())
}

/// The key of [`Ledgers::exclusive`] for an image download.
pub fn image_lock_key(volume: &str) -> String {
    format!("image:{volume}")
}

/// How long a release is remembered at most ([`Ledgers::recently_released`] asks for less).
pub const RELEASED_KEPT_FOR: Duration = Duration::from_secs(30 * 60);

/// The key of [`Ledgers::image_present`] for a boot ISO on a node.
pub fn image_presence_key(node: &str, volid: &str) -> String {
    format!("{node}/{volid}")
}

/// How long a boot ISO seen in its storage is trusted to be there without listing the storage again.
/// Only an operator deletes one (neither provider does), and a create or start that then finds it
/// missing puts it back ([`Ledgers::image_gone`]), so this bounds how long such a deletion goes unnoticed
/// by requests that have not started yet, not whether it is repaired.
pub const IMAGE_TRUSTED_FOR: Duration = Duration::from_secs(600);

/// The key of [`Ledgers::exclusive`] for HA rule changes: every rule lives in one file with one
/// digest, so two changes at once would make one of them fail and read again.
pub const HA_RULES_LOCK: &str = "ha-rules";

/// How long a Proxmox VE version read is trusted: an upgrade is noticed within this time.
pub const PVE_VERSION_MAX_AGE: Duration = Duration::from_secs(600);

impl Ledgers {
    /// The Proxmox VE version (`GET /version`), read again after [`PVE_VERSION_MAX_AGE`].
    pub async fn pve_version(&self, pve: &ProxmoxClient) -> Result<String, ProxmoxError> {
        let known = entry(&self.pve_version)
            .as_ref()
            .filter(|(_, at)| at.elapsed() < PVE_VERSION_MAX_AGE)
            .map(|(v, _)| v.clone());
        if let Some(version) = known {
            return Ok(version);
        }
        let version = pve.version().await?.version;
        *entry(&self.pve_version) = Some((version.clone(), std::time::Instant::now()));
        Ok(version)
    }

    /// The Proxmox cluster's name (`GET /cluster/status`), read once per process. A token without
    /// `Sys.Audit` on `/` cannot read it: that is remembered as no name (a warning says why, once),
    /// so the topology labels go without the region instead of failing every round.
    pub async fn cluster_name(&self, pve: &ProxmoxClient) -> Result<Option<String>, ProxmoxError> {
        let name = self
            .cluster_name
            .get_or_try_init(|| async {
                match pve.cluster_name().await {
                    Err(ProxmoxError::PermissionDenied { message, .. }) => {
                        tracing::warn!(%message, "cannot read the cluster name (GET /cluster/status needs Sys.Audit on /): topology labels go without the region");
                        Ok(None)
                    }
                    other => other,
                }
            })
            .await?;
        Ok(name.clone())
    }

    /// Whether the boot ISO was seen in its storage within [`IMAGE_TRUSTED_FOR`] and not found
    /// missing since.
    pub fn image_present(&self, key: &str) -> bool {
        entry(&self.images_seen)
            .get(key)
            .is_some_and(|at| at.elapsed() < IMAGE_TRUSTED_FOR)
    }

    /// The boot ISO is in its storage: listed, downloaded, or a VM just started from it.
    pub fn image_seen(&self, key: &str) {
        entry(&self.images_seen).insert(key.to_owned(), std::time::Instant::now());
    }

    /// A create or start found the boot ISO missing (deleted behind this process's back).
    pub fn image_gone(&self, key: &str) {
        entry(&self.images_seen).remove(key);
    }

    /// Places a request with the reservations of requests in flight counted, and reserves the
    /// chosen node for it under the same lock: two requests placed at once cannot both take the last
    /// room on a node.
    pub fn place(
        &self,
        request_id: &str,
        set_id: Option<&str>,
        (memory_mb, vcpus): (u64, u64),
        decide: impl FnOnce(&Reservations) -> Result<Placement, PlacementError>,
    ) -> Result<Placement, PlacementError> {
        let mut reservations = entry(&self.reservations);
        let placement = decide(&reservations)?;
        reservations.reserve(request_id, &placement.node, set_id, memory_mb, vcpus);
        Ok(placement)
    }

    pub fn reserve(
        &self,
        request_id: &str,
        node: &str,
        set_id: Option<&str>,
        memory_mb: u64,
        vcpus: u64,
    ) {
        entry(&self.reservations).reserve(request_id, node, set_id, memory_mb, vcpus);
    }

    /// Requests of `set` other than `request_id` placed by this process whose VMs the listing may
    /// not show yet.
    pub fn placed_in_set(&self, set: &str, request_id: &str) -> Vec<String> {
        entry(&self.reservations).in_set(set, request_id)
    }

    /// The request's VM is visible now (or never will be): it counts through the listing again.
    pub fn release_reservation(&self, request_id: &str) {
        if entry(&self.reservations).release(request_id).is_some() {
            *entry(&self.reservation_dropped) = Some(std::time::Instant::now());
        }
    }

    /// How long ago a placement reservation was last dropped.
    pub fn since_reservation_dropped(&self) -> Option<Duration> {
        entry(&self.reservation_dropped).map(|at| at.elapsed())
    }

    /// Whether `vmid` is not `request`'s to choose: a request of this process is creating a VM
    /// there or made one lately, or another request's provider state records it.
    pub fn vmid_held(&self, vmid: u32, request: &str) -> bool {
        entry(&self.vmids).holds(vmid, request)
    }

    /// Marks `vmid` as in flight and recorded by `request`; false when it is held
    /// ([`Ledgers::vmid_held`]).
    pub fn take_vmid(&self, vmid: u32, request: &str) -> bool {
        let mut vmids = entry(&self.vmids);
        if vmids.in_flight.contains(&vmid)
            || vmids.recorded.get(&vmid).is_some_and(|r| r != request)
        {
            return false;
        }
        vmids.in_flight.insert(vmid);
        vmids.recorded.insert(vmid, request.to_owned());
        true
    }

    /// Loads the VMIDs the provider states record, by request ([`seed_from_states`]); what this
    /// process recorded meanwhile stays.
    pub fn seed_vmids(&self, recorded: impl IntoIterator<Item = (u32, String)>) {
        let mut vmids = entry(&self.vmids);
        for (vmid, request) in recorded {
            vmids.recorded.entry(vmid).or_insert(request);
        }
    }

    /// The request's provider state is gone: the VMIDs it recorded are free to choose again.
    pub fn forget_vmids_of(&self, request: &str) {
        entry(&self.vmids).recorded.retain(|_, r| r != request);
    }

    /// The create at `vmid` failed, or the VM there is already in the listing: other requests may
    /// choose it again.
    pub fn release_vmid(&self, vmid: u32) {
        entry(&self.vmids).in_flight.remove(&vmid);
    }

    /// The VM at `vmid` was made: held a while longer, since a listing read just before it was made
    /// still shows the VMID free.
    pub fn vmid_made(&self, vmid: u32) {
        let mut vmids = entry(&self.vmids);
        vmids.in_flight.remove(&vmid);
        vmids
            .made
            .retain(|_, at| at.elapsed() < VmidLedger::MADE_HELD_FOR);
        vmids.made.insert(vmid, std::time::Instant::now());
    }

    /// Proxmox refused a create for a taken VMID: VMIDs are asked of Proxmox for a while.
    pub fn vmid_refused(&self) {
        entry(&self.vmids).refused_at = Some(std::time::Instant::now());
    }

    /// How the next VM's VMID is chosen ([`vmid::source`]): from the listing when the token's
    /// privileges say it shows every guest and the datacenter's range is readable, else by asking
    /// Proxmox. The privileges and the range are read once for every request choosing at the time,
    /// again after [`PVE_VERSION_MAX_AGE`]; a read that fails means asking Proxmox until the next.
    pub async fn vmid_source(&self, pve: &ProxmoxClient) -> VmidSource {
        let mut facts = self.vmid_facts.lock().await;
        let known = facts
            .as_ref()
            .filter(|(_, at)| at.elapsed() < PVE_VERSION_MAX_AGE);
        if known.is_none() {
            let read = read_vmid_facts(pve).await;
            *facts = Some((read, std::time::Instant::now()));
        }
        let refused_lately = entry(&self.vmids)
            .refused_at
            .is_some_and(|at| at.elapsed() < VmidLedger::ASK_AFTER_REFUSAL_FOR);
        vmid::source(facts.as_ref().and_then(|(f, _)| f.as_ref()), refused_lately)
    }

    pub fn pool_known(&self, pool: &str) -> bool {
        entry(&self.pools_created).contains(pool)
    }

    pub fn pool_created(&self, pool: &str) {
        entry(&self.pools_created).insert(pool.to_owned());
    }

    /// Made again on demand if its set comes back.
    pub fn forget_pool(&self, pool: &str) {
        entry(&self.pools_created).remove(pool);
    }

    /// Remembers that the request's VM (as `target` describes it) was deleted and the request let go;
    /// `leftover`: its seed ISO or its set's pool could not be deleted yet.
    pub fn request_released(&self, target: DeprovisionTarget, leftover: bool) {
        let mut released = entry(&self.released);
        // Bounded by the window whether or not the topology loop runs.
        released.retain(|_, r| r.at.elapsed() < RELEASED_KEPT_FOR);
        released.insert(
            target.request_id.clone(),
            Released {
                target,
                at: std::time::Instant::now(),
                leftover,
            },
        );
    }

    /// The requests released within `window` (oldest forgotten), each with whether something it
    /// had is still left.
    pub fn recently_released(&self, window: Duration) -> Vec<(DeprovisionTarget, bool)> {
        let mut released = entry(&self.released);
        released.retain(|_, r| r.at.elapsed() < window);
        released
            .values()
            .map(|r| (r.target.clone(), r.leftover))
            .collect()
    }

    /// The request's VM was made by this process's first create for it, whose answer came: see
    /// [`Ledgers::created_cleanly`].
    pub fn created_cleanly(&self, request_id: &str) {
        entry(&self.created_cleanly).insert(request_id.to_owned());
    }

    /// Whether the request's VM was made cleanly ([`Ledgers::created_cleanly`]), forgetting it: its
    /// release is the last thing this process does for it.
    pub fn take_created_cleanly(&self, request_id: &str) -> bool {
        entry(&self.created_cleanly).remove(request_id)
    }

    /// The request's VM is being deprovisioned (until [`Ledgers::teardown_ended`]).
    pub fn teardown_started(&self, request_id: &str) {
        entry(&self.tearing_down).insert(request_id.to_owned());
    }

    pub fn teardown_ended(&self, request_id: &str) {
        entry(&self.tearing_down).remove(request_id);
    }

    /// The requests being torn down or released by this process: their VMs are going, or gone.
    pub fn departing(&self) -> BTreeSet<String> {
        let mut departing: BTreeSet<String> = entry(&self.tearing_down).iter().cloned().collect();
        departing.extend(entry(&self.released).keys().cloned());
        departing
    }

    /// Nothing of the released request is left any more.
    pub fn release_complete(&self, request_id: &str) {
        if let Some(r) = entry(&self.released).get_mut(request_id) {
            r.leftover = false;
        }
    }

    /// The request is back (same ID) or its late VM was dealt with.
    pub fn forget_released(&self, request_id: &str) {
        entry(&self.released).remove(request_id);
    }

    /// A lock shared by everyone handling this key: concurrent requests for one image download it
    /// once ([`image_lock_key`]), this process edits HA rules one change at a time
    /// ([`HA_RULES_LOCK`]), and the machines of a set in HA rules are checked and placed one at a
    /// time. Entries live as long as the process (a handful: one per image and node, one per such
    /// set).
    pub fn exclusive(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        entry(&self.locks)
            .entry(key.to_owned())
            .or_default()
            .clone()
    }
}

/// When the guest agents were asked, and what each VM (by VMID) reported.
pub(crate) type AgentAnswers = (std::time::Instant, BTreeMap<u32, Vec<IpAddr>>);

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
    pub(crate) held: Mutex<crate::rules::ip_pool::IpLedger>,
    /// Set once the ledger holds every provider state's allocations.
    pub(crate) seeded: tokio::sync::OnceCell<()>,
    /// Requests released before the ledger was seeded: a listing read before their state was
    /// destroyed must not bring their addresses back.
    pub(crate) released_before_seed: Mutex<HashSet<String>>,
    /// Addresses running VMs reported through their guest agent, by VMID, and when they were read.
    pub(crate) agent: tokio::sync::Mutex<Option<AgentAnswers>>,
    /// Requests that found their pool full, to be looked at again as soon as an address is freed
    /// (instead of at their next backoff, which may be minutes away).
    waiting: Mutex<BTreeSet<String>>,
    /// Signalled when an address is freed while requests wait.
    freed_signal: tokio::sync::Notify,
}

impl IpLedgers {
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

/// Fills the ledgers that must not start empty from every provider state in Omni, once per process
/// (the first request that needs them pays one listing): the static IP allocations, and the VMIDs
/// the states record (a create sent before a restart may still be applied at its VMID, which nothing
/// in the cluster shows until then).
pub async fn seed_from_states(ctx: &StepContext<'_>) -> Result<(), StepError> {
    let ledgers = &ctx.services.ledgers;
    let ip = &ledgers.ip;
    ip.seeded
        .get_or_try_init(|| async {
            let states = ctx
                .progress
                .machine_states()
                .await
                .map_err(StepError::omni(
                    "reading every provider state (the IP addresses and VMIDs they hold)",
                ))?;
            let released = entry(&ip.released_before_seed).clone();
            let mut held = entry(&ip.held);
            for (request, state) in states.iter().filter(|(r, _)| !released.contains(r)) {
                held.hold(request, &state.ip_allocations);
            }
            ledgers.seed_vmids(states.iter().flat_map(|(request, state)| {
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
            Ok::<(), StepError>(())
        })
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placement_is_reserved_under_the_lock_it_was_decided_with() {
        let ledgers = Ledgers::default();
        let place = |id: &str| {
            ledgers.place(id, Some("set"), (1024, 2), |reservations| {
                // What the next decision sees already holds every earlier one.
                let node = format!("pve{}", reservations.len() + 1);
                Ok(Placement {
                    node,
                    storage: "local-lvm".into(),
                    reason: crate::rules::placement::PlacementReason::Pinned,
                    template: None,
                })
            })
        };
        assert_eq!(place("a").map(|p| p.node).ok().as_deref(), Some("pve1"));
        assert_eq!(place("b").map(|p| p.node).ok().as_deref(), Some("pve2"));
        let _ = ledgers.place("c", None, (1024, 2), |r| {
            assert_eq!(r.get("b").map(|r| r.node.as_str()), Some("pve2"));
            assert_eq!(r.get("b").map(|r| r.memory_bytes), Some(1024 * 1024 * 1024));
            Ok(Placement {
                node: "pve3".into(),
                storage: "local-lvm".into(),
                reason: crate::rules::placement::PlacementReason::Pinned,
                template: None,
            })
        });
    }
}

//! The requests this process tears down and lets go: what a create Proxmox applies late could
//! bring back.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::entry;
use crate::pipeline::deprovision::DeprovisionTarget;

/// How long a release is remembered at most ([`Releases::recent`] asks for less).
pub const RELEASED_KEPT_FOR: Duration = Duration::from_secs(30 * 60);

/// Requests this process is tearing down, released, or made cleanly.
#[derive(Default)]
pub struct Releases {
    /// Requests released by this process, with what their VM was and when they went: a create
    /// Proxmox applies late (sent before a crash, its answer never read) can make the VM again after
    /// the teardown; see [`Releases::recent`].
    released: Mutex<HashMap<String, Released>>,
    /// Requests whose VM this process is deprovisioning now.
    tearing_down: Mutex<HashSet<String>>,
    /// Requests whose only create ever was sent by this process and answered: no create of theirs
    /// can still be on its way to Proxmox, so their release needs no watching for a late VM.
    created_cleanly: Mutex<HashSet<String>>,
}

/// A request released by this process (see [`Releases::recent`]).
struct Released {
    target: DeprovisionTarget,
    at: Instant,
    leftover: bool,
}

impl Releases {
    /// The request's teardown ended: `leftover` is `None` when its deprovision failed (it is tried
    /// again), else whether its seed ISO or its set's pool could not be deleted yet. A create sent
    /// before a crash, or whose answer was lost, may still be applied by Proxmox: the release is kept
    /// for `housekeeping::remove_late_vms`. A VM this process made with the request's only create
    /// cannot come back, so such releases are not kept: a provider running thousands of machines
    /// would otherwise hold one for each.
    pub fn teardown_ended(&self, target: &DeprovisionTarget, leftover: Option<bool>) {
        let id = &target.request_id;
        if let Some(leftover) = leftover {
            let clean = entry(&self.created_cleanly).remove(id);
            if leftover || (target.vmid.is_some() && !clean) {
                let mut released = entry(&self.released);
                // Bounded by the window whether or not the housekeeping round runs.
                released.retain(|_, r| r.at.elapsed() < RELEASED_KEPT_FOR);
                let release = Released {
                    target: target.clone(),
                    at: Instant::now(),
                    leftover,
                };
                released.insert(id.clone(), release);
            }
        }
        entry(&self.tearing_down).remove(id);
    }

    /// The requests released within `window` (oldest forgotten), each with whether something it
    /// had is still left.
    pub fn recent(&self, window: Duration) -> Vec<(DeprovisionTarget, bool)> {
        let mut released = entry(&self.released);
        released.retain(|_, r| r.at.elapsed() < window);
        released
            .values()
            .map(|r| (r.target.clone(), r.leftover))
            .collect()
    }

    /// The request's VM was made by this process's first create for it, whose answer came.
    pub fn created_cleanly(&self, request_id: &str) {
        entry(&self.created_cleanly).insert(request_id.to_owned());
    }

    /// The request's VM is being deprovisioned (until [`Releases::teardown_ended`]).
    pub fn teardown_started(&self, request_id: &str) {
        entry(&self.tearing_down).insert(request_id.to_owned());
    }

    /// The requests being torn down or released by this process: their VMs are going, or gone.
    pub fn departing(&self) -> BTreeSet<String> {
        let mut departing: BTreeSet<String> = entry(&self.tearing_down).iter().cloned().collect();
        departing.extend(entry(&self.released).keys().cloned());
        departing
    }

    /// Nothing of the released request is left any more.
    pub fn complete(&self, request_id: &str) {
        if let Some(r) = entry(&self.released).get_mut(request_id) {
            r.leftover = false;
        }
    }

    /// The request is back (same ID) or its late VM was dealt with.
    pub fn forget(&self, request_id: &str) {
        entry(&self.released).remove(request_id);
    }
}

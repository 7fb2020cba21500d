//! The VMIDs requests in flight chose, and how VMIDs are chosen.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{PVE_VERSION_MAX_AGE, entry};
use crate::proxmox::{ProxmoxClient, ProxmoxError};
use crate::rules::vmid::{self, VmidFacts, VmidSource};

/// VMIDs chosen by requests in flight, made lately and perhaps not yet in the listing a request
/// chooses from, or recorded in a request's provider state; and the facts that say how VMIDs are
/// chosen ([`Vmids::source`]).
#[derive(Default)]
pub struct Vmids {
    held: Mutex<Held>,
    /// Read at most every [`PVE_VERSION_MAX_AGE`]; the lock is held while they are read, so a
    /// burst of requests reads them once.
    facts: tokio::sync::Mutex<Option<(Option<VmidFacts>, Instant)>>,
}

#[derive(Default)]
struct Held {
    in_flight: BTreeSet<u32>,
    made: HashMap<u32, Instant>,
    refused_at: Option<Instant>,
    /// VMID -> the request whose provider state records it (its `vmid` or `reserved_vmid`). A
    /// create sent before a crash can still make that VM (Proxmox applies it late), and the listing
    /// shows nothing of it until then: no other request may choose it.
    recorded: HashMap<u32, String>,
}

impl Held {
    /// Whether a create at `vmid` is in flight, or another request's provider state records it.
    fn by_another(&self, vmid: u32, request: &str) -> bool {
        self.in_flight.contains(&vmid) || self.recorded.get(&vmid).is_some_and(|r| r != request)
    }
}

/// Far longer than any listing a request chooses from is kept (a few seconds).
const MADE_HELD_FOR: Duration = Duration::from_secs(600);
/// Whoever made the VMID Proxmox refused (a guest the token cannot see, another client) may be
/// making more.
const ASK_AFTER_REFUSAL_FOR: Duration = Duration::from_secs(600);

impl Vmids {
    /// Whether `vmid` is not `request`'s to choose: a request of this process is creating a VM
    /// there or made one lately, or another request's provider state records it.
    pub fn held(&self, vmid: u32, request: &str) -> bool {
        let held = entry(&self.held);
        let lately = |at: &Instant| at.elapsed() < MADE_HELD_FOR;
        held.by_another(vmid, request) || held.made.get(&vmid).is_some_and(lately)
    }

    /// Marks `vmid` as in flight and recorded by `request`; false when another request holds it.
    pub fn take(&self, vmid: u32, request: &str) -> bool {
        let mut held = entry(&self.held);
        if held.by_another(vmid, request) {
            return false;
        }
        held.in_flight.insert(vmid);
        held.recorded.insert(vmid, request.to_owned());
        true
    }

    /// Loads the VMIDs the provider states record, by request; what this process recorded
    /// meanwhile stays.
    pub fn seed(&self, recorded: impl IntoIterator<Item = (u32, String)>) {
        let mut held = entry(&self.held);
        for (vmid, request) in recorded {
            held.recorded.entry(vmid).or_insert(request);
        }
    }

    /// The request's provider state is gone: the VMIDs it recorded are free to choose again.
    pub fn forget_of(&self, request: &str) {
        entry(&self.held).recorded.retain(|_, r| r != request);
    }

    /// The create at `vmid` failed, or the VM there is already in the listing: other requests may
    /// choose it again.
    pub fn release(&self, vmid: u32) {
        entry(&self.held).in_flight.remove(&vmid);
    }

    /// The VM at `vmid` was made: held a while longer, since a listing read just before it was made
    /// still shows the VMID free.
    pub fn made(&self, vmid: u32) {
        let mut held = entry(&self.held);
        held.in_flight.remove(&vmid);
        held.made.retain(|_, at| at.elapsed() < MADE_HELD_FOR);
        held.made.insert(vmid, Instant::now());
    }

    /// Proxmox refused a create for a taken VMID: VMIDs are asked of Proxmox for a while.
    pub fn refused(&self) {
        entry(&self.held).refused_at = Some(Instant::now());
    }

    /// How the next VM's VMID is chosen ([`vmid::source`]): from the listing when the token's
    /// privileges say it shows every guest and the datacenter's range is readable, else by asking
    /// Proxmox. The privileges and the range are read once for every request choosing at the time,
    /// again after [`PVE_VERSION_MAX_AGE`]; a read that fails means asking Proxmox until the next.
    pub async fn source(&self, pve: &ProxmoxClient) -> VmidSource {
        let mut facts = self.facts.lock().await;
        if facts
            .as_ref()
            .is_none_or(|(_, at)| at.elapsed() >= PVE_VERSION_MAX_AGE)
        {
            *facts = Some((read_facts(pve).await, Instant::now()));
        }
        let refused_lately = entry(&self.held)
            .refused_at
            .is_some_and(|at| at.elapsed() < ASK_AFTER_REFUSAL_FOR);
        vmid::source(facts.as_ref().and_then(|(f, _)| f.as_ref()), refused_lately)
    }
}

/// The token's view and the datacenter's range, for [`vmid::source`]; `None` when the privileges
/// cannot be read. Without `Sys.Audit` on `/` the range is not asked for: `/cluster/options` then
/// answers without it as if it were unset.
async fn read_facts(pve: &ProxmoxClient) -> Option<VmidFacts> {
    let say = |e: &ProxmoxError| {
        tracing::info!(error = %e, "cannot read the token's privileges; VMIDs come from /cluster/nextid");
    };
    let privileges = pve.effective_privileges().await.inspect_err(say).ok()?;
    let range = if privileges.holds("/", "Sys.Audit") {
        let say = |e: &ProxmoxError| {
            tracing::info!(error = %e, "cannot read the datacenter's next-id range; VMIDs come from /cluster/nextid");
        };
        pve.next_id_range().await.inspect_err(say).ok()
    } else {
        None
    };
    Some(VmidFacts {
        audits_every_guest: privileges.holds("/vms", "VM.Audit"),
        range,
    })
}

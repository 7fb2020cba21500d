//! "Which VMID does a new VM get?"
//!
//! Proxmox's own answer is `GET /cluster/nextid`: the lowest VMID of the datacenter's `next-id`
//! range that no guest has, counting every guest of the cluster (pve-manager `PVE/API2/Cluster.pm`,
//! `nextid`, over pmxcfs's vmlist). Asking it costs one request per VM, and a burst of VMs all get
//! the same answer and must each check another VMID with Proxmox.
//!
//! The same answer can be read off the cluster listing the provider holds anyway, when the listing
//! shows every guest and the range is known: the token has `VM.Audit` on `/vms` (the listing hides
//! guests it may not audit) and `Sys.Audit` on `/` (only then does `/cluster/options` include the
//! datacenter's `next-id`). A wrong guess costs nothing but a retry: creating a VM at a taken VMID
//! is refused before anything is made (pve-guest-common `AbstractConfig.pm`,
//! `create_and_lock_config`, calls `check_vmid_unused` under the VMID's lock). After such a refusal
//! the provider asks Proxmox again for a while: something it cannot see is making guests.

use std::collections::BTreeSet;

use std::ops::Range;

use crate::proxmox::types::VmId;

/// What the provider knows of the token and the datacenter, for [`source`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmidFacts {
    /// The token has `VM.Audit` on `/vms`: the cluster listing shows every guest.
    pub audits_every_guest: bool,
    /// The datacenter's range, `None` when it cannot be read (no `Sys.Audit` on `/`).
    pub range: Option<Range<u32>>,
}

/// Where the VMID of the next VM comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmidSource {
    /// The lowest VMID of the range that neither the listing nor this process holds.
    Listing(Range<u32>),
    /// `GET /cluster/nextid`, with the reason the listing cannot be used.
    AskProxmox(&'static str),
}

/// Chooses how to pick VMIDs; `refused_lately`: a create was refused for a taken VMID recently.
pub fn source(facts: Option<&VmidFacts>, refused_lately: bool) -> VmidSource {
    let Some(facts) = facts else {
        return VmidSource::AskProxmox("the token's privileges could not be read");
    };
    if refused_lately {
        return VmidSource::AskProxmox(
            "Proxmox refused a VMID the listing showed free a short while ago",
        );
    }
    if !facts.audits_every_guest {
        return VmidSource::AskProxmox(
            "the token lacks VM.Audit on /vms, so the listing may not show every guest",
        );
    }
    match &facts.range {
        Some(range) => VmidSource::Listing(range.clone()),
        None => VmidSource::AskProxmox(
            "the datacenter's next-id range is unreadable without Sys.Audit on /",
        ),
    }
}

/// The lowest VMID of `range` that is not `listed` and that `held` (VMIDs this process is creating
/// or just made) does not claim; `None` when the range is full.
pub fn lowest_free(
    range: &Range<u32>,
    listed: &BTreeSet<u32>,
    held: impl Fn(u32) -> bool,
) -> Option<VmId> {
    (range.start.max(VmId::MIN)..range.end.min(VmId::MAX.saturating_add(1)))
        .find(|id| !listed.contains(id) && !held(*id))
        .and_then(|id| VmId::new(id).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(audits_every_guest: bool, range: Option<Range<u32>>) -> VmidFacts {
        VmidFacts {
            audits_every_guest,
            range,
        }
    }

    #[test]
    fn the_listing_is_used_only_when_it_shows_every_guest_and_the_range_is_known() {
        let range = 5000..6000;
        assert_eq!(
            source(Some(&facts(true, Some(range.clone()))), false),
            VmidSource::Listing(range.clone())
        );
        for (facts, refused) in [
            (Some(facts(false, Some(range.clone()))), false),
            (Some(facts(true, None)), false),
            (Some(facts(true, Some(range.clone()))), true),
            (None, false),
        ] {
            assert!(
                matches!(source(facts.as_ref(), refused), VmidSource::AskProxmox(_)),
                "{facts:?} refused={refused}"
            );
        }
    }

    #[test]
    fn lowest_free_steps_over_listed_and_held_vmids_inside_the_range() {
        let range = 100..105;
        let listed: BTreeSet<u32> = [100, 101, 103].into();
        assert_eq!(
            lowest_free(&range, &listed, |_| false).map(VmId::get),
            Some(102)
        );
        assert_eq!(
            lowest_free(&range, &listed, |id| id == 102).map(VmId::get),
            Some(104)
        );
        assert_eq!(
            lowest_free(&range, &listed, |id| id >= 102),
            None,
            "range full"
        );
        // The upper bound is exclusive, as pve-manager's nextid loop has it.
        assert_eq!(lowest_free(&(104..104), &BTreeSet::new(), |_| false), None);
    }
}

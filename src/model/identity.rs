//! "Is this VM ours?": the one answer, used by adoption (`create_vm`), teardown (`deprovision`) and
//! the `orphans` search alike, so that a VM one of them would adopt is never one another would leave
//! alone, or the other way round.
//!
//! A VM carries our identity three ways: its name is the request ID, its tags carry our provider tag
//! (`omni-provider.<id>`) and the request (`omni-request.<id>`), and its description carries a marker
//! naming both. The `/cluster/resources` listing shows name and tags, so most VMs are recognised
//! without reading their config ([`judge_listing`]); when the listing cannot say (no name yet, tags
//! incomplete) the config's marker decides ([`judge_config`]). What our provider state recorded (the
//! VMID, the SMBIOS UUID) sharpens the answer: a VM at the recorded VMID named like the official
//! provider names them is the request's, and a VM with another UUID than the one we gave is not.
//!
//! Every tag comparison ignores case: Proxmox lowercases tags unless datacenter.cfg's `tag-style`
//! says `case-sensitive`, so a provider ID with capitals comes back lowercased.

use crate::proxmox::property::Tag;
use crate::proxmox::types::{VmConfig, VmId, VmResource, split_list};

/// The tag marking every VM this provider made: `omni-provider.<provider id>`.
pub fn provider_tag(provider_id: &str) -> String {
    format!("omni-provider.{provider_id}")
}

const REQUEST_TAG_PREFIX: &str = "omni-request.";

/// The tag naming the request a VM was made for: `omni-request.<request id>`. `None` when the ID is not
/// a valid Proxmox tag (Omni's IDs always are; the VM then simply goes without it).
pub fn request_tag(request_id: &str) -> Option<Tag> {
    let tag = Tag::new(format!("{REQUEST_TAG_PREFIX}{request_id}"));
    tag.ok().filter(|_| !request_id.is_empty())
}

/// The request a VM's tags name (`omni-request.<id>`), if any.
pub fn tagged_request<'a>(tags: &[&'a str]) -> Option<&'a str> {
    tagged(tags, REQUEST_TAG_PREFIX)
}

/// The comment of the pools made for machine-request sets: the official provider's
/// (internal/pkg/provider/provision.go, `poolComment`), whose teardown deletes a recorded pool only
/// when it is empty and carries exactly this comment. Ours carry it too, so either provider removes
/// the other's set pools, and neither ever a pool someone else made.
pub const SET_POOL_COMMENT: &str = "managed by omni-infra-provider-proxmox";

const SET_TAG_PREFIX: &str = "machine-request.";

/// The tag the provider (and the official one) puts on every VM of a machine-request set:
/// `machine-request.<set>`.
pub fn set_tag(set_id: &str) -> String {
    format!("{SET_TAG_PREFIX}{set_id}")
}

/// The machine-request set a VM's tags name, if any.
pub fn tagged_set<'a>(tags: &[&'a str]) -> Option<&'a str> {
    tagged(tags, SET_TAG_PREFIX)
}

/// What follows `prefix` (in any case) in the first tag that starts with it.
fn tagged<'a>(tags: &[&'a str], prefix: &str) -> Option<&'a str> {
    tags.iter().find_map(|t| {
        t.get(..prefix.len())
            .filter(|p| p.eq_ignore_ascii_case(prefix))
            .map(|_| &t[prefix.len()..])
            .filter(|id| !id.is_empty())
    })
}

/// Whether this provider made the VM, for whichever request: not a template and carrying our
/// provider tag. The `orphans` search starts from these (and still judges each one per request).
pub fn made_by(vm: &VmResource, provider_id: &str) -> bool {
    !vm.template && vm.has_tag(&provider_tag(provider_id))
}

/// Whether the listing shows a VM dressed as the request's: made by us and named after the request.
/// Such a VM is a candidate wherever it is; it still goes through [`judge_listing`].
pub fn looks_like(vm: &VmResource, request_id: &str, provider_id: &str) -> bool {
    made_by(vm, provider_id) && vm.name.as_deref() == Some(request_id)
}

const MARKER_HEADER: &str =
    "Managed by the Omni infrastructure provider for Proxmox VE. Do not edit the two lines below.";
pub const MARKER_PROVIDER: &str = "omni-provider-id";
pub const MARKER_REQUEST: &str = "omni-machine-request";

/// The description written on the VM: a sentence for people, then the machine-readable marker.
pub fn description_marker(provider_id: &str, request_id: &str) -> String {
    format!("{MARKER_HEADER}\n{MARKER_PROVIDER}: {provider_id}\n{MARKER_REQUEST}: {request_id}\n")
}

/// What the marker line `key` says (`MARKER_PROVIDER`, `MARKER_REQUEST`), wherever the marker sits
/// in the description (Proxmox returns it decoded): a user may write notes above it.
pub fn marked<'d>(description: &'d str, key: &str) -> Option<&'d str> {
    description.lines().find_map(|line| {
        let (k, value) = line.split_once(':')?;
        (k.trim() == key).then(|| value.trim())
    })
}

/// The `uuid=` of an `smbios1` value (`uuid=…,serial=…`).
pub fn smbios_uuid(smbios1: &str) -> Option<&str> {
    smbios1
        .split(',')
        .find_map(|part| part.trim().strip_prefix("uuid="))
        .map(str::trim)
}

/// What a provider state claims about a request's VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim<'a> {
    pub request_id: &'a str,
    pub provider_id: &'a str,
    /// The VMID a provider state recorded (ours or the official provider's): the `vmid`, else the
    /// `reserved_vmid` written before the create. `None` when the question comes from a listing
    /// (the `orphans` search), which makes a VM without our marker never the request's.
    pub recorded_vmid: Option<VmId>,
    /// The SMBIOS UUID we gave the VM, when recorded.
    pub smbios_uuid: Option<&'a str>,
}

/// Whether a VM is the request's. The listing and the config answer `Ours` or `NotOurs`; asking
/// for the config (`pipeline::identify`) can also find the VM gone, its node away, or it locked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    Ours,
    /// Not the request's VM; the reason is for people (logs, status).
    NotOurs(String),
    /// Listed a moment ago, gone when its config was asked for.
    Gone,
    /// The listing cannot tell and the VM's node is not online to be asked: wait for it rather than
    /// act on a guess (a second VM, or leaving ours behind).
    NodeAway,
    /// The config does not show our marker, but the VM is locked (`create`, `clone`): its config may
    /// not be complete yet, so it cannot be ruled out.
    Locked(String),
}

/// The VMs worth judging for a claim: the one at the recorded VMID first (whatever the listing shows
/// of it), then any other that looks like the request's (see [`looks_like`]).
pub fn candidates<'a>(
    vms: impl Iterator<Item = &'a VmResource> + Clone,
    claim: &Claim<'_>,
) -> Vec<&'a VmResource> {
    let recorded = claim
        .recorded_vmid
        .and_then(|id| vms.clone().find(|vm| vm.vmid == id));
    let lookalikes = vms.filter(|vm| {
        Some(vm.vmid) != claim.recorded_vmid && looks_like(vm, claim.request_id, claim.provider_id)
    });
    recorded.into_iter().chain(lookalikes).collect()
}

/// Ownership as far as the listing (name + tags) can decide it: enough for what changes nothing in
/// Proxmox (the topology labels); adoption and deletion ask [`judge_listing_to_act`]. Ours when
/// named after the request with our provider tag and the request tag; not ours when a template or
/// named otherwise (neither our marker nor the official provider's naming can make it ours); `None`
/// when named after the request (or not named yet) but not tagged conclusively: the config decides.
pub fn judge_listing(vm: &VmResource, claim: &Claim<'_>) -> Option<Ownership> {
    if vm.template {
        return Some(Ownership::NotOurs("it is a template".into()));
    }
    let tagged = request_tag(claim.request_id).is_some_and(|request| {
        vm.has_tag(&provider_tag(claim.provider_id)) && vm.has_tag(request.as_str())
    });
    match vm.name.as_deref() {
        Some(name) if name == claim.request_id && tagged => Some(Ownership::Ours),
        Some(name) if name == claim.request_id => None,
        Some(name) => Some(Ownership::NotOurs(format!(
            "it is named {name:?}, not {:?}",
            claim.request_id
        ))),
        // pvestatd has not reported the VM yet (created seconds ago, or its node has been away for
        // minutes and its RRD entry expired): the listing cannot tell, the config can.
        None => None,
    }
}

/// Ownership as far as the listing can decide it before an adoption or a destructive call. Name and
/// tags are copied by anyone who may edit a VM's options (`VM.Config.Options`); the SMBIOS UUID we
/// gave the VM is not in the listing, and a copy never carries it. So when one was recorded, only
/// the config ([`judge_config`]) decides; the listing alone still rules a VM out.
pub fn judge_listing_to_act(vm: &VmResource, claim: &Claim<'_>) -> Option<Ownership> {
    let uuid_recorded = claim.smbios_uuid.is_some_and(|u| !u.trim().is_empty());
    judge_listing(vm, claim).filter(|o| !(uuid_recorded && *o == Ownership::Ours))
}

/// Ownership from the VM's config, for when [`judge_listing`] could not decide. The listing's name
/// and tags stand in for what the config lacks.
pub fn judge_config(vm: &VmResource, config: &VmConfig, claim: &Claim<'_>) -> Ownership {
    if vm.template || config.get("template").as_deref() == Some("1") {
        return Ownership::NotOurs("it is a template".into());
    }
    let expected = claim.smbios_uuid.map(str::trim).filter(|u| !u.is_empty());
    let name = config
        .get("name")
        .or_else(|| vm.name.clone())
        .unwrap_or_default();
    let config_tags = config.get("tags");
    let tag_refs: Vec<&str> = match &config_tags {
        Some(tags) => split_list(tags),
        None => vm.tag_list(),
    };
    // No marker, but named after the request and tagged with a machine-request set, as the official
    // provider makes VMs: the request's only at the VMID its state recorded. That provider records
    // the UUID before its create, the VMID only after: a VM it made whose answer was lost is known
    // by the UUID alone, which a copy cannot carry.
    let legacy = || {
        if claim.recorded_vmid == Some(vm.vmid)
            || expected.is_some_and(|e| uuid_verdict(config, e).is_none())
        {
            return Ownership::Ours;
        }
        Ownership::NotOurs("it has no ownership marker (made by the official provider?) and its VMID was not recorded for this request".into())
    };
    let description = config.get("description").unwrap_or_default();
    let verdict = by_marker(&name, &tag_refs, &description, claim).unwrap_or_else(legacy);
    if verdict != Ownership::Ours {
        return verdict;
    }
    // A clone not configured yet carries the UUID Proxmox gave it at clone time; ours is set with our
    // tags, so the UUID is checked only once the VM carries them.
    let ours = provider_tag(claim.provider_id);
    let configured = tag_refs.iter().any(|t| t.eq_ignore_ascii_case(&ours));
    match expected {
        Some(expected) if configured => uuid_verdict(config, expected).unwrap_or(verdict),
        _ => verdict,
    }
}

/// `Some(NotOurs)` when the VM's SMBIOS UUID is not the one recorded: a VM cloned from ours by hand
/// carries our marker too, but never our UUID.
fn uuid_verdict(config: &VmConfig, expected: &str) -> Option<Ownership> {
    let smbios1 = config.get("smbios1");
    match smbios1.as_deref().and_then(smbios_uuid) {
        Some(actual) if actual.eq_ignore_ascii_case(expected) => None,
        Some(actual) => Some(Ownership::NotOurs(format!(
            "its SMBIOS UUID is {actual}, not the recorded {expected}"
        ))),
        None => Some(Ownership::NotOurs(format!(
            "it has no SMBIOS UUID, but {expected} was recorded"
        ))),
    }
}

/// What the description marker says: `None` when there is none and the VM is named and tagged as
/// the official provider makes them.
fn by_marker(name: &str, tags: &[&str], description: &str, claim: &Claim<'_>) -> Option<Ownership> {
    let (request_id, provider_id) = (claim.request_id, claim.provider_id);
    let marker_provider = marked(description, MARKER_PROVIDER);
    let marker_request = marked(description, MARKER_REQUEST);
    if marker_provider.is_some() || marker_request.is_some() {
        if marker_provider != Some(provider_id) {
            return Some(Ownership::NotOurs(format!(
                "its description marker names provider {:?}, not {provider_id:?}",
                marker_provider.unwrap_or_default()
            )));
        }
        if marker_request != Some(request_id) {
            return Some(Ownership::NotOurs(format!(
                "its description marker names request {:?}, not {request_id:?}",
                marker_request.unwrap_or_default()
            )));
        }
        if name != request_id {
            return Some(Ownership::NotOurs(format!(
                "it is named {name:?}, not {request_id:?}"
            )));
        }
        return Some(Ownership::Ours);
    }
    if name == request_id
        && tags
            .iter()
            .any(|t| t.to_ascii_lowercase().starts_with(SET_TAG_PREFIX))
    {
        return None;
    }
    Some(Ownership::NotOurs(format!(
        "it has no ownership marker and is named {name:?}, not {request_id:?}"
    )))
}

#[cfg(test)]
mod tests;

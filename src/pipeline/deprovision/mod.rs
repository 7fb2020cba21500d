//! Deprovision: find the VM where it is now, make sure it is ours, shut it down, destroy it with its
//! disks, delete its seed ISO; and find what a deprovision left behind (orphans).
//!
//! Shaped by the two worst failures of the official provider (landscape pain points 1 and 3):
//! - **Teardown that never ends.** Everything that means "the VM is not there" (not in the listing,
//!   "does not exist" at any later call) is success, so a VM deleted by hand, never created, or
//!   whose recorded node was renamed never blocks a teardown. A VM migrated by hand or by HA is
//!   deleted on the node it is on now, found in one `/cluster/resources` listing; we never move it
//!   back and report the node where it was seen so the caller can update its state.
//! - **Deleting someone else's VM.** VMIDs are reused. Before anything destructive the VM must prove
//!   it is ours: from the listing alone when it is named after the request and carries both our
//!   provider tag and the request tag, else from its config (description marker, and the SMBIOS UUID
//!   when recorded). A VMID now held by another VM means ours is already gone: we return
//!   [`DeprovisionOutcome::NotOurs`] and never touch it. VMs made by the official Go provider (no
//!   marker) are deleted only through the VMID its state recorded.
//!
//! What must not happen is a silent "done" while the VM may still exist: a node that is offline or
//! unreachable is a transient [`DeprovisionError`] naming the node, and the caller retries.
//!
//! Cost (docs/performance.md; target ≤ 7 requests per deprovision whatever the node count): one listing,
//! the VM's config when a SMBIOS UUID was recorded (only the config shows it, and a copy of our VM
//! carries everything else of ours), then one call plus one poll per task (shutdown, destroy), then
//! the seed ISO delete, whose task is not polled (deleting a file is near instant, the poll would
//! be the 7th request, and an ISO left behind is harmless and listed by the `orphans` command): 7
//! requests for a running VM whose tasks finish at once, 5 for a stopped one.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::model::Listing;
use crate::model::identity::{self, Claim, Ownership};
use crate::pipeline::identify::identify;
use crate::proxmox::property::{IsoVolume, PoolId};
use crate::proxmox::types::{NodeName, NodeState, VmId, VmResource};
use crate::proxmox::{ProxmoxClient, ProxmoxError};

mod destroy;
mod error;
mod orphans;

use destroy::destroy;
pub use error::{Action, DeprovisionError};
pub use orphans::*;

/// What the provider state knows about a request's VM. Every field but the IDs may be missing: a
/// crash can come before anything was recorded, and the official provider records only `vmid` and
/// `node`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeprovisionTarget {
    pub request_id: String,
    pub provider_id: String,
    /// The state's `vmid`, else its `reserved_vmid`.
    pub vmid: Option<VmId>,
    /// Where the VM was created or last seen (it may have moved since).
    pub recorded_node: Option<NodeName>,
    /// The SMBIOS UUID the VM was given, checked whenever the VM's config is read.
    pub smbios_uuid: Option<String>,
    /// The NoCloud seed ISO, e.g. `local:iso/omni-seed-<request>.iso`.
    /// It was uploaded to the VM's node (which matters for node-local storage).
    pub seed_iso_volume: Option<IsoVolume>,
    /// The machine-request set's pool the VM was put in by default, or the one the official
    /// provider recorded for a VM it made ([`MachineState::official_pool`]): removed when the
    /// listing shows no other guest in it and it carries the set pools' comment.
    pub set_pool: Option<PoolId>,
}

/// How long the guest gets to shut down before Proxmox stops it (`forceStop`).
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long to wait for a teardown task (on top of [`SHUTDOWN_TIMEOUT`] for the shutdown).
pub const TEARDOWN_TASK_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Default)]
pub struct DeprovisionOptions {
    /// The VMID comes from a listing, not from a provider state (the `orphans` command): a VM
    /// without our marker, named and tagged as the official provider makes them, is not accepted
    /// at that VMID.
    pub listed_vmid: bool,
    /// The requests this process is tearing down or has released: their VMs in the set's pool are
    /// going too, so the pool may be empty once ours is gone. `None` (the `orphans` command): every
    /// VM of ours may be going.
    pub departing: Option<BTreeSet<String>>,
    /// Held while the set's HA rules are read and deleted: the lock under which this process joins
    /// VMs to them (`pipeline::ha`). `None` (the `orphans` command): no joins run meanwhile.
    pub ha_rules_lock: Option<std::sync::Arc<tokio::sync::Mutex<()>>>,
}

/// How a deprovision ended. Every variant means the request's VM no longer exists on Proxmox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeprovisionOutcome {
    /// We destroyed it, on `node` (where it was found, which may differ from the recorded node).
    Deleted { node: NodeName, vmid: VmId },
    /// It was gone before we got to it (deleted by hand, or never created).
    AlreadyGone,
    /// The VMID now belongs to a VM that is not ours, so ours is gone; theirs was left alone.
    NotOurs { vmid: VmId, reason: String },
    /// No VMID was recorded and no VM carries the request's identity: it was never created.
    NothingRecorded,
}

/// A deprovision's outcome plus what it had to leave behind.
#[derive(Debug)]
pub struct Deprovisioned {
    pub outcome: DeprovisionOutcome,
    /// The seed ISO could not be deleted (its delete failed, or its node is away). The VM is gone,
    /// so the teardown finishes anyway: retrying it for a file would block the request's deletion
    /// for ever when the storage refuses. The ISO is then an orphan: no VM uses it and no live
    /// request will, so the `orphans` command lists it and `orphans --delete` removes it.
    pub leftover_seed_iso: Option<DeprovisionError>,
    /// The set's default pool was empty but could not be deleted (Proxmox out of reach, say): a
    /// later try can still remove it.
    pub leftover_pool: bool,
}

/// An online node that can reach `storage`: the preferred ones first, then any node where a shared
/// storage of that name is listed.
fn online_node_for(listing: &Listing, storage: &str, preferred: &[NodeName]) -> Option<NodeName> {
    let shared = listing
        .storages()
        .filter(|s| s.storage == storage && s.shared);
    let mut nodes = preferred.iter().chain(shared.map(|s| &s.node));
    nodes.find(|n| listing.node_online(n)).cloned()
}

/// What every part of one deprovision works with: the client, the listing it started from, the
/// options, and where progress lines go.
struct Run<'a> {
    pve: &'a ProxmoxClient,
    view: &'a Listing,
    options: &'a DeprovisionOptions,
    progress: &'a (dyn Fn(&str) + Send + Sync),
}

/// Deletes the request's VM and seed ISO, saying what was left behind (see
/// [`Deprovisioned::leftover_seed_iso`]). See the module docs for the rules; `progress` gets readable
/// status lines ("shutting down VM 104 on pve2 …") for the MachineRequestStatus.
pub async fn deprovision_reporting(
    pve: &ProxmoxClient,
    target: &DeprovisionTarget,
    options: &DeprovisionOptions,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<Deprovisioned, DeprovisionError> {
    progress(&match target.vmid {
        Some(id) => format!("looking up VM {id} in the Proxmox cluster"),
        None => format!(
            "looking up the VM of request {} in the Proxmox cluster",
            target.request_id
        ),
    });
    let view = pve
        .cluster_listing()
        .await
        .map_err(|source| DeprovisionError::Listing {
            request_id: target.request_id.clone(),
            source,
        })?;
    let run = Run {
        pve,
        view: &view,
        options,
        progress,
    };
    let outcome = deprovision_in(&run, target).await?;
    let (vm_node, deleted) = match &outcome {
        DeprovisionOutcome::Deleted { node, vmid } => (Some(node.clone()), Some(*vmid)),
        _ => (None, None),
    };
    let leftover_seed_iso = delete_seed_iso(&run, target, vm_node).await.err();
    if let Some(e) = &leftover_seed_iso {
        tracing::warn!(request = %target.request_id, error = %e,
            "seed ISO left behind; the teardown goes on (`orphans` lists it, `orphans --delete` removes it)");
        progress(&format!("{e}; left for the `orphans` command"));
    }
    let mut leftover_pool = false;
    if let Some(pool) = target.set_pool.as_ref().map(PoolId::as_str) {
        let ask = pool_may_be_empty(
            &view,
            pool,
            deleted,
            &target.provider_id,
            options.departing.as_ref(),
        );
        leftover_pool = ask && !remove_pool_if_ours(pve, pool, &target.request_id).await;
    }
    let request = &target.request_id;
    match &outcome {
        DeprovisionOutcome::Deleted { node, vmid } => {
            tracing::info!(%request, %vmid, %node, "VM deleted")
        }
        DeprovisionOutcome::NotOurs { vmid, reason } => tracing::warn!(%request, %vmid, %reason,
            "the recorded VMID now belongs to a VM that is not ours; ours is gone, theirs was left alone"),
        DeprovisionOutcome::AlreadyGone => {
            tracing::info!(%request, vmid = ?target.vmid, "VM already gone")
        }
        DeprovisionOutcome::NothingRecorded => tracing::info!(%request, "no VM was ever created"),
    }
    Ok(Deprovisioned {
        outcome,
        leftover_seed_iso,
        leftover_pool,
    })
}

/// Whether the set's pool may be empty once our VM is gone, so that deleting it is worth a request.
/// The listing was read before our VM was deleted, so a VM of ours it still shows in the pool may be
/// going at this moment (the set's last machines torn down at once each see the other in the pool,
/// and neither would delete it): then Proxmox decides, since it refuses to delete a pool that is
/// not empty. A guest that is not ours, or a VM of ours whose request is not `departing`, will still be
/// there: no request is spent on a refusal. A VM whose request the listing does not name (no name yet)
/// may be going.
pub fn pool_may_be_empty(
    view: &Listing,
    pool: &str,
    deleted: Option<VmId>,
    provider_id: &str,
    departing: Option<&BTreeSet<String>>,
) -> bool {
    let in_pool = |pool_of: Option<&str>| pool_of == Some(pool);
    if view.containers().any(|g| in_pool(g.pool.as_deref())) {
        return false;
    }
    !view
        .vms()
        .filter(|g| in_pool(g.pool.as_deref()) && Some(g.vmid) != deleted)
        .any(|g| {
            if !identity::made_by(g, provider_id) {
                return true;
            }
            let tags = g.tag_list();
            let request = identity::tagged_request(&tags).or(g.name.as_deref());
            match (departing, request) {
                (Some(departing), Some(request)) => !departing.contains(request),
                _ => false,
            }
        })
}

/// Deletes the set's pool if its comment says a provider made it for a set and Proxmox finds it
/// empty: a pool of the same name made by someone else (with its ACLs) is reused for the set's VMs
/// by the create, never deleted. The comment is read only here, when the pool may be empty, so a
/// teardown that leaves machines in the pool costs nothing more. Best effort: an empty pool left
/// behind is harmless. False when a request failed for another reason than the pool not being
/// empty.
async fn remove_pool_if_ours(pve: &ProxmoxClient, pool: &str, request_id: &str) -> bool {
    match pve.pool_comment(pool).await {
        Ok(comment) if comment.as_deref() == Some(identity::SET_POOL_COMMENT) => {}
        Ok(_) => {
            tracing::info!(request = %request_id, %pool, "the set's pool was not made by a provider (its comment says otherwise); leaving it");
            return true;
        }
        Err(e) => {
            tracing::warn!(request = %request_id, %pool, error = %e, "cannot read the set's pool");
            return false;
        }
    }
    match pve.delete_pool_if_empty(pool).await {
        Ok(true) => {
            tracing::info!(request = %request_id, %pool, "removed the machine-request set's pool, now empty");
            true
        }
        Ok(false) => true,
        Err(e) => {
            tracing::warn!(request = %request_id, %pool, error = %e, "cannot remove the machine-request set's pool");
            false
        }
    }
}

/// The VM part, against a listing already made.
async fn deprovision_in(
    run: &Run<'_>,
    target: &DeprovisionTarget,
) -> Result<DeprovisionOutcome, DeprovisionError> {
    let view = run.view;
    let claim = Claim {
        request_id: &target.request_id,
        provider_id: &target.provider_id,
        recorded_vmid: target.vmid.filter(|_| !run.options.listed_vmid),
        smbios_uuid: target.smbios_uuid.as_deref(),
    };
    let mut foreign: Option<(VmId, String)> = None;
    if let Some(id) = target.vmid {
        if let Some(vm) = view.vm(id) {
            match verdict(run, vm, &claim).await? {
                Ownership::Ours => return destroy(run, vm).await,
                Ownership::NotOurs(reason) => foreign = Some((id, reason)),
                _gone => return Ok(DeprovisionOutcome::AlreadyGone),
            }
        } else if view.containers().any(|ct| ct.vmid == id) {
            foreign = Some((id, "it is now a container".into()));
        }
    }
    // No VMID recorded (a crash between create and recording it), or the recorded one is gone or
    // someone else's: look for the request's identity, which costs nothing more.
    let candidates: Vec<&VmResource> = view
        .vms()
        .filter(|vm| Some(vm.vmid) != target.vmid)
        .filter(|vm| identity::looks_like(vm, &target.request_id, &target.provider_id))
        .collect();
    match candidates.as_slice() {
        [] => {}
        [vm] => match verdict(run, vm, &claim).await? {
            Ownership::Ours => return destroy(run, vm).await,
            Ownership::NotOurs(reason) => {
                tracing::warn!(request = %target.request_id, vmid = %vm.vmid, %reason,
                    "a VM named after the request is not ours; left alone");
            }
            _gone => {}
        },
        many => {
            return Err(DeprovisionError::Ambiguous {
                request_id: target.request_id.clone(),
                vmids: many.iter().map(|vm| vm.vmid).collect(),
            });
        }
    }
    Ok(match (foreign, target.vmid) {
        (Some((vmid, reason)), _) => DeprovisionOutcome::NotOurs { vmid, reason },
        (None, Some(_)) => DeprovisionOutcome::AlreadyGone,
        (None, None) => DeprovisionOutcome::NothingRecorded,
    })
}

/// The error for a VM whose node cannot be asked (offline, unknown, or missing from the listing).
fn node_offline(view: &Listing, vm: &VmResource) -> DeprovisionError {
    DeprovisionError::NodeOffline {
        node: vm.node.clone(),
        vmid: vm.vmid,
        state: NodeState::word(view.node_state(&vm.node)),
    }
}

/// Whether `vm` is the request's, by `model::identity` (the rule adoption uses too). A VM whose
/// node is away or that is locked mid-create cannot be ruled out: an error, so the teardown waits.
/// What is returned is `Ours`, `NotOurs` or `Gone`.
async fn verdict(
    run: &Run<'_>,
    vm: &VmResource,
    claim: &Claim<'_>,
) -> Result<Ownership, DeprovisionError> {
    let reading = DeprovisionError::proxmox(Action::ReadConfig, &vm.node, vm.vmid);
    match identify(run.pve, run.view, vm, claim)
        .await
        .map_err(reading)?
    {
        Ownership::NodeAway => Err(node_offline(run.view, vm)),
        Ownership::Locked(lock) => Err(DeprovisionError::Locked {
            node: vm.node.clone(),
            vmid: vm.vmid,
            lock,
        }),
        ours_not_ours_or_gone => Ok(ours_not_ours_or_gone),
    }
}

/// Deletes the recorded seed ISO, from the first online node among the recorded node (where the seed
/// was uploaded) and the node the VM was deleted on (or any node, for shared storage).
async fn delete_seed_iso(
    run: &Run<'_>,
    target: &DeprovisionTarget,
    vm_node: Option<NodeName>,
) -> Result<(), DeprovisionError> {
    let (pve, view) = (run.pve, run.view);
    let Some(iso) = &target.seed_iso_volume else {
        return Ok(());
    };
    let (volume, storage) = (&iso.to_string(), iso.storage.to_string());
    let mut preferred: Vec<NodeName> = target.recorded_node.iter().cloned().collect();
    preferred.extend(vm_node.filter(|n| !preferred.contains(n)));
    let Some(node) = online_node_for(view, &storage, &preferred) else {
        if let Some(n) = preferred.iter().find(|n| view.node_state(n).is_some()) {
            return Err(DeprovisionError::SeedIsoNodeOffline {
                volume: volume.to_owned(),
                node: n.clone(),
                state: NodeState::word(view.node_state(n)),
            });
        }
        // The node is no longer in the cluster: the ISO went with it.
        tracing::warn!(request = %target.request_id, %volume, nodes = ?preferred,
            "no node that could hold the seed ISO is in the cluster; skipping it");
        return Ok(());
    };
    (run.progress)(&format!("deleting seed ISO {volume} on {node}"));
    let fail = |source| DeprovisionError::SeedIso {
        volume: volume.to_owned(),
        node: node.clone(),
        source,
    };
    match pve.delete_volume(&node, &storage, volume).await {
        Err(e) if !e.is_not_found() && !volume_gone(&e) => Err(fail(e)),
        _ => Ok(()),
    }
}

/// Proxmox words a missing volume in several ways, not all of which map to "not found".
fn volume_gone(e: &ProxmoxError) -> bool {
    let ProxmoxError::Api { message, .. } = e else {
        return false;
    };
    let m = message.to_ascii_lowercase();
    m.contains("does not exist") || m.contains("no such volume")
}

#[cfg(test)]
mod tests;

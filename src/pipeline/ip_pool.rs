//! Static addresses from the config's IP pools, allocated at the start of `pick_node`, before
//! anything exists in Proxmox: the seed's network-config (built in `create_vm` or `configure_vm`)
//! and the VM's MACs depend on them.
//!
//! An address is decided by [`ip_pool::allocate`] under the ledger's lock (so concurrent requests
//! never get the same one), held in the ledger at once, and written to the request's provider state
//! before the step goes on. A crash before that write loses only an address nothing used yet; after
//! it, the state holds it, and the next process seeds its ledger from every provider state before it
//! allocates anything. It is released when the state is destroyed after the VM is
//! (`controller::teardown`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::context::StepContext;
use super::discover_ip::usable_addresses;
use super::error::StepError;
use crate::model::machine::IpAllocation;
use crate::rules::ip_pool;

/// How long the addresses running VMs reported through their guest agent are trusted.
///
/// Asking every running VM's agent costs one request per VM, so it is not done per allocation:
/// the answers are kept this long and read again only when a request needs an address after that
/// (a provider without pools never asks). A VM that took an address from the pool's range by hand
/// in the meantime is therefore noticed within this time; a VM gone from the listing stops
/// counting at once, since only VMs the current listing still shows are counted.
pub const AGENT_ADDRESSES_MAX_AGE: Duration = Duration::from_secs(180);

/// How many guest agents are asked at once when the cache is refreshed.
const AGENT_READS_AT_ONCE: usize = 8;

/// Gives every NIC that names a pool its address, recorded in the provider state, unless it has one.
pub async fn allocate(ctx: &mut StepContext<'_>) -> Result<(), StepError> {
    let wanted = ip_pool::wanted(&ctx.data);
    if ctx.state.recorded_vmid().is_some() {
        // The VM exists (or may): its seed was written with what the state records.
        return Ok(());
    }
    // A class changed before the VM existed: an allocation for a pool it no longer names goes.
    let allocations = &mut ctx.state.ip_allocations;
    let stale: Vec<IpAllocation> = allocations
        .extract_if(.., |a| !wanted.contains(&(a.nic, a.pool.as_str())))
        .collect();
    let missing: Vec<(u8, String)> = wanted
        .into_iter()
        .filter(|(nic, _)| ctx.state.allocation(*nic).is_none())
        .map(|(nic, pool)| (nic, pool.to_owned()))
        .collect();
    if missing.is_empty() && stale.is_empty() {
        return Ok(());
    }
    let services = ctx.services;
    services
        .ledgers
        .ip
        .seed_once(&services.ledgers.vmids, ctx.store)
        .await?;
    for a in &stale {
        services
            .ledgers
            .ip
            .held()
            .release_nic(&ctx.request.id, a.nic);
    }
    let reported = if missing.is_empty() {
        BTreeSet::new()
    } else {
        reported_addresses(ctx).await?
    };
    for (nic, name) in missing {
        let pool = ip_pool::find(&services.config.ip_pools, &ip_pool::key_of(nic), &name)
            .map_err(|p| StepError::config(format!("invalid provider data: {p}")))?;
        // Decided and held under the ledger's lock. An address this request already holds in the
        // ledger (taken by an attempt whose state write failed) is taken again.
        let mut held = services.ledgers.ip.held();
        let this_nic = |(n, a): &(u8, IpAddr)| *n == nic && pool.contains(*a);
        let address = match held.of(&ctx.request.id).into_iter().find(this_nic) {
            Some((_, address)) => address,
            None => {
                held.release_nic(&ctx.request.id, nic);
                let mut taken = held.taken();
                taken.extend(reported.iter().copied());
                ip_pool::allocate(pool, &taken).map_err(|full| {
                    services.ledgers.ip.wait_for_address(&ctx.request.id);
                    StepError::PoolFull(full)
                })?
            }
        };
        let allocation = IpAllocation {
            nic,
            pool: pool.name.clone(),
            address,
        };
        held.hold(&ctx.request.id, std::slice::from_ref(&allocation));
        tracing::info!(request = %ctx.request.id, pool = %pool.name, address = %allocation.address, nic = %format!("net{nic}"), "allocated a static address");
        ctx.state.ip_allocations.push(allocation);
    }
    services.ledgers.ip.stop_waiting(&ctx.request.id);
    // Something was allocated or released: neither `missing` nor `stale` is empty.
    ctx.report("recording the static addresses").await;
    ctx.persist().await
}

/// The addresses the guest agents of the VMs the current listing shows reported, read again when
/// older than [`AGENT_ADDRESSES_MAX_AGE`].
async fn reported_addresses(ctx: &mut StepContext<'_>) -> Result<BTreeSet<IpAddr>, StepError> {
    let listing = ctx.cluster(false).await?;
    let mut cache = ctx.services.ledgers.ip.agent.lock().await;
    let (_, by_vm) = match &mut *cache {
        Some(answers) if answers.0.elapsed() < AGENT_ADDRESSES_MAX_AGE => answers,
        stale => {
            let answers = agent_addresses(&ctx.services.pve, listing.guests()).await;
            stale.insert((Instant::now(), answers))
        }
    };
    let present: BTreeSet<u32> = listing.guests().map(|vm| vm.vmid.get()).collect();
    let reported = by_vm.iter().filter(|(vmid, _)| present.contains(vmid));
    Ok(reported
        .flat_map(|(_, addresses)| addresses.clone())
        .collect())
}

/// Every address the guest agents of the cluster's running VMs report (one listing, then one
/// request per running VM): for `validate` and the `pools` command, which read it once.
pub async fn reported_by_agents(
    pve: &crate::proxmox::ProxmoxClient,
) -> Result<BTreeSet<IpAddr>, crate::proxmox::ProxmoxError> {
    let vms = pve.vms().await?;
    let reported = agent_addresses(pve, &vms).await;
    Ok(reported.into_values().flatten().collect())
}

/// What the guest agent of each running VM among `vms` reports, by VMID: one request per running VM,
/// [`AGENT_READS_AT_ONCE`] at a time. A VM without an agent (or whose agent is not up yet) reports
/// nothing; that is not an error.
pub async fn agent_addresses(
    pve: &crate::proxmox::ProxmoxClient,
    vms: impl IntoIterator<Item = &crate::proxmox::types::VmResource>,
) -> BTreeMap<u32, Vec<IpAddr>> {
    let running = vms
        .into_iter()
        .filter(|vm| !vm.template && vm.status.as_deref() == Some("running"));
    let reads = running.map(|vm| async move {
        let result = pve.vm(&vm.node, vm.vmid).agent_network_interfaces().await;
        let reported = result.map(|i| usable_addresses(&i)).unwrap_or_default();
        let addresses = reported.iter().filter_map(|a| a.parse().ok()).collect();
        (vm.vmid.get(), addresses)
    });
    // Collected first: the stream over the lazy iterator would not be `Send` for every lifetime the
    // runner's spawn asks of it.
    let reads: Vec<_> = reads.collect();
    let answers = futures_util::stream::iter(reads).buffer_unordered(AGENT_READS_AT_ONCE);
    answers.collect().await
}

//! Cluster-wide reads. `/cluster/resources` is the workhorse: one call gives every node, guest and
//! storage, so placement and VM lookup never cost one call per node, and a VM is always found on the
//! node it is on now (after a live migration too).

use std::sync::Arc;

use super::client::{Params, Pool, ProxmoxClient};
use super::error::ProxmoxError;
use super::types::{ClusterResource, NodeStatus, ResourceKind, Version, VmId, lenient};

impl ProxmoxClient {
    /// `GET /version`: cheap, and needs valid credentials: the health check.
    pub async fn version(&self) -> Result<Version, ProxmoxError> {
        self.get(&["version"], Params::new()).await
    }

    /// The provider's health as Omni shows it: `None` when the API answers and accepts our credentials,
    /// else a sentence saying what is wrong (never a secret).
    pub async fn health(&self) -> Option<String> {
        match self.version().await {
            Ok(_) => None,
            Err(e) => Some(format!(
                "Proxmox API at {} is not usable: {e}",
                self.api_url()
            )),
        }
    }

    /// `GET /nodes`.
    pub async fn nodes(&self) -> Result<Vec<NodeStatus>, ProxmoxError> {
        self.get(&["nodes"], Params::new()).await
    }

    /// `GET /cluster/resources[?type=…]`.
    ///
    /// The full listing (no `type`) is shared by callers that ask while one is being read: each
    /// gets a listing whose request was sent after it asked (as fresh as one of its own), but a
    /// hundred requests placing or tearing down machines at once cause one or two listings, not a
    /// hundred. On a cluster of a thousand guests each listing is a few hundred KiB to send, parse
    /// and hold; Proxmox builds each from every node's status.
    pub async fn cluster_resources(
        &self,
        kind: Option<ResourceKind>,
    ) -> Result<Vec<ClusterResource>, ProxmoxError> {
        if kind.is_some() {
            let params = Params::new().with_opt("type", kind.map(ResourceKind::as_query));
            return self
                .get_over(Pool::Large, &["cluster", "resources"], params)
                .await;
        }
        Ok(self.cluster_listing().await?.as_ref().clone())
    }

    /// The full `/cluster/resources` listing, shared as [`ProxmoxClient::cluster_resources`]
    /// describes, without a copy of its own: many requests in flight may each hold one.
    pub async fn cluster_listing(&self) -> Result<Arc<Vec<ClusterResource>>, ProxmoxError> {
        let asked = std::time::Instant::now();
        // One listing at a time: who asks while one is read waits, then takes it if it was sent
        // after they asked, else reads the next one (which the others waiting then share).
        let mut last = self.listing_slot().lock().await;
        if let Some((sent, listing)) = last.as_ref()
            && *sent >= asked
        {
            return Ok(listing.clone());
        }
        let sent = std::time::Instant::now();
        let mut listing: Vec<ClusterResource> = self
            .get_over(Pool::Large, &["cluster", "resources"], Params::new())
            .await?;
        // Requests in flight may each hold a listing for a while (a few hundred KiB with a
        // thousand guests): not the up to twice as much the vector grew to while it was read.
        listing.shrink_to_fit();
        let listing = Arc::new(listing);
        *last = Some((sent, listing.clone()));
        Ok(listing)
    }

    /// The guests `/cluster/resources` lists (`type=vm`: VMs and containers), VMs only.
    pub async fn vms(&self) -> Result<Vec<super::types::VmResource>, ProxmoxError> {
        Ok(self
            .cluster_resources(Some(ResourceKind::Vm))
            .await?
            .into_iter()
            .filter_map(|r| match r {
                ClusterResource::Vm(vm) => Some(vm),
                _ => None,
            })
            .collect())
    }

    /// `GET /cluster/nextid`: the lowest free VMID at this instant (Proxmox sends it as a string). Not a
    /// reservation: a concurrent create can take it, which the caller handles by choosing again.
    pub async fn next_vmid(&self) -> Result<VmId, ProxmoxError> {
        #[derive(serde::Deserialize)]
        struct Id(#[serde(deserialize_with = "lenient::u64")] u64);
        let Id(n) = self.get(&["cluster", "nextid"], Params::new()).await?;
        u32::try_from(n)
            .ok()
            .and_then(|n| VmId::new(n).ok())
            .ok_or_else(|| ProxmoxError::Decode {
                call: super::error::Call {
                    method: "GET",
                    path: "/cluster/nextid".into(),
                },
                message: format!("{n} is not a valid VMID"),
            })
    }

    /// `GET /cluster/nextid?vmid=…`: whether no guest in the whole cluster has this VMID, those the
    /// token cannot see included (the listing hides them). pve-manager answers a taken VMID with a
    /// parameter error on `vmid`, which we read by status and field, not by text.
    pub async fn vmid_is_free(&self, vmid: VmId) -> Result<bool, ProxmoxError> {
        match self
            .get::<serde_json::Value>(&["cluster", "nextid"], Params::new().with("vmid", vmid))
            .await
        {
            Ok(_) => Ok(true),
            Err(ProxmoxError::Api {
                status: 400,
                field_errors,
                ..
            }) if field_errors.contains_key("vmid") => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The cluster's name from `GET /cluster/status` (Sys.Audit on `/`), or `None` for a standalone
    /// node: pve-manager PVE/API2/Cluster.pm `get_status` lists a `type: cluster` entry only when
    /// pmxcfs knows a corosync cluster, and just the local node otherwise.
    pub async fn cluster_name(&self) -> Result<Option<String>, ProxmoxError> {
        let entries: Vec<ClusterStatusEntry> =
            self.get(&["cluster", "status"], Params::new()).await?;
        Ok(entries
            .into_iter()
            .find(|e| e.kind == "cluster")
            .and_then(|e| e.name)
            .filter(|n| !n.is_empty()))
    }
}

#[derive(Debug, serde::Deserialize)]
struct ClusterStatusEntry {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: Option<String>,
}

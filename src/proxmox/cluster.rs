//! Cluster-wide reads. `/cluster/resources` is the workhorse: one call gives every node, guest and
//! storage, so placement and VM lookup never cost one call per node, and a VM is always found on the
//! node it is on now (after a live migration too). Beside them, what a machine class names and only
//! the cluster can confirm: a node's bridges (a NIC on a bridge missing there fails only at start
//! time, on that one node) and the PCI and USB resource mappings. Last, the resource pools the VMs go
//! in.

use std::collections::BTreeMap;

use super::client::Replay::OnlyIfUnsent;
use super::client::{DELETE, POST, Params, Pool, ProxmoxClient};
use super::error::{ProxmoxError, Result};
use super::listing::Listing;
use super::types::{ClusterResource, NodeName, Version, VmId, lenient};

impl ProxmoxClient {
    /// `GET /version`: cheap, and needs valid credentials: the health check.
    pub async fn version(&self) -> Result<Version> {
        self.get(&["version"], Params::new()).await
    }

    /// The provider's health as Omni shows it: `None` when the API answers and accepts our credentials,
    /// else a sentence saying what is wrong (never a secret).
    pub async fn health(&self) -> Option<String> {
        let unusable = |e| format!("Proxmox API at {} is not usable: {e}", self.api_url());
        self.version().await.err().map(unusable)
    }

    /// `GET /cluster/resources`, shared by callers that ask while one is being read: each gets a
    /// listing whose request was sent after it asked (as fresh as one of its own), but a hundred
    /// requests placing or tearing down machines at once cause one or two listings, not a hundred.
    /// On a cluster of a thousand guests each listing is a few hundred KiB to send, parse and hold
    /// (Proxmox builds each from every node's status), so callers share it rather than copy it.
    pub async fn cluster_listing(&self) -> Result<Listing> {
        self.cluster_listing_within(std::time::Duration::ZERO).await
    }

    /// [`Self::cluster_listing`], or the last one if it was sent at most `max_age` before this
    /// call: requests that start together (a burst of one machine set) share one read.
    pub async fn cluster_listing_within(&self, max_age: std::time::Duration) -> Result<Listing> {
        let asked = std::time::Instant::now();
        let oldest = asked.checked_sub(max_age).unwrap_or(asked);
        // One listing at a time: who asks while one is read waits, then takes it if it was sent
        // after they asked (or within `max_age` before), else reads the next one (which the others
        // waiting then share).
        let mut last = self.inner.listing.lock().await;
        if let Some(listing) = last.as_ref()
            && listing.read_at >= oldest
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
        let listing = Listing::read(listing, sent);
        *last = Some(listing.clone());
        Ok(listing)
    }

    /// The guests `/cluster/resources` lists (`type=vm`: VMs and containers), VMs only.
    pub async fn vms(&self) -> Result<Vec<super::types::VmResource>> {
        let params = Params::new().with("type", "vm");
        let path = ["cluster", "resources"];
        let sent = std::time::Instant::now();
        let listing: Vec<ClusterResource> = self.get_over(Pool::Large, &path, params).await?;
        Ok(Listing::read(listing, sent).vms().cloned().collect())
    }

    /// `GET /cluster/nextid`: the lowest free VMID at this instant (Proxmox sends it as a string). Not a
    /// reservation: a concurrent create can take it, which the caller handles by choosing again.
    pub async fn next_vmid(&self) -> Result<VmId> {
        #[derive(serde::Deserialize)]
        struct Id(#[serde(deserialize_with = "lenient::u64")] u64);
        let Id(n) = self.get(&["cluster", "nextid"], Params::new()).await?;
        u32::try_from(n)
            .ok()
            .and_then(|n| VmId::new(n).ok())
            .ok_or_else(|| bad_answer("/cluster/nextid", format!("{n} is not a valid VMID")))
    }

    /// `GET /access/permissions`: the token's effective privileges on every path Proxmox reports
    /// (the top-level paths `/`, `/vms`, `/storage`, … always, plus every path with an ACL and every
    /// pool member), as pve-access-control `RPCEnvironment.pm` `get_effective_permissions` computes
    /// them: inherited ones included, paths without any privilege left out. Every token may read its
    /// own.
    pub async fn effective_privileges(&self) -> Result<EffectivePrivileges> {
        self.get(&["access", "permissions"], Params::new()).await
    }

    /// The datacenter's `next-id` range from `GET /cluster/options` (pve-manager `PVE/API2/Cluster.pm`,
    /// `get_options`: the whole datacenter.cfg with `Sys.Audit` on `/`, only a few display options
    /// without it, so the caller must know the token has it). An unset range is the default one.
    /// The range is where new VMIDs go (datacenter.cfg; Datacenter > Options > Next Free VMID
    /// Range); its upper end is exclusive.
    pub async fn next_id_range(&self) -> Result<std::ops::Range<u32>> {
        #[derive(serde::Deserialize)]
        struct Options {
            #[serde(rename = "next-id")]
            next_id: Option<NextId>,
        }
        #[derive(serde::Deserialize, Default)]
        struct NextId {
            #[serde(default, deserialize_with = "lenient::opt_u64")]
            lower: Option<u64>,
            #[serde(default, deserialize_with = "lenient::opt_u64")]
            upper: Option<u64>,
        }
        let options: Options = self.get(&["cluster", "options"], Params::new()).await?;
        let NextId { lower, upper } = options.next_id.unwrap_or_default();
        let bound = |v: Option<u64>, or: u32| v.map_or(Some(or), |v| u32::try_from(v).ok());
        // pve-cluster `DataCenterConfig.pm`, `$next_id_format`: 100 up to (not including) one
        // million when unset, which is below the largest VMID on purpose.
        bound(lower, 100)
            .zip(bound(upper, 1_000_000))
            .map(|(lower, upper)| lower..upper)
            .ok_or_else(|| bad_answer("/cluster/options", "next-id bounds out of range".into()))
    }

    /// `GET /cluster/nextid?vmid=…`: whether no guest in the whole cluster has this VMID, those the
    /// token cannot see included (the listing hides them). pve-manager answers a taken VMID with a
    /// parameter error on `vmid`, which we read by status and field, not by text.
    pub async fn vmid_is_free(&self, vmid: VmId) -> Result<bool> {
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

    /// Quorum and membership from `GET /cluster/status` (Sys.Audit on `/`).
    pub async fn cluster_health(&self) -> Result<ClusterHealth> {
        let entries: Vec<ClusterStatusEntry> =
            self.get(&["cluster", "status"], Params::new()).await?;
        let cluster = entries.iter().find(|e| e.kind == "cluster");
        let mut members: Vec<ClusterMember> = entries
            .iter()
            .filter(|e| e.kind == "node")
            .filter_map(|e| {
                Some(ClusterMember {
                    name: e.name.clone()?,
                    online: e.online,
                })
            })
            .collect();
        members.sort();
        Ok(ClusterHealth {
            name: cluster
                .and_then(|c| c.name.clone())
                .filter(|n| !n.is_empty()),
            quorate: cluster.map(|c| c.quorate),
            members,
        })
    }

    /// `GET /nodes/{node}/network?type=…`: `type` is `any_bridge` (Linux and OVS bridges, every
    /// Proxmox VE version) or `include_sdn` (those plus SDN VNets, which guests can use as a
    /// `bridge=` too; Proxmox VE 9.0 and later).
    pub async fn node_networks(
        &self,
        node: &NodeName,
        kind: &str,
    ) -> Result<Vec<NetworkInterface>> {
        let params = Params::new().with("type", kind);
        self.get(&["nodes", node.as_str(), "network"], params).await
    }

    /// `GET /cluster/mapping/<kind>`, `pci` or `usb`: the resource mappings that
    /// `pci_devices[].mapping` and `usb_devices[].mapping` name.
    pub async fn resource_mappings(&self, kind: &str) -> Result<Vec<ResourceMapping>> {
        self.get(&["cluster", "mapping", kind], Params::new()).await
    }

    // Resource pools: the official provider puts each machine-request set's VMs in a pool named
    // after the set unless the class names one, creates it on demand and removes it once empty. We
    // do the same.

    /// `POST /pools`. A pool that already exists is success.
    pub async fn ensure_pool(&self, pool: &str, comment: &str) -> Result<()> {
        let params = Params::new().with("poolid", pool).with("comment", comment);
        match self.write(POST, &["pools"], params, OnlyIfUnsent).await {
            Err(ProxmoxError::Api { message, .. }) if message.contains("already exists") => Ok(()),
            other => other,
        }
    }

    /// The comment of `pool` from `GET /pools` (each pool's ID and comment; pve-manager Pool.pm
    /// `index`), `None` when there is no such pool or it has no comment.
    pub async fn pool_comment(&self, pool: &str) -> Result<Option<String>> {
        #[derive(serde::Deserialize)]
        struct Entry {
            poolid: String,
            comment: Option<String>,
        }
        let pools: Vec<Entry> = self.get(&["pools"], Params::new()).await?;
        let pool = pools.into_iter().find(|p| p.poolid == pool);
        Ok(pool.and_then(|p| p.comment))
    }

    /// `DELETE /pools?poolid=…` (PVE 8.1 and later), else `DELETE /pools/{poolid}`, which older PVE
    /// have (pve-manager Pool.pm: the query form came with nested pools and answers 501 before).
    /// Returns false when the pool is not empty or already gone, which is not an error for someone
    /// cleaning up.
    pub async fn delete_pool_if_empty(&self, pool: &str) -> Result<bool> {
        let by_query = Params::new().with("poolid", pool);
        let answer = match self.write(DELETE, &["pools"], by_query, OnlyIfUnsent).await {
            Err(ProxmoxError::Api { status: 501, .. }) => {
                let path = ["pools", pool];
                self.write(DELETE, &path, Params::new(), OnlyIfUnsent).await
            }
            other => other,
        };
        match answer {
            Ok(()) => Ok(true),
            Err(ProxmoxError::Api { message, .. })
                if message.contains("not empty") || message.contains("does not exist") =>
            {
                Ok(false)
            }
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// An answer to `GET <path>` that is not what the API documents.
fn bad_answer(path: &str, message: String) -> ProxmoxError {
    let call = super::error::Call {
        method: "GET",
        path: path.into(),
    };
    ProxmoxError::Decode { call, message }
}

/// The cluster's quorum and corosync membership, as pve-manager PVE/API2/Cluster.pm `get_status`
/// reports them: one `type: cluster` entry (name, `quorate`) when there is a cluster, and one
/// `type: node` entry per member (`online`). Without quorum pmxcfs makes /etc/pve read-only and
/// every change is refused (pve-cluster src/PVE/Cluster.pm `check_cfs_quorum`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClusterHealth {
    /// `None` for a standalone node, which needs no quorum.
    pub name: Option<String>,
    /// `None` for a standalone node.
    pub quorate: Option<bool>,
    pub members: Vec<ClusterMember>,
}

/// Ordered by name first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct ClusterMember {
    pub name: String,
    pub online: bool,
}

impl ClusterHealth {
    /// "quorate, 3 of 3 members online", "NO QUORUM, 1 of 3 members online (pve1)", or
    /// "standalone node".
    pub fn summary(&self) -> String {
        let Some(quorate) = self.quorate else {
            return "standalone node".into();
        };
        let online: Vec<&str> = self
            .members
            .iter()
            .filter(|m| m.online)
            .map(|m| m.name.as_str())
            .collect();
        let counts = format!("{} of {} members online", online.len(), self.members.len());
        if quorate {
            format!("quorate, {counts}")
        } else {
            format!(
                "NO QUORUM, {counts} ({}): Proxmox refuses every change (VM create, start, pools, HA) until enough members are back",
                online.join(", ")
            )
        }
    }
}

#[derive(Debug, serde::Deserialize)]
struct ClusterStatusEntry {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    #[serde(default, deserialize_with = "super::types::lenient::bool")]
    quorate: bool,
    #[serde(default, deserialize_with = "super::types::lenient::bool")]
    online: bool,
}

/// What [`ProxmoxClient::effective_privileges`] read: by ACL path, the privileges held there (each
/// with its "propagate" flag, which is not read).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct EffectivePrivileges(BTreeMap<String, BTreeMap<String, serde_json::Value>>);

impl EffectivePrivileges {
    /// Whether the token holds `privilege` on `path` (a path missing from the answer holds none).
    pub fn holds(&self, path: &str, privilege: &str) -> bool {
        self.0.get(path).is_some_and(|p| p.contains_key(privilege))
    }

    /// The privileges held on `path`.
    pub fn on(&self, path: &str) -> impl Iterator<Item = &str> {
        self.0
            .get(path)
            .into_iter()
            .flat_map(|p| p.keys().map(String::as_str))
    }
}

/// One entry of `GET /nodes/{node}/network`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct NetworkInterface {
    pub iface: String,
    /// `bridge`, `OVSBridge`, `vnet`, `eth`, `bond`, ...
    #[serde(rename = "type", default)]
    pub kind: String,
}

/// One resource mapping: its ID and one `map` entry per node (`node=pve1,path=0000:01:00.0,...`).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ResourceMapping {
    pub id: String,
    #[serde(default)]
    pub map: Vec<String>,
}

impl ResourceMapping {
    /// The nodes the mapping has a device on.
    pub fn nodes(&self) -> Vec<&str> {
        self.map
            .iter()
            .filter_map(|entry| {
                entry
                    .split(',')
                    .find_map(|kv| kv.trim().strip_prefix("node="))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_nodes() {
        let m: ResourceMapping = serde_json::from_str(
            r#"{"id":"gpu","map":["node=pve1,path=0000:01:00.0,id=10de:2204","id=1:2,node=pve2"]}"#,
        )
        .unwrap();
        assert_eq!(m.nodes(), ["pve1", "pve2"]);
    }
}

//! Node network reads: which bridges a node has, so a machine class naming `vmbr1` can be checked
//! before a VM is created with a NIC on a bridge that does not exist there (Proxmox would only refuse
//! at start time, on that one node).

use serde::Deserialize;

use super::client::{Params, ProxmoxClient};
use super::error::Result;
use super::types::NodeName;

/// One entry of `GET /nodes/{node}/network`.
#[derive(Debug, Clone, Deserialize)]
pub struct NetworkInterface {
    pub iface: String,
    /// `bridge`, `OVSBridge`, `vnet`, `eth`, `bond`, ...
    #[serde(rename = "type", default)]
    pub kind: String,
}

impl ProxmoxClient {
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
}

/// One resource mapping: its ID and one `map` entry per node (`node=pve1,path=0000:01:00.0,...`).
#[derive(Debug, Clone, Deserialize)]
pub struct ResourceMapping {
    pub id: String,
    #[serde(default)]
    pub map: Vec<String>,
}

impl ResourceMapping {
    /// The nodes the mapping has a device on.
    pub fn nodes(&self) -> Vec<String> {
        self.map
            .iter()
            .filter_map(|entry| {
                entry
                    .split(',')
                    .find_map(|kv| kv.trim().strip_prefix("node="))
                    .map(str::to_owned)
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

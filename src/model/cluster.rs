//! The cluster as one `/cluster/resources` read describes it: nodes, the storages of each node (in API
//! order, which is the order "the first storage that fits" walks), and the VMs on each node.

use std::collections::BTreeMap;

use crate::proxmox::property::StorageId;
use crate::proxmox::types::{ClusterResource, NodeName, NodeState, VmResource, split_list};

pub const GIB: u64 = 1024 * 1024 * 1024;
pub const MIB: u64 = 1024 * 1024;

/// A storage of one node, as `/cluster/resources` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageSnapshot {
    pub name: StorageId,
    pub storage_type: String,
    /// Content types (`images`, `iso`, …).
    pub content: Vec<String>,
    pub active: bool,
    pub shared: bool,
    /// Free bytes.
    pub available: u64,
}

impl StorageSnapshot {
    pub fn holds(&self, content: &str) -> bool {
        self.content.iter().any(|c| c == content)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSnapshot {
    pub name: NodeName,
    pub online: bool,
    /// Bytes in use and in total (`mem`, `maxmem`).
    pub memory_used: u64,
    pub memory_max: u64,
    /// Logical CPUs (`maxcpu`); 0 when the node reports none (offline).
    pub cpus: u64,
    /// The VMs on the node, templates left out: they are not VMs of a set, and they never run.
    pub vms: Vec<VmResource>,
    pub storages: Vec<StorageSnapshot>,
}

impl NodeSnapshot {
    pub fn storage(&self, name: &str) -> Option<&StorageSnapshot> {
        self.storages.iter().find(|s| s.name.as_str() == name)
    }
}

/// Every node of the cluster, sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSnapshot {
    pub nodes: Vec<NodeSnapshot>,
}

impl ClusterSnapshot {
    /// Reads one `/cluster/resources` listing. Storages and VMs of a node the listing does not name
    /// are dropped: nothing can be placed there.
    pub fn from_resources(resources: &[ClusterResource]) -> Self {
        let mut nodes: BTreeMap<NodeName, NodeSnapshot> = BTreeMap::new();
        for r in resources {
            if let ClusterResource::Node(n) = r {
                nodes.insert(
                    n.node.clone(),
                    NodeSnapshot {
                        name: n.node.clone(),
                        online: n.status == NodeState::Online,
                        memory_used: n.mem.unwrap_or(0),
                        memory_max: n.maxmem.unwrap_or(0),
                        cpus: n.maxcpu.unwrap_or(0),
                        vms: Vec::new(),
                        storages: Vec::new(),
                    },
                );
            }
        }
        for r in resources {
            match r {
                ClusterResource::Vm(vm) if !vm.template => {
                    if let Some(node) = nodes.get_mut(&vm.node) {
                        node.vms.push(vm.clone());
                    }
                }
                ClusterResource::Storage(s) => {
                    // A storage ID Proxmox would not accept (`pve-storage-id`) names no storage
                    // anything can be placed on.
                    if let (Some(node), Ok(name)) =
                        (nodes.get_mut(&s.node), StorageId::new(s.storage.as_str()))
                    {
                        let total = s.maxdisk.unwrap_or(0);
                        let content = split_list(s.content.as_deref().unwrap_or_default());
                        node.storages.push(StorageSnapshot {
                            name,
                            storage_type: s.plugintype.clone().unwrap_or_default(),
                            content: content.into_iter().map(str::to_owned).collect(),
                            active: s.status.as_deref() == Some("available"),
                            shared: s.shared,
                            available: total.saturating_sub(s.disk.unwrap_or(0)),
                        });
                    }
                }
                _ => {}
            }
        }
        Self {
            nodes: nodes.into_values().collect(),
        }
    }

    pub fn node(&self, name: &str) -> Option<&NodeSnapshot> {
        self.nodes.iter().find(|n| n.name.as_str() == name)
    }

    /// Node names, sorted.
    pub fn node_names(&self) -> Vec<&str> {
        self.nodes.iter().map(|n| n.name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_from_resources() {
        let r: Vec<ClusterResource> = serde_json::from_str(
            r#"[
            {"type":"node","node":"pve1","status":"online","mem":100,"maxmem":1000,"maxcpu":8},
            {"type":"node","node":"pve2","status":"offline"},
            {"type":"qemu","vmid":101,"node":"pve1","name":"r1","tags":"machine-request.s;x","maxcpu":2,"maxmem":400},
            {"type":"qemu","vmid":9000,"node":"pve1","name":"t","template":1,"maxcpu":2,"maxmem":300},
            {"type":"storage","storage":"local-lvm","node":"pve1","content":"images,rootdir","status":"available","disk":10,"maxdisk":110,"plugintype":"lvmthin"},
            {"type":"storage","storage":"orphan","node":"pve9","content":"images"}
        ]"#,
        )
        .unwrap();
        let s = ClusterSnapshot::from_resources(&r);
        assert_eq!(s.node_names(), ["pve1", "pve2"]);
        let pve1 = s.node("pve1").unwrap();
        assert_eq!(pve1.vms.len(), 1, "templates are not VMs of a set");
        assert_eq!(pve1.vms[0].tag_list(), ["machine-request.s", "x"]);
        assert_eq!(pve1.memory_max - pve1.memory_used, 900);
        let given = |of: fn(&VmResource) -> Option<u64>| pve1.vms.iter().filter_map(of).sum();
        assert_eq!((pve1.cpus, given(|vm| vm.maxcpu)), (8, 2));
        assert_eq!(
            given(|vm| vm.maxmem),
            400,
            "the template's memory is not counted"
        );
        let lvm = pve1.storage("local-lvm").unwrap();
        assert_eq!(lvm.available, 100);
        assert!(lvm.active && lvm.holds("images"));
        assert!(!s.node("pve2").unwrap().online);
    }
}

//! One node placement could choose, with the data resolved as it would be there (its `nodes:`
//! override applied): storages, boot image, bridges and passthrough devices. The storage verdicts
//! are those of [`crate::rules::storage::choose`] and [`placement::boot_disk_storage`], rendered with
//! the reason for every storage passed over.

use super::cluster::{ClusterCheck, class_request};
use super::{Finding, Outcome, list_or_none};
use crate::model::{GIB, NodeSnapshot};
use crate::pipeline::prepare_image::BootImage;
use crate::proxmox::cluster::ResourceMapping;
use crate::rules::placement::{self, CloneRefusal, LeftOut, Reservations};
use crate::rules::provider_data::ProviderData;
use crate::rules::storage::{self, StorageChoice, StorageNeed};

/// One node's check: the node, and the data as it resolves there.
struct NodeCheck<'a> {
    check: &'a ClusterCheck<'a>,
    node: &'a NodeSnapshot,
    /// The node's name.
    n: &'a str,
    here: ProviderData,
}

/// Placement's verdicts on one node, for the findings about the cluster as a whole: why memory and
/// vCPUs leave it out ([`placement::capacity_fit`]), if they do, and with `boot: clone` what a clone
/// onto it would be (a sentence), or why there is none.
type NodeVerdicts = (Option<LeftOut>, Option<Result<String, CloneRefusal>>);

/// Checks `node` into `out`; returns placement's verdicts there, or `None` when the data does not
/// even resolve on this node (those problems are in `out`).
pub(crate) fn check_node(
    check: &ClusterCheck<'_>,
    node: &NodeSnapshot,
    out: &mut Vec<Finding>,
) -> Option<NodeVerdicts> {
    let n = node.name.as_str();
    let problems = |problems| out.extend(Outcome::Problem.findings(problems).map(|f| f.on(n)));
    let here = check.layers.resolve_on(Some(n)).map_err(problems).ok()?;
    let at = NodeCheck {
        check,
        node,
        n,
        here,
    };
    // The request placement would get for the data here, with the config's `placement:` limits,
    // which placement's verdicts count against.
    let clone = check
        .view
        .clone_source
        .as_ref()
        .and_then(|c| c.as_ref().ok());
    let request = class_request(&at.here, check.layers.config.placement, clone);
    at.disks(&placement::boot_disk_storage(node, &request), out);
    at.isos(out);
    at.network(out);
    at.devices(out);
    // The clone verdict is placement's own (`disk_verdict`); a plain storage shortfall or a
    // failing selector is already reported by the disk findings above.
    let clone = request
        .clone
        .and_then(|source| match placement::disk_verdict(node, &request) {
            Ok(Ok((storage, Some(vmid)))) => {
                let copy = source.templates.iter().find(|t| t.vmid == vmid);
                let (mode, on) = (source.mode.as_str(), copy.map_or("?", |t| t.node.as_str()));
                let (wanted, to) = (&source.wanted, &storage.name);
                Some(Ok(format!(
                    "a {mode} clone of template {wanted} ({vmid} on {on}) goes to {to}"
                )))
            }
            Ok(Err(LeftOut::Clone(refusal))) => Some(Err(*refusal)),
            _ => None,
        });
    let capacity = placement::capacity_fit(node, &request, &Reservations::default());
    Some((capacity.err(), clone))
}

impl NodeCheck<'_> {
    /// `key` as the user must change it for this node.
    fn key(&self, key: &str) -> String {
        self.check.layers.key(key, Some(self.n))
    }

    fn is_stand_in(&self, key: &str) -> bool {
        self.check.layers.is_stand_in(key, Some(self.n))
    }

    /// The boot disk (with the additional disks, as placement wants them) and each additional disk.
    fn disks(&self, main: &StorageChoice, out: &mut Vec<Finding>) {
        let (n, here) = (self.n, &self.here);
        if !self.is_stand_in("storage_selector") {
            let need = StorageNeed::boot_disk(&here.storage_selector, here.total_disk_gb());
            let mut finding = self.storage(self.key("storage_selector"), &need, main);
            if self.check.data.node.is_none() && main.chosen.is_none() {
                finding.message.push_str(&format!(
                    " (placement would skip {n}; fix the selector, add a `nodes.{n}.storage_selector` override, or leave {n} out of `allowed_nodes`)"
                ));
            }
            out.push(finding);
        }
        for (i, disk) in here.additional_disks.iter().enumerate() {
            let need = StorageNeed::boot_disk(&disk.storage_selector, disk.size_gb);
            let choice = storage::choose(self.node, &need);
            let key = format!("{}[{i}].storage_selector", self.key("additional_disks"));
            out.push(self.storage(key, &need, &choice));
        }
    }

    /// ISO (or disk image) storage for boot modes `iso` and `image`.
    fn isos(&self, out: &mut Vec<Finding>) {
        if let Some(kind) = BootImage::of(self.here.boot)
            && !self.is_stand_in("iso_storage_selector")
        {
            let selector = self.here.iso_storage_selector.as_ref();
            let need = StorageNeed::download(kind.content, selector);
            let choice = storage::choose(self.node, &need);
            out.push(self.storage(self.key("iso_storage_selector"), &need, &choice));
        }
    }

    /// The storage chosen for `need`, or why each storage on the node was passed over.
    fn storage(&self, key: String, need: &StorageNeed, choice: &StorageChoice) -> Finding {
        let (what, node, need_gb) = (need.content.describe(), self.n, need.size_gb);
        if let Some(s) = &choice.chosen {
            let room = match need_gb {
                0 => String::new(),
                _ => format!(" ({} GiB free, {need_gb} GiB needed)", s.available / GIB),
            };
            let message = format!("{what} go to {}{room}", s.name);
            return Outcome::Pass.finding(key, message).on(node);
        }
        let reasons = if choice.rejected.is_empty() {
            "the node reports no storages".to_string()
        } else {
            let reasons = choice.rejected.iter().map(|(s, why)| format!("{s}: {why}"));
            reasons.collect::<Vec<_>>().join("; ")
        };
        let matched = match need.selector {
            Some(sel) => format!("`{sel}` matches no"),
            None => "there is no".to_string(),
        };
        let room = match need_gb {
            0 => String::new(),
            _ => format!(" with {need_gb} GiB free"),
        };
        let message = format!("{matched} active storage for {what} on {node}{room}: {reasons}");
        Outcome::Problem.finding(key, message).on(node)
    }

    /// The bridges of the NICs, when the node's bridges could be read.
    fn network(&self, out: &mut Vec<Finding>) {
        let (n, here) = (self.n, &self.here);
        // A NIC on an IP pool that names a bridge goes on that bridge (the data is resolved with
        // it): the key to change is the pool's.
        let pool_bridge = |pool: Option<&str>| {
            let mut pools = self.check.layers.config.ip_pools.iter();
            let pool = pools.find(|p| p.bridge.is_some() && Some(p.name.as_str()) == pool)?;
            Some(format!("ipPools.{}.bridge", pool.name))
        };
        let mut wanted = Vec::new();
        if let Some(key) = pool_bridge(here.ip_pool.as_deref()) {
            wanted.push((key, here.network_bridge.to_string()));
        } else if !self.is_stand_in("network_bridge") {
            wanted.push((self.key("network_bridge"), here.network_bridge.to_string()));
        }
        for (i, nic) in here.additional_nics.iter().enumerate() {
            let key = pool_bridge(nic.ip_pool.as_deref())
                .unwrap_or_else(|| format!("{}[{i}].bridge", self.key("additional_nics")));
            wanted.push((key, nic.bridge.to_string()));
        }
        let bridges = match self.check.view.bridges.get(n) {
            None => return,
            Some(Ok(bridges)) => bridges,
            Some(Err(why)) => {
                let message = format!("bridges not checked: {why}");
                let finding = Outcome::Warning.finding(self.key("network_bridge"), message);
                return out.push(finding.on(n));
            }
        };
        for (key, bridge) in wanted {
            let finding = if bridges.contains(&bridge) {
                Outcome::Pass.finding(key, format!("bridge {bridge} exists"))
            } else {
                let list = list_or_none(bridges);
                let message =
                    format!("bridge {bridge:?} does not exist on {n}; its bridges: {list}");
                Outcome::Problem.finding(key, message)
            };
            out.push(finding.on(n));
        }
    }

    /// PCI and USB passthrough: the resource mappings must exist and have a device on this node.
    fn devices(&self, out: &mut Vec<Finding>) {
        let (here, view) = (&self.here, self.check.view);
        let pci = here.pci_devices.iter().map(|d| d.mapping.as_str());
        let usb = here.usb_devices.iter().map(|d| d.mapping.as_str());
        let devices: [(_, _, Vec<&str>, _); 2] = [
            ("pci_devices", "PCI", pci.collect(), &view.pci_mappings),
            ("usb_devices", "USB", usb.collect(), &view.usb_mappings),
        ];
        for (list, kind, ids, known) in devices {
            let Some(known) = known else { continue };
            for (i, id) in ids.iter().enumerate() {
                let key = format!("{}[{i}].mapping", self.key(list));
                let (outcome, message) = mapping_verdict(self.n, kind, id, known);
                out.push(outcome.finding(key, message).on(self.n));
            }
        }
    }
}

/// Whether the resource mapping `id` exists and has a device on `node`, as far as `known` tells.
fn mapping_verdict(
    node: &str,
    kind: &str,
    id: &str,
    known: &Result<Vec<ResourceMapping>, String>,
) -> (Outcome, String) {
    let list = match known {
        Err(why) => {
            let message = format!("{kind} resource mappings not checked: {why}");
            return (Outcome::Skipped, message);
        }
        Ok(list) => list,
    };
    match list.iter().find(|m| m.id == id) {
        None => (
            Outcome::Problem,
            format!(
                "{kind} resource mapping {id:?} does not exist (Datacenter > Resource Mappings); existing: {}",
                list_or_none(&list.iter().map(|m| m.id.clone()).collect::<Vec<_>>())
            ),
        ),
        Some(m) if !m.nodes().contains(&node) => (
            Outcome::Problem,
            format!(
                "{kind} resource mapping {id:?} has no device on {node} (it has: {})",
                list_or_none(&m.nodes())
            ),
        ),
        Some(_) => (
            Outcome::Pass,
            format!("{kind} resource mapping {id} has a device here"),
        ),
    }
}

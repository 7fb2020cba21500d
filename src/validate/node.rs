//! One node placement could choose, with the data resolved as it would be there (its `nodes:`
//! override applied): storages, boot image, bridges and passthrough devices. The storage verdicts
//! are those of [`crate::rules::storage::choose`] and [`placement::boot_disk_storage`], rendered with
//! the reason for every storage passed over.

use super::cluster::ClusterCheck;
use super::report::{Finding, Outcome, list_or_none};
use crate::model::{GIB, NodeSnapshot};
use crate::pipeline::prepare_image::BootImage;
use crate::proxmox::network::mapping::ResourceMapping;
use crate::rules::placement::{self, CloneRefusal, LeftOut, Reservations};
use crate::rules::provider_data::ProviderData;
use crate::rules::storage::{self, Content, StorageChoice, StorageNeed};
use crate::rules::storage_selector::StorageSelector;

/// Placement's verdicts on one node, for the findings about the cluster as a whole.
pub(crate) struct NodeOutcome {
    /// Memory and vCPUs ([`placement::capacity_fit`]).
    pub capacity: Result<u64, LeftOut>,
    /// `boot: clone`: what a clone onto this node would be (a sentence), or why there is none.
    pub clone: Option<Result<String, CloneRefusal>>,
}

/// Checks `node` into `out`; returns placement's verdicts there, or `None` when the data does not
/// even resolve on this node (those problems are in `out`).
pub(crate) fn check_node(
    check: &ClusterCheck<'_>,
    node: &NodeSnapshot,
    out: &mut Vec<Finding>,
) -> Option<NodeOutcome> {
    let n = node.name.as_str();
    let here = match check.layers.resolve_on(check.schema, Some(n)) {
        Ok(d) => d,
        Err(problems) => {
            out.extend(Outcome::Problem.findings(problems).map(|f| f.on(n)));
            return None;
        }
    };
    let request = check.request(&here);
    let main = placement::boot_disk_storage(node, &request);
    disk_findings(check, node, &here, &main, out);
    iso_findings(check, node, &here, out);
    network_findings(check, node, &here, out);
    device_findings(check, node, &here, out);
    // The clone verdict is placement's own (`disk_verdict`); a plain storage shortfall or a
    // failing selector is already reported by the disk findings above.
    let clone = request
        .clone
        .and_then(|source| match placement::disk_verdict(node, &request) {
            Ok(Ok((storage, Some(vmid)))) => Some(Ok(format!(
                "a {} clone of template {} ({vmid} on {}) goes to {}",
                source.mode.as_str(),
                source.wanted,
                source
                    .templates
                    .iter()
                    .find(|t| t.vmid == vmid)
                    .map_or("?", |t| t.node.as_str()),
                storage.name
            ))),
            Ok(Err(LeftOut::Clone(refusal))) => Some(Err(*refusal)),
            _ => None,
        });
    Some(NodeOutcome {
        capacity: placement::capacity_fit(node, &request, &Reservations::default()),
        clone,
    })
}

/// The boot disk (with the additional disks, as placement wants them) and each additional disk.
fn disk_findings(
    check: &ClusterCheck<'_>,
    node: &NodeSnapshot,
    here: &ProviderData,
    main: &StorageChoice,
    out: &mut Vec<Finding>,
) {
    let n = node.name.as_str();
    let layers = check.layers;
    if !layers.is_stand_in("storage_selector", Some(n)) {
        let mut finding = storage_finding(
            layers.key("storage_selector", Some(n)),
            n,
            Some(&here.storage_selector),
            here.total_disk_gb(),
            main,
            Content::VmDisks,
        );
        if check.data.node.is_none() && main.chosen.is_none() {
            finding.message.push_str(&format!(
                " (placement would skip {n}; fix the selector, add a `nodes.{n}.storage_selector` override, or leave {n} out of `allowed_nodes`)"
            ));
        }
        out.push(finding);
    }
    for (i, disk) in here.additional_disks.iter().enumerate() {
        let choice = storage::choose(
            node,
            &StorageNeed::additional_disk(&disk.storage_selector, disk.size_gb),
        );
        out.push(storage_finding(
            format!(
                "{}[{i}].storage_selector",
                layers.key("additional_disks", Some(n))
            ),
            n,
            Some(&disk.storage_selector),
            disk.size_gb,
            &choice,
            Content::VmDisks,
        ));
    }
}

/// ISO (or disk image) storage for boot modes `iso` and `image`.
fn iso_findings(
    check: &ClusterCheck<'_>,
    node: &NodeSnapshot,
    here: &ProviderData,
    out: &mut Vec<Finding>,
) {
    let n = node.name.as_str();
    let layers = check.layers;
    if let Some(kind) = BootImage::of(here.boot)
        && !layers.is_stand_in("iso_storage_selector", Some(n))
    {
        let selector = here.iso_storage_selector.as_ref();
        let content = kind.content();
        let choice = storage::choose(node, &StorageNeed::download(content, selector));
        out.push(storage_finding(
            layers.key("iso_storage_selector", Some(n)),
            n,
            selector,
            0,
            &choice,
            content,
        ));
    }
}

/// The chosen storage, or why each storage on the node was passed over.
fn storage_finding(
    key: String,
    node: &str,
    selector: Option<&StorageSelector>,
    need_gb: u64,
    choice: &StorageChoice,
    content: Content,
) -> Finding {
    let what = content.describe();
    if let Some(s) = &choice.chosen {
        let message = if need_gb > 0 {
            format!(
                "{what} go to {} ({} GiB free, {need_gb} GiB needed)",
                s.name,
                s.available / GIB
            )
        } else {
            format!("{what} go to {}", s.name)
        };
        return Outcome::Pass.finding(key, message).on(node);
    }
    let reasons = if choice.rejected.is_empty() {
        "the node reports no storages".to_string()
    } else {
        choice
            .rejected
            .iter()
            .map(|(s, why)| format!("{s}: {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let matched = match selector {
        Some(sel) => format!("`{}` matches no", sel.expression()),
        None => "there is no".to_string(),
    };
    let room = if need_gb > 0 {
        format!(" with {need_gb} GiB free")
    } else {
        String::new()
    };
    let message = format!("{matched} active storage for {what} on {node}{room}: {reasons}");
    Outcome::Problem.finding(key, message).on(node)
}

/// The bridges of the NICs, when the node's bridges could be read.
fn network_findings(
    check: &ClusterCheck<'_>,
    node: &NodeSnapshot,
    here: &ProviderData,
    out: &mut Vec<Finding>,
) {
    let n = node.name.as_str();
    let layers = check.layers;
    // A NIC on an IP pool that names a bridge goes on that bridge (the data is resolved with it):
    // the key to change is the pool's.
    let pool_bridge = |pool: Option<&str>| {
        pool.and_then(|name| {
            check
                .layers
                .ip_pools
                .iter()
                .find(|p| p.name == name && p.bridge.is_some())
                .map(|p| format!("ipPools.{}.bridge", p.name))
        })
    };
    let mut wanted = Vec::new();
    if let Some(key) = pool_bridge(here.ip_pool.as_deref()) {
        wanted.push((key, here.network_bridge.to_string()));
    } else if !layers.is_stand_in("network_bridge", Some(n)) {
        wanted.push((
            layers.key("network_bridge", Some(n)),
            here.network_bridge.to_string(),
        ));
    }
    for (i, nic) in here.additional_nics.iter().enumerate() {
        let key = pool_bridge(nic.ip_pool.as_deref())
            .unwrap_or_else(|| format!("{}[{i}].bridge", layers.key("additional_nics", Some(n))));
        wanted.push((key, nic.bridge.to_string()));
    }
    match check.view.bridges.get(n) {
        None => {}
        Some(Err(why)) => {
            let key = layers.key("network_bridge", Some(n));
            out.push(
                Outcome::Warning
                    .finding(key, format!("bridges not checked: {why}"))
                    .on(n),
            );
        }
        Some(Ok(bridges)) => {
            for (key, bridge) in wanted {
                let finding = if bridges.iter().any(|b| b == &bridge) {
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
    }
}

/// PCI and USB passthrough: the resource mappings must exist and have a device on this node.
fn device_findings(
    check: &ClusterCheck<'_>,
    node: &NodeSnapshot,
    here: &ProviderData,
    out: &mut Vec<Finding>,
) {
    let n = node.name.as_str();
    let pci = here.pci_devices.iter().map(|d| d.mapping.to_string());
    let usb = here.usb_devices.iter().map(|d| d.mapping.to_string());
    let view = check.view;
    let devices = [
        (
            "pci_devices",
            "PCI",
            pci.collect::<Vec<_>>(),
            &view.pci_mappings,
        ),
        ("usb_devices", "USB", usb.collect(), &view.usb_mappings),
    ];
    for (list, kind, ids, known) in devices {
        let Some(known) = known else {
            continue;
        };
        for (i, id) in ids.iter().enumerate() {
            let key = format!("{}[{i}].mapping", check.layers.key(list, Some(n)));
            let (outcome, message) = mapping_verdict(n, kind, id, known);
            out.push(outcome.finding(key, message).on(n));
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
        Some(m) if !m.nodes().iter().any(|n| n == node) => (
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

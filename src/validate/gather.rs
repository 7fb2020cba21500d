//! The reads, at the edge: one `/cluster/resources`, the bridges of the candidate nodes (in parallel),
//! the PCI/USB resource mappings and the Proxmox VE version only when the data needs them, and with
//! `boot: clone` the config of each copy of the template (where its drives are).

use futures_util::future::OptionFuture;
use serde_json::{Map, Value};

use super::check_schema;
use super::checks::check_cluster;
use super::cluster::{ClusterFacts, candidate_nodes};
use super::layers::Layers;
use super::report::Report;
use crate::model::ClusterSnapshot;
use crate::pipeline::template::clone_source;
use crate::proxmox::network::{MappingKind, NetworkFilter};
use crate::proxmox::types::NodeName;
use crate::proxmox::{ProxmoxClient, ProxmoxError};
use crate::rules::placement::PlacementLimits;
use crate::rules::provider_data::{
    BootMode, ProviderData, ProviderDataSchema, needs_release_check,
};

/// Reads what the checks need for `data`: `/cluster/resources`, the bridges of every online candidate
/// node (in parallel), and the PCI/USB mappings when the data (or a node override) names devices.
pub async fn gather(
    pve: &ProxmoxClient,
    data: &ProviderData,
    config_nodes: &Map<String, Value>,
    placement: PlacementLimits,
) -> Result<ClusterFacts, ProxmoxError> {
    let resources = pve.cluster_listing().await?;
    let cluster = ClusterSnapshot::from_resources(&resources);
    let online = candidate_nodes(data, &cluster).into_iter();
    let answers = futures_util::future::join_all(
        online
            .filter(|n| n.online)
            .map(|n| async { (n.name.to_string(), bridges(pve, &n.name).await) }),
    )
    .await;
    let uses = |key: &str, in_data: bool| {
        // A missing key (or a node override that is not a map) indexes as null.
        in_data || (config_nodes.values()).any(|v| v[key].as_array().is_some_and(|a| !a.is_empty()))
    };
    let mappings = |kind, used: bool| {
        let read = async move { pve.resource_mappings(kind).await.map_err(|e| e.to_string()) };
        OptionFuture::from(used.then_some(read))
    };
    let pci_used = uses("pci_devices", !data.pci_devices.is_empty());
    let pci_mappings = mappings(MappingKind::Pci, pci_used).await;
    let usb_used = uses("usb_devices", !data.usb_devices.is_empty());
    let usb_mappings = mappings(MappingKind::Usb, usb_used).await;
    let version = needs_release_check(data).then_some(async {
        let version = pve.version().await;
        version.map(|v| v.version).map_err(|e| e.to_string())
    });
    let pve_version = OptionFuture::from(version).await;
    let clone_source = match (data.boot, &data.template) {
        (BootMode::Clone, Some(wanted)) => Some(
            clone_source(pve, &resources, &cluster, wanted, data.clone_mode)
                .await
                .map_err(|e| e.to_string()),
        ),
        _ => None,
    };
    // Proxmox VE 8 has no HA rules (501): the release check says so.
    let ha_rules = match data.ha.as_ref().filter(|ha| ha.uses_rules()) {
        Some(_) => match pve.ha_rules().await {
            Err(ProxmoxError::Api { status: 501, .. }) => None,
            read => Some(read.map_err(|e| e.to_string())),
        },
        None => None,
    };
    let health = Some(pve.cluster_health().await.map_err(|e| e.to_string()));
    Ok(ClusterFacts {
        health,
        ha_rules,
        clone_source,
        placement,
        resources,
        bridges: answers.into_iter().collect(),
        pci_mappings,
        usb_mappings,
        pve_version,
    })
}

/// Bridges and SDN VNets of a node; Proxmox before 9.0 does not know `include_sdn` (a parameter error
/// on `type`), so that refusal falls back to plain bridges.
async fn bridges(pve: &ProxmoxClient, node: &NodeName) -> Result<Vec<String>, String> {
    let list = match pve
        .node_networks(node, Some(NetworkFilter::BridgesAndVnets))
        .await
    {
        Err(ProxmoxError::Api {
            status: 400,
            field_errors,
            ..
        }) if field_errors.contains_key("type") => {
            pve.node_networks(node, Some(NetworkFilter::AnyBridge))
                .await
        }
        other => other,
    }
    .map_err(|e| e.to_string())?;
    Ok(list
        .into_iter()
        .filter(|i| i.is_guest_bridge())
        .map(|i| i.iface)
        .collect())
}

/// The whole check of one machine class's provider data: schema, then (if that passes) the cluster.
/// `Err` only when the cluster cannot be read.
pub async fn validate_class(
    pve: &ProxmoxClient,
    schema: &ProviderDataSchema,
    layers: &Layers<'_>,
    placement: PlacementLimits,
) -> Result<Report, ProxmoxError> {
    let (mut findings, data) = check_schema(schema, layers);
    if let Some(data) = data {
        let view = gather(pve, &data, layers.nodes, placement).await?;
        findings.extend(check_cluster(schema, layers, &data, &view));
    }
    Ok(Report::new(findings))
}

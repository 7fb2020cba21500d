//! Kubernetes topology labels that follow the VM (provider data `topology_labels`, on by default).
//!
//! Each machine gets `topology.kubernetes.io/zone` = the Proxmox node its VM runs on and
//! `topology.kubernetes.io/region` = the Proxmox cluster name (left out on a standalone node), as
//! Talos `machine.nodeLabels` in a ConfigPatchRequest. That is the one way Omni lets a provider patch
//! a machine's config: Omni's ConfigPatchRequestController
//! (internal/backend/runtime/omni/controllers/omni/infra_provider_config_patch.go) copies a
//! ConfigPatchRequest labelled with a machine request into a ConfigPatch for the machine that
//! request's status names (its `id`, the SMBIOS UUID), and destroys it when the status goes. We label
//! it as the Go library's `provision.Context.CreateConfigPatch` does (provider ID, request ID), so the
//! teardown that removes every patch so labelled (ours or the official provider's hostname patches)
//! removes it too.
//!
//! A machine gets its patch when it is provisioned (its node is known then, so that costs no Proxmox
//! request). One loop keeps every patch in step after that: each round (every minute) reads the
//! requests, the provider states and our patches from Omni, and one `/cluster/resources` listing from
//! Proxmox, whatever the number of machines, then writes only the patches whose labels changed. A VM
//! migrated by hand or by the HA manager is relabelled within a round; machines provisioned before
//! the labels existed get theirs; a class or `defaults:` turning the labels off removes the patch.

use std::collections::BTreeMap;

use super::context::{Context, Request, request_info};
use super::error_policy::{ReconcileError, omni};
use crate::model::MachineState;
use crate::model::identity::{self, Claim, Ownership};
use crate::omni::resources::{CONFIG_PATCH_REQUEST, MACHINE_REQUEST, label};
use crate::omni::state::ResourceRef;
use crate::proxmox::types::VmResource;

/// Our patch IDs: `<prefix><request id>`. Omni's patch of the machine is machine-level, and Omni
/// applies cluster, machine-set, cluster-machine and then machine-level patches, each level in ID
/// order (internal/backend/runtime/omni/controllers/omni/internal/layeredresource/layeredresource.go,
/// `Helper.Get`): ours override the same labels in any cluster or machine-set patch. Among machine
/// patches this sorts after the official provider's `000-hostname-…` and before those people add
/// (`400-…` and up in Omni's UI), so theirs win there; `topology_labels: false` keeps theirs
/// everywhere.
pub const PATCH_PREFIX: &str = "100-topology-";

pub fn patch_id(request_id: &str) -> String {
    format!("{PATCH_PREFIX}{request_id}")
}

/// The Talos machine config patch setting the two labels. Node and cluster names are Proxmox
/// identifiers (letters, digits, `-`, `.`, `_`), so they need no quoting; they are quoted anyway so
/// a purely numeric name stays a string.
pub fn patch_yaml(zone: &str, region: Option<&str>) -> String {
    let region = region.map(|r| format!("    topology.kubernetes.io/region: \"{}\"\n", escape(r)));
    format!(
        "machine:\n  nodeLabels:\n    topology.kubernetes.io/zone: \"{}\"\n{}",
        escape(zone),
        region.unwrap_or_default()
    )
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

/// What one machine's patch should say, as far as this round could tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// The patch with this content.
    Patch(String),
    /// No patch: the labels are turned off for this machine.
    Nothing,
    /// Cannot tell this round (no VM yet, VM not identifiable from the listing, invalid provider
    /// data): leave whatever is there.
    Unknown,
}

/// A write the round makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Write { request_id: String, yaml: String },
    Remove { request_id: String },
}

/// Pure: the writes that bring `existing` (request ID → our patch's content) to `wanted`.
pub fn plan(wanted: &BTreeMap<String, Wanted>, existing: &BTreeMap<String, String>) -> Vec<Change> {
    let mut changes = Vec::new();
    for (request_id, want) in wanted {
        let have = existing.get(request_id);
        match want {
            Wanted::Patch(yaml) if have != Some(yaml) => changes.push(Change::Write {
                request_id: request_id.clone(),
                yaml: yaml.clone(),
            }),
            Wanted::Nothing if have.is_some() => changes.push(Change::Remove {
                request_id: request_id.clone(),
            }),
            _ => {}
        }
    }
    changes
}

/// Pure: what `request`'s patch should say, given its recorded VMID and the listing.
pub fn wanted(
    enabled: Option<bool>,
    claim: &Claim<'_>,
    vms: &[VmResource],
    region: Option<&str>,
) -> Wanted {
    match enabled {
        None => return Wanted::Unknown,
        Some(false) => return Wanted::Nothing,
        Some(true) => {}
    }
    let Some(vmid) = claim.recorded_vmid else {
        return Wanted::Unknown;
    };
    match vms.iter().find(|vm| vm.vmid == vmid) {
        // Only a VM the listing alone proves ours: a round never spends a config read per machine.
        Some(vm) if identity::judge_listing(vm, claim) == Some(Ownership::Ours) => {
            Wanted::Patch(patch_yaml(vm.node.as_str(), region))
        }
        _ => Wanted::Unknown,
    }
}

/// Labels a machine just provisioned on `node`: its patch, without waiting for the next round.
pub async fn label(ctx: &Context, request_id: &str, node: &str) -> Result<(), ReconcileError> {
    let services = &ctx.services;
    let region = services.ledgers.facts.cluster_name(&services.pve).await?;
    let yaml = patch_yaml(node, region.as_deref());
    let request_id = request_id.to_owned();
    apply(ctx, &Change::Write { request_id, yaml }).await
}

/// One round.
pub async fn round(ctx: &Context) -> Result<Vec<Change>, ReconcileError> {
    let ours = [(label::INFRA_PROVIDER_ID, ctx.provider_id())];
    let requests: Vec<Request> = ctx
        .state
        .list(&MACHINE_REQUEST, &ours)
        .await
        .map_err(omni("listing the machine requests"))?;
    let existing: BTreeMap<String, String> = ctx
        .state
        .list(&CONFIG_PATCH_REQUEST, &ours)
        .await
        .map_err(omni("listing our config patch requests"))?
        .into_iter()
        .filter_map(|p| {
            let request_id = p.metadata.id.strip_prefix(PATCH_PREFIX)?.to_owned();
            Some((request_id, p.spec.data))
        })
        .collect();
    // Left behind by a request that is gone without our teardown (removed by force): Omni already
    // dropped the machine's patch with the status, the request for it goes here.
    let mut wanted: BTreeMap<String, Wanted> = existing
        .keys()
        .filter(|id| !requests.iter().any(|r| r.id() == id.as_str()))
        .map(|id| (id.clone(), Wanted::Nothing))
        .collect();
    // Being torn down: the teardown removes the patch; this round leaves it alone.
    let live: Vec<&Request> = requests
        .iter()
        .filter(|r| !r.is_tearing_down() && r.has_finalizer(&ctx.owner))
        .collect();
    if !live.is_empty() {
        wanted.extend(wanted_for_live(ctx, &live).await?);
    }
    let changes = plan(&wanted, &existing);
    for change in &changes {
        apply(ctx, change).await?;
    }
    Ok(changes)
}

/// What each live request's patch should say: one listing of the provider states from Omni and one
/// of the cluster from Proxmox for all of them.
async fn wanted_for_live(
    ctx: &Context,
    live: &[&Request],
) -> Result<BTreeMap<String, Wanted>, ReconcileError> {
    let states: BTreeMap<String, MachineState> = ctx
        .machine_states()
        .await
        .map_err(omni("listing the provider states"))?
        .into_iter()
        .collect();
    let services = &ctx.services;
    let vms: Vec<VmResource> = services.pve.vms().await?;
    // Without the region this round writes nothing: a patch without it would be rewritten with it
    // next round, relabelling every node twice.
    let region = services.ledgers.facts.cluster_name(&services.pve).await?;
    Ok(live
        .iter()
        .map(|request| {
            let id = request.id();
            let Some(state) = states.get(id) else {
                return (id.to_owned(), Wanted::Unknown);
            };
            let uuid = state.uuid.map(|u| u.to_string());
            let claim = Claim {
                request_id: id,
                provider_id: ctx.provider_id(),
                recorded_vmid: state.vmid,
                smbios_uuid: uuid.as_deref(),
            };
            // The node the VM is on now decides which `nodes:` override applies, as for every
            // other key.
            let node = state
                .vmid
                .and_then(|vmid| vms.iter().find(|vm| vm.vmid == vmid))
                .map(|vm| vm.node.as_str());
            let enabled = services
                .provider_data(&request_info(request), node)
                .ok()
                .map(|data| data.topology_labels);
            (
                id.to_owned(),
                wanted(enabled, &claim, &vms, region.as_deref()),
            )
        })
        .collect())
}

/// Carries out one change of a round. A patch is written only while its request is live, checked
/// again under [`Context::topology_writes`]: the round's listing may be older than a teardown that
/// began since and removed the patch, and the write would make it again.
pub async fn apply(ctx: &Context, change: &Change) -> Result<(), ReconcileError> {
    match change {
        Change::Write { request_id, yaml } => {
            let _writing = ctx.topology_writes.lock().await;
            let request = ctx
                .state
                .find(&MACHINE_REQUEST, request_id)
                .await
                .map_err(omni("reading the machine request before writing its patch"))?;
            if !request.is_some_and(|r| !r.is_tearing_down() && r.has_finalizer(&ctx.owner)) {
                return Ok(());
            }
            ctx.state
                .modify(
                    &CONFIG_PATCH_REQUEST,
                    &patch_id(request_id),
                    &ctx.owner,
                    None,
                    |patch| {
                        let labels = &mut patch.metadata.labels;
                        labels.insert(label::INFRA_PROVIDER_ID.into(), ctx.provider_id().into());
                        labels.insert(label::MACHINE_REQUEST.into(), request_id.clone());
                        patch.spec.data = yaml.clone();
                        patch.spec.compressed_data.clear();
                    },
                )
                .await
                .map_err(omni("writing a topology config patch request"))?;
            // A teardown that starts before the watch delivers this patch still removes it.
            ctx.outputs.patch_written(request_id, &patch_id(request_id));
            tracing::info!(request = %request_id, "topology labels written: {}", yaml.replace('\n', " "));
        }
        Change::Remove { request_id } => {
            let what = ResourceRef::of(&CONFIG_PATCH_REQUEST, &patch_id(request_id));
            // `false`: Omni still holds a finalizer; destroyed in a later round.
            let gone = ctx
                .state
                .teardown_and_destroy(&what, &ctx.owner, super::outputs::PATCH_RELEASE_WAIT)
                .await
                .map_err(omni("removing a topology config patch request"))?;
            if gone {
                tracing::info!(request = %request_id, "topology labels turned off; config patch removed");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxmox::types::VmId;
    use serde_json::json;

    fn vm(value: serde_json::Value) -> VmResource {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_patch_sets_zone_and_region_as_strings() {
        assert_eq!(
            patch_yaml("pve1", Some("homelab")),
            "machine:\n  nodeLabels:\n    topology.kubernetes.io/zone: \"pve1\"\n    topology.kubernetes.io/region: \"homelab\"\n"
        );
        // A standalone node has no cluster name: zone only.
        assert_eq!(
            patch_yaml("2024", None),
            "machine:\n  nodeLabels:\n    topology.kubernetes.io/zone: \"2024\"\n"
        );
        let parsed: serde_json::Value =
            serde_saphyr::from_str(&patch_yaml("pve1", Some("a\"b"))).unwrap();
        assert_eq!(
            parsed["machine"]["nodeLabels"]["topology.kubernetes.io/region"],
            json!("a\"b")
        );
    }

    #[test]
    fn the_zone_is_where_the_listing_shows_our_vm_now() {
        let vms = vec![
            vm(json!({"vmid": 104, "node": "pve3", "name": "req-1",
                "tags": "omni-provider.proxmox;omni-request.req-1"})),
            vm(json!({"vmid": 105, "node": "pve2", "name": "someone-else"})),
            vm(json!({"vmid": 106, "node": "pve2"})),
        ];
        let claim = |id: u32| Claim {
            request_id: "req-1",
            provider_id: "proxmox",
            recorded_vmid: VmId::new(id).ok(),
            smbios_uuid: None,
        };
        assert_eq!(
            wanted(Some(true), &claim(104), &vms, Some("lab")),
            Wanted::Patch(patch_yaml("pve3", Some("lab")))
        );
        // Someone else's VM at the recorded VMID, a VM the listing cannot identify (no name
        // yet), or none at all: nothing is decided this round.
        assert_eq!(wanted(Some(true), &claim(105), &vms, None), Wanted::Unknown);
        assert_eq!(wanted(Some(true), &claim(106), &vms, None), Wanted::Unknown);
        assert_eq!(wanted(Some(true), &claim(999), &vms, None), Wanted::Unknown);
        assert_eq!(
            wanted(Some(false), &claim(104), &vms, None),
            Wanted::Nothing
        );
        assert_eq!(wanted(None, &claim(104), &vms, None), Wanted::Unknown);
    }

    #[test]
    fn a_round_writes_only_what_changed() {
        let yaml = |node| patch_yaml(node, Some("lab"));
        let wanted = BTreeMap::from([
            ("same".to_string(), Wanted::Patch(yaml("pve1"))),
            ("moved".to_string(), Wanted::Patch(yaml("pve2"))),
            ("new".to_string(), Wanted::Patch(yaml("pve3"))),
            ("off".to_string(), Wanted::Nothing),
            ("off-already".to_string(), Wanted::Nothing),
            ("unknown".to_string(), Wanted::Unknown),
        ]);
        let existing = BTreeMap::from([
            ("same".to_string(), yaml("pve1")),
            ("moved".to_string(), yaml("pve1")),
            ("off".to_string(), yaml("pve1")),
            ("unknown".to_string(), yaml("pve1")),
        ]);
        assert_eq!(
            plan(&wanted, &existing),
            vec![
                Change::Write {
                    request_id: "moved".into(),
                    yaml: yaml("pve2")
                },
                Change::Write {
                    request_id: "new".into(),
                    yaml: yaml("pve3")
                },
                Change::Remove {
                    request_id: "off".into()
                },
            ]
        );
    }
}

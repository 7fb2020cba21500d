//! Boot mode `clone`: which copy of the template to clone, and where each copy's drives are (what
//! the placement rule needs to tell which nodes a clone reaches). `pick_node` gathers the copies
//! before placing; `prepare_image` applies the same rule to a state recorded before placement knew
//! templates, so nothing is written before the clone is known to work.

use super::context::StepContext;
use super::error::StepError;
use super::step::StepOutcome;
use crate::model::{ClusterSnapshot, Listing, TemplateFacts};
use crate::proxmox::ProxmoxClient;
use crate::proxmox::types::{NodeName, VmId, VmResource};
use crate::rules::placement::{CloneSource, LeftOut, clone_verdict};
use crate::rules::provider_data::{BootMode, CloneMode, TemplateRef};

pub(super) async fn find_template(
    ctx: &mut StepContext<'_>,
    node: &NodeName,
) -> Result<StepOutcome, StepError> {
    ctx.state.boot_mode = Some(BootMode::Clone.as_str().into());
    let wanted = ctx.data.template.clone().ok_or_else(|| {
        StepError::config("boot mode `clone` needs `template` (a VMID or a template name)")
    })?;
    let listing = ctx.cluster(false).await?;
    let recorded = ctx.state.template_vmid;
    if listing.templates().any(|vm| Some(vm.vmid) == recorded) {
        // Chosen by placement for this node and storage.
        return Ok(StepOutcome::Done);
    }
    let cluster = ClusterSnapshot::from_resources(&listing);
    let source = copies_of(ctx, &wanted, &listing, &cluster).await?;
    let here = cluster.node(node.as_str()).ok_or_else(|| {
        StepError::Cluster(format!(
            "node {node} recorded for this machine is not in the cluster"
        ))
    })?;
    match clone_verdict(
        here,
        &source,
        &ctx.data.storage_selector,
        ctx.data.total_disk_gb(),
    ) {
        Ok((storage, template)) => {
            ctx.state.template_vmid = VmId::new(template).ok();
            ctx.state.storage = Some(storage.name);
            Ok(StepOutcome::Done)
        }
        Err(LeftOut::NoStorage { rejected, .. }) => Err(StepError::Cluster(format!(
            "no storage on {node} for the clone: {}",
            rejected
                .iter()
                .map(|(s, why)| format!("{s}: {why}"))
                .collect::<Vec<_>>()
                .join("; ")
        ))),
        Err(why) => Err(StepError::Cluster(format!(
            "node {node} cannot take this clone: {why}"
        ))),
    }
}

/// The copies of the class's template, as a step reports and fails on them.
pub(super) async fn copies_of(
    ctx: &StepContext<'_>,
    wanted: &TemplateRef,
    listing: &Listing,
    cluster: &ClusterSnapshot,
) -> Result<CloneSource, StepError> {
    ctx.report(format!("looking for template {wanted}")).await;
    clone_source(
        &ctx.services.pve,
        listing,
        cluster,
        wanted,
        ctx.data.clone_mode,
    )
    .await
}

/// Every copy of the template `wanted` on an online node, with where its drives are: what the
/// placement rule needs to tell which nodes a clone reaches. The listing does not say where a
/// template's disks are, so each copy's config is read (one request per copy; a clone runs on the
/// copy's node, so copies on offline nodes could not be cloned anyway and are named as such).
pub async fn clone_source(
    pve: &ProxmoxClient,
    listing: &Listing,
    cluster: &ClusterSnapshot,
    wanted: &TemplateRef,
    mode: CloneMode,
) -> Result<CloneSource, StepError> {
    let copies = matching_templates(listing, wanted).map_err(StepError::Cluster)?;
    let mut templates = Vec::new();
    let mut offline = Vec::new();
    for vm in copies {
        if !cluster.node(vm.node.as_str()).is_some_and(|n| n.online) {
            offline.push(vm.node.to_string());
            continue;
        }
        let doing = format!("reading the config of template {} on {}", vm.vmid, vm.node);
        let config = pve
            .vm(&vm.node, vm.vmid)
            .config()
            .await
            .map_err(StepError::proxmox(doing))?;
        templates.push(TemplateFacts::from_config(vm, &config, cluster));
    }
    Ok(CloneSource {
        wanted: wanted.to_string(),
        mode,
        templates,
        offline,
    })
}

/// Every template matching `wanted` by VMID or name, or why there is none (with what there is).
pub fn matching_templates<'a>(
    listing: &'a Listing,
    wanted: &TemplateRef,
) -> Result<Vec<&'a VmResource>, String> {
    // `vm` is the one `wanted` names, by VMID or name.
    let named = |vm: &&VmResource| match wanted {
        TemplateRef::VmId(id) => vm.vmid.get() == *id,
        TemplateRef::Name(name) => vm.name.as_ref() == Some(name),
    };
    let matching: Vec<&VmResource> = listing.vms().filter(named).collect();
    let templates: Vec<&VmResource> = matching.iter().copied().filter(|vm| vm.template).collect();
    if !templates.is_empty() {
        return Ok(templates);
    }
    if let Some(vm) = matching.first() {
        return Err(format!(
            "VM {} ({}) on {} is not a template; convert it with `qm template {}` or name another `template`",
            vm.vmid,
            vm.name.as_deref().unwrap_or("unnamed"),
            vm.node,
            vm.vmid
        ));
    }
    let available: Vec<String> = listing
        .templates()
        .map(|vm| format!("{} ({})", vm.vmid, vm.name.as_deref().unwrap_or("unnamed")))
        .collect();
    Err(format!(
        "template {wanted} not found in the cluster; templates there: {}",
        if available.is_empty() {
            "none".to_string()
        } else {
            available.join(", ")
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxmox::types::ClusterResource;

    fn resources() -> Listing {
        let resources = serde_json::from_str::<Vec<ClusterResource>>(
            r#"[
            {"type":"qemu","vmid":9000,"node":"pve1","name":"talos","template":1},
            {"type":"qemu","vmid":9001,"node":"pve2","name":"talos","template":1},
            {"type":"qemu","vmid":105,"node":"pve2","name":"plain"}
        ]"#,
        );
        Listing::read(resources.unwrap(), std::time::Instant::now())
    }

    #[test]
    fn template_lookup() {
        let r = resources();
        let ids = |wanted| {
            matching_templates(&r, &wanted).map(|vms| vms.iter().map(|vm| vm.vmid.get()).collect())
        };
        assert_eq!(ids(TemplateRef::Name("talos".into())), Ok(vec![9000, 9001]));
        assert_eq!(ids(TemplateRef::VmId(9000)), Ok(vec![9000]));
        let e = ids(TemplateRef::VmId(105)).unwrap_err();
        assert!(e.contains("not a template"), "{e}");
        let e = ids(TemplateRef::Name("nope".into())).unwrap_err();
        assert!(e.contains("9000 (talos), 9001 (talos)"), "{e}");
        let none = matching_templates(
            &Listing::read(Vec::new(), std::time::Instant::now()),
            &TemplateRef::VmId(1),
        )
        .unwrap_err();
        assert!(none.ends_with("templates there: none"), "{none}");
    }
}

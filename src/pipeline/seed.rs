//! The request's NoCloud seed ISO (label `cidata`: `user-data` = the join config, `meta-data` =
//! instance ID and hostname, `network-config`), built in memory and uploaded once to ISO storage on
//! the VM's node. Boot mode `iso` needs it before the create call, boot mode `clone` in the config
//! write after the clone, so both steps use this module rather than each other.

use super::context::{StepContext, recorded};
use super::error::StepError;
use super::prepare_image::download_storage;
use crate::proxmox::property::{IsoFileName, IsoVolume};
use crate::proxmox::types::NodeName;
use crate::rules::cloud_init::{seed_iso, seed_iso_file_name};
use crate::rules::ip_pool;
use crate::rules::storage::Content;

/// Builds and uploads this request's seed ISO (once; the state records it), returning its volume.
pub async fn upload_seed(
    ctx: &mut StepContext<'_>,
    node: &NodeName,
) -> Result<IsoVolume, StepError> {
    if let Some(v) = &ctx.state.seed_iso {
        return Ok(v.clone());
    }
    // Beside the boot ISO when there is one, else on the ISO storage the selector picks.
    let storage = match &ctx.state.boot_iso {
        Some(boot) => boot.storage.clone(),
        None => download_storage(ctx, node, Content::IsoImages).await?.0,
    };
    let instance_id = recorded(&ctx.state.uuid, "SMBIOS UUID")?;
    // DHCP, or every NIC by its MAC with the static addresses the provider state records.
    let network = ip_pool::network_config(
        &ctx.request.id,
        1 + ctx.data.additional_nics.len(),
        &ctx.state.ip_allocations,
        &ctx.services.config.ip_pools,
    )
    .map_err(|p| StepError::config(format!("the recorded static address: {p}")))?;
    let bytes = seed_iso::build_seed(ctx.join, instance_id, &ctx.request.id, &network)
        .map_err(|e| StepError::Cluster(e.to_string()))?;
    let file_name = seed_iso_file_name(&ctx.request.id);
    let file = IsoFileName::new(file_name.as_str()).map_err(|e| {
        StepError::Cluster(format!("seed ISO volume {storage}:iso/{file_name}: {e}"))
    })?;
    let volume = IsoVolume { storage, file };
    ctx.run_task(
        format!("uploading the NoCloud seed to {} on {node}", volume.storage),
        ctx.services
            .pve
            .upload_file(node, volume.storage.as_str(), "iso", &file_name, bytes),
    )
    .await?;
    ctx.state.seed_iso = Some(volume.clone());
    ctx.persist().await?;
    Ok(volume)
}

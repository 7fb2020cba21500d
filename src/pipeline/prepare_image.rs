//! Step 2, `prepare_image`: what the VM boots from.
//!
//! Boot mode `iso` (the default, as upstream): the schematic (request extensions plus the QEMU guest
//! agent, never connection parameters: those are per request and go in the NoCloud seed) is created
//! through Omni, and the chosen node downloads the Image Factory's nocloud ISO into ISO storage itself,
//! so the image never passes through the provider; only a factory that asks for credentials is
//! fetched from by the provider, which streams the image into the storage ([`fetched_by_provider`]). The URL and the file name are built exactly as the
//! official provider builds them: `<factory>/image/<schematic>/<Talos version as the request gives
//! it>/nocloud-amd64.iso` (no `v` added: auto-provisioned requests carry `1.11.4`), named by the hex
//! SHA-256 of that URL, so ISOs it already downloaded are reused and none is downloaded twice.
//! Concurrent requests for the same image wait for one download.
//!
//! The state records what the official provider records, in its formats: the request's Talos
//! version (field 3), the bare file name (field 4) and the download task (field 6); the full volume ID
//! is ours (field 31).
//!
//! Boot mode `image` (ours): the same schematic, but the node downloads the nocloud *disk* image
//! (`nocloud-amd64.qcow2`, see [`BootImage::DISK`]) into a storage with the `import` content type,
//! named by the SHA-256 of its URL with a `.qcow2` extension, once per storage; `create_vm` makes the
//! boot disk from it. Its volume ID is ours (field 32); fields 4 and 31 stay empty.
//!
//! Boot mode `clone`: the copy of the template `pick_node` chose by the placement rule (which nodes
//! a clone reaches is `rules::placement::clone_verdict`); a state recorded before placement knew
//! templates gets the same rule applied here, before anything is written.

use crate::proxmox::property::{ImportVolume, IsoVolume, PropertyError, StorageId};
use sha2::{Digest, Sha256};

use super::context::StepContext;
use super::error::StepError;
use super::image_factory::{self, DOWNLOAD_TIMEOUT, FactoryError};
use super::ledgers::image_presence_key;
use super::step::StepOutcome;
use crate::model::ClusterSnapshot;
use crate::omni::management::{BootAssetKind, ManagementError};
use crate::proxmox::types::NodeName;
use crate::rules::provider_data::BootMode;
use crate::rules::schematic::schematic_yaml;
use crate::rules::storage::{self, Content, StorageNeed};

/// What the node downloads from the Image Factory for the VM to boot from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootImage {
    /// The storage content it goes into.
    pub content: Content,
    /// The file the Image Factory serves.
    file: &'static str,
    /// What the status text calls it.
    what: &'static str,
    /// What Omni calls it.
    asset: BootAssetKind,
}

impl BootImage {
    /// `nocloud-amd64.iso` into ISO storage (`boot: iso`).
    pub const ISO: BootImage = BootImage {
        content: Content::IsoImages,
        file: "nocloud-amd64.iso",
        what: "ISO",
        asset: BootAssetKind::Iso,
    };

    /// `nocloud-amd64.qcow2` into `import` storage (`boot: image`): qcow2 because download-url
    /// decompresses only ISOs (pve-storage Status.pm `download_url`: "decompression not supported"
    /// for other content, and never `xz`), and the raw image is the full 8 GiB disk; the Image
    /// Factory serves any platform image as `.qcow2` (image-factory internal/profile/profile.go
    /// `ParseFromPath`).
    pub const DISK: BootImage = BootImage {
        content: Content::DiskImages,
        file: "nocloud-amd64.qcow2",
        what: "disk image",
        asset: BootAssetKind::Disk,
    };

    /// What a boot mode downloads; `clone` downloads nothing.
    pub fn of(boot: BootMode) -> Option<BootImage> {
        match boot {
            BootMode::Iso => Some(BootImage::ISO),
            BootMode::Image => Some(BootImage::DISK),
            BootMode::Clone => None,
        }
    }
}

/// Downloads the boot image once per storage (the node fetches it itself, so it never passes through
/// the provider), and records where it is; boot mode `clone` finds its template instead.
pub async fn run(ctx: &mut StepContext<'_>, node: &NodeName) -> Result<StepOutcome, StepError> {
    let Some(kind) = BootImage::of(ctx.data.boot) else {
        return super::template::find_template(ctx, node).await;
    };
    ctx.state.boot_mode = Some(ctx.data.boot.as_str().into());
    let version = talos_version(&ctx.request.talos_version);
    let schematic = match ctx.state.schematic.clone() {
        Some(id) => id,
        None => create_schematic(ctx, &version).await?,
    };
    ctx.state.schematic = Some(schematic.clone());
    ctx.state.talos_version = Some(ctx.request.talos_version.clone());
    let file_name = image_file_name(&boot_image_url(ctx, &schematic, kind), kind);
    let (storage, shared) = download_storage(ctx, node, kind.content).await?;
    let wanted = Wanted {
        kind,
        schematic: &schematic,
        node,
        storage: storage.as_str(),
        file_name: &file_name,
        shared,
    };
    let volid = wanted.volid();
    let unusable =
        |e: PropertyError| StepError::Cluster(format!("Talos {} volume {volid}: {e}", kind.what));
    // Where the image goes: a volume in ISO storage, or one in `import` storage.
    if kind == BootImage::ISO {
        let iso = Some(IsoVolume::parse(&volid).map_err(unusable)?);
        if ctx.state.boot_iso != iso || ctx.state.iso_file.as_deref() != Some(&file_name) {
            fetch(ctx, &wanted).await?;
            ctx.state.iso_file = Some(file_name.clone());
            ctx.state.boot_iso = iso;
        }
    } else {
        let image = Some(ImportVolume::parse(&volid).map_err(unusable)?);
        if ctx.state.boot_image != image {
            fetch(ctx, &wanted).await?;
            ctx.state.boot_image = image;
        }
    }
    Ok(StepOutcome::Done)
}

/// A boot image the provider downloads with `headers` and uploads: the factory needs credentials,
/// which never reach the node.
struct Fetched {
    url: String,
    headers: Vec<(String, crate::secret::Secret)>,
    /// Whose credentials they are, as the status text names them.
    named: &'static str,
    /// What to check when the factory refuses them.
    advice: &'static str,
}

/// Where the image comes from: `None` when the node downloads it itself (`download-url`), the
/// factory needing no credentials. Credentials the operator gives for the factory come first; else
/// Omni is asked where the asset is and with which headers (Omni from August 2026: siderolabs/omni
/// `client/pkg/imagefactory/bootasset.go` `ResolveBootAsset`, which puts the factory's credentials
/// in an `Authorization` header); a factory that needs none is left to the node, as the official
/// provider does. An Omni that cannot tell (older, or failing) leaves it to the node too.
async fn fetched_by_provider(ctx: &StepContext<'_>, wanted: &Wanted<'_>) -> Option<Fetched> {
    let services = ctx.services;
    if let Some(headers) = services
        .factory_auth
        .for_factory(ctx.request.factory(services))
    {
        return Some(Fetched {
            url: boot_image_url(ctx, wanted.schematic, wanted.kind),
            headers,
            named: "the credentials of --image-factory-auth-file",
            advice: "the factory refuses the credentials --image-factory-auth-file gives for it: check its username and password",
        });
    }
    let management = &services.management;
    let asset = management.boot_asset(
        &ctx.request.talos_version,
        wanted.schematic,
        wanted.kind.asset,
    );
    let warn = |e: &ManagementError| {
        tracing::warn!(error = %e, "cannot ask Omni how to fetch the boot image; the node downloads it");
    };
    let asset = asset.await.inspect_err(warn).ok()??;
    (!asset.headers.is_empty()).then_some(Fetched {
        url: asset.url,
        headers: asset.headers,
        named: "the credentials Omni holds for it",
        advice: "the factory refuses the credentials Omni holds for it: check Omni's image factory settings",
    })
}

/// The boot image a download must put in place.
struct Wanted<'a> {
    kind: BootImage,
    schematic: &'a str,
    node: &'a NodeName,
    storage: &'a str,
    file_name: &'a str,
    /// The storage is shared: one download serves every node.
    shared: bool,
}

impl Wanted<'_> {
    fn volid(&self) -> String {
        let content = self.kind.content;
        format!("{}:{}/{}", self.storage, content.as_str(), self.file_name)
    }
}

/// Makes sure the image is in the storage: there already (another request, another provider, an
/// earlier try), or downloaded by the node now, its task recorded before it is waited for.
async fn fetch(ctx: &mut StepContext<'_>, wanted: &Wanted<'_>) -> Result<(), StepError> {
    let (kind, node, storage, volid) = (wanted.kind, wanted.node, wanted.storage, wanted.volid());
    let ledgers = &ctx.services.ledgers;
    let presence_key = image_presence_key(node.as_str(), &volid);
    // One download per image and storage (and node, unless the storage is shared), however many
    // requests want it at once.
    let one_download = if wanted.shared { &volid } else { &presence_key };
    let _guard = ledgers.locks.hold(&format!("image:{one_download}")).await;
    let pve = &ctx.services.pve;
    // A download the official provider (or an earlier run) started may still be running: wait for it
    // rather than start a second one into the same file. How it ended is read from the storage below.
    if let Some(task) = ctx.state.iso_download_task.clone() {
        let _ = pve.wait_for_task(&task, DOWNLOAD_TIMEOUT).await;
    }
    // A boot ISO seen lately needs no listing per VM: a start that finds it gone puts it back
    // (`put_back_if_missing`). A disk image is only read by the create, which cannot do that.
    let presence = (kind == BootImage::ISO).then_some(presence_key);
    if ctx.state.iso_download_task.is_none()
        && presence.as_deref().is_some_and(|k| ledgers.images.known(k))
    {
        return Ok(());
    }
    let present = pve
        .storage_content(node, storage, Some(kind.content.as_str()))
        .await
        .map_err(StepError::proxmox(format!(
            "listing {} in storage {storage} on {node}",
            kind.content.describe()
        )))?
        .iter()
        .any(|v| v.volid == volid);
    if !present {
        put_in_place(ctx, wanted).await?;
    }
    if let Some(key) = presence {
        ledgers.images.seen(&key);
    }
    Ok(())
}

/// Puts the image into the storage: downloaded by the node, or by the provider and uploaded when
/// the factory needs credentials ([`fetched_by_provider`]); the task is recorded before it is waited for.
async fn put_in_place(ctx: &mut StepContext<'_>, wanted: &Wanted<'_>) -> Result<(), StepError> {
    let (kind, node, storage, file_name) =
        (wanted.kind, wanted.node, wanted.storage, wanted.file_name);
    let pve = &ctx.services.pve;
    let content = kind.content.as_str();
    let what = format!(
        "the Talos {} {} to {storage} on {node}",
        talos_version(&ctx.request.talos_version),
        kind.what
    );
    let task = match fetched_by_provider(ctx, wanted).await {
        None => {
            let url = boot_image_url(ctx, wanted.schematic, kind);
            let download = pve.download_url(node, storage, content, file_name, &url);
            ctx.start_task(format!("downloading {what}"), download)
                .await?
        }
        Some(Fetched {
            url,
            headers,
            named,
            advice,
        }) => {
            let image = image_factory::download(&ctx.services.factory_http, &url, &headers)
                .await
                .map_err(|e| match e {
                    FactoryError::Refused {
                        status: 401 | 403, ..
                    } => StepError::config(format!("{e} ({advice})")),
                    other => StepError::Cluster(other.to_string()),
                })?;
            ctx.start_task(
                format!("uploading {what}, fetched from the Image Factory with {named}"),
                pve.upload_file(node, storage, content, file_name, image),
            )
            .await?
        }
    };
    if kind == BootImage::ISO {
        ctx.state.iso_file = Some(file_name.to_owned());
    }
    ctx.state.iso_download_task = Some(task.upid.clone());
    ctx.persist().await?;
    match ctx.finish_task(task, DOWNLOAD_TIMEOUT).await {
        // Another provider (or an earlier try whose answer we lost) put it there meanwhile.
        Err(StepError::Proxmox { source, .. }) if source.is_file_already_present() => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Whether `error` is a create or start that found the request's boot ISO gone from its storage
/// (deleted by hand after `fetch` last saw it). Then the ISO is put back first, and the caller
/// tries once more; the presence is forgotten first, so other requests list the storage again.
pub(super) async fn put_back_if_missing(
    ctx: &mut StepContext<'_>,
    node: &NodeName,
    error: &StepError,
) -> Result<bool, StepError> {
    let (StepError::Proxmox { source, .. }, Some(volume)) = (error, ctx.state.boot_iso.clone())
    else {
        return Ok(false);
    };
    let volid = volume.to_string();
    if !source.is_volume_missing(&volid) {
        return Ok(false);
    }
    ctx.services
        .ledgers
        .images
        .forget(&image_presence_key(node.as_str(), &volid));
    tracing::warn!(request = %ctx.request.id, volume = %volid, "the Talos ISO is gone from its storage; downloading it again");
    let Some(schematic) = ctx.state.schematic.clone() else {
        return Ok(true);
    };
    // The same file name in the same storage, downloaded from the same URL: where the VM's config
    // expects it.
    ctx.state.iso_download_task = None;
    let wanted = Wanted {
        kind: BootImage::ISO,
        schematic: &schematic,
        node,
        storage: volume.storage.as_str(),
        file_name: volume.file.as_str(),
        shared: false,
    };
    fetch(ctx, &wanted).await?;
    Ok(true)
}

/// The storage on `node` a boot image goes to: the first that matches `iso_storage_selector` (or
/// any that holds the content when none is set), in API order like upstream. Returns (storage,
/// shared).
pub(super) async fn download_storage(
    ctx: &mut StepContext<'_>,
    node: &NodeName,
    content: Content,
) -> Result<(StorageId, bool), StepError> {
    let cluster = ClusterSnapshot::from_resources(&ctx.cluster(false).await?);
    let selector = ctx.data.iso_storage_selector.as_ref();
    let need = StorageNeed::download(content, selector);
    let choice = cluster
        .node(node.as_str())
        .map(|n| storage::choose(n, &need));
    if let Some(e) = choice.as_ref().and_then(|c| c.selector_error()) {
        return Err(StepError::key("iso_storage_selector", e));
    }
    if let Some(s) = choice.as_ref().and_then(|c| c.chosen.as_ref()) {
        return Ok((s.name.clone(), s.shared));
    }
    // Without a selector the first storage with the content was taken, so reaching here means a
    // selector rejected every one, or there is none.
    let seen: Vec<&str> = choice.iter().flat_map(|c| c.usable()).collect();
    let (kind, what) = (content.as_str(), content.describe());
    Err(StepError::Cluster(match selector {
        Some(sel) if !seen.is_empty() => format!(
            "iso_storage_selector `{}` matches none of the storages for {what} on {node}: {}",
            sel,
            seen.join(", ")
        ),
        _ if content == Content::DiskImages => format!(
            "node {node} has no active storage that holds {what}; enable the `{kind}` content type on a directory, NFS, CIFS or CephFS storage (Datacenter > Storage > Edit > Content: Import), or use `boot: iso`"
        ),
        _ => format!(
            "node {node} has no active storage that holds {what}; enable the `{kind}` content type on one (Datacenter > Storage)"
        ),
    }))
}

/// The schematic ID for the request's extensions, kernel args, meta values and overlay: from Omni,
/// or from the Image Factory directly when Omni is older than 1.8 (as the older Go library did).
async fn create_schematic(ctx: &StepContext<'_>, version: &str) -> Result<String, StepError> {
    ctx.report("creating the image schematic through Omni")
        .await;
    let yaml = schematic_yaml(&ctx.request.schematic)
        .map_err(|e| StepError::config(format!("cannot build the image schematic: {e}")))?;
    let services = ctx.services;
    let made = services
        .management
        .create_schematic_from_raw(&yaml, version);
    match made.await {
        Ok(id) => Ok(id),
        // Omni before 1.8: ask the factory ourselves, as the older Go library did.
        Err(ManagementError::OmniTooOld) => image_factory::create_schematic(
            &services.factory_http,
            &services.image_factory_url,
            &yaml,
        )
        .await
        .map_err(|e| {
            StepError::Cluster(format!(
                "this Omni is older than 1.8, so the schematic went to the Image Factory directly, which failed: {e}"
            ))
        }),
        Err(other) => Err(StepError::Cluster(format!(
            "creating the image schematic through Omni: {other}"
        ))),
    }
}

/// Where the request's factory serves its boot image of `kind`.
fn boot_image_url(ctx: &StepContext<'_>, schematic: &str, kind: BootImage) -> String {
    let factory = ctx.request.factory(ctx.services);
    image_url(factory, schematic, &ctx.request.talos_version, kind.file)
}

/// `<factory>/image/<schematic>/<version>/<file>`. The factory adds a missing `v` itself
/// (image-factory internal/frontend/http/image.go, `handleImage`).
pub fn image_url(factory: &str, schematic: &str, talos_version: &str, file: &str) -> String {
    format!(
        "{}/image/{schematic}/{talos_version}/{file}",
        factory.trim_end_matches('/')
    )
}

/// A boot image's file name in storage: the hex SHA-256 of its URL, with the extension Proxmox
/// wants for the content (`.iso`, `.qcow2`), so the same image is found again by name.
pub fn image_file_name(url: &str, kind: BootImage) -> String {
    let ext = kind.file.rsplit('.').next().unwrap_or_default();
    format!("{:x}.{ext}", Sha256::digest(url.as_bytes()))
}

/// The version for Omni's schematic call, which wants the `v` prefix; Omni may send the version with or without it.
pub fn talos_version(v: &str) -> String {
    let v = v.trim();
    format!("v{}", v.strip_prefix('v').unwrap_or(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_url_and_name_are_the_official_providers() {
        // omni-infra-provider-proxmox internal/pkg/provider/provision.go, step uploadISO: the URL is
        // the factory base joined with "image", the schematic, the request's Talos version as given
        // (GetTalosVersion, no prefix added) and "nocloud-amd64.iso"; the file is the hex SHA-256 of
        // that URL string plus ".iso". Expected values computed independently (Python hashlib).
        let schematic = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";
        let url = image_url(
            "https://factory.talos.dev/",
            schematic,
            "1.11.4",
            BootImage::ISO.file,
        );
        assert_eq!(
            url,
            format!("https://factory.talos.dev/image/{schematic}/1.11.4/nocloud-amd64.iso")
        );
        assert_eq!(
            image_file_name(&url, BootImage::ISO),
            "9d4a60553b0968e85b3fb1b2a532d5903df42db7eaf708b1b663b44a3cb6caee.iso"
        );
    }

    #[test]
    fn version_prefix() {
        assert_eq!(talos_version("1.11.0"), "v1.11.0");
        assert_eq!(talos_version("v1.11.0"), "v1.11.0");
    }
}

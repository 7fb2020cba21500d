//! `boot: image` end to end: the node downloads the Image Factory's nocloud disk image into `import`
//! storage once, each VM's boot disk is made from it with `import-from` and grown to `disk_size`, and
//! no Talos ISO is attached.
//!
//! Proxmox facts this follows (fakepve's launcher models them): pve-storage
//! src/PVE/API2/Storage/Status.pm `download_url` takes `import` content only for names ending in
//! `.ova|.qcow2|.raw|.vmdk` (the last three from libpve-storage-perl 8.3.6, i.e. Proxmox VE 8.4) and
//! decompresses nothing but ISOs; qemu-server src/PVE/API2/Qemu.pm takes `import-from` only on
//! `<storage>:0` and gives the disk the image's virtual size.

use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use serde_json::{Value, json};
use testkit::fakepve::three_node_scenario;
use testkit::harness::Harness;

const IMAGE_CLASS: &str = "cores: 2\nmemory: 2048\ndisk_size: 20\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nboot: image\nip_discovery_timeout: 0\n";

fn with_import_storage(h: &mut Harness) {
    h.pve.control(json!({"op": "set_storage", "name": "local",
        "options": {"content": "iso,vztmpl,backup,import"}}));
}

fn volumes(h: &mut Harness, storage: &str) -> Vec<String> {
    serde_json::from_value(
        h.pve
            .control(json!({"op": "storage_volumes", "storage": storage})),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vms_boot_from_one_downloaded_disk_image_grown_and_without_an_iso() {
    let mut h = Harness::start("").await;
    with_import_storage(&mut h);
    h.request("img-1", "image", IMAGE_CLASS);
    h.request("img-2", "image", IMAGE_CLASS);
    h.wait_stage("img-1", Stage::Provisioned).await;
    h.wait_stage("img-2", Stage::Provisioned).await;

    let local = volumes(&mut h, "local");
    let images: Vec<&String> = local.iter().filter(|v| v.starts_with("import/")).collect();
    assert_eq!(images.len(), 1, "one download for both: {local:?}");
    assert!(images[0].ends_with(".qcow2"), "{images:?}");
    assert!(
        !local
            .iter()
            .any(|v| v.starts_with("iso/") && !v.contains("omni-seed")),
        "no Talos ISO downloaded: {local:?}"
    );
    let downloads = h
        .pve
        .requests()
        .iter()
        .filter(|(m, p)| m == "POST" && p.ends_with("/download-url"))
        .count();
    assert_eq!(downloads, 1);

    for id in ["img-1", "img-2"] {
        let vm = h.vms_named(id).pop().expect("one VM");
        let config = &vm["config"];
        let scsi0 = config["scsi0"].as_str().unwrap_or_default();
        assert!(scsi0.starts_with("local-lvm:vm-"), "{scsi0}");
        assert!(!scsi0.contains("import-from"), "{scsi0}");
        assert!(
            scsi0.contains("size=20G"),
            "grown from the image's 8 GiB: {scsi0}"
        );
        assert_eq!(config["ide2"], Value::Null, "no Talos ISO attached");
        let seed = config["ide3"].as_str().unwrap_or_default();
        assert!(seed.contains("omni-seed"), "the NoCloud seed stays: {seed}");
        assert_eq!(config["boot"], json!("order=scsi0;net0"));
        assert_eq!(vm["status"], json!("running"));
    }
    let state = h.machine_state("img-1");
    assert!(
        state.spec.boot_image_volume.starts_with("local:import/"),
        "{:?}",
        state.spec
    );
    h.stop_controller().await;
}

/// No storage on the node allows `import`: a readable failure that says what to enable, and no VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_import_storage_the_request_fails_saying_what_to_enable() {
    let mut h = Harness::start("").await;
    h.request("img-none", "image", IMAGE_CLASS);
    let status = h.wait_stage("img-none", Stage::Failed).await;
    let error = status.spec.error;
    assert!(error.contains("`import` content type"), "{error}");
    assert!(error.contains("pve1"), "{error}");
    assert!(h.vms_named("img-none").is_empty());
    h.stop_controller().await;
}

/// Before Proxmox VE 8.4 download-url takes no `.qcow2` into `import` storage: refused before anything
/// is written, naming the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_proxmox_8_3_boot_image_is_refused_before_anything_is_written() {
    let mut scenario = three_node_scenario();
    scenario["pve_version"] = json!("8.3.5");
    let mut h = Harness::start_with(scenario, "").await;
    with_import_storage(&mut h);
    h.request("img-old", "image", IMAGE_CLASS);
    let status = h.wait_stage("img-old", Stage::Failed).await;
    let error = status.spec.error;
    assert!(error.contains("8.4"), "{error}");
    assert!(error.contains("8.3.5"), "{error}");
    let writes = h.pve.requests().iter().filter(|(m, _)| m != "GET").count();
    assert_eq!(writes, 0, "nothing is written to Proxmox");
    h.stop_controller().await;
}

/// The path and `Authorization` header of each request a factory received.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(String, Option<String>)>>>;

/// An Image Factory that asks for credentials, served on a loopback address: it answers 401
/// without them, and with them the image, with its length or (`chunked`) without.
struct PrivateFactory {
    url: String,
    seen: Seen,
}

const FACTORY_USER: &str = "omni";
const FACTORY_PASSWORD: &str = "factory-s3cret";
const IMAGE_LEN: usize = 3 * 1024 * 1024 + 17;
const ISO_CLASS: &str = "cores: 2\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nip_discovery_timeout: 0\n";

impl PrivateFactory {
    async fn start(chunked: bool) -> Self {
        use axum::response::IntoResponse;
        use base64::Engine;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD
                .encode(format!("{FACTORY_USER}:{FACTORY_PASSWORD}"))
        );
        let log = seen.clone();
        let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let auth = request
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            log.lock()
                .unwrap()
                .push((request.uri().path().to_owned(), auth.clone()));
            let allowed = auth.as_deref() == Some(expected.as_str());
            async move {
                if !allowed {
                    return (
                        axum::http::StatusCode::UNAUTHORIZED,
                        "authentication required",
                    )
                        .into_response();
                }
                let image = vec![7u8; IMAGE_LEN];
                if chunked {
                    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
                        image.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
                    axum::body::Body::from_stream(futures_util::stream::iter(chunks))
                        .into_response()
                } else {
                    image.into_response()
                }
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { url, seen }
    }

    fn image_requests(&self) -> Vec<(String, Option<String>)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(path, _)| path.ends_with("/nocloud-amd64.iso"))
            .cloned()
            .collect()
    }
}

/// The one Talos ISO in `local` arrived whole through the upload call.
fn assert_one_whole_image_uploaded(h: &mut Harness) {
    let isos: Vec<String> = volumes(h, "local")
        .into_iter()
        .filter(|v| v.starts_with("iso/") && !v.contains("omni-seed"))
        .collect();
    assert_eq!(isos.len(), 1, "{isos:?}");
    let size = h
        .pve
        .control(json!({"op": "upload_size", "volid": format!("local:{}", isos[0])}));
    assert_eq!(size, json!(IMAGE_LEN), "the whole image arrived");
}

/// The provider uses `factory` and the credentials `password` for it, from the next reconcile on.
async fn use_private_factory(h: &mut Harness, factory: &PrivateFactory, password: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("factories.yaml");
    std::fs::write(
        &file,
        format!(
            "{}:\n  username: {FACTORY_USER}\n  password: {password}\n",
            factory.url
        ),
    )
    .unwrap();
    h.factory_auth =
        omni_infra_provider_proxmox::pipeline::image_factory::FactoryAuth::read(&file).unwrap();
    h.image_factory_url = factory.url.clone();
    h.stop_controller().await;
    h.start_controller();
}

/// An infra provider may not read Omni's ImageFactoryAuth resources (they need the Reader role,
/// which ranks above InfraProvider: siderolabs/omni `internal/backend/runtime/omni/state_access.go`,
/// `client/pkg/access/role/role.go`), and Proxmox's download-url sends no credentials. So the
/// provider fetches the image with the credentials it is given and streams it into the storage
/// through the upload call: the node never sees the credentials, the image is downloaded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_factory_that_asks_for_credentials_gets_them_and_its_image_is_uploaded_once() {
    let mut h = Harness::start("").await;
    let factory = PrivateFactory::start(false).await;
    use_private_factory(&mut h, &factory, FACTORY_PASSWORD).await;
    h.request("auth-1", "auth", ISO_CLASS);
    h.wait_stage("auth-1", Stage::Provisioned).await;
    h.request("auth-2", "auth", ISO_CLASS);
    h.wait_stage("auth-2", Stage::Provisioned).await;

    let fetched = factory.image_requests();
    assert_eq!(fetched.len(), 1, "one download for both: {fetched:?}");
    assert!(fetched[0].1.is_some(), "sent with credentials");
    let requests = h.pve.requests();
    assert!(
        !requests.iter().any(|(_, p)| p.ends_with("/download-url")),
        "the node is never asked to download it: {requests:?}"
    );
    assert_one_whole_image_uploaded(&mut h);
    let everything = format!("{requests:?}{:?}", h.status("auth-1"));
    assert!(!everything.contains(FACTORY_PASSWORD), "{everything}");
    h.stop_controller().await;
}

/// A factory that does not say the image's length (chunked): pveproxy takes no chunked upload
/// (pve-http-server `src/PVE/APIServer/AnyEvent.pm`, 501), so the image is kept in a file first.
/// Credentials the factory refuses fail the request, saying where they come from, never the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_of_unknown_length_is_spooled_and_refused_credentials_are_named() {
    let mut h = Harness::start("").await;
    let factory = PrivateFactory::start(true).await;
    use_private_factory(&mut h, &factory, "wrong-password").await;
    h.request("auth-3", "auth", ISO_CLASS);
    let failed = h.wait_stage("auth-3", Stage::Failed).await;
    assert!(
        failed.spec.error.contains("--image-factory-auth-file")
            && failed.spec.error.contains("401"),
        "{}",
        failed.spec.error
    );
    assert!(!failed.spec.error.contains("wrong-password"));

    use_private_factory(&mut h, &factory, FACTORY_PASSWORD).await;
    h.request("auth-4", "auth", ISO_CLASS);
    h.wait_stage("auth-4", Stage::Provisioned).await;
    assert_one_whole_image_uploaded(&mut h);
    let leftovers: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".image"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "the spooled copy is deleted: {leftovers:?}"
    );
    h.stop_controller().await;
}

/// With no credentials of its own for the factory, the provider asks Omni where the image is
/// (`GetBootAssetURL`, which the InfraProvider role may call: siderolabs/omni
/// `internal/backend/grpc/schematics.go`); Omni answers with the factory's credentials as a basic
/// `Authorization` header (`client/pkg/imagefactory/bootasset.go` `ResolveBootAsset`), and the
/// provider fetches the image with it. The operator keeps the credentials in Omni only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_credentials_omni_holds_for_its_factory_fetch_the_image() {
    use omni_infra_provider_proxmox::omni::proto::specs::FeaturesConfigSpec;
    use omni_infra_provider_proxmox::omni::resources::{FEATURES_CONFIG, FEATURES_CONFIG_ID};
    let mut h = Harness::start("").await;
    let factory = PrivateFactory::start(false).await;
    h.omni.state.put(
        &FEATURES_CONFIG,
        FEATURES_CONFIG_ID,
        &FeaturesConfigSpec {
            image_factory_base_url: factory.url.clone(),
        },
        Default::default(),
    );
    h.omni
        .state
        .set_image_factory_auth(&factory.url, FACTORY_USER, FACTORY_PASSWORD);
    h.image_factory_url = factory.url.clone();
    h.stop_controller().await;
    h.start_controller();
    h.request("auth-5", "auth", ISO_CLASS);
    h.wait_stage("auth-5", Stage::Provisioned).await;
    assert_eq!(
        h.omni
            .state
            .calls("/management.ManagementService/GetBootAssetURL"),
        1
    );
    let fetched = factory.image_requests();
    assert_eq!(fetched.len(), 1, "{fetched:?}");
    assert!(
        fetched[0].0.contains("/v1.11.3/"),
        "Omni's URL: {fetched:?}"
    );
    let requests = h.pve.requests();
    assert!(!requests.iter().any(|(_, p)| p.ends_with("/download-url")));
    assert!(!format!("{requests:?}").contains(FACTORY_PASSWORD));
    h.stop_controller().await;
}

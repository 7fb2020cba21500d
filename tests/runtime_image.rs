//! The container image needs nothing beyond its base image: the provider binary, run in a root file
//! system holding only what `gcr.io/distroless/cc-debian12:nonroot` holds that a program can use
//! (the Debian 12 packages libc6, libgcc-s1, gcc-12-base and the ca-certificates bundle, the
//! `nonroot` user, /tmp), as that user (uid 65532), provisions and tears down a machine against
//! fakepve (HTTPS with a private CA) and the in-memory Omni.
//!
//! The package list is distroless's own (GoogleContainerTools/distroless, base/config.bzl
//! `BASE_PACKAGES["debian12"]` = libc6, libssl3; cc/config.bzl `CC_PACKAGES["debian12"]` = libgomp1,
//! libstdc++6, libgcc-s1, gcc-12-base; base/base.bzl: the static layer with base-files, netbase,
//! tzdata, the CA bundle, passwd with nonroot = 65532, /tmp). The file system here is a subset of
//! that (libssl3, libstdc++6 and libgomp1 left out: the binary does not use them), so what runs
//! here runs in the image. `scripts/setup-test-env.sh` fetches the packages with `apt-get
//! download` into `.venv/runtime-rootfs`; only Debian 12 has them, so elsewhere the test is
//! skipped, except under `CI=true`, where it fails.
//!
//! It runs the debug binary `make test` builds: its shared-library needs are the release build's
//! (same target, same linker, same crates), and a release build would add minutes to every CI run.
//! `make image-check` builds the release binary the image ships and runs this test on it
//! (`PROVIDER_BINARY` names the binary to run).
//! `unshare --user --map-user=65532 --root=…` (util-linux) makes the chroot without privileges;
//! the container runtime's /proc and /dev are absent here, so the binary is shown not to need them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use omni_infra_provider_proxmox::omni::proto::specs::{
    MachineRequestSpec, machine_request_status_spec::Stage,
};
use omni_infra_provider_proxmox::omni::resources::{MACHINE_REQUEST, MACHINE_REQUEST_STATUS};
use testkit::fakepve::{FakePve, TOKEN_ID, TOKEN_SECRET, three_node_scenario};

const WAIT: Duration = Duration::from_secs(60);
const NONROOT: &str = "65532";

fn required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The runtime file system made by the setup script, or `None` (skipped) where it cannot be made.
fn runtime_rootfs() -> Option<PathBuf> {
    let rootfs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/runtime-rootfs");
    if rootfs.join(".complete").exists() {
        return Some(rootfs);
    }
    skip("no runtime root file system: run `scripts/setup-test-env.sh` on Debian 12")
}

fn skip<T>(msg: &str) -> Option<T> {
    assert!(!required(), "{msg} (required because CI=true)");
    eprintln!("SKIPPED: {msg}");
    None
}

/// Whether this machine lets us make a user namespace (some kernels forbid it to non-root users).
fn user_namespaces() -> Option<()> {
    let ok = Command::new("unshare")
        .args([
            "--user",
            "--map-user",
            NONROOT,
            "--map-group",
            NONROOT,
            "true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Some(())
    } else {
        skip(
            "`unshare --user` does not work here (util-linux missing, or user namespaces disabled)",
        )
    }
}

/// A private copy of the runtime file system with the binary as the image has it (`/` + its name),
/// the config file and the Proxmox CA.
fn image_root(rootfs: &Path, config: &str, ca: &Path) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let copied = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", rootfs.display()))
        .arg(root.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let binary = std::env::var_os("PROVIDER_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_omni-infra-provider-proxmox")));
    std::fs::copy(&binary, root.path().join("omni-infra-provider-proxmox"))
        .unwrap_or_else(|e| panic!("cannot copy {}: {e}", binary.display()));
    std::fs::create_dir_all(root.path().join("etc/omni-proxmox")).unwrap();
    std::fs::copy(ca, root.path().join("etc/omni-proxmox/pve-root-ca.pem")).unwrap();
    std::fs::write(root.path().join("config.yaml"), config).unwrap();
    root
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_runs_in_the_runtime_image_as_its_nonroot_user() {
    let (Some(rootfs), Some(())) = (runtime_rootfs(), user_namespaces()) else {
        return;
    };
    let pve = FakePve::start(three_node_scenario(), 0.0);
    let omni = testkit::omni::Omni::start("proxmox").await;
    let config = format!(
        "proxmox:\n  url: \"{}/api2/json\"\n  tokenID: \"{TOKEN_ID}\"\n  tokenSecret: \"{TOKEN_SECRET}\"\n  caFile: /etc/omni-proxmox/pve-root-ca.pem\n",
        pve.url
    );
    let root = image_root(&rootfs, &config, &pve.pki.ca_pem);
    let log_path = root.path().join("tmp/provider.log");
    let mut child = spawn_in_image(root.path(), &log_path, &omni);
    let spec = MachineRequestSpec {
        talos_version: "v1.11.3".into(),
        provider_data: "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\n".into(),
        ..Default::default()
    };
    omni.state
        .create_machine_request("in-image", "proxmox", "s", &spec);
    let provisioned = omni
        .state
        .wait_for(WAIT, |s| {
            s.get(&MACHINE_REQUEST_STATUS, "in-image")
                .is_some_and(|st| st.spec.stage == Stage::Provisioned as i32)
        })
        .await;
    if provisioned {
        // By now the process runs in a user namespace as uid 65532 and nothing else: no
        // capability, and no file of another user it could read as root.
        let uid_map =
            std::fs::read_to_string(format!("/proc/{}/uid_map", child.id())).unwrap_or_default();
        assert_eq!(
            uid_map.split_whitespace().next(),
            Some(NONROOT),
            "uid map: {uid_map:?}"
        );
    }
    omni.state.teardown(&MACHINE_REQUEST, "in-image");
    let released = provisioned
        && omni
            .state
            .wait_for(WAIT, |s| {
                s.collect_torn_down(&MACHINE_REQUEST);
                s.get(&MACHINE_REQUEST, "in-image").is_none()
            })
            .await;
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        provisioned && released,
        "in the runtime file system the provider did not provision and release a machine:\n{output}"
    );
    assert!(status.success(), "exit {status:?}:\n{output}");
}

/// The binary as the image's entrypoint runs it: `/omni-infra-provider-proxmox` in `root`, as uid
/// and gid 65532, with the image's environment only (nothing of the host's, such as PATH or
/// SSL_CERT_FILE, leaks in), its log to `log`.
fn spawn_in_image(root: &Path, log: &Path, omni: &testkit::omni::Omni) -> std::process::Child {
    let log = std::fs::File::create(log).unwrap();
    Command::new("unshare")
        .args(["--user", "--map-user", NONROOT, "--map-group", NONROOT])
        .arg("--root")
        .arg(root)
        .args([
            "/omni-infra-provider-proxmox",
            "--config-file",
            "/config.yaml",
        ])
        .args(["--health-interval", "200ms"])
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
        .env("OMNI_ENDPOINT", omni.url())
        // The in-memory Omni speaks plaintext.
        .env("OMNI_INSECURE_HTTP", "true")
        .env("OMNI_SERVICE_ACCOUNT_KEY", &omni.encoded_key)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("cannot run unshare (util-linux)")
}

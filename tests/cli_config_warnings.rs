//! Every command that reads the config file names its misspelt keys with a "did you mean", and the
//! logs it writes to a file are plain text: no terminal colour codes.
//!
//! The Proxmox URL points at a closed port, so each command fails after loading the file: the
//! warning must come before that failure, which is what a user with a misspelt
//! `insecureSkipVerify` needs (otherwise they see only a certificate or connection error).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::memstate::MemState;

const TYPO_CONFIG: &str = "proxmox:\n  url: https://127.0.0.1:1/api2/json\n  tokenID: omni@pve!provider\n  tokenSecret: not-used\n  insecureSkipVerfy: true\ndefaults:\n  corse: 2\n";

fn write_config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("config.yaml");
    std::fs::write(&path, TYPO_CONFIG).unwrap();
    path
}

fn binary(dir: &Path, log: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_omni-infra-provider-proxmox"));
    cmd.current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env("OMNI_ENDPOINT", "http://127.0.0.1:1")
        .env("OMNI_INSECURE_HTTP", "true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    cmd
}

fn assert_names_the_typos(command: &str, log: &str) {
    assert!(
        log.contains("unknown key `proxmox.insecureSkipVerfy` is ignored (did you mean `insecureSkipVerify`?)"),
        "{command}: {log}"
    );
    assert!(log.contains("did you mean `cores`?"), "{command}: {log}");
    assert!(
        !log.contains('\u{1b}'),
        "{command} wrote terminal escape codes into a file: {log:?}"
    );
}

#[test]
fn cluster_orphans_and_pools_name_misspelt_config_keys() {
    let key = MemState::new().register_provider("proxmox").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    for command in ["cluster", "orphans", "pools"] {
        let log = dir.path().join(format!("{command}.log"));
        let status = binary(dir.path(), &log)
            .arg(command)
            .arg("--config-file")
            .arg(&config)
            .env("OMNI_SERVICE_ACCOUNT_KEY", key.expose())
            .status()
            .unwrap();
        assert!(!status.success(), "{command} reached a closed port?");
        assert_names_the_typos(command, &std::fs::read_to_string(&log).unwrap());
    }
}

/// The provider itself, with its log going to a file (as under `docker logs` or a service manager):
/// the config warnings are there, and no line carries a colour code.
#[test]
fn provider_log_in_a_file_is_plain_text() {
    let key = MemState::new().register_provider("proxmox").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let log = dir.path().join("provider.log");
    let mut child = binary(dir.path(), &log)
        .arg("--config-file")
        .arg(&config)
        .env("OMNI_SERVICE_ACCOUNT_KEY", key.expose())
        .spawn()
        .unwrap();
    // Omni is out of reach, so the provider keeps trying; its log says so once it got that far.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut text = String::new();
    while Instant::now() < deadline {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("Omni is out of reach") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(text.contains("Omni is out of reach"), "{text}");
    assert!(text.contains("INFO"), "{text}");
    assert_names_the_typos("the provider", &text);
}

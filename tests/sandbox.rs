//! `make sandbox`'s cluster fits the examples: with `examples/config.yaml` pointed at it, every
//! machine class in `examples/machine-classes/` passes `validate` with no problem and no warning,
//! and `cluster`, `pools` and `orphans` run cleanly against it and the in-memory Omni, as the
//! README's sandbox section shows them.

use std::process::{Output, Stdio};

use testkit::fakepve::FakePve;
use testkit::sandbox;

fn binary(args: &[&str], config: &std::path::Path, omni: &testkit::omni::Omni) -> Output {
    omni.provider_command()
        .args(&args[..1])
        .arg("--config-file")
        .arg(config)
        .args(&args[1..])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn show(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_is_valid_against_the_sandbox() {
    let pve = FakePve::start(sandbox::scenario(), 0.0);
    let omni = testkit::omni::Omni::start("proxmox").await;
    let example = include_str!("../examples/config.yaml");
    let text = sandbox::config_yaml(example, &pve.url, &pve.pki.ca_pem.display().to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    let config = pve.dir.path().join("sandbox-config.yaml");
    std::fs::write(&config, text).unwrap();

    let classes_dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/machine-classes");
    let mut classes: Vec<_> = std::fs::read_dir(&classes_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    classes.sort();
    assert!(classes.len() >= 7, "{classes:?}");
    for class in &classes {
        let out = binary(&["validate", &class.display().to_string()], &config, &omni);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("OK: no problems found (0 warning(s))"),
            "{} against the sandbox: {}",
            class.display(),
            show(&out)
        );
    }
    for command in ["cluster", "pools", "orphans"] {
        let out = binary(&[command], &config, &omni);
        assert!(out.status.success(), "{command}: {}", show(&out));
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("WARN"),
            "{command} warned about the example config: {}",
            show(&out)
        );
    }
}

/// The sandbox config is the example with only its connection changed, and a change to the
/// example that drops a connection key is named rather than silently kept.
#[test]
fn sandbox_config_is_the_example_pointed_at_the_fake_cluster() {
    let example = include_str!("../examples/config.yaml");
    let text = sandbox::config_yaml(example, "https://127.0.0.1:8006", "/tmp/ca.pem").unwrap();
    assert!(text.contains("  url: \"https://127.0.0.1:8006/api2/json\"\n"));
    assert!(text.contains("  caFile: \"/tmp/ca.pem\"\n"));
    assert!(!text.contains("pve.example.com"));
    assert_eq!(text.lines().count(), example.lines().count());
    let without_ca: String = example
        .lines()
        .filter(|l| !l.starts_with("  caFile:"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        sandbox::config_yaml(&without_ca, "https://x", "/ca").unwrap_err(),
        "examples/config.yaml has no `proxmox.caFile` line to point at the sandbox"
    );
}

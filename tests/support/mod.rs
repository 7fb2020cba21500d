//! Shared test helpers. Each integration test binary compiles this module and uses part of it.
#![allow(dead_code)]

pub mod certs;
pub mod fakepve;
pub mod harness;
pub mod omni;
pub mod sandbox;

use std::time::{Duration, Instant};

/// Runs the provider binary's `args[0]` command with `--config-file config` and the rest of `args`,
/// feeding it `stdin`: whether it succeeded, and its stdout.
pub fn cli(args: &[&str], config: &std::path::Path, stdin: &str) -> (bool, String) {
    let out = cli_output(args, config, stdin);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// [`cli`] with everything the process left: exit status, stdout and stderr.
pub fn cli_output(args: &[&str], config: &std::path::Path, stdin: &str) -> std::process::Output {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_omni-infra-provider-proxmox"))
        .arg(args[0])
        .arg("--config-file")
        .arg(config)
        .args(&args[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`. Tests wait for
/// conditions, never for fixed times.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    let mut delay = Duration::from_millis(5);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
    }
}

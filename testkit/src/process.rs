//! The provider binary as a process: where it is built, and one command run to completion.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The provider binary Cargo built beside the running test or example: test binaries live in
/// `target/<profile>/deps/`, examples in `target/<profile>/examples/`, the provider in
/// `target/<profile>/`. `cargo test` and `cargo build --bins --examples` build it.
pub fn provider_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .ok_or("cannot locate the target directory")?;
    let bin = dir.join("omni-infra-provider-proxmox");
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "{} is missing: build it first (`cargo build --bins --examples`, or use `make demo`)",
            bin.display()
        ))
    }
}

/// [`provider_binary`] for a test, which fails saying what to build.
pub fn provider_binary_for_test() -> PathBuf {
    provider_binary().unwrap_or_else(|e| panic!("{e}"))
}

/// Runs the provider binary's `args[0]` command with `--config-file config` and the rest of `args`,
/// feeding it `stdin`: whether it succeeded, and its stdout.
pub fn cli(args: &[&str], config: &Path, stdin: &str) -> (bool, String) {
    let out = cli_output(args, config, stdin);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// [`cli`] with everything the process left: exit status, stdout and stderr.
pub fn cli_output(args: &[&str], config: &Path, stdin: &str) -> Output {
    let mut child = Command::new(provider_binary_for_test())
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

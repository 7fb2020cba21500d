//! Test doubles and the shared test harness of `omni-infra-provider-proxmox`, kept out of the
//! shipped binary: the in-memory Omni ([`memstate`]) with Omni's signature check ([`verify`]), the
//! keys it registers ([`keys`]) and a served instance of it for tests ([`omni`]), fakepve, the fake
//! Proxmox VE ([`fakepve`], its certificates in [`certs`], the cluster of `make sandbox` in
//! [`sandbox`]), the provider in-process against both ([`harness`]) or as a process ([`process`]),
//! one [`eventually`] (and [`until`] over it), and hostile input for property tests ([`junk`]). The
//! `dev-omni` binary serves [`memstate`] for local development.
//!
//! The provider crate depends on this one only as a dev-dependency (its integration tests and
//! examples); this crate depends on the provider crate for the resource kinds, the protobuf types and
//! the codec.

pub mod certs;
pub mod fakepve;
pub mod harness;
pub mod junk;
pub mod keys;
pub mod memstate;
pub mod omni;
pub mod process;
pub mod sandbox;
pub mod verify;

/// The server stubs the in-memory Omni implements (see `build.rs`), over the provider crate's
/// message types.
pub mod proto {
    /// `cosi.resource.State`.
    pub mod state {
        tonic::include_proto!("cosi.resource");
    }
    /// `management.ManagementService`.
    pub mod management {
        tonic::include_proto!("management");
    }
}

use std::time::{Duration, Instant};

pub use process::{cli, cli_output, provider_binary};

/// The repository's root directory (where `.venv`, `tests/` and the README are).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
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

/// [`eventually`] for a condition that is checked without awaiting (a look at fakepve, the in-memory
/// Omni or a child process).
pub async fn until(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) {
    eventually(timeout, what, || {
        let done = done();
        async move { done.then_some(()) }
    })
    .await
}

/// A log sink for a test that checks a message only the provider's log carries: every
/// `LogWriter` over one buffer appends to it (a `tracing_subscriber` writer is `move ||
/// LogWriter(buffer.clone())`).
pub struct LogWriter(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut buffer = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        buffer.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

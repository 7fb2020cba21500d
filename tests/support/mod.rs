//! Shared test helpers. Each integration test binary compiles this module and uses part of it.
#![allow(dead_code)]

pub mod certs;
pub mod fakepve;
pub mod harness;
pub mod omni;

use std::time::{Duration, Instant};

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

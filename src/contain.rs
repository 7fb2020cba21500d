//! Panics kept where they happen: a bug met by one request (or one round of a background loop)
//! becomes a failure of that request or that round, reported once, and everything else goes on.
//!
//! Without this a panic unwinds the task it happens in: the work queue never hears that the
//! request's reconcile ended, so the request is never looked at again (not even to tear it down),
//! and a background loop simply stops. The panic hook installed by [`install_hook`] keeps the
//! message of a contained panic for the caller to report instead of printing it a second time;
//! panics anywhere else are printed as always.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;
use std::task::Poll;

/// A contained panic: what it said and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("internal error (a bug, please report it): {message}")]
pub struct Panic {
    pub message: String,
}

thread_local! {
    /// Set while a contained call runs on this thread.
    static CONTAINING: Cell<bool> = const { Cell::new(false) };
    /// The message of the last contained panic on this thread, with its location.
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs the hook that keeps contained panics quiet (idempotent); other panics are printed by
/// the hook that was installed before.
pub fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CONTAINING.with(Cell::get) {
                let location = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                let text = format!("{}{location}", payload_text(info.payload()));
                LAST.with(|last| *last.borrow_mut() = Some(text));
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic into an error.
pub fn call<T>(f: impl FnOnce() -> T) -> Result<T, Panic> {
    let was = CONTAINING.with(|c| c.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    CONTAINING.with(|c| c.set(was));
    let message = LAST.with(|last| last.borrow_mut().take());
    result.map_err(|payload| Panic {
        message: message.unwrap_or_else(|| payload_text(&*payload)),
    })
}

/// Runs `future`, turning a panic in any of its polls into an error.
pub async fn future<F: Future>(future: F) -> Result<F::Output, Panic> {
    let mut future = Box::pin(future);
    std::future::poll_fn(|cx| match call(|| future.as_mut().poll(cx)) {
        Ok(poll) => poll.map(Ok),
        Err(panic) => Poll::Ready(Err(panic)),
    })
    .await
}

fn payload_text(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_with_its_message_and_place() {
        install_hook();
        let err = call(|| -> u32 { panic!("boom {}", 7) }).unwrap_err();
        assert!(
            err.message.starts_with("boom 7 at src/contain.rs:"),
            "{err}"
        );
        assert_eq!(call(|| 3), Ok(3));
    }

    #[tokio::test]
    async fn a_panic_in_a_later_poll_becomes_an_error() {
        install_hook();
        let err = future(async {
            tokio::task::yield_now().await;
            panic!("after a yield");
        })
        .await;
        let err: Panic = match err {
            Ok(()) => unreachable!(),
            Err(e) => e,
        };
        assert!(err.message.contains("after a yield"), "{err}");
        assert_eq!(future(async { 5 }).await, Ok(5));
    }
}

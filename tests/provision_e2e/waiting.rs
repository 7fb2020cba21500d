//! What a request weighs while it waits. In a burst of a thousand requests most of them wait for a
//! slot at once (`--concurrency` per node), each holding its reconcile's future, and a future is as
//! large as the largest state it can be in: an Omni call made inside it without a box adds some
//! 2 KiB to every waiting request, a status write 6 KiB, a step 9 KiB (release build). Before the
//! steps and the Omni calls were boxed, a waiting request held 11.7 KiB; a thousand, 11 MiB.

use std::mem::size_of_val;

use omni_infra_provider_proxmox::controller::{provision, teardown};
use omni_infra_provider_proxmox::omni::proto::specs::MachineRequestSpec;
use omni_infra_provider_proxmox::omni::state::Typed;

use testkit::harness::Harness;

/// Above what apply, cleanup and orphan measure now (2.0, 3.0 and 2.9 KiB, debug and release
/// builds alike), below what they were before (11.6, 8.8 and 8.8 KiB) and what one unboxed step
/// or status write would add.
const WAITING_FUTURE_MAX: usize = 6 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_a_slot_holds_a_small_future() {
    let h = Harness::start("").await;
    let ctx = h.context();
    let mut request = Typed {
        metadata: Default::default(),
        spec: MachineRequestSpec::default(),
        unknown_fields: Vec::new(),
        received_spec: None,
    };
    request.metadata.id = "waiting-1".into();
    // Made, never polled: their size is what a waiting request holds.
    let apply = provision::apply(&ctx, &request);
    let cleanup = teardown::cleanup(&ctx, &request);
    let orphan = teardown::orphan(&ctx, "waiting-1");
    let sizes = [
        ("apply", size_of_val(&apply)),
        ("cleanup", size_of_val(&cleanup)),
        ("orphan", size_of_val(&orphan)),
    ];
    eprintln!("reconcile futures: {sizes:?}");
    for (what, size) in sizes {
        assert!(
            size <= WAITING_FUTURE_MAX,
            "a request in {what} holds a {size}-byte future while it waits for a slot (at most \
             {WAITING_FUTURE_MAX}): box the step or Omni call that made it grow"
        );
    }
}

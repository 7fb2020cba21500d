//! The provisioning pipeline: the steps, and the deprovision. Each step glues decisions from
//! [`crate::rules`] to the Proxmox and Omni clients; what decides something is there, pure and tested
//! without a network.
pub mod deprovision;

pub mod configure_vm;
pub mod context;
pub mod create_vm;
pub mod discover_ip;
pub mod error;
pub mod ha;
pub mod identify;
pub mod image_factory;
pub mod ip_pool;
pub mod ledgers;
pub mod pick_node;
pub mod prepare_image;
pub mod services;
pub mod start_vm;
pub mod step;
pub mod template;

use step::{Step, StepContext, StepError, StepOutcome};

/// Runs one step, with what the steps before it recorded (its node, its VM).
pub async fn run_step(step: Step, ctx: &mut StepContext<'_>) -> Result<StepOutcome, StepError> {
    match step {
        Step::PickNode => pick_node::run(ctx).await,
        Step::PrepareImage => prepare_image::run(ctx, &ctx.placed()?).await,
        Step::CreateVm => create_vm::run(ctx, &ctx.placed()?).await,
        Step::ConfigureVm => configure_vm::run(ctx).await,
        Step::StartVm => start_vm::run(ctx).await,
        Step::DiscoverIp => discover_ip::run(ctx).await,
    }
}

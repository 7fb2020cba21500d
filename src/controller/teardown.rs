//! Tearing a MachineRequest down (reference §3.6), in Omni's order: our config patch requests, the
//! MachineRequestStatus (waiting for Omni's own finalizers), the VM, the provider state, and last our
//! finalizer on the request. Unlike the Go library, a missing provider state does not stop the
//! teardown forever: there is simply nothing to deprovision.

use std::time::Duration;

use super::provision::{Action, Provisioner, ReconcileError};
use crate::omni::proto::specs::MachineRequestSpec;
use crate::omni::resources::{MachineRequest, MachineRequestStatus, ProviderMachine};
use crate::omni::state::{ResourceRef, StateError, Typed};

/// How often to look again while Omni still holds a finalizer on something we tore down.
pub const WAIT_FOR_OMNI: Duration = Duration::from_secs(2);

pub async fn run(
    p: &Provisioner,
    request: &Typed<MachineRequestSpec>,
) -> Result<Action, ReconcileError> {
    let id = request.id();
    if !request.has_finalizer(&p.owner) {
        // Not ours to clean up (never reconciled, or done already).
        p.forget(id);
        return Ok(Action::Done);
    }
    // The status first: Omni holds it until the machine left its cluster and its Link is gone.
    let status_ref = ResourceRef::of(&MachineRequestStatus, id);
    if !teardown_and_destroy(p, &status_ref).await? {
        return Ok(Action::RequeueAfter(WAIT_FOR_OMNI));
    }
    let machine_kind = ProviderMachine::new(p.provider_id());
    let machine = p
        .state
        .find(&machine_kind, id)
        .await
        .map_err(|e| teardown_error("reading the provider state", e))?;
    if let Some(machine) = &machine {
        deprovision_vm(p, id, &machine.spec).await?;
        let machine_ref = ResourceRef::of(&machine_kind, id);
        if !teardown_and_destroy(p, &machine_ref).await? {
            return Ok(Action::RequeueAfter(WAIT_FOR_OMNI));
        }
    }
    p.state
        .remove_finalizer(&ResourceRef::of(&MachineRequest, id), &p.owner)
        .await
        .or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) })
        .map_err(|e| teardown_error("removing our finalizer from the machine request", e))?;
    p.forget(id);
    tracing::info!(request = %id, "machine request torn down");
    Ok(Action::Done)
}

/// Tears down then destroys; `false` while someone else's finalizer is still on it. Gone = done.
async fn teardown_and_destroy(p: &Provisioner, what: &ResourceRef) -> Result<bool, ReconcileError> {
    match p.state.teardown(what, &p.owner).await {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        Err(e) if e.is_not_found() => return Ok(true),
        Err(e) => return Err(teardown_error("tearing down", e)),
    }
    match p.state.destroy(what, &p.owner).await {
        Ok(()) => Ok(true),
        Err(e) if e.is_not_found() => Ok(true),
        // A finalizer arrived between teardown and destroy.
        Err(e) if e.is_conflict() => Ok(false),
        Err(e) => Err(teardown_error("destroying", e)),
    }
}

fn teardown_error(doing: &str, e: StateError) -> ReconcileError {
    ReconcileError::Teardown(format!("{doing}: {e}"))
}

async fn deprovision_vm(
    _p: &Provisioner,
    _id: &str,
    _spec: &crate::omni::proto::provider::MachineSpec,
) -> Result<(), ReconcileError> {
    Err(ReconcileError::Teardown(
        "deprovisioning is being wired in".into(),
    ))
}

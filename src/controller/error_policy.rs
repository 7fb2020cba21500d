//! What happens after a failed reconcile: how long until the next try, and what Omni shows meanwhile.
//!
//! Shaped like kube-runtime's `error_policy` (error in, action out), and pure, so the whole policy is
//! one table a test can read (docs/omni-protocol.md §3.8). The decision rests on the error's kind,
//! never on its wording, and falls into one of three answers:
//! - **transient** (the network, an overloaded API, a version conflict): retried soon, backing off;
//! - **waiting on the cluster** (a node offline, a storage offline, a guest locked): nothing to fix on
//!   our side and nothing gained by hammering, so retried slowly; the status says what it waits for
//!   without calling the request failed;
//! - **needs a human** (a missing privilege, invalid provider data, a missing template): shown as
//!   FAILED with the reason, and retried rarely, so a fix made outside Omni (a privilege granted, a
//!   template restored) is still picked up. A change to the request retries at once anyway.

use std::time::Duration;

use crate::omni::join::JoinError;
use crate::omni::proto::specs::machine_request_status_spec::Stage;
use crate::omni::state::StateError;
use crate::pipeline::deprovision::DeprovisionError;
use crate::pipeline::step::{Step, StepError};
use crate::proxmox::ProxmoxError;

/// Why a reconcile stopped short, kept typed until the policy has read its kind.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A provisioning step failed; the provider state says how far it got.
    #[error("step {}/{} {} failed: {source}", step.number(), Step::ALL.len(), step.as_str())]
    Step {
        step: Step,
        #[source]
        source: StepError,
    },
    /// The request asks for what cannot work here (its provider data, or a feature the cluster's
    /// Proxmox VE release lacks), found before anything was created.
    #[error("{doing}: {problem}")]
    Refused {
        doing: &'static str,
        problem: String,
    },
    #[error("{doing}: {source}")]
    Omni {
        doing: &'static str,
        #[source]
        source: Box<StateError>,
    },
    #[error("cannot build the join configuration: {0}")]
    Join(#[from] JoinError),
    #[error("deprovisioning: {0}")]
    Deprovision(#[from] Box<DeprovisionError>),
    /// The cluster listing a housekeeping round reads.
    #[error("listing the Proxmox cluster: {0}")]
    Listing(#[from] ProxmoxError),
    /// The reconcile panicked: a bug of ours, contained to this request.
    #[error("{0}")]
    Panicked(crate::contain::Panic),
}

/// A failed call to Omni while `doing`, for `map_err`.
pub fn omni(doing: &'static str) -> impl FnOnce(StateError) -> ReconcileError {
    move |source| ReconcileError::Omni {
        doing,
        source: Box::new(source),
    }
}

/// What the next try depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Transient,
    WaitingOnCluster,
    NeedsHuman,
}

/// What the MachineRequestStatus says until the next try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// `None` keeps the stage (a request being torn down has no provisioning stage to show).
    pub stage: Option<Stage>,
    pub status: String,
    pub error: String,
}

/// First retry after a transient failure; doubles per consecutive failure up to
/// [`TRANSIENT_MAX`].
const TRANSIENT_FIRST: Duration = Duration::from_secs(1);
const TRANSIENT_MAX: Duration = Duration::from_secs(60);
/// A node or storage comes back in minutes, not seconds: look again without flooding its logs.
const WAITING_FIRST: Duration = Duration::from_secs(5);
const WAITING_MAX: Duration = Duration::from_secs(120);
/// Long enough not to matter to Proxmox or Omni, short enough that a fix is noticed within minutes.
const NEEDS_HUMAN: Duration = Duration::from_secs(300);

/// When to try again after a failure of this kind. `attempt` counts this request's consecutive
/// failures, this one included (1 = first). What the status says meanwhile is [`report`]'s.
pub fn retry_after(kind: ErrorKind, attempt: u32) -> Duration {
    let doubling = |first: Duration, max: Duration| {
        first
            .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1).min(16)))
            .min(max)
    };
    match kind {
        ErrorKind::Transient => doubling(TRANSIENT_FIRST, TRANSIENT_MAX),
        ErrorKind::WaitingOnCluster => doubling(WAITING_FIRST, WAITING_MAX),
        ErrorKind::NeedsHuman => NEEDS_HUMAN,
    }
}

/// What the status says after `error`; the same whatever the attempt, so a failure repeating itself
/// costs no status write. `None`: the status is left alone (the failure was talking to Omni
/// itself, where a status write would fail the same way).
pub fn report(error: &ReconcileError) -> Option<Report> {
    let kind = kind(error);
    let failed_in = |doing: &str| match kind {
        ErrorKind::Transient => (Some(Stage::Failed), format!("Failed in {doing}; retrying")),
        ErrorKind::WaitingOnCluster => (
            Some(Stage::Provisioning),
            format!("Waiting in {doing} for the cluster; retrying until it is back"),
        ),
        ErrorKind::NeedsHuman => (
            Some(Stage::Failed),
            format!(
                "Failed in {doing}; needs attention, retrying every 5 minutes and when the request changes"
            ),
        ),
    };
    let ((stage, status), text) = match error {
        ReconcileError::Omni { .. } => return None,
        // FAILED, as the request cannot go on by itself, but retried at the waiting pace: a machine
        // on the pool going away heals it without anyone touching the request.
        ReconcileError::Step {
            step,
            source: StepError::PoolFull(_),
        } => {
            let status = format!(
                "Failed in {}: IP pool full; retrying until an address frees up",
                step.as_str()
            );
            ((Some(Stage::Failed), status), error.to_string())
        }
        ReconcileError::Step { step, source } => (failed_in(step.as_str()), source.to_string()),
        ReconcileError::Refused { doing, problem } => (failed_in(doing), problem.clone()),
        ReconcileError::Join(e) => (failed_in("building the join configuration"), e.to_string()),
        ReconcileError::Listing(e) => (failed_in("listing the Proxmox cluster"), e.to_string()),
        // The stage is left as it is: a bug is neither the request's failure nor the cluster's,
        // and a request being torn down has no stage to show.
        ReconcileError::Panicked(panic) => {
            let status = "Internal error; retrying every 5 minutes and when the request changes";
            ((None, status.to_owned()), panic.to_string())
        }
        ReconcileError::Deprovision(_) => {
            let status = match kind {
                ErrorKind::Transient => "retrying",
                ErrorKind::WaitingOnCluster => "waiting for the cluster; retrying until it is back",
                ErrorKind::NeedsHuman => "needs attention; retrying every 5 minutes",
            };
            (
                (None, format!("Deprovisioning: {status}")),
                error.to_string(),
            )
        }
    };
    Some(Report {
        stage,
        status,
        error: text,
    })
}

/// "What after this error", for every error a reconcile can meet.
pub fn kind(error: &ReconcileError) -> ErrorKind {
    match error {
        ReconcileError::Step { source, .. } => step_kind(source),
        ReconcileError::Refused { .. } | ReconcileError::Join(_) | ReconcileError::Panicked(_) => {
            ErrorKind::NeedsHuman
        }
        ReconcileError::Omni { source, .. } => omni_kind(source),
        ReconcileError::Deprovision(e) => deprovision_kind(e),
        ReconcileError::Listing(e) => proxmox_kind(e),
    }
}

fn step_kind(e: &StepError) -> ErrorKind {
    match e {
        StepError::Proxmox { source, .. } => proxmox_kind(source),
        StepError::Omni { source, .. } => omni_kind(source),
        // Provider data that cannot work, or a cluster without what the class names (a template,
        // an ISO storage, room on any node): a person changes the class or the cluster.
        StepError::Config { .. } | StepError::Cluster(_) => ErrorKind::NeedsHuman,
        // No room anywhere right now: VMs going away or a node coming back make room. A full IP
        // pool likewise: a machine on it going away frees an address.
        StepError::Placement(e) if e.may_heal() => ErrorKind::WaitingOnCluster,
        StepError::Placement(_) => ErrorKind::NeedsHuman,
        StepError::PoolFull(_) => ErrorKind::WaitingOnCluster,
    }
}

fn proxmox_kind(e: &ProxmoxError) -> ErrorKind {
    if e.is_node_unreachable() || e.is_guest_locked() || e.is_storage_offline() || e.is_no_quorum()
    {
        return ErrorKind::WaitingOnCluster;
    }
    match e {
        ProxmoxError::Transient { .. }
        | ProxmoxError::TaskTimeout { .. }
        | ProxmoxError::TaskFailed { .. }
        // The replica lost the lease: its reconciles stop, and the next leader tries again.
        | ProxmoxError::Fenced { .. }
        // Something we expected vanished under us (a migration, a hand deletion); the step looks
        // again on the next try.
        | ProxmoxError::NotFound { .. } => ErrorKind::Transient,
        // 5xx with a reason is often the state of the moment ("VM is running"); 4xx is our request
        // the way the config made it, which fails the same way until someone changes that.
        ProxmoxError::Api { status, .. } if *status >= 500 => ErrorKind::Transient,
        ProxmoxError::Api { .. }
        | ProxmoxError::Unauthorized { .. }
        | ProxmoxError::PermissionDenied { .. }
        | ProxmoxError::Decode { .. }
        | ProxmoxError::Setup(_) => ErrorKind::NeedsHuman,
    }
}

fn omni_kind(e: &StateError) -> ErrorKind {
    match e {
        StateError::Transport { .. }
        | StateError::Conflict { .. }
        | StateError::NotFound { .. }
        | StateError::AlreadyExists { .. }
        | StateError::Other { .. }
        | StateError::Fenced { .. } => ErrorKind::Transient,
        StateError::PermissionDenied { .. }
        | StateError::Unauthenticated { .. }
        | StateError::InvalidArgument { .. }
        | StateError::Unimplemented { .. }
        | StateError::Decode { .. } => ErrorKind::NeedsHuman,
    }
}

pub fn deprovision_kind(e: &DeprovisionError) -> ErrorKind {
    match e {
        DeprovisionError::NodeOffline { .. }
        | DeprovisionError::Locked { .. }
        | DeprovisionError::SeedIsoNodeOffline { .. } => ErrorKind::WaitingOnCluster,
        DeprovisionError::Ambiguous { .. } => ErrorKind::NeedsHuman,
        DeprovisionError::Listing { source, .. }
        | DeprovisionError::Proxmox { source, .. }
        | DeprovisionError::SeedIso { source, .. } => proxmox_kind(source),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::ops::RangeInclusive;

    use super::*;
    use crate::omni::state::ResourceRef;
    use crate::proxmox::error::Call;
    use crate::proxmox::types::{NodeName, Upid, VmId};
    use crate::rules::ip_pool::PoolFull;
    use crate::rules::placement::{LeftOut, PlacementError};

    fn call() -> Call {
        Call {
            method: "POST",
            path: "/nodes/pve2/qemu".into(),
        }
    }

    fn in_step(step: Step, source: ProxmoxError) -> ReconcileError {
        ReconcileError::Step {
            step,
            source: StepError::proxmox("creating VM 104 on pve2")(source),
        }
    }

    fn transient(status: Option<u16>, message: &str) -> ProxmoxError {
        ProxmoxError::Transient {
            call: call(),
            status,
            message: message.into(),
            request_sent: true,
        }
    }

    fn api(status: u16, message: &str) -> ProxmoxError {
        ProxmoxError::Api {
            call: call(),
            status,
            message: message.into(),
            field_errors: BTreeMap::new(),
        }
    }

    fn omni(source: StateError) -> ReconcileError {
        super::omni("recording the provider state")(source)
    }

    fn what() -> ResourceRef {
        ResourceRef::of(&crate::omni::resources::MACHINE_REQUEST, "req-1")
    }

    fn node(name: &str) -> NodeName {
        NodeName::new(name.to_owned()).unwrap()
    }

    fn vmid() -> VmId {
        VmId::new(104).unwrap()
    }

    fn secs(r: RangeInclusive<u64>) -> RangeInclusive<Duration> {
        Duration::from_secs(*r.start())..=Duration::from_secs(*r.end())
    }

    /// One row: an error, and what the policy must answer.
    struct Row {
        error: ReconcileError,
        kind: ErrorKind,
        /// The delay after the first failure, and after the tenth in a row.
        first: RangeInclusive<Duration>,
        tenth: RangeInclusive<Duration>,
        /// `None` with an empty `status`: the status is left alone.
        stage: Option<Stage>,
        status: &'static str,
    }

    fn row(
        error: ReconcileError,
        kind: ErrorKind,
        first: RangeInclusive<Duration>,
        tenth: RangeInclusive<Duration>,
        stage: Option<Stage>,
        status: &'static str,
    ) -> Row {
        Row {
            error,
            kind,
            first,
            tenth,
            stage,
            status,
        }
    }

    #[test]
    fn the_policy_table() {
        use ErrorKind::*;
        let table = vec![
            row(
                in_step(Step::CreateVm, transient(Some(503), "proxy went away")),
                Transient,
                secs(1..=1),
                secs(60..=60),
                Some(Stage::Failed),
                "Failed in create_vm; retrying",
            ),
            row(
                in_step(Step::StartVm, api(500, "start refused")),
                Transient,
                secs(1..=1),
                secs(60..=60),
                Some(Stage::Failed),
                "Failed in start_vm",
            ),
            row(
                in_step(
                    Step::StartVm,
                    ProxmoxError::TaskFailed {
                        upid: Upid::parse("UPID:pve2:1:2:3:qmstart:104:root@pam:").unwrap(),
                        exit_status: "start failed".into(),
                        log_tail: vec![],
                    },
                ),
                Transient,
                secs(1..=1),
                secs(60..=60),
                Some(Stage::Failed),
                "Failed in start_vm",
            ),
            row(
                omni(StateError::Conflict {
                    what: what(),
                    message: "version mismatch".into(),
                }),
                Transient,
                secs(1..=1),
                secs(60..=60),
                None,
                "",
            ),
            row(
                ReconcileError::Step {
                    step: Step::PickNode,
                    source: StepError::Placement(PlacementError::NothingFits {
                        rejected: vec![(
                            "pve1".into(),
                            LeftOut::MemoryShort {
                                free_memory: 1024 << 20,
                                needed_mb: 4096,
                            },
                        )],
                    }),
                },
                WaitingOnCluster,
                secs(5..=5),
                secs(120..=120),
                Some(Stage::Provisioning),
                "Waiting in pick_node for the cluster",
            ),
            // A class that names a node the cluster lacks: a person changes the class.
            row(
                ReconcileError::Step {
                    step: Step::PickNode,
                    source: StepError::Placement(PlacementError::PinnedNodeMissing {
                        node: "pve9".into(),
                        existing: vec!["pve1".into()],
                    }),
                },
                NeedsHuman,
                secs(300..=300),
                secs(300..=300),
                Some(Stage::Failed),
                "Failed in pick_node",
            ),
            // A full IP pool: FAILED, saying so, but retried at the waiting pace so a release heals
            // it within two minutes.
            row(
                ReconcileError::Step {
                    step: Step::PickNode,
                    source: StepError::PoolFull(PoolFull {
                        pool: "talos-net".into(),
                        in_use: 100,
                        size: 100,
                    }),
                },
                WaitingOnCluster,
                secs(5..=5),
                secs(120..=120),
                Some(Stage::Failed),
                "Failed in pick_node: IP pool full; retrying until an address frees up",
            ),
            row(
                in_step(Step::CreateVm, transient(Some(595), "No route to host")),
                WaitingOnCluster,
                secs(5..=5),
                secs(120..=120),
                Some(Stage::Provisioning),
                "Waiting in create_vm for the cluster",
            ),
            row(
                in_step(Step::ConfigureVm, api(500, "VM is locked (clone)")),
                WaitingOnCluster,
                secs(5..=5),
                secs(120..=120),
                Some(Stage::Provisioning),
                "Waiting in configure_vm",
            ),
            row(
                in_step(Step::PrepareImage, api(500, "storage 'nfs' is not online")),
                WaitingOnCluster,
                secs(5..=5),
                secs(120..=120),
                Some(Stage::Provisioning),
                "Waiting in prepare_image",
            ),
            row(
                ReconcileError::Deprovision(Box::new(DeprovisionError::NodeOffline {
                    node: node("pve2"),
                    vmid: vmid(),
                    state: "offline",
                })),
                WaitingOnCluster,
                secs(5..=5),
                secs(120..=120),
                None,
                "Deprovisioning: waiting for the cluster",
            ),
            row(
                ReconcileError::Deprovision(Box::new(DeprovisionError::Proxmox {
                    action: crate::pipeline::deprovision::Action::Destroy,
                    vmid: vmid(),
                    node: node("pve2"),
                    source: transient(Some(503), "proxy went away"),
                })),
                Transient,
                secs(1..=1),
                secs(60..=60),
                None,
                "Deprovisioning: retrying",
            ),
            row(
                in_step(
                    Step::CreateVm,
                    ProxmoxError::PermissionDenied {
                        call: call(),
                        message: "Permission check failed (/vms/104, VM.Allocate)".into(),
                    },
                ),
                NeedsHuman,
                secs(300..=300),
                secs(300..=300),
                Some(Stage::Failed),
                "needs attention",
            ),
            row(
                in_step(
                    Step::CreateVm,
                    ProxmoxError::Unauthorized {
                        call: call(),
                        message: "authentication failure".into(),
                    },
                ),
                NeedsHuman,
                secs(300..=300),
                secs(300..=300),
                Some(Stage::Failed),
                "Failed in create_vm",
            ),
            row(
                in_step(Step::CreateVm, api(400, "Parameter verification failed.")),
                NeedsHuman,
                secs(300..=300),
                secs(300..=300),
                Some(Stage::Failed),
                "needs attention",
            ),
            row(
                ReconcileError::Step {
                    step: Step::PrepareImage,
                    source: StepError::Cluster("template talos-v9 not found in the cluster".into()),
                },
                NeedsHuman,
                secs(300..=300),
                secs(300..=300),
                Some(Stage::Failed),
                "Failed in prepare_image",
            ),
            row(
                ReconcileError::Refused {
                    doing: "validating provider data",
                    problem: "invalid provider data: cores: must be at least 1".into(),
                },
                NeedsHuman,
                secs(300..=300),
                secs(300..=300),
                Some(Stage::Failed),
                "Failed in validating provider data",
            ),
            row(
                ReconcileError::Join(JoinError::EmptyToken),
                NeedsHuman,
                secs(300..=300),
                secs(300..=300),
                Some(Stage::Failed),
                "Failed in building the join configuration",
            ),
            row(
                omni(StateError::PermissionDenied {
                    what: what(),
                    message: "no".into(),
                }),
                NeedsHuman,
                secs(300..=300),
                secs(300..=300),
                None,
                "",
            ),
            row(
                ReconcileError::Deprovision(Box::new(DeprovisionError::Ambiguous {
                    request_id: "req-1".into(),
                    vmids: vec![vmid()],
                })),
                NeedsHuman,
                secs(300..=300),
                secs(300..=300),
                None,
                "Deprovisioning: needs attention",
            ),
        ];
        for Row {
            error,
            kind,
            first,
            tenth,
            stage,
            status,
        } in table
        {
            assert_eq!(super::kind(&error), kind, "{error}");
            let soon = retry_after(kind, 1);
            assert!(first.contains(&soon), "{error}: {soon:?}");
            let later = retry_after(kind, 10);
            assert!(tenth.contains(&later), "{error}: {later:?}");
            match report(&error) {
                None => assert!(stage.is_none() && status.is_empty(), "{error}: no report"),
                Some(report) => {
                    assert_eq!(report.stage, stage, "{error}");
                    assert!(report.status.contains(status), "{error}: {report:?}");
                    assert!(!report.error.is_empty(), "{error}");
                }
            }
        }
    }

    #[test]
    fn transient_retries_grow_from_one_second_as_before() {
        let delays: Vec<u64> = (1..=8)
            .map(|n| retry_after(ErrorKind::Transient, n).as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(
            retry_after(ErrorKind::Transient, u32::MAX),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn the_status_error_is_what_proxmox_said_with_what_we_were_doing() {
        let e = in_step(Step::StartVm, api(500, "start refused by test"));
        let report = report(&e).unwrap();
        assert_eq!(
            report.error,
            "creating VM 104 on pve2: Proxmox rejected POST /nodes/pve2/qemu: 500 start refused by test"
        );
    }
}

//! The six provisioning steps: their order, their names, and where a request resumes.
//!
//! Steps run in order; each reads what the previous ones recorded in the provider state
//! ([`MachineState`]) and records what it decided, so a restart at any point resumes at the first step
//! not yet done, and re-running a step is always safe. A step returns [`StepOutcome::Done`], asks to
//! be called again later ([`StepOutcome::Requeue`], for waits that take long, such as a guest agent
//! coming up: a requeue never holds a worker), or fails with a [`StepError`] whose text is what the
//! user reads in Omni.

use std::time::Duration;

pub use super::context::{StatePort, StatusPort, StepContext};
pub use super::error::StepError;
pub use super::services::{AGENT_POLL, RequestInfo, Services};
use crate::model::MachineState;

crate::proxmox::property::str_enum!(
    /// The steps, in order. Names are persisted in the provider state.
    Step {
        PickNode = "pick_node",
        PrepareImage = "prepare_image",
        CreateVm = "create_vm",
        ConfigureVm = "configure_vm",
        StartVm = "start_vm",
        DiscoverIp = "discover_ip",
    }
);

impl Step {
    /// 1-based position, for "step 3/6".
    pub fn number(self) -> usize {
        self as usize + 1
    }

    /// The official provider's name for the step of its own that this step's work corresponds to,
    /// written to the `infra.omni.sidero.dev/step` annotation after the step ran (done or not), as the
    /// Go library writes the name of the step it last ran.
    ///
    /// The Go library resumes by skipping every step until the annotated one and running that one
    /// again (an unknown name skips them all and marks the request provisioned with no VM), so the
    /// name must be one of its steps and its re-run must be harmless given the state fields we wrote:
    /// - `pickNode` picks a node again (nothing exists yet);
    /// - `uploadISO` checks the recorded download task, or finds the ISO by name, or downloads it;
    ///   without a schematic (clone mode) it could build no URL, so `createSchematic` is named instead;
    /// - `syncVM` checks the recorded create task instead of creating a VM; with no create task
    ///   recorded (a VM adopted rather than created by us) it would create a second VM, so once a
    ///   VMID is recorded without a create task `startVM` is named instead;
    /// - `startVM` checks the recorded start task instead of starting again. Its later steps
    ///   (`registerHA`, `syncHARules`) check what exists before they act.
    pub fn go_name(self, state: &MachineState) -> &'static str {
        match self {
            Step::PickNode => "pickNode",
            Step::PrepareImage if state.schematic.is_none() => "createSchematic",
            Step::PrepareImage => "uploadISO",
            Step::CreateVm | Step::ConfigureVm
                if state.vmid.is_some() && state.vm_create_task.is_none() =>
            {
                "startVM"
            }
            Step::CreateVm | Step::ConfigureVm => "syncVM",
            Step::StartVm | Step::DiscoverIp => "startVM",
        }
    }

    /// Where to resume. `last_done` is our own record (field 21: the last step completed);
    /// `annotation` is the step annotation, written by us or by the official provider, naming the
    /// Go step last run (to be run again).
    ///
    /// When the annotation agrees with our record (it names the Go step of `last_done` or of the step
    /// after it), our finer record decides. Otherwise the official provider ran last and its
    /// annotation decides: its step is run again in our terms. A Go step before the VM exists maps to
    /// `prepare_image` at the latest, which is cheap and fills our own fields (the full ISO volume ID)
    /// from its bare ones; `syncVM` then finds its VM by the recorded VMID.
    pub fn resume_index(last_done: &str, annotation: Option<&str>, state: &MachineState) -> usize {
        let ours = Self::ALL.iter().position(|s| s.as_str() == last_done);
        let Some(annotation) = annotation else {
            return ours.map_or(0, |i| i + 1);
        };
        if let Some(i) = ours
            && Self::ALL[i..]
                .iter()
                .take(2)
                .any(|s| s.go_name(state) == annotation)
        {
            return i + 1;
        }
        let go = GO_STEPS
            .iter()
            .find(|(name, _)| *name == annotation)
            .map(|(_, ours)| *ours);
        match (go, ours) {
            // The official provider records the node but none of what our `pick_node` decides with
            // it (the boot disk's storage, the copy to clone); before a VM exists `pick_node` runs
            // again, and keeps the node when the rest of the decision fits it.
            (Some(_), _) if state.storage.is_none() && state.recorded_vmid().is_none() => 0,
            (Some(step), _) => step as usize,
            // Our own step names: a state this provider wrote with them is read as it was meant.
            (None, Some(i)) => i + 1,
            (None, None) => 0,
        }
    }
}

/// Every step name the official provider has written into the step annotation, in its order, and
/// the step of ours that runs again when we take a request over from it (the table in the README's
/// migration section). siderolabs/omni-infra-provider-proxmox `internal/pkg/provider/provision.go`,
/// `ProvisionSteps`: `configureHostname` existed from November 2025 to February 2026;
/// `registerHA` and `syncHARules` come after `startVM` from its HA support on.
///
/// A step before the VM exists maps to `prepare_image`, which is cheap and fills our own fields from
/// its bare ones; `syncVM` then finds its VM by the recorded VMID (`create_vm` adopts it). From
/// `startVM` on the VM exists and may run: `start_vm` checks it, starts it only if it is stopped,
/// and joins HA idempotently, which is what `registerHA` and `syncHARules` did.
pub const GO_STEPS: [(&str, Step); 8] = [
    ("pickNode", Step::PickNode),
    ("createSchematic", Step::PrepareImage),
    ("uploadISO", Step::PrepareImage),
    ("configureHostname", Step::PrepareImage),
    ("syncVM", Step::PrepareImage),
    ("startVM", Step::StartVm),
    ("registerHA", Step::StartVm),
    ("syncHARules", Step::StartVm),
];

/// What a step asks the controller to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    Done,
    /// Run this step again after `after`; `why` is shown in Omni meanwhile.
    Requeue {
        after: Duration,
        why: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxmox::types::{Upid, VmId};

    #[test]
    fn resume_points() {
        let st = MachineState::default();
        assert_eq!(Step::resume_index("", None, &st), 0);
        assert_eq!(Step::resume_index("pick_node", None, &st), 1);
        assert_eq!(Step::resume_index("discover_ip", None, &st), 6);
        // The Go provider's annotation names the step to run again.
        assert_eq!(Step::resume_index("", Some("pickNode"), &st), 0);
        // Before its VM exists the official provider has recorded no storage: placement again.
        assert_eq!(Step::resume_index("", Some("uploadISO"), &st), 0);
        assert_eq!(Step::resume_index("", Some("syncVM"), &st), 0);
        let mut vm = MachineState::default();
        vm.vmid = VmId::new(150).ok();
        assert_eq!(Step::resume_index("", Some("syncVM"), &vm), 1);
        assert_eq!(Step::resume_index("", Some("configureHostname"), &vm), 1);
        assert_eq!(Step::resume_index("", Some("startVM"), &vm), 4);
        // The newest official release's steps after the start: the VM exists and may run, so we
        // resume at our start step, not at placement.
        assert_eq!(Step::resume_index("", Some("registerHA"), &vm), 4);
        assert_eq!(Step::resume_index("", Some("syncHARules"), &vm), 4);
        assert_eq!(Step::resume_index("pick_node", Some("syncHARules"), &vm), 4);
        assert_eq!(Step::resume_index("", Some("bogus"), &st), 0);
        // Our record and our annotation agree: our record decides.
        assert_eq!(Step::resume_index("create_vm", Some("syncVM"), &st), 3);
        assert_eq!(Step::resume_index("configure_vm", Some("startVM"), &st), 4);
        // The Go provider ran after us (its annotation is ahead of our record): it decides.
        assert_eq!(Step::resume_index("pick_node", Some("startVM"), &vm), 4);
        // Our old snake_case annotation.
        assert_eq!(Step::resume_index("create_vm", Some("create_vm"), &st), 3);
        assert_eq!(Step::CreateVm.number(), 3);
    }

    #[test]
    fn annotation_names_are_go_step_names() {
        // omni-infra-provider-proxmox internal/pkg/provider/provision.go, ProvisionSteps: the Go
        // provider's steps are pickNode, createSchematic, uploadISO, (configureHostname from Nov 2025
        // to Feb 2026), syncVM, startVM (then registerHA, syncHARules in its newest releases);
        // Omni's client/pkg/infra/controllers/provision.go, reconcileRunning, skips steps until the
        // annotated name, so only names every release knows are written.
        let every_release = [
            "pickNode",
            "createSchematic",
            "uploadISO",
            "syncVM",
            "startVM",
        ];
        let mut iso = MachineState::default();
        iso.schematic = Some("abc".into());
        let mut adopted = iso.clone();
        adopted.vmid = VmId::new(150).ok();
        for st in [MachineState::default(), iso, adopted] {
            for step in Step::ALL {
                assert!(every_release.contains(&step.go_name(&st)), "{step:?}");
            }
        }
        for (name, _) in GO_STEPS {
            assert!(
                every_release.contains(&name)
                    || ["configureHostname", "registerHA", "syncHARules"].contains(&name),
                "{name}"
            );
        }
    }

    #[test]
    fn an_adopted_vm_without_a_create_task_resumes_the_official_provider_at_its_start() {
        // The official provider's syncVM creates a VM whenever no create task is recorded
        // (internal/pkg/provider/provision.go, ProvisionSteps, syncVM: `VmCreateTask != ""` is its
        // only check), so for a VM we adopted it must not be told to run syncVM again.
        let mut st = MachineState::default();
        st.schematic = Some("abc".into());
        st.vmid = VmId::new(150).ok();
        assert_eq!(Step::CreateVm.go_name(&st), "startVM");
        assert_eq!(Step::ConfigureVm.go_name(&st), "startVM");
        assert_eq!(Step::resume_index("create_vm", Some("startVM"), &st), 3);
        st.vm_create_task =
            Upid::parse("UPID:pve1:0000AAAA:00000001:65000000:qmcreate:150:root@pam:").ok();
        assert_eq!(Step::CreateVm.go_name(&st), "syncVM");
        st.vm_create_task = None;
        st.vmid = None;
        st.reserved_vmid = VmId::new(150).ok();
        assert_eq!(
            Step::CreateVm.go_name(&st),
            "syncVM",
            "no VM yet: syncVM makes it"
        );
    }
}

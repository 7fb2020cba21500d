//! What Omni holds of the outputs a teardown hands it, as the watch of our outputs shows it.
//!
//! A teardown removes the request's config patch requests and its status, and Omni keeps each with a
//! finalizer until it is done with it: its config-patch controller until the patch is gone, its
//! cleanup controller until the machine has left its cluster, seconds to minutes (siderolabs/omni
//! `infra_provider_config_patch.go`, `machine_request_cleanup.go`). The watch already delivers every
//! change of these resources, so the teardown reads them here instead of listing and tearing down
//! again at each wake-up: a thousand machines draining at once then cost Omni nothing while they wait.
//!
//! What the watch showed is trusted for [`WAIT_FOR_OMNI`] at most: after that, a
//! teardown asks Omni, so a lost event delays it and never stops it.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::omni::resources::{PHASE_TEARING_DOWN, label};
use crate::omni::state::WatchEvent;
use crate::pipeline::ledgers::entry;

/// How long to wait before looking again on our own while Omni still holds a finalizer on
/// something we tore down. The wait normally ends earlier, when the watch of our outputs sees the
/// finalizer go (the watch in [`super::runner`]); this only bounds a lost event. A
/// drain of a thousand machines so costs Omni no call per machine while it lasts.
pub const WAIT_FOR_OMNI: Duration = Duration::from_secs(60);

/// How long removing a config patch request waits, in the one TeardownAndDestroy call, for Omni's
/// ConfigPatchRequestController to let go. It lets go as soon as it has seen the teardown (it
/// holds the request only to remove the patch it made of it: cosi-project/runtime
/// `pkg/controller/generic/qtransform` reconcileTearingDown), so the call normally ends in
/// milliseconds; a busy Omni is left to the watch instead of holding a worker.
pub const PATCH_RELEASE_WAIT: Duration = Duration::from_secs(5);

/// Where an output stands in its teardown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Not torn down.
    Live,
    /// Torn down; a finalizer of Omni's still holds it.
    Held,
    /// Torn down and held by nothing: it can be destroyed.
    Released,
}

/// Which output a watch event is about, and so how it names its machine request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputOf {
    /// The status has the request's ID.
    Status,
    /// A patch request names it in its `omni.sidero.dev/machine-request` label.
    PatchRequest,
}

/// Where an output stands, and when the watch said so.
type Seen = (Hold, Instant);

#[derive(Default)]
struct Known {
    /// The patch watch has listed every patch request: one missing here does not exist.
    patches_listed: bool,
    /// (what, its ID) → (its machine request, where it stands).
    outputs: HashMap<(OutputOf, String), (String, Seen)>,
    /// Outputs this process destroyed whose Destroyed event has not come yet: a late event of
    /// their release must not bring them back as released (a teardown would destroy them again).
    destroyed: HashSet<(OutputOf, String)>,
}

/// The outputs of every request, as the watch of our outputs shows them.
pub struct Outputs {
    known: Mutex<Known>,
    trusted_for: Duration,
}

impl Outputs {
    /// What the watch showed is believed for `trusted_for`; after that a teardown asks Omni.
    pub fn new(trusted_for: Duration) -> Self {
        Self {
            known: Mutex::default(),
            trusted_for,
        }
    }

    /// Takes in one event of the watch of `of`; returns the machine request whose teardown may go
    /// on because an output of it has just been released.
    pub fn observe(&self, of: OutputOf, event: &WatchEvent) -> Option<String> {
        let mut known = entry(&self.known);
        match event {
            WatchEvent::Created(r) | WatchEvent::Updated(r) => {
                let md = r.metadata.as_ref()?;
                let hold = match (md.phase == PHASE_TEARING_DOWN, md.finalizers.is_empty()) {
                    (false, _) => Hold::Live,
                    (true, false) => Hold::Held,
                    (true, true) => Hold::Released,
                };
                if known.destroyed.contains(&(of, md.id.clone())) {
                    return None;
                }
                let request = match of {
                    OutputOf::Status => md.id.clone(),
                    OutputOf::PatchRequest => md.labels.get(label::MACHINE_REQUEST)?.clone(),
                };
                let seen = (request.clone(), (hold, Instant::now()));
                let before = known.outputs.insert((of, md.id.clone()), seen);
                // Only the change to released lets a teardown go on: our own writes to a released
                // status (the deprovision's progress) must not wake its teardown again.
                let was_released = before.is_some_and(|(_, (hold, _))| hold == Hold::Released);
                (hold == Hold::Released && !was_released).then_some(request)
            }
            WatchEvent::Destroyed(r) => {
                let key = (of, r.metadata.as_ref()?.id.clone());
                known.outputs.remove(&key);
                known.destroyed.remove(&key);
                None
            }
            WatchEvent::Bootstrapped => {
                known.patches_listed |= of == OutputOf::PatchRequest;
                None
            }
            // A fresh listing follows; until it is complete, nothing missing can be trusted.
            WatchEvent::Resync => {
                known.outputs.retain(|(what, _), _| *what != of);
                known.destroyed.retain(|(what, _)| *what != of);
                known.patches_listed &= of != OutputOf::PatchRequest;
                None
            }
        }
    }

    /// The patch requests of `request` with where each stands, once the watch has listed them all;
    /// `None` before (the teardown lists them itself). A patch whose news is older than we trust
    /// counts as [`Hold::Live`]: tearing it down again tells where it stands.
    pub fn patches_of(&self, request: &str) -> Option<Vec<(String, Hold)>> {
        let known = entry(&self.known);
        known.patches_listed.then(|| {
            known
                .outputs
                .iter()
                .filter(|((what, _), (of, _))| *what == OutputOf::PatchRequest && of == request)
                .map(|((_, id), (_, seen))| (id.clone(), self.trusted(*seen).unwrap_or(Hold::Live)))
                .collect()
        })
    }

    /// Where the status of `request` stands, if the watch said so recently enough.
    pub fn status(&self, request: &str) -> Option<Hold> {
        let key = (OutputOf::Status, request.to_owned());
        (entry(&self.known).outputs.get(&key)).and_then(|&(_, seen)| self.trusted(seen))
    }

    /// A patch request this process just wrote: a teardown that starts before the watch delivers
    /// it still removes it.
    pub fn patch_written(&self, request: &str, patch: &str) {
        entry(&self.known)
            .outputs
            .entry((OutputOf::PatchRequest, patch.to_owned()))
            .or_insert_with(|| (request.to_owned(), (Hold::Live, Instant::now())));
    }

    /// An output this process tore down and found held: a teardown that runs again before the
    /// watch delivers the teardown waits for the release instead of tearing down again. A release
    /// the watch has already delivered stands. A patch request not seen is left to the listing.
    pub fn held(&self, of: OutputOf, id: &str) {
        let held = (Hold::Held, Instant::now());
        let mut known = entry(&self.known);
        let key = (of, id.to_owned());
        let seen = match of {
            OutputOf::Status => {
                Some(&mut known.outputs.entry(key).or_insert((id.to_owned(), held)).1)
            }
            OutputOf::PatchRequest => known.outputs.get_mut(&key).map(|(_, seen)| seen),
        };
        if let Some(seen) = seen.filter(|(hold, _)| *hold == Hold::Live) {
            *seen = held;
        }
    }

    /// An output this process destroyed: gone before its Destroyed event arrives.
    pub fn destroyed(&self, of: OutputOf, id: &str) {
        let mut known = entry(&self.known);
        let key = (of, id.to_owned());
        // Only an output the watch still shows has a Destroyed event to come, which ends the
        // entry: one already delivered would leave it for ever.
        if known.outputs.remove(&key).is_some() {
            known.destroyed.insert(key);
        }
    }

    fn trusted(&self, (hold, at): Seen) -> Option<Hold> {
        (at.elapsed() < self.trusted_for).then_some(hold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::omni::proto::cosi::resource as pb;

    fn output(id: &str, phase: &str, finalizers: &[&str], request: Option<&str>) -> pb::Resource {
        pb::Resource {
            metadata: Some(pb::Metadata {
                id: id.into(),
                phase: phase.into(),
                finalizers: finalizers.iter().map(|f| f.to_string()).collect(),
                labels: request
                    .map(|r| (label::MACHINE_REQUEST.to_owned(), r.to_owned()))
                    .into_iter()
                    .collect(),
                ..Default::default()
            }),
            spec: None,
        }
    }

    #[test]
    fn an_output_is_released_when_it_is_tearing_down_without_finalizers() {
        let outputs = Outputs::new(Duration::from_secs(60));
        let status = OutputOf::Status;
        let patch = OutputOf::PatchRequest;
        let held = output("r1", PHASE_TEARING_DOWN, &["Cleanup"], None);
        assert_eq!(outputs.observe(status, &WatchEvent::Updated(held)), None);
        assert_eq!(outputs.status("r1"), Some(Hold::Held));
        let free = output("r1", PHASE_TEARING_DOWN, &[], None);
        assert_eq!(
            outputs
                .observe(status, &WatchEvent::Updated(free.clone()))
                .as_deref(),
            Some("r1")
        );
        assert_eq!(outputs.status("r1"), Some(Hold::Released));
        assert_eq!(outputs.observe(status, &WatchEvent::Destroyed(free)), None);
        assert_eq!(outputs.status("r1"), None);
        let free_patch = output("p1", PHASE_TEARING_DOWN, &[], Some("r1"));
        assert_eq!(
            outputs
                .observe(patch, &WatchEvent::Created(free_patch))
                .as_deref(),
            Some("r1")
        );
        let running = output("p2", "running", &[], Some("r2"));
        assert_eq!(outputs.observe(patch, &WatchEvent::Updated(running)), None);
        let unlabelled = output("p3", PHASE_TEARING_DOWN, &[], None);
        assert_eq!(
            outputs.observe(patch, &WatchEvent::Updated(unlabelled)),
            None
        );
    }

    #[test]
    fn a_released_output_wakes_its_teardown_once_not_at_each_later_write() {
        let outputs = Outputs::new(Duration::from_secs(60));
        let free = output("r1", PHASE_TEARING_DOWN, &[], None);
        let event = WatchEvent::Updated(free);
        assert_eq!(
            outputs.observe(OutputOf::Status, &event).as_deref(),
            Some("r1")
        );
        // The deprovision's progress written to the released status comes back as an update: the
        // teardown it belongs to is running already and must not be queued again.
        assert_eq!(outputs.observe(OutputOf::Status, &event), None);
        assert_eq!(outputs.status("r1"), Some(Hold::Released));
        // After a resync the listing is news again.
        outputs.observe(OutputOf::Status, &WatchEvent::Resync);
        assert_eq!(
            outputs.observe(OutputOf::Status, &event).as_deref(),
            Some("r1")
        );
    }

    #[test]
    fn an_output_we_destroyed_is_not_brought_back_by_a_late_event_of_its_release() {
        let outputs = Outputs::new(Duration::from_secs(60));
        let patch = OutputOf::PatchRequest;
        outputs.observe(patch, &WatchEvent::Bootstrapped);
        let held = output(
            "p1",
            PHASE_TEARING_DOWN,
            &["ConfigPatchRequestController"],
            Some("r1"),
        );
        outputs.observe(patch, &WatchEvent::Updated(held));
        // TeardownAndDestroy answered before the watch delivered the release and the destroy.
        outputs.destroyed(patch, "p1");
        let released = output("p1", PHASE_TEARING_DOWN, &[], Some("r1"));
        let late = WatchEvent::Updated(released.clone());
        assert_eq!(outputs.observe(patch, &late), None, "no teardown is woken");
        assert_eq!(
            outputs.patches_of("r1"),
            Some(vec![]),
            "nothing left to destroy"
        );
        // Once its Destroyed event has come, the same ID is news again.
        outputs.observe(patch, &WatchEvent::Destroyed(released.clone()));
        let again = WatchEvent::Created(released.clone());
        assert_eq!(outputs.observe(patch, &again).as_deref(), Some("r1"));
        // An answer that comes after the Destroyed event leaves nothing behind to wait for.
        outputs.observe(patch, &WatchEvent::Destroyed(released.clone()));
        outputs.destroyed(patch, "p1");
        assert_eq!(outputs.observe(patch, &again).as_deref(), Some("r1"));
    }

    #[test]
    fn patches_are_known_only_once_listed_and_news_is_trusted_for_a_while() {
        let outputs = Outputs::new(Duration::from_millis(50));
        let patch = OutputOf::PatchRequest;
        let held = output("p1", PHASE_TEARING_DOWN, &["ConfigPatch"], Some("r1"));
        outputs.observe(patch, &WatchEvent::Updated(held));
        assert_eq!(outputs.patches_of("r1"), None, "not listed yet");
        outputs.observe(patch, &WatchEvent::Bootstrapped);
        assert_eq!(
            outputs.patches_of("r1"),
            Some(vec![("p1".to_owned(), Hold::Held)])
        );
        assert_eq!(outputs.patches_of("r2"), Some(vec![]));
        outputs.patch_written("r2", "p2");
        assert_eq!(
            outputs.patches_of("r2"),
            Some(vec![("p2".to_owned(), Hold::Live)])
        );
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(
            outputs.patches_of("r1"),
            Some(vec![("p1".to_owned(), Hold::Live)]),
            "old news: ask Omni again"
        );
        outputs.observe(patch, &WatchEvent::Resync);
        assert_eq!(outputs.patches_of("r1"), None, "relisting");
    }

    #[test]
    fn an_output_found_held_waits_for_its_release_unless_the_release_came_first() {
        let outputs = Outputs::new(Duration::from_secs(60));
        let (status, patch) = (OutputOf::Status, OutputOf::PatchRequest);
        outputs.observe(
            status,
            &WatchEvent::Updated(output("r1", "running", &[], None)),
        );
        outputs.held(status, "r1");
        assert_eq!(outputs.status("r1"), Some(Hold::Held));
        outputs.held(status, "r2");
        assert_eq!(outputs.status("r2"), Some(Hold::Held), "not seen yet");
        let free = output("r3", PHASE_TEARING_DOWN, &[], None);
        outputs.observe(status, &WatchEvent::Updated(free));
        outputs.held(status, "r3");
        assert_eq!(outputs.status("r3"), Some(Hold::Released));
        outputs.observe(patch, &WatchEvent::Bootstrapped);
        outputs.patch_written("r1", "p1");
        outputs.held(patch, "p1");
        outputs.held(patch, "p2");
        assert_eq!(
            outputs.patches_of("r1"),
            Some(vec![("p1".to_owned(), Hold::Held)])
        );
    }
}

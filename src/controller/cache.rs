//! Remembers the resources this process wrote last, so updating them costs one call, not two.
//!
//! Every status line and every recorded decision is an Omni write. A plain modify reads the resource
//! first to learn its version; but we wrote it ourselves a moment ago and know that version. The
//! cache tries the update with the remembered copy and falls back to read-modify-write when someone
//! else wrote in between (a version conflict, e.g. Omni adding its finalizer) or the copy is gone.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::omni::resources::Kind;
use crate::omni::state::{StateClient, StateError, Typed};
use crate::pipeline::ledgers::entry;

pub struct WriteCache<K: Kind> {
    kind: K,
    last: Mutex<HashMap<String, Typed<K::Spec>>>,
    /// Omni's controllers put a finalizer on every resource of this kind right after its creation
    /// (MachineRequestStatus: siderolabs/omni `machine_request_cleanup.go`), so the created
    /// version is outdated at once: it is not remembered, since an update with it would only be
    /// refused; the next write reads the resource first, unless the watch delivered the newer
    /// version meanwhile ([`Self::observe`]).
    omni_adds_finalizers: bool,
}

impl<K: Kind> WriteCache<K> {
    /// `omni_adds_finalizers`: see the field.
    pub fn new(kind: K, omni_adds_finalizers: bool) -> Self {
        Self {
            kind,
            last: Mutex::new(HashMap::new()),
            omni_adds_finalizers,
        }
    }

    /// The copy of `id` this process wrote last, if it remembers one.
    pub fn last_written(&self, id: &str) -> Option<Typed<K::Spec>> {
        entry(&self.last).get(id).cloned()
    }

    fn remember(&self, id: &str, resource: &Typed<K::Spec>) {
        entry(&self.last).insert(id.to_owned(), resource.clone());
    }

    /// A newer version of a resource this process wrote, as a watch delivered it (Omni's
    /// controllers add their finalizers right after our create): remembered instead, so the next
    /// update carries the version Omni holds and costs one call, not a refused update and a read.
    pub fn observe(&self, resource: Typed<K::Spec>) {
        let mut last = entry(&self.last);
        let version = |r: &Typed<K::Spec>| r.metadata.version.parse::<u64>().unwrap_or(0);
        if let Some(known) = last.get_mut(resource.id())
            && version(&resource) > version(known)
        {
            *known = resource;
        }
    }

    pub fn forget(&self, id: &str) {
        entry(&self.last).remove(id);
    }

    /// Like [`StateClient::modify`] (creates when missing, skips unchanged writes), starting from the
    /// copy this process wrote last. `mutate` may run twice, so it must only set values.
    pub async fn modify(
        &self,
        state: &StateClient,
        id: &str,
        owner: &str,
        mut mutate: impl FnMut(&mut Typed<K::Spec>),
    ) -> Result<Typed<K::Spec>, StateError> {
        if let Some(current) = self.last_written(id) {
            let mut next = current.clone();
            mutate(&mut next);
            if next == current {
                return Ok(current);
            }
            match state.update(&self.kind, &next, owner, None).await {
                Ok(stored) => {
                    self.remember(id, &stored);
                    return Ok(stored);
                }
                Err(e) if e.is_conflict() || e.is_not_found() => self.forget(id),
                Err(e) => return Err(e),
            }
        }
        let stored = state.modify(&self.kind, id, owner, mutate).await?;
        let created = stored.metadata.version == "1";
        if !(created && self.omni_adds_finalizers) {
            self.remember(id, &stored);
        }
        Ok(stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::omni::proto::specs::MachineRequestStatusSpec;
    use crate::omni::resources::MachineRequestStatus;

    fn status(
        version: &str,
        text: &str,
    ) -> Typed<crate::omni::proto::specs::MachineRequestStatusSpec> {
        let mut s = Typed {
            metadata: Default::default(),
            spec: MachineRequestStatusSpec::default(),
            unknown_fields: Vec::new(),
            received_spec: None,
        };
        s.metadata.id = "r1".into();
        s.metadata.version = version.into();
        s.spec.status = text.into();
        s
    }

    #[test]
    fn a_newer_version_from_the_watch_replaces_what_we_wrote_and_an_older_one_does_not() {
        let cache = WriteCache::new(MachineRequestStatus, true);
        cache.observe(status("9", "never written by us"));
        assert!(
            cache.last_written("r1").is_none(),
            "only what we wrote is kept"
        );
        cache.remember("r1", &status("3", "ours"));
        cache.observe(status("2", "older echo"));
        assert_eq!(cache.last_written("r1").unwrap().spec.status, "ours");
        cache.observe(status("4", "with Omni's finalizer"));
        assert_eq!(cache.last_written("r1").unwrap().metadata.version, "4");
    }
}

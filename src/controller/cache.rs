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

pub struct WriteCache<K: Kind> {
    kind: K,
    last: Mutex<HashMap<String, Typed<K::Spec>>>,
}

impl<K: Kind> WriteCache<K> {
    pub fn new(kind: K) -> Self {
        Self {
            kind,
            last: Mutex::new(HashMap::new()),
        }
    }

    fn remembered(&self, id: &str) -> Option<Typed<K::Spec>> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    fn remember(&self, id: &str, resource: &Typed<K::Spec>) {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_owned(), resource.clone());
    }

    pub fn forget(&self, id: &str) {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
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
        if let Some(current) = self.remembered(id) {
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
        self.remember(id, &stored);
        Ok(stored)
    }
}

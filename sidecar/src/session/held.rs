//! The sessions a pod holds, by client session id, with how many each principal holds: every
//! change of the map goes through [`Held::insert`] and [`Held::remove`], so the count of a
//! principal (`--max-principal-sessions`) is always that of its sessions in the map. Reads see
//! the map itself.

use std::collections::HashMap;

use crate::counts::Counts;
use std::ops::Deref;
use std::sync::Arc;

use super::Session;
use crate::mcp::principal::Principal;

/// The held sessions and their principals' counts.
#[derive(Debug, Default)]
pub(super) struct Held {
    by_id: HashMap<String, Arc<Session>>,
    /// The principal each held session was counted under, by id (sessions bound to none have
    /// no entry).
    principal_of: HashMap<String, Principal>,
    /// Held sessions per principal.
    by_principal: Counts<Principal>,
}

impl Held {
    /// Holds `session` (replacing a copy of the same id, whose count goes).
    pub(super) fn insert(&mut self, session: Arc<Session>) {
        let id = session.id.clone();
        self.remove(&id);
        if let Some(principal) = session.binding().and_then(|b| b.principal) {
            self.by_principal.add(principal, 1);
            self.principal_of.insert(id.clone(), principal);
        }
        self.by_id.insert(id, session);
    }

    /// Lets the session with client id `id` go; it, if it was held.
    pub(super) fn remove(&mut self, id: &str) -> Option<Arc<Session>> {
        if let Some(principal) = self.principal_of.remove(id) {
            self.by_principal.sub(&principal, 1);
        }
        self.by_id.remove(id)
    }

    /// Sessions held for `principal`.
    pub(super) fn of_principal(&self, principal: &Principal) -> usize {
        self.by_principal.get(principal)
    }

    /// Principals with a held session (for tests).
    #[cfg(test)]
    pub(super) fn principals(&self) -> usize {
        self.by_principal.len()
    }
}

impl Deref for Held {
    type Target = HashMap<String, Arc<Session>>;

    fn deref(&self) -> &Self::Target {
        &self.by_id
    }
}

//! What a session's replica must carry, as a mark that changes with it
//! (`docs/design/replication.md#keeping-a-replica-current`): the holder sends a replica again
//! only when its mark changed, never for each event of a running request (without
//! `replication: Events`).

use std::hash::{DefaultHasher, Hash, Hasher};

use super::{Session, Standalone};

impl Session {
    /// A digest of what a replica of the session carries: its epoch, journal, binding and the
    /// credentials the MCP server accepted, the standalone stream's refusal, and its ledger
    /// (streams and retry records); with `events`, each stream's numbering too.
    pub(crate) fn replica_mark(&self, events: bool) -> u64 {
        let mut h = DefaultHasher::new();
        {
            let st = self.state.lock();
            st.holding.epoch().hash(&mut h);
            st.journal.hash(&mut h);
            matches!(st.standalone, Standalone::Unsupported(_)).hash(&mut h);
            st.ledger.mark(&mut h, events);
        }
        self.binding().map(|b| b.principal).hash(&mut h);
        self.is_credentialed().hash(&mut h);
        for (credential, _) in self.credentials.accepted_ages() {
            credential.hash(&mut h);
        }
        h.finish()
    }
}

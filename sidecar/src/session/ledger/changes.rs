//! What changed in a ledger since its session's replica was last computed
//! (`docs/design/replication.md#keeping-a-replica-current`): the keys of the streams and the
//! ids of the retry records registered, settled or forgotten since. The holder's replicator
//! then sends the change since the copy its replica pod acknowledged by looking at these and at
//! the live streams alone, not at every stream and record the retry window keeps.
//!
//! ```text
//!              a replica computed (whole, or by a full scan)
//!   Unfollowed ─────────────────────────────────────────────▶ Listed  ◀──┐ a change computed
//!        ▲                                                     │  │      │ from the list
//!        │ the replicator stops following the session          │  └──────┘
//!        └─────────────────────────────────────────────────────┤
//!                                                              │ more than MAX_CHANGES listed
//!                                                              ▼
//!                                           Overflowed: the next change is a full scan,
//!                                           and listing starts again
//! ```
//!
//! Every change also moves the revision, which a replica's mark carries: a session whose
//! ledger changed is sent again, whatever changed.

use crate::mcp::cursor::StreamKey;
use crate::mcp::jsonrpc::RequestKey;
use crate::retained::Charge;

/// Most keys listed between two replicas of one session; beyond, the list is dropped and the
/// next replica is computed by a scan of the whole ledger. A busy session lists about two
/// streams and two records per request (the new one, and the one its window forgets) in a
/// replication interval.
pub(super) const MAX_CHANGES: usize = 1024;
/// Bytes one listed key takes besides its text (its slot and length).
const CHANGE_BYTES: u64 = 32;

/// The state of the list (module docs).
#[derive(Debug)]
enum List {
    /// No replica of the session was computed yet, or nobody follows it any more: nothing is
    /// listed.
    Unfollowed,
    /// The keys changed since the last replica, in the order they changed (a key may repeat).
    Listed {
        streams: Vec<StreamKey>,
        requests: Vec<RequestKey>,
    },
    /// More changed than [`MAX_CHANGES`]: nothing is listed until the next replica.
    Overflowed,
}

/// The keys changed since a given replica, each once; streams in the order they first changed
/// (the order they were registered), records in the order they last changed (a reused id is
/// the newest).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Changed {
    pub(super) streams: Vec<StreamKey>,
    pub(super) requests: Vec<RequestKey>,
}

/// A ledger's changes since its last replica.
#[derive(Debug)]
pub(super) struct Changes {
    listing: List,
    /// Moves with every change.
    revision: u64,
    /// The listed keys' bytes, in `tether_retained_bytes{kind="replicas"}`.
    charge: Charge,
}

impl Changes {
    pub(super) fn new(charge: Charge) -> Self {
        Self {
            listing: List::Unfollowed,
            revision: 0,
            charge,
        }
    }

    /// Moves with every change of the ledger.
    pub(super) fn revision(&self) -> u64 {
        self.revision
    }

    /// Stream `key` was registered, settled or forgotten.
    pub(super) fn stream(&mut self, key: &StreamKey) {
        self.revision = self.revision.wrapping_add(1);
        if let List::Listed { streams, .. } = &mut self.listing {
            streams.push(key.clone());
            self.count(CHANGE_BYTES + std::mem::size_of::<StreamKey>() as u64);
        }
    }

    /// The retry record of request `id` was added, replaced or forgotten.
    pub(super) fn request(&mut self, id: &RequestKey) {
        self.revision = self.revision.wrapping_add(1);
        if let List::Listed { requests, .. } = &mut self.listing {
            requests.push(id.clone());
            self.count(CHANGE_BYTES + id.as_json().len() as u64);
        }
    }

    /// What changed since the last replica, and a new list from now on; `None` when it is not
    /// known (nothing was listed, or too much): the replica is computed from the whole ledger.
    pub(super) fn take(&mut self) -> Option<Changed> {
        let before = std::mem::replace(
            &mut self.listing,
            List::Listed {
                streams: Vec::new(),
                requests: Vec::new(),
            },
        );
        self.charge.resize(0);
        let List::Listed { streams, requests } = before else {
            return None;
        };
        let mut seen = std::collections::HashSet::with_capacity(streams.len());
        let streams = streams
            .into_iter()
            .filter(|key| seen.insert(key.clone()))
            .collect();
        let mut seen = std::collections::HashSet::with_capacity(requests.len());
        let mut requests: Vec<RequestKey> = requests
            .into_iter()
            .rev()
            .filter(|id| seen.insert(id.clone()))
            .collect();
        requests.reverse();
        Some(Changed { streams, requests })
    }

    /// Nobody follows the session's replica any more: nothing is listed.
    pub(super) fn unfollow(&mut self) {
        self.listing = List::Unfollowed;
        self.charge.resize(0);
    }

    /// Counts `bytes` more listed, or drops the list beyond [`MAX_CHANGES`].
    fn count(&mut self, bytes: u64) {
        let List::Listed { streams, requests } = &self.listing else {
            return;
        };
        if streams.len() + requests.len() > MAX_CHANGES {
            self.listing = List::Overflowed;
            self.charge.resize(0);
        } else {
            self.charge.resize(self.charge.bytes() + bytes);
        }
    }
}

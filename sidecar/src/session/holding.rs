//! Where a session is in a handoff: the `Holding` state machine
//! (`docs/design/handoff.md#moving-one-session`, `docs/design/handoff.md#one-holder-per-session`).
//!
//! ```text
//!              begin (a Transfer)           Transfer::moved(to)
//!   ┌──────┐ ─────────────────────▶ ┌────────┐ ────────────────────▶ ┌───────────┐
//!   │ Held │                        │ Moving │                       │ Moved(to) │
//!   └──────┘ ◀───────────────────── └────────┘                       └───────────┘
//!      ▲       the Transfer dropped                                        │
//!      └──────────────────────────── reclaim (the new holder left) ────────┘
//! ```
//!
//! - Requests enter only a held session, and count as *entering* until they registered their
//!   stream ([`Holding::enter`], [`Holding::entered`]): a move images the session only once none
//!   is left, so no image is taken halfway through a request.
//! - Only one mover at a time: [`Holding::begin`] succeeds once, and its [`super::Transfer`]
//!   is the one handle that ends the move — acknowledged (`Moved`) or, when it is dropped
//!   unfinished, served here again (`Held`). No path of the mover can leave a session `Moving`.
//! - The **epoch** counts the pushes of the session to peers: 0 at `initialize`, one more for
//!   every push ([`Holding::advance_epoch`]), carried in its images; a copy of an older epoch
//!   is stale.
//!
//! The state lives under the session's lock; [`super::Session`] wakes its waiters on each
//! transition.

/// Where a session is in a handoff.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HandoffState {
    /// Served here.
    Held,
    /// Being pushed to a peer: new requests wait until the peer acknowledged or refused.
    Moving,
    /// The peer with this UID acknowledged it: requests go there.
    Moved(String),
}

/// The handoff state of one session, its requests entering, and its epoch.
#[derive(Debug)]
pub(super) struct Holding {
    state: HandoffState,
    /// Requests admitted and not registered yet.
    entering: u32,
    epoch: u64,
}

impl Holding {
    /// A session held here, at `epoch` (0 for a new session; an adopted one's image's).
    pub(super) fn at(epoch: u64) -> Self {
        Self {
            state: HandoffState::Held,
            entering: 0,
            epoch,
        }
    }

    /// Where the session is.
    pub(super) fn state(&self) -> &HandoffState {
        &self.state
    }

    /// Whether it is served here.
    pub(super) fn is_held(&self) -> bool {
        self.state == HandoffState::Held
    }

    /// Admits a request (`Ok`: counted as entering), or says where the session is.
    pub(super) fn enter(&mut self) -> Result<(), HandoffState> {
        if self.state != HandoffState::Held {
            return Err(self.state.clone());
        }
        self.entering += 1;
        Ok(())
    }

    /// A request registered its stream (or gave up); whether none is entering any more.
    pub(super) fn entered(&mut self) -> bool {
        self.entering = self.entering.saturating_sub(1);
        self.entering == 0
    }

    /// Requests admitted and not registered yet.
    pub(super) fn entering(&self) -> u32 {
        self.entering
    }

    /// Starts a move: `Held` → `Moving`; `false` when one is under way or done.
    pub(super) fn begin(&mut self) -> bool {
        if self.state != HandoffState::Held {
            return false;
        }
        self.state = HandoffState::Moving;
        true
    }

    /// Ends a move: acknowledged by `to` (`Moved`), or refused everywhere (`None`: `Held`).
    pub(super) fn finish(&mut self, to: Option<String>) {
        self.state = match to {
            Some(uid) => HandoffState::Moved(uid),
            None => HandoffState::Held,
        };
    }

    /// Takes back a session whose new holder left: `Moved` → `Held`.
    pub(super) fn reclaim(&mut self) {
        if matches!(self.state, HandoffState::Moved(_)) {
            self.state = HandoffState::Held;
        }
    }

    /// The handoff epoch.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The epoch of a new push of the session: one more than any before, so a copy an earlier
    /// push may have left at a peer is stale against it.
    pub(super) fn advance_epoch(&mut self) -> u64 {
        self.epoch += 1;
        self.epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_is_begun_once_and_ends_moved_or_held() {
        let mut h = Holding::at(0);
        assert!(h.enter().is_ok());
        assert_eq!(h.entering(), 1);
        assert!(h.begin(), "Held → Moving");
        assert!(!h.begin(), "one mover at a time");
        assert_eq!(h.enter(), Err(HandoffState::Moving), "requests wait");
        assert!(
            h.entered(),
            "the request admitted before the move registered"
        );
        h.finish(None);
        assert!(h.is_held(), "refused everywhere: served here again");
        assert!(h.begin());
        h.finish(Some("pod-b".into()));
        assert_eq!(h.state(), &HandoffState::Moved("pod-b".into()));
        assert_eq!(h.enter(), Err(HandoffState::Moved("pod-b".into())));
        assert!(!h.begin(), "a moved session is not moved again from here");
        h.reclaim();
        assert!(h.is_held(), "the new holder left: taken back");
    }

    #[test]
    fn reclaim_takes_back_only_a_moved_session() {
        let mut h = Holding::at(0);
        assert!(h.begin());
        h.reclaim();
        assert_eq!(
            h.state(),
            &HandoffState::Moving,
            "a move under way is its mover's"
        );
    }

    #[test]
    fn every_push_gets_a_later_epoch() {
        let mut h = Holding::at(3);
        assert_eq!(h.epoch(), 3, "an adopted session keeps its image's epoch");
        assert_eq!(h.advance_epoch(), 4);
        assert_eq!(h.advance_epoch(), 5);
        assert_eq!(h.epoch(), 5);
    }

    #[test]
    fn entering_counts_down_to_none() {
        let mut h = Holding::at(0);
        assert!(h.enter().is_ok());
        assert!(h.enter().is_ok());
        assert!(!h.entered());
        assert!(h.entered());
        assert!(h.entered(), "never below zero");
        assert_eq!(h.entering(), 0);
    }
}

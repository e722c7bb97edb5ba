//! A session's change feed: any number of subscribers follow what changes in the session
//! (the handoff follower of a moved session is one, `docs/design/handoff.md#moving-one-session`).
//!
//! ```text
//!   a change ── Feed::tell ──▶ version n+1 ──▶ every Subscription: changed() returns
//!                                              (once for any number of changes since it last
//!                                               looked: it reads the session again)
//! ```
//!
//! The feed carries no data: a subscriber reads what it needs from the session once told. It
//! is told of
//! - every change of every stream of the session (answers, completion; streams tell it
//!   themselves, [`crate::stream::Stream::feed_into`]) and, to subscribers that follow events
//!   (the handoff follower; the replicator with `replication: Events`), every event,
//! - a stream registered (a new request, streams imported from a peer), the standalone stream
//!   set or cleared,
//! - the journal changed,
//! - the last request entering the session registered its stream, and the handoff state
//!   changed (a move ended, the session was taken back).
//!
//! What the retry window and the TTL forget (spent streams, records, tombstones) is not told.
//!
//! A change made before [`Subscription::look`] returns is seen by what the subscriber reads
//! after it; one made after it makes the next [`Subscription::changed`] return: none is lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::watch;

use crate::stream::Teller;

/// The sending end, kept by the session; its streams tell through a clone of its [`Teller`].
#[derive(Debug)]
pub(super) struct Feed(Teller);

impl Feed {
    /// A feed nobody follows yet.
    pub(super) fn new() -> Self {
        Self(Teller::new())
    }

    /// Tells every subscriber something changed.
    pub(super) fn tell(&self) {
        self.0.tell();
    }

    /// What a stream of the session tells of its changes.
    pub(super) fn teller(&self) -> &Teller {
        &self.0
    }

    /// A new subscriber: its first [`Subscription::changed`] returns at the first change from
    /// now on; with `events`, an event that changes nothing else is one too.
    pub(super) fn subscribe(&self, events: bool) -> Subscription {
        let (changes, events) = self.0.follow(events);
        Subscription { changes, events }
    }
}

/// One follower of a session's changes.
#[derive(Debug)]
pub(crate) struct Subscription {
    changes: watch::Receiver<()>,
    /// The feed's count of event followers, when this one is one.
    events: Option<Arc<AtomicUsize>>,
}

impl Subscription {
    /// Marks every change so far as seen: call it before reading the session.
    pub(crate) fn look(&mut self) {
        self.changes.mark_unchanged();
    }

    /// Whether something changed since the last [`Subscription::look`], without waiting.
    pub(crate) fn has_changed(&self) -> bool {
        self.changes.has_changed().unwrap_or(false)
    }

    /// Waits for a change since the last [`Subscription::look`] (returns at once if one came
    /// meanwhile). Never returns once the session is gone: nothing changes any more.
    pub(crate) async fn changed(&mut self) {
        if self.changes.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(followers) = &self.events {
            followers.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const SOON: Duration = Duration::from_millis(20);

    async fn told(s: &mut Subscription) -> bool {
        tokio::time::timeout(SOON, s.changed()).await.is_ok()
    }

    #[tokio::test]
    async fn every_subscriber_is_told_of_a_change() {
        let feed = Feed::new();
        let (mut a, mut b) = (feed.subscribe(true), feed.subscribe(true));
        assert!(!told(&mut a).await, "nothing changed yet");
        feed.tell();
        assert!(told(&mut a).await);
        assert!(told(&mut b).await, "not only one of them");
        assert!(!told(&mut a).await, "told once per change");
    }

    #[tokio::test]
    async fn changes_while_a_subscriber_reads_are_not_lost() {
        let feed = Feed::new();
        let mut s = feed.subscribe(true);
        feed.tell();
        s.look();
        assert!(!told(&mut s).await, "seen before reading");
        feed.tell();
        feed.tell();
        assert!(told(&mut s).await, "changed after its look");
        assert!(
            !told(&mut s).await,
            "many changes, one wake: it reads them all"
        );
    }

    #[tokio::test]
    async fn a_stream_of_the_session_tells_through_the_sender() {
        let feed = Feed::new();
        let mut s = feed.subscribe(true);
        feed.teller().clone().tell();
        assert!(told(&mut s).await);
    }

    #[tokio::test]
    async fn an_event_alone_is_told_only_to_subscribers_that_follow_events() {
        let feed = Feed::new();
        let teller = feed.teller().clone();
        let mut changes = feed.subscribe(false);
        teller.tell_event();
        assert!(
            !told(&mut changes).await,
            "no event follower: not even sent"
        );
        let mut events = feed.subscribe(true);
        teller.tell_event();
        assert!(told(&mut events).await);
        assert!(
            told(&mut changes).await,
            "one send wakes all (it reads the session and finds its mark unchanged)"
        );
        drop(events);
        teller.tell_event();
        assert!(!told(&mut changes).await, "the event follower left");
        teller.tell();
        assert!(told(&mut changes).await, "any other change");
    }

    #[tokio::test]
    async fn a_gone_session_changes_no_more() {
        let feed = Feed::new();
        let mut s = feed.subscribe(true);
        drop(feed);
        assert!(!told(&mut s).await, "waits, does not spin");
    }
}

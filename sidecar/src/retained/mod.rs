//! The pod's one byte budget (`--pod-retained-bytes`, `docs/design/buffering.md#the-pod-budget`):
//! everything its sessions retain, counted per kind (`tether_retained_bytes{kind}`) — event
//! buffers, journals, retry records, stored replies, tombstones — against one cap. What no
//! enforcement can free (journals, tombstones, events no client was sent) is *pinned*: it
//! alone may fill the budget, and then new sessions and requests are refused. The rest (sent
//! events, spent answers) is given up, oldest first, when the budget is over. Per-session
//! bounds (`--max-journal-bytes`, `--max-session-retry-bytes`, and the session's share of
//! event buffers, `--max-session-buffer-bytes`, kept by a [`BufferAccount`]) keep one session
//! from taking the pod's budget.
//!
//! What a principal's sessions pin is counted together too ([`shares`]): one principal pins at
//! most `--max-principal-retained-bytes`, and when the pod is full, the principals over their
//! fair share are refused and give up their unread buffers, never the others.
//!
//! A [`Charge`] is what one session holds of one kind; a [`Held`] is what one of its streams
//! holds of a [`Shared`] session tally (its stored reply). Both are given back when dropped, so
//! the tally falls back when a reply is forgotten or a session ends, expires or moves away.

pub(crate) mod shares;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::mcp::principal::Principal;
use shares::{Share, Shares};

/// What a session retains, as `tether_retained_bytes` labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// The journal: the `initialize` request, the log level, the subscriptions.
    Journal,
    /// Retry records: request ids, body digests, stream keys.
    Records,
    /// Stored replies: the upstream's complete non-SSE answers, kept for retried requests.
    Replies,
    /// Tombstones: digests of answered request ids whose records were forgotten.
    Tombstones,
    /// Buffered SSE event data, sent or not.
    Buffers,
    /// Calls in flight: what an upstream exchange costs while it runs, read or not
    /// (`broker/calls.rs`). Counted, not held to the byte budget: nothing can give it up, and
    /// a budget full of calls would stall the very streams whose end frees them; their number
    /// is bounded instead (`--max-calls` and its shares).
    Calls,
    /// Replicas of sessions held by peers, kept here to serve them if their holder is lost
    /// (`docs/design/replication.md`).
    Replicas,
}

impl Kind {
    /// Every kind, in label order.
    pub(crate) const ALL: [Kind; 7] = [
        Kind::Journal,
        Kind::Records,
        Kind::Replies,
        Kind::Tombstones,
        Kind::Buffers,
        Kind::Calls,
        Kind::Replicas,
    ];

    /// The `kind` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Journal => "journal",
            Kind::Records => "records",
            Kind::Replies => "replies",
            Kind::Tombstones => "tombstones",
            Kind::Buffers => "buffers",
            Kind::Calls => "calls",
            Kind::Replicas => "replicas",
        }
    }
}

/// The growth would take the pod's pinned bytes past `--pod-retained-bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PodFull;

/// The pod's budget and its tally, shared by every session and stream of the pod.
#[derive(Clone, Debug)]
pub(crate) struct Retained(Arc<Tally>);

#[derive(Debug)]
struct Tally {
    bytes: [AtomicU64; Kind::ALL.len()],
    /// Bytes of buffered events no client was sent yet (part of `Buffers`).
    unsent: AtomicU64,
    /// Buffered events, and stream buffers (kept as they change, so the gauges cost no walk).
    events: AtomicU64,
    streams: AtomicU64,
    /// `--pod-retained-bytes`.
    cap: u64,
    /// `--max-session-buffer-bytes`: each session's share of buffered event data.
    session_buffers: u64,
    /// What each principal's sessions pin, and `--max-principal-retained-bytes`.
    shares: Arc<Shares>,
    principal_cap: u64,
}

impl Retained {
    /// An empty tally against a budget of `cap` bytes, each session's event buffers taking
    /// at most the whole of it (tests and fuzzing).
    #[cfg(any(test, fuzzing))]
    pub(crate) fn new(cap: u64) -> Self {
        Self::with_shares(cap, cap, cap)
    }

    /// An empty tally against a budget of `cap` bytes, each session's event buffers taking at
    /// most `session_buffers` bytes of it, and each principal's sessions pinning at most
    /// `principal_cap`.
    pub(crate) fn with_shares(cap: u64, session_buffers: u64, principal_cap: u64) -> Self {
        Self(Arc::new(Tally {
            session_buffers,
            shares: Arc::default(),
            principal_cap,
            bytes: Default::default(),
            unsent: AtomicU64::new(0),
            events: AtomicU64::new(0),
            streams: AtomicU64::new(0),
            cap,
        }))
    }

    /// Bytes of `kind` retained now.
    pub(crate) fn bytes(&self, kind: Kind) -> u64 {
        self.0.bytes[kind as usize].load(Ordering::Relaxed)
    }

    /// Bytes held to the budget now: every kind but [`Kind::Calls`].
    pub(crate) fn total(&self) -> u64 {
        Kind::ALL
            .iter()
            .filter(|&&k| k != Kind::Calls)
            .map(|&k| self.bytes(k))
            .sum()
    }

    /// Whether the pod retains more than its budget: sent events and spent answers go then.
    pub(crate) fn over(&self) -> bool {
        self.above(1, 1)
    }

    /// Whether the pod retains more than `num / den` of its budget (the low-water mark
    /// enforcement sheds down to).
    pub(crate) fn above(&self, num: u64, den: u64) -> bool {
        self.total() > self.0.cap / den * num
    }

    /// Bytes of events no client was sent yet (which no bound evicts).
    pub(crate) fn unsent(&self) -> u64 {
        self.0.unsent.load(Ordering::Relaxed)
    }

    /// Bytes nothing can free now: journals, tombstones and events no client was sent.
    pub(crate) fn pinned(&self) -> u64 {
        self.bytes(Kind::Journal) + self.bytes(Kind::Tombstones) + self.unsent()
    }

    /// Whether pinned bytes take the whole budget: shedding makes no room then, and new
    /// requests that would add to them are refused.
    pub(crate) fn is_full(&self) -> bool {
        self.pinned() >= self.0.cap
    }

    /// `--pod-retained-bytes`.
    pub(crate) fn cap(&self) -> u64 {
        self.0.cap
    }

    /// `--max-principal-retained-bytes`.
    pub(crate) fn principal_cap(&self) -> u64 {
        self.0.principal_cap
    }

    /// The tally of what `principal`'s sessions pin.
    pub(crate) fn share(&self, principal: Principal) -> Arc<Share> {
        self.0.shares.of(principal)
    }

    /// Bytes `principal`'s sessions pin now.
    pub(crate) fn pinned_by(&self, principal: &Principal) -> u64 {
        self.0.shares.pinned_by(principal)
    }

    /// Principals pinning some bytes now.
    pub(crate) fn principals_pinning(&self) -> u64 {
        self.0.shares.holding()
    }

    /// Buffered events and stream buffers on the pod now.
    pub(crate) fn events_and_streams(&self) -> (u64, u64) {
        (
            self.0.events.load(Ordering::Relaxed),
            self.0.streams.load(Ordering::Relaxed),
        )
    }

    /// Counts one more buffered event of `bytes`.
    pub(crate) fn take_event(&self, bytes: u64) {
        self.0.bytes[Kind::Buffers as usize].fetch_add(bytes, Ordering::Relaxed);
        self.0.events.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `events` buffered events of `bytes` in all fewer.
    pub(crate) fn give_back_events(&self, events: u64, bytes: u64) {
        self.0.bytes[Kind::Buffers as usize].fetch_sub(bytes, Ordering::Relaxed);
        self.0.events.fetch_sub(events, Ordering::Relaxed);
    }

    /// Counts a stream buffer made (`true`) or dropped.
    pub(crate) fn count_stream(&self, made: bool) {
        if made {
            self.0.streams.fetch_add(1, Ordering::Relaxed);
        } else {
            self.0.streams.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Moves the tally of unsent bytes from `from` (a buffer's last count) to `to`.
    pub(crate) fn adjust_unsent(&self, from: u64, to: u64) {
        if to >= from {
            self.0.unsent.fetch_add(to - from, Ordering::Relaxed);
        } else {
            self.0.unsent.fetch_sub(from - to, Ordering::Relaxed);
        }
    }

    /// The account of a new session's event buffers: this pod's budget and the session's
    /// share of it.
    pub(crate) fn account(&self) -> BufferAccount {
        BufferAccount {
            pod: self.clone(),
            session: Arc::new(SessionBuffers {
                bytes: AtomicU64::new(0),
                unsent: AtomicU64::new(0),
                cap: self.0.session_buffers,
                share: OnceLock::new(),
            }),
        }
    }

    /// An empty charge of `kind`.
    pub(crate) fn charge(&self, kind: Kind) -> Charge {
        Charge {
            retained: self.clone(),
            kind,
            bytes: 0,
            share: None,
        }
    }
}

/// What a stream buffer counts its events against: the pod's budget and its session's share
/// (`--max-session-buffer-bytes`). Cloned into every stream of the session.
#[derive(Clone, Debug)]
pub(crate) struct BufferAccount {
    pod: Retained,
    session: Arc<SessionBuffers>,
}

#[derive(Debug)]
struct SessionBuffers {
    /// Bytes of event data the session's streams buffer.
    bytes: AtomicU64,
    /// Of which no client was sent yet.
    unsent: AtomicU64,
    cap: u64,
    /// The tally of the principal the session is bound to (unsent bytes count there too).
    share: OnceLock<Arc<Share>>,
}

impl BufferAccount {
    /// The pod's tally.
    pub(crate) fn pod(&self) -> &Retained {
        &self.pod
    }

    /// Bytes of event data the session's streams buffer.
    pub(crate) fn session_bytes(&self) -> u64 {
        self.session.bytes.load(Ordering::Relaxed)
    }

    /// Whether the session's streams buffer more than its share: its sent events go then,
    /// the oldest completed streams' first.
    pub(crate) fn session_over(&self) -> bool {
        self.session_bytes() > self.session.cap
    }

    /// Whether the pod is over its budget or the session over its share: events no client
    /// was sent wait then (backpressure).
    pub(crate) fn over(&self) -> bool {
        self.pod.over() || self.session_over()
    }

    /// Counts one more buffered event of `bytes`.
    pub(crate) fn take_event(&self, bytes: u64) {
        self.pod.take_event(bytes);
        self.session.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts `events` buffered events of `bytes` in all fewer.
    pub(crate) fn give_back_events(&self, events: u64, bytes: u64) {
        self.pod.give_back_events(events, bytes);
        self.session.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Moves the tallies of unsent bytes from `from` (a buffer's last count) to `to`.
    pub(crate) fn adjust_unsent(&self, from: u64, to: u64) {
        self.pod.adjust_unsent(from, to);
        let unsent = &self.session.unsent;
        if to >= from {
            unsent.fetch_add(to - from, Ordering::Relaxed);
        } else {
            unsent.fetch_sub(from - to, Ordering::Relaxed);
        }
        if let Some(share) = self.session.share.get() {
            share.adjust(from, to);
        }
    }

    /// Counts the session's unsent bytes, from now on, in `share` too (its principal's; once,
    /// when the session is bound, before another thread sees it).
    pub(crate) fn attribute(&self, share: &Arc<Share>) {
        if self.session.share.set(Arc::clone(share)).is_ok() {
            share.adjust(0, self.session.unsent.load(Ordering::Relaxed));
        }
    }

    /// Counts a stream buffer made (`true`) or dropped.
    pub(crate) fn count_stream(&self, made: bool) {
        self.pod.count_stream(made);
    }
}

/// The bytes of one kind one session retains; given back on drop.
#[derive(Debug)]
pub(crate) struct Charge {
    retained: Retained,
    kind: Kind,
    bytes: u64,
    /// The principal's tally it counts in too (journals and tombstones of a bound session).
    share: Option<Arc<Share>>,
}

impl Charge {
    /// Bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Holds `bytes` from now on when the pod's budget allows the growth of a journal (pinned
    /// bytes stay within it; a shrink, and other kinds, always do); else changes nothing.
    ///
    /// # Errors
    /// [`PodFull`] when a journal's growth takes the pod's pinned bytes past its budget.
    pub(crate) fn try_resize(&mut self, bytes: u64) -> Result<(), PodFull> {
        if bytes <= self.bytes || self.kind != Kind::Journal {
            self.apply(bytes);
            return Ok(());
        }
        let grow = bytes - self.bytes;
        let pod = &self.retained;
        let others = pod.bytes(Kind::Tombstones) + pod.unsent();
        let cap = pod.0.cap;
        pod.0.bytes[self.kind as usize]
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                (others + now + grow <= cap).then_some(now + grow)
            })
            .map_err(|_| PodFull)?;
        if let Some(share) = &self.share {
            share.adjust(self.bytes, bytes);
        }
        self.bytes = bytes;
        Ok(())
    }

    /// Counts what it holds, from now on, in `share` too (its session's principal's).
    pub(crate) fn attribute(&mut self, share: &Arc<Share>) {
        share.adjust(0, self.bytes);
        if let Some(old) = self.share.replace(Arc::clone(share)) {
            old.adjust(self.bytes, 0);
        }
    }

    /// Whether [`Charge::try_resize`] to `bytes` would succeed now (changes nothing).
    pub(crate) fn fits(&self, bytes: u64) -> bool {
        if bytes <= self.bytes || self.kind != Kind::Journal {
            return true;
        }
        let pod = &self.retained;
        let others = pod.bytes(Kind::Tombstones) + pod.unsent();
        others + pod.bytes(self.kind) + (bytes - self.bytes) <= pod.0.cap
    }

    /// Holds `bytes` from now on, whatever the pod's cap (what another pod already accepted,
    /// and kinds without a cap).
    pub(crate) fn resize(&mut self, bytes: u64) {
        self.apply(bytes);
    }

    fn apply(&mut self, bytes: u64) {
        let tally = &self.retained.0.bytes[self.kind as usize];
        if bytes >= self.bytes {
            tally.fetch_add(bytes - self.bytes, Ordering::Relaxed);
        } else {
            tally.fetch_sub(self.bytes - bytes, Ordering::Relaxed);
        }
        if let Some(share) = &self.share {
            share.adjust(self.bytes, bytes);
        }
        self.bytes = bytes;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.apply(0);
    }
}

/// What one session's parts hold of one kind together (its streams' stored replies), each
/// part through a [`Held`]; counted in the pod's tally of that kind too.
#[derive(Debug)]
pub(crate) struct Shared {
    bytes: AtomicU64,
    retained: Retained,
    kind: Kind,
}

impl Shared {
    /// An empty session tally of `kind`.
    pub(crate) fn new(retained: &Retained, kind: Kind) -> Arc<Self> {
        Arc::new(Self {
            bytes: AtomicU64::new(0),
            retained: retained.clone(),
            kind,
        })
    }

    /// Bytes the session's parts hold now.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Holds `bytes` (in this tally and the pod's) until the [`Held`] is dropped.
    pub(crate) fn hold(self: &Arc<Self>, bytes: u64) -> Held {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.retained.0.bytes[self.kind as usize].fetch_add(bytes, Ordering::Relaxed);
        Held {
            shared: Arc::clone(self),
            bytes,
        }
    }
}

/// Bytes one part of a session holds in its [`Shared`] tally; given back on drop.
#[derive(Debug)]
pub(crate) struct Held {
    shared: Arc<Shared>,
    bytes: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        let s = &self.shared;
        s.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        s.retained.0.bytes[s.kind as usize].fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_add_up_keep_pinned_bytes_within_the_budget_and_are_given_back_on_drop() {
        let pod = Retained::new(100);
        let mut a = pod.charge(Kind::Journal);
        let mut b = pod.charge(Kind::Journal);
        a.try_resize(60).unwrap();
        assert_eq!(b.try_resize(41), Err(PodFull));
        assert_eq!(b.bytes(), 0, "a refused growth changes nothing");
        b.try_resize(40).unwrap();
        assert_eq!(pod.bytes(Kind::Journal), 100);
        assert!(pod.is_full());
        a.try_resize(10).unwrap();
        assert_eq!(pod.bytes(Kind::Journal), 50);
        pod.adjust_unsent(0, 30);
        assert_eq!(
            b.try_resize(61),
            Err(PodFull),
            "unsent events are pinned too"
        );
        let mut records = pod.charge(Kind::Records);
        records.resize(1_000);
        assert!(pod.over() && !pod.is_full(), "records can be shed");
        b.try_resize(60).unwrap();
        b.resize(500);
        assert_eq!(
            pod.bytes(Kind::Journal),
            510,
            "an adopted journal is accepted"
        );
        drop((a, b, records));
        pod.adjust_unsent(30, 0);
        assert_eq!((pod.total(), pod.pinned()), (0, 0));
    }

    #[test]
    fn a_session_share_bounds_its_buffers_within_the_pod_budget() {
        let pod = Retained::with_shares(1_000, 300, 1_000);
        let (a, b) = (pod.account(), pod.account());
        a.take_event(200);
        b.take_event(250);
        assert!(!a.over() && !b.over());
        a.take_event(200);
        assert!(
            a.session_over() && a.over(),
            "400 bytes over a share of 300"
        );
        assert!(!b.over(), "the other session is within its share");
        b.take_event(300);
        b.take_event(100);
        assert!(pod.over() && a.over(), "1,050 bytes over the pod's 1,000");
        a.give_back_events(2, 400);
        b.give_back_events(3, 650);
        assert_eq!((pod.total(), a.session_bytes()), (0, 0));
    }

    #[test]
    fn every_kind_counts_against_the_one_budget() {
        let pod = Retained::new(1_000);
        let mut calls = pod.charge(Kind::Calls);
        calls.resize(5_000);
        assert!(!pod.over(), "calls are counted, bounded by their number");
        let session = Shared::new(&pod, Kind::Replies);
        let a = session.hold(600);
        let b = session.hold(300);
        assert_eq!((session.bytes(), pod.bytes(Kind::Replies)), (900, 900));
        assert!(!pod.over());
        pod.take_event(101);
        assert!(pod.over(), "900 + 101 bytes exceed the budget of 1,000");
        assert_eq!(pod.events_and_streams(), (1, 0));
        assert!(pod.above(7, 8) && !pod.is_full());
        drop(a);
        assert_eq!((session.bytes(), pod.bytes(Kind::Replies)), (300, 300));
        assert!(!pod.over());
        pod.give_back_events(1, 101);
        drop(b);
        assert_eq!((session.bytes(), pod.total()), (0, 0));
    }

    #[test]
    fn a_principals_share_counts_what_its_sessions_pin() {
        let pod = Retained::with_shares(1_000, 1_000, 400);
        let share = pod.share(Principal([7; 16]));
        let (a, b) = (pod.account(), pod.account());
        let mut journal = pod.charge(Kind::Journal);
        journal.resize(100);
        a.adjust_unsent(0, 50);
        a.attribute(&share);
        journal.attribute(&share);
        assert_eq!(
            share.pinned(),
            150,
            "what was pinned before the binding counts"
        );
        a.adjust_unsent(50, 250);
        journal.try_resize(120).unwrap();
        b.adjust_unsent(0, 500);
        assert_eq!(
            share.pinned(),
            370,
            "the other session is not the principal's"
        );
        assert_eq!(pod.principals_pinning(), 1);
        drop(journal);
        a.adjust_unsent(250, 0);
        assert_eq!(
            (share.pinned(), pod.principals_pinning()),
            (0, 0),
            "given back as the parts shrink and drop"
        );
        b.adjust_unsent(500, 0);
    }
}

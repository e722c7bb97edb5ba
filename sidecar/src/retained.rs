//! The bytes a pod's sessions retain beyond their event buffers, counted per kind
//! (`tether_retained_bytes{kind}`) and held against their bounds: each session's journal
//! against `--max-journal-bytes`, every journal of the pod against `--pod-journal-bytes`; each
//! session's retry state (records, stored replies, tombstones) against
//! `--max-session-retry-bytes`, the pod's against `--pod-retry-bytes`
//! (`docs/design/architecture.md#bounds`).
//!
//! A [`Charge`] is what one session holds of one kind; a [`Held`] is what one of its streams
//! holds of a [`Shared`] session tally (its stored reply). Both are given back when dropped, so
//! the tally falls back when a reply is forgotten or a session ends, expires or moves away.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a session retains, as `tether_retained_bytes` labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The journal: the `initialize` request, the log level, the subscriptions.
    Journal,
    /// Retry records: request ids, body digests, stream keys.
    Records,
    /// Stored replies: the upstream's complete non-SSE answers, kept for retried requests.
    Replies,
    /// Tombstones: digests of answered request ids whose records were forgotten.
    Tombstones,
}

impl Kind {
    /// Every kind, in label order.
    pub(crate) const ALL: [Kind; 4] = [
        Kind::Journal,
        Kind::Records,
        Kind::Replies,
        Kind::Tombstones,
    ];

    /// The `kind` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Journal => "journal",
            Kind::Records => "records",
            Kind::Replies => "replies",
            Kind::Tombstones => "tombstones",
        }
    }
}

/// The pod's journals would exceed `--pod-journal-bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PodFull;

/// The pod-wide tally, shared by every session of the pod.
#[derive(Clone, Debug)]
pub(crate) struct Retained(Arc<Tally>);

#[derive(Debug)]
struct Tally {
    bytes: [AtomicU64; 4],
    /// `--pod-journal-bytes`.
    journal_cap: u64,
    /// `--pod-retry-bytes`: records, replies and tombstones together.
    retry_cap: u64,
}

impl Retained {
    /// A tally whose journals may hold at most `journal_cap` bytes in all, and whose retry
    /// state (records and replies) `retry_cap` bytes before new requests are refused.
    pub(crate) fn new(journal_cap: u64, retry_cap: u64) -> Self {
        Self(Arc::new(Tally {
            bytes: Default::default(),
            journal_cap,
            retry_cap,
        }))
    }

    /// Bytes of `kind` retained now.
    pub(crate) fn bytes(&self, kind: Kind) -> u64 {
        self.0.bytes[kind as usize].load(Ordering::Relaxed)
    }

    /// Whether the pod's retry state (records, stored replies, tombstones) takes more than
    /// `--pod-retry-bytes`.
    pub(crate) fn retry_over(&self) -> bool {
        self.retry_above(1, 1)
    }

    /// Whether the pod's retry state takes more than `num / den` of `--pod-retry-bytes` (the
    /// low-water mark enforcement sheds down to).
    pub(crate) fn retry_above(&self, num: u64, den: u64) -> bool {
        let cap = self.0.retry_cap / den * num;
        self.bytes(Kind::Records) + self.bytes(Kind::Replies) + self.bytes(Kind::Tombstones) > cap
    }

    /// An empty charge of `kind`.
    pub(crate) fn charge(&self, kind: Kind) -> Charge {
        Charge {
            retained: self.clone(),
            kind,
            bytes: 0,
        }
    }
}

/// The bytes of one kind one session retains; given back on drop.
#[derive(Debug)]
pub(crate) struct Charge {
    retained: Retained,
    kind: Kind,
    bytes: u64,
}

impl Charge {
    /// Bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Holds `bytes` from now on when the pod's cap of this kind allows the growth (a shrink
    /// always does); else changes nothing.
    ///
    /// # Errors
    /// [`PodFull`] when growing past the pod's journal cap.
    pub(crate) fn try_resize(&mut self, bytes: u64) -> Result<(), PodFull> {
        if bytes <= self.bytes || self.kind != Kind::Journal {
            self.apply(bytes);
            return Ok(());
        }
        let grow = bytes - self.bytes;
        let cap = self.retained.0.journal_cap;
        self.retained.0.bytes[self.kind as usize]
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                (now + grow <= cap).then_some(now + grow)
            })
            .map_err(|_| PodFull)?;
        self.bytes = bytes;
        Ok(())
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
    fn charges_add_up_respect_the_journal_cap_and_are_given_back_on_drop() {
        let pod = Retained::new(100, u64::MAX);
        let mut a = pod.charge(Kind::Journal);
        let mut b = pod.charge(Kind::Journal);
        a.try_resize(60).unwrap();
        assert_eq!(b.try_resize(41), Err(PodFull));
        assert_eq!(b.bytes(), 0, "a refused growth changes nothing");
        b.try_resize(40).unwrap();
        assert_eq!(pod.bytes(Kind::Journal), 100);
        a.try_resize(10).unwrap();
        assert_eq!(pod.bytes(Kind::Journal), 50);
        let mut records = pod.charge(Kind::Records);
        records.resize(1_000);
        assert_eq!(pod.bytes(Kind::Records), 1_000, "records have no cap here");
        b.resize(500);
        assert_eq!(
            pod.bytes(Kind::Journal),
            510,
            "an adopted journal is accepted"
        );
        drop((a, b, records));
        assert_eq!((pod.bytes(Kind::Journal), pod.bytes(Kind::Records)), (0, 0));
    }

    #[test]
    fn held_bytes_count_in_the_session_and_the_pod_and_the_retry_cap_covers_records_and_replies() {
        let pod = Retained::new(u64::MAX, 1_000);
        let session = Shared::new(&pod, Kind::Replies);
        let a = session.hold(600);
        let b = session.hold(300);
        assert_eq!((session.bytes(), pod.bytes(Kind::Replies)), (900, 900));
        assert!(!pod.retry_over());
        let mut records = pod.charge(Kind::Records);
        records.resize(101);
        assert!(pod.retry_over(), "900 + 101 bytes exceed the cap of 1,000");
        drop(a);
        assert_eq!((session.bytes(), pod.bytes(Kind::Replies)), (300, 300));
        assert!(!pod.retry_over());
        drop((b, records));
        assert_eq!((session.bytes(), pod.bytes(Kind::Replies)), (0, 0));
    }
}

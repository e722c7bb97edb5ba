//! The per-stream replay buffer (`docs/design/architecture.md#streams-and-the-replay-buffer`).
//!
//! A [`StreamBuffer`] holds the newest events of one stream, bounded by `buffer.maxEvents`
//! (events), `buffer.maxBytes` (bytes of event data) and `buffer.ttl`, plus a pod-wide byte cap
//! shared by every stream ([`PodBudget`]). The oldest events are evicted first; the newest event
//! is kept, so a stream never loses the event it has just received (a single event larger than
//! `maxBytes` is kept alone) — unless it alone is larger than the pod's cap, which no stream may
//! hold (upstream events are smaller: `--max-event-bytes`). Once every event is gone the buffer
//! is a *tombstone*: it still knows its last sequence number, so "nothing after the last event"
//! is answered correctly.
//!
//! Every retained event has a sequence number in `(evicted_through, last_seq]`, in order. Some
//! numbers in that range carry no event: [`StreamBuffer::reserve`] hands them out as the ids of
//! priming events, so that every id sent on a session is unique (spec R-01).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Bounds of one stream's buffer, from `spec.buffer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BufferLimits {
    /// Most events kept (`buffer.maxEvents`), at least 1.
    pub(crate) max_events: usize,
    /// Most bytes of event data kept (`buffer.maxBytes`).
    pub(crate) max_bytes: u64,
    /// How long an event stays replayable (`buffer.ttl`).
    pub(crate) ttl: Duration,
}

/// Pod-wide accounting of buffered bytes, shared by every stream of every session.
#[derive(Clone, Debug)]
pub(crate) struct PodBudget {
    used: Arc<AtomicU64>,
    cap: u64,
}

impl PodBudget {
    /// A budget of `cap` bytes.
    pub(crate) fn new(cap: u64) -> Self {
        Self {
            used: Arc::new(AtomicU64::new(0)),
            cap,
        }
    }

    /// Bytes currently buffered on this pod.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Whether more than the cap is buffered.
    pub(crate) fn over(&self) -> bool {
        self.used() > self.cap
    }

    fn take(&self, n: u64) {
        self.used.fetch_add(n, Ordering::Relaxed);
    }

    fn give_back(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// One buffered SSE event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BufferedEvent {
    /// Sequence number on its stream (from 1).
    pub(crate) seq: u64,
    /// The SSE `event:` field, when the upstream set one.
    pub(crate) event: Option<String>,
    /// The SSE `data:` payload (a JSON-RPC message), LF-joined.
    pub(crate) data: Bytes,
    /// When the sidecar received it.
    pub(crate) at: Instant,
}

impl BufferedEvent {
    fn size(&self) -> u64 {
        (self.data.len() + self.event.as_ref().map_or(0, String::len)) as u64
    }
}

/// Events evicted by one operation, by reason (for `tether_buffer_evictions_total`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Evictions {
    /// Over `maxEvents`.
    pub(crate) count: u64,
    /// Over `maxBytes`.
    pub(crate) bytes: u64,
    /// Older than `ttl`.
    pub(crate) ttl: u64,
    /// Over the pod-wide byte cap.
    pub(crate) pod_cap: u64,
}

/// Why events after a cursor cannot be replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReplayError {
    /// The cursor names an event this stream has not produced.
    #[error("cursor is ahead of the stream (last event {last})")]
    Ahead {
        /// Sequence of the newest event.
        last: u64,
    },
    /// Events right after the cursor were evicted; replaying would silently skip them.
    #[error("events after the cursor were evicted (oldest kept is {oldest_kept})")]
    Evicted {
        /// Sequence of the oldest event still kept (or the next one to come).
        oldest_kept: u64,
    },
}

/// The bounded event buffer of one stream.
#[derive(Debug)]
pub(crate) struct StreamBuffer {
    limits: BufferLimits,
    budget: PodBudget,
    events: VecDeque<BufferedEvent>,
    bytes: u64,
    last_seq: u64,
    evicted_through: u64,
}

impl StreamBuffer {
    /// How long an event stays replayable (`buffer.ttl`).
    pub(crate) fn ttl(&self) -> Duration {
        self.limits.ttl
    }

    /// An empty buffer (no event yet: last sequence 0).
    pub(crate) fn new(limits: BufferLimits, budget: PodBudget) -> Self {
        Self {
            limits,
            budget,
            events: VecDeque::new(),
            bytes: 0,
            last_seq: 0,
            evicted_through: 0,
        }
    }

    /// Appends an event received at `now`; returns its sequence number and what was evicted.
    pub(crate) fn push(
        &mut self,
        event: Option<String>,
        data: Bytes,
        now: Instant,
    ) -> (u64, Evictions) {
        self.last_seq += 1;
        let ev = BufferedEvent {
            seq: self.last_seq,
            event,
            data,
            at: now,
        };
        let size = ev.size();
        self.bytes += size;
        self.budget.take(size);
        self.events.push_back(ev);
        let mut ev = Evictions::default();
        while self.events.len() > self.limits.max_events.max(1) {
            self.pop_front();
            ev.count += 1;
        }
        while self.bytes > self.limits.max_bytes && self.events.len() > 1 {
            self.pop_front();
            ev.bytes += 1;
        }
        // The newest event stays even over the bounds, but never when it alone is over the
        // pod's cap (the upstream's events are bounded below it, `--max-event-bytes`; this holds
        // for events from anywhere): then it goes too, and a reader learns it was evicted.
        while self.budget.over() && (self.events.len() > 1 || size > self.budget.cap) {
            self.pop_front();
            ev.pod_cap += 1;
        }
        (self.last_seq, ev)
    }

    /// Stores an event that another pod numbered `seq` (the tail of a handed-off stream,
    /// `docs/design/handoff.md`); numbers up to `seq` that carry no event stay gaps, as reserved
    /// ones do. Events at or below the last sequence are already here and ignored (`None`).
    pub(crate) fn put(
        &mut self,
        seq: u64,
        event: Option<String>,
        data: Bytes,
        now: Instant,
    ) -> Option<Evictions> {
        if seq <= self.last_seq {
            return None;
        }
        self.last_seq = seq - 1;
        Some(self.push(event, data, now).1)
    }

    /// Takes over the numbering of the holder a stream came from: its last sequence (which may
    /// be a reserved priming number) and how far it evicted. When the holder evicted events this
    /// buffer never received, everything older is dropped too, so a cursor before the gap is
    /// answered `cursor_evicted` instead of skipping events.
    ///
    /// The last sequence is at least `evicted_through` (events up to there existed), so every
    /// number handed out later is beyond what was evicted.
    pub(crate) fn follow(&mut self, last_seq: u64, evicted_through: u64) {
        if evicted_through > self.last_seq {
            self.evict_all();
            self.evicted_through = self.evicted_through.max(evicted_through);
        }
        self.last_seq = self.last_seq.max(last_seq).max(self.evicted_through);
    }

    /// How far events were evicted: every event at or below this sequence may be gone.
    pub(crate) fn evicted_through(&self) -> u64 {
        self.evicted_through
    }

    /// Reserves the next sequence number without storing an event (the id of a priming event,
    /// which marks "the position before everything that follows").
    pub(crate) fn reserve(&mut self) -> u64 {
        self.last_seq += 1;
        self.last_seq
    }

    /// Evicts every event (the pod is over its byte cap and the stream is complete).
    pub(crate) fn evict_all(&mut self) -> u64 {
        let n = self.events.len() as u64;
        while !self.events.is_empty() {
            self.pop_front();
        }
        n
    }

    /// When the oldest kept event was received.
    pub(crate) fn oldest(&self) -> Option<Instant> {
        self.events.front().map(|e| e.at)
    }

    /// Evicts events older than the TTL at `now`.
    pub(crate) fn evict_expired(&mut self, now: Instant) -> Evictions {
        let mut ev = Evictions::default();
        while self
            .events
            .front()
            .is_some_and(|e| now.saturating_duration_since(e.at) >= self.limits.ttl)
        {
            self.pop_front();
            ev.ttl += 1;
        }
        ev
    }

    /// The retained events strictly after sequence `after` (spec R-03).
    ///
    /// # Errors
    /// [`ReplayError::Ahead`] when `after` is beyond the last event; [`ReplayError::Evicted`] when
    /// some event right after `after` is no longer kept.
    pub(crate) fn events_after(
        &self,
        after: u64,
    ) -> Result<impl Iterator<Item = &BufferedEvent>, ReplayError> {
        if after > self.last_seq {
            return Err(ReplayError::Ahead {
                last: self.last_seq,
            });
        }
        if after < self.evicted_through {
            return Err(ReplayError::Evicted {
                oldest_kept: self.evicted_through + 1,
            });
        }
        let skip = self.events.partition_point(|e| e.seq <= after);
        Ok(self.events.iter().skip(skip))
    }

    /// Sequence of the newest event (0 before the first).
    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Events kept.
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    /// Bytes of event data kept.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    fn pop_front(&mut self) {
        if let Some(e) = self.events.pop_front() {
            let size = e.size();
            self.bytes -= size;
            self.budget.give_back(size);
            self.evicted_through = e.seq;
        }
    }
}

impl Drop for StreamBuffer {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_events: usize, max_bytes: u64, ttl_ms: u64) -> BufferLimits {
        BufferLimits {
            max_events,
            max_bytes,
            ttl: Duration::from_millis(ttl_ms),
        }
    }

    fn seqs(buf: &StreamBuffer, after: u64) -> Result<Vec<u64>, ReplayError> {
        buf.events_after(after)
            .map(|it| it.map(|e| e.seq).collect())
    }

    fn data(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    #[test]
    fn r03_replay_is_strictly_after_the_cursor() {
        let now = Instant::now();
        let mut b = StreamBuffer::new(limits(10, 1 << 20, 60_000), PodBudget::new(u64::MAX));
        for _ in 0..5 {
            b.push(None, data(3), now);
        }
        assert_eq!(seqs(&b, 0), Ok(vec![1, 2, 3, 4, 5]));
        assert_eq!(seqs(&b, 2), Ok(vec![3, 4, 5]));
        assert_eq!(seqs(&b, 5), Ok(vec![]));
        assert_eq!(seqs(&b, 6), Err(ReplayError::Ahead { last: 5 }));
    }

    #[test]
    fn r01_reserved_numbers_are_gaps_and_never_reused() {
        let now = Instant::now();
        let mut b = StreamBuffer::new(limits(10, 1 << 20, 60_000), PodBudget::new(u64::MAX));
        let primed = b.reserve();
        assert_eq!(primed, 1);
        b.push(None, data(1), now);
        let again = b.reserve();
        b.push(None, data(1), now);
        assert_eq!(again, 3);
        assert_eq!(seqs(&b, 0), Ok(vec![2, 4]));
        assert_eq!(seqs(&b, primed), Ok(vec![2, 4]));
        assert_eq!(seqs(&b, again), Ok(vec![4]));
        assert_eq!(seqs(&b, 5), Err(ReplayError::Ahead { last: 4 }));
    }

    #[test]
    fn eviction_by_count() {
        let now = Instant::now();
        let mut b = StreamBuffer::new(limits(3, 1 << 20, 60_000), PodBudget::new(u64::MAX));
        let mut total = Evictions::default();
        for _ in 0..5 {
            total.count += b.push(None, data(1), now).1.count;
        }
        assert_eq!(total.count, 2);
        assert_eq!(seqs(&b, 2), Ok(vec![3, 4, 5]));
        assert_eq!(seqs(&b, 1), Err(ReplayError::Evicted { oldest_kept: 3 }));
        assert_eq!(b.len(), 3);
    }

    #[test]
    fn eviction_by_bytes_keeps_the_newest_event() {
        let now = Instant::now();
        let mut b = StreamBuffer::new(limits(100, 10, 60_000), PodBudget::new(u64::MAX));
        b.push(None, data(4), now);
        b.push(None, data(4), now);
        assert_eq!(b.bytes(), 8);
        let (_, ev) = b.push(None, data(4), now);
        assert_eq!(ev.bytes, 1);
        assert_eq!(seqs(&b, 1), Ok(vec![2, 3]));
        let (_, ev) = b.push(None, data(50), now);
        assert_eq!(ev.bytes, 2, "older events go, the oversized newest stays");
        assert_eq!(seqs(&b, 3), Ok(vec![4]));
        assert_eq!(b.bytes(), 50);
    }

    #[test]
    fn eviction_by_ttl_leaves_a_tombstone() {
        let t0 = Instant::now();
        let mut b = StreamBuffer::new(limits(100, 1 << 20, 1_000), PodBudget::new(u64::MAX));
        b.push(None, data(1), t0);
        b.push(None, data(1), t0 + Duration::from_millis(600));
        assert_eq!(b.evict_expired(t0 + Duration::from_millis(999)).ttl, 0);
        assert_eq!(b.evict_expired(t0 + Duration::from_millis(1_000)).ttl, 1);
        assert_eq!(b.evict_expired(t0 + Duration::from_millis(1_600)).ttl, 1);
        assert_eq!(b.len(), 0, "a tombstone");
        assert_eq!(b.last_seq(), 2);
        assert_eq!(seqs(&b, 2), Ok(vec![]), "nothing after the last event");
        assert_eq!(seqs(&b, 1), Err(ReplayError::Evicted { oldest_kept: 3 }));
    }

    #[test]
    fn the_pod_cap_is_shared_and_released() {
        let now = Instant::now();
        let budget = PodBudget::new(10);
        let mut a = StreamBuffer::new(limits(100, 1 << 20, 60_000), budget.clone());
        let mut b = StreamBuffer::new(limits(100, 1 << 20, 60_000), budget.clone());
        a.push(None, data(6), now);
        a.push(None, data(1), now);
        assert_eq!(budget.used(), 7);
        let (_, ev) = b.push(None, data(6), now);
        assert_eq!(ev.pod_cap, 0, "b keeps its only event even over the cap");
        let (_, ev) = b.push(None, data(1), now);
        assert_eq!(ev.pod_cap, 1);
        assert_eq!(budget.used(), 8);
        drop(a);
        assert_eq!(budget.used(), 1);
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_newest_event_is_kept_only_within_the_pod_cap() {
        let now = Instant::now();
        let budget = PodBudget::new(10);
        let mut b = StreamBuffer::new(limits(100, 4, 60_000), budget.clone());
        let (_, ev) = b.push(None, data(10), now);
        assert_eq!(
            (ev.bytes, ev.pod_cap, b.len()),
            (0, 0, 1),
            "over maxBytes, at the cap"
        );
        let (seq, ev) = b.push(None, data(11), now);
        assert_eq!(
            (ev.bytes, ev.pod_cap),
            (1, 1),
            "the older event, then the newest itself"
        );
        assert_eq!(b.len(), 0);
        assert_eq!(budget.used(), 0);
        assert_eq!(
            seqs(&b, seq - 1),
            Err(ReplayError::Evicted {
                oldest_kept: seq + 1
            }),
            "a reader before it learns it is gone"
        );
    }

    #[test]
    fn events_numbered_elsewhere_keep_their_numbers_and_gaps() {
        let now = Instant::now();
        let mut b = StreamBuffer::new(limits(10, 1 << 20, 60_000), PodBudget::new(u64::MAX));
        assert!(b.put(2, None, data(1), now).is_some());
        assert!(b.put(5, None, data(1), now).is_some());
        assert!(
            b.put(5, None, data(1), now).is_none(),
            "a repeated event is ignored"
        );
        assert!(b.put(4, None, data(1), now).is_none(), "an older one too");
        assert_eq!(seqs(&b, 0), Ok(vec![2, 5]));
        assert_eq!(seqs(&b, 3), Ok(vec![5]));
        // The writer reserved 6 for a priming event: the numbering follows it.
        b.follow(6, 0);
        assert_eq!(b.last_seq(), 6);
        assert_eq!(seqs(&b, 6), Ok(vec![]));
        assert!(b.put(7, None, data(1), now).is_some());
        assert_eq!(seqs(&b, 6), Ok(vec![7]));
    }

    #[test]
    fn a_gap_the_writer_evicted_is_evicted_here_too() {
        let now = Instant::now();
        let mut b = StreamBuffer::new(limits(10, 1 << 20, 60_000), PodBudget::new(u64::MAX));
        b.put(1, None, data(1), now);
        b.put(2, None, data(1), now);
        // Events 3..=6 were evicted at the writer before they were sent here.
        b.follow(0, 6);
        b.put(7, None, data(1), now);
        b.put(8, None, data(1), now);
        b.follow(8, 6);
        assert_eq!(seqs(&b, 6), Ok(vec![7, 8]));
        assert_eq!(seqs(&b, 2), Err(ReplayError::Evicted { oldest_kept: 7 }));
        assert_eq!(seqs(&b, 0), Err(ReplayError::Evicted { oldest_kept: 7 }));
    }

    #[test]
    fn following_an_eviction_past_the_last_event_moves_the_last_sequence() {
        // A holder's image claiming events evicted beyond its last sequence: numbers handed
        // out later (priming ids, events) are beyond the evicted ones, never among them.
        let now = Instant::now();
        let mut b = StreamBuffer::new(limits(10, 1 << 20, 60_000), PodBudget::new(u64::MAX));
        b.follow(6, 8);
        assert_eq!((b.last_seq(), b.evicted_through()), (8, 8));
        assert_eq!(seqs(&b, 8), Ok(vec![]));
        assert_eq!(b.reserve(), 9);
        assert_eq!(b.put(9, None, data(1), now), None, "9 is taken");
        assert!(b.put(10, None, data(1), now).is_some());
        assert_eq!(seqs(&b, 9), Ok(vec![10]));
    }
}

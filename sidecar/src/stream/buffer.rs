//! The per-stream replay buffer (`docs/design/buffering.md`).
//!
//! A [`StreamBuffer`] holds the events of one stream in two parts: those some client connection
//! was sent — at or below the buffer's *floor*, which its [`Stream`](super::Stream) keeps — and
//! those nobody was sent yet. The sent ones are the *replay window*: at most `buffer.maxEvents`
//! events and `buffer.maxBytes` bytes of event data, for `buffer.ttl`, the oldest evicted first,
//! and evicted first when the pod's byte budget or the session's share of it
//! ([`BufferAccount`]) is over.
//! The unsent ones are never evicted by a bound: the stream's upstream task waits for
//! [`StreamBuffer::has_room`] (fewer than `maxEvents` and `maxBytes` of them, the pod under its
//! cap) before it reads more — backpressure. The one exception is `buffer.ttl` on a stream
//! nobody reads: its client had that long to come back. Once every event is gone the buffer is a
//! *tombstone*: it still knows its last sequence number, so "nothing after the last event" is
//! answered correctly.
//!
//! Every retained event has a sequence number in `(evicted_through, last_seq]`, in order. Some
//! numbers in that range carry no event: [`StreamBuffer::reserve`] hands them out as the ids of
//! priming events, so that every id sent on a session is unique (spec R-01).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::retained::BufferAccount;

/// Bounds of one stream's buffer, from `spec.buffer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BufferLimits {
    /// Most events kept (`buffer.maxEvents`), at least 1.
    pub(crate) max_events: usize,
    /// Most bytes of event data kept (`buffer.maxBytes`).
    pub(crate) max_bytes: u64,
    /// How long an event stays replayable (`buffer.ttl`).
    pub(crate) ttl: Duration,
    /// How long the events of a stream no client was ever sent an event of stay
    /// (`--unread-ttl`, at most `ttl`): only a retry of its request could still read them.
    pub(crate) unread_ttl: Duration,
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
    /// Bytes of event data pushed into the buffer before this event (a running total, so the
    /// bytes after any event are one subtraction).
    start: u64,
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
    /// Over the pod's budget (`--pod-retained-bytes`).
    pub(crate) pod_cap: u64,
    /// Over the session's share of it (`--max-session-buffer-bytes`).
    pub(crate) session_cap: u64,
    /// Of a stream no client was ever sent an event of, older than `--unread-ttl`.
    pub(crate) unread_ttl: u64,
    /// Unread, shed for a full pod from a caller over its fair share
    /// (`--max-principal-retained-bytes`).
    pub(crate) principal_share: u64,
}

impl std::ops::AddAssign for Evictions {
    fn add_assign(&mut self, e: Self) {
        self.count += e.count;
        self.bytes += e.bytes;
        self.ttl += e.ttl;
        self.pod_cap += e.pod_cap;
        self.session_cap += e.session_cap;
        self.unread_ttl += e.unread_ttl;
        self.principal_share += e.principal_share;
    }
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
    budget: BufferAccount,
    events: VecDeque<BufferedEvent>,
    bytes: u64,
    /// Bytes of event data ever pushed (the running total behind `BufferedEvent::start`).
    pushed: u64,
    last_seq: u64,
    evicted_through: u64,
    /// Events at or below this sequence were sent to some client connection (or forwarded to
    /// the pod a session moved to) and may be evicted; later ones may not.
    floor: u64,
    /// Bytes of unsent events, as last counted in the pod's tally.
    unsent_counted: u64,
}

impl StreamBuffer {
    /// How long an event stays replayable (`buffer.ttl`).
    pub(crate) fn ttl(&self) -> Duration {
        self.limits.ttl
    }

    /// How long the events of a stream no client was ever sent an event of stay
    /// (`--unread-ttl`).
    pub(crate) fn unread_ttl(&self) -> Duration {
        self.limits.unread_ttl
    }

    /// An empty buffer (no event yet: last sequence 0).
    pub(crate) fn new(limits: BufferLimits, budget: BufferAccount) -> Self {
        budget.count_stream(true);
        Self {
            limits,
            budget,
            events: VecDeque::new(),
            bytes: 0,
            pushed: 0,
            last_seq: 0,
            evicted_through: 0,
            floor: 0,
            unsent_counted: 0,
        }
    }

    /// Sets the floor: events at or below `seq` were sent and may be evicted; events after it
    /// may not (a reader still needs them).
    pub(crate) fn set_floor(&mut self, seq: u64) {
        self.floor = seq;
        self.count_unsent();
    }

    /// The floor: events at or below it were sent.
    pub(crate) fn floor(&self) -> u64 {
        self.floor
    }

    /// Brings the pod's tally of unsent bytes up to date with this buffer's.
    fn count_unsent(&mut self) {
        let now = self.unsent().1;
        self.budget.adjust_unsent(self.unsent_counted, now);
        self.unsent_counted = now;
    }

    /// Whether the oldest event may be evicted (it was sent).
    fn front_sent(&self) -> bool {
        self.events.front().is_some_and(|e| e.seq <= self.floor)
    }

    /// Bytes pushed before the `i`th event kept (all of them for `i` = the number kept).
    fn start_of(&self, i: usize) -> u64 {
        self.events.get(i).map_or(self.pushed, |e| e.start)
    }

    /// How many of the kept events were sent (those at or below the floor, which come first).
    fn sent_count(&self) -> usize {
        self.count_through(self.floor)
    }

    /// How many kept events have a sequence at or below `seq` (they come first). Every push and
    /// every read asks; sequences are consecutive but for the few reserved numbers, so the
    /// position `seq` would have without gaps is tried before a search.
    fn count_through(&self, seq: u64) -> usize {
        let Some(first) = self.events.front() else {
            return 0;
        };
        let guess = usize::try_from(seq.saturating_add(1).saturating_sub(first.seq))
            .unwrap_or(usize::MAX)
            .min(self.events.len());
        let below = guess == 0 || self.events[guess - 1].seq <= seq;
        let above = self.events.get(guess).is_none_or(|e| e.seq > seq);
        if below && above {
            guess
        } else {
            self.events.partition_point(|e| e.seq <= seq)
        }
    }

    /// Events kept that no reader was sent yet, and their bytes.
    pub(crate) fn unsent(&self) -> (usize, u64) {
        let first = self.sent_count();
        (
            self.events.len() - first,
            self.pushed - self.start_of(first),
        )
    }

    /// Whether another event may be pushed: the stream holds fewer than its bounds of unsent
    /// events (`maxEvents`, `maxBytes`) and the pod is under its cap — or nothing unsent at
    /// all, so a reader that keeps up is never held back by other streams' slow readers (the
    /// pod's buffers may go over the cap by one event per such stream). When not, the
    /// stream's writer waits (the sidecar stops reading that upstream response).
    pub(crate) fn has_room(&self) -> bool {
        let (events, bytes) = self.unsent();
        events == 0
            || (events < self.limits.max_events.max(1)
                && bytes < self.limits.max_bytes
                && !self.budget.over())
    }

    /// Appends an event received at `now`; returns its sequence number and what was evicted to
    /// stay within the bounds. Only sent events are evicted: an append beyond [`Self::has_room`]
    /// (error events that end a request, events another pod forwards) is kept over the bounds.
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
            start: self.pushed,
        };
        let size = ev.size();
        self.bytes += size;
        self.pushed += size;
        self.budget.take_event(size);
        self.events.push_back(ev);
        let mut ev = Evictions::default();
        // The replay window: at most maxEvents and maxBytes of events already sent, oldest
        // evicted first. Unsent events have bounds of their own: `has_room`.
        let mut sent = self.sent_count();
        while sent > 0 {
            let sent_bytes = self.start_of(sent) - self.events[0].start;
            if sent > self.limits.max_events.max(1) {
                ev.count += 1;
            } else if sent_bytes > self.limits.max_bytes {
                ev.bytes += 1;
            } else {
                break;
            }
            self.pop_front();
            sent -= 1;
        }
        while self.budget.pod().over() && self.front_sent() {
            self.pop_front();
            ev.pod_cap += 1;
        }
        self.count_unsent();
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

    /// Evicts every event (the holder this buffer follows evicted past them).
    fn evict_all(&mut self) {
        while !self.events.is_empty() {
            self.pop_front();
        }
        self.count_unsent();
    }

    /// Evicts every event that was sent (the pod is over its byte cap); returns how many.
    pub(crate) fn evict_sent(&mut self) -> u64 {
        let mut n = 0;
        while self.front_sent() {
            self.pop_front();
            n += 1;
        }
        n
    }

    /// When the oldest kept event was received.
    pub(crate) fn oldest(&self) -> Option<Instant> {
        self.events.front().map(|e| e.at)
    }

    /// Evicts the events older than `--unread-ttl` at `now` (of a stream no client was ever
    /// sent an event of: all of them unsent).
    pub(crate) fn evict_unread(&mut self, now: Instant) -> Evictions {
        let mut ev = Evictions::default();
        while self
            .events
            .front()
            .is_some_and(|e| now.saturating_duration_since(e.at) >= self.limits.unread_ttl)
        {
            self.pop_front();
            ev.unread_ttl += 1;
        }
        self.count_unsent();
        ev
    }

    /// Evicts every event, sent or not (a full pod sheds the unread buffers of a caller over
    /// its fair share); a resume before them gets `cursor_evicted`.
    pub(crate) fn shed(&mut self) -> Evictions {
        let mut ev = Evictions::default();
        while !self.events.is_empty() {
            self.pop_front();
            ev.principal_share += 1;
        }
        self.count_unsent();
        ev
    }

    /// Evicts events older than the TTL at `now`: sent ones, and with `unread` (nobody reads
    /// the stream) unsent ones too — their client had the TTL to come back for them.
    pub(crate) fn evict_expired(&mut self, now: Instant, unread: bool) -> Evictions {
        let mut ev = Evictions::default();
        while self.events.front().is_some_and(|e| {
            now.saturating_duration_since(e.at) >= self.limits.ttl
                && (unread || e.seq <= self.floor)
        }) {
            self.pop_front();
            ev.ttl += 1;
        }
        self.count_unsent();
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
        let skip = self.count_through(after);
        Ok(self.events.iter().skip(skip))
    }

    /// Sequence of the newest event (0 before the first).
    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Events kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    /// Bytes of event data kept.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Evicts the oldest event; callers bring the unsent tally up to date.
    fn pop_front(&mut self) {
        if let Some(e) = self.events.pop_front() {
            let size = e.size();
            self.bytes -= size;
            self.budget.give_back_events(1, size);
            self.evicted_through = e.seq;
        }
    }
}

impl Drop for StreamBuffer {
    fn drop(&mut self) {
        self.budget
            .give_back_events(self.events.len() as u64, self.bytes);
        self.budget.adjust_unsent(self.unsent_counted, 0);
        self.budget.count_stream(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retained::{Kind, Retained};

    fn limits(max_events: usize, max_bytes: u64, ttl_ms: u64) -> BufferLimits {
        BufferLimits {
            max_events,
            max_bytes,
            ttl: Duration::from_millis(ttl_ms),
            unread_ttl: Duration::from_millis(ttl_ms),
        }
    }

    fn seqs(buf: &StreamBuffer, after: u64) -> Result<Vec<u64>, ReplayError> {
        buf.events_after(after)
            .map(|it| it.map(|e| e.seq).collect())
    }

    fn data(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    /// Pushes an event of `n` bytes after its reader was sent every earlier one (so the bounds
    /// may evict those).
    fn push_sent(b: &mut StreamBuffer, n: usize, now: Instant) -> (u64, Evictions) {
        b.set_floor(b.last_seq());
        b.push(None, data(n), now)
    }

    #[test]
    fn r03_replay_is_strictly_after_the_cursor() {
        let now = Instant::now();
        let mut b = StreamBuffer::new(
            limits(10, 1 << 20, 60_000),
            Retained::new(u64::MAX).account(),
        );
        for _ in 0..5 {
            b.push(None, data(3), now);
        }
        assert_eq!(seqs(&b, 0), Ok(vec![1, 2, 3, 4, 5]));
        assert_eq!(seqs(&b, 2), Ok(vec![3, 4, 5]));
        assert_eq!(seqs(&b, 5), Ok(vec![]));
        assert_eq!(seqs(&b, 6), Err(ReplayError::Ahead { last: 5 }));
    }

    #[test]
    fn positions_are_found_across_reserved_gaps_and_evictions() {
        // `count_through` guesses a position from the sequence; gaps (reserved numbers, events
        // put by another holder) and evictions must still give the searched answer.
        let now = Instant::now();
        let mut b = StreamBuffer::new(
            limits(6, 1 << 20, 60_000),
            Retained::new(u64::MAX).account(),
        );
        for step in 0..40u64 {
            match step % 7 {
                2 => {
                    b.reserve();
                }
                5 => {
                    b.put(b.last_seq() + 3, None, data(2), now);
                }
                _ => {
                    b.push(None, data(2), now);
                }
            }
            if step % 3 == 0 {
                b.set_floor(b.last_seq().saturating_sub(step % 4));
            }
            for seq in 0..=b.last_seq() + 2 {
                let searched = b.events.partition_point(|e| e.seq <= seq);
                assert_eq!(b.count_through(seq), searched, "step {step}, seq {seq}");
            }
        }
        assert!(b.evicted_through() > 0, "the bounds evicted some events");
    }

    #[test]
    fn r01_reserved_numbers_are_gaps_and_never_reused() {
        let now = Instant::now();
        let mut b = StreamBuffer::new(
            limits(10, 1 << 20, 60_000),
            Retained::new(u64::MAX).account(),
        );
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
    fn the_replay_window_keeps_max_events_sent_events() {
        let now = Instant::now();
        let mut b = StreamBuffer::new(
            limits(3, 1 << 20, 60_000),
            Retained::new(u64::MAX).account(),
        );
        let mut total = Evictions::default();
        for _ in 0..5 {
            total.count += push_sent(&mut b, 1, now).1.count;
        }
        assert_eq!(total.count, 1, "4 sent events in a window of 3");
        assert_eq!(
            seqs(&b, 1),
            Ok(vec![2, 3, 4, 5]),
            "3 sent, the newest unsent"
        );
        assert_eq!(seqs(&b, 0), Err(ReplayError::Evicted { oldest_kept: 2 }));
        assert_eq!(b.len(), 4);
    }

    #[test]
    fn the_replay_window_of_sent_bytes_keeps_the_newest_event() {
        let now = Instant::now();
        let mut b = StreamBuffer::new(limits(100, 10, 60_000), Retained::new(u64::MAX).account());
        for _ in 0..3 {
            assert_eq!(push_sent(&mut b, 4, now).1.bytes, 0);
        }
        let (_, ev) = push_sent(&mut b, 4, now);
        assert_eq!(ev.bytes, 1, "12 sent bytes in a window of 10");
        assert_eq!(seqs(&b, 1), Ok(vec![2, 3, 4]));
        let (_, ev) = push_sent(&mut b, 50, now);
        assert_eq!(ev.bytes, 1);
        assert_eq!(seqs(&b, 2), Ok(vec![3, 4, 5]));
        assert_eq!(
            b.bytes(),
            58,
            "the oversized newest event stays: nobody was sent it"
        );
    }

    #[test]
    fn eviction_by_ttl_leaves_a_tombstone() {
        let t0 = Instant::now();
        let mut b = StreamBuffer::new(
            limits(100, 1 << 20, 1_000),
            Retained::new(u64::MAX).account(),
        );
        push_sent(&mut b, 1, t0);
        push_sent(&mut b, 1, t0 + Duration::from_millis(600));
        assert_eq!(
            b.evict_expired(t0 + Duration::from_millis(999), false).ttl,
            0
        );
        assert_eq!(
            b.evict_expired(t0 + Duration::from_millis(1_000), false)
                .ttl,
            1
        );
        assert_eq!(
            b.evict_expired(t0 + Duration::from_millis(1_600), false)
                .ttl,
            0,
            "event 2 was not sent: a reader still needs it"
        );
        assert_eq!(
            b.evict_expired(t0 + Duration::from_millis(1_600), true).ttl,
            1,
            "nobody reads the stream: its client had the TTL to come back"
        );
        assert_eq!(b.len(), 0, "a tombstone");
        assert_eq!(b.last_seq(), 2);
        assert_eq!(seqs(&b, 2), Ok(vec![]), "nothing after the last event");
        assert_eq!(seqs(&b, 1), Err(ReplayError::Evicted { oldest_kept: 3 }));
    }

    #[test]
    fn the_pod_cap_is_shared_and_released() {
        let now = Instant::now();
        let budget = Retained::new(10);
        let mut a = StreamBuffer::new(limits(100, 1 << 20, 60_000), budget.account());
        let mut b = StreamBuffer::new(limits(100, 1 << 20, 60_000), budget.account());
        push_sent(&mut a, 6, now);
        push_sent(&mut a, 1, now);
        assert_eq!(budget.bytes(Kind::Buffers), 7);
        let (_, ev) = push_sent(&mut b, 6, now);
        assert_eq!(ev.pod_cap, 0, "b keeps its only event even over the cap");
        let (_, ev) = push_sent(&mut b, 1, now);
        assert_eq!(ev.pod_cap, 1);
        assert_eq!(budget.bytes(Kind::Buffers), 8);
        drop(a);
        assert_eq!(budget.bytes(Kind::Buffers), 1);
        drop(b);
        assert_eq!(budget.bytes(Kind::Buffers), 0);
    }

    #[test]
    fn unsent_events_are_never_evicted_and_fill_the_room() {
        let now = Instant::now();
        let budget = Retained::new(u64::MAX);
        let mut b = StreamBuffer::new(limits(3, 1 << 20, 60_000), budget.account());
        for _ in 0..3 {
            assert!(b.has_room());
            let (_, ev) = b.push(None, data(2), now);
            assert_eq!(ev, Evictions::default());
        }
        assert!(!b.has_room(), "maxEvents unsent events: the writer waits");
        assert_eq!(b.unsent(), (3, 6));
        // Pushed anyway (an error event that ends a request): kept over the bound.
        let (_, ev) = b.push(None, data(2), now);
        assert_eq!((ev, b.len()), (Evictions::default(), 4));
        assert_eq!(b.evict_sent(), 0);
        // A reader was sent events 1 and 2: room, and they stay in the replay window.
        b.set_floor(2);
        assert_eq!(b.unsent(), (2, 4));
        assert!(b.has_room());
        let (_, ev) = b.push(None, data(2), now);
        assert_eq!(ev, Evictions::default());
        // Sent all five: two more than the window of 3 go.
        b.set_floor(5);
        let (_, ev) = b.push(None, data(2), now);
        assert_eq!(ev.count, 2);
        assert_eq!(seqs(&b, 2), Ok(vec![3, 4, 5, 6]));
    }

    #[test]
    fn unsent_bytes_fill_the_room_and_so_does_the_pod_cap() {
        let now = Instant::now();
        let budget = Retained::new(100);
        let mut b = StreamBuffer::new(limits(100, 10, 60_000), budget.account());
        b.push(None, data(6), now);
        assert!(b.has_room());
        b.push(None, data(6), now);
        assert!(!b.has_room(), "12 unsent bytes of a maxBytes of 10");
        assert_eq!(budget.unsent(), 12);
        b.set_floor(1);
        assert_eq!(b.unsent(), (1, 6));
        assert_eq!(
            budget.unsent(),
            6,
            "the pod counts what its streams have not sent"
        );
        assert!(b.has_room());
        let mut other = StreamBuffer::new(limits(100, 1 << 20, 60_000), budget.account());
        other.push(None, data(90), now);
        assert!(!b.has_room() && !other.has_room(), "the pod's cap is over");
        let mut caught_up = StreamBuffer::new(limits(100, 1 << 20, 60_000), budget.account());
        assert!(
            caught_up.has_room(),
            "nothing unsent: one event at a time, whatever the pod"
        );
        caught_up.push(None, data(1), now);
        assert!(!caught_up.has_room());
        drop(caught_up);
        assert!(
            !budget.is_full(),
            "96 unsent bytes: evicting sent ones makes room"
        );
        assert_eq!(b.evict_sent(), 1);
        assert_eq!(budget.bytes(Kind::Buffers), 96);
        assert!(b.has_room(), "back under the pod's cap");
        other.push(None, data(4), now);
        assert!(budget.is_full());
        drop(other);
        assert_eq!((budget.bytes(Kind::Buffers), budget.unsent()), (6, 6));
    }

    #[test]
    fn events_numbered_elsewhere_keep_their_numbers_and_gaps() {
        let now = Instant::now();
        let mut b = StreamBuffer::new(
            limits(10, 1 << 20, 60_000),
            Retained::new(u64::MAX).account(),
        );
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
        let mut b = StreamBuffer::new(
            limits(10, 1 << 20, 60_000),
            Retained::new(u64::MAX).account(),
        );
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
        let mut b = StreamBuffer::new(
            limits(10, 1 << 20, 60_000),
            Retained::new(u64::MAX).account(),
        );
        b.follow(6, 8);
        assert_eq!((b.last_seq(), b.evicted_through()), (8, 8));
        assert_eq!(seqs(&b, 8), Ok(vec![]));
        assert_eq!(b.reserve(), 9);
        assert_eq!(b.put(9, None, data(1), now), None, "9 is taken");
        assert!(b.put(10, None, data(1), now).is_some());
        assert_eq!(seqs(&b, 9), Ok(vec![10]));
    }
}

//! A client connection's view of a [`Stream`]: [`Stream::attach`] gives a [`Feed`], which
//! yields the events after the reader's position from the stream's buffer, keep-alive comments
//! on silence, and the end (`docs/design/architecture.md#streams-and-the-replay-buffer`).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::watch;

use super::buffer::ReplayError;
use super::{Start, Stream};
use crate::mcp::cursor::EventId;
use crate::mcp::sse;

impl Stream {
    /// Attaches a new reader.
    ///
    /// - `take_over`: earlier readers end cleanly (a new GET for the same stream, spec T-09);
    ///   otherwise the reader joins them (a retried POST while its first connection lives).
    /// - `priming`: send a priming event first (negotiated ≥ 2025-11-25, spec R-05): with id
    ///   `<key>-0` for a reader from the start, or a reserved sequence number (unique in the
    ///   session, R-01) for a reader at the stream's end. A reader with events to catch up on
    ///   gets them at once instead, each with its id.
    pub(crate) fn attach(
        self: &Arc<Self>,
        start: Start,
        take_over: bool,
        priming: bool,
        keep_alive: Duration,
    ) -> Feed {
        let mut st = self.state.lock();
        if take_over {
            st.reader_gen += 1;
        }
        let after = match start {
            Start::After(seq) => seq,
            Start::Undelivered => st.delivered,
        };
        let reader = st.next_reader;
        st.next_reader += 1;
        st.readers.push(super::Reader { id: reader, after });
        st.refloor();
        let generation = st.reader_gen;
        // The priming id must not let a resuming client skip anything: sequence 0 is the
        // position before the first event; at the stream's end a reserved number is unique
        // and newer than every event. A reader with events to catch up on gets no priming event
        // (the events carry ids at once).
        let prime_at = match after {
            _ if !priming => None,
            a if a > 0 && st.following.is_some() => None,
            0 => Some(0),
            a if a == st.buffer.last_seq() => Some(st.buffer.reserve()),
            _ => None,
        };
        let prelude = prime_at.map(|seq| {
            let id = EventId {
                stream: self.key.clone(),
                seq,
            };
            sse::priming(&id, None)
        });
        drop(st);
        if take_over {
            // Wake earlier readers so they notice the take-over.
            self.changed.send_replace(());
        }
        Feed {
            stream: Arc::clone(self),
            reader,
            after,
            generation,
            rx: self.changed.subscribe(),
            keep_alive,
            prelude,
            closing: false,
        }
    }
}

/// Events are batched into one chunk up to this many bytes (at least one event): a client
/// catching up on a long buffer is written to in pieces, so each write's deadline
/// (`--client-write-timeout`) asks it the same pace as a live stream does.
pub(crate) const CHUNK_BYTES: usize = 64 * 1024;

/// The next thing to write to a client connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FeedItem {
    /// SSE bytes (events, a priming event or a keep-alive comment).
    Data(Bytes),
    /// The stream is over, or another connection took it over: end the response cleanly.
    End,
    /// Events this reader had not been sent were evicted (a reader slower than the buffer):
    /// abort the connection so the client resumes and learns `cursor_evicted`, rather than
    /// silently skipping them.
    Lost,
}

/// A client connection's view of a [`Stream`]. Dropping it detaches the reader.
#[derive(Debug)]
pub(crate) struct Feed {
    stream: Arc<Stream>,
    /// This reader's id among the stream's readers.
    reader: u64,
    /// The sequence this reader was sent up to.
    after: u64,
    generation: u64,
    rx: watch::Receiver<()>,
    keep_alive: Duration,
    prelude: Option<Bytes>,
    /// The `retry:` of a moved session was sent; the connection ends next.
    closing: bool,
}

impl Feed {
    /// Waits for the next item: buffered events after the reader's position (batched into
    /// chunks of about [`CHUNK_BYTES`]), else a keep-alive comment after `keep_alive` of silence, or the end.
    pub(crate) async fn next(&mut self) -> FeedItem {
        if let Some(prelude) = self.prelude.take() {
            return FeedItem::Data(prelude);
        }
        loop {
            self.rx.borrow_and_update();
            match self.poll_buffer() {
                Some(item) => return item,
                None => {
                    tokio::select! {
                        changed = self.rx.changed() => {
                            if changed.is_err() {
                                return FeedItem::End;
                            }
                        }
                        () = tokio::time::sleep(self.keep_alive) => {
                            return FeedItem::Data(Bytes::from_static(sse::KEEP_ALIVE));
                        }
                    }
                }
            }
        }
    }

    fn poll_buffer(&mut self) -> Option<FeedItem> {
        let mut st = self.stream.state.lock();
        if st.reader_gen != self.generation {
            return Some(FeedItem::End);
        }
        if self.closing {
            return Some(FeedItem::End);
        }
        let events = match st.buffer.events_after(self.after) {
            Ok(events) => events,
            Err(ReplayError::Ahead { .. }) if st.following.is_some() => return None,
            Err(_) => return Some(FeedItem::Lost),
        };
        let mut out = BytesMut::new();
        let mut last = self.after;
        for ev in events {
            let id = EventId {
                stream: self.stream.key.clone(),
                seq: ev.seq,
            };
            sse::put_event(&mut out, &id, ev.event.as_deref(), &ev.data);
            last = ev.seq;
            if out.len() >= CHUNK_BYTES {
                break;
            }
        }
        if last > self.after {
            self.after = last;
            st.delivered = st.delivered.max(last);
            if let Some(r) = st.readers.iter_mut().find(|r| r.id == self.reader) {
                r.after = last;
            }
            if st.refloor() {
                self.stream.room.notify_one();
            }
            return Some(FeedItem::Data(out.freeze()));
        }
        if let Some(hint) = st.moved_retry.filter(|_| !st.complete) {
            self.closing = true;
            return Some(FeedItem::Data(sse::retry(hint)));
        }
        st.complete.then_some(FeedItem::End)
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        let mut st = self.stream.state.lock();
        st.readers.retain(|r| r.id != self.reader);
        if st.refloor() {
            self.stream.room.notify_one();
        }
    }
}

//! What a listener knows of one connection, shared by the listener (`listener.rs`), the
//! connection's byte stream (`watched.rs`) and the request callbacks: where the current request
//! head stands against `--header-timeout`, whether pingora answered a head itself, and whether
//! the connection was refused a slot (`slots.rs`).
//!
//! pingora bounds each read of a request head (by its keep-alive timeout), not the whole head,
//! so a client trickling one byte at a time would hold a connection for as long as it likes.
//! The first head's clock starts when the connection is accepted — a connection that sends
//! nothing is not let hold a slot — and a later head's at its first byte — an idle keep-alive
//! connection waiting for its next request (at most pingora's keep-alive timeout) is not reading
//! a head. The clock stops when the application gets the parsed head.

use std::sync::atomic::{AtomicBool, Ordering};

use super::slots::Full;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Where the current request head of a connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Head {
    /// The proxy has the head of the request in progress: no head is being read.
    Delivered,
    /// The next head is awaited and nothing of it came yet (an idle keep-alive connection).
    Awaited,
    /// A head is due since this instant: its first byte, or for the connection's first head
    /// the moment it was accepted.
    Arriving(Instant),
}

impl Head {
    /// When a head in this state is overdue after `timeout`; `None` while no head arrives.
    pub(crate) fn deadline(self, timeout: Duration) -> Option<Instant> {
        match self {
            Head::Arriving(since) => Some(since + timeout),
            Head::Delivered | Head::Awaited => None,
        }
    }
}

/// Which listener a connection came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Port {
    /// The MCP port: clients only.
    Mcp,
    /// The peer port: peer messages and forwarded requests only; `tls` when the connection is
    /// mutual TLS with a certificate of the endpoint's CA.
    Peer {
        /// The connection is mutual TLS.
        tls: bool,
    },
    /// The admin port (`ops/admin.rs`).
    Admin,
}

/// One connection of the MCP or the peer listener.
#[derive(Debug)]
pub(crate) struct Connection {
    head: Mutex<Head>,
    /// A head is awaited or arriving (a cheap check for every read and write).
    pending: AtomicBool,
    /// Woken when a head starts arriving or is delivered.
    changed: Notify,
    /// Bytes were written while a head was pending: only pingora answers then, refusing it.
    refused_head: AtomicBool,
    refused: Option<Full>,
    port: Port,
}

impl Connection {
    /// A connection to `port` accepted at `accepted`, its first head due from then; `refused`
    /// when it got no slot (its first request is answered why, then it closes).
    pub(crate) fn new(refused: Option<Full>, port: Port, accepted: Instant) -> Self {
        Self {
            head: Mutex::new(Head::Arriving(accepted)),
            pending: AtomicBool::new(true),
            changed: Notify::new(),
            refused_head: AtomicBool::new(false),
            refused,
            port,
        }
    }

    /// The listener it came to.
    pub(crate) fn port(&self) -> Port {
        self.port
    }

    /// Why the connection got no slot, if it did not (its first request is refused).
    pub(crate) fn refused(&self) -> Option<Full> {
        self.refused
    }

    /// The next request's head is awaited (the listener, after each request).
    pub(crate) fn await_head(&self) {
        *self.head.lock() = Head::Awaited;
        self.pending.store(true, Ordering::Release);
    }

    /// Bytes arrived at `now` (the stream, on every read): the first ones of an awaited head
    /// start its clock.
    pub(crate) fn bytes_read(&self, now: Instant) {
        if !self.pending.load(Ordering::Acquire) {
            return;
        }
        let mut head = self.head.lock();
        if *head == Head::Awaited {
            *head = Head::Arriving(now);
            self.changed.notify_one();
        }
    }

    /// Bytes left for the client (the stream, on every write).
    pub(crate) fn bytes_written(&self) {
        if self.pending.load(Ordering::Acquire) {
            self.refused_head.store(true, Ordering::Relaxed);
        }
    }

    /// The proxy has the parsed head (its first callback of the request).
    pub(crate) fn head_delivered(&self) {
        self.pending.store(false, Ordering::Release);
        *self.head.lock() = Head::Delivered;
        self.changed.notify_one();
    }

    /// Whether pingora answered a head itself since the last call (a 400 or 405 it wrote
    /// before any callback of the sidecar ran).
    pub(crate) fn take_refused_head(&self) -> bool {
        self.refused_head.swap(false, Ordering::Relaxed)
    }

    /// Resolves once the head being read is still pending `timeout` after its first byte;
    /// never while no head arrives.
    pub(crate) async fn head_overdue(&self, timeout: Duration) {
        loop {
            let changed = self.changed.notified();
            let head = *self.head.lock();
            match head.deadline(timeout) {
                Some(at) => {
                    tokio::time::sleep_until(at).await;
                    if *self.head.lock() == head {
                        return;
                    }
                }
                None => changed.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(10);

    #[test]
    fn only_an_arriving_head_has_a_deadline() {
        let t = Instant::now();
        assert_eq!(Head::Delivered.deadline(TIMEOUT), None);
        assert_eq!(Head::Awaited.deadline(TIMEOUT), None);
        assert_eq!(Head::Arriving(t).deadline(TIMEOUT), Some(t + TIMEOUT));
    }

    /// Whether `conn.head_overdue` resolves within `wait` of virtual time.
    async fn overdue_within(conn: &Connection, wait: Duration) -> bool {
        tokio::time::timeout(wait, conn.head_overdue(TIMEOUT))
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_heads_clock_starts_at_accept() {
        let conn = Connection::new(None, Port::Mcp, Instant::now());
        assert!(
            overdue_within(&conn, TIMEOUT + Duration::from_millis(1)).await,
            "a connection that sends nothing is cut at the header deadline"
        );
        let conn = Connection::new(None, Port::Mcp, Instant::now());
        tokio::time::advance(TIMEOUT / 2).await;
        conn.bytes_read(Instant::now());
        assert!(
            overdue_within(&conn, TIMEOUT / 2 + Duration::from_millis(1)).await,
            "its first byte does not restart the clock"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_heads_clock_starts_at_its_first_byte() {
        let conn = Connection::new(None, Port::Mcp, Instant::now());
        conn.head_delivered();
        conn.await_head();
        assert!(
            !overdue_within(&conn, 3 * TIMEOUT).await,
            "an idle keep-alive connection is not reading a head"
        );
        conn.bytes_read(Instant::now());
        tokio::time::advance(TIMEOUT / 2).await;
        conn.bytes_read(Instant::now());
        assert!(
            overdue_within(&conn, TIMEOUT).await,
            "later bytes do not restart the clock"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivered_head_is_never_overdue() {
        let conn = Connection::new(None, Port::Mcp, Instant::now());
        let waiting = conn.head_overdue(TIMEOUT);
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(TIMEOUT / 2, waiting.as_mut())
                .await
                .is_err()
        );
        conn.head_delivered();
        assert!(tokio::time::timeout(3 * TIMEOUT, waiting).await.is_err());
        conn.bytes_read(Instant::now());
        assert!(
            !overdue_within(&conn, 3 * TIMEOUT).await,
            "a body's bytes start no clock"
        );
    }

    #[test]
    fn a_write_while_a_head_is_pending_is_pingora_refusing_it() {
        let conn = Connection::new(None, Port::Mcp, Instant::now());
        conn.bytes_written();
        assert!(
            conn.take_refused_head(),
            "an answer before the first head is delivered"
        );
        conn.await_head();
        conn.bytes_read(Instant::now());
        conn.bytes_written();
        assert!(conn.take_refused_head());
        assert!(!conn.take_refused_head(), "taken once");
        conn.await_head();
        conn.head_delivered();
        conn.bytes_written();
        assert!(!conn.take_refused_head(), "the proxy's own answer");
    }
}

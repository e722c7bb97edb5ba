//! The MCP listener's connections: pingora's HTTP/1 keep-alive loop around the proxy
//! ([`McpListener`]), with the limits a trusted proxy puts on its clients
//! (`docs/design/architecture.md#connection-limits`):
//!
//! - at most `--max-connections` connections hold a [`Slot`]; the first request of one beyond
//!   is answered 503 `too_many_connections` by the proxy, and the connection closed;
//! - a request head still arriving `--header-timeout` after its first byte closes the
//!   connection ([`Connection::head_overdue`]): pingora's read timeout bounds each read only;
//! - heads pingora answers itself (400: malformed, over its fixed 256 header fields or 1 MiB of
//!   head; 405: `CONNECT`) are counted.
//!
//! A connection's [`Connection`] reaches each of its requests as pingora's connection user
//! context, which the proxy hands to `ProxyHttp::on_connection_reuse` before any other
//! callback — for every request, the first included, since the listener sets it each time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::Stream;
use pingora::protocols::http::ServerSession;
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;

use super::McpProxy;
use super::connection::Connection;
use super::watched::Watched;
use crate::metrics::Metrics;

/// Seconds an idle keep-alive connection waits for its next request (pingora's own default).
const KEEPALIVE_SECS: u64 = 60;

/// The connection limits of the MCP listener (from flags).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnectionLimits {
    /// Most open connections (`--max-connections`).
    pub(crate) max_connections: usize,
    /// How long a request head may take from its first byte (`--header-timeout`).
    pub(crate) header_timeout: Duration,
}

/// The open connections that count against `--max-connections`.
#[derive(Debug)]
pub(crate) struct Slots {
    open: AtomicUsize,
    max: usize,
}

/// One connection's place among the [`Slots`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot(Arc<Slots>);

impl Slots {
    /// Room for `max` connections.
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            open: AtomicUsize::new(0),
            max,
        })
    }

    /// A place for one more connection; `None` when all `max` are taken.
    pub(crate) fn take(self: &Arc<Self>) -> Option<Slot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(Arc::clone(self)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An open connection: counted in `tether_client_connections` until dropped.
struct Open {
    metrics: Arc<Metrics>,
    _slot: Option<Slot>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.metrics.client_connection(false);
    }
}

/// The MCP listener's application: every accepted connection, its requests served by the
/// proxy.
pub(crate) struct McpListener {
    proxy: Arc<HttpProxy<McpProxy>>,
    slots: Arc<Slots>,
    header_timeout: Duration,
    metrics: Arc<Metrics>,
}

impl McpListener {
    /// The listener serving `proxy` within `limits`.
    pub(crate) fn new(
        proxy: HttpProxy<McpProxy>,
        limits: ConnectionLimits,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            proxy: Arc::new(proxy),
            slots: Slots::new(limits.max_connections),
            header_timeout: limits.header_timeout,
            metrics,
        }
    }

    /// Serves the requests of one connection, one after the other, as long as it is kept
    /// alive and every request head arrives in time.
    async fn serve(&self, stream: Stream, conn: &Arc<Connection>, shutdown: &ShutdownWatch) {
        let mut session = ServerSession::new_http1(stream);
        session.set_keepalive((!*shutdown.borrow()).then_some(KEEPALIVE_SECS));
        loop {
            conn.await_head();
            session.set_connection_user_context(Some(Box::new(Arc::clone(conn))));
            // Counted before the connection is dropped, so whoever sees it closed sees it counted.
            let overdue = async {
                conn.head_overdue(self.header_timeout).await;
                self.metrics.header_timeout();
            };
            let served = tokio::select! {
                served = self.proxy.process_new_http(session, shutdown) => served,
                () = overdue => {
                    tracing::debug!("request head not complete within --header-timeout; closing");
                    return;
                }
            };
            if conn.take_refused_head() {
                self.metrics.request_head_refused();
            }
            let Some(reused) = served else { return };
            let (stream, settings) = reused.consume();
            session = ServerSession::new_http1(stream);
            if let Some(settings) = settings {
                settings.apply_to_session(&mut session);
            }
        }
    }
}

#[async_trait]
impl ServerApp for McpListener {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let slot = self.slots.take();
        let conn = Arc::new(Connection::new(slot.is_none()));
        self.metrics.client_connection(true);
        let _open = Open {
            metrics: Arc::clone(&self.metrics),
            _slot: slot,
        };
        let stream = Box::new(Watched::new(stream, Arc::clone(&conn)));
        self.serve(stream, &conn, shutdown).await;
        None
    }

    async fn cleanup(&self) {
        self.proxy.http_cleanup().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_and_given_back() {
        let slots = Slots::new(2);
        let a = slots.take();
        let b = slots.take();
        assert!(a.is_some() && b.is_some());
        assert!(slots.take().is_none(), "a third connection is over the cap");
        drop(a);
        assert!(slots.take().is_some(), "a closed connection frees its slot");
    }
}

//! The connections of the MCP and the peer listener: pingora's HTTP/1 keep-alive loop around
//! the proxy ([`McpListener`]), with the limits a trusted proxy puts on its clients
//! (`docs/design/architecture.md#connection-limits`):
//!
//! - at most `--max-connections` connections hold a [`Slot`]; the first request of one beyond
//!   is answered 503 `too_many_connections` by the proxy, and the connection closed;
//! - a request head still arriving `--header-timeout` after its first byte closes the
//!   connection ([`Connection::head_overdue`]): pingora's read timeout bounds each read only;
//! - heads pingora answers itself (400: malformed, over its fixed 256 header fields or 1 MiB of
//!   head; 405: `CONNECT`) are counted.
//!
//! The peer port ([`Listening::Peer`], `docs/design/peer-trust.md#transport`) tells a TLS
//! connection from a plaintext one by its first byte (a TLS handshake record starts with
//! `0x16`, no HTTP method does): TLS is accepted with the key ring's current configuration
//! (mutual: a client certificate of the endpoint's CA is required); plaintext only when peer
//! TLS is off, or from a sidecar of the first peer protocol (which then may send only that
//! protocol's messages). A TLS connection that negotiated `h2` carries its requests as HTTP/2
//! streams, each served in a task of its own, at most `--peer-max-streams` at once. The peer
//! port's connections are counted in `tether_peer_connections`, not among the clients'.
//!
//! A connection's [`Connection`] reaches each of its requests as pingora's connection user
//! context, which the proxy hands to `ProxyHttp::on_connection_reuse` before any other
//! callback — for every request, the first included, since the listener sets it each time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::http::v2::server::{self as h2_server, H2Accept};
use pingora::protocols::{ALPN, Digest, Stream};
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;

use super::connection::{Connection, Port};
use super::watched::Watched;
use super::{McpProxy, PEER_STREAM_WINDOW, peer_connection_window};
use crate::keys::KeyRing;
use crate::metrics::Metrics;

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// Which listener an [`McpListener`] serves.
#[derive(Clone, Debug)]
pub(crate) enum Listening {
    /// The MCP port.
    Mcp,
    /// The peer port.
    Peer {
        /// The key ring whose TLS configuration is used for each new connection.
        keys: KeyRing,
        /// Peer TLS is on (`spec.peer.tls`).
        tls: bool,
        /// Plaintext connections of first-protocol sidecars are taken (`--peer-min-protocol 1`).
        accept_first: bool,
        /// Most requests at once on one HTTP/2 connection (`--peer-max-streams`).
        max_streams: u32,
    },
}

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

/// An open connection: counted in `tether_client_connections` (or, on the peer port,
/// `tether_peer_connections`) until dropped.
struct Open {
    metrics: Arc<Metrics>,
    peer: bool,
    _slot: Option<Slot>,
}

impl Open {
    fn new(metrics: &Arc<Metrics>, peer: bool, slot: Option<Slot>) -> Self {
        metrics.connection(peer, true);
        Self {
            metrics: Arc::clone(metrics),
            peer,
            _slot: slot,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.metrics.connection(self.peer, false);
    }
}

/// The application of the MCP or the peer listener: every accepted connection, its requests
/// served by the proxy.
pub(crate) struct McpListener {
    proxy: Arc<HttpProxy<McpProxy>>,
    slots: Arc<Slots>,
    header_timeout: Duration,
    metrics: Arc<Metrics>,
    listening: Listening,
}

impl McpListener {
    /// The listener serving `proxy` within `limits`, as `listening` says.
    pub(crate) fn new(
        proxy: Arc<HttpProxy<McpProxy>>,
        limits: ConnectionLimits,
        metrics: Arc<Metrics>,
        listening: Listening,
    ) -> Self {
        Self {
            proxy,
            slots: Slots::new(limits.max_connections),
            header_timeout: limits.header_timeout,
            metrics,
            listening,
        }
    }

    /// Which port a new connection is on: on the peer port, TLS when its first byte starts a
    /// handshake; `None` closes it (a plaintext peer when TLS is required, nothing sent within
    /// `--header-timeout`).
    async fn port(&self, stream: &mut Stream) -> Option<Port> {
        let Listening::Peer {
            tls, accept_first, ..
        } = &self.listening
        else {
            return Some(Port::Mcp);
        };
        let mut first = [0u8; 1];
        let peeked = tokio::time::timeout(self.header_timeout, stream.try_peek(&mut first)).await;
        if !matches!(peeked, Ok(Ok(true))) {
            return None;
        }
        if first[0] == TLS_HANDSHAKE {
            return Some(Port::Peer { tls: true });
        }
        (!*tls || *accept_first).then_some(Port::Peer { tls: false })
    }

    /// Accepts mutual TLS on `stream` with the key ring's current configuration; `None` (the
    /// connection closes) when the handshake fails or takes longer than `--header-timeout`.
    async fn handshake(&self, stream: Watched) -> Option<Stream> {
        let Listening::Peer { keys, .. } = &self.listening else {
            return Some(Box::new(stream));
        };
        let config = Arc::clone(&keys.load().tls()?.server);
        let acceptor = pingora::listeners::tls::Acceptor::from_server_config(config);
        match tokio::time::timeout(self.header_timeout, acceptor.tls_handshake(stream)).await {
            Ok(Ok(secured)) => Some(Box::new(secured)),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "peer TLS handshake failed");
                self.metrics.peer_auth_failure("tls");
                None
            }
            Err(_) => {
                self.metrics.peer_auth_failure("tls");
                None
            }
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

    /// Serves the HTTP/2 streams of one peer connection, each in a task of its own. The
    /// connection closes when the peer closes it, after [`KEEPALIVE_SECS`] without a stream,
    /// after [`MAX_MALFORMED_STREAMS`] streams refused as malformed, or at shutdown (a GOAWAY,
    /// then once its streams ended).
    async fn serve_h2(&self, stream: Stream, max_streams: u32, shutdown: &ShutdownWatch) {
        let digest = Arc::new(Digest {
            ssl_digest: stream.get_ssl_digest(),
            timing_digest: stream.get_timing_digest(),
            proxy_digest: stream.get_proxy_digest(),
            socket_digest: stream.get_socket_digest(),
        });
        let mut options = h2_server::default_h2_options();
        options.max_concurrent_streams(max_streams);
        options.initial_window_size(PEER_STREAM_WINDOW);
        options.initial_connection_window_size(peer_connection_window(max_streams));
        let mut conn = match h2_server::handshake(stream, Some(options)).await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::debug!(error = %e, "peer HTTP/2 handshake failed");
                return;
            }
        };
        let active = Arc::new(tokio::sync::watch::channel(0usize).0);
        let mut shutdown = shutdown.clone();
        let mut closing = *shutdown.borrow();
        if closing {
            conn.graceful_shutdown();
        }
        let mut malformed = 0;
        loop {
            let idle = async {
                let mut streams = active.subscribe();
                let _ = streams.wait_for(|n| *n == 0).await;
                tokio::time::sleep(Duration::from_secs(KEEPALIVE_SECS)).await;
            };
            let accepted = tokio::select! {
                biased;
                _ = shutdown.changed(), if !closing => {
                    conn.graceful_shutdown();
                    closing = true;
                    continue;
                }
                accepted = h2_server::HttpSession::from_h2_conn(&mut conn, Arc::clone(&digest)) => accepted,
                () = idle, if !closing => return,
            };
            let h2_stream = match accepted {
                Ok(Some(H2Accept::Session(h2_stream))) => h2_stream,
                Ok(Some(H2Accept::Rejected)) => {
                    malformed += 1;
                    if malformed >= MAX_MALFORMED_STREAMS {
                        return;
                    }
                    continue;
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "peer HTTP/2 connection ended");
                    return;
                }
            };
            let proxy = Arc::clone(&self.proxy);
            let shutdown = shutdown.clone();
            let serving = Serving::new(&active);
            tokio::spawn(async move {
                let _serving = serving;
                proxy
                    .process_new_http(ServerSession::new_http2(h2_stream), &shutdown)
                    .await;
            });
        }
    }
}

/// Streams of one HTTP/2 connection refused as malformed before the connection is closed.
const MAX_MALFORMED_STREAMS: usize = 32;

/// One HTTP/2 stream being served, counted in its connection's active streams until dropped.
struct Serving(Arc<tokio::sync::watch::Sender<usize>>);

impl Serving {
    fn new(active: &Arc<tokio::sync::watch::Sender<usize>>) -> Self {
        active.send_modify(|n| *n += 1);
        Self(Arc::clone(active))
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

#[async_trait]
impl ServerApp for McpListener {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let mut stream = stream;
        let peer = matches!(self.listening, Listening::Peer { .. });
        let slot = self.slots.take();
        let over_cap = slot.is_none();
        let _open = Open::new(&self.metrics, peer, slot);
        let port = self.port(&mut stream).await?;
        let conn = Arc::new(Connection::new(over_cap, port));
        let watched = Watched::new(stream, Arc::clone(&conn));
        let stream = match port {
            Port::Peer { tls: true } => self.handshake(watched).await?,
            _ => Box::new(watched),
        };
        if let Listening::Peer { max_streams, .. } = self.listening
            && stream.selected_alpn_proto() == Some(ALPN::H2)
        {
            self.serve_h2(stream, max_streams, shutdown).await;
            return None;
        }
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

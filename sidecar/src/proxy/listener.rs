//! The connections of the MCP, the peer and the admin listener: pingora's HTTP/1 keep-alive
//! loop around the application — the proxy, or the admin endpoints — ([`Listener`]), with the
//! limits a trusted proxy puts on its clients (`docs/design/architecture.md#connection-limits`):
//!
//! - each listener keeps at most its cap of connections open, and at most its per-source cap
//!   from one source address ([`Slots`]); the first request of a connection beyond is answered
//!   503 `too_many_connections` (429 `source_connections` beyond the per-source cap; on the admin
//!   port a plain 503), and the connection closed — or closed at once when a sixteenth of the
//!   cap are being refused already;
//! - a connection's first request head must be complete `--header-timeout` after the
//!   connection was accepted (a connection that sends nothing holds no slot for longer), a later
//!   head `--header-timeout` after its first byte ([`Connection::head_overdue`]): pingora's read
//!   timeout bounds each read only;
//! - heads pingora answers itself (400: malformed, over its fixed 256 header fields or 1 MiB of
//!   head; 405: `CONNECT`) are counted.
//!
//! The peer port ([`Listening::Peer`], `docs/design/peer-protocol.md#transport`) tells a TLS
//! connection from a plaintext one by its first byte (a TLS handshake record starts with
//! `0x16`, no HTTP method does): TLS is accepted with the key ring's current configuration
//! (mutual: a client certificate of the endpoint's CA is required); plaintext only when peer
//! TLS is off, otherwise the connection is closed before a byte is read. A TLS connection that negotiated `h2` carries its requests as HTTP/2
//! streams, each served in a task of its own, at most `--peer-max-streams` at once. The peer
//! port's connections are counted in `tether_peer_connections`, the admin port's in
//! `tether_admin_connections`, not among the clients'.
//!
//! A connection's [`Connection`] reaches each of its requests as pingora's connection user
//! context, which the proxy takes in `ProxyHttp::on_connection_reuse` before any other
//! callback — for every request, the first included, since the listener sets it each time —
//! and the admin endpoints through [`HeadTimed`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::{Response, StatusCode, header};
use pingora::apps::http_app::ServeHttp;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::http::v2::server::{self as h2_server, H2Accept};
use pingora::protocols::{ALPN, Digest, Stream};
use pingora::server::ShutdownWatch;
use tokio::time::Instant;

use super::connection::{Connection, Port};
use super::metrics::{ListenerName, ProxyMetrics};
use super::slots::{Full, Slot, SlotLimits, Slots, Taken};
use super::watched::Watched;
use super::{PEER_STREAM_WINDOW, peer_connection_window};
use crate::handoff::metrics::HandoffMetrics;
use crate::keys::KeyRing;
use crate::peer::auth::AuthFailure;

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// Which listener a [`Listener`] serves.
#[derive(Clone, Debug)]
pub(crate) enum Listening {
    /// The MCP port.
    Mcp,
    /// The admin port.
    Admin,
    /// The peer port.
    Peer {
        /// The key ring whose TLS configuration is used for each new connection.
        keys: KeyRing,
        /// Peer TLS is on (`spec.peer.tls`).
        tls: bool,
        /// Most requests at once on one HTTP/2 connection (`--peer-max-streams`).
        max_streams: u32,
        /// Where connections refused before a request are counted (TLS, plaintext).
        refusals: Arc<HandoffMetrics>,
    },
}

/// Seconds an idle keep-alive connection waits for its next request (pingora's own default).
const KEEPALIVE_SECS: u64 = 60;

/// The connection limits of a listener (from flags).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnectionLimits {
    /// Most open connections, in all and from one source address (`--max-connections`,
    /// `--max-connections-per-source`; `--admin-max-connections…` on the admin port).
    pub(crate) slots: SlotLimits,
    /// How long a request head may take: the first from the connection's accept, a later one
    /// from its first byte (`--header-timeout`).
    pub(crate) header_timeout: Duration,
}

impl Listening {
    /// The value of the `listener` label of the connection metrics.
    fn name(&self) -> ListenerName {
        match self {
            Listening::Mcp => ListenerName::Mcp,
            Listening::Admin => ListenerName::Admin,
            Listening::Peer { .. } => ListenerName::Peer,
        }
    }
}

/// An open connection: counted in `tether_client_connections` (or `tether_peer_connections`,
/// `tether_admin_connections`) until dropped.
struct Open {
    metrics: Arc<ProxyMetrics>,
    listener: ListenerName,
    _slot: Slot,
}

impl Open {
    fn new(metrics: &Arc<ProxyMetrics>, listener: ListenerName, slot: Slot) -> Self {
        metrics.connection(listener, true);
        Self {
            metrics: Arc::clone(metrics),
            listener,
            _slot: slot,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.metrics.connection(self.listener, false);
    }
}

/// A listener: every accepted connection, its requests served by the application `A` (the
/// proxy on the MCP and the peer port, the admin endpoints on the admin port).
pub(crate) struct Listener<A> {
    app: Arc<A>,
    slots: Arc<Slots>,
    header_timeout: Duration,
    metrics: Arc<ProxyMetrics>,
    listening: Listening,
}

impl<A: HttpServerApp + Send + Sync + 'static> Listener<A> {
    /// The listener serving `app` within `limits`, as `listening` says.
    pub(crate) fn new(
        app: Arc<A>,
        limits: ConnectionLimits,
        metrics: Arc<ProxyMetrics>,
        listening: Listening,
    ) -> Self {
        Self {
            app,
            slots: Slots::new(limits.slots),
            header_timeout: limits.header_timeout,
            metrics,
            listening,
        }
    }

    /// Which port a new connection is on: on the peer port, TLS when its first byte starts a
    /// handshake; `None` closes it (plaintext when TLS is required, counted `plaintext`; nothing
    /// sent within `--header-timeout`).
    async fn port(&self, stream: &mut Stream) -> Option<Port> {
        let (tls, refusals) = match &self.listening {
            Listening::Mcp => return Some(Port::Mcp),
            Listening::Admin => return Some(Port::Admin),
            Listening::Peer { tls, refusals, .. } => (*tls, refusals),
        };
        let mut first = [0u8; 1];
        let peeked = tokio::time::timeout(self.header_timeout, stream.try_peek(&mut first)).await;
        if !matches!(peeked, Ok(Ok(true))) {
            return None;
        }
        if first[0] == TLS_HANDSHAKE {
            return Some(Port::Peer { tls: true });
        }
        if tls {
            refusals.peer_auth_failure(AuthFailure::Plaintext);
            return None;
        }
        Some(Port::Peer { tls: false })
    }

    /// Accepts mutual TLS on `stream` with the key ring's current configuration; `None` (the
    /// connection closes) when the handshake fails or takes longer than `--header-timeout`.
    async fn handshake(&self, stream: Watched) -> Option<Stream> {
        let Listening::Peer { keys, refusals, .. } = &self.listening else {
            return Some(Box::new(stream));
        };
        let config = Arc::clone(&keys.load().tls()?.server);
        let acceptor = pingora::listeners::tls::Acceptor::from_server_config(config);
        match tokio::time::timeout(self.header_timeout, acceptor.tls_handshake(stream)).await {
            Ok(Ok(secured)) => Some(Box::new(secured)),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "peer TLS handshake failed");
                refusals.peer_auth_failure(AuthFailure::Tls);
                None
            }
            Err(_) => {
                refusals.peer_auth_failure(AuthFailure::Tls);
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
            session.set_connection_user_context(Some(Box::new(Arc::clone(conn))));
            // Counted before the connection is dropped, so whoever sees it closed sees it counted.
            let overdue = async {
                conn.head_overdue(self.header_timeout).await;
                self.metrics.header_timeout();
            };
            let served = tokio::select! {
                served = self.app.process_new_http(session, shutdown) => served,
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
            conn.await_head();
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
            let app = Arc::clone(&self.app);
            let shutdown = shutdown.clone();
            let serving = Serving::new(&active);
            tokio::spawn(async move {
                let _serving = serving;
                app.process_new_http(ServerSession::new_http2(h2_stream), &shutdown)
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
impl<A: HttpServerApp + Send + Sync + 'static> ServerApp for Listener<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let accepted = Instant::now();
        let mut stream = stream;
        let source = stream
            .get_socket_digest()
            .and_then(|digest| digest.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
        // A refused connection holds a slot only while it is answered; none: closed at once.
        let (slot, refused) = match self.slots.take(source) {
            Taken::Open(slot) => (Some(slot), None),
            Taken::Answer { full, refusing } => (Some(refusing), Some(full)),
            Taken::Close(full) => (None, Some(full)),
        };
        if let Some(full) = refused {
            self.metrics.connection_refused(self.listening.name(), full);
        }
        let slot = slot?;
        let _open = Open::new(&self.metrics, self.listening.name(), slot);
        let port = self.port(&mut stream).await?;
        let conn = Arc::new(Connection::new(refused, port, accepted));
        let watched = Watched::new(stream, Arc::clone(&conn));
        let stream = match port {
            Port::Peer { tls: true } => {
                let secured = self.handshake(watched).await?;
                // The handshake's own writes answer no request head.
                conn.take_refused_head();
                secured
            }
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
        self.app.http_cleanup().await;
    }
}

/// An application served by a [`Listener`] other than the proxy (the admin endpoints): each
/// request's head is marked delivered (its deadline met), and the first request of a connection
/// refused a slot is answered 503 and the connection closed.
pub(crate) struct HeadTimed<S>(pub(crate) S);

#[async_trait]
impl<S: ServeHttp + Send + Sync> ServeHttp for HeadTimed<S> {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let conn = session
            .take_connection_user_context()
            .and_then(|context| context.downcast::<Arc<Connection>>().ok());
        if let Some(conn) = &conn {
            conn.head_delivered();
        }
        if let Some(full) = conn.and_then(|c| c.refused()) {
            session.set_keepalive(None);
            let why = match full {
                Full::Source => "too many connections from this address",
                Full::Listener => "too many connections",
            };
            let body = format!("{why}; retry after Retry-After\n").into_bytes();
            return Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .header(header::RETRY_AFTER, "1")
                .header(header::CONTENT_TYPE, "text/plain")
                .header(header::CONTENT_LENGTH, body.len())
                .body(body)
                .unwrap_or_default();
        }
        self.0.response(session).await
    }
}

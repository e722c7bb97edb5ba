//! The pingora side of the data plane: a [`ProxyHttp`] whose `request_filter` carries out each
//! request's [`Lane`], decided in `lane.rs` (admission, locating and entering its session,
//! routing, era), and serves sessionful ones through the [`Broker`]. The callbacks decide
//! nothing of their own.
//!
//! - Sessionful requests (2025-03-26 … 2025-11-25) are answered by the sidecar itself: the body
//!   is read (bounded in size and time), the broker produces a [`Reply`], and SSE replies are
//!   written event by event from the stream buffer, each chunk flushed at once.
//! - Stateless requests (2026-07-28) are read (bounded), their standard headers checked against
//!   the body ([`crate::mcp::modern`]), and relayed to the upstream by the broker without a
//!   session (`broker::stateless`): `Mcp-Session-Id` and `Last-Event-ID` are dropped (spec S-10,
//!   R-08), and a client disconnect drops the relay, which is the cancellation (spec L-05). An
//!   unknown version of an endpoint that admits 2026-07-28 gets MCP's
//!   `UnsupportedProtocolVersionError` with the request's id. Task ids are opened on the way in
//!   and sealed on the way out (`docs/design/tasks.md`).
//! - Requests for a session held by another pod, `tasks/*` requests whose `Mcp-Name` names a task
//!   of another pod, retries of multi round-trip requests whose `requestState` another pod
//!   issued (their body read first and resent from pingora's 64 KiB retry buffer; a larger one
//!   is served here), and requests without a session on a draining pod, are forwarded to the peer [`crate::cluster::routing`] picks, through pingora's proxy path: the
//!   client's headers and the peer's status, headers and body pass unchanged (SSE chunks are
//!   written as they arrive), with the signed hop headers added. A peer that cannot be reached is
//!   skipped and the next candidate tried.
//! - Every response, errors included, carries the CORS headers
//!   (`o02_fr24_bad_origin_is_403_and_listed_or_missing_origins_pass`).
//! - Connections are accepted by the [`Listener`] (`listener.rs`), which bounds their number (in
//!   all and per source address) and the time a request head may take; each write to a client may wait at most
//!   `--client-write-timeout`.

mod connection;
mod forward;
mod lane;
mod listener;
pub(crate) mod metrics;
mod respond;
mod slots;
mod watched;

pub(crate) use listener::{ConnectionLimits, HeadTimed, Listener, Listening};
pub(crate) use slots::SlotLimits;

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use connection::{Connection, Port};
use forward::{Failure, Forwarding, Next, World, failed_answer, is_connect_error};
use http::{HeaderValue, StatusCode, header};
use lane::{BodySource, Head, Lane, Lanes, StatelessRequest};
use pingora::http::RequestHeader;
use pingora::prelude::HttpPeer;
use pingora::protocols::ALPN;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{ErrorSource, ErrorType};
use tether_crds::keyring::PEER_SERVER_NAME;

use crate::broker::Broker;
use crate::cluster::routing::Router;
use crate::handoff::Handoff;
use crate::handoff::listener::PeerListener;
use crate::lifecycle::Lifecycle;
use crate::mcp::admission::{AdmissionPolicy, Admitted};
use crate::mcp::headers::MCP_NAME;
use crate::mcp::jsonrpc::Message;
use crate::mcp::modern;
use crate::mcp::origin::OriginCheck;
use crate::mcp::tasks::Revision;
use crate::peer::auth::now_ms;
use crate::peer::hop::{HOP_HEADERS, Signing};
use crate::peer::{PROTOCOL, TETHER_PEER_PROTOCOL};
use crate::proxy::metrics::{ForwardOutcome, ProxyMetrics};
use crate::reply::{Reply, ReplyBody};

/// How long connecting to a peer sidecar may take before the next candidate is tried: the TCP
/// connection and, with peer TLS, its handshake (pingora bounds both with it).
pub(crate) const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a request for a session being handed off waits for the handoff to end before it
/// gets 503 + `Retry-After`.
pub(crate) const MOVE_WAIT: Duration = Duration::from_secs(5);
/// Idle pooled connections to peers are closed after this long (shorter than a peer's own
/// keep-alive timeout, so a pooled connection is never stale).
pub(crate) const PEER_IDLE_TIMEOUT: Duration = Duration::from_secs(20);
/// Bytes of one stream in flight on an HTTP/2 connection between peers (its receive window, on
/// either side): SSE events are small, and a reader slower than the peer holds no more than this.
const PEER_STREAM_WINDOW: u32 = 256 * 1024;
/// The largest HTTP/2 window (RFC 9113 §6.9.1).
const H2_MAX_WINDOW: u32 = (1 << 31) - 1;

/// The receive window of an HTTP/2 connection between peers with `max_streams` streams, in
/// bytes: room for every stream's [`PEER_STREAM_WINDOW`], so a stream whose reader is slow (or
/// a message waiting for its slot) never stalls the others. With the protocol's default of
/// 64 KiB, the few dozen pushes and tails of a drain sharing one connection were paced by how
/// fast the busy receiver read them.
fn peer_connection_window(max_streams: u32) -> u32 {
    PEER_STREAM_WINDOW
        .saturating_mul(max_streams)
        .min(H2_MAX_WINDOW)
}

/// The MCP endpoint service: the pingora callbacks of the MCP listener.
pub(crate) struct McpProxy {
    /// Serves sessionful requests held here.
    pub(crate) broker: Arc<Broker>,
    /// Where requests of sessions held elsewhere go.
    pub(crate) router: Router,
    /// Admission; read per request, so a reload ([`crate::config::reload`]) applies to the next.
    pub(crate) policy: Arc<ArcSwap<AdmissionPolicy>>,
    /// Whether this pod drains.
    pub(crate) lifecycle: Arc<Lifecycle>,
    /// Requests, retries and forwards are counted here (rejections in the broker's metrics).
    pub(crate) metrics: Arc<ProxyMetrics>,
    /// How long a request body may take to arrive (slow clients get 408).
    pub(crate) body_timeout: Duration,
    /// Bounds each read from a peer a request was forwarded to: it exceeds the peer's own
    /// upstream deadline and keep-alive interval, so only a peer that stopped answering hits it.
    pub(crate) peer_read_timeout: Duration,
    /// Bounds each write to the client (a client that stopped reading is cut off).
    pub(crate) client_write_timeout: Duration,
    /// The peer protocol's messages on the peer port.
    pub(crate) peer: Arc<PeerListener>,
    /// This pod's peer port (`spec.peer.port`), where forwards go (a peer's own port when
    /// membership knows it).
    pub(crate) peer_port: u16,
    /// Peer traffic is mutual TLS (`spec.peer.tls`).
    pub(crate) peer_tls: bool,
    /// Most requests at once on one HTTP/2 connection to a peer (`--peer-max-streams`).
    pub(crate) peer_max_streams: u32,
    /// Takes back a session whose new holder left before a request for it came here.
    pub(crate) handoff: Arc<Handoff>,
}

impl McpProxy {
    /// What this request's lane is decided from ([`Lanes::decide`]), with the admission
    /// policy as loaded now.
    fn lanes(&self) -> Lanes<'_> {
        Lanes {
            broker: &self.broker,
            router: &self.router,
            policy: self.policy.load_full(),
            lifecycle: &self.lifecycle,
            handoff: &self.handoff,
            metrics: &self.metrics,
            body_timeout: self.body_timeout,
        }
    }

    /// Serves a 2026-07-28 request here ([`Lane::Stateless`]): its sealed values
    /// opened, then relayed to the upstream (`broker::stateless`). Errors carry the request's
    /// id.
    async fn serve_stateless(&self, admitted: &Admitted, request: StatelessRequest) -> Reply {
        let StatelessRequest { mut body, envelope } = request;
        let (mut id, mut rpc) = (None, None);
        let mut headers = std::borrow::Cow::Borrowed(&admitted.headers);
        if let Some(mut envelope) = envelope {
            id = envelope.first_request_id();
            let named;
            (body, named) =
                match self
                    .broker
                    .open_sealed(&mut envelope, body, Revision::Extension, || {
                        self.broker.request_owner(&admitted.headers)
                    }) {
                    Ok(opened) => opened,
                    Err(rejection) => {
                        return self.broker.task_miss_reply(
                            &rejection,
                            &envelope,
                            Revision::Extension,
                        );
                    }
                };
            if let Some(upstream) = named {
                headers
                    .to_mut()
                    .insert(MCP_NAME, modern::header_value(&upstream));
            }
            rpc = match envelope.messages.first() {
                Some((Message::Request { method, .. }, _)) => Some(method.clone()),
                _ => None,
            };
        }
        match self
            .broker
            .stateless(
                admitted.method.clone(),
                &headers,
                body,
                rpc.as_deref(),
                id.as_ref(),
            )
            .await
        {
            Ok(reply) => reply,
            Err(rejection) => {
                self.broker.metrics().rejection(&rejection);
                Reply::rejection(&rejection, id.as_ref())
            }
        }
    }
}

/// Per-request state.
#[derive(Debug)]
pub(crate) struct RequestCtx {
    origin: OriginCheck,
    body_bytes: usize,
    /// The response was already (partly) written by us; errors need no further answer.
    answered: bool,
    /// Set when the request is forwarded to a peer.
    forward: Option<Forwarding>,
    /// The client connection the request came on.
    connection: Option<Arc<Connection>>,
}

impl RequestCtx {
    /// The listener the request came to: its connection's. An HTTP/2 request carries no
    /// connection context, and HTTP/2 is negotiated only on the peer port's mutual TLS
    /// (`listener.rs`).
    fn port(&self, session: &Session) -> Port {
        match &self.connection {
            Some(c) => c.port(),
            None if session.as_downstream().is_http2() => Port::Peer { tls: true },
            None => Port::Mcp,
        }
    }
}

#[async_trait]
impl ProxyHttp for McpProxy {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            origin: OriginCheck::Missing,
            body_bytes: 0,
            answered: false,
            forward: None,
            connection: None,
        }
    }

    fn on_connection_reuse(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
        prev_ctx: Box<dyn std::any::Any + Send + Sync>,
    ) {
        // The listener hands every request its connection this way (`listener.rs`).
        if let Ok(connection) = prev_ctx.downcast::<Arc<Connection>>() {
            connection.head_delivered();
            ctx.connection = Some(*connection);
        }
    }

    async fn early_request_filter(
        &self,
        session: &mut Session,
        _ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        // Serve HTTP/1.1 pipelined requests in order instead of dropping them (RFC 9112 §9.3.2).
        session.set_pipelining_enabled(true);
        session
            .as_downstream_mut()
            .set_write_timeout(Some(self.client_write_timeout));
        if self.lifecycle.is_draining() {
            // A draining pod answers `Connection: close`: its clients reconnect through the
            // Service (to a live pod once the endpoint is gone) instead of keeping an idle
            // connection that pingora drops when the sidecar stops, which a request sent at
            // that moment would lose.
            session.set_keepalive(None);
        }
        Ok(())
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<bool> {
        // A connection refused a slot gets one answer, whatever it asks, then closes.
        let refused = ctx.connection.as_ref().and_then(|c| c.refused());
        if refused.is_some() {
            session.set_keepalive(None);
        }
        let req = session.req_header();
        let head = Head {
            method: req.method.clone(),
            path: req.uri.path().to_owned(),
            headers: req.headers.clone(),
            port: ctx.port(session),
            refused,
        };
        let (lane, origin) = self.lanes().decide(&head, session).await;
        ctx.origin = origin;
        let reply = match lane {
            Lane::Peer => self.peer.serve(session.as_downstream_mut()).await,
            Lane::Probe => probe_reply(),
            Lane::Preflight(headers) => Reply {
                status: StatusCode::NO_CONTENT,
                headers,
                body: ReplyBody::Empty,
            },
            Lane::Refuse(refusal) => {
                self.broker.metrics().rejection(&refusal.rejection);
                if refusal.close {
                    session.set_keepalive(None);
                }
                Reply::rejection(&refusal.rejection, refusal.id.as_ref())
            }
            Lane::Forward(forwarding) => {
                ctx.forward = Some(forwarding);
                return Ok(false);
            }
            Lane::Stateless { admitted, request } => self.serve_stateless(&admitted, request).await,
            Lane::Session {
                admitted,
                body,
                entered,
            } => self.broker.handle(admitted, body, entered).await,
        };
        respond(session, ctx, reply).await
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Box<HttpPeer>> {
        if let Some(f) = ctx.forward.as_ref() {
            let mut peer = self.peer_of(f)?;
            peer.options.connection_timeout = Some(PEER_CONNECT_TIMEOUT);
            peer.options.idle_timeout = Some(PEER_IDLE_TIMEOUT);
            peer.options.read_timeout = Some(self.peer_read_timeout);
            peer.options.write_timeout = Some(self.peer_read_timeout);
            return Ok(Box::new(peer));
        }
        // Only forwards take pingora's proxy path; everything else is answered in
        // `request_filter`.
        Err(pingora::Error::explain(
            ErrorType::InternalError,
            "a request that is not forwarded reached the proxy path",
        ))
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<pingora::Error>,
    ) -> Box<pingora::Error> {
        if let Some(f) = ctx.forward.as_mut() {
            let failure = Failure::Connect {
                refused: e.etype() == &ErrorType::ConnectRefused,
            };
            let retry = self.after_failure(f, failure, &e);
            e.set_retry(retry);
        }
        e
    }

    async fn connected_to_upstream(
        &self,
        _session: &mut Session,
        reused: bool,
        _peer: &HttpPeer,
        _fd: std::os::unix::io::RawFd,
        _digest: Option<&pingora::protocols::Digest>,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        if ctx.forward.is_some() {
            self.metrics.peer_connect(reused);
        }
        Ok(())
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        for name in &HOP_HEADERS {
            upstream_request.remove_header(name);
        }
        if let Some(f) = &ctx.forward {
            let next = f.hop_so_far().next(self.router.uid());
            let signing = Signing {
                to: &f.peer.uid,
                now_ms: now_ms(),
            };
            for (name, value) in
                next.headers(self.router.secret(), f.session_id.as_deref(), signing)
            {
                upstream_request.insert_header(name, value)?;
            }
        }
        Ok(())
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        ctx.body_bytes += body.as_ref().map_or(0, Bytes::len);
        if ctx.body_bytes > self.policy.load().max_body_bytes {
            return Err(pingora::Error::explain(
                ErrorType::HTTPStatus(413),
                "request body too large",
            ));
        }
        Ok(())
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<pingora::Error>,
        ctx: &mut RequestCtx,
        client_reused: bool,
    ) -> Box<pingora::Error> {
        let mut e = e.more_context(format!("peer: {peer}"));
        let replayable = !session.as_ref().retry_buffer_truncated();
        let unanswered = session.response_written().is_none();
        let timed_out = matches!(
            e.etype(),
            ErrorType::ReadTimedout | ErrorType::WriteTimedout
        );
        match ctx.forward.as_mut() {
            // The client left (or broke its side): the peer did nothing wrong, and nobody is
            // there to answer.
            Some(_) if e.esource() == &ErrorSource::Downstream => e.set_retry(false),
            Some(f) => {
                let failure = Failure::Broken {
                    replayable,
                    answered: !unanswered,
                    timed_out,
                    reused_connection: client_reused,
                };
                let retry = self.after_failure(f, failure, &e);
                e.set_retry(retry);
            }
            None if !session.req_header().method.is_idempotent() || !replayable => {
                e.set_retry(false);
            }
            None => e.retry.decide_reuse(client_reused),
        }
        e
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &pingora::Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        if ctx.answered || session.response_written().is_some() {
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        }
        let fallback = ctx.forward.as_mut().and_then(|f| f.fallback.take());
        let rejection = fallback.unwrap_or_else(|| {
            failed_answer(
                e.etype(),
                ctx.forward.is_some(),
                self.policy.load().max_body_bytes,
            )
        });
        self.broker.metrics().rejection(&rejection);
        let code = rejection.status().as_u16();
        let _ = respond(session, ctx, rejection.into()).await;
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(
        &self,
        _session: &mut Session,
        e: Option<&pingora::Error>,
        ctx: &mut RequestCtx,
    ) {
        // A write to the client that waited too long: ours (answered) or pingora's proxying.
        if let Some(e) = e
            && e.etype() == &ErrorType::WriteTimedout
            && (ctx.answered || e.esource() == &ErrorSource::Downstream)
        {
            self.metrics.client_write_timeout();
        }
        let Some(f) = &ctx.forward else { return };
        // Connect failures were counted when they happened (`fail_to_connect`).
        let outcome = match e {
            None => Some(ForwardOutcome::Ok),
            Some(e) if is_connect_error(e.etype()) => None,
            Some(e) if e.esource() == &ErrorSource::Downstream => {
                Some(ForwardOutcome::ClientClosed)
            }
            Some(_) => Some(ForwardOutcome::Error),
        };
        if let Some(outcome) = outcome {
            self.metrics.forward(f.kind, outcome);
        }
        self.metrics.forward_hop(f.hop.count.saturating_add(1));
    }

    fn suppress_error_log(
        &self,
        _session: &Session,
        ctx: &RequestCtx,
        error: &pingora::Error,
    ) -> bool {
        // Errors after we answered are client disconnects or lost readers, logged at debug; so
        // are clients leaving a forwarded exchange.
        ctx.answered || (ctx.forward.is_some() && error.esource() == &ErrorSource::Downstream)
    }
}

impl McpProxy {
    /// The connection of a forward: the peer's peer port, over mutual TLS with the key ring's
    /// current certificate when peer TLS is on.
    fn peer_of(&self, f: &Forwarding) -> pingora::Result<HttpPeer> {
        let addr = std::net::SocketAddr::new(
            f.peer.address.ip(),
            f.peer.peer_port.unwrap_or(self.peer_port),
        );
        if !self.peer_tls {
            return Ok(HttpPeer::new(addr, false, String::new()));
        }
        let ring = self.router.secret().load();
        let tls = ring.tls().ok_or_else(|| {
            pingora::Error::explain(ErrorType::InternalError, "the key ring has no TLS material")
        })?;
        let mut peer = HttpPeer::new(addr, true, PEER_SERVER_NAME.to_owned());
        peer.client_cert_key = Some(Arc::clone(&tls.cert_key));
        peer.options.ca = Some(Arc::clone(&tls.ca));
        // HTTP/2 when the peer offers it: its hops share a few connections, and a hop the client
        // cuts resets one stream instead of a connection (and its next one's handshake).
        peer.options.alpn = ALPN::H2H1;
        peer.options.max_h2_streams = self.peer_max_streams as usize;
        peer.options.h2_stream_window_size = Some(PEER_STREAM_WINDOW);
        peer.options.h2_connection_window_size =
            Some(peer_connection_window(self.peer_max_streams));
        Ok(peer)
    }

    /// Carries out [`forward::after_failure`] for `f` after `failure` (`error`): counts and
    /// logs a peer given up on, marks it down, and returns whether pingora tries again (the
    /// same peer, or the next candidate now in `f.peer`).
    fn after_failure(&self, f: &mut Forwarding, failure: Failure, error: &pingora::Error) -> bool {
        let (kind, name, address) = (f.kind, f.peer.name.clone(), f.peer.address);
        let now = Instant::now();
        let health = self.router.health();
        let view = self.router.view();
        let own = self.router.own_peer();
        let nonce = placement_nonce();
        let down = |uid: &str| health.down(uid, now);
        let replica_of = |id: &str| self.handoff.replica_holder(id);
        let world = World {
            view: &view,
            me: self.router.me(self.lifecycle.is_draining()),
            down: &down,
            own: &own,
            nonce: &nonce,
            replica_of: &replica_of,
        };
        let decision = forward::after_failure(f, failure, &world);
        if decision.rerouted {
            self.metrics.forward(kind, ForwardOutcome::ConnectError);
            match failure {
                Failure::Connect { .. } => {
                    tracing::warn!(peer = %name, %address, %error, "peer unreachable; trying the next candidate");
                }
                Failure::Broken { .. } => {
                    tracing::warn!(peer = %name, %error, "peer broke the exchange; trying the next candidate");
                }
            }
        }
        if let Some((uid, cause)) = &decision.mark_down {
            health.mark_down(uid, *cause, now);
        }
        decision.next != Next::GiveUp
    }
}

/// The answer to the peers' liveness probe (`peer_health`), on the port they forward to, with
/// the peer protocol this sidecar speaks.
fn probe_reply() -> Reply {
    let mut headers = http::HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(TETHER_PEER_PROTOCOL, HeaderValue::from(u16::from(PROTOCOL)));
    Reply {
        status: StatusCode::OK,
        headers,
        body: ReplyBody::Full(Bytes::from_static(b"ok\n")),
    }
}

/// A client's request body, read through pingora (its retry buffer keeps what a forward
/// resends).
#[async_trait]
impl BodySource for Session {
    async fn chunk(&mut self) -> Result<Option<Bytes>, ()> {
        self.read_request_body().await.map_err(|_| ())
    }

    fn keep_for_resend(&mut self) {
        self.as_mut().enable_retry_buffering();
    }

    fn too_large_to_resend(&self) -> bool {
        self.as_ref().retry_buffer_truncated()
    }
}

/// A random string that spreads placements over routable peers.
fn placement_nonce() -> String {
    let bytes: [u8; 8] = rand::random();
    hex::encode(bytes)
}

/// Writes `reply` with the CORS headers of the request (see [`respond::write`]); from now on
/// the request needs no other answer.
async fn respond(
    session: &mut Session,
    ctx: &mut RequestCtx,
    reply: Reply,
) -> pingora::Result<bool> {
    ctx.answered = true;
    respond::write(session, &ctx.origin, reply).await
}

//! 2026-07-28 requests (stateless; SEP-2575): each is sent to the MCP server from the client's
//! own request and its answer relayed as it comes, nothing buffered or kept (`docs/design/
//! architecture.md#request-path`).
//!
//! - The request goes with the client's end-to-end headers (`Mcp-Method`, `Mcp-Name` and every
//!   `Mcp-Param-*` unchanged), without `Mcp-Session-Id` or `Last-Event-ID` (spec S-10, R-08).
//! - An SSE answer (a call's progress, `subscriptions/listen`) is relayed chunk by chunk, each
//!   written and flushed when it arrives, with `X-Accel-Buffering: no` and a `: keep-alive`
//!   comment after `--keep-alive` of silence (spec L-05); a JSON answer is relayed as it comes.
//! - The relay ends the upstream exchange when it is dropped: a client that goes away cancels
//!   its request (L-05), which the writer notices even while the MCP server is silent
//!   (`crate::proxy`).
//! - An upstream session the MCP server opened anyway is ended (S-10).
//! - Task ids are exchanged on the way ([`super::tasks`]): an answer that may carry them is
//!   read whole (JSON) or re-framed event by event (SSE, each event still written at once).
//! - Each relay is counted while it lives ([`StatelessTally`]): a drain lets the requests in
//!   flight finish, and ends the pod's `subscriptions/listen` streams cleanly at its start, at
//!   an event boundary, each with its request's completion result (the spec's graceful
//!   closure), so that their clients listen again on a routable pod (`crate::ops::drain`).
//!   A listen stream opened on a pod that already drains (no routable peer took it) is not
//!   ended: its client would only come back.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, Method, header};
use http_body_util::BodyDataStream;
use tokio::sync::watch;

use super::Broker;
use super::metrics::UpstreamFailure;
use crate::mcp::headers::{MCP_SESSION_ID, forward_response_header};
use crate::mcp::jsonrpc::RequestKey;
use crate::mcp::methods::LISTEN;
use crate::mcp::modern::listen_completed;
use crate::mcp::mrtr;
use crate::mcp::principal::Owner;
use crate::mcp::rejection::Rejection;
use crate::mcp::sse::put_relayed;
use crate::mcp::tasks::{self, Revision};
use crate::reply::{Relay, Reply, ReplyBody};
use crate::upstream::{BodyError, Exchange, events, read_body};

impl Broker {
    /// Sends a 2026-07-28 request (`method`, the client's `headers`, its `body` with task ids
    /// opened, [`Broker::open_sealed`]) to the MCP server and relays its answer; `rpc`: the
    /// JSON-RPC method of a POST's request, `id` its id. The answer to a request that may carry task ids
    /// ([`tasks::may_answer_with_tasks`]) has them sealed: a JSON answer is read whole (up to
    /// the largest upstream body), an SSE one event by event (up to `--max-event-bytes`).
    ///
    /// # Errors
    /// [`Rejection::UpstreamUnavailable`] (503, never reached), [`Rejection::UpstreamLost`]
    /// (502, may have run) or [`Rejection::UpstreamTimeout`] (504) when the MCP server does not
    /// answer, counted in `tether_upstream_errors_total`;
    /// [`Rejection::TaskIdTooLong`].
    pub(crate) async fn stateless(
        self: &Arc<Self>,
        method: Method,
        headers: &HeaderMap,
        body: Bytes,
        rpc: Option<&str>,
        id: Option<&RequestKey>,
    ) -> Result<Reply, Rejection> {
        let listen = rpc == Some(LISTEN);
        let sealing =
            rpc.is_some_and(|m| tasks::may_answer_with_tasks(m) || mrtr::may_require_input(m));
        let in_flight = InFlight::new(self, listen);
        let exchange = Exchange {
            headers: self.upstream_headers(headers),
            ..Exchange::default()
        };
        let response = self
            .upstream
            .send(method, exchange, body)
            .await
            .map_err(|e| self.upstream_rejection(&e))?;
        if let Some(id) = response
            .headers()
            .get(MCP_SESSION_ID)
            .and_then(|v| v.to_str().ok())
        {
            self.abandon_upstream_session(id.to_owned());
        }
        let (parts, body) = response.into_parts();
        let mut out = HeaderMap::with_capacity(parts.headers.len() + 1);
        for (name, value) in &parts.headers {
            if forward_response_header(name) {
                out.append(name.clone(), value.clone());
            }
        }
        let sse = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if sse {
            out.insert("x-accel-buffering", HeaderValue::from_static("no"));
        }
        let keep_alive = sse.then(|| self.cfg().keep_alive);
        // Task ids in the answer are sealed for the request's principal.
        let owner = sealing.then(|| self.request_owner(headers));
        let chunks = match owner {
            None => BodyDataStream::new(body)
                .map(|chunk| chunk.map_err(|e| e.to_string()))
                .boxed(),
            Some(owner) if sse => self.sealed_events(body, owner),
            Some(owner) => {
                let (max_bytes, within) = {
                    let cfg = self.cfg();
                    (cfg.max_upstream_body_bytes, cfg.upstream_body_timeout)
                };
                let json = read_body(body, max_bytes, within).await.map_err(|e| {
                    self.metrics.upstream_error(UpstreamFailure::Body);
                    match e {
                        BodyError::Timeout(_) => Rejection::UpstreamTimeout,
                        _ => Rejection::UpstreamLost,
                    }
                })?;
                let json = self
                    .seal_answer(&json, &owner, Revision::Extension)?
                    .map_or(json, Bytes::from);
                return Ok(Reply {
                    status: parts.status,
                    headers: out,
                    body: ReplyBody::Full(json),
                });
            }
        };
        let mut relay = Relay::new(chunks, keep_alive);
        let end_listens = &self.stateless.end_listens;
        if let (true, Some(id)) = (listen, id)
            && !*end_listens.borrow()
        {
            relay = relay.ending_on(end_listens.subscribe(), listen_completed(id));
        }
        let reply = Reply {
            status: parts.status,
            headers: out,
            body: ReplyBody::Relay(relay.holding(in_flight)),
        };
        if listen {
            return Ok(self.until_credential_expires(reply, headers));
        }
        Ok(reply)
    }

    /// An upstream SSE body re-framed event by event with its task ids sealed for `owner`; an event over
    /// `--max-event-bytes`, or one naming a task id tether cannot seal, breaks the answer off.
    fn sealed_events(
        self: &Arc<Self>,
        body: hyper::body::Incoming,
        owner: Owner,
    ) -> futures::stream::BoxStream<'static, Result<Bytes, String>> {
        let broker = Arc::clone(self);
        events(body, self.cfg().max_event_bytes)
            .map(move |event| {
                let event = event.map_err(|e| e.to_string())?;
                let sealed = match event.data.as_deref() {
                    Some(data) => broker
                        .seal_answer(data.as_bytes(), &owner, Revision::Extension)
                        .map_err(|r| r.reason().to_owned())?,
                    None => None,
                };
                let mut out = BytesMut::new();
                put_relayed(&mut out, &event, sealed.as_deref());
                Ok(out.freeze())
            })
            .boxed()
    }

    /// 2026-07-28 requests in flight here, `subscriptions/listen` streams apart.
    pub(crate) fn stateless_in_flight(&self) -> usize {
        self.stateless.calls.load(Ordering::Relaxed)
    }

    /// Ends every `subscriptions/listen` stream open here cleanly, each at its next event
    /// boundary (a drain's start); returns how many were open.
    pub(crate) fn end_listen_streams(&self) -> usize {
        // Counted first: a stream ended by the signal leaves the count at once, on another
        // thread.
        let open = self.stateless.listens.load(Ordering::Relaxed);
        self.stateless.end_listens.send_replace(true);
        open
    }
}

/// The 2026-07-28 requests this pod relays: those in flight, its open `subscriptions/listen`
/// streams, and the signal that ends these.
#[derive(Debug, Default)]
pub(super) struct StatelessTally {
    calls: AtomicUsize,
    listens: AtomicUsize,
    end_listens: watch::Sender<bool>,
}

/// One relayed request, counted in its [`StatelessTally`] from its start until its answer ended
/// or its client left; the pod's activity is woken when it ends (a drain waits on it).
struct InFlight {
    broker: Arc<Broker>,
    listen: bool,
}

impl InFlight {
    fn new(broker: &Arc<Broker>, listen: bool) -> Self {
        let held = Self {
            broker: Arc::clone(broker),
            listen,
        };
        held.counter().fetch_add(1, Ordering::Relaxed);
        held
    }

    fn counter(&self) -> &AtomicUsize {
        let tally = &self.broker.stateless;
        if self.listen {
            &tally.listens
        } else {
            &tally.calls
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.counter().fetch_sub(1, Ordering::Relaxed);
        self.broker.activity().notify_waiters();
    }
}

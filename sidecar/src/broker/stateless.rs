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
//! - Each relay is counted while it lives ([`StatelessTally`]): a drain lets the requests in
//!   flight finish, and ends the pod's `subscriptions/listen` streams cleanly at its start, at
//!   an event boundary, so that their clients listen again on a routable pod (`crate::ops::drain`).
//!   A listen stream opened on a pod that already drains (no routable peer took it) is not
//!   ended: its client would only come back.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, Method, header};
use http_body_util::BodyDataStream;
use tokio::sync::watch;

use super::Broker;
use crate::mcp::headers::{MCP_SESSION_ID, forward_response_header};
use crate::mcp::rejection::Rejection;
use crate::reply::{Relay, Reply, ReplyBody};
use crate::upstream::Exchange;

impl Broker {
    /// Sends a 2026-07-28 request (`method`, the client's `headers`, its `body`) to the MCP
    /// server and relays its answer; `listen`: the request is a `subscriptions/listen`.
    ///
    /// # Errors
    /// [`Rejection::UpstreamUnavailable`] (502) or [`Rejection::UpstreamTimeout`] (504) when the
    /// MCP server does not answer, counted in `tether_upstream_errors_total`.
    pub(crate) async fn stateless(
        self: &Arc<Self>,
        method: Method,
        headers: &HeaderMap,
        body: Bytes,
        listen: bool,
    ) -> Result<Reply, Rejection> {
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
        let mut relay = Relay::new(
            BodyDataStream::new(body).map(|chunk| chunk.map_err(|e| e.to_string())),
            keep_alive,
        );
        let end_listens = &self.stateless.end_listens;
        if listen && !*end_listens.borrow() {
            relay = relay.ending_on(end_listens.subscribe());
        }
        Ok(Reply {
            status: parts.status,
            headers: out,
            body: ReplyBody::Relay(relay.holding(in_flight)),
        })
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

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

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, Method, header};
use http_body_util::BodyDataStream;

use super::Broker;
use crate::mcp::headers::{MCP_SESSION_ID, forward_response_header};
use crate::mcp::rejection::Rejection;
use crate::reply::{Relay, Reply, ReplyBody};
use crate::upstream::Exchange;

impl Broker {
    /// Sends a 2026-07-28 request (`method`, the client's `headers`, its `body`) to the MCP
    /// server and relays its answer.
    ///
    /// # Errors
    /// [`Rejection::UpstreamUnavailable`] (502) or [`Rejection::UpstreamTimeout`] (504) when the
    /// MCP server does not answer, counted in `tether_upstream_errors_total`.
    pub(crate) async fn stateless(
        self: &std::sync::Arc<Self>,
        method: Method,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Reply, Rejection> {
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
        Ok(Reply {
            status: parts.status,
            headers: out,
            body: ReplyBody::Relay(Relay::new(
                BodyDataStream::new(body).map(|chunk| chunk.map_err(|e| e.to_string())),
                keep_alive,
            )),
        })
    }
}

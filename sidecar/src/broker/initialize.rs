//! `initialize`: create the upstream session and mint the client's session id
//! (`docs/design/architecture.md#sessions`; spec S-01, S-02, I-01, I-02).
//!
//! The request is forwarded without any session header, even when the client sent a stale one
//! (`fr15_an_initialize_with_a_stale_session_id_starts_a_new_session`). The upstream's answer is
//! read whole (it is one message, possibly preceded by log notifications), the negotiated version
//! is checked against `spec.protocolVersions`, and the reply keeps the upstream's content type:
//! JSON passes through unchanged, SSE is re-served from a stream buffer with the sidecar's event
//! ids. The reply carries the sidecar-minted `Mcp-Session-Id`; the upstream's id never reaches the
//! client.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use http::Method;
use http_body_util::Full;
use serde_json::Value;
use tether_crds::ProtocolVersion;

use super::Broker;
use super::metrics::UpstreamFailure;
use crate::mcp::admission::Admitted;
use crate::mcp::headers::{MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::mcp::jsonrpc::{RequestKey, response_id};
use crate::mcp::principal::Binding;
use crate::mcp::principal::Owner;
use crate::mcp::rejection::{Rejection, VersionMismatch};
use crate::reply::Reply;
use crate::retained::Kind;
use crate::session::journal::Journal;
use crate::session::{NoRoom, Session};
use crate::stream::{Start, StreamKind};
use crate::upstream::{Exchange, events, is_sse};

/// The messages of an upstream `initialize` answer: `(event name, data)` in order.
pub(super) type Messages = Vec<(Option<String>, Bytes)>;

impl Broker {
    pub(super) async fn initialize(
        self: &Arc<Self>,
        call: &Admitted,
        mut request: Value,
        init_id: RequestKey,
    ) -> Result<Reply, Rejection> {
        if !self.registry.has_room() {
            return Err(Rejection::TooManySessions);
        }
        let max_params = self.cfg().max_initialize_bytes;
        if serde_json::to_vec(&request["params"]).map_or(0, |p| p.len()) > max_params {
            return Err(Rejection::InitializeTooLarge(max_params));
        }
        let mut headers = self.upstream_headers(&call.headers);
        if let Some(offer) = self.version_offer(&request) {
            // I-02: the client asked for a version this endpoint does not serve; offer the
            // newest one it does, and let the client decide whether it can use it.
            request["params"]["protocolVersion"] = Value::from(offer.as_str());
            headers.remove(MCP_PROTOCOL_VERSION);
        }
        // The session's id and key now: its principal is a digest keyed by the key, and the
        // principal's share of the pod is weighed before anything is pinned for it.
        let (id, key) = self.minter.mint();
        let binding = {
            let cfg = self.cfg();
            Binding::of(&call.headers, &cfg.forward_headers, cfg.binding, &key)
        };
        self.admit_pinning(binding.and_then(|b| b.principal))?;
        // The journal keeps the `initialize` request as sent, for the session's life: its text
        // is what goes upstream, held against the pod's journal budget meanwhile.
        let journal = Journal::new(request);
        let mut reservation = self.retained().charge(Kind::Journal);
        reservation
            .try_resize(journal.bytes() as u64)
            .map_err(|_| Rejection::PodFull)?;
        let exchange = Exchange {
            upstream_session: None,
            headers,
            last_event_id: None,
        };
        let resp = self
            .upstream
            .send(
                Method::POST,
                exchange,
                Bytes::copy_from_slice(journal.initialize_text().as_bytes()),
            )
            .await
            .map_err(|e| self.upstream_rejection(&e))?;
        let upstream_id = resp
            .headers()
            .get(MCP_SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let sse = is_sse(&resp);
        // An `initialize` answer names no task.
        let stored = self.read_stored(resp, &Owner::ANONYMOUS).await?;
        if !stored.status.is_success() {
            return Ok(stored.into());
        }
        let messages = if sse {
            sse_messages(stored.body.clone()).await
        } else {
            vec![(None, stored.body.clone())]
        };
        let negotiated = match negotiated_version(&messages, &init_id) {
            Some(Ok(v)) => v,
            // A JSON-RPC error (e.g. an unsupported requested version): no session.
            Some(Err(())) => {
                self.abandon_upstream(upstream_id, &call.headers).await;
                return Ok(stored.into());
            }
            None => {
                self.abandon_upstream(upstream_id, &call.headers).await;
                self.metrics
                    .upstream_error(UpstreamFailure::InitializeWithoutResult);
                return Err(Rejection::UpstreamLost);
            }
        };
        let Some(version) =
            ProtocolVersion::parse(&negotiated).filter(|v| self.cfg().versions.contains(v))
        else {
            self.abandon_upstream(upstream_id, &call.headers).await;
            return Err(Rejection::UnsupportedNegotiatedVersion(
                VersionMismatch::new(&negotiated, &self.cfg().versions),
            ));
        };
        drop(reservation);
        let session = Session::new(
            id.clone(),
            key,
            upstream_id.clone(),
            version,
            journal,
            self.retained(),
        );
        session.bind(binding);
        session.remember_credentials(&call.headers, &self.cfg().forward_headers);
        if let Err(no_room) = self.registry.insert(Arc::clone(&session)) {
            self.abandon_upstream(upstream_id, &call.headers).await;
            return Err(match no_room {
                NoRoom::Pod(_) => Rejection::TooManySessions,
                NoRoom::Principal(_) => Rejection::PrincipalSessions,
            });
        }
        self.metrics.session_created();
        tracing::info!(session = session.digest(), %version, "session created");
        if !sse {
            return Ok(Reply::from(stored).with_session_id(&id));
        }
        let stream = self.new_stream(&session, StreamKind::Post, Vec::new());
        let now = Instant::now();
        for (event, data) in messages {
            let evicted = stream.append(event, data, now);
            self.metrics.event_buffered();
            self.metrics.evictions(&evicted);
        }
        stream.complete();
        session.register_stream(&stream);
        Ok(
            Reply::sse(self.feed(&session, &stream, Start::After(0), true))
                .with_upstream_headers(&stored.headers)
                .with_session_id(&id),
        )
    }

    /// The version to ask the upstream for instead of the client's, when the client's is not a
    /// sessionful version listed in `spec.protocolVersions`.
    fn version_offer(&self, request: &Value) -> Option<ProtocolVersion> {
        let requested = request
            .pointer("/params/protocolVersion")
            .and_then(Value::as_str)
            .and_then(ProtocolVersion::parse);
        let cfg = self.cfg();
        let servable = |v: &ProtocolVersion| !v.is_stateless() && cfg.versions.contains(v);
        if requested.as_ref().is_some_and(servable) {
            return None;
        }
        cfg.versions.iter().copied().filter(servable).max()
    }

    /// Ends an upstream session the client will never see.
    async fn abandon_upstream(&self, upstream_id: Option<String>, headers: &http::HeaderMap) {
        if let Some(id) = upstream_id {
            self.end_upstream_session(&id, self.upstream_headers(headers))
                .await;
        }
    }
}

/// The data events of a complete SSE body (priming and comment-only blocks dropped).
pub(super) async fn sse_messages(body: Bytes) -> Messages {
    let mut out = Vec::new();
    // The body is already held whole (bounded when it was read): no event can be larger.
    let whole = body.len();
    let mut stream = std::pin::pin!(events(Full::new(body), whole));
    while let Some(Ok(ev)) = stream.next().await {
        if let Some(data) = ev.data.filter(|d| !d.is_empty()) {
            out.push((ev.event.filter(|e| e != "message"), Bytes::from(data)));
        }
    }
    out
}

/// The `protocolVersion` of the `initialize` result: `None` when no message answers the
/// request, `Some(Err(()))` when the answer is a JSON-RPC error.
pub(super) fn negotiated_version(
    messages: &Messages,
    init_id: &RequestKey,
) -> Option<Result<String, ()>> {
    let (_, data) = messages
        .iter()
        .find(|(_, d)| response_id(d).as_ref() == Some(init_id))?;
    let value: Value = serde_json::from_slice(data).ok()?;
    match value
        .pointer("/result/protocolVersion")
        .and_then(Value::as_str)
    {
        Some(v) => Some(Ok(v.to_owned())),
        None => Some(Err(())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_the_negotiated_version_from_an_sse_answer() {
        let body = Bytes::from_static(
            b"id: 0\r\nretry: 3000\r\ndata:\r\n\r\nevent: message\r\nid: 1\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\r\ndata: \"result\":{\"protocolVersion\":\"2025-06-18\"}}\r\n\r\n",
        );
        let messages = sse_messages(body).await;
        assert_eq!(messages.len(), 1, "the priming event is dropped");
        assert_eq!(messages[0].0, None, "the default event name is dropped");
        let id = RequestKey::of(&Value::from(1));
        assert_eq!(
            negotiated_version(&messages, &id),
            Some(Ok("2025-06-18".to_owned()))
        );
        assert_eq!(
            negotiated_version(&messages, &RequestKey::of(&Value::from(2))),
            None
        );
        let err = vec![(
            None,
            Bytes::from_static(
                br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"x"}}"#,
            ),
        )];
        assert_eq!(negotiated_version(&err, &id), Some(Err(())));
    }
}

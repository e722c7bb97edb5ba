//! The HTTP client to the MCP server in the same pod (the upstream).
//!
//! Sessionful requests are sent from the sidecar's own tasks with hyper, decoupled from the
//! client connection (spec L-01): the upstream call lives as long as its stream needs it, not as
//! long as the client stays connected. Upstream SSE bodies are decoded with the `sse-stream`
//! crate (chunk boundaries are not event boundaries; LF, CRLF and CR line ends; `retry`), each
//! event bounded in size while it is read (`--max-event-bytes`).

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyDataStream, BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sse_stream::{Sse, SseByteStream};

use crate::mcp::headers::{LAST_EVENT_ID, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::mcp::sse_limit::{EventBound, EventTooLarge};

/// How long connecting to the upstream may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an idle connection to the MCP server is kept for reuse.
pub(crate) const UPSTREAM_POOL_IDLE: Duration = Duration::from_secs(60);

/// Why an upstream exchange failed before a response arrived.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// The request was not sent — no connection could be made, or it could not be built: it
    /// certainly did not reach the MCP server.
    #[error("upstream refused the connection: {0}")]
    Refused(String),
    /// The exchange broke after the connection was made (the request may have arrived).
    #[error("upstream unavailable: {0}")]
    Unavailable(String),
    /// No response headers within the configured time.
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    /// The session's upstream session must be rebuilt and the MCP server is not ready for it
    /// yet; the request was not sent.
    #[error("the MCP server is not ready to rebuild the session")]
    NotReady,
}

/// Why a complete upstream body could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// Larger than the limit, in bytes.
    #[error("upstream body larger than {0} bytes")]
    TooLarge(usize),
    /// Not complete within the time limit.
    #[error("upstream body not complete within {0:?}")]
    Timeout(Duration),
    /// The connection broke.
    #[error("upstream body broken: {0}")]
    Broken(String),
}

/// The upstream MCP endpoint and a pooled client for it.
#[derive(Clone, Debug)]
pub(crate) struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
    uri: Uri,
    /// `Host` of every request (`spec.upstream.host`, else the authority of `uri`).
    host: Option<HeaderValue>,
    header_timeout: Duration,
}

/// An upstream exchange: which session, which extra headers.
#[derive(Debug, Default)]
pub(crate) struct Exchange<'a> {
    /// The upstream's session id (`None` for `initialize` or a sessionless upstream).
    pub(crate) upstream_session: Option<&'a str>,
    /// End-to-end headers to send (already filtered, see [`crate::mcp::headers`]).
    pub(crate) headers: HeaderMap,
    /// `Last-Event-ID` to resume an upstream stream (spec R-04, SEP-1699).
    pub(crate) last_event_id: Option<&'a str>,
}

impl Upstream {
    /// A client for the MCP endpoint at `uri` (`http://host:port/path`). `header_timeout` bounds
    /// the wait for response headers; at most `max_idle` idle connections are kept
    /// (`--upstream-max-idle-connections`), each for at most [`UPSTREAM_POOL_IDLE`].
    pub(crate) fn new(uri: Uri, host: &str, header_timeout: Duration, max_idle: usize) -> Self {
        let client = http_client(CONNECT_TIMEOUT, UPSTREAM_POOL_IDLE, max_idle);
        let host = HeaderValue::from_str(host).ok().or_else(|| {
            let authority = uri.authority()?.as_str();
            HeaderValue::from_str(authority).ok()
        });
        Self {
            client,
            uri,
            host,
            header_timeout,
        }
    }

    /// Sends one request and waits for the response headers.
    ///
    /// # Errors
    /// [`UpstreamError`] when the upstream cannot be reached or does not answer in time.
    pub(crate) async fn send(
        &self,
        method: Method,
        exchange: Exchange<'_>,
        body: Bytes,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let mut req = Request::builder()
            .method(method)
            .uri(self.uri.clone())
            .body(Full::new(body))
            .map_err(|e| UpstreamError::Refused(e.to_string()))?;
        let headers = req.headers_mut();
        *headers = exchange.headers;
        if let Some(host) = &self.host {
            headers.insert(http::header::HOST, host.clone());
        }
        if let Some(id) = exchange.upstream_session
            && let Ok(v) = HeaderValue::from_str(id)
        {
            headers.insert(MCP_SESSION_ID, v);
        }
        if let Some(id) = exchange.last_event_id
            && let Ok(v) = HeaderValue::from_str(id)
        {
            headers.insert(LAST_EVENT_ID, v);
        }
        match tokio::time::timeout(self.header_timeout, self.client.request(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) if e.is_connect() => Err(UpstreamError::Refused(e.to_string())),
            Ok(Err(e)) => Err(UpstreamError::Unavailable(e.to_string())),
            Err(_) => Err(UpstreamError::Timeout(self.header_timeout)),
        }
    }

    /// Whether a TCP connection to the upstream can be opened within `within` (readiness).
    pub(crate) async fn reachable(&self, within: Duration) -> bool {
        let Some(authority) = self.uri.authority() else {
            return false;
        };
        matches!(
            tokio::time::timeout(within, tokio::net::TcpStream::connect(authority.as_str())).await,
            Ok(Ok(_))
        )
    }
}

/// A pooled HTTP/1 client (no Nagle delay) whose connects give up after `connect_timeout`,
/// which keeps at most `max_idle` idle connections per host and closes each after `pool_idle`
/// ([`pool_timer`]).
pub(crate) fn http_client(
    connect_timeout: Duration,
    pool_idle: Duration,
    max_idle: usize,
) -> Client<HttpConnector, Full<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(pool_idle)
        .pool_max_idle_per_host(max_idle)
        .pool_timer(pool_timer())
        .build(connector)
}

/// The timer a client's pool needs to close idle connections on time: without one, hyper's pool
/// drops an expired connection only when it is next asked for one, so after a burst the idle
/// connections (and their buffers) stay until traffic comes back.
pub(crate) fn pool_timer() -> hyper_util::rt::TokioTimer {
    hyper_util::rt::TokioTimer::new()
}

/// Headers for a request the sidecar makes on its own (GET resume, DELETE): the negotiated
/// `MCP-Protocol-Version` and, for GET, `Accept: text/event-stream`.
pub(crate) fn own_headers(version: &str, sse: bool) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(version) {
        h.insert(MCP_PROTOCOL_VERSION, v);
    }
    if sse {
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
    }
    h
}

/// Headers for a JSON-RPC POST the sidecar makes on its own (journal replay, a relayed
/// cancellation): `Accept` for JSON and SSE, `Content-Type: application/json`, and
/// `MCP-Protocol-Version` when `version` is given.
pub(crate) fn post_headers(version: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(v) = version.and_then(|v| HeaderValue::from_str(v).ok()) {
        h.insert(MCP_PROTOCOL_VERSION, v);
    }
    h
}

/// Whether a response is an SSE stream.
pub(crate) fn is_sse(resp: &Response<Incoming>) -> bool {
    content_type_is(resp.headers(), "text/event-stream")
}

/// Whether the `Content-Type` essence is `essence` (case-insensitive).
pub(crate) fn content_type_is(headers: &HeaderMap, essence: &str) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim())
        .is_some_and(|v| v.eq_ignore_ascii_case(essence))
}

/// Reads a whole body of at most `limit` bytes within `within`.
///
/// # Errors
/// [`BodyError`] when it is too large, too slow or broken.
pub(crate) async fn read_body(
    body: Incoming,
    limit: usize,
    within: Duration,
) -> Result<Bytes, BodyError> {
    let collect = Limited::new(body, limit).collect();
    match tokio::time::timeout(within, collect).await {
        Err(_) => Err(BodyError::Timeout(within)),
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(BodyError::TooLarge(limit))
        }
        Ok(Err(e)) => Err(BodyError::Broken(e.to_string())),
        // Copied: a one-frame body is a slice of the connection's read buffer (8 KiB or more),
        // which a stored reply would otherwise keep alive for as long as it is kept.
        Ok(Ok(collected)) => Ok(Bytes::copy_from_slice(&collected.to_bytes())),
    }
}

/// Why an upstream SSE body stopped before its end.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SseBodyError {
    /// An event passed `--max-event-bytes`: the body is not read further.
    #[error(transparent)]
    TooLarge(#[from] EventTooLarge),
    /// The connection broke.
    #[error("upstream SSE body broken: {0}")]
    Broken(Box<dyn std::error::Error + Send + Sync>),
}

/// Decodes an SSE body into events (raw blocks: `id`, `event`, `data`, `retry`; comments
/// dropped; an incomplete last block discarded). Each chunk is checked against
/// `max_event_bytes` before the decoder sees it, so the decoder never holds more than that of
/// one event; past it the stream ends with an error that [`event_too_large`] recognises.
pub(crate) fn events<B>(
    body: B,
    max_event_bytes: usize,
) -> impl futures::Stream<Item = Result<Sse, sse_stream::Error>>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let mut bound = EventBound::new(max_event_bytes);
    let checked = BodyDataStream::new(body).map(move |chunk| {
        let chunk = chunk.map_err(|e| SseBodyError::Broken(Box::new(e)))?;
        bound.feed(&chunk)?;
        Ok::<_, SseBodyError>(chunk)
    });
    SseByteStream::new(checked).fuse()
}

/// The limit an upstream event passed, when `e` ended an [`events`] stream for that reason.
pub(crate) fn event_too_large(e: &sse_stream::Error) -> Option<EventTooLarge> {
    match e {
        sse_stream::Error::Body(inner) => match inner.downcast_ref::<SseBodyError>() {
            Some(SseBodyError::TooLarge(too_large)) => Some(*too_large),
            _ => None,
        },
        _ => None,
    }
}

/// Whether an upstream status means the upstream no longer knows the session (spec S-05).
pub(crate) fn session_gone(status: StatusCode) -> bool {
    status == StatusCode::NOT_FOUND
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use proptest::prelude::*;

    /// One event as a producer writes it.
    #[derive(Clone, Debug)]
    struct Written {
        id: Option<String>,
        event: Option<String>,
        data: Vec<String>,
        retry: Option<u64>,
        comment: bool,
    }

    fn written() -> impl Strategy<Value = Written> {
        (
            proptest::option::of("[a-z0-9/_-]{1,12}"),
            proptest::option::of("[a-z]{1,8}"),
            proptest::collection::vec("[ -~&&[^\r\n]]{0,20}", 1..4),
            proptest::option::of(0u64..100_000),
            any::<bool>(),
        )
            .prop_map(|(id, event, data, retry, comment)| Written {
                id,
                event,
                data,
                retry,
                comment,
            })
    }

    fn encode(events: &[Written], eol: &str) -> Vec<u8> {
        let mut out = String::new();
        for e in events {
            if e.comment {
                out.push_str(&format!(": keep-alive{eol}"));
            }
            if let Some(id) = &e.id {
                out.push_str(&format!("id: {id}{eol}"));
            }
            if let Some(ev) = &e.event {
                out.push_str(&format!("event: {ev}{eol}"));
            }
            if let Some(r) = e.retry {
                out.push_str(&format!("retry: {r}{eol}"));
            }
            for line in &e.data {
                out.push_str(&format!("data: {line}{eol}"));
            }
            out.push_str(eol);
        }
        out.into_bytes()
    }

    /// Decodes `bytes` delivered in chunks cut at `cuts` through [`events`].
    fn decode(bytes: Vec<u8>, mut cuts: Vec<usize>) -> Vec<Sse> {
        cuts.retain(|c| *c < bytes.len());
        cuts.sort_unstable();
        cuts.dedup();
        let mut chunks = Vec::new();
        let mut start = 0;
        for c in cuts.into_iter().chain(std::iter::once(bytes.len())) {
            chunks.push(Ok::<_, std::convert::Infallible>(Frame::data(
                Bytes::copy_from_slice(&bytes[start..c]),
            )));
            start = c;
        }
        let body = StreamBody::new(stream::iter(chunks));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(
            events(body, 1 << 20)
                .filter_map(|r| async move { r.ok() })
                .collect(),
        )
    }

    proptest! {
        #[test]
        fn sse_parsing_survives_any_chunking_and_line_ending(
            events in proptest::collection::vec(written(), 1..8),
            eol in prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
            cuts in proptest::collection::vec(0usize..2000, 0..40),
        ) {
            let decoded = decode(encode(&events, eol), cuts);
            prop_assert_eq!(decoded.len(), events.len());
            for (got, want) in decoded.iter().zip(&events) {
                prop_assert_eq!(&got.id, &want.id);
                prop_assert_eq!(&got.event, &want.event);
                prop_assert_eq!(got.retry, want.retry);
                let joined = want.data.join("\n");
                prop_assert_eq!(got.data.as_deref(), Some(joined.as_str()));
            }
        }
    }

    #[test]
    fn a_priming_event_has_an_empty_data_field_and_comments_are_dropped() {
        let decoded = decode(
            b": hi\n\nid: 0\nretry: 3000\ndata:\n\n".to_vec(),
            vec![3, 9],
        );
        assert_eq!(decoded.len(), 1);
        assert_eq!(decoded[0].id.as_deref(), Some("0"));
        assert_eq!(decoded[0].retry, Some(3000));
        assert_eq!(decoded[0].data.as_deref(), Some(""));
    }

    #[test]
    fn an_event_over_the_limit_ends_the_stream_with_its_own_error() {
        let mut bytes = b"id: 1\ndata: small\n\n".to_vec();
        bytes.extend_from_slice(b"data: ");
        bytes.extend(std::iter::repeat_n(b'x', 10_000));
        bytes.extend_from_slice(b"\n\nid: 3\ndata: after\n\n");
        let chunks: Vec<_> = bytes
            .chunks(512)
            .map(|c| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        let body = StreamBody::new(stream::iter(chunks));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let got: Vec<_> = rt.block_on(events(body, 4096).collect());
        assert_eq!(got.len(), 2, "the small event, then the error: {got:?}");
        assert_eq!(got[0].as_ref().unwrap().data.as_deref(), Some("small"));
        let e = got[1].as_ref().unwrap_err();
        assert_eq!(event_too_large(e), Some(EventTooLarge { limit: 4096 }));
    }

    #[test]
    fn an_incomplete_last_event_is_not_delivered() {
        assert!(decode(b"data: {\"half\"".to_vec(), vec![]).is_empty());
    }
}

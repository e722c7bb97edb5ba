//! What the sidecar writes to a client: a [`Reply`] (status, headers, a full body, an SSE
//! feed of a stream's buffer, or an upstream answer relayed as it comes: [`Relay`]).

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;

use crate::mcp::headers::MCP_SESSION_ID;
use crate::mcp::jsonrpc::RequestKey;
use crate::mcp::rejection::Rejection;
use crate::mcp::sse;
use crate::stream::{Feed, StoredReply};

/// The body of a [`Reply`].
#[derive(Debug)]
pub(crate) enum ReplyBody {
    /// No body (202, 204, 405…).
    Empty,
    /// A complete body.
    Full(Bytes),
    /// An SSE stream served from a session stream's buffer.
    Sse(Feed),
    /// An upstream answer relayed as it comes (2026-07-28 requests); the client going away
    /// drops it, which cancels the request.
    Relay(Relay),
}

/// A response the sidecar writes to the client.
#[derive(Debug)]
pub(crate) struct Reply {
    /// HTTP status.
    pub(crate) status: StatusCode,
    /// Headers (CORS headers are added on the way out).
    pub(crate) headers: HeaderMap,
    /// Body.
    pub(crate) body: ReplyBody,
}

impl From<Rejection> for Reply {
    fn from(r: Rejection) -> Self {
        StoredReply::from(&r).into()
    }
}

impl From<StoredReply> for Reply {
    fn from(s: StoredReply) -> Self {
        let body = if s.body.is_empty() {
            ReplyBody::Empty
        } else {
            ReplyBody::Full(s.body)
        };
        Reply {
            status: s.status,
            headers: s.headers,
            body,
        }
    }
}

impl Reply {
    /// This reply, a relayed `subscriptions/listen` stream ending at `at` as on a drain (at an
    /// event boundary, with its completion result): the credential that opened it expires
    /// then. `expired` counts such ends. Other replies are unchanged.
    pub(crate) fn until(mut self, at: tokio::time::Instant, expired: Counter) -> Self {
        if let ReplyBody::Relay(relay) = &mut self.body {
            relay.until = Some((at, expired));
        }
        self
    }

    /// The reply of rejection `r` to the request whose JSON-RPC id is `id` (its error body
    /// echoes it; `None`: `"id": null`).
    pub(crate) fn rejection(r: &Rejection, id: Option<&RequestKey>) -> Self {
        Reply::from(StoredReply::rejection(r, id))
    }

    /// A 200 reply carrying JSON `body` (a JSON-RPC answer the sidecar makes itself).
    pub(crate) fn json(body: Bytes) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Reply {
            status: StatusCode::OK,
            headers,
            body: ReplyBody::Full(body),
        }
    }

    /// An empty reply with `status` (e.g. 202 Accepted for notifications, spec T-05).
    pub(crate) fn empty(status: StatusCode) -> Self {
        Reply {
            status,
            headers: HeaderMap::new(),
            body: ReplyBody::Empty,
        }
    }

    /// A 200 SSE reply reading `feed`, with the headers proxies need to stream it (`Cache-Control:
    /// no-cache`, `X-Accel-Buffering: no`; `fr14_sse_headers_and_each_event_flushed_at_once`).
    pub(crate) fn sse(feed: Feed) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache, no-transform"),
        );
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        Reply {
            status: StatusCode::OK,
            headers,
            body: ReplyBody::Sse(feed),
        }
    }

    /// Adds the upstream's end-to-end headers that the reply does not set itself
    /// (`WWW-Authenticate`, `Mcp-Param-*`… pass through on SSE replies too;
    /// `fr15_end_to_end_headers_pass_through`).
    pub(crate) fn with_upstream_headers(mut self, upstream: &HeaderMap) -> Self {
        for name in upstream.keys() {
            if !self.headers.contains_key(name) {
                for value in upstream.get_all(name) {
                    self.headers.append(name.clone(), value.clone());
                }
            }
        }
        self
    }

    /// Adds `Mcp-Session-Id` (only on successful replies within a session).
    pub(crate) fn with_session_id(mut self, id: &str) -> Self {
        if let Ok(v) = HeaderValue::from_str(id) {
            self.headers.insert(MCP_SESSION_ID, v);
        }
        self
    }
}

/// An upstream answer relayed to the client as it arrives: its body's chunks and, for SSE,
/// keep-alive comments in its silences. Dropping it ends the upstream exchange; it holds what
/// counts it in flight ([`Relay::holding`]) until then.
pub(crate) struct Relay {
    body: BoxStream<'static, Result<Bytes, String>>,
    /// `Some(interval)` for SSE: a `: keep-alive` comment after this much silence, written only
    /// between lines (where a comment line cannot split an event).
    keep_alive: Option<Duration>,
    /// Once this turns `true` the answer ends cleanly at the next event boundary (a listen
    /// stream of a draining pod, [`Relay::ending_on`]).
    end_signal: Option<watch::Receiver<bool>>,
    /// The event written last when the answer ends on `end_signal` or `until` (the listen
    /// request's completion result), taken once.
    last_event: Option<Bytes>,
    /// When the credential that opened the answer expires: it ends there too, like on
    /// `end_signal`, counting itself in the counter ([`Reply::until`]).
    until: Option<(tokio::time::Instant, Counter)>,
    /// `until` passed: the answer is ending.
    expired: bool,
    /// The last bytes relayed (up to 4), to know whether a line or an event ended there.
    tail: u32,
    /// Whatever must live as long as the relay (a count of requests in flight).
    _held: Option<Box<dyn Send + Sync>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("keep_alive", &self.keep_alive)
            .finish_non_exhaustive()
    }
}

/// What a [`Relay`] yields next.
#[derive(Debug)]
pub(crate) enum Relayed {
    /// Bytes to write and flush.
    Data(Bytes),
    /// The answer is complete.
    End,
    /// The upstream broke the answer off: the client's connection is cut, not ended cleanly,
    /// so that it knows the answer is incomplete.
    Broken(String),
}

/// `tail` before anything was relayed: as after a blank line.
const FRESH_TAIL: u32 = u32::from_be_bytes(*b"\r\n\r\n");

impl Relay {
    /// Relays `body` (its chunks, or why it broke), with keep-alive comments after
    /// `keep_alive` of silence when it is SSE.
    pub(crate) fn new(
        body: impl futures::Stream<Item = Result<Bytes, String>> + Send + 'static,
        keep_alive: Option<Duration>,
    ) -> Self {
        Self {
            body: body.boxed(),
            keep_alive,
            end_signal: None,
            last_event: None,
            until: None,
            expired: false,
            tail: FRESH_TAIL,
            _held: None,
        }
    }

    /// This relay, ending cleanly at the first event boundary once `signal` is `true`, with
    /// `last_event` written there.
    pub(crate) fn ending_on(mut self, signal: watch::Receiver<bool>, last_event: Bytes) -> Self {
        self.end_signal = Some(signal);
        self.last_event = Some(last_event);
        self
    }

    /// This relay, keeping `held` until it is dropped.
    pub(crate) fn holding(mut self, held: impl Send + Sync + 'static) -> Self {
        self._held = Some(Box::new(held));
        self
    }

    /// Whether the last byte relayed ended a line (or nothing was relayed yet).
    fn at_line_start(&self) -> bool {
        self.tail & 0xff == u32::from(b'\n') || self.tail & 0xff == u32::from(b'\r')
    }

    /// Whether the bytes relayed end with a blank line, where an SSE event ends (or nothing was
    /// relayed yet).
    fn at_event_start(&self) -> bool {
        let [.., a, b] = self.tail.to_be_bytes();
        self.tail == FRESH_TAIL || matches!([a, b], [b'\n', b'\n'] | [b'\r', b'\r'])
    }

    /// Whether the answer is to end: the signal came, or the credential expired (counted once).
    fn ending(&mut self) -> bool {
        if let Some((at, counter)) = &self.until
            && tokio::time::Instant::now() >= *at
        {
            counter.inc();
            self.until = None;
            self.expired = true;
        }
        self.expired || self.end_signal.as_ref().is_some_and(|s| *s.borrow())
    }

    /// The next chunk of the answer, a keep-alive comment, or its end.
    pub(crate) async fn next(&mut self) -> Relayed {
        loop {
            if self.ending() && self.at_event_start() {
                return match self.last_event.take() {
                    Some(event) => Relayed::Data(event),
                    None => Relayed::End,
                };
            }
            // While ending mid-event, only the rest of the event is awaited.
            let until = self.until.as_ref().map(|(at, _)| *at);
            let signal = self.end_signal.as_mut().filter(|s| !*s.borrow());
            let keep_alive = self.keep_alive;
            tokio::select! {
                () = sleep_until_or_never(until) => {}
                chunk = self.body.next() => return self.relayed(chunk),
                () = sleep_or_never(keep_alive) => {
                    if self.at_line_start() {
                        return Relayed::Data(Bytes::from_static(sse::KEEP_ALIVE_LINE));
                    }
                }
                _ = changed_or_never(signal) => {}
            }
        }
    }

    fn relayed(&mut self, chunk: Option<Result<Bytes, String>>) -> Relayed {
        match chunk {
            None => Relayed::End,
            Some(Err(e)) => Relayed::Broken(e),
            Some(Ok(bytes)) => {
                for b in bytes.iter().rev().take(4).rev() {
                    self.tail = (self.tail << 8) | u32::from(*b);
                }
                Relayed::Data(bytes)
            }
        }
    }
}

/// Sleeps until `at`, or forever without it.
async fn sleep_until_or_never(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sleeps `interval`, or forever without one.
async fn sleep_or_never(interval: Option<Duration>) {
    match interval {
        Some(interval) => tokio::time::sleep(interval).await,
        None => std::future::pending().await,
    }
}

/// Resolves when `signal` changes (or its sender is gone); never without one.
async fn changed_or_never(signal: Option<&mut watch::Receiver<bool>>) {
    match signal {
        Some(signal) => {
            if signal.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::rejection::NotFound;

    #[test]
    fn rejection_replies_carry_no_session_id() {
        let reply = Reply::from(Rejection::SessionNotFound(NotFound::Unknown));
        assert_eq!(reply.status, StatusCode::NOT_FOUND);
        assert!(reply.headers.get(MCP_SESSION_ID).is_none());
    }

    fn relay(chunks: Vec<Result<&'static [u8], &'static str>>, gap: Duration) -> Relay {
        let body = futures::stream::iter(chunks).then(move |chunk| async move {
            tokio::time::sleep(gap).await;
            chunk.map(Bytes::from_static).map_err(str::to_owned)
        });
        Relay::new(body, Some(Duration::from_millis(100)))
    }

    async fn collect(mut relay: Relay) -> (Vec<Bytes>, Relayed) {
        let mut out = Vec::new();
        loop {
            match relay.next().await {
                Relayed::Data(bytes) => out.push(bytes),
                end => return (out, end),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn l05_silences_get_keep_alive_lines_between_lines_only() {
        let chunks = vec![Ok(&b"data: a\n\n"[..]), Ok(b"data: b"), Ok(b"c\n\n")];
        let (out, end) = collect(relay(chunks, Duration::from_millis(250))).await;
        assert!(matches!(end, Relayed::End), "{end:?}");
        let text: Vec<&[u8]> = out.iter().map(|b| b.as_ref()).collect();
        // Two silences before the first chunk and after it; none inside the split line.
        assert_eq!(
            text,
            [
                sse::KEEP_ALIVE_LINE,
                sse::KEEP_ALIVE_LINE,
                b"data: a\n\n",
                sse::KEEP_ALIVE_LINE,
                sse::KEEP_ALIVE_LINE,
                b"data: b",
                b"c\n\n",
            ]
        );
    }

    /// A listen stream of a draining pod ends cleanly, never inside an event: the event under
    /// way (split over chunks) is finished first, then the last event (the listen request's
    /// completion result), and nothing of the upstream after it is relayed.
    #[tokio::test(start_paused = true)]
    async fn an_ending_relay_ends_at_the_next_event_boundary() {
        let (signal, rx) = watch::channel(false);
        let chunks = vec![
            Ok(&b"data: a\n\ndata: b"[..]),
            Ok(b"c\n"),
            Ok(b"\n"),
            Ok(b"data: d\n\n"),
        ];
        let last = Bytes::from_static(b"data: done\n\n");
        let mut relay = relay(chunks, Duration::from_millis(10)).ending_on(rx, last.clone());
        assert!(
            matches!(relay.next().await, Relayed::Data(b) if b.as_ref() == b"data: a\n\ndata: b")
        );
        signal.send_replace(true);
        let (out, end) = collect(relay).await;
        assert!(matches!(end, Relayed::End), "{end:?}");
        let text: Vec<&[u8]> = out.iter().map(|b| b.as_ref()).collect();
        assert_eq!(
            text,
            [&b"c\n"[..], b"\n", b"data: done\n\n"],
            "the event under way, then the last event"
        );
        // Silent and between events: it ends as soon as the signal comes.
        let (signal, rx) = watch::channel(false);
        let silent = futures::stream::pending::<Result<Bytes, String>>();
        let relay = Relay::new(silent, None).ending_on(rx, last.clone());
        let waiting = tokio::spawn(collect(relay));
        tokio::time::sleep(Duration::from_secs(60)).await;
        signal.send_replace(true);
        let (out, end) = waiting.await.unwrap();
        assert!(matches!(end, Relayed::End));
        assert_eq!(out, [last]);
    }

    /// A listen stream opened with a credential that expires ends there like on a drain: at an
    /// event boundary, with its last event, counted once.
    #[tokio::test(start_paused = true)]
    async fn a_relay_ends_when_its_credential_expires() {
        let (_signal, rx) = watch::channel(false);
        let expired = Counter::<u64>::default();
        let last = Bytes::from_static(b"data: done\n\n");
        let at = tokio::time::Instant::now() + Duration::from_secs(30);
        let chunks = vec![
            Ok(&b"data: a\n\ndata: b"[..]),
            Ok(b"c\n\n"),
            Ok(b"data: d\n\n"),
        ];
        let relay = relay(chunks, Duration::from_secs(20)).ending_on(rx, last.clone());
        let reply = Reply {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: ReplyBody::Relay(relay),
        }
        .until(at, expired.clone());
        let ReplyBody::Relay(relay) = reply.body else {
            panic!("a relay stays a relay");
        };
        let (out, end) = collect(relay).await;
        assert!(matches!(end, Relayed::End), "{end:?}");
        let text: Vec<&[u8]> = out
            .iter()
            .map(|b| b.as_ref())
            .filter(|b| *b != sse::KEEP_ALIVE_LINE)
            .collect();
        assert_eq!(
            text,
            [&b"data: a\n\ndata: b"[..], b"c\n\n", b"data: done\n\n"],
            "the event under way at 30 s is finished, then the last event"
        );
        assert_eq!(expired.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_broken_upstream_body_is_not_a_clean_end() {
        let chunks = vec![Ok(&b"{"[..]), Err("reset")];
        let (out, end) = collect(relay(chunks, Duration::ZERO)).await;
        assert_eq!(out.len(), 1);
        assert!(matches!(end, Relayed::Broken(e) if e == "reset"));
    }
}

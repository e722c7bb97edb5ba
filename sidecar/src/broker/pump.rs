//! Upstream tasks: send a request, then pump its SSE answer into the stream buffer.
//!
//! A task is independent of the client connection (spec L-01): it ends when its requests are
//! answered, when the client cancels them (`notifications/cancelled`, L-02) or when the session
//! ends. An upstream that closes an SSE connection before the stream is over (SEP-1699 polling,
//! spec) is resumed by the task itself with `GET` + the upstream's `Last-Event-ID`,
//! after the upstream's `retry` delay, invisibly to the client; events the upstream sends again
//! on resume are recognised by their upstream id and dropped. An event larger than
//! `--max-event-bytes` is never buffered: reading stops there. A request that cannot be finished
//! ends with a JSON-RPC error for its id on the stream, so a client never hangs.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use hyper::body::Incoming;
use serde_json::Value;
use sse_stream::Sse;

use super::Broker;
use super::calls::CallSlot;
use super::metrics::UpstreamFailure;
use super::rebuild::Sent;
use super::rerun::Rerun;
use crate::mcp::headers::MCP_PROTOCOL_VERSION;
use crate::mcp::jsonrpc::{Message, RequestKey};
use crate::mcp::principal::Owner;
use crate::mcp::rejection::{NotFound, Rejection};
use crate::mcp::sse_limit::EventTooLarge;
use crate::mcp::tasks::Revision;
use crate::session::Session;
use crate::stream::{StoredReply, Stream, StreamKind, refuses_caller};
use crate::upstream::{UpstreamError, event_too_large, events, is_sse, read_body};

/// `data.reason` of the error that ends a request whose upstream stream was lost.
const UPSTREAM_STREAM_LOST: &str = "upstream_stream_lost";

/// Upstream event ids remembered per stream to drop events sent again on resume.
const RECENT_IDS: usize = 64;

/// How often a paused upstream task looks for room made without a reader (the pod's cap, the
/// TTL of events nobody reads).
const ROOM_POLL: Duration = Duration::from_millis(100);

/// Where an upstream stream stands, for resuming it.
#[derive(Debug, Default)]
pub(crate) struct UpstreamCursor {
    last_id: Option<String>,
    retry: Option<Duration>,
    recent: VecDeque<String>,
}

impl UpstreamCursor {
    /// Records the id of a message event; `false` when that message was seen before (sent again on
    /// resume). Priming events are not recorded: rmcp gives the standalone stream's priming event
    /// the id of the first message to come
    /// (https://github.com/modelcontextprotocol/rust-sdk/issues/791).
    fn first_time(&mut self, id: &str) -> bool {
        if self.recent.iter().any(|r| r == id) {
            return false;
        }
        if self.recent.len() == RECENT_IDS {
            self.recent.pop_front();
        }
        self.recent.push_back(id.to_owned());
        true
    }

    /// What one decoded upstream event adds to the stream: its `event` field (`message`, the
    /// default, left out) and its data. `None` for blocks that carry no message (priming and
    /// retry-only blocks, comments-only data) and for messages sent again on resume. Records the
    /// event's id and `retry` hint either way.
    pub(crate) fn take(&mut self, ev: Sse) -> Option<(Option<String>, Bytes)> {
        if let Some(retry) = ev.retry {
            self.retry = Some(Duration::from_millis(retry));
        }
        if let Some(id) = &ev.id {
            self.last_id = Some(id.clone());
        }
        let data = ev.data.filter(|d| !d.is_empty())?;
        if let Some(id) = &ev.id
            && !self.first_time(id)
        {
            return None;
        }
        // Shrunk to its length: the decoder grows the string as it reads, and a buffered event
        // keeps its allocation for as long as it is kept.
        let data = Bytes::from(data.into_bytes().into_boxed_slice());
        Some((ev.event.filter(|e| e != "message"), data))
    }

    /// The id of the newest upstream event that had one (the `Last-Event-ID` of a resume).
    #[cfg(fuzzing)]
    pub(crate) fn last_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// The newest `retry` hint of the upstream.
    #[cfg(fuzzing)]
    pub(crate) fn retry(&self) -> Option<Duration> {
        self.retry
    }
}

enum BodyEnd {
    /// The stream needs nothing more from this task.
    Done,
    /// The upstream ended the connection; `progressed` tells whether new events came.
    Closed { progressed: bool },
}

enum Resumed {
    Body(Incoming),
    Failed,
    Unsupported,
    /// The upstream session was rebuilt: the stream's upstream side is gone.
    Rebuilt,
    SessionGone,
}

/// One upstream POST of a session's request(s).
pub(super) struct Dispatch {
    /// The upstream headers (the client's credentials among them).
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
    /// The requests this exchange answers.
    pub(super) ids: Vec<RequestKey>,
    /// Its journal entries, recorded once the MCP server accepted it (checked to fit before).
    pub(super) journal: Vec<(Message, Value)>,
    /// What a second dispatch of it would do: a harmful one waits for the write-ahead.
    pub(super) rerun: Rerun,
}

impl Broker {
    /// Sends one request upstream and serves its answer through `stream`; `ids` are the requests
    /// this task is responsible for (all of the stream's, or one of a batch). `slots` holds the
    /// request's place among the calls in flight until the exchange ends (a batch's are held by
    /// the batch).
    pub(super) async fn run_request(
        self: Arc<Self>,
        session: Arc<Session>,
        stream: Arc<Stream>,
        dispatch: Dispatch,
        _slots: Option<CallSlot>,
    ) {
        let Dispatch {
            headers,
            body,
            ids,
            journal,
            rerun,
        } = dispatch;
        let send = async {
            self.write_ahead(&session, &ids, rerun).await;
            self.send_in_session(&session, Method::POST, &headers, None, body, true)
                .await
        };
        let sent = tokio::select! {
            sent = send => sent,
            () = stream.cancel_token().cancelled() => return,
        };
        if tracing::enabled!(tracing::Level::DEBUG) {
            let outcome = match &sent {
                Ok(Sent::Answer(resp)) => resp.status().as_str().to_owned(),
                Ok(Sent::Denied(reply)) => format!("rebuild denied {}", reply.status.as_u16()),
                Ok(Sent::Rebuilt | Sent::Gone) => "upstream session lost".to_owned(),
                Err(e) => e.to_string(),
            };
            tracing::debug!(session = session.digest(), stream = %stream.key(), outcome, "upstream answered");
        }
        let resp = match sent {
            Ok(Sent::Answer(resp)) => resp,
            Ok(Sent::Denied(reply)) => {
                self.deliver(&session, &stream, &ids, reply);
                return;
            }
            Ok(Sent::Rebuilt | Sent::Gone) => {
                self.fail(
                    &stream,
                    &ids,
                    Rejection::SessionNotFound(NotFound::UpstreamGone),
                );
                return;
            }
            Err(e) => {
                let rejection = self.upstream_rejection(&e);
                if let UpstreamError::Refused(_) | UpstreamError::NotReady = e
                    && stream.kind() == StreamKind::Post
                {
                    // Nothing was answered: a retry may dispatch the request again.
                    self.metrics.rejection(&rejection);
                    session.withdraw_post(
                        &stream,
                        StoredReply::rejection(&rejection, ids.first()),
                        self.cfg().max_session_retry_bytes,
                    );
                } else {
                    self.fail(&stream, &ids, rejection);
                }
                return;
            }
        };
        self.note_acceptance(&session, &headers, resp.status());
        if !refuses_caller(resp.status()) {
            self.record_accepted(&session, &journal);
        }
        if resp.status() == StatusCode::OK && is_sse(&resp) {
            stream.mark_sse(crate::mcp::headers::forwarded_response_headers(
                resp.headers(),
            ));
            let origin = session.upstream_id();
            self.pump(&session, &stream, resp.into_body(), &ids, headers, origin)
                .await;
            if rerun == Rerun::Lists
                && let Some(answer) = ids.first().and_then(|id| stream.answer(id))
            {
                self.learn_tools(&answer);
            }
            return;
        }
        let owner = Owner::of_session(session.binding());
        match self.read_stored(resp, &owner).await {
            Ok(stored) => {
                if rerun == Rerun::Lists && stored.status == StatusCode::OK {
                    self.learn_tools(&stored.body);
                }
                self.deliver(&session, &stream, &ids, stored);
            }
            Err(rejection) => self.fail(&stream, &ids, rejection),
        }
    }

    /// Serves the upstream's complete non-SSE answer to requests `ids` through `stream`: kept
    /// as a POST's reply (for its retries, unless it is a refusal), or a batch member's answer.
    fn deliver(
        &self,
        session: &Session,
        stream: &Arc<Stream>,
        ids: &[RequestKey],
        stored: StoredReply,
    ) {
        if stream.kind() != StreamKind::Post {
            self.append_answer(stream, ids, &stored);
            return;
        }
        if stored.is_refusal() {
            // Not the request's outcome: the client waiting gets it, and the same message sent
            // again (a refreshed token, after Retry-After) is dispatched.
            session.withdraw_post(stream, stored, self.cfg().max_session_retry_bytes);
            return;
        }
        session.keep_reply(stream, stored, self.cfg().max_session_retry_bytes);
    }

    /// Pumps upstream SSE into `stream`, resuming the upstream stream when it closes early.
    /// `origin` is the upstream session the stream lives in: once the session was rebuilt, the
    /// stream's upstream side is gone, and its upstream event ids mean nothing in the new
    /// upstream session (resuming with them could fetch another request's events).
    pub(super) async fn pump(
        self: &Arc<Self>,
        session: &Arc<Session>,
        stream: &Arc<Stream>,
        body: Incoming,
        ids: &[RequestKey],
        headers: HeaderMap,
        mut origin: Option<String>,
    ) {
        let mut cursor = UpstreamCursor::default();
        let mut body = Some(body);
        let mut failures = 0u32;
        loop {
            if let Some(b) = body.take() {
                match self.pump_body(session, stream, b, ids, &mut cursor).await {
                    BodyEnd::Done => return,
                    BodyEnd::Closed { progressed: true } => failures = 0,
                    BodyEnd::Closed { progressed: false } => {}
                }
                if stream.kind() == StreamKind::Standalone
                    && session.upstream_id().is_none()
                    && self.registry.departed(session.id()).is_some()
                {
                    // The session was handed off and its upstream session ended here
                    // (`Broker::end_departed_upstream`): everything it sent is in the stream.
                    session.clear_standalone(stream);
                    stream.complete();
                    return;
                }
            }
            let answers = stream.kind().answers_requests();
            if answers && !stream.any_pending(ids) {
                return;
            }
            if answers && cursor.last_id.is_none() {
                self.fail_stream(
                    stream,
                    ids,
                    "the MCP server closed the stream before responding, without an event id to resume from",
                );
                return;
            }
            failures += 1;
            if failures > self.cfg().upstream_resume_attempts {
                self.metrics
                    .upstream_error(UpstreamFailure::ResumeExhausted);
                self.give_up(session, stream, ids);
                return;
            }
            let wait = cursor.retry.unwrap_or(self.cfg().upstream_retry);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stream.cancel_token().cancelled() => return,
            }
            let resumed = if session.upstream_id() == origin {
                self.resume_upstream(session, &headers, cursor.last_id.as_deref())
                    .await
            } else {
                Resumed::Rebuilt
            };
            match resumed {
                Resumed::Body(b) => {
                    self.metrics.upstream_resumed();
                    body = Some(b);
                }
                Resumed::Failed => {}
                Resumed::Unsupported => {
                    self.give_up(session, stream, ids);
                    return;
                }
                Resumed::SessionGone => return,
                Resumed::Rebuilt if stream.kind().answers_requests() => {
                    // The call died with the old upstream session.
                    self.fail_stream(stream, ids, "the MCP server restarted; the call was lost");
                    return;
                }
                Resumed::Rebuilt => {
                    // A fresh standalone stream on the rebuilt upstream session.
                    cursor = UpstreamCursor::default();
                    failures = 0;
                    origin = session.upstream_id();
                }
            }
        }
    }

    async fn pump_body(
        &self,
        session: &Session,
        stream: &Arc<Stream>,
        body: Incoming,
        ids: &[RequestKey],
        cursor: &mut UpstreamCursor,
    ) -> BodyEnd {
        let mut events = std::pin::pin!(events(body, self.cfg().max_event_bytes));
        let owner = Owner::of_session(session.binding());
        let mut progressed = false;
        loop {
            let next = tokio::select! {
                biased;
                () = stream.cancel_token().cancelled() => return BodyEnd::Done,
                next = events.next() => next,
            };
            let ev = match next {
                Some(Ok(ev)) => ev,
                Some(Err(e)) => {
                    if let Some(too_large) = event_too_large(&e) {
                        self.drop_oversized(session, stream, ids, too_large);
                        return BodyEnd::Done;
                    }
                    tracing::debug!(error = %e, "upstream SSE stream broke");
                    return BodyEnd::Closed { progressed };
                }
                None => return BodyEnd::Closed { progressed },
            };
            tracing::trace!(upstream_id = ?ev.id, data = ev.data.as_ref().map(String::len), "upstream event");
            let Some((event, data)) = cursor.take(ev) else {
                continue;
            };
            self.watch_tools(&data);
            let data = match self.seal_answer(&data, &owner, Revision::Session) {
                Ok(sealed) => sealed.map_or(data, Bytes::from),
                Err(rejection) => {
                    self.metrics.rejection(&rejection);
                    self.fail_stream(stream, ids, rejection.reason());
                    return BodyEnd::Done;
                }
            };
            if !self.room_for(session, stream).await {
                return BodyEnd::Done;
            }
            let appended = stream.append(event, data, Instant::now());
            self.metrics.event_buffered();
            self.metrics.evictions(&appended);
            self.enforce_budget_soon();
            self.enforce_share(session);
            progressed = true;
            if stream.kind().answers_requests() && !stream.any_pending(ids) {
                return BodyEnd::Done;
            }
        }
    }

    /// Keeps `session`'s event buffers within its share when they are over it
    /// ([`Session::evict_for_share`]).
    fn enforce_share(&self, session: &Session) {
        let evicted = session.evict_for_share();
        if evicted > 0 {
            self.metrics.evictions(&crate::stream::buffer::Evictions {
                session_cap: evicted,
                ..Default::default()
            });
        }
    }

    /// Waits until `stream` may take another event (`docs/design/buffering.md#backpressure`):
    /// meanwhile this task reads nothing more of the upstream response, so TCP holds the MCP
    /// server back as it would behind a plain proxy. `false` when the task must stop instead
    /// (the stream ended, the session ended).
    async fn room_for(&self, session: &Session, stream: &Stream) -> bool {
        if stream.has_room() {
            return true;
        }
        self.metrics.upstream_paused();
        let since = Instant::now();
        let resumed = loop {
            self.enforce_budget_soon();
            self.enforce_share(session);
            if stream.has_room() {
                break true;
            }
            tokio::select! {
                biased;
                () = stream.cancel_token().cancelled() => break false,
                () = stream.wait_room() => {}
                () = tokio::time::sleep(ROOM_POLL) => {}
            }
        };
        self.metrics.upstream_resumed_reading(since.elapsed());
        resumed
    }

    async fn resume_upstream(
        self: &Arc<Self>,
        session: &Arc<Session>,
        headers: &HeaderMap,
        last_event_id: Option<&str>,
    ) -> Resumed {
        // The session's latest credentials: the request's token may have been refreshed since.
        let mut headers = session.with_credentials(headers.clone());
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.remove(header::CONTENT_TYPE);
        if let Ok(v) = HeaderValue::from_str(session.version().as_str()) {
            headers.insert(MCP_PROTOCOL_VERSION, v);
        }
        let sent = self
            .send_in_session(
                session,
                Method::GET,
                &headers,
                last_event_id,
                Bytes::new(),
                false,
            )
            .await;
        match sent {
            Ok(Sent::Gone) => Resumed::SessionGone,
            Ok(Sent::Rebuilt) => Resumed::Rebuilt,
            Ok(Sent::Denied(reply)) => {
                self.metrics.upstream_error(UpstreamFailure::ResumeRefused);
                tracing::debug!(status = %reply.status, "upstream refused the rebuild a stream resume needs");
                Resumed::Failed
            }
            Ok(Sent::Answer(resp)) if resp.status() == StatusCode::METHOD_NOT_ALLOWED => {
                Resumed::Unsupported
            }
            Ok(Sent::Answer(resp)) if resp.status() == StatusCode::OK && is_sse(&resp) => {
                Resumed::Body(resp.into_body())
            }
            Ok(Sent::Answer(resp)) => {
                self.metrics.upstream_error(UpstreamFailure::ResumeRefused);
                tracing::debug!(status = %resp.status(), "upstream refused a stream resume");
                Resumed::Failed
            }
            Err(e) => {
                self.metrics
                    .upstream_error(UpstreamFailure::ResumeUnavailable);
                tracing::debug!(error = %e, "upstream stream resume failed");
                Resumed::Failed
            }
        }
    }

    /// Stops reading an upstream stream at an event larger than `--max-event-bytes` (never
    /// buffered): its requests end with a JSON-RPC error naming the limit
    /// (`data.reason` = `event_too_large`); a standalone stream is closed and the event is
    /// lost: the next GET opens a new one (resuming upstream would fetch the same event again).
    fn drop_oversized(
        &self,
        session: &Session,
        stream: &Arc<Stream>,
        ids: &[RequestKey],
        too_large: EventTooLarge,
    ) {
        self.metrics.upstream_event_too_large();
        tracing::warn!(
            session = session.digest(),
            limit = too_large.limit,
            "the MCP server sent an SSE event over --max-event-bytes; the stream was cut"
        );
        let message = format!(
            "event_too_large: the MCP server sent an SSE event larger than {} bytes \
             (--max-event-bytes)",
            too_large.limit
        );
        end_stream(session, stream, ids, &message, "event_too_large");
    }

    /// Gives a stream up after repeated failures: POST requests end with an error; the
    /// standalone stream is closed and the next GET opens a new one.
    fn give_up(&self, session: &Session, stream: &Arc<Stream>, ids: &[RequestKey]) {
        end_stream(
            session,
            stream,
            ids,
            "the MCP server's stream could not be resumed",
            UPSTREAM_STREAM_LOST,
        );
    }

    /// Ends requests `ids` on `stream` with a JSON-RPC error (a client never hangs).
    fn fail_stream(&self, stream: &Stream, ids: &[RequestKey], message: &str) {
        stream.fail_pending(ids, message, UPSTREAM_STREAM_LOST);
    }

    /// Reports a failure before any answer: as the POST's reply (single request) or as error
    /// events (batch member).
    fn fail(&self, stream: &Stream, ids: &[RequestKey], rejection: Rejection) {
        self.metrics.rejection(&rejection);
        if stream.kind() == StreamKind::Batch {
            self.fail_stream(stream, ids, rejection.reason());
        } else {
            stream.store_reply(StoredReply::rejection(&rejection, ids.first()));
        }
    }

    /// Appends a batch member's non-SSE answer as events: its JSON-RPC message when the
    /// upstream answered with one, else an error for its ids.
    fn append_answer(&self, stream: &Stream, ids: &[RequestKey], stored: &StoredReply) {
        if stored.status.is_success() && !stored.body.is_empty() {
            stream.append(None, stored.body.clone(), Instant::now());
        }
        if stream.any_pending(ids) {
            let message = format!("the MCP server answered HTTP {}", stored.status.as_u16());
            self.fail_stream(stream, ids, &message);
        }
    }

    /// Reads an upstream answer whole (status, end-to-end headers, body), its task ids sealed
    /// for `owner`.
    pub(super) async fn read_stored(
        &self,
        resp: http::Response<Incoming>,
        owner: &Owner,
    ) -> Result<StoredReply, Rejection> {
        let status = resp.status();
        let headers = crate::mcp::headers::forwarded_response_headers(resp.headers());
        let (max_bytes, timeout) = {
            let cfg = self.cfg();
            (cfg.max_upstream_body_bytes, cfg.upstream_body_timeout)
        };
        let body = read_body(resp.into_body(), max_bytes, timeout)
            .await
            .map_err(|e| {
                self.metrics.upstream_error(UpstreamFailure::Body);
                tracing::debug!(error = %e, "upstream body not read");
                match e {
                    crate::upstream::BodyError::Timeout(_) => Rejection::UpstreamTimeout,
                    _ => Rejection::UpstreamLost,
                }
            })?;
        let body = match status.is_success() {
            true => self
                .seal_answer(&body, owner, Revision::Session)?
                .map_or(body, Bytes::from),
            false => body,
        };
        Ok(StoredReply {
            status,
            headers,
            body,
        })
    }

    /// The rejection for an upstream failure, counted.
    pub(super) fn upstream_rejection(&self, e: &UpstreamError) -> Rejection {
        tracing::warn!(error = %e, "upstream request failed");
        match e {
            UpstreamError::Refused(_) => {
                self.metrics.upstream_error(UpstreamFailure::Refused);
                Rejection::UpstreamUnavailable
            }
            UpstreamError::Unavailable(_) => {
                self.metrics.upstream_error(UpstreamFailure::Lost);
                Rejection::UpstreamLost
            }
            UpstreamError::Timeout(_) => {
                self.metrics.upstream_error(UpstreamFailure::Timeout);
                Rejection::UpstreamTimeout
            }
            UpstreamError::NotReady => {
                self.metrics.upstream_error(UpstreamFailure::NotReady);
                Rejection::UpstreamNotReady
            }
        }
    }
}

/// Ends a stream whose upstream side is lost: requests `ids` get a JSON-RPC error (`message`,
/// `data.reason` = `reason`); a standalone stream is closed, and the next GET opens a new one.
fn end_stream(
    session: &Session,
    stream: &Arc<Stream>,
    ids: &[RequestKey],
    message: &str,
    reason: &str,
) {
    match stream.kind() {
        StreamKind::Post | StreamKind::Batch => stream.fail_pending(ids, message, reason),
        StreamKind::Standalone => {
            session.clear_standalone(stream);
            stream.complete();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replayed_upstream_events_are_recognised() {
        let mut c = UpstreamCursor::default();
        assert!(c.first_time("0/1"));
        assert!(c.first_time("1/1"));
        assert!(
            !c.first_time("1/1"),
            "rmcp re-sends the Last-Event-ID event on resume"
        );
        for i in 2..200 {
            assert!(c.first_time(&format!("{i}/1")));
        }
        assert_eq!(c.recent.len(), RECENT_IDS);
    }
}

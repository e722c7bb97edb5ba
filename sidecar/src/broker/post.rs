//! POST within a session: requests, notifications and retries
//! (`docs/design/architecture.md#request-path`).
//!
//! - A body with requests gets a stream: the upstream call runs in its own task, and the client
//!   is served from the stream's buffer (SSE) or gets the upstream's JSON answer unchanged.
//! - A body with only notifications or responses is forwarded and the upstream's status (202,
//!   spec T-05) passes through unchanged; `notifications/cancelled` also ends the local stream of
//!   the cancelled request (spec L-02) once the MCP server accepted it.
//! - Journal entries (`session/journal.rs`) are checked to fit before anything is sent and
//!   recorded once the MCP server accepted the message that carries them: a credential it
//!   refuses (a forged token that passes the binding) changes nothing in the session.
//! - A request id already seen in the session with the same body is a retry: it attaches to the
//!   existing stream instead of being dispatched again, so the upstream sees it exactly once.
//!   The same id with another body is a new request once the first was answered (clients that
//!   send `id: 1` every time), and 400 while the first still runs (spec S-09; two requests of
//!   one id in flight could not be told apart). A retry that joined a request which was not
//!   carried out — refused for its caller (401, 429…) or never received by the MCP server, here
//!   or at the pod that held the session before a handoff — is dispatched itself, once.
//! - Batches (2025-03-26 only, B-01) are dispatched one message per upstream POST, all answers
//!   merged into one SSE stream.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;
use tether_crds::ProtocolVersion;

use super::Broker;
use super::calls::CallSlot;
use super::metrics::IdReuse;
use super::pump::Dispatch;
use super::rebuild::Sent;
use super::rerun::Rerun;
use crate::mcp::admission::Admitted;
use crate::mcp::jsonrpc::{
    self, Body, CODE_TRANSPORT, Envelope, Message, RequestKey, error_response,
};
use crate::mcp::methods::CANCELLED;
use crate::mcp::principal::Owner;
use crate::mcp::rejection::{NotFound, Rejection};
use crate::mcp::tasks::Revision;
use crate::reply::Reply;
use crate::session::{Dedupe, EnterGuard, Entry, Session, journal};
use crate::stream::{Head, Start, StoredReply, Stream, StreamKind, refuses_caller};

impl Broker {
    pub(super) async fn post(
        self: &Arc<Self>,
        call: &Admitted,
        body: Body,
        entered: Option<EnterGuard>,
    ) -> Result<Reply, Rejection> {
        self.post_once(call, body, entered, true).await
    }

    /// [`Broker::post`]; with `may_redispatch`, a retry whose request was withdrawn
    /// ([`Stream::is_withdrawn`]) is handled once more as a new request.
    async fn post_once(
        self: &Arc<Self>,
        call: &Admitted,
        body: Body,
        entered: Option<EnterGuard>,
        may_redispatch: bool,
    ) -> Result<Reply, Rejection> {
        let (body, parsed) = body.into_parts(call.limits);
        // Batching follows the session's negotiated version, whatever the header claims: only a
        // 2025-03-26 session may batch (B-01/B-02), checked before the body is parsed. A batch
        // without a session is refused below (`initialize` is never batched; anything else
        // needs the session).
        let early = match call.session_id {
            Some(_) if jsonrpc::is_batch(&body) => {
                let session = self.entered_session(call, entered.as_ref())?;
                if session.version() != ProtocolVersion::V2025_03_26 {
                    return Err(Rejection::BatchNotAllowed);
                }
                Some(session)
            }
            _ => None,
        };
        let mut envelope = parsed.map_err(Rejection::from)?;
        if envelope.is_initialize() {
            let id = envelope.request_ids().remove(0);
            self.metrics
                .protocol_version(call.version.unwrap_or(ProtocolVersion::V2025_03_26));
            let request = envelope.messages.into_iter().next().map(|(_, v)| v);
            return self.initialize(call, request.unwrap_or_default(), id).await;
        }
        if envelope.contains_initialize() {
            return Err(Rejection::InitializeInBatch);
        }
        let session = match early {
            Some(session) => session,
            None => self.entered_session(call, entered.as_ref())?,
        };
        // The retry digest stays the client's: its task ids are the same on every retry.
        let owner = || Owner::of_session(session.binding());
        let body = match self.open_sealed(&mut envelope, body, Revision::Session, owner) {
            Ok((body, _)) => body,
            Err(rejection) => {
                return Ok(self.task_miss_reply(&rejection, &envelope, Revision::Session));
            }
        };
        if !envelope.request_ids().is_empty() {
            // Before the journal may grow: a request adds to what the pod pins.
            self.admit_pinning(session.binding().and_then(|b| b.principal))?;
        }
        let _busy = session.busy();
        session.forget_initialize_stream();
        // Journal entries are recorded once the MCP server accepted the message that carries
        // them (a credential it refuses changes nothing); one that would not fit is refused
        // before anything is sent.
        let journaled: Vec<(Message, Value)> = envelope
            .messages
            .iter()
            .filter(|(message, _)| journal::belongs(message))
            .cloned()
            .collect();
        session.check_journal(&journaled, self.cfg().max_journal_bytes)?;
        self.metrics
            .protocol_version(call.version.unwrap_or(session.version()));
        let ids = envelope.request_ids();
        if ids.is_empty() {
            // Held until the notifications are forwarded and their journal entries recorded:
            // a handoff after that carries them.
            let reply = self.notify(call, &session, &envelope, body).await;
            drop(entered);
            return reply;
        }
        let kind = if envelope.batch {
            StreamKind::Batch
        } else {
            StreamKind::Post
        };
        // A new request over a bound of calls in flight is refused before anything is built
        // for it: a refusal that made a stream and a record cost a flood as much as a call.
        // A retry still joins or replays its request.
        let principal = session.binding().and_then(|b| b.principal);
        let taken = if session.is_new(&ids, envelope.digest) {
            let taken = self.calls.take(session.digest(), principal, ids.len());
            Some(taken.map_err(Rejection::TooManyCalls)?)
        } else {
            None
        };
        let stream = self.new_stream(&session, kind, ids.clone());
        let claimed = session.claim(&ids, envelope.digest, &stream, self.retry_room());
        // The stream is registered: a handoff from now on carries it.
        drop(entered);
        match claimed {
            Dedupe::Conflict => {
                self.metrics.request_id_reuse(IdReuse::Refused);
                Err(Rejection::RequestIdReused)
            }
            Dedupe::SessionFull(limit) => Err(Rejection::RetryStateFull(limit)),
            Dedupe::Ended => Err(Rejection::SessionNotFound(
                self.registry.why_missing(session.digest()),
            )),
            Dedupe::Expired(id) => {
                self.metrics.request_id_reuse(IdReuse::Expired);
                Ok(expired_reply(&id).with_session_id(session.id()))
            }
            Dedupe::Answered(stored) => {
                self.metrics.request_id_reuse(IdReuse::Replayed);
                tracing::debug!(
                    session = session.digest(),
                    "a retry gets its request's answer again"
                );
                if let Err(refusal) = self.revalidate(&session, &call.headers).await {
                    return Ok(refusal);
                }
                Ok(stored_reply(&session, stored))
            }
            Dedupe::Retry(existing) => {
                self.metrics.request_id_reuse(IdReuse::Joined);
                tracing::debug!(session = session.digest(), stream = %existing.key(), following = ?existing.following(), "a retry joins its request's stream");
                if let Err(refusal) = self.revalidate(&session, &call.headers).await {
                    return Ok(refusal);
                }
                let reply = self.serve_post(&session, &existing).await;
                if may_redispatch
                    && existing.is_withdrawn()
                    && let Entry::Entered(guard) = session.enter()
                {
                    // Its answer was no outcome: this request, with its own credentials, is
                    // dispatched (its record went with the withdrawal).
                    return Box::pin(self.post_once(call, Body::new(body), Some(guard), false))
                        .await;
                }
                reply
            }
            verdict @ (Dedupe::New | Dedupe::Reused) => {
                if matches!(verdict, Dedupe::Reused) {
                    self.metrics.request_id_reuse(IdReuse::Run);
                }
                // A request sent now holds call slots until its exchange ends (a retry that
                // joins it takes none); over a bound it is not sent, and a later retry is.
                let slots = taken.map_or_else(
                    || self.calls.take(session.digest(), principal, ids.len()),
                    Ok,
                );
                let slots = match slots {
                    Ok(slots) => Some(slots),
                    Err(scope) => {
                        let rejection = Rejection::TooManyCalls(scope);
                        session.withdraw_post(
                            &stream,
                            StoredReply::rejection(&rejection, ids.first()),
                            self.cfg().max_session_retry_bytes,
                        );
                        return Err(rejection);
                    }
                };
                tracing::debug!(session = session.digest(), stream = %stream.key(), "request dispatched");
                let headers = self.upstream_headers(&call.headers);
                if envelope.batch {
                    stream.mark_sse(http::HeaderMap::new());
                    tokio::spawn(Arc::clone(self).run_batch(
                        Arc::clone(&session),
                        Arc::clone(&stream),
                        headers,
                        envelope.messages,
                        slots,
                    ));
                } else {
                    let rerun = envelope
                        .messages
                        .first()
                        .map_or(Rerun::Harmful, |(m, json)| self.rerun_of(m, json));
                    let dispatch = Dispatch {
                        headers,
                        body,
                        ids,
                        journal: journaled,
                        rerun,
                    };
                    tokio::spawn(Arc::clone(self).run_request(
                        Arc::clone(&session),
                        Arc::clone(&stream),
                        dispatch,
                        slots,
                    ));
                }
                self.serve_post(&session, &stream).await
            }
        }
    }

    /// The reply to a POST: the upstream's non-SSE answer, or the stream from its first event.
    /// POST readers never take a stream over: a retry joins the first connection's readers.
    async fn serve_post(
        &self,
        session: &Session,
        stream: &Arc<Stream>,
    ) -> Result<Reply, Rejection> {
        match stream.wait_head().await {
            Head::Stored(stored) => {
                // Handed to this connection: from now on a compact record stands for it.
                session.settle(stream);
                Ok(stored_reply(session, stored))
            }
            Head::Sse(headers) => {
                stream
                    .check_cursor(0)
                    .map_err(|_| Rejection::CursorEvicted)?;
                let feed = self.feed(session, stream, Start::After(0), false);
                Ok(Reply::sse(feed)
                    .with_upstream_headers(&headers)
                    .with_session_id(session.id()))
            }
        }
    }

    /// Forwards notifications and responses; the upstream's answer passes through unchanged.
    /// What a message changes here — a journal entry, a cancellation of a running request
    /// (spec L-02, relayed with the caller's credentials when the request runs on another pod)
    /// — happens only once the MCP server accepted that message: a credential it refuses
    /// changes nothing.
    async fn notify(
        self: &Arc<Self>,
        call: &Admitted,
        session: &Arc<Session>,
        envelope: &Envelope,
        body: Bytes,
    ) -> Result<Reply, Rejection> {
        let headers = self.upstream_headers(&call.headers);
        let mut body = Some(body);
        let mut answer: Option<StoredReply> = None;
        for (message, raw) in &envelope.messages {
            let sent = match body.take().filter(|_| !envelope.batch) {
                Some(body) => body,
                None => Bytes::from(raw.to_string()),
            };
            let stored = self.forward(session, headers.clone(), sent).await?;
            if !refuses_caller(stored.status) {
                self.accepted(call, session, message, raw);
            }
            let keep = match &answer {
                None => true,
                Some(prev) => prev.status.is_success() && !stored.status.is_success(),
            };
            if keep {
                answer = Some(stored);
            }
        }
        Ok(answer.map_or_else(|| Reply::empty(StatusCode::ACCEPTED), Reply::from))
    }

    /// What the MCP server's acceptance of notification `message` changes here: its journal
    /// entry, and the cancellation of the request it names.
    fn accepted(&self, call: &Admitted, session: &Session, message: &Message, raw: &Value) {
        self.record_accepted(session, &[(message.clone(), raw.clone())]);
        if let Message::Notification { method, params } = message
            && method == CANCELLED
            && let Some(id) = params.get("requestId")
        {
            let id = RequestKey::of(id);
            self.relay_cancel(session, &id, raw, &call.headers);
            if let Some(stream) = session.stream_of_request(&id) {
                stream.cancel_request(&id);
            }
        }
    }

    /// Records the journal entries of a message the MCP server accepted (checked to fit before
    /// it was sent: another request may have taken the room since, which is logged).
    pub(super) fn record_accepted(&self, session: &Session, entries: &[(Message, Value)]) {
        let max = self.cfg().max_journal_bytes;
        for (message, raw) in entries {
            if !journal::belongs(message) {
                continue;
            }
            if let Err(rejection) = session.record(message, raw, max) {
                tracing::info!(
                    session = session.digest(),
                    reason = rejection.reason(),
                    "an accepted request's journal entry no longer fits: a rebuild will not replay it"
                );
            }
        }
    }

    /// Sends one message upstream and reads the whole answer.
    pub(super) async fn forward(
        self: &Arc<Self>,
        session: &Arc<Session>,
        headers: http::HeaderMap,
        body: Bytes,
    ) -> Result<StoredReply, Rejection> {
        let sent = self
            .send_in_session(session, Method::POST, &headers, None, body, true)
            .await
            .map_err(|e| self.upstream_rejection(&e))?;
        match sent {
            Sent::Answer(resp) => {
                let owner = Owner::of_session(session.binding());
                self.read_stored(resp, &owner).await
            }
            Sent::Denied(reply) => Ok(reply),
            Sent::Rebuilt | Sent::Gone => Err(Rejection::SessionNotFound(NotFound::UpstreamGone)),
        }
    }

    /// Runs each message of a 2025-03-26 batch as its own upstream POST; `slots` holds a call
    /// slot for each of its requests until the last has ended.
    async fn run_batch(
        self: Arc<Self>,
        session: Arc<Session>,
        stream: Arc<Stream>,
        headers: http::HeaderMap,
        messages: Vec<(Message, Value)>,
        slots: Option<CallSlot>,
    ) {
        let _slots = slots;
        let mut requests = tokio::task::JoinSet::new();
        for (message, json) in messages {
            let body = Bytes::from(json.to_string());
            match message {
                Message::Request { ref id, .. } => {
                    let dispatch = Dispatch {
                        headers: headers.clone(),
                        body,
                        ids: vec![id.clone()],
                        rerun: self.rerun_of(&message, &json),
                        journal: vec![(message, json)],
                    };
                    requests.spawn(Arc::clone(&self).run_request(
                        Arc::clone(&session),
                        Arc::clone(&stream),
                        dispatch,
                        None,
                    ));
                }
                Message::Notification { .. } | Message::Response => {
                    match self.forward(&session, headers.clone(), body).await {
                        Ok(stored) if !refuses_caller(stored.status) => {
                            self.record_accepted(&session, &[(message, json)]);
                        }
                        Ok(_) => {}
                        Err(rejection) => tracing::debug!(
                            session = session.digest(),
                            reason = rejection.reason(),
                            "batch notification not delivered"
                        ),
                    }
                }
            }
        }
        while requests.join_next().await.is_some() {}
    }
}

/// The reply replaying the upstream's complete answer `stored`; a success names the session.
fn stored_reply(session: &Session, stored: StoredReply) -> Reply {
    let ok = stored.status.is_success();
    let reply = Reply::from(stored);
    if ok {
        reply.with_session_id(session.id())
    } else {
        reply
    }
}

/// The answer to a retry of a request the session answered and forgot (its retry window,
/// `docs/design/buffering.md#retries`): a JSON-RPC error for its id, so the client's call
/// fails instead of running twice.
fn expired_reply(id: &RequestKey) -> Reply {
    Reply::json(Bytes::from(error_response(
        id,
        CODE_TRANSPORT,
        "the result of this request is no longer available: it was answered, and the session \
         no longer keeps its answer (--retry-window); it was not run again",
        "result_expired",
    )))
}

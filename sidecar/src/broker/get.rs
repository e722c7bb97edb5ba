//! GET within a session: resumes and the standalone stream
//! (`docs/design/architecture.md#streams-and-the-replay-buffer`; spec, T-09, T-10).
//!
//! - With `Last-Event-ID`: the cursor must name a stream of this session. Events strictly after
//!   it are replayed, then the stream continues live if it is still open. A malformed cursor,
//!   a stream of another session or a cursor ahead of its stream is 400; events after the
//!   cursor that were evicted are 400 `cursor_evicted` (never an empty 200, never events of
//!   another stream).
//! - Without: the session's standalone stream. The sidecar opens it upstream once and keeps it
//!   open, buffering server-initiated messages while no client listens; each client GET takes it
//!   over. An upstream without one answers 405, which is passed through (and remembered).
//! - A GET that ends another connection's read of a stream (a take-over) is allowed
//!   `--max-takeovers` times a second per session; more get 429 `takeover_budget`.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};

use super::Broker;
use super::metrics::ResumeMiss;
use super::rebuild::Rebuild;
use super::rebuild::Sent;
use crate::mcp::admission::Admitted;
use crate::mcp::cursor::EventId;
use crate::mcp::principal::{Owner, credential_expired};
use crate::mcp::rejection::{NotFound, Rejection};
use crate::reply::Reply;
use crate::session::{EnterGuard, Session, Standalone};
use crate::stream::buffer::ReplayError;
use crate::stream::{Feed, Start, Stream, StreamKind};
use crate::upstream::is_sse;

impl Broker {
    pub(super) async fn get(
        self: &Arc<Self>,
        call: &Admitted,
        entered: Option<EnterGuard>,
    ) -> Result<Reply, Rejection> {
        let session = self.entered_session(call, entered.as_ref())?;
        // A stream opened on a JWT past its `exp` could only end at once: the client refreshes
        // its token instead of reconnecting in a loop.
        if credential_expired(&call.headers, std::time::SystemTime::now()) {
            return Err(Rejection::CredentialExpired);
        }
        let _busy = session.busy();
        if let Err(refusal) = self.revalidate(&session, &call.headers).await {
            return Ok(refusal);
        }
        self.metrics
            .protocol_version(call.version.unwrap_or(session.version()));
        match &call.last_event_id {
            Some(_)
                if self
                    .resume_budget
                    .as_ref()
                    .is_some_and(|b| b.check().is_err()) =>
            {
                Err(Rejection::ResumeBudget)
            }
            Some(cursor) => match self.resume(&session, cursor)? {
                Some(reply) => Ok(reply),
                None => self.standalone(call, &session).await,
            },
            None => self.standalone(call, &session).await,
        }
    }

    /// Serves a resume: the events after the cursor, then the rest of its stream live. At the
    /// end of a standalone stream that has ended, the next standalone stream of the session;
    /// `None` when there is none yet: the client gets a new one, rather than an empty stream it
    /// would reopen forever.
    fn resume(&self, session: &Session, cursor: &str) -> Result<Option<Reply>, Rejection> {
        let started = Instant::now();
        let miss = |reason: ResumeMiss, rejection: Rejection| {
            self.metrics.resume_miss(reason);
            rejection
        };
        let id = EventId::parse(cursor)
            .map_err(|_| miss(ResumeMiss::Malformed, Rejection::MalformedCursor))?;
        let stream = session
            .stream(&id.stream)
            .ok_or_else(|| miss(ResumeMiss::UnknownStream, Rejection::UnknownCursor))?;
        stream.check_cursor(id.seq).map_err(|e| match e {
            ReplayError::Ahead { .. } => miss(ResumeMiss::Ahead, Rejection::UnknownCursor),
            ReplayError::Evicted { .. } => miss(ResumeMiss::Evicted, Rejection::CursorEvicted),
        })?;
        // At the end of an ended standalone stream (its holder handed the session off, or the
        // upstream closed it) the client goes on with the next one, from its start: the new
        // holder's stream, with the server messages buffered while the client read the old one.
        let (stream, from) =
            if stream.kind() == StreamKind::Standalone && stream.is_over_after(id.seq) {
                match session.next_standalone(&id.stream) {
                    Some(next) => (next, 0),
                    None => return Ok(None),
                }
            } else {
                (stream, id.seq)
            };
        let reply = Reply::sse(self.take_over(session, &stream, Start::After(from))?);
        self.metrics
            .resume_hit(stream.last_seq().saturating_sub(from), started.elapsed());
        Ok(Some(reply.with_session_id(session.id())))
    }

    async fn standalone(
        self: &Arc<Self>,
        call: &Admitted,
        session: &Arc<Session>,
    ) -> Result<Reply, Rejection> {
        let stream = match session.standalone() {
            Standalone::Open(stream) => stream,
            Standalone::Unsupported(stored) => return Ok((*stored).into()),
            Standalone::None => match self.open_standalone(&call.headers, session).await? {
                Ok(stream) => stream,
                Err(reply) => return Ok(reply),
            },
        };
        Ok(
            Reply::sse(self.take_over(session, &stream, Start::Undelivered)?)
                .with_session_id(session.id()),
        )
    }

    /// A reader of `stream` for this GET, which ends any other connection's read (spec T-09).
    /// Ending one is a take-over, at most `--max-takeovers` a second per session.
    fn take_over(
        &self,
        session: &Session,
        stream: &Arc<Stream>,
        start: Start,
    ) -> Result<Feed, Rejection> {
        if stream.is_read() {
            if let Some(max) = self.cfg().max_takeovers
                && !session.admit_takeover(max)
            {
                return Err(Rejection::TakeoverBudget);
            }
            self.metrics.stream_takeover();
        }
        Ok(self.feed(session, stream, start, true))
    }

    /// Opens the upstream standalone stream: `Ok(stream)`, or the upstream's refusal to pass on.
    /// [`Broker::open_standalone`] as a boxed future, for the rebuild of an adopted session
    /// (opening sends through `send_in_session`, which may start that rebuild: the boxed type
    /// breaks the cycle of future types).
    pub(super) fn open_standalone_boxed(
        self: Arc<Self>,
        headers: http::HeaderMap,
        session: Arc<Session>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), Rejection>> + Send>> {
        Box::pin(async move { self.open_standalone(&headers, &session).await.map(|_| ()) })
    }

    /// Opens the session's standalone stream on the upstream (with the end-to-end headers of
    /// `request_headers`): the stream, or the upstream's non-SSE answer (405: it offers none).
    pub(super) async fn open_standalone(
        self: &Arc<Self>,
        request_headers: &http::HeaderMap,
        session: &Arc<Session>,
    ) -> Result<Result<Arc<Stream>, Reply>, Rejection> {
        // An adopted session is rebuilt first, outside the lock: the rebuild opens the
        // standalone stream itself when the sender had one (lock order: rebuild, then open).
        match self.ensure_upstream(session, request_headers).await {
            Rebuild::Done => {}
            Rebuild::NotReady => return Err(Rejection::UpstreamNotReady),
            Rebuild::Denied(reply) => return Ok(Err(reply.into())),
            Rebuild::Ended => return Err(Rejection::SessionNotFound(NotFound::UpstreamGone)),
        }
        session
            .open_standalone_once(self.open_standalone_now(request_headers, session))
            .await
    }

    /// [`Broker::open_standalone`] inside [`Session::open_standalone_once`].
    async fn open_standalone_now(
        self: &Arc<Self>,
        request_headers: &http::HeaderMap,
        session: &Arc<Session>,
    ) -> Result<Result<Arc<Stream>, Reply>, Rejection> {
        match session.standalone() {
            Standalone::Open(stream) => return Ok(Ok(stream)),
            Standalone::Unsupported(stored) => return Ok(Err((*stored).into())),
            Standalone::None => {}
        }
        let mut headers = self.upstream_headers(request_headers);
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        let sent = self
            .send_in_session(session, Method::GET, &headers, None, Bytes::new(), true)
            .await
            .map_err(|e| self.upstream_rejection(&e))?;
        let resp = match sent {
            Sent::Answer(resp) => resp,
            Sent::Denied(reply) => return Ok(Err(reply.into())),
            Sent::Rebuilt | Sent::Gone => {
                return Err(Rejection::SessionNotFound(NotFound::UpstreamGone));
            }
        };
        let status = resp.status();
        if status == StatusCode::OK && is_sse(&resp) {
            let stream = self.new_stream(session, StreamKind::Standalone, Vec::new());
            session.set_standalone(Standalone::Open(Arc::clone(&stream)));
            let broker = Arc::clone(self);
            let (session, task_stream) = (Arc::clone(session), Arc::clone(&stream));
            tokio::spawn(async move {
                let origin = session.upstream_id();
                broker
                    .pump(
                        &session,
                        &task_stream,
                        resp.into_body(),
                        &[],
                        headers,
                        origin,
                    )
                    .await;
            });
            return Ok(Ok(stream));
        }
        let stored = self
            .read_stored(resp, &Owner::of_session(session.binding()))
            .await?;
        if status == StatusCode::METHOD_NOT_ALLOWED {
            session.set_standalone(Standalone::Unsupported(Box::new(stored.clone())));
        }
        Ok(Err(stored.into()))
    }
}

//! The session broker: what the sidecar does with an admitted sessionful request.
//!
//! - [`initialize`](self::initialize): `initialize` → upstream session, sidecar-minted client id;
//! - [`post`](self::post): requests (response streams, retry de-duplication, batches) and
//!   notifications (202, `notifications/cancelled`);
//! - [`get`](self::get): resumes with `Last-Event-ID` and the standalone GET stream;
//! - [`delete`](self::delete): ends a session;
//! - [`stateless`](self::stateless): 2026-07-28 requests, relayed without a session;
//! - [`pump`](self::pump): upstream tasks that fill stream buffers and resume upstream streams
//!   closed early (SEP-1699);
//! - [`sweep`](self::sweep): idle expiry, buffer TTL, gauges;
//! - [`sealed`](self::sealed): the server's values a client holds sealed (task ids, the
//!   `requestState` of multi round-trip requests), exchanged on their way;
//! - [`tasks`](self::tasks): the tasks a drain waits for;
//! - [`write_ahead`](self::write_ahead): a request dispatched once its replica pod keeps its
//!   retry record, unless a second dispatch is harmless ([`rerun`](self::rerun)).
//!
//! Handlers return `Result<Reply, Rejection>`; [`Broker::handle`] counts and renders rejections.

mod calls;
mod cancel;
mod delete;
mod get;
mod initialize;
pub(crate) mod metrics;
mod post;
mod pump;
mod rebuild;
mod rerun;
mod revalidate;
mod sealed;
mod stateless;
mod sweep;
mod tasks;
mod write_ahead;

pub(crate) use calls::{CALL_BYTES, CallLimits};
pub(crate) use cancel::CancelRelay;
#[cfg(fuzzing)]
pub(crate) use pump::UpstreamCursor;
pub(crate) use tasks::TaskLimits;
pub(crate) use write_ahead::WriteAhead;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use tether_crds::ProtocolVersion;

use crate::broker::metrics::{BrokerMetrics, UpstreamFailure};
use crate::mcp::admission::Admitted;
use crate::mcp::jsonrpc::{Body, RequestKey};
use crate::mcp::rejection::{NotFound, Rejection, VersionMismatch};
use crate::reply::Reply;
use crate::retained::Retained;
use crate::session::{EnterGuard, Registry, Session};
use crate::stream::StoredReply;
use crate::stream::buffer::BufferLimits;

/// Where a genuine session id stands on this pod ([`Broker::locate`]).
#[derive(Debug)]
pub(crate) enum Here {
    /// Held here.
    Held(Arc<Session>),
    /// Handed off from here to the peer with this UID.
    Moved(String),
    /// Ended here, for this reason (`DELETE`, expiry, its upstream gone): the session is over
    /// wherever a copy of it may still be (a replica pod not yet told).
    Ended(NotFound),
    /// Not held here.
    Absent,
}
use crate::keys::KeyId;
use crate::mcp::headers::forwarded_request_headers;
use crate::mcp::home::HomeToken;
use crate::mcp::sealed::{REQUEST_STATE, TASK_ID};
use crate::mcp::session_id::{IdMinter, Verified};
use crate::stream::{Feed, Start, Stream, StreamKind};
use crate::upstream::{Exchange, Upstream, own_headers};

/// Settings of the broker, from the endpoint spec and flags.
#[derive(Clone, Debug)]
pub(crate) struct BrokerConfig {
    /// `spec.protocolVersions`.
    pub(crate) versions: Vec<ProtocolVersion>,
    /// `spec.buffer`.
    pub(crate) buffer: BufferLimits,
    /// `spec.session.idleTimeout`.
    pub(crate) idle_timeout: Duration,
    /// When a reload ([`crate::config::reload`]) installed these settings (`None`: at start-up); no
    /// session expires before `idle_timeout` has passed since.
    pub(crate) reloaded_at: Option<std::time::Instant>,
    /// Interval of `: keep-alive` comments on idle client streams.
    pub(crate) keep_alive: Duration,
    /// Largest complete upstream body read (JSON responses), in bytes.
    pub(crate) max_upstream_body_bytes: usize,
    /// How long a complete upstream body may take to arrive.
    pub(crate) upstream_body_timeout: Duration,
    /// Wait before resuming an upstream stream that closed early without a `retry` hint.
    pub(crate) upstream_retry: Duration,
    /// How long a rebuild waits for an MCP server that is not ready (`--rebuild-retry-for`).
    pub(crate) rebuild_retry_for: Duration,
    /// Consecutive failed upstream resumes before a stream is given up.
    pub(crate) upstream_resume_attempts: u32,
    /// `spec.session.migration`: whether a session whose upstream session was lost is rebuilt
    /// from its journal (`Replay`) or ended (`Pin`).
    pub(crate) migration: tether_crds::Migration,
    /// `spec.session.replication`: what each session's replica carries
    /// (`docs/design/replication.md`).
    pub(crate) replication: tether_crds::Replication,
    /// `spec.session.writeAhead`: a request is dispatched once its replica pod keeps its
    /// retry record (`docs/design/replication.md#write-ahead`).
    pub(crate) write_ahead: bool,
    /// Most tools remembered with whether a second call is harmless (`--write-ahead-max-tools`,
    /// read at start).
    pub(crate) write_ahead_max_tools: usize,
    /// Most resumes served per second (burst as many); `None`: no limit (`--resume-budget`).
    pub(crate) resume_budget: Option<std::num::NonZeroU32>,
    /// Largest `initialize` params, in bytes (`--max-initialize-bytes`).
    pub(crate) max_initialize_bytes: usize,
    /// Largest journal of one session, in bytes (`--max-journal-bytes`).
    pub(crate) max_journal_bytes: usize,
    /// Largest retry state (records, stored replies, tombstones) of one session, in bytes
    /// (`--max-session-retry-bytes`).
    pub(crate) max_session_retry_bytes: u64,
    /// Answered requests kept replayable per session (`--retry-window`,
    /// `--retry-window-bytes`, `buffer.ttl`).
    pub(crate) retry_window: crate::session::RetryWindow,
    /// The request headers that carry a client's credentials (`spec.auth.forwardHeaders`).
    pub(crate) forward_headers: Vec<http::HeaderName>,
    /// Whether the client's `Origin` is passed to the MCP server
    /// (`spec.upstream.forwardOrigin`).
    pub(crate) forward_origin: bool,
    /// What new sessions are bound to (`spec.auth.binding`).
    pub(crate) binding: tether_crds::AuthBinding,
    /// How long the MCP server's acceptance of a credential vouches for it before an answer
    /// from memory (`spec.auth.revalidate`; zero: never asked).
    pub(crate) revalidate: Duration,
    /// Most take-overs of one session's streams per second; `None`: no limit
    /// (`--max-takeovers`).
    pub(crate) max_takeovers: Option<std::num::NonZeroU32>,
    /// Largest SSE event read from the upstream, in bytes (`--max-event-bytes`).
    pub(crate) max_event_bytes: usize,
    /// Most tasks tracked as open, in all and of one owner, and how recently a task must have
    /// been polled for a drain to wait for it (`--max-open-tasks`,
    /// `--max-principal-open-tasks`, `--task-poll-window`; read at start).
    pub(crate) tasks: TaskLimits,
    /// Most upstream `DELETE`s sent on the sidecar's own at once (`--max-upstream-deletes`;
    /// read at start).
    pub(crate) max_upstream_deletes: usize,
    /// Most calls in flight per session, principal and pod (`--max-session-calls`,
    /// `--max-principal-calls`, `--max-calls`; read at start).
    pub(crate) calls: CallLimits,
}

/// The session broker of one pod.
#[derive(Debug)]
pub(crate) struct Broker {
    cfg: arc_swap::ArcSwap<BrokerConfig>,
    minter: IdMinter,
    registry: Registry,
    upstream: Upstream,
    metrics: Arc<BrokerMetrics>,
    /// When the data path last enforced `--pod-retained-bytes` (at most every 50 ms).
    last_enforcement: parking_lot::Mutex<Option<std::time::Instant>>,
    /// Whether the last enforcement left the pod over its budget: nothing it could give up
    /// was left (what is over belongs to requests in flight), so new requests wait.
    budget_stuck: std::sync::atomic::AtomicBool,
    /// When the last walk shedding unread buffers of callers over their fair share began.
    last_shedding: parking_lot::Mutex<Option<std::time::Instant>>,
    resume_budget: Option<governor::DefaultDirectRateLimiter>,
    cancel_relay: std::sync::OnceLock<Arc<dyn CancelRelay>>,
    write_ahead: std::sync::OnceLock<Arc<dyn WriteAhead>>,
    /// The tools the MCP server declared, harmless to call again or not.
    tools: rerun::Tools,
    rebuild_slots: tokio::sync::Semaphore,
    stateless: stateless::StatelessTally,
    tasks: tasks::Tasks,
    /// Calls in flight, by session, principal and pod.
    calls: Arc<calls::Calls>,
    /// Seals the `requestState`s this pod's MCP server issues.
    request_states: crate::mcp::sealed::Sealer,
    /// Upstream `DELETE`s sent on the sidecar's own, at most `--max-upstream-deletes` at once.
    deletes: BackgroundDeletes,
}

/// The upstream sessions the sidecar ends on its own ([`Broker::end_upstream_later`]): slots
/// for those in flight, and how many are pending (waiting or in flight).
#[derive(Debug)]
struct BackgroundDeletes {
    slots: tokio::sync::Semaphore,
    pending: std::sync::atomic::AtomicUsize,
}

impl Broker {
    /// A broker with no session yet.
    pub(crate) fn new(
        cfg: BrokerConfig,
        minter: IdMinter,
        upstream: Upstream,
        registry: Registry,
        metrics: Arc<BrokerMetrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            tools: rerun::Tools::new(cfg.write_ahead_max_tools),
            tasks: tasks::Tasks::new(minter.sealer(&TASK_ID), cfg.tasks),
            calls: calls::Calls::new(cfg.calls, Arc::clone(&metrics), registry.retained().clone()),
            request_states: minter.sealer(&REQUEST_STATE),
            deletes: BackgroundDeletes {
                slots: tokio::sync::Semaphore::new(cfg.max_upstream_deletes.max(1)),
                pending: std::sync::atomic::AtomicUsize::new(0),
            },
            minter,
            registry,
            upstream,
            metrics,
            last_enforcement: parking_lot::Mutex::new(None),
            budget_stuck: std::sync::atomic::AtomicBool::new(false),
            last_shedding: parking_lot::Mutex::new(None),
            resume_budget: cfg
                .resume_budget
                .map(|n| governor::RateLimiter::direct(governor::Quota::per_second(n))),
            cfg: arc_swap::ArcSwap::from_pointee(cfg),
            cancel_relay: std::sync::OnceLock::new(),
            write_ahead: std::sync::OnceLock::new(),
            rebuild_slots: tokio::sync::Semaphore::new(rebuild::BACKGROUND_REBUILDS),
            stateless: stateless::StatelessTally::default(),
        })
    }

    /// The settings in effect now; a reload ([`Broker::reconfigure`]) may replace them between
    /// two calls.
    pub(crate) fn cfg(&self) -> arc_swap::Guard<Arc<BrokerConfig>> {
        self.cfg.load()
    }

    /// Replaces the settings (a reload of the endpoint file, [`crate::config::reload`]). Protocol
    /// versions and the idle timeout apply at once; buffer bounds apply to streams opened from
    /// now on (open streams keep theirs); the resume budget stays the one given at start.
    pub(crate) fn reconfigure(&self, cfg: BrokerConfig) {
        self.cfg.store(Arc::new(cfg));
        // The sweep schedule was made with the old timeouts.
        self.registry.schedule_all(std::time::Instant::now());
    }

    /// Serves an admitted sessionful request with its complete body; `entered` is the session
    /// the request entered here ([`Session::enter`]), released once its stream is registered.
    pub(crate) async fn handle(
        self: &Arc<Self>,
        call: Admitted,
        body: Body,
        entered: Option<EnterGuard>,
    ) -> Reply {
        // At debug level each request logs its start and its answer's head (a stream goes on).
        let traced = tracing::enabled!(tracing::Level::DEBUG).then(|| {
            let session = call.session_id.as_deref().map(|id| self.log_digest(id));
            tracing::debug!(method = %call.method, session, held = entered.is_some(), "request");
            (session, std::time::Instant::now())
        });
        let result = match call.method {
            Method::POST => self.post(&call, body, entered).await,
            Method::GET => self.get(&call, entered).await,
            Method::DELETE => self.delete(&call, entered).await,
            _ => Err(Rejection::MethodNotAllowed),
        };
        let reply = result.unwrap_or_else(|rejection| {
            self.metrics.rejection(&rejection);
            rejection.into()
        });
        if let Some((session, started)) = traced {
            let ms = started.elapsed().as_millis();
            tracing::debug!(session, status = reply.status.as_u16(), ms, "answered");
        }
        reply
    }

    /// Sessions with a request in flight (being handled, or a POST waiting for its response).
    pub(crate) fn in_flight(&self) -> usize {
        self.registry.all().iter().filter(|s| s.in_flight()).count()
    }

    /// Where session `id` lives: its home token and where it stands on this pod.
    ///
    /// # Errors
    /// [`NotFound::Forged`] for an id that fails the MAC (answered 404 at once, no hop).
    pub(crate) fn locate(&self, id: &str) -> Result<(HomeToken, Here), NotFound> {
        let verified = self.minter.verify(id).map_err(|_| NotFound::Forged)?;
        let here = match self.registry.get(id) {
            Some(session) => Here::Held(session),
            None => match self.registry.moved_to(id) {
                Some(uid) => Here::Moved(uid),
                None => match self.registry.why_missing(&verified.key.log_digest(id)) {
                    NotFound::Unknown => Here::Absent,
                    reason => Here::Ended(reason),
                },
            },
        };
        Ok((verified.home, here))
    }

    /// Every session held here.
    pub(crate) fn sessions(&self) -> Vec<Arc<Session>> {
        self.registry.all()
    }

    /// Whether this pod took session `id` at `epoch` or a later one (held, forwarding its tail,
    /// or handed on since).
    pub(crate) fn took(&self, id: &str, epoch: u64) -> bool {
        self.registry.took(id, epoch)
    }

    /// Sessions held here or handed off and still forwarding, by the id of the key that minted
    /// them (`GET /keys`).
    pub(crate) fn sessions_by_key(&self) -> std::collections::BTreeMap<KeyId, u64> {
        let mut counts = std::collections::BTreeMap::new();
        for session in self
            .registry
            .all()
            .iter()
            .chain(&self.registry.all_departed())
        {
            *counts.entry(session.key().id()).or_default() += 1;
        }
        counts
    }

    /// Records that peer `to` acknowledged `session`: it leaves this pod's registry and its
    /// requests are sent there.
    pub(crate) fn mark_moved(&self, session: &Arc<Session>, to: &str) {
        self.registry.mark_moved(session, to);
        self.metrics.session_handed_off();
    }

    /// Sessions handed off whose streams are still forwarded to their new holder.
    pub(crate) fn departed(&self) -> Vec<Arc<Session>> {
        self.registry.all_departed()
    }

    /// How many handed-off sessions still have streams forwarded.
    pub(crate) fn departed_count(&self) -> usize {
        self.registry.departed_count()
    }

    /// A handed-off session's streams are all forwarded: end its upstream session, and forget
    /// it, or (`keep`) keep it as the copy pushed again should its new holder `keep` leave.
    pub(crate) async fn release_departed(&self, session: &Session, keep: Option<&str>) {
        self.registry.forget_departed(session.id(), keep);
        self.delete_upstream(session).await;
    }

    /// Ends the upstream session of `session`, handed off from here, once no call runs in it
    /// any more: the MCP server then ends its standalone stream after the messages it had sent
    /// on it, which the stream's pump forwards before it sees the end. Returns whether the
    /// server ended it (a 2xx; a server that forbids client termination answers 405). Nothing
    /// is sent again when the session is released.
    pub(crate) async fn end_departed_upstream(&self, session: &Session) -> bool {
        let Some(upstream_id) = session.upstream_id() else {
            return false;
        };
        // Forgotten first: the end of the standalone stream may be read before the answer to
        // the DELETE, and a pump that still knew the upstream session would resume it.
        session.set_upstream_id(None);
        let status = self.delete_upstream_id(session, &upstream_id).await;
        let ended = status.is_some_and(|s| s.is_success());
        if ended {
            // Taken back later (its new holder lost), it is rebuilt from the journal.
            session.rebuild_on_next_use();
        } else {
            session.set_upstream_id(Some(upstream_id));
        }
        ended
    }

    /// Takes back a session handed off from here whose new holder is gone: held here again, as
    /// it was before the move (see [`Registry::reclaim`]); `false` without a copy of it.
    pub(crate) fn reclaim(&self, id: &str, lost: &str) -> bool {
        let reclaimed = self.registry.reclaim(id, lost, |session| session.reclaim());
        if reclaimed {
            self.metrics.session_reclaimed();
        }
        reclaimed
    }

    /// Whether `session` is the one held here under its id (not ended, not handed off).
    pub(crate) fn holds(&self, session: &Arc<Session>) -> bool {
        self.registry.holds(session)
    }

    /// Sessions handed off from here and kept whose new holder `lost` says is gone, with that
    /// holder's UID.
    pub(crate) fn kept_lost(&self, lost: &dyn Fn(&str) -> bool) -> Vec<(Arc<Session>, String)> {
        self.registry.kept_lost(lost)
    }

    /// The buffer bounds of new streams.
    pub(crate) fn buffer_limits(&self) -> BufferLimits {
        self.cfg().buffer
    }

    /// The pod's activity: woken whenever what it has in flight may have shrunk (see
    /// [`Registry::activity`]).
    pub(crate) fn activity(&self) -> &tokio::sync::Notify {
        self.registry.activity()
    }

    /// A client request's headers as the MCP server gets them: end-to-end ones, the proxy
    /// hop's `X-Forwarded-Host` / `Forwarded`, `Origin` only with `spec.upstream.forwardOrigin`
    /// ([`forwarded_request_headers`]).
    pub(crate) fn upstream_headers(&self, client: &http::HeaderMap) -> http::HeaderMap {
        forwarded_request_headers(client, self.cfg().forward_origin)
    }

    /// Where the broker counts, and the proxy counts what it answers itself.
    pub(crate) fn metrics(&self) -> &BrokerMetrics {
        &self.metrics
    }

    /// The pod's byte budget (`--pod-retained-bytes`) and its tally of what sessions retain.
    pub(crate) fn retained(&self) -> &Retained {
        self.registry.retained()
    }

    /// The home and key of `id` when it is a session id of this endpoint (its MAC verifies
    /// with a key of the ring).
    pub(crate) fn genuine(&self, id: &str) -> Option<Verified> {
        self.minter.verify(id).ok()
    }

    /// The keyed digest that stands for session id `id` in logs.
    pub(crate) fn log_digest(&self, id: &str) -> String {
        self.minter.log_digest(id)
    }

    /// Whether the session with client id `id` ended on this pod (`DELETE`, expiry, its
    /// upstream gone): it is never taken again.
    pub(crate) fn ended_here(&self, id: &str) -> bool {
        self.genuine(id).is_some_and(|verified| {
            self.registry.why_missing(&verified.key.log_digest(id)) != NotFound::Unknown
        })
    }

    /// The session with client id `id` held here.
    pub(crate) fn held(&self, id: &str) -> Option<Arc<Session>> {
        self.registry.get(id)
    }

    /// The session with client id `id` handed off from here whose streams are still forwarded.
    pub(crate) fn departed_session(&self, id: &str) -> Option<Arc<Session>> {
        self.registry.departed(id)
    }

    /// The session a client id names: 404 at once for a forged id (no lookup), or for a genuine
    /// id this pod does not hold (spec S-05).
    fn session_for(&self, id: &str) -> Result<Arc<Session>, Rejection> {
        let Ok(verified) = self.minter.verify(id) else {
            return Err(Rejection::SessionNotFound(NotFound::Forged));
        };
        self.registry.get(id).ok_or_else(|| {
            Rejection::SessionNotFound(self.registry.why_missing(&verified.key.log_digest(id)))
        })
    }

    /// The session a request entered, else the one its id names (spec S-04).
    ///
    /// # Errors
    /// Besides a missing session: [`Rejection::UnsupportedVersion`] (400, spec P-03) when the
    /// request's `MCP-Protocol-Version` is neither listed in `spec.protocolVersions` nor the
    /// session's own — admission lets a session's request name a version a reload removed, so
    /// sessions negotiated before the reload keep working until they end.
    fn entered_session(
        &self,
        call: &Admitted,
        entered: Option<&EnterGuard>,
    ) -> Result<Arc<Session>, Rejection> {
        let session = match entered {
            Some(guard) => Arc::clone(guard.session()),
            None => self.required_session(call)?,
        };
        let cfg = self.cfg();
        if let Some(binding) = session.binding()
            && !binding.admits(&call.headers, &cfg.forward_headers, session.key())
        {
            // Nothing is served, dispatched or remembered: the id alone opens nothing.
            return Err(Rejection::SessionNotFound(NotFound::PrincipalMismatch));
        }
        // The request's credentials become the session's only once the MCP server accepted
        // them (`Broker::send_in_session`, `Broker::revalidate`): a forged token naming the
        // caller passes the binding, never the server.
        match call.version {
            Some(v) if v != session.version() && !cfg.versions.contains(&v) => Err(
                Rejection::UnsupportedVersion(VersionMismatch::new(v.as_str(), &cfg.versions)),
            ),
            _ => Ok(session),
        }
    }

    /// The session of a request that must carry one (spec S-04).
    fn required_session(&self, call: &Admitted) -> Result<Arc<Session>, Rejection> {
        let id = call
            .session_id
            .as_deref()
            .ok_or(Rejection::SessionRequired)?;
        self.session_for(id)
    }

    /// Ends a session held by this pod; `reason` is what later requests for it are told (404).
    /// Expired sessions are also ended upstream.
    fn end_session(self: &Arc<Self>, session: &Arc<Session>, reason: NotFound) {
        if !self.registry.remove(session, reason) {
            return;
        }
        session.end(&StoredReply::from(&Rejection::SessionNotFound(reason)));
        self.metrics.session_ended(reason);
        tracing::info!(
            session = session.digest(),
            reason = reason.label(),
            "session ended"
        );
        if reason == NotFound::Expired {
            self.delete_upstream_later(session);
        }
    }

    /// Ends `session`'s upstream session in the background ([`Broker::end_upstream_later`]).
    fn delete_upstream_later(self: &Arc<Self>, session: &Session) {
        if let Some(upstream_id) = session.upstream_id() {
            let headers = session.with_credentials(own_headers(session.version().as_str(), false));
            self.end_upstream_later(upstream_id, headers);
        }
    }

    /// Sends `DELETE` for upstream session `upstream_id` in the background (best effort), at
    /// most `--max-upstream-deletes` at once: a sweep that expires thousands of sessions must
    /// not open as many connections to the MCP server. A waiting one holds its id and headers
    /// only (`tether_upstream_deletes_pending`).
    fn end_upstream_later(self: &Arc<Self>, upstream_id: String, headers: http::HeaderMap) {
        use std::sync::atomic::Ordering;
        let pending = self.deletes.pending.fetch_add(1, Ordering::Relaxed) + 1;
        self.metrics.upstream_deletes_pending(pending);
        let broker = Arc::clone(self);
        tokio::spawn(async move {
            // The semaphore is never closed.
            let slot = broker.deletes.slots.acquire().await;
            broker.end_upstream_session(&upstream_id, headers).await;
            drop(slot);
            let left = broker.deletes.pending.fetch_sub(1, Ordering::Relaxed) - 1;
            broker.metrics.upstream_deletes_pending(left);
        });
    }

    /// Tells the upstream a session is over (best effort).
    async fn delete_upstream(&self, session: &Session) {
        if let Some(upstream_id) = session.upstream_id() {
            self.delete_upstream_id(session, &upstream_id).await;
        }
    }

    /// Sends `DELETE` for `session`'s upstream session `upstream_id` with the session's
    /// credentials (best effort); returns the status.
    async fn delete_upstream_id(
        &self,
        session: &Session,
        upstream_id: &str,
    ) -> Option<http::StatusCode> {
        let headers = session.with_credentials(own_headers(session.version().as_str(), false));
        self.end_upstream_session(upstream_id, headers).await
    }

    /// Sends `DELETE` for upstream session `upstream_id` (best effort); returns the status.
    async fn end_upstream_session(
        &self,
        upstream_id: &str,
        headers: http::HeaderMap,
    ) -> Option<http::StatusCode> {
        let exchange = Exchange {
            upstream_session: Some(upstream_id),
            headers,
            last_event_id: None,
        };
        match self
            .upstream
            .send(Method::DELETE, exchange, Bytes::new())
            .await
        {
            Ok(resp) => Some(resp.status()),
            Err(e) => {
                self.metrics.upstream_error(UpstreamFailure::Delete);
                tracing::debug!(error = %e, "upstream DELETE failed");
                None
            }
        }
    }

    /// Ends, in the background, an upstream session opened by a request that must not have
    /// one (a 2026-07-28 request the upstream answered with `Mcp-Session-Id`, spec S-10).
    pub(crate) fn abandon_upstream_session(self: &Arc<Self>, upstream_id: String) {
        self.metrics
            .upstream_error(UpstreamFailure::StatelessSessionOpened);
        self.end_upstream_later(upstream_id, http::HeaderMap::new());
    }

    fn new_stream(
        &self,
        session: &Session,
        kind: StreamKind,
        pending: Vec<RequestKey>,
    ) -> Arc<Stream> {
        Stream::new(
            kind,
            pending,
            self.cfg().buffer,
            session.account(),
            session.child_token(),
        )
    }

    /// A reader of `stream` for a client of `session` (see [`Stream::attach`]).
    fn feed(&self, session: &Session, stream: &Arc<Stream>, start: Start, take_over: bool) -> Feed {
        stream.attach(start, take_over, session.primes(), self.cfg().keep_alive)
    }
}

#[cfg(test)]
mod tests;

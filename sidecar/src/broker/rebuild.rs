//! Rebuilding a session whose upstream session was lost (the MCP server restarted), from the
//! journal (`session.migration: Replay`, `docs/design/architecture.md#sessions`).
//!
//! When the upstream answers 404 for a session the sidecar still holds, the sidecar replays the
//! journal on the upstream (`initialize`, `notifications/initialized`, the last
//! `logging/setLevel`, the subscriptions) and carries on with the new upstream session; the
//! client keeps its session id and never sees the restart, except that calls in flight at the
//! restart end with an error and tool state the journal does not carry starts over. With
//! `migration: Pin` the session ends instead and later requests get 404 (spec S-05).
//!
//! A rebuild that finds the MCP server not ready — refusing connections, answering 502, 503 or
//! 504, or not in time (a server still starting, or shutting down) — does not end the session:
//! the session waits, its requests get 503 `upstream_not_ready` + `Retry-After` and each tries
//! the rebuild again (an adopted session's background rebuild retries with backoff), for at most
//! `--rebuild-retry-for`. Only a definitive refusal, or a server not ready for that long, ends it.
//!
//! A rebuild the MCP server refuses for the caller — 401, 403, 407 or 429 to the replayed
//! `initialize`, typically a client's expired token — does not end the session either: the
//! request that triggered it gets that answer unchanged (with its `WWW-Authenticate`), and the
//! session's next request tries the rebuild again with its own credentials (a refreshed token).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Response};
use hyper::body::Incoming;
use serde_json::Value;
use tether_crds::Migration;

use super::Broker;
use super::initialize::{Messages, negotiated_version, sse_messages};
use crate::mcp::headers::{MCP_SESSION_ID, credential_headers, replace_credentials};
use crate::mcp::jsonrpc::RequestKey;
use crate::mcp::methods::INITIALIZE;
use crate::mcp::principal::Owner;
use crate::mcp::rejection::{NotFound, Rejection};
use crate::session::{Adopted, Refused, Session};
use crate::stream::{StoredReply, refuses_caller};
use crate::upstream::{Exchange, UpstreamError, is_sse, own_headers, post_headers, session_gone};

/// Adopted sessions rebuilt in the background at the same time.
pub(super) const BACKGROUND_REBUILDS: usize = 8;

/// First and longest pause between background rebuild attempts of an adopted session.
const BACKGROUND_RETRY: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(2));

/// Why a rebuild failed.
#[derive(Debug, thiserror::Error)]
enum RebuildError {
    #[error("the MCP server refused {0}: HTTP {1}")]
    Refused(&'static str, http::StatusCode),
    #[error("the MCP server refused the caller's credentials for {0}: HTTP {status}", status = .1.status)]
    Denied(&'static str, StoredReply),
    #[error("the MCP server negotiated {0} instead of {1}")]
    Version(String, String),
    #[error("the MCP server cannot be reached: {0}")]
    Unreachable(String),
    #[error("{0}")]
    Exchange(String),
}

impl RebuildError {
    /// Whether the MCP server is only not ready (yet): worth trying again.
    fn is_transient(&self) -> bool {
        match self {
            RebuildError::Unreachable(_) => true,
            RebuildError::Refused(_, status) => matches!(status.as_u16(), 502..=504),
            _ => false,
        }
    }
}

/// Where a rebuild leaves a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Rebuild {
    /// Its upstream session is usable.
    Done,
    /// The MCP server is not ready; the session waits (503 `upstream_not_ready` meanwhile).
    NotReady,
    /// The MCP server refused the caller (its credentials, its rate): the request that tried
    /// gets this answer unchanged, and the session waits for one with other credentials.
    Denied(StoredReply),
    /// The session has ended (404 from now on).
    Ended,
}

/// The outcome of [`Broker::send_in_session`].
pub(super) enum Sent {
    /// The upstream answered (anything but "unknown session").
    Answer(Response<Incoming>),
    /// The upstream session was lost and rebuilt; the request was not sent again.
    Rebuilt,
    /// The upstream session was lost and the session has ended (404 from now on).
    Gone,
    /// The session's upstream session must be rebuilt and the MCP server refused the rebuild
    /// for this request's caller: its answer, to pass on (the request was not sent).
    Denied(StoredReply),
}

impl Broker {
    /// Sends a request in `session`'s upstream session. When the upstream no longer knows it,
    /// the session is recovered ([`Broker::recover`]) and, with `resend`, the request is sent
    /// once more on the rebuilt upstream session (it never reached the lost one).
    ///
    /// # Errors
    /// [`UpstreamError`] when the upstream cannot be reached.
    pub(super) async fn send_in_session(
        self: &Arc<Self>,
        session: &Arc<Session>,
        method: Method,
        headers: &HeaderMap,
        last_event_id: Option<&str>,
        body: Bytes,
        resend: bool,
    ) -> Result<Sent, UpstreamError> {
        let before = session.upstream_id();
        match self.ensure_upstream(session, headers).await {
            // A request that belongs to the upstream session it was made for (the resume of an
            // upstream stream) is not sent to the one rebuilt meanwhile.
            Rebuild::Done if !resend && session.upstream_id() != before => {
                return Ok(Sent::Rebuilt);
            }
            Rebuild::Done => {}
            Rebuild::NotReady => return Err(UpstreamError::NotReady),
            Rebuild::Denied(reply) => return Ok(Sent::Denied(reply)),
            Rebuild::Ended => return Ok(Sent::Gone),
        }
        let mut rebuilt = false;
        loop {
            let used = session.upstream_id();
            let exchange = Exchange {
                upstream_session: used.as_deref(),
                headers: headers.clone(),
                last_event_id,
            };
            let resp = self
                .upstream
                .send(method.clone(), exchange, body.clone())
                .await?;
            if !session_gone(resp.status()) {
                if !refuses_caller(resp.status()) {
                    // Accepted: the session's own requests carry these credentials from now on.
                    session.remember_credentials(headers, &self.cfg().forward_headers);
                }
                return Ok(Sent::Answer(resp));
            }
            let recovered = if rebuilt {
                Rebuild::Ended
            } else {
                self.recover(session, used.as_deref(), headers).await
            };
            match recovered {
                Rebuild::Done => {}
                Rebuild::NotReady => return Err(UpstreamError::NotReady),
                Rebuild::Denied(reply) => return Ok(Sent::Denied(reply)),
                Rebuild::Ended => {
                    if !session.is_ended() {
                        self.end_session(session, NotFound::UpstreamGone);
                    }
                    return Ok(Sent::Gone);
                }
            }
            if !resend {
                return Ok(Sent::Rebuilt);
            }
            rebuilt = true;
        }
    }

    /// Registers a session handed over by a peer (`docs/design/handoff.md`) and starts
    /// rebuilding its upstream session in the background, a few at a time (a drain hands over
    /// hundreds of sessions at once); a request for the session rebuilds it at once if it comes
    /// first. A session whose clients presented credentials is rebuilt by its next request
    /// only, with that request's credentials. Returns whether the session was new (a repeated
    /// push of a session already held is acknowledged again without change); a copy of an
    /// earlier epoch it replaces has its upstream session ended
    /// (`docs/design/handoff.md#one-holder-per-session`).
    ///
    /// # Errors
    /// [`Refused`]: the pod is full, the push is stale, or the session ended here.
    pub(crate) fn adopt_session(self: &Arc<Self>, session: Arc<Session>) -> Result<bool, Refused> {
        match self.registry.adopt(Arc::clone(&session))? {
            Adopted::Repeated => return Ok(false),
            Adopted::New => self.metrics.session_adopted(true),
            Adopted::Replaced(stale) => {
                self.metrics.session_adopted(false);
                tracing::info!(
                    session = session.digest(),
                    stale = stale.epoch(),
                    epoch = session.epoch(),
                    "a copy of an earlier push replaced"
                );
                stale.end(&StoredReply::from(&Rejection::PeerUnavailable));
                self.delete_upstream_later(&stale);
            }
        }
        if session.is_credentialed() {
            // Its credentials stayed on the sender: the session's next request rebuilds it with
            // its own (`docs/design/handoff.md#credentials`).
            return Ok(true);
        }
        let broker = Arc::clone(self);
        tokio::spawn(async move {
            let _slot = broker.rebuild_slots.acquire().await;
            let (mut pause, longest) = BACKGROUND_RETRY;
            // Bounded: after --rebuild-retry-for a rebuild that still fails ends the session.
            while broker.ensure_upstream(&session, &HeaderMap::new()).await == Rebuild::NotReady {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(longest);
            }
        });
        Ok(true)
    }

    /// Rebuilds the upstream session of an adopted session (or one waiting for a server that
    /// was not ready) from its journal, once; returns where that leaves the session (a failed
    /// rebuild ends it: later requests get 404). The rebuild presents the credentials of
    /// `request` (the headers of the request that needs it; none: the session's latest), so
    /// the MCP server's judgement is of the credentials of the request that gets its answer.
    pub(super) async fn ensure_upstream(
        self: &Arc<Self>,
        session: &Arc<Session>,
        request: &HeaderMap,
    ) -> Rebuild {
        let usable = || {
            if session.is_ended() {
                Rebuild::Ended
            } else {
                Rebuild::Done
            }
        };
        if !session.needs_rebuild() {
            return usable();
        }
        session
            .rebuild_once(async {
                if !session.needs_rebuild() || session.is_ended() {
                    return usable();
                }
                let rebuilt = self.rebuild_now(session, request).await;
                if rebuilt != Rebuild::Done {
                    return rebuilt;
                }
                // A standalone stream open at the sender goes on there until its calls finish;
                // this pod opens its own before any request of the session reaches the
                // upstream, so server messages of calls made here are buffered for the
                // client's next GET.
                if session.take_reopen_standalone() {
                    let headers = self.rebuild_headers(
                        session,
                        request,
                        own_headers(session.version().as_str(), true),
                    );
                    if let Err(e) = Arc::clone(self)
                        .open_standalone_boxed(headers, Arc::clone(session))
                        .await
                    {
                        tracing::debug!(session = session.digest(), error = ?e, "cannot open the standalone stream");
                    }
                }
                Rebuild::Done
            })
            .await
    }

    /// Recovers `session` after the upstream said it does not know upstream session `lost`:
    /// rebuilt ([`Rebuild::Done`]) with the credentials of `request`, waiting for a server
    /// that is not ready, or ended (later requests get 404).
    pub(super) async fn recover(
        self: &Arc<Self>,
        session: &Arc<Session>,
        lost: Option<&str>,
        request: &HeaderMap,
    ) -> Rebuild {
        if self.cfg().migration == Migration::Pin || session.is_ended() {
            self.end_session(session, NotFound::UpstreamGone);
            return Rebuild::Ended;
        }
        session
            .rebuild_once(async {
                if session.is_ended() {
                    return Rebuild::Ended; // a rebuild failed meanwhile
                }
                if session.upstream_id().as_deref() != lost && !session.needs_rebuild() {
                    return Rebuild::Done; // another request rebuilt it meanwhile
                }
                self.rebuild_now(session, request).await
            })
            .await
    }

    /// Rebuilds `session`'s upstream session from its journal now (the caller runs it in
    /// [`Session::rebuild_once`]). An MCP server that is not ready leaves the session waiting
    /// for the next attempt, within `--rebuild-retry-for` of the first; any other failure ends
    /// it (404 from then on).
    pub(super) async fn rebuild_now(
        self: &Arc<Self>,
        session: &Arc<Session>,
        request: &HeaderMap,
    ) -> Rebuild {
        tracing::debug!(
            session = session.digest(),
            "rebuilding the upstream session"
        );
        match self.rebuild(session, request).await {
            Ok(id) => {
                session.set_upstream_id(id);
                session.rebuilt();
                self.metrics.session_rebuilt();
                tracing::info!(
                    session = session.digest(),
                    "upstream session rebuilt from the journal"
                );
                Rebuild::Done
            }
            Err(RebuildError::Denied(what, reply)) => {
                tracing::info!(session = session.digest(), status = %reply.status, "the MCP server refused the caller's credentials for {what} of the rebuild; the session waits for a request with others");
                session.await_credentials();
                Rebuild::Denied(reply)
            }
            Err(e)
                if e.is_transient() && session.defer_rebuild() < self.cfg().rebuild_retry_for =>
            {
                tracing::info!(session = session.digest(), error = %e, "the MCP server is not ready to rebuild the session; it waits");
                Rebuild::NotReady
            }
            Err(e) => {
                tracing::warn!(session = session.digest(), error = %e, "cannot rebuild the upstream session");
                self.end_session(session, NotFound::UpstreamGone);
                Rebuild::Ended
            }
        }
    }

    /// `headers` with the credentials of `request` when it carries any, else with the session's
    /// latest: a rebuild is judged on the credentials of the request waiting for it, not on
    /// those of another request of the session that may have come since with an expired token.
    fn rebuild_headers(
        &self,
        session: &Session,
        request: &HeaderMap,
        headers: HeaderMap,
    ) -> HeaderMap {
        let own = credential_headers(request, &self.cfg().forward_headers);
        if own.is_empty() {
            session.with_credentials(headers)
        } else {
            replace_credentials(headers, &own)
        }
    }

    async fn rebuild(
        &self,
        session: &Session,
        request: &HeaderMap,
    ) -> Result<Option<String>, RebuildError> {
        let journal = session.journal();
        let version = session.version().as_str();
        let init = journal.initialize();
        let headers = |version| self.rebuild_headers(session, request, post_headers(version));
        let sent = headers(None);
        let accepted = self.credential_key(session, &sent);
        let (upstream_id, messages) = self.exchange(INITIALIZE, None, sent, &init).await?;
        if let Some(key) = accepted {
            // The MCP server accepted these credentials for the session it opened.
            session.accept_credential(key);
        }
        let init_id = init.get("id").map(RequestKey::of);
        let negotiated = init_id
            .and_then(|id| negotiated_version(&messages, &id))
            .and_then(Result::ok)
            .unwrap_or_default();
        if negotiated != version {
            if let Some(id) = &upstream_id {
                self.end_upstream_session(
                    id,
                    self.rebuild_headers(session, request, HeaderMap::new()),
                )
                .await;
            }
            return Err(RebuildError::Version(negotiated, version.to_owned()));
        }
        let replayed = self
            .replay_journal(
                upstream_id.as_deref(),
                &headers(Some(version)),
                &journal.replay(),
            )
            .await;
        if replayed.is_err()
            && let Some(id) = &upstream_id
        {
            // Do not leave the half-built upstream session behind.
            self.end_upstream_session(id, self.rebuild_headers(session, request, HeaderMap::new()))
                .await;
        }
        replayed.map(|()| upstream_id)
    }

    async fn replay_journal(
        &self,
        upstream_id: Option<&str>,
        headers: &HeaderMap,
        messages: &[Value],
    ) -> Result<(), RebuildError> {
        for message in messages {
            let what = if message.get("id").is_some() {
                "a journal request"
            } else {
                "a journal notification"
            };
            self.exchange(what, upstream_id, headers.clone(), message)
                .await?;
        }
        Ok(())
    }

    /// POSTs one message (`what`, for errors) with `headers` and reads the answer: the upstream
    /// session id and the messages of a 2xx; any other status is an error.
    async fn exchange(
        &self,
        what: &'static str,
        upstream_session: Option<&str>,
        headers: HeaderMap,
        message: &Value,
    ) -> Result<(Option<String>, Messages), RebuildError> {
        let exchange = Exchange {
            upstream_session,
            headers,
            last_event_id: None,
        };
        let resp = self
            .upstream
            .send(Method::POST, exchange, Bytes::from(message.to_string()))
            .await
            .map_err(|e| RebuildError::Unreachable(e.to_string()))?;
        let status = resp.status();
        let sse = is_sse(&resp);
        let id = resp
            .headers()
            .get(MCP_SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let stored = self
            // The answers of a replayed journal reach no client.
            .read_stored(resp, &Owner::ANONYMOUS)
            .await
            .map_err(|r| RebuildError::Exchange(r.reason().to_owned()))?;
        if stored.refuses_caller() {
            return Err(RebuildError::Denied(what, stored));
        }
        if !status.is_success() {
            return Err(RebuildError::Refused(what, status));
        }
        let messages = if sse {
            sse_messages(stored.body).await
        } else {
            vec![(None, stored.body)]
        };
        Ok((id, messages))
    }
}

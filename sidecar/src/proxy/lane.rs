//! The request's lane: where a request on the MCP or peer port goes, decided in one place.
//!
//! [`Lanes::decide`] takes a request's head and a way to read its body, and returns the
//! [`Lane`] the pingora callbacks then carry out (`proxy/mod.rs`): they hold no decision of
//! their own. The steps, in order:
//!
//! ```text
//!  head ─┬─ peer path on the peer port ─────────────────────────────────────► Peer
//!        ├─ GET /tether/probe ──────────────────────────────────────────────► Probe
//!        ├─ admission: refused (Origin, version, method …) ─────────────────► Refuse
//!        │             preflight ───────────────────────────────────────────► Preflight
//!        ├─ the connection was refused a slot ─────────────────────────────► Refuse (503)
//!        ├─ a 2026-07-28 retry of a multi round-trip request: body read
//!        │  first, its requestState names the issuing pod
//!        ├─ route (docs/design/routing.md): a session held here is entered,
//!        │  one being handed off is waited for (MOVE_WAIT)
//!        │    ├─ held elsewhere, moved, placed on a peer ─────────────────────► Forward
//!        │    ├─ no holder, or ended here: a POST's body decides (an initialize
//!        │    │  that kept a stale session id starts a new session), else ────► Refuse (404)
//!        │    └─ here
//!        └─ era: 2026-07-28 ─── body read, checked against its headers ─────► Stateless
//!                sessionful ─── body read, a POST's envelope parsed once ───► Session
//! ```
//!
//! A forwarded request's body is never read here (pingora relays it), except a multi
//! round-trip retry's, which stays in pingora's 64 KiB retry buffer for the forward; one over
//! it is served here. Each request's body is parsed at most once: the [`Body`] handed to the
//! broker carries its envelope.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method};

use super::connection::Port;
use super::forward::Forwarding;
use super::slots::Full;
use super::{MOVE_WAIT, placement_nonce};
use crate::broker::{Broker, Here};
use crate::cluster::routing::{ForwardKind, Hop, Route, Router, Target};
use crate::handoff::Handoff;
use crate::handoff::replication::Recovered;
use crate::lifecycle::Lifecycle;
use crate::mcp::admission::{Admission, AdmissionPolicy, Admitted, Era};
use crate::mcp::headers::{MCP_METHOD, MCP_NAME};
use crate::mcp::home::HomeToken;
use crate::mcp::jsonrpc::{Body, Envelope, RequestKey};
use crate::mcp::modern;
use crate::mcp::mrtr;
use crate::mcp::origin::OriginCheck;
use crate::mcp::rejection::{NotFound, Rejection};
use crate::mcp::tasks::{Revision, names_task};
use crate::peer::auth::now_ms;
use crate::peer::hop::Accept;
use crate::peer::{PROBE_PATH, is_peer_path};
use crate::proxy::metrics::{MrtrRetry, ProxyMetrics};
use crate::session::{EnterGuard, Entry};

/// What the pingora callbacks do with a request.
#[derive(Debug)]
pub(crate) enum Lane {
    /// A peer protocol message (the peer port only): the peer listener serves it.
    Peer,
    /// The peers' liveness probe, answered with the peer protocol this sidecar speaks.
    Probe,
    /// A CORS preflight: 204 with these headers.
    Preflight(HeaderMap),
    /// Answered with an error of the sidecar's own.
    Refuse(Refusal),
    /// Proxied to a peer through pingora's proxy path.
    Forward(Forwarding),
    /// A 2026-07-28 request served here, without a session.
    Stateless {
        /// The admitted request.
        admitted: Admitted,
        /// Its body, checked.
        request: StatelessRequest,
    },
    /// A sessionful request served here by the broker.
    Session {
        /// The admitted request.
        admitted: Admitted,
        /// Its body, a POST's envelope parsed.
        body: Body,
        /// The session held here that it entered (released once its stream is registered, so
        /// a handoff never images a session halfway through a request).
        entered: Option<EnterGuard>,
    },
}

/// An error the sidecar answers itself.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// The error.
    pub(crate) rejection: Rejection,
    /// The JSON-RPC id its body echoes, when the request's body was read.
    pub(crate) id: Option<RequestKey>,
    /// The connection closes after the answer (its body was not read to its end).
    pub(crate) close: bool,
}

impl From<Rejection> for Refusal {
    fn from(rejection: Rejection) -> Self {
        Self {
            rejection,
            id: None,
            close: false,
        }
    }
}

/// A 2026-07-28 request read whole: its body and, for a POST, its envelope (checked against the
/// standard headers).
#[derive(Debug)]
pub(crate) struct StatelessRequest {
    pub(crate) body: Bytes,
    pub(crate) envelope: Option<Envelope>,
}

/// A request's head, as the lane needs it.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) headers: HeaderMap,
    /// The listener the request came to.
    pub(crate) port: Port,
    /// Its connection was refused a slot: it gets one answer.
    pub(crate) refused: Option<Full>,
}

/// Where a request's body comes from: the client's connection (pingora's session), or a
/// test's bytes.
#[async_trait]
pub(crate) trait BodySource: Send {
    /// The body's next chunk, `None` at its end; `Err` when it broke off.
    async fn chunk(&mut self) -> Result<Option<Bytes>, ()>;
    /// Keeps what is read from now on for a forward to resend (pingora's retry buffer).
    fn keep_for_resend(&mut self);
    /// Whether more was read than a forward could resend.
    fn too_large_to_resend(&self) -> bool;
}

/// What a lane is decided from: the pod's parts, borrowed for one request.
pub(crate) struct Lanes<'a> {
    pub(crate) broker: &'a Arc<Broker>,
    pub(crate) router: &'a Router,
    /// The admission policy as loaded for this request (a reload applies to the next).
    pub(crate) policy: Arc<AdmissionPolicy>,
    pub(crate) lifecycle: &'a Lifecycle,
    /// Moves a session again whose new holder left before a request for it came here.
    pub(crate) handoff: &'a Arc<Handoff>,
    /// Requests and multi round-trip retries are counted here (refusals by whoever answers
    /// them).
    pub(crate) metrics: &'a ProxyMetrics,
    /// How long a request body may take to arrive (slow clients get 408).
    pub(crate) body_timeout: Duration,
}

impl Lanes<'_> {
    /// The lane of the request `head` (body from `body`), and the `Origin` check its answer's
    /// CORS headers follow.
    pub(crate) async fn decide(
        &self,
        head: &Head,
        body: &mut impl BodySource,
    ) -> (Lane, OriginCheck) {
        if matches!(head.port, Port::Peer { .. }) && is_peer_path(&head.path) {
            return (Lane::Peer, OriginCheck::Missing);
        }
        if head.method == Method::GET && head.path == PROBE_PATH {
            return (Lane::Probe, OriginCheck::Missing);
        }
        let admitted = match self.policy.admit(&head.method, &head.path, &head.headers) {
            Err(refused) => {
                // MCP's `UnsupportedProtocolVersionError` answers the request by its id.
                let id = match &refused.rejection {
                    Rejection::UnsupportedVersion(v)
                        if head.method == Method::POST && !v.modern().is_empty() =>
                    {
                        self.request_id(body).await
                    }
                    _ => None,
                };
                let refusal = Refusal {
                    rejection: refused.rejection,
                    id,
                    close: false,
                };
                return (Lane::Refuse(refusal), refused.origin);
            }
            Ok(Admission::Preflight(headers)) => {
                return (Lane::Preflight(headers), OriginCheck::Missing);
            }
            Ok(Admission::Request(admitted)) => admitted,
        };
        let origin = admitted.origin.clone();
        (self.admitted(head, admitted, body).await, origin)
    }

    /// [`Lanes::decide`] for an admitted request.
    async fn admitted(&self, head: &Head, admitted: Admitted, body: &mut impl BodySource) -> Lane {
        if let Some(full) = head.refused {
            let rejection = match full {
                Full::Source => Rejection::SourceConnections,
                Full::Listener => Rejection::TooManyConnections,
            };
            return Lane::Refuse(rejection.into());
        }
        // A retry of a multi round-trip request is read first: its `requestState` names the pod
        // that serves it. The body stays in pingora's retry buffer for a forward.
        let mut read_first = None;
        if may_retry_input(&admitted) {
            body.keep_for_resend();
            match self.read_stateless(body, &admitted).await {
                Ok(request) => read_first = Some(request),
                Err(refusal) => return Lane::Refuse(refusal),
            }
        }
        let issuer = read_first.as_ref().and_then(|r| self.issuer(r, &admitted));
        let mut too_large = false;
        // A POST for a session nobody holds may still be an `initialize` that kept an old session
        // id (`fr15_an_initialize_with_a_stale_session_id_starts_a_new_session`): the body decides,
        // so the 404 waits for it.
        let (entered, miss) = match self.route(&admitted, head.port, issuer).await {
            Ok(Routed::Here(entered)) => (entered, None),
            // A body read first that is over the retry buffer cannot be resent: served here.
            Ok(Routed::Forward(_)) if read_first.is_some() && body.too_large_to_resend() => {
                too_large = true;
                (None, None)
            }
            Ok(Routed::Forward(mut forwarding)) => {
                forwarding.at_most_once =
                    admitted.era == Era::Stateless && admitted.method == Method::POST;
                if issuer.is_some() {
                    self.metrics.mrtr_retry(MrtrRetry::Forwarded);
                }
                return Lane::Forward(*forwarding);
            }
            Err(rejection @ Rejection::SessionNotFound(_)) if admitted.method == Method::POST => {
                (None, Some(rejection))
            }
            Err(rejection) => return Lane::Refuse(rejection.into()),
        };
        self.metrics.request(&admitted.method, admitted.era);
        if admitted.era == Era::Stateless {
            if let Some(v) = admitted.version {
                self.broker.metrics().protocol_version(v);
            }
            if let Some(issuer) = issuer {
                let outcome = match (issuer == self.router.me(false).home, too_large) {
                    (true, _) => MrtrRetry::ServedByIssuer,
                    (false, true) => MrtrRetry::TooLarge,
                    (false, false) => MrtrRetry::IssuerGone,
                };
                self.metrics.mrtr_retry(outcome);
            }
            let request = match read_first {
                Some(request) => request,
                None => match self.read_stateless(body, &admitted).await {
                    Ok(request) => request,
                    Err(refusal) => return Lane::Refuse(refusal),
                },
            };
            return Lane::Stateless { admitted, request };
        }
        let bytes = match self.read_body(body).await {
            Ok(bytes) => bytes,
            Err(rejection) => {
                return Lane::Refuse(Refusal {
                    rejection,
                    id: None,
                    close: true,
                });
            }
        };
        let body = if admitted.method == Method::POST {
            Body::parsed(bytes, admitted.limits)
        } else {
            Body::new(bytes)
        };
        if let Some(rejection) = miss
            && !body.is_initialize()
        {
            return Lane::Refuse(rejection.into());
        }
        Lane::Session {
            admitted,
            body,
            entered,
        }
    }

    /// Reads the whole request body, at most the policy's `max_body_bytes` within
    /// `body_timeout`.
    async fn read_body(&self, body: &mut impl BodySource) -> Result<Bytes, Rejection> {
        let limit = self.policy.max_body_bytes;
        let read = async {
            let mut bytes = BytesMut::new();
            while let Some(chunk) = body
                .chunk()
                .await
                .map_err(|()| Rejection::InvalidRequest("the request body broke off".into()))?
            {
                if bytes.len() + chunk.len() > limit {
                    return Err(Rejection::PayloadTooLarge(limit));
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(bytes.freeze())
        };
        tokio::time::timeout(self.body_timeout, read)
            .await
            .unwrap_or(Err(Rejection::RequestTimeout))
    }

    /// The JSON-RPC id of the request in the body, read for an error that echoes it (a body
    /// that cannot be read or parsed has none).
    async fn request_id(&self, body: &mut impl BodySource) -> Option<RequestKey> {
        let bytes = self.read_body(body).await.ok()?;
        Envelope::parse(&bytes, self.policy.envelope)
            .ok()?
            .first_request_id()
    }

    /// Reads a 2026-07-28 request: its body (bounded), a POST's checked against its standard
    /// headers ([`modern::check`]); otherwise the refusal, with the request's id once the body
    /// is parsed.
    async fn read_stateless(
        &self,
        body: &mut impl BodySource,
        admitted: &Admitted,
    ) -> Result<StatelessRequest, Refusal> {
        let bytes = self.read_body(body).await.map_err(|rejection| Refusal {
            rejection,
            id: None,
            close: true,
        })?;
        if admitted.method != Method::POST {
            return Ok(StatelessRequest {
                body: bytes,
                envelope: None,
            });
        }
        let envelope = Envelope::parse(&bytes, admitted.limits).map_err(Rejection::from)?;
        if let Err(rejection) = modern::check(&admitted.headers, &envelope) {
            return Err(Refusal {
                rejection,
                id: envelope.first_request_id(),
                close: false,
            });
        }
        Ok(StatelessRequest {
            body: bytes,
            envelope: Some(envelope),
        })
    }

    /// The pod that issued the `requestState` of a request read before routing, when it
    /// carries a genuine one.
    fn issuer(&self, request: &StatelessRequest, admitted: &Admitted) -> Option<HomeToken> {
        let (_, message) = request.envelope.as_ref()?.messages.first()?;
        self.broker.request_state_issuer(message, &admitted.headers)
    }

    /// Routes an admitted request: served here (a session held here entered), forwarded to a
    /// peer, or the 404/403/503 that ends it. `issuer`: the pod that issued the `requestState`
    /// of a multi round-trip request's retry.
    async fn route(
        &self,
        admitted: &Admitted,
        port: Port,
        issuer: Option<HomeToken>,
    ) -> Result<Routed, Rejection> {
        let session_id = match admitted.era {
            Era::Stateless => None,
            _ => admitted.session_id.clone(),
        };
        let accept = match port {
            Port::Peer { .. } => Accept::Peer {
                me: self.router.uid(),
                now_ms: now_ms(),
            },
            Port::Mcp | Port::Admin => Accept::Nothing,
        };
        let hop = Hop::read(
            &admitted.headers,
            self.router.secret(),
            session_id.as_deref(),
            accept,
        )?;
        let nonce;
        let mut entered = None;
        let (target, home) = match session_id.as_deref() {
            Some(id) => {
                let (mut home, mut moved);
                (home, moved, entered) = self.enter(id).await?;
                if let Some(uid) = &moved
                    && self.router.moved_to(uid, &hop)
                        == Err(Rejection::SessionNotFound(NotFound::NoHolder))
                {
                    // The pod it was handed to is gone: if this one kept a copy, it moves again
                    // (or is served here); it may have moved on already.
                    self.handoff.push_again(id, uid).await;
                    (home, moved, entered) = self.enter(id).await?;
                }
                if let Some(uid) = moved {
                    let peer = self.router.moved_to(&uid, &hop)?;
                    return Ok(Routed::moved(peer, hop, session_id, home));
                }
                if entered.is_none() {
                    match self.handoff.recover(id, home, &hop).await {
                        Recovered::Held => (home, _, entered) = self.enter(id).await?,
                        Recovered::At(peer) => {
                            return Ok(Routed::moved(peer, hop, session_id, home));
                        }
                        Recovered::Unavailable => return Err(Rejection::PeerUnavailable),
                        Recovered::Route => {}
                    }
                }
                let held = entered.is_some();
                (Target::Session { id, home, held }, Some(home))
            }
            None => match issuer.or_else(|| self.task_holder(admitted)) {
                Some(home) => (Target::Issued { home }, Some(home)),
                None => {
                    nonce = placement_nonce();
                    (Target::Placement { nonce: &nonce }, None)
                }
            },
        };
        match self
            .router
            .route(self.lifecycle.is_draining(), target, &hop)
        {
            Route::Local => Ok(Routed::Here(entered)),
            // Served here: a task's request gets the task's not-found error (`broker::tasks`), a
            // retry of a multi round-trip request goes to this pod's MCP server.
            Route::NotFound(_) if matches!(target, Target::Issued { .. }) => {
                Ok(Routed::Here(entered))
            }
            Route::NotFound(reason) => {
                if let Some(id) = session_id.as_deref() {
                    tracing::debug!(
                        session = self.broker.log_digest(id),
                        reason = reason.label(),
                        hop = hop.count,
                        visited = hop.visited.join(","),
                        "no pod holds the session"
                    );
                }
                Err(Rejection::SessionNotFound(reason))
            }
            Route::Unavailable => Err(Rejection::PeerUnavailable),
            Route::Forward { peer, kind } => {
                tracing::debug!(peer = %peer.name, kind = kind.label(), hop = hop.count + 1, "forwarding");
                Ok(Routed::Forward(Box::new(Forwarding::new(
                    peer, kind, hop, session_id, home,
                ))))
            }
        }
    }

    /// The pod holding the task a 2026-07-28 `tasks/*` request names in `Mcp-Name`, when that is
    /// a genuine task id (the header is checked against the body where the request is served).
    fn task_holder(&self, admitted: &Admitted) -> Option<HomeToken> {
        if admitted.era != Era::Stateless || admitted.method != Method::POST {
            return None;
        }
        let text = |name| {
            admitted
                .headers
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
        };
        text(MCP_METHOD)
            .map(str::trim)
            .filter(|m| names_task(m, Revision::Extension))?;
        self.broker
            .task_holder(text(MCP_NAME)?.trim(), &admitted.headers)
    }

    /// Enters session `id` when it is held here, waiting out a handoff under way: its home,
    /// the new holder's UID when it was handed off from here, and the guard of a session
    /// entered; 404 with its reason for a session that ended here.
    async fn enter(
        &self,
        id: &str,
    ) -> Result<(HomeToken, Option<String>, Option<EnterGuard>), Rejection> {
        loop {
            let (home, here) = self.broker.locate(id).map_err(Rejection::SessionNotFound)?;
            let session = match here {
                Here::Held(session) => session,
                Here::Moved(uid) => return Ok((home, Some(uid), None)),
                // This pod was its holder: nobody else holds it, and a replica pod not yet
                // told it ended would answer 503 for a holder it sees alive.
                Here::Ended(reason) => return Err(Rejection::SessionNotFound(reason)),
                Here::Absent => return Ok((home, None, None)),
            };
            match session.enter() {
                Entry::Entered(guard) => return Ok((home, None, Some(guard))),
                Entry::Moved(uid) => return Ok((home, Some(uid), None)),
                Entry::Moving => {
                    if !session.settled(MOVE_WAIT).await {
                        return Err(Rejection::PeerUnavailable);
                    }
                }
            }
        }
    }
}

/// Where routing sends a request.
enum Routed {
    /// Served here; the session held here that it entered.
    Here(Option<EnterGuard>),
    /// Proxied to a peer.
    Forward(Box<Forwarding>),
}

impl Routed {
    /// Forwarded to `peer`, which holds session `session_id` (homed at `home`) since it moved or
    /// was taken over there.
    fn moved(
        peer: crate::cluster::membership::Peer,
        hop: Hop,
        session_id: Option<String>,
        home: HomeToken,
    ) -> Self {
        Self::Forward(Box::new(Forwarding::new(
            peer,
            ForwardKind::Moved,
            hop,
            session_id,
            Some(home),
        )))
    }
}

/// Whether a 2026-07-28 request may retry a multi round-trip request (a POST whose `Mcp-Method`
/// may be answered with an `InputRequiredResult`): its body is read before it is routed, as its
/// `requestState` names the pod to serve it (`docs/design/routing.md#multi-round-trip-requests`).
fn may_retry_input(admitted: &Admitted) -> bool {
    admitted.era == Era::Stateless
        && admitted.method == Method::POST
        && admitted
            .headers
            .get(MCP_METHOD)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|m| mrtr::may_require_input(m.trim()))
}

#[cfg(test)]
mod tests;

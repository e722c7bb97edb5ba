//! The peer protocol's messages on the peer port (`spec.peer.port`): where sidecars push
//! sessions and tails to this pod (`docs/design/handoff.md`, `docs/design/peer-trust.md`).
//! The peer port's connections (TLS, limits) and its forwarded requests are the proxy's; the
//! proxy hands every request under `/v2/` to [`PeerListener::serve`].
//!
//! | request | answer |
//! |---|---|
//! | `POST /v2/sessions` ([`SessionPush`]) | 200 once the session is held here (the acknowledgement); 503 draining or full; 403 forged id; 400 unusable |
//! | `POST /v2/tail` ([`TailPush`]) | 200 applied; 404 the session is not held here (the sender stops) |
//! | `POST /v2/cancel` ([`CancelPush`]) | 200 once the cancellation went to this pod's upstream; 404 the session is not here |
//! | `POST /v2/held` ([`HeldQuery`]) | 200 `{"held": bool}`: whether this pod took the session at that epoch or a later one |
//! | `POST /v2/replicas` ([`ReplicasPush`]) | 200 with what became of each replica ([`Handoff::keep_replicas`]) |
//! | `POST /v2/claim` ([`ClaimQuery`]) | 200 with the replica handed back to its restarted holder, or `held` ([`Handoff::hand_back`]) |
//! | `POST /v2/about` ([`About`]) | 200 with this pod's report, once the sender's is recorded in [`Reports`] (only when the connection comes from the sender's address in membership, [`speaks_for`]) |
//! | a head that does not authenticate | 401 (`skew`: with this pod's time in `Tether-Peer-Time`), 421 another receiver, 413 too long — before a slot is taken or a body byte read |
//! | a nonce seen within the window | 409 `replayed` |
//! | a body other than the signed one | 400 `digest_mismatch` |
//! | more than [`MAX_CONCURRENT`] messages at once for [`QUEUE_WAIT`], or [`MAX_NONCES`] nonces in the window | 503 `busy` |
//!
//! Every answer to a message that authenticated carries `Tether-Peer-Ack`.
//! Error bodies are JSON `{"error": "...", "reason": "..."}`.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use pingora::protocols::http::ServerSession;
use tokio::sync::Semaphore;

use super::Handoff;
use super::adopt::{self, AdoptError};
use super::metrics::HandoffMetrics;
use crate::broker::Broker;
use crate::cluster::membership::View;
use crate::cluster::membership::reports::{self, Reports};
use crate::cluster::routing::Router;
use crate::keys::KeyRing;
use crate::lifecycle::Lifecycle;
use crate::peer::auth::{self, AuthFailure, BodyCheck, Claim, TETHER_PEER_ACK, TETHER_PEER_TIME};
use crate::peer::nonces::{MAX_NONCES, NonceError, Nonces};
use crate::peer::wire::{
    About, CancelPush, ClaimQuery, HeldAnswer, HeldQuery, ReplicasPush, SessionPush, TailPush,
};
use crate::peer::{
    ABOUT_PATH, CANCEL_PATH, CLAIM_PATH, HELD_PATH, REPLICAS_PATH, SESSIONS_PATH, TAIL_PATH,
};
use crate::reply::{Reply, ReplyBody};

/// Messages handled at the same time; more wait.
pub(crate) const MAX_CONCURRENT: usize = 128;
/// How long a message waits for a slot before 503.
pub(crate) const QUEUE_WAIT: Duration = Duration::from_secs(5);
/// How long a message body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// A refused message: status, reason label, message.
type Refusal = (StatusCode, &'static str, String);

/// What a message asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Sessions,
    Tail,
    Cancel,
    Held,
    About,
    Replicas,
    Claim,
}

impl Kind {
    fn of(path: &str) -> Option<Self> {
        match path {
            SESSIONS_PATH => Some(Self::Sessions),
            TAIL_PATH => Some(Self::Tail),
            CANCEL_PATH => Some(Self::Cancel),
            HELD_PATH => Some(Self::Held),
            ABOUT_PATH => Some(Self::About),
            REPLICAS_PATH => Some(Self::Replicas),
            CLAIM_PATH => Some(Self::Claim),
            _ => None,
        }
    }
}

/// The receiving side of the peer protocol of one pod.
pub(crate) struct PeerListener {
    broker: Arc<Broker>,
    handoff: Arc<Handoff>,
    lifecycle: Arc<Lifecycle>,
    metrics: Arc<HandoffMetrics>,
    keys: KeyRing,
    uid: String,
    max_message_bytes: usize,
    router: Router,
    reports: Arc<Reports>,
    slots: Semaphore,
    nonces: Nonces,
}

impl PeerListener {
    /// The listener of pod `uid`, adopting into `broker` (unless `lifecycle` says this pod
    /// drains), checking MACs with `keys`, refusing bodies over `max_message_bytes`; peers'
    /// reports go to `reports`, which has this pod's, when `router`'s membership lists them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        broker: Arc<Broker>,
        handoff: Arc<Handoff>,
        lifecycle: Arc<Lifecycle>,
        metrics: Arc<HandoffMetrics>,
        keys: KeyRing,
        uid: String,
        max_message_bytes: usize,
        router: Router,
        reports: Arc<Reports>,
    ) -> Self {
        Self {
            broker,
            handoff,
            lifecycle,
            metrics,
            keys,
            uid,
            max_message_bytes,
            router,
            reports,
            slots: Semaphore::new(MAX_CONCURRENT),
            nonces: Nonces::new(auth::WINDOW * 2, MAX_NONCES),
        }
    }

    /// Answers the peer-protocol request `session` carries (its head read, its body not).
    pub(crate) async fn serve(&self, session: &mut ServerSession) -> Reply {
        let (method, path) = {
            let req = session.req_header();
            (req.method.clone(), req.uri.path().to_owned())
        };
        let Some(kind) = Kind::of(&path) else {
            return error(StatusCode::NOT_FOUND, "unknown_path", "unknown path");
        };
        if method != Method::POST {
            return error(StatusCode::METHOD_NOT_ALLOWED, "method", "use POST");
        }
        let claim = match self.authenticate(session, &method, &path) {
            Ok(claim) => claim,
            Err(reply) => {
                session.set_keepalive(None);
                return *reply;
            }
        };
        let (status, body) = self.dispatch(session, kind, &claim).await;
        let mut reply = json(status, body);
        reply.headers.insert(
            TETHER_PEER_ACK,
            auth::ack(&self.keys, &self.uid, &claim.nonce, &claim.digest, status),
        );
        reply
    }

    /// Checks a message's head and nonce: the [`Claim`] its body must meet, or the refusal.
    fn authenticate(
        &self,
        session: &ServerSession,
        method: &Method,
        path: &str,
    ) -> Result<Claim, Box<Reply>> {
        let now = auth::now_ms();
        let headers = &session.req_header().headers;
        let claim = auth::check(
            &self.keys,
            method,
            path,
            headers,
            &self.uid,
            now,
            self.max_message_bytes,
        )
        .map_err(|refused| {
            self.metrics.peer_auth_failure(refused.failure());
            let mut reply = error(refused.status(), refused.reason(), &refused.to_string());
            if matches!(refused, auth::Refused::Skew(_)) {
                reply
                    .headers
                    .insert(TETHER_PEER_TIME, HeaderValue::from(now));
            }
            Box::new(reply)
        })?;
        match self.nonces.admit(claim.nonce, Instant::now()) {
            Ok(()) => {
                self.metrics.peer_nonces(self.nonces.len());
                Ok(claim)
            }
            Err(NonceError::Replayed) => {
                self.metrics.peer_auth_failure(AuthFailure::Replayed);
                let mut reply = error(StatusCode::CONFLICT, "replayed", "message seen before");
                reply.headers.insert(
                    TETHER_PEER_ACK,
                    auth::ack(
                        &self.keys,
                        &self.uid,
                        &claim.nonce,
                        &claim.digest,
                        StatusCode::CONFLICT,
                    ),
                );
                Err(Box::new(reply))
            }
            Err(NonceError::Full) => Err(Box::new(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "too many messages in the time window",
            ))),
        }
    }

    /// Takes a slot, reads the body against `claim`, and carries the message out.
    async fn dispatch(
        &self,
        session: &mut ServerSession,
        kind: Kind,
        claim: &Claim,
    ) -> (StatusCode, serde_json::Value) {
        let Ok(Ok(_slot)) = tokio::time::timeout(QUEUE_WAIT, self.slots.acquire()).await else {
            return refusal((
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "too many messages".into(),
            ));
        };
        let mut check = BodyCheck::new(claim);
        let body = match read_body(session, claim.length, |chunk| check.update(chunk)).await {
            Ok(body) => body,
            Err(refused) => {
                session.set_keepalive(None);
                return refusal(refused);
            }
        };
        if !check.matches() {
            self.metrics.peer_auth_failure(AuthFailure::DigestMismatch);
            session.set_keepalive(None);
            return refusal((
                StatusCode::BAD_REQUEST,
                "digest_mismatch",
                "the body is not the signed one".into(),
            ));
        }
        self.carry_out(kind, &claim.from, remote_ip(session), &body)
            .await
    }

    /// Applies an authenticated message from `from`, whose connection comes from `remote`
    /// (`None`: unknown).
    async fn carry_out(
        &self,
        kind: Kind,
        from: &str,
        remote: Option<IpAddr>,
        body: &[u8],
    ) -> (StatusCode, serde_json::Value) {
        let outcome = match kind {
            Kind::Held => {
                return match parse::<HeldQuery>(from, body) {
                    Ok(query) => {
                        let held = adopt::took(&self.broker, &query);
                        (StatusCode::OK, serde_json::json!(HeldAnswer { held }))
                    }
                    Err(refused) => refusal(refused),
                };
            }
            Kind::About => {
                return match parse::<About>(from, body) {
                    Ok(about) => {
                        if speaks_for(&self.router.view(), from, remote) {
                            self.reports.record(from, about.into());
                        }
                        let own = reports::about(&self.uid, self.reports.own());
                        (StatusCode::OK, serde_json::json!(own))
                    }
                    Err(refused) => refusal(refused),
                };
            }
            Kind::Replicas => {
                return match parse::<ReplicasPush>(from, body) {
                    Ok(push) => (
                        StatusCode::OK,
                        serde_json::json!(self.handoff.keep_replicas(push)),
                    ),
                    Err(refused) => refusal(refused),
                };
            }
            Kind::Claim => {
                return match parse::<ClaimQuery>(from, body) {
                    Ok(query) => (
                        StatusCode::OK,
                        serde_json::json!(self.handoff.hand_back(&query)),
                    ),
                    Err(refused) => refusal(refused),
                };
            }
            Kind::Sessions => parse::<SessionPush>(from, body)
                .map(|push| adopt::adopt(&self.broker, &self.lifecycle, &push)),
            Kind::Tail => parse::<TailPush>(from, body)
                .map(|tail| adopt::apply_tail(&self.broker, &tail).map(|_| ())),
            Kind::Cancel => match parse::<CancelPush>(from, body) {
                Ok(push) => Ok(adopt::cancel_here(&self.broker, &push).await),
                Err(refused) => Err(refused),
            },
        };
        match outcome {
            Ok(Ok(())) => (StatusCode::OK, serde_json::json!({"ok": true})),
            Ok(Err(e)) => refusal(adopt_error(&e)),
            Err(refused) => refusal(refused),
        }
    }
}

/// The IP the connection of `session` comes from, if known.
fn remote_ip(session: &ServerSession) -> Option<IpAddr> {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(std::net::SocketAddr::ip)
}

/// Whether a report sent by an asker claiming to be pod `from`, over a connection from `remote`,
/// may be recorded as that pod's: `view` holds `from` on the address `remote`. Any holder of the
/// key ring can claim any UID; only the pod on the address the EndpointSlices give that UID
/// speaks for it. (A report this pod gets by asking a slice address needs no such check.)
fn speaks_for(view: &View, from: &str, remote: Option<IpAddr>) -> bool {
    view.peer(from)
        .is_some_and(|peer| Some(peer.address.ip()) == remote)
}

/// Reads a body of at most `limit` bytes within [`BODY_TIMEOUT`], each chunk offered to
/// `take` first (`false`: longer than announced).
async fn read_body(
    session: &mut ServerSession,
    limit: usize,
    mut take: impl FnMut(&[u8]) -> bool,
) -> Result<Bytes, Refusal> {
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            "message_too_large",
            format!("messages are limited to {limit} bytes"),
        )
    };
    let read = async {
        let mut body = BytesMut::new();
        loop {
            match session.read_request_body().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > limit || !take(&chunk) {
                        return Err(too_large());
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => return Ok(body.freeze()),
                Err(e) => return Err((StatusCode::BAD_REQUEST, "body", e.to_string())),
            }
        }
    };
    tokio::time::timeout(BODY_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| {
            Err((
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                "the message body did not arrive in time".to_owned(),
            ))
        })
}

/// A message whose `from` names its authenticated sender.
trait FromPeer: serde::de::DeserializeOwned {
    fn sender(&self) -> &str;
}

impl FromPeer for SessionPush {
    fn sender(&self) -> &str {
        &self.from
    }
}

impl FromPeer for TailPush {
    fn sender(&self) -> &str {
        &self.from
    }
}

impl FromPeer for CancelPush {
    fn sender(&self) -> &str {
        &self.from
    }
}

impl FromPeer for HeldQuery {
    fn sender(&self) -> &str {
        &self.from
    }
}

impl FromPeer for ReplicasPush {
    fn sender(&self) -> &str {
        &self.from
    }
}

impl FromPeer for ClaimQuery {
    fn sender(&self) -> &str {
        &self.from
    }
}

impl FromPeer for About {
    fn sender(&self) -> &str {
        &self.from
    }
}

/// Decodes a message body and checks that it comes from `from` (the authenticated sender).
fn parse<M: FromPeer>(from: &str, body: &[u8]) -> Result<M, Refusal> {
    let message: M = serde_json::from_slice(body)
        .map_err(|e| (StatusCode::BAD_REQUEST, "malformed", e.to_string()))?;
    if message.sender() != from {
        return Err((
            StatusCode::BAD_REQUEST,
            "sender",
            "`from` differs from Tether-Peer".to_owned(),
        ));
    }
    Ok(message)
}

fn adopt_error(e: &AdoptError) -> Refusal {
    let (status, reason) = match e {
        AdoptError::Forged => (StatusCode::FORBIDDEN, "forged_session_id"),
        AdoptError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_image"),
        AdoptError::Draining => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
        AdoptError::Full => (StatusCode::SERVICE_UNAVAILABLE, "full"),
        AdoptError::Stale(_) => (StatusCode::CONFLICT, "stale_epoch"),
        AdoptError::Ended => (StatusCode::CONFLICT, "ended"),
        AdoptError::NotHeld => (StatusCode::NOT_FOUND, "not_held"),
    };
    (status, reason, e.to_string())
}

fn refusal((status, reason, message): Refusal) -> (StatusCode, serde_json::Value) {
    (
        status,
        serde_json::json!({"error": message, "reason": reason}),
    )
}

fn error(status: StatusCode, reason: &'static str, message: &str) -> Reply {
    let (status, body) = refusal((status, reason, message.to_owned()));
    json(status, body)
}

fn json(status: StatusCode, value: serde_json::Value) -> Reply {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Reply {
        status,
        headers,
        body: ReplyBody::Full(Bytes::from(format!("{value}\n"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cluster::membership::fixtures::peer;
    use crate::cluster::membership::{PeerState, Snapshot};

    #[test]
    fn only_the_pod_on_its_address_speaks_for_a_uid() {
        let mut b = peer("uid-b", PeerState::Draining);
        b.address = "10.0.0.2:8080".parse().unwrap();
        let view = View::new(Snapshot { peers: vec![b] });
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert!(speaks_for(&view, "uid-b", ip("10.0.0.2")));
        assert!(
            !speaks_for(&view, "uid-b", ip("10.0.0.9")),
            "another key holder claiming b's UID"
        );
        assert!(
            !speaks_for(&view, "uid-c", ip("10.0.0.2")),
            "a UID not in the view"
        );
        assert!(!speaks_for(&view, "uid-b", None), "an unknown remote");
    }
}

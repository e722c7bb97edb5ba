//! The peer listener (`spec.peer.port`): where sidecars push sessions and tails to this pod
//! (`docs/design/handoff.md`).
//!
//! | request | answer |
//! |---|---|
//! | `POST /v1/sessions` ([`SessionPush`]) | 200 once the session is held here (the acknowledgement); 503 draining or full; 403 forged id; 400 unusable |
//! | `POST /v1/tail` ([`TailPush`]) | 200 applied; 404 the session is not held here (the sender stops) |
//! | `POST /v1/cancel` ([`CancelPush`]) | 200 once the cancellation went to this pod's upstream; 404 the session is not here |
//! | bad MAC or time | 401 |
//! | body over `--peer-max-message-bytes` | 413 |
//! | more than [`MAX_CONCURRENT`] messages at once for [`QUEUE_WAIT`] | 503 |
//!
//! Error bodies are JSON `{"error": "...", "reason": "..."}`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use http::{Method, Response, StatusCode, header};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use tokio::sync::Semaphore;

use super::adopt::{self, AdoptError};
use super::auth;
use super::wire::{CancelPush, SessionPush, TailPush};
use crate::broker::Broker;
use crate::lifecycle::Lifecycle;
use crate::secret::Secret;

/// Path of session pushes.
pub(crate) const SESSIONS_PATH: &str = "/v1/sessions";
/// Path of tail messages.
pub(crate) const TAIL_PATH: &str = "/v1/tail";
/// Path of relayed cancellations.
pub(crate) const CANCEL_PATH: &str = "/v1/cancel";
/// Messages handled at the same time; more wait.
pub(crate) const MAX_CONCURRENT: usize = 64;
/// How long a message waits for a slot before 503.
pub(crate) const QUEUE_WAIT: Duration = Duration::from_secs(5);
/// How long a message body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// A refused message: status, reason label, message.
type Refusal = (StatusCode, &'static str, String);

/// The peer HTTP application.
pub(crate) struct PeerListener {
    broker: Arc<Broker>,
    lifecycle: Arc<Lifecycle>,
    secret: Secret,
    max_message_bytes: usize,
    slots: Arc<Semaphore>,
}

impl PeerListener {
    /// A listener adopting into `broker` (unless `lifecycle` says this pod drains), checking
    /// MACs with `secret`, refusing bodies over `max_message_bytes`.
    pub(crate) fn new(
        broker: Arc<Broker>,
        lifecycle: Arc<Lifecycle>,
        secret: Secret,
        max_message_bytes: usize,
    ) -> Self {
        Self {
            broker,
            lifecycle,
            secret,
            max_message_bytes,
            slots: Arc::new(Semaphore::new(MAX_CONCURRENT)),
        }
    }

    async fn read_body(&self, session: &mut ServerSession) -> Result<Bytes, Refusal> {
        let limit = self.max_message_bytes;
        let read = async {
            let mut body = BytesMut::new();
            loop {
                match session.read_request_body().await {
                    Ok(Some(chunk)) => {
                        if body.len() + chunk.len() > limit {
                            return Err((
                                StatusCode::PAYLOAD_TOO_LARGE,
                                "message_too_large",
                                format!("messages are limited to {limit} bytes"),
                            ));
                        }
                        body.extend_from_slice(&chunk);
                    }
                    Ok(None) => return Ok(body.freeze()),
                    Err(e) => {
                        return Err((StatusCode::BAD_REQUEST, "body", e.to_string()));
                    }
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

    async fn handle(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let (method, path) = {
            let req = session.req_header();
            (req.method.clone(), req.uri.path().to_owned())
        };
        if ![SESSIONS_PATH, TAIL_PATH, CANCEL_PATH].contains(&path.as_str()) {
            return error(StatusCode::NOT_FOUND, "unknown_path", "unknown path");
        }
        if method != Method::POST {
            return error(StatusCode::METHOD_NOT_ALLOWED, "method", "use POST");
        }
        let Ok(Ok(_slot)) = tokio::time::timeout(QUEUE_WAIT, self.slots.acquire()).await else {
            return error(StatusCode::SERVICE_UNAVAILABLE, "busy", "too many messages");
        };
        let body = match self.read_body(session).await {
            Ok(body) => body,
            Err(refusal) => return refuse(refusal),
        };
        let headers = session.req_header().headers.clone();
        let from = match auth::verify(&self.secret, &path, &headers, &body) {
            Ok(uid) => uid,
            Err(e) => return error(StatusCode::UNAUTHORIZED, "unauthenticated", &e.to_string()),
        };
        match path.as_str() {
            SESSIONS_PATH => self.adopt(&from, &body),
            TAIL_PATH => self.tail(&from, &body),
            _ => self.cancel(&from, &body).await,
        }
    }

    async fn cancel(&self, from: &str, body: &[u8]) -> Response<Vec<u8>> {
        let push: CancelPush = match parse(from, body) {
            Ok(push) => push,
            Err(refusal) => return refuse(refusal),
        };
        match adopt::cancel_here(&self.broker, &push).await {
            Ok(()) => ok(),
            Err(e) => adopt_error(&e),
        }
    }

    fn adopt(&self, from: &str, body: &[u8]) -> Response<Vec<u8>> {
        match parse::<SessionPush>(from, body)
            .map(|push| adopt::adopt(&self.broker, &self.lifecycle, &push))
        {
            Ok(Ok(())) => ok(),
            Ok(Err(e)) => adopt_error(&e),
            Err(refusal) => refuse(refusal),
        }
    }

    fn tail(&self, from: &str, body: &[u8]) -> Response<Vec<u8>> {
        match parse::<TailPush>(from, body).map(|tail| adopt::apply_tail(&self.broker, &tail)) {
            Ok(Ok(_)) => ok(),
            Ok(Err(e)) => adopt_error(&e),
            Err(refusal) => refuse(refusal),
        }
    }
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

fn refuse((status, reason, message): Refusal) -> Response<Vec<u8>> {
    error(status, reason, &message)
}

fn adopt_error(e: &AdoptError) -> Response<Vec<u8>> {
    let (status, reason) = match e {
        AdoptError::Forged => (StatusCode::FORBIDDEN, "forged_session_id"),
        AdoptError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_image"),
        AdoptError::Draining => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
        AdoptError::Full(_) => (StatusCode::SERVICE_UNAVAILABLE, "full"),
        AdoptError::NotHeld => (StatusCode::NOT_FOUND, "not_held"),
    };
    error(status, reason, &e.to_string())
}

fn ok() -> Response<Vec<u8>> {
    json(StatusCode::OK, serde_json::json!({"ok": true}))
}

fn error(status: StatusCode, reason: &str, message: &str) -> Response<Vec<u8>> {
    json(
        status,
        serde_json::json!({"error": message, "reason": reason}),
    )
}

fn json(status: StatusCode, value: serde_json::Value) -> Response<Vec<u8>> {
    let body = format!("{value}\n").into_bytes();
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, body.len())
        .body(body)
        .unwrap_or_default()
}

#[async_trait]
impl ServeHttp for PeerListener {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        self.handle(session).await
    }
}

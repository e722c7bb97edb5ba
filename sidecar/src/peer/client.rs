//! The sending side of the peer protocol: signed `POST`s to a peer's peer port, over mutual TLS
//! when `spec.peer.tls` is on (`docs/design/peer-trust.md`), as HTTP/2 streams of one connection
//! per peer when the peer offers `h2` (the tails of a drain's thousands of streams cost no
//! connection each).
//!
//! A message counts only when its answer carries an acknowledgement that verifies for the
//! receiver addressed, the message's nonce and body, and the status received; anything else is
//! [`SendError::Unacknowledged`], 2xx included. A 401 `skew` is answered with the receiver's
//! clock: the message is signed again once, with the time corrected.
//!
//! The client is also how the Kubernetes membership learns what a peer reports of itself
//! ([`Exchange`]: `POST /v2/about`, this pod's report out, the peer's back).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::auth::{self, Signed};
use crate::keys::KeyRing;
use crate::keys::tls::{PeerTls, server_name};
use crate::upstream::http_client;

/// How long connecting to a peer may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a peer may take to answer one message.
pub(crate) const MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle pooled connections to peers are closed after this long.
const POOL_IDLE: Duration = Duration::from_secs(20);
/// Longest error body kept for logs, in bytes.
const ERROR_BODY: usize = 512;

/// Why a message was not acknowledged.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// No connection could be made: the message never reached the peer. Worth retrying.
    #[error("peer unreachable: {0}")]
    Unreachable(String),
    /// The message was sent, but no answer came (a timeout, a broken exchange): the peer may
    /// have carried it out. Worth retrying — a push is asked about first
    /// (`docs/design/handoff.md#one-holder-per-session`).
    #[error("no answer from the peer: {0}")]
    Lost(String),
    /// The peer answered with an error status (its body says why), acknowledged.
    #[error("peer answered {status}: {reason}")]
    Refused {
        /// The status.
        status: StatusCode,
        /// The body, shortened.
        reason: String,
    },
    /// An answer without a valid acknowledgement: not from the peer addressed, or not to
    /// this message.
    #[error("answer {0} without a valid acknowledgement")]
    Unacknowledged(StatusCode),
}

impl SendError {
    /// Whether trying the same peer again may help (unreachable, or busy: 429/503).
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Self::Unreachable(_) | Self::Lost(_) => true,
            Self::Refused { status, .. } => {
                *status == StatusCode::SERVICE_UNAVAILABLE
                    || *status == StatusCode::TOO_MANY_REQUESTS
            }
            Self::Unacknowledged(_) => false,
        }
    }

    /// Whether the peer refused with this `reason` (the `reason` of its JSON error body).
    pub(crate) fn refused_for(&self, reason: &str) -> bool {
        match self {
            Self::Refused { reason: body, .. } => {
                reason_of(&Bytes::copy_from_slice(body.as_bytes())).as_deref() == Some(reason)
            }
            _ => false,
        }
    }
}

/// How the mover and the tail follower reach a peer: [`PeerClient`] in production, a scripted
/// fake in the component tests of `handoff/`.
#[async_trait::async_trait]
pub(crate) trait PeerLink: Send + Sync {
    /// POSTs `body` (JSON) to `path` (`/v2/…`) on the peer listener of `to`; the body of its
    /// acknowledged 2xx answer.
    ///
    /// # Errors
    /// [`SendError`].
    async fn ask(&self, to: Destination<'_>, path: &str, body: Bytes) -> Result<Bytes, SendError>;

    /// The same, for a message whose answer carries nothing but its acknowledgement.
    ///
    /// # Errors
    /// [`SendError`].
    async fn post(&self, to: Destination<'_>, path: &str, body: Bytes) -> Result<(), SendError> {
        self.ask(to, path, body).await.map(|_| ())
    }
}

/// Where a message goes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Destination<'a> {
    /// The receiving pod's UID.
    pub(crate) uid: &'a str,
    /// Its peer port.
    pub(crate) addr: SocketAddr,
}

/// The TLS client of one key-ring load.
struct TlsClient {
    tls: Arc<PeerTls>,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// A client of peers' listeners, signing as pod `uid`.
pub(crate) struct PeerClient {
    plain: Client<HttpConnector, Full<Bytes>>,
    tls: ArcSwapOption<TlsClient>,
    keys: KeyRing,
    uid: String,
    use_tls: bool,
}

impl std::fmt::Debug for PeerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerClient")
            .field("uid", &self.uid)
            .field("tls", &self.use_tls)
            .finish_non_exhaustive()
    }
}

impl PeerClient {
    /// A client signing with `keys` as pod `uid`; `use_tls` dials the peer port with mutual TLS.
    pub(crate) fn new(keys: KeyRing, uid: String, use_tls: bool) -> Self {
        Self {
            plain: http_client(CONNECT_TIMEOUT, POOL_IDLE, usize::MAX),
            tls: ArcSwapOption::empty(),
            keys,
            uid,
            use_tls,
        }
    }

    /// The UID of the pod it signs for.
    pub(crate) fn uid(&self) -> &str {
        &self.uid
    }

    /// The TLS client of the key ring loaded now (made again when the ring's TLS changed).
    fn tls_client(&self) -> Result<Arc<TlsClient>, SendError> {
        let ring = self.keys.load();
        let tls = ring
            .tls()
            .ok_or_else(|| SendError::Unreachable("the key ring has no TLS material".into()))?;
        if let Some(current) = self.tls.load_full()
            && Arc::ptr_eq(&current.tls, tls)
        {
            return Ok(current);
        }
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(rustls::ClientConfig::clone(&tls.client))
            .https_only()
            .with_server_name_resolver(FixedServerNameResolver::new(server_name()))
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let made = Arc::new(TlsClient {
            tls: Arc::clone(tls),
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(POOL_IDLE)
                .pool_timer(crate::upstream::pool_timer())
                .build(connector),
        });
        self.tls.store(Some(Arc::clone(&made)));
        Ok(made)
    }

    /// Sends a signed message and judges its answer (the [`PeerLink`] of production).
    async fn signed(
        &self,
        to: Destination<'_>,
        path: &str,
        body: Bytes,
    ) -> Result<Bytes, SendError> {
        let mut correction = 0i64;
        for attempt in 0..2 {
            let time =
                u64::try_from(i64::try_from(auth::now_ms()).unwrap_or(i64::MAX) + correction)
                    .unwrap_or(0);
            let signed = auth::sign(
                &self.keys,
                &Method::POST,
                path,
                &self.uid,
                to.uid,
                &body,
                time,
            );
            let (status, headers, answer) = self.exchange(to.addr, path, &signed, &body).await?;
            if attempt == 0
                && status == StatusCode::UNAUTHORIZED
                && reason_of(&answer).as_deref() == Some("skew")
                && let Some(c) = auth::skew_correction(&headers, time)
            {
                tracing::warn!(
                    peer = to.uid,
                    correction_ms = c,
                    "peer clock differs; signing again"
                );
                correction = c;
                continue;
            }
            return judge(&self.keys, to.uid, &signed, status, &headers, answer);
        }
        Err(SendError::Unreachable("clock skew persists".into()))
    }

    async fn exchange(
        &self,
        addr: SocketAddr,
        path: &str,
        signed: &Signed,
        body: &Bytes,
    ) -> Result<(StatusCode, HeaderMap, Bytes), SendError> {
        let scheme = if self.use_tls { "https" } else { "http" };
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(format!("{scheme}://{addr}{path}"))
            .header(header::CONTENT_TYPE, "application/json");
        for (name, value) in &signed.headers {
            req = req.header(name, value);
        }
        let req = req
            .body(Full::new(body.clone()))
            .map_err(|e| SendError::Unreachable(e.to_string()))?;
        if self.use_tls {
            let tls = self.tls_client()?;
            timed(tls.client.request(req)).await
        } else {
            timed(self.plain.request(req)).await
        }
    }
}

#[async_trait::async_trait]
impl PeerLink for PeerClient {
    async fn ask(&self, to: Destination<'_>, path: &str, body: Bytes) -> Result<Bytes, SendError> {
        self.signed(to, path, body).await
    }
}

/// Runs one exchange within [`MESSAGE_TIMEOUT`]: status, headers, body.
async fn timed(
    response: impl Future<
        Output = Result<http::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error>,
    >,
) -> Result<(StatusCode, HeaderMap, Bytes), SendError> {
    let exchange = async {
        let resp = response.await.map_err(|e| {
            if e.is_connect() {
                SendError::Unreachable(e.to_string())
            } else {
                SendError::Lost(e.to_string())
            }
        })?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| SendError::Lost(e.to_string()))?
            .to_bytes();
        Ok((parts.status, parts.headers, body))
    };
    tokio::time::timeout(MESSAGE_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err(SendError::Lost("timed out".into())))
}

/// What an answer to `signed` means: acknowledged success, an acknowledged refusal, or
/// nothing that counts.
fn judge(
    keys: &KeyRing,
    to: &str,
    signed: &Signed,
    status: StatusCode,
    headers: &HeaderMap,
    answer: Bytes,
) -> Result<Bytes, SendError> {
    if !auth::verify_ack(keys, headers, to, signed, status) {
        return Err(SendError::Unacknowledged(status));
    }
    if status.is_success() {
        return Ok(answer);
    }
    Err(refused(status, &answer))
}

fn refused(status: StatusCode, answer: &Bytes) -> SendError {
    let end = answer.len().min(ERROR_BODY);
    SendError::Refused {
        status,
        reason: String::from_utf8_lossy(&answer[..end]).trim().to_owned(),
    }
}

/// The `reason` of a JSON error body.
fn reason_of(answer: &Bytes) -> Option<String> {
    let body: serde_json::Value = serde_json::from_slice(answer).ok()?;
    Some(body.get("reason")?.as_str()?.to_owned())
}

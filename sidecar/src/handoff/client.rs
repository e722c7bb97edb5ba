//! The sending side of the peer protocol: authenticated `POST`s to a peer's peer listener.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use super::auth;
use crate::secret::Secret;
use crate::upstream::http_client;

/// How long connecting to a peer may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a peer may take to answer one message.
pub(crate) const MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest error body kept for logs, in bytes.
const ERROR_BODY: usize = 512;

/// Why a message was not acknowledged.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// No connection, a timeout or a broken exchange: worth retrying.
    #[error("peer unreachable: {0}")]
    Unreachable(String),
    /// The peer answered with an error status (its body says why).
    #[error("peer answered {status}: {reason}")]
    Refused {
        /// The status.
        status: StatusCode,
        /// The body, shortened.
        reason: String,
    },
}

impl SendError {
    /// Whether trying the same peer again may help (unreachable, or busy: 429/503).
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Self::Unreachable(_) => true,
            Self::Refused { status, .. } => {
                *status == StatusCode::SERVICE_UNAVAILABLE
                    || *status == StatusCode::TOO_MANY_REQUESTS
            }
        }
    }

    /// Metric label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Unreachable(_) => "unreachable",
            Self::Refused { .. } => "refused",
        }
    }
}

/// A client of peers' listeners, signing as pod `uid`.
#[derive(Clone, Debug)]
pub(crate) struct PeerClient {
    http: Client<HttpConnector, Full<Bytes>>,
    secret: Secret,
    uid: String,
}

impl PeerClient {
    /// A client signing with `secret` as pod `uid`.
    pub(crate) fn new(secret: Secret, uid: String) -> Self {
        let http = http_client(CONNECT_TIMEOUT, Duration::from_secs(20));
        Self { http, secret, uid }
    }

    /// POSTs `body` (JSON) to `path` on the peer listener at `addr`; `Ok` on 2xx.
    ///
    /// # Errors
    /// [`SendError`].
    pub(crate) async fn post(
        &self,
        addr: SocketAddr,
        path: &str,
        body: Bytes,
    ) -> Result<(), SendError> {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{addr}{path}"))
            .header(header::CONTENT_TYPE, "application/json");
        for (name, value) in auth::sign(&self.secret, path, &self.uid, &body) {
            req = req.header(name, value);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| SendError::Unreachable(e.to_string()))?;
        let exchange = async {
            let resp = self
                .http
                .request(req)
                .await
                .map_err(|e| SendError::Unreachable(e.to_string()))?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| SendError::Unreachable(e.to_string()))?
                .to_bytes();
            if status.is_success() {
                return Ok(());
            }
            let end = body.len().min(ERROR_BODY);
            Err(SendError::Refused {
                status,
                reason: String::from_utf8_lossy(&body[..end]).trim().to_owned(),
            })
        };
        tokio::time::timeout(MESSAGE_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| Err(SendError::Unreachable("timed out".into())))
    }
}

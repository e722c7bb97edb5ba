//! The drain socket (`--drain-socket`): a Unix socket that takes the request to drain, so that
//! only the sidecar's own container can start one (`docs/design/architecture.md#lifecycle`).
//!
//! The socket is created with mode 0600 in a directory the operator mounts into the sidecar
//! container only; the MCP server's container shares the pod's network but not that volume, so
//! neither the network nor a tool of the MCP server that fetches URLs can reach it.
//!
//! - `POST /drain` → drains the pod ([`crate::ops::drain`]) and answers when done with
//!   [`crate::ops::admin::drain_answer`]; every call waits for the same drain.
//!
//! [`request`] is the other end: what `tether-sidecar drain` sends.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::ops::admin::{drain_answer, text};
use crate::ops::drain::Drain;

/// The path of the drain request.
const DRAIN_PATH: &str = "/drain";

/// The drain socket's HTTP application.
pub(crate) struct DrainControl {
    drain: Arc<Drain>,
}

impl DrainControl {
    /// The application that runs `drain` on request.
    pub(crate) fn new(drain: Arc<Drain>) -> Self {
        Self { drain }
    }
}

#[async_trait]
impl ServeHttp for DrainControl {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        match (&req.method, req.uri.path()) {
            (&Method::POST, DRAIN_PATH) => {
                tracing::info!("drain requested on the drain socket");
                drain_answer(&self.drain.run().await)
            }
            (_, DRAIN_PATH) => text(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "use POST\n"),
            _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
        }
    }
}

/// Why `tether-sidecar drain` could not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum DrainRequestError {
    /// The socket cannot be reached (no sidecar runs, or another path).
    #[error("cannot reach the sidecar's drain socket {path}: {source}")]
    Connect {
        /// The socket's path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The exchange broke off.
    #[error("the drain request failed: {0}")]
    Http(#[from] hyper::Error),
}

/// Sends `POST /drain` to the sidecar listening on `socket` and waits for its answer: whether
/// the pod drained (200) and the outcome's JSON body.
///
/// # Errors
/// [`DrainRequestError`] when nothing listens there or the exchange breaks off.
pub async fn request(socket: &Path) -> Result<(bool, String), DrainRequestError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| DrainRequestError::Connect {
            path: socket.display().to_string(),
            source,
        })?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let req = Request::builder()
        .method(Method::POST)
        .uri(DRAIN_PATH)
        .header(http::header::HOST, "localhost")
        .body(Empty::<Bytes>::new())
        .unwrap_or_default();
    let resp = sender.send_request(req).await?;
    let drained = resp.status() == StatusCode::OK;
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((drained, String::from_utf8_lossy(&body).into_owned()))
}

//! The admin listener (`spec.admin.port`): `/healthz`, `/readyz`, `/metrics`, `/drain`
//! (`docs/design/architecture.md#lifecycle`).
//!
//! - `GET /healthz` → 200 while the process serves;
//! - `GET /readyz` → 200 when the upstream MCP server accepts connections, else 503 (the pod
//!   gets no new clients while its server is down or while it drains);
//! - `GET /metrics` → Prometheus text format;
//! - `POST /drain` (or `GET`, as a `preStop httpGet` sends) → drains the pod
//!   ([`crate::ops::drain`]: sessions handed to peers, requests in flight finished) and answers
//!   when done: 200
//!   `{"drained":true,"inFlight":0,"handedOff":N,"notMoved":N,"cut":0,"elapsedMs":N}`, or 503 with
//!   `"drained":false` when `spec.drain.timeout` passed first (`cut` requests ended with a JSON-RPC
//!   error). Idempotent: every call waits for the same drain.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::{Method, Response, StatusCode, header};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::ops::drain::Drain;
use crate::upstream::Upstream;

/// How long `/readyz` waits for a TCP connection to the upstream.
pub(crate) const READY_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The admin HTTP application.
pub(crate) struct Admin {
    upstream: Upstream,
    drain: Arc<Drain>,
    lifecycle: Arc<Lifecycle>,
    metrics: Arc<Metrics>,
}

impl Admin {
    /// Admin endpoints of a pod whose MCP server is `upstream`, draining with `drain`, ready
    /// unless `lifecycle` drains, serving `metrics`.
    pub(crate) fn new(
        upstream: Upstream,
        drain: Arc<Drain>,
        lifecycle: Arc<Lifecycle>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            upstream,
            drain,
            lifecycle,
            metrics,
        }
    }

    async fn drain(&self) -> Response<Vec<u8>> {
        let outcome = self.drain.run().await;
        let status = if outcome.drained {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        let body = serde_json::json!({
            "drained": outcome.drained,
            "inFlight": outcome.in_flight,
            "handedOff": outcome.handed_off,
            "notMoved": outcome.not_moved,
            "cut": outcome.cut,
            "elapsedMs": u64::try_from(outcome.elapsed.as_millis()).unwrap_or(u64::MAX),
        });
        text(status, "application/json", format!("{body}\n"))
    }
}

fn text(status: StatusCode, content_type: &str, body: impl Into<Vec<u8>>) -> Response<Vec<u8>> {
    let body = body.into();
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CONTENT_LENGTH, body.len())
        .body(body)
        .unwrap_or_default()
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        if req.uri.path() == "/drain" && (req.method == Method::POST || req.method == Method::GET) {
            return self.drain().await;
        }
        if req.method != Method::GET {
            return text(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "use GET\n");
        }
        match req.uri.path() {
            "/healthz" => text(StatusCode::OK, "text/plain", "ok\n"),
            "/readyz" if self.lifecycle.is_draining() => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "not ready: draining\n",
            ),
            "/readyz" => {
                if self.upstream.reachable(READY_PROBE_TIMEOUT).await {
                    text(StatusCode::OK, "text/plain", "ready\n")
                } else {
                    text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        "not ready: the MCP server does not accept connections\n",
                    )
                }
            }
            "/metrics" => text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                self.metrics.encode(),
            ),
            _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
        }
    }
}

//! The admin listener (`spec.admin.port`, on the pod IP): `/healthz`, `/readyz`, `/metrics`,
//! `/drained` (`docs/design/architecture.md#lifecycle`). Anything that reaches the pod IP may
//! read it; nothing on it changes the pod. Its connections are bounded like the MCP port's
//! (`--admin-max-connections`, `--admin-max-connections-per-source`, `--header-timeout` from
//! accept: the listener of `proxy/listener.rs`), so that no stranger can take the pod's memory
//! or every connection a probe or a `preStop` hook needs.
//!
//! - `GET /healthz` → 200 while the process serves;
//! - `GET /readyz` → 200 when the sidecar's MCP listener and the upstream MCP server accept
//!   connections and membership's first complete view arrived, else 503 (the pod gets no new
//!   clients before its listener is up, before it knows its peers — it would answer 404 for
//!   sessions homed on pods it does not know yet —, while its server is down or while it
//!   drains);
//! - `GET /metrics` → Prometheus text format;
//! - `GET /keys` → the key ring loaded here and how many sessions each key minted
//!   ([`tether_crds::keyring::KeyReport`], JSON): what the operator waits for between the steps
//!   of a rotation (`docs/design/peer-trust.md#rotation`); key ids only, never a key;
//! - `GET /drained` (the MCP server container's `preStop httpGet`) → waits until this pod's
//!   drain has ended — it never starts one — and answers with the drain's outcome
//!   ([`drain_answer`]); 503 `{"drained":false,"draining":bool}` when none ended within
//!   `spec.drain.timeout` + [`DRAINED_MARGIN`]. A waiter costs its connection and a watch of the
//!   drain's outcome, nothing else: any number wait (within the listener's connection caps), so
//!   strangers waiting cannot crowd out the `preStop` hook.
//! - `/drain` → 403: a drain starts only from inside the pod, through the drain socket
//!   ([`crate::ops::control`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use http::{Method, Response, StatusCode, header};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::broker::Broker;
use crate::cluster::routing::Router;
use crate::keys::{KeyRing, Role};
use crate::lifecycle::Lifecycle;
use crate::ops::drain::{Drain, DrainOutcome};
use crate::ops::metrics::{AdminRefusal, OpsMetrics};
use crate::upstream::Upstream;

/// How long `/readyz` waits for a TCP connection to the upstream.
pub(crate) const READY_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Added to `spec.drain.timeout` to bound a `/drained` wait: the errors of requests cut at the
/// deadline are flushed after it.
pub(crate) const DRAINED_MARGIN: Duration = Duration::from_secs(2);

/// What `GET /metrics` serves: the pod's metrics, assembled above this layer.
pub(crate) trait Exposition: Send + Sync {
    /// The metrics in the Prometheus text format.
    fn encode(&self) -> String;
}

/// The admin HTTP application.
pub(crate) struct Admin {
    upstream: Upstream,
    /// The sidecar's own MCP listener, and whether it has accepted a connection yet (pingora
    /// starts the admin and MCP services apart).
    listener: SocketAddr,
    listening: AtomicBool,
    drain: Arc<Drain>,
    lifecycle: Arc<Lifecycle>,
    exposition: Arc<dyn Exposition>,
    metrics: Arc<OpsMetrics>,
    keys: KeyRing,
    broker: Arc<Broker>,
    router: Router,
}

impl Admin {
    /// Admin endpoints of a pod whose MCP server is `upstream` and whose MCP listener is
    /// `listener`, draining with `drain`, ready unless `lifecycle` drains, serving `exposition`
    /// (counting its refusals in `metrics`), reporting the key ring `keys` and the sessions of
    /// `broker`, ready once `router`'s membership is known.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        upstream: Upstream,
        listener: SocketAddr,
        drain: Arc<Drain>,
        lifecycle: Arc<Lifecycle>,
        exposition: Arc<dyn Exposition>,
        metrics: Arc<OpsMetrics>,
        keys: KeyRing,
        broker: Arc<Broker>,
        router: Router,
    ) -> Self {
        Self {
            upstream,
            listener,
            listening: AtomicBool::new(false),
            drain,
            lifecycle,
            exposition,
            metrics,
            keys,
            broker,
            router,
        }
    }

    /// `GET /keys`: the ring loaded here and the sessions (held, or handed off and still
    /// forwarding) each key minted.
    fn keys(&self) -> Response<Vec<u8>> {
        let ring = self.keys.load();
        let id_of = |role: Role| {
            ring.keys()
                .find(|(r, _)| *r == role)
                .map(|(_, key)| key.id().to_string())
        };
        let report = tether_crds::keyring::KeyReport {
            current: id_of(Role::Current).unwrap_or_default(),
            previous: id_of(Role::Previous),
            next: id_of(Role::Next),
            sessions: self
                .broker
                .sessions_by_key()
                .into_iter()
                .map(|(id, n)| (id.to_string(), n))
                .collect(),
        };
        text(
            StatusCode::OK,
            "application/json",
            serde_json::to_vec(&report).unwrap_or_default(),
        )
    }

    /// Whether the MCP listener accepts connections (checked until it first does).
    async fn listening(&self) -> bool {
        if self.listening.load(Ordering::Relaxed) {
            return true;
        }
        let connect = tokio::net::TcpStream::connect(self.listener);
        let up = matches!(
            tokio::time::timeout(READY_PROBE_TIMEOUT, connect).await,
            Ok(Ok(_))
        );
        self.listening.store(up, Ordering::Relaxed);
        up
    }

    async fn drained(&self) -> Response<Vec<u8>> {
        match self
            .drain
            .ended(self.drain.deadline() + DRAINED_MARGIN)
            .await
        {
            Some(outcome) => drain_answer(&outcome),
            None => {
                let body = serde_json::json!({
                    "drained": false,
                    "draining": self.lifecycle.is_draining(),
                });
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "application/json",
                    format!("{body}\n"),
                )
            }
        }
    }
}

/// The answer to a drain request or a `/drained` wait: 200
/// `{"drained":true,"inFlight":0,"handedOff":N,"notMoved":N,"cut":0,"statelessInFlight":N,
/// "listenClosed":N,"elapsedMs":N}`, or 503 with `"drained":false` when `spec.drain.timeout`
/// passed first (`cut` requests ended with a JSON-RPC error). `statelessInFlight`: 2026-07-28
/// requests in flight at the start, let finish; `listenClosed`: `subscriptions/listen` streams
/// ended at the start.
pub(crate) fn drain_answer(outcome: &DrainOutcome) -> Response<Vec<u8>> {
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
        "statelessInFlight": outcome.stateless_in_flight,
        "listenClosed": outcome.listen_closed,
        "tasksOpen": outcome.tasks_open,
        "tasksLeft": outcome.tasks_left,
        "elapsedMs": u64::try_from(outcome.elapsed.as_millis()).unwrap_or(u64::MAX),
    });
    text(status, "application/json", format!("{body}\n"))
}

/// A response of `status` with `body` of `content_type`.
pub(crate) fn text(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Vec<u8>>,
) -> Response<Vec<u8>> {
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
        if req.uri.path() == "/drain" {
            self.metrics.admin_refused(AdminRefusal::DrainNotLocal);
            return text(
                StatusCode::FORBIDDEN,
                "text/plain",
                "a drain starts only from inside the pod: run `tether-sidecar drain` in the sidecar container\n",
            );
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
            "/readyz" if !self.router.membership_known() => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "not ready: no complete list of the endpoint's pods yet\n",
            ),
            "/readyz" if !self.listening().await => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "not ready: the MCP listener does not accept connections yet\n",
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
            "/drained" => self.drained().await,
            "/keys" => self.keys(),
            "/metrics" => text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                self.exposition.encode(),
            ),
            _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
        }
    }
}

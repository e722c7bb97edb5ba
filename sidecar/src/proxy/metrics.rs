//! What the proxy counts (`docs/reference/metrics.md`): the requests it admits, multi
//! round-trip retries, forwards to peers and the connections they went out on, and the
//! connections of the three listeners (open, refused, timed out).

use http::Method;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub(crate) use super::slots::Full;
use crate::cluster::routing::ForwardKind;
use crate::mcp::admission::Era;

/// The `method` label of `tether_requests_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum RequestMethod {
    /// `GET`.
    Get,
    /// `POST`.
    Post,
    /// `DELETE`.
    Delete,
    /// Any other method.
    Other,
}

impl RequestMethod {
    /// The label of `method`.
    fn of(method: &Method) -> Self {
        match *method {
            Method::GET => Self::Get,
            Method::POST => Self::Post,
            Method::DELETE => Self::Delete,
            _ => Self::Other,
        }
    }

    /// The `method` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Post => "POST",
            Self::Delete => "DELETE",
            Self::Other => "OTHER",
        }
    }
}

/// Where a retry of a multi round-trip request (a sealed `requestState`) went
/// (`tether_mrtr_retries_total{outcome}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum MrtrRetry {
    /// Forwarded to the pod that issued its state.
    Forwarded,
    /// Served by the pod that issued its state.
    ServedByIssuer,
    /// Served here: the issuer left the endpoint or refuses connections.
    IssuerGone,
    /// Served here: a body over 64 KiB, beyond what a forward can resend.
    TooLarge,
}

impl MrtrRetry {
    /// The `outcome` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Forwarded => "forwarded",
            Self::ServedByIssuer => "served_by_issuer",
            Self::IssuerGone => "issuer_gone",
            Self::TooLarge => "too_large",
        }
    }
}

/// How a forward to a peer ended (`tether_forwards_total{outcome}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum ForwardOutcome {
    /// The peer answered.
    Ok,
    /// The peer could not be reached: the next candidate was tried.
    ConnectError,
    /// The client left mid-exchange.
    ClientClosed,
    /// The peer broke the exchange off.
    Error,
}

impl ForwardOutcome {
    /// The `outcome` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ConnectError => "connect_error",
            Self::ClientClosed => "client_closed",
            Self::Error => "error",
        }
    }
}

/// Which listener a connection is on (the `listener` label).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum ListenerName {
    /// The MCP port.
    Mcp,
    /// The peer port.
    Peer,
    /// The admin port.
    Admin,
}

impl ListenerName {
    /// The `listener` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Mcp => "mcp",
            Self::Peer => "peer",
            Self::Admin => "admin",
        }
    }
}

label_value!(
    RequestMethod,
    MrtrRetry,
    ForwardOutcome,
    ListenerName,
    Era,
    ForwardKind,
    Full
);

/// Labels of `tether_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// HTTP method.
    method: RequestMethod,
    /// `sessionful` (2025-03-26 … 2025-11-25) or `stateless` (2026-07-28).
    era: Era,
}

/// Labels of `tether_mrtr_retries_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MrtrLabel {
    /// Where the retry went.
    outcome: MrtrRetry,
}

/// Labels of `tether_forwards_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ForwardLabels {
    /// Why the request was forwarded.
    kind: ForwardKind,
    /// How the forward ended.
    outcome: ForwardOutcome,
}

/// Labels of `tether_forward_hops_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HopLabel {
    /// The hop number of the forwarded request (1 or 2).
    hop: u8,
}

/// Labels of `tether_peer_connects_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReusedLabel {
    /// Whether a pooled connection was reused (`true`) or a new one opened (`false`).
    reused: bool,
}

/// Labels of `tether_connections_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    /// The listener.
    listener: ListenerName,
    /// `listener_full` or `source_full`.
    reason: Full,
}

/// The proxy's metrics.
#[derive(Debug, Default)]
pub(crate) struct ProxyMetrics {
    /// Requests admitted to the MCP endpoint, by method and era.
    requests: Family<RequestLabels, Counter>,
    /// Retries of multi round-trip requests, by where they went.
    mrtr_retries: Family<MrtrLabel, Counter>,
    /// Requests forwarded to a peer, by kind and outcome.
    forwards: Family<ForwardLabels, Counter>,
    /// Forwarded requests by the hop number they left with.
    forward_hops: Family<HopLabel, Counter>,
    /// Connections forwarded requests went out on, pooled or new.
    peer_connects: Family<ReusedLabel, Counter>,
    /// Client connections open on the MCP listener.
    client_connections: Gauge,
    /// Connections open on the peer listener.
    peer_connections: Gauge,
    /// Connections open on the admin listener.
    admin_connections: Gauge,
    /// Connections refused a slot, by listener and reason.
    connections_refused: Family<RefusedLabels, Counter>,
    /// Connections closed because a request head was not complete `--header-timeout` after its
    /// first byte.
    header_timeouts: Counter,
    /// Request heads pingora refused before the sidecar saw them (400: malformed, over 256
    /// header fields or 1 MiB; 405: `CONNECT`).
    request_heads_refused: Counter,
    /// Connections closed because a write to the client waited `--client-write-timeout`.
    client_write_timeouts: Counter,
}

impl ProxyMetrics {
    /// The proxy's metrics, registered in `r`.
    pub(crate) fn new(r: &mut Registry) -> Self {
        let m = Self::default();
        r.register("requests", "MCP requests admitted", m.requests.clone());
        r.register(
            "mrtr_retries",
            "Retries of multi round-trip requests: forwarded to the pod that issued their requestState, served by it, or served elsewhere (issuer_gone, too_large)",
            m.mrtr_retries.clone(),
        );
        r.register(
            "forwards",
            "Requests forwarded to a peer sidecar, by kind and outcome",
            m.forwards.clone(),
        );
        r.register(
            "forward_hops",
            "Forwarded requests by hop number",
            m.forward_hops.clone(),
        );
        r.register(
            "peer_connects",
            "Connections forwarded requests went out on, by whether a pooled one was reused",
            m.peer_connects.clone(),
        );
        r.register(
            "client_connections",
            "Client connections open on the MCP listener",
            m.client_connections.clone(),
        );
        r.register(
            "peer_connections",
            "Connections open on the peer listener",
            m.peer_connections.clone(),
        );
        r.register(
            "admin_connections",
            "Connections open on the admin listener",
            m.admin_connections.clone(),
        );
        r.register(
            "connections_refused",
            "Connections refused a slot (over the listener's cap or its per-source cap), by listener and reason",
            m.connections_refused.clone(),
        );
        r.register(
            "header_timeouts",
            "Connections closed for a request head not complete within --header-timeout",
            m.header_timeouts.clone(),
        );
        r.register(
            "request_heads_refused",
            "Request heads pingora refused before the sidecar saw them",
            m.request_heads_refused.clone(),
        );
        r.register(
            "client_write_timeouts",
            "Connections closed for a write waiting --client-write-timeout",
            m.client_write_timeouts.clone(),
        );
        m
    }

    /// Counts an admitted request in `tether_requests_total{method, era}`.
    pub(crate) fn request(&self, method: &Method, era: Era) {
        self.requests
            .get_or_create(&RequestLabels {
                method: RequestMethod::of(method),
                era,
            })
            .inc();
    }

    /// A retry of a multi round-trip request, and where it went (`tether_mrtr_retries_total`).
    pub(crate) fn mrtr_retry(&self, outcome: MrtrRetry) {
        self.mrtr_retries
            .get_or_create(&MrtrLabel { outcome })
            .inc();
    }

    /// Counts a forward of `kind` that ended with `outcome` (`tether_forwards_total`).
    pub(crate) fn forward(&self, kind: ForwardKind, outcome: ForwardOutcome) {
        self.forwards
            .get_or_create(&ForwardLabels { kind, outcome })
            .inc();
    }

    /// A forwarded request by the hop number it left with (`tether_forward_hops_total{hop}`).
    pub(crate) fn forward_hop(&self, hop: u8) {
        self.forward_hops.get_or_create(&HopLabel { hop }).inc();
    }

    /// A forwarded request went out on a pooled connection (`reused`) or a new one
    /// (`tether_peer_connects_total{reused}`).
    pub(crate) fn peer_connect(&self, reused: bool) {
        self.peer_connects
            .get_or_create(&ReusedLabel { reused })
            .inc();
    }

    /// A connection opened (`true`) or closed (`false`) on the `listener` (`tether_client_connections`,
    /// `tether_peer_connections`, `tether_admin_connections`).
    pub(crate) fn connection(&self, listener: ListenerName, opened: bool) {
        let gauge = match listener {
            ListenerName::Mcp => &self.client_connections,
            ListenerName::Peer => &self.peer_connections,
            ListenerName::Admin => &self.admin_connections,
        };
        if opened {
            gauge.inc();
        } else {
            gauge.dec();
        }
    }

    /// A connection the `listener` refused a slot, for `reason`
    /// (`tether_connections_refused_total{listener,reason}`).
    pub(crate) fn connection_refused(&self, listener: ListenerName, reason: Full) {
        self.connections_refused
            .get_or_create(&RefusedLabels { listener, reason })
            .inc();
    }

    /// A connection closed for a request head past `--header-timeout`
    /// (`tether_header_timeouts_total`).
    pub(crate) fn header_timeout(&self) {
        self.header_timeouts.inc();
    }

    /// A request head pingora refused itself (`tether_request_heads_refused_total`).
    pub(crate) fn request_head_refused(&self) {
        self.request_heads_refused.inc();
    }

    /// A connection closed for a write past `--client-write-timeout`
    /// (`tether_client_write_timeouts_total`).
    pub(crate) fn client_write_timeout(&self) {
        self.client_write_timeouts.inc();
    }
}

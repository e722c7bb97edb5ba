//! The catalogue of errors the sidecar answers itself: [`Rejection`].
//!
//! Every error the sidecar produces itself is a [`Rejection`]: one place fixes its HTTP status
//! (per the spec checklist ids noted on each variant), its JSON-RPC error code, its message and
//! the `reason` label used in metrics. Error bodies are JSON-RPC errors without an id
//! (`"id": null`), which the spec allows for transport errors (T-05, O-02), unless the request's
//! body was read: then they carry its id ([`Rejection::body_for`]; 2026-07-28 requires it). No
//! error reply ever carries `Mcp-Session-Id` (`rejection_bodies_are_json_rpc_errors_without_id`).
//!
//! Codes are JSON-RPC's own, MCP's where the rejection means what MCP's code means
//! (`HeaderMismatch` -32020, `UnsupportedProtocolVersionError` -32022), else in the range MCP
//! leaves to implementations (-32000..-32019): a client that speaks both eras reads an MCP code as
//! a server of the 2026-07-28 era, so an endpoint without that version never answers one.

use bytes::Bytes;
use http::StatusCode;
use serde_json::json;
use tether_crds::ProtocolVersion;

use super::jsonrpc::{
    CODE_HEADER_MISMATCH, CODE_INTERNAL, CODE_INVALID_PARAMS, CODE_INVALID_REQUEST,
    CODE_METHOD_NOT_FOUND, CODE_PARSE_ERROR, CODE_SESSION_NOT_FOUND, CODE_TRANSPORT,
    CODE_UNSUPPORTED_PROTOCOL_VERSION, EnvelopeError, RequestKey,
};
use super::tasks::TaskMiss;

/// Which bound of calls in flight a request would pass (`--max-session-calls`,
/// `--max-principal-calls`, `--max-calls`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum CallScope {
    /// The session's.
    Session,
    /// Its principal's (every session bound to the same caller).
    Principal,
    /// The pod's.
    Pod,
}

/// Why a session id is answered 404 (spec S-05); the `reason` label of
/// `tether_not_found_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::VariantArray)]
pub(crate) enum NotFound {
    /// The id fails the MAC: forged, or minted for another endpoint.
    Forged,
    /// A genuine id this pod does not hold (never created here, or lost in a restart).
    Unknown,
    /// The session was ended by `DELETE`.
    Deleted,
    /// The session ended after `session.idleTimeout` without activity.
    Expired,
    /// The upstream no longer knows the session.
    UpstreamGone,
    /// The session's home is gone and no pod of the ranked walk holds it
    /// (`docs/design/routing.md#placement-and-routing`), or the pods that could hold it are
    /// unreachable.
    NoHolder,
    /// The request reached the hop limit (2) before finding the session's holder.
    HopLimit,
    /// The request does not present the principal the session is bound to
    /// (`spec.auth.binding`): answered like an unknown session.
    PrincipalMismatch,
}

impl NotFound {
    /// Metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            NotFound::Forged => "forged",
            NotFound::Unknown => "unknown",
            NotFound::Deleted => "deleted",
            NotFound::Expired => "expired",
            NotFound::UpstreamGone => "upstream_gone",
            NotFound::NoHolder => "no_holder",
            NotFound::HopLimit => "hop_limit",
            NotFound::PrincipalMismatch => "principal_mismatch",
        }
    }
}

/// A protocol version the endpoint does not serve, with the ones it does (spec I-02 error data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct VersionMismatch {
    /// The version asked for or negotiated (at most 64 characters of it).
    pub(crate) requested: String,
    /// `spec.protocolVersions`.
    pub(crate) supported: Vec<ProtocolVersion>,
}

impl VersionMismatch {
    /// A mismatch for `requested` (truncated to 64 characters).
    pub(crate) fn new(requested: &str, supported: &[ProtocolVersion]) -> Self {
        Self {
            requested: requested.chars().take(64).collect(),
            supported: supported.to_vec(),
        }
    }

    /// The versions of the 2026-07-28 era the endpoint admits: those a client uses without a
    /// handshake, which an `UnsupportedProtocolVersionError` lists (a client of both eras reaches
    /// the older ones through `initialize`). Empty for an endpoint of the 2025 era only.
    pub(crate) fn modern(&self) -> Vec<ProtocolVersion> {
        self.supported
            .iter()
            .copied()
            .filter(|v| v.is_stateless())
            .collect()
    }
}

impl From<EnvelopeError> for Rejection {
    fn from(e: EnvelopeError) -> Self {
        match e {
            EnvelopeError::Parse(m) => Rejection::ParseError(m),
            EnvelopeError::Invalid(m) => Rejection::InvalidRequest(m),
        }
    }
}

/// An error answered by the sidecar itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// 404: the session does not exist (S-05); clients re-initialize (S-06).
    SessionNotFound(NotFound),
    /// 404: a path other than `spec.listen.path`.
    PathNotFound,
    /// 404 with JSON-RPC -32601: a method the request's protocol version does not have
    /// (`initialize` in 2026-07-28, spec P-04).
    MethodNotFound(&'static str),
    /// 403: `Origin` not in the allowlist, or missing while `allowMissing` is false (O-01/O-02).
    OriginForbidden,
    /// 400: `MCP-Protocol-Version` unknown or not in `spec.protocolVersions` (P-03); MCP's
    /// `UnsupportedProtocolVersionError` (-32022) when the endpoint admits 2026-07-28 (P-04).
    UnsupportedVersion(VersionMismatch),
    /// 400: the negotiated version is not in `spec.protocolVersions` (I-02).
    UnsupportedNegotiatedVersion(VersionMismatch),
    /// 406: `Accept` lacks what the method needs (T-03 POST, T-04 GET).
    NotAcceptable(&'static str),
    /// 415: a POST body that is not `application/json`.
    UnsupportedMediaType,
    /// 405: a method other than GET, POST, DELETE, OPTIONS.
    MethodNotAllowed,
    /// 400: `Mcp-Session-Id` with characters outside 0x21–0x7E (S-02).
    MalformedSessionId,
    /// 400: a request other than `initialize` without `Mcp-Session-Id` (S-04).
    SessionRequired,
    /// 400 with MCP's `HeaderMismatch` (-32020): a 2026-07-28 request whose standard headers
    /// (`Mcp-Method`, `Mcp-Name`, `MCP-Protocol-Version`) are missing, malformed or disagree with
    /// its body (P-04, P-05, SEP-2243); the detail says which.
    HeaderMismatch(String),
    /// 400: a header value that is not visible ASCII / UTF-8.
    MalformedHeader(&'static str),
    /// 413: body larger than the limit.
    PayloadTooLarge(usize),
    /// 413: `initialize` params larger than `--max-initialize-bytes` (the journal keeps them for
    /// the session's life).
    InitializeTooLarge(usize),
    /// 413: a request the session's journal would keep (`resources/subscribe`,
    /// `logging/setLevel`) past `--max-journal-bytes` or its most subscriptions; the detail says
    /// which.
    JournalFull(String),
    /// 429: what the pod cannot free now — journals, tombstones, events no client was sent
    /// yet (their upstream responses wait for readers) — takes its whole
    /// `--pod-retained-bytes`; retry after `Retry-After` (or on another pod).
    PodFull,
    /// 429: an `initialize` of a principal (`spec.auth.binding`) that holds
    /// `--max-principal-sessions` sessions on this pod already.
    PrincipalSessions,
    /// 429: a request of a principal whose sessions pin `--max-principal-retained-bytes`
    /// (journals, tombstones, events no client was sent), or hold their fair share of a full
    /// pod.
    PrincipalRetained,
    /// 429: the request would pass a bound of calls in flight (of its session, its principal
    /// or the pod); it is not sent.
    TooManyCalls(CallScope),
    /// 413: a new request of a session whose retry records and stored replies of requests in
    /// flight or unread already take `--max-session-retry-bytes`.
    RetryStateFull(u64),
    /// 408: the body did not arrive in time (slow client).
    RequestTimeout,
    /// 400: body is not JSON (-32700).
    ParseError(String),
    /// 400: body is not a JSON-RPC 2.0 message (-32600).
    InvalidRequest(String),
    /// 400: a batch where the version forbids it (B-02).
    BatchNotAllowed,
    /// 400: `initialize` inside a batch (B-01).
    InitializeInBatch,
    /// 400: a request id reused in the session with a different body (S-09).
    RequestIdReused,
    /// 400: `Last-Event-ID` is not an id this endpoint issues.
    MalformedCursor,
    /// 400: `Last-Event-ID` names a stream of another session, or one never issued.
    UnknownCursor,
    /// 400: events after `Last-Event-ID` were evicted (documented `cursor_evicted` policy).
    CursorEvicted,
    /// 503: the pod holds `--max-sessions` sessions.
    TooManySessions,
    /// 503: the MCP server cannot be reached (it refuses connections): the request provably
    /// never reached it (`data.notProcessed: true`), so sending it again is safe.
    UpstreamUnavailable,
    /// 502: the exchange with the MCP server broke after the request was sent, or its answer
    /// could not be read: the request may have run (`data.notProcessed: false`).
    UpstreamLost,
    /// 503: the session's upstream session is being rebuilt and the MCP server is not ready
    /// (`--rebuild-retry-for`); retry after `Retry-After`.
    UpstreamNotReady,
    /// 504: the upstream did not answer in time.
    UpstreamTimeout,
    /// 503: an answer from memory (a resume, a standalone GET, a retry) or a DELETE with a
    /// credential the MCP server has not accepted for the session lately, while the server
    /// cannot say whether it does (unreachable, not ready, failing): nothing is served or
    /// ended until it can; retry after `Retry-After`.
    CredentialUnconfirmed,
    /// 403: `Tether-Hop` headers whose peer MAC does not verify (not sent by a sidecar of this
    /// endpoint).
    ForgedHop,
    /// 503: the pod holding the session is alive in membership but does not answer (its health
    /// probes fail), or a request without a session found no pod to take it.
    PeerUnavailable,
    /// 429: more resumes than `--resume-budget` per second arrived at this pod (a reconnect
    /// storm); the client retries after `Retry-After`.
    ResumeBudget,
    /// 503: the MCP listener holds `--max-connections` client connections; this one is answered
    /// and closed.
    TooManyConnections,
    /// 429: the client's source address holds `--max-connections-per-source` connections; this
    /// one is answered and closed.
    SourceConnections,
    /// 429: more than `--max-takeovers` GETs in a second took over a stream of this session from
    /// another connection (T-09).
    TakeoverBudget,
    /// 200 with JSON-RPC -32602: a request naming a task whose id this endpoint did not issue
    /// (forged, altered, sealed with a retired key), or whose pod is gone (tasks extension,
    /// "Error Handling"; `mcp/tasks.rs`).
    TaskNotFound(TaskMiss),
    /// 502: the MCP server named a task with an id longer than tether seals
    /// ([`crate::mcp::sealed::MAX_UPSTREAM_TASK_ID`] bytes).
    TaskIdTooLong,
    /// 200 with JSON-RPC -32602: a retry of a multi round-trip request whose `requestState`
    /// this endpoint did not seal for its principal (forged, altered, another principal's,
    /// sealed with a retired key; `mcp/mrtr.rs`).
    RequestStateInvalid,
    /// 401: a GET stream (standalone, or a resume) asked for with a JWT past its `exp`: the
    /// client refreshes its token (RFC 6750 `invalid_token`) instead of reading a stream on an
    /// expired credential.
    CredentialExpired,
    /// 502: the MCP server answered with a `requestState` longer than tether seals
    /// ([`crate::mcp::sealed::MAX_UPSTREAM_REQUEST_STATE`] bytes).
    RequestStateTooLong,
}

impl Rejection {
    /// HTTP status.
    pub(crate) fn status(&self) -> StatusCode {
        use Rejection::*;
        match self {
            SessionNotFound(_) | PathNotFound | MethodNotFound(_) => StatusCode::NOT_FOUND,
            // The MCP server's own answer for an unknown task: a JSON-RPC error, not a transport
            // one.
            TaskNotFound(_) | RequestStateInvalid => StatusCode::OK,
            CredentialExpired => StatusCode::UNAUTHORIZED,
            OriginForbidden | ForgedHop => StatusCode::FORBIDDEN,
            NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            PayloadTooLarge(_) | InitializeTooLarge(_) | JournalFull(_) | RetryStateFull(_) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            TooManySessions | TooManyConnections | PeerUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ResumeBudget | PodFull | TakeoverBudget | SourceConnections | TooManyCalls(_)
            | PrincipalSessions | PrincipalRetained => StatusCode::TOO_MANY_REQUESTS,
            UpstreamLost | TaskIdTooLong | RequestStateTooLong => StatusCode::BAD_GATEWAY,
            UpstreamUnavailable | UpstreamNotReady | CredentialUnconfirmed => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            UnsupportedVersion(_)
            | UnsupportedNegotiatedVersion(_)
            | MalformedSessionId
            | SessionRequired
            | HeaderMismatch(_)
            | MalformedHeader(_)
            | ParseError(_)
            | InvalidRequest(_)
            | BatchNotAllowed
            | InitializeInBatch
            | RequestIdReused
            | MalformedCursor
            | UnknownCursor
            | CursorEvicted => StatusCode::BAD_REQUEST,
        }
    }

    /// Stable label for metrics and the `data.reason` field of the error body.
    pub(crate) fn reason(&self) -> &'static str {
        use Rejection::*;
        match self {
            SessionNotFound(_) => "session_not_found",
            PathNotFound => "path_not_found",
            MethodNotFound(_) => "method_not_found",
            OriginForbidden => "origin_forbidden",
            UnsupportedVersion(_) => "unsupported_protocol_version",
            UnsupportedNegotiatedVersion(_) => "unsupported_negotiated_version",
            NotAcceptable(_) => "not_acceptable",
            UnsupportedMediaType => "unsupported_media_type",
            MethodNotAllowed => "method_not_allowed",
            MalformedSessionId => "malformed_session_id",
            SessionRequired => "session_required",
            HeaderMismatch(_) => "header_mismatch",
            MalformedHeader(_) => "malformed_header",
            PayloadTooLarge(_) => "payload_too_large",
            InitializeTooLarge(_) => "initialize_too_large",
            JournalFull(_) => "journal_full",
            PodFull => "pod_full",
            PrincipalSessions => "principal_sessions",
            PrincipalRetained => "principal_retained",
            TooManyCalls(CallScope::Session) => "session_calls",
            TooManyCalls(CallScope::Principal) => "principal_calls",
            TooManyCalls(CallScope::Pod) => "pod_calls",
            RetryStateFull(_) => "retry_state_full",
            RequestTimeout => "request_timeout",
            ParseError(_) => "parse_error",
            InvalidRequest(_) => "invalid_request",
            BatchNotAllowed => "batch_not_allowed",
            InitializeInBatch => "initialize_in_batch",
            RequestIdReused => "request_id_reused",
            MalformedCursor => "malformed_cursor",
            UnknownCursor => "unknown_cursor",
            CursorEvicted => "cursor_evicted",
            TooManySessions => "too_many_sessions",
            UpstreamUnavailable => "upstream_unavailable",
            CredentialUnconfirmed => "credential_unconfirmed",
            UpstreamLost => "upstream_answer_lost",
            UpstreamNotReady => "upstream_not_ready",
            UpstreamTimeout => "upstream_timeout",
            ForgedHop => "forged_hop",
            PeerUnavailable => "peer_unavailable",
            ResumeBudget => "resume_budget",
            TooManyConnections => "too_many_connections",
            SourceConnections => "source_connections",
            TakeoverBudget => "takeover_budget",
            TaskNotFound(TaskMiss::Unknown) => "task_not_found",
            TaskNotFound(TaskMiss::Gone) => "task_gone",
            TaskIdTooLong => "task_id_oversized",
            RequestStateInvalid => "request_state_invalid",
            CredentialExpired => "credential_expired",
            RequestStateTooLong => "request_state_oversized",
        }
    }

    fn code(&self) -> i64 {
        use Rejection::*;
        match self {
            SessionNotFound(_) => CODE_SESSION_NOT_FOUND,
            MethodNotFound(_) => CODE_METHOD_NOT_FOUND,
            ParseError(_) => CODE_PARSE_ERROR,
            InvalidRequest(_) | BatchNotAllowed | InitializeInBatch | RequestIdReused => {
                CODE_INVALID_REQUEST
            }
            UnsupportedNegotiatedVersion(_) | TaskNotFound(_) | RequestStateInvalid => {
                CODE_INVALID_PARAMS
            }
            HeaderMismatch(_) => CODE_HEADER_MISMATCH,
            UnsupportedVersion(v) if !v.modern().is_empty() => CODE_UNSUPPORTED_PROTOCOL_VERSION,
            UpstreamUnavailable | UpstreamLost | UpstreamNotReady | UpstreamTimeout
            | PeerUnavailable | TaskIdTooLong | RequestStateTooLong => CODE_INTERNAL,
            _ => CODE_TRANSPORT,
        }
    }

    fn message(&self) -> String {
        use Rejection::*;
        match self {
            SessionNotFound(_) => "Session not found: start a new session with initialize".into(),
            PathNotFound => {
                "Not found: this endpoint serves MCP on its configured path only".into()
            }
            MethodNotFound(m) => format!(
                "Method not found: {m} is not part of protocol version 2026-07-28 (stateless)"
            ),
            OriginForbidden => "Forbidden: Origin not allowed".into(),
            UnsupportedVersion(v) => {
                format!("Unsupported MCP-Protocol-Version: {}", v.requested)
            }
            UnsupportedNegotiatedVersion(v) => format!(
                "Unsupported protocol version negotiated by the server: {}",
                v.requested
            ),
            NotAcceptable(what) => format!("Not Acceptable: {what}"),
            UnsupportedMediaType => {
                "Unsupported Media Type: Content-Type must be application/json".into()
            }
            MethodNotAllowed => "Method Not Allowed: use GET, POST or DELETE".into(),
            MalformedSessionId => {
                "Bad Request: Mcp-Session-Id must be visible ASCII (0x21-0x7E)".into()
            }
            SessionRequired => "Bad Request: Mcp-Session-Id header is required".into(),
            HeaderMismatch(detail) => format!("Bad Request: header mismatch: {detail}"),
            MalformedHeader(name) => format!("Bad Request: malformed {name} header"),
            PayloadTooLarge(limit) => format!("Payload Too Large: body exceeds {limit} bytes"),
            InitializeTooLarge(limit) => format!(
                "Payload Too Large: initialize params exceed {limit} bytes (--max-initialize-bytes)"
            ),
            JournalFull(detail) => {
                format!("Payload Too Large: the session keeps too much to rebuild it: {detail}")
            }
            PodFull => {
                "Too Many Requests: this pod's sessions keep --pod-retained-bytes it cannot free \
                 now (journals, tombstones, events no client has read yet); retry after \
                 Retry-After"
                    .into()
            }
            PrincipalSessions => {
                "Too Many Requests: this caller holds --max-principal-sessions sessions on this \
                 pod; end one, or retry after Retry-After"
                    .into()
            }
            PrincipalRetained => {
                "Too Many Requests: this caller's sessions keep --max-principal-retained-bytes \
                 of answers nobody read yet (with their journals); read or end them, or retry \
                 after Retry-After"
                    .into()
            }
            TooManyCalls(scope) => {
                let whose = match scope {
                    CallScope::Session => "this session has --max-session-calls",
                    CallScope::Principal => "this caller's sessions have --max-principal-calls",
                    CallScope::Pod => "this pod has --max-calls",
                };
                format!(
                    "Too Many Requests: {whose} calls in flight; the request was not sent, retry \
                     after Retry-After"
                )
            }
            RetryStateFull(limit) => format!(
                "Payload Too Large: the session's requests in flight keep {limit} bytes of retry \
                 state (--max-session-retry-bytes); send more once they are answered"
            ),
            RequestTimeout => "Request Timeout: the body did not arrive in time".into(),
            ParseError(e) => format!("Parse error: {e}"),
            InvalidRequest(e) => format!("Invalid Request: {e}"),
            BatchNotAllowed => {
                "Invalid Request: JSON-RPC batches are allowed only in protocol version 2025-03-26"
                    .into()
            }
            InitializeInBatch => "Invalid Request: initialize must not be part of a batch".into(),
            RequestIdReused => {
                "Invalid Request: request id already used in this session with another body".into()
            }
            MalformedCursor => {
                "Bad Request: Last-Event-ID is not an event id issued by this endpoint".into()
            }
            UnknownCursor => {
                "Bad Request: Last-Event-ID does not name a stream of this session".into()
            }
            CursorEvicted => {
                "Bad Request: cursor_evicted: events after Last-Event-ID are no longer buffered"
                    .into()
            }
            TooManySessions => "Service Unavailable: too many sessions on this pod".into(),
            UpstreamUnavailable => {
                "Service Unavailable: the MCP server cannot be reached; the request did not reach \
                 it"
                .into()
            }
            UpstreamLost => {
                "Bad Gateway: the exchange with the MCP server broke after the request was sent; \
                 it may have run"
                    .into()
            }
            UpstreamNotReady => {
                "Service Unavailable: the MCP server is not ready yet; retry after Retry-After"
                    .into()
            }
            UpstreamTimeout => "Gateway Timeout: the MCP server did not answer in time".into(),
            CredentialUnconfirmed => {
                "Service Unavailable: the MCP server cannot confirm this request's credentials \
                 now, and nothing is served from memory or ended without it; retry after \
                 Retry-After"
                    .into()
            }
            ForgedHop => "Forbidden: Tether-Hop headers not signed by a peer sidecar".into(),
            PeerUnavailable => {
                "Service Unavailable: no routable pod could take this request; retry".into()
            }
            ResumeBudget => {
                "Too Many Requests: this pod's resume budget is spent; retry after Retry-After"
                    .into()
            }
            TooManyConnections => {
                "Service Unavailable: too many client connections on this pod; retry after \
                 Retry-After"
                    .into()
            }
            SourceConnections => {
                "Too Many Requests: too many connections from this address on this pod; retry \
                 after Retry-After"
                    .into()
            }
            TakeoverBudget => {
                "Too Many Requests: this session's streams were taken over too often; retry \
                 after Retry-After"
                    .into()
            }
            TaskNotFound(miss) => format!("Invalid params: task not found: {miss}"),
            TaskIdTooLong => format!(
                "Bad Gateway: the MCP server named a task with an id longer than {} bytes",
                crate::mcp::sealed::MAX_UPSTREAM_TASK_ID
            ),
            CredentialExpired => {
                "Unauthorized: the access token expired; send the request again with a fresh one"
                    .into()
            }
            RequestStateInvalid => "Invalid params: requestState is not one this endpoint \
                 issued to this principal: send the original request again"
                .into(),
            RequestStateTooLong => format!(
                "Bad Gateway: the MCP server answered with a requestState longer than {} bytes",
                crate::mcp::sealed::MAX_UPSTREAM_REQUEST_STATE
            ),
        }
    }

    /// For a failure to get the MCP server's answer: whether the request provably never reached
    /// it (`true`: sending it again is safe) or may have run (`false`); `None` for the rest.
    fn not_processed(&self) -> Option<bool> {
        match self {
            Rejection::UpstreamUnavailable | Rejection::UpstreamNotReady => Some(true),
            Rejection::UpstreamLost | Rejection::UpstreamTimeout => Some(false),
            _ => None,
        }
    }

    /// The JSON-RPC error body answering request `id` (`null` when unknown): `data.reason` is
    /// [`Rejection::reason`], and version errors add `data.requested` and `data.supported`
    /// (spec I-02; for MCP's `UnsupportedProtocolVersionError` the versions of
    /// [`VersionMismatch::modern`]).
    pub(crate) fn body_for(&self, id: Option<&RequestKey>) -> Bytes {
        let mut data = json!({"reason": self.reason()});
        if let Some(not_processed) = self.not_processed() {
            data["notProcessed"] = json!(not_processed);
        }
        if let Rejection::UnsupportedVersion(v) | Rejection::UnsupportedNegotiatedVersion(v) = self
        {
            let listed = match self.code() {
                CODE_UNSUPPORTED_PROTOCOL_VERSION => v.modern(),
                _ => v.supported.clone(),
            };
            data["requested"] = json!(v.requested);
            data["supported"] = json!(listed.iter().map(|s| s.as_str()).collect::<Vec<_>>());
        }
        let id: serde_json::Value = id
            .and_then(|k| serde_json::from_str(k.as_json()).ok())
            .unwrap_or_default();
        let body = json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": self.code(), "message": self.message(), "data": data}
        });
        Bytes::from(body.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of each rejection; the match makes the compiler flag a variant missing here.
    fn every_rejection() -> Vec<Rejection> {
        use Rejection::*;
        let v = || VersionMismatch::new("x", &[ProtocolVersion::V2025_06_18]);
        let all = vec![
            SessionNotFound(NotFound::Unknown),
            PathNotFound,
            MethodNotFound("initialize"),
            OriginForbidden,
            UnsupportedVersion(v()),
            UnsupportedNegotiatedVersion(v()),
            NotAcceptable("x"),
            UnsupportedMediaType,
            MethodNotAllowed,
            MalformedSessionId,
            SessionRequired,
            HeaderMismatch("x".into()),
            MalformedHeader("x"),
            PayloadTooLarge(1),
            InitializeTooLarge(1),
            JournalFull("x".into()),
            PodFull,
            PrincipalSessions,
            PrincipalRetained,
            TooManyCalls(CallScope::Session),
            TooManyCalls(CallScope::Principal),
            TooManyCalls(CallScope::Pod),
            RetryStateFull(1),
            RequestTimeout,
            ParseError("x".into()),
            InvalidRequest("x".into()),
            BatchNotAllowed,
            InitializeInBatch,
            RequestIdReused,
            MalformedCursor,
            UnknownCursor,
            CursorEvicted,
            TooManySessions,
            UpstreamUnavailable,
            CredentialUnconfirmed,
            UpstreamLost,
            UpstreamNotReady,
            UpstreamTimeout,
            ForgedHop,
            PeerUnavailable,
            ResumeBudget,
            TooManyConnections,
            SourceConnections,
            TakeoverBudget,
            TaskNotFound(TaskMiss::Unknown),
            TaskNotFound(TaskMiss::Gone),
            TaskIdTooLong,
            RequestStateInvalid,
            RequestStateTooLong,
            CredentialExpired,
        ];
        for r in &all {
            match r {
                SessionNotFound(_)
                | PathNotFound
                | MethodNotFound(_)
                | OriginForbidden
                | UnsupportedVersion(_)
                | UnsupportedNegotiatedVersion(_)
                | NotAcceptable(_)
                | UnsupportedMediaType
                | MethodNotAllowed
                | MalformedSessionId
                | HeaderMismatch(_)
                | SessionRequired
                | MalformedHeader(_)
                | PayloadTooLarge(_)
                | InitializeTooLarge(_)
                | JournalFull(_)
                | PodFull
                | PrincipalSessions
                | PrincipalRetained
                | TooManyCalls(_)
                | RetryStateFull(_)
                | RequestTimeout
                | ParseError(_)
                | InvalidRequest(_)
                | BatchNotAllowed
                | InitializeInBatch
                | RequestIdReused
                | MalformedCursor
                | UnknownCursor
                | CursorEvicted
                | TooManySessions
                | UpstreamUnavailable
                | UpstreamLost
                | UpstreamNotReady
                | UpstreamTimeout
                | CredentialUnconfirmed
                | ForgedHop
                | PeerUnavailable
                | ResumeBudget
                | TooManyConnections
                | SourceConnections
                | TakeoverBudget
                | TaskNotFound(_)
                | TaskIdTooLong
                | RequestStateInvalid
                | RequestStateTooLong
                | CredentialExpired => {}
            }
        }
        all
    }

    /// When each rejection happens, with its spec checklist id: the last column of the status
    /// code reference.
    fn when(r: &Rejection) -> &'static str {
        use Rejection::*;
        match r {
            SessionRequired => "a request other than `initialize` without `Mcp-Session-Id` (S-04)",
            MalformedSessionId => "`Mcp-Session-Id` outside visible ASCII 0x21–0x7E (S-02)",
            UnsupportedVersion(_) => {
                "`MCP-Protocol-Version` unknown or not in `protocolVersions` (P-03), unless it is \
                 the session's own negotiated version (a reload that removes a version leaves its \
                 sessions working); `data.supported` lists them. An endpoint that admits \
                 2026-07-28 answers MCP's `UnsupportedProtocolVersionError` (-32022, P-04) with \
                 the request's id and lists its 2026-07-28-era versions; one that does not \
                 answers -32000, which dual-era clients read as a server to `initialize`"
            }
            UnsupportedNegotiatedVersion(_) => {
                "the MCP server negotiated a version not in `protocolVersions` (I-02)"
            }
            HeaderMismatch(_) => {
                "a 2026-07-28 request without `Mcp-Method` (P-05), or whose `Mcp-Method`, \
                 `Mcp-Name` or `MCP-Protocol-Version` disagrees with its body (P-04, SEP-2243; \
                 -32020 `HeaderMismatch`, with the request's id)"
            }
            MalformedHeader(_) => "a header value that is not text, or repeated",
            ParseError(_) => "body is not JSON (-32700)",
            InvalidRequest(_) => "body is not JSON-RPC 2.0 (-32600)",
            BatchNotAllowed => "a batch in a session that did not negotiate 2025-03-26 (B-02)",
            InitializeInBatch => "`initialize` inside a batch (B-01)",
            RequestIdReused => {
                "a request id sent again with another body while the session's request of that \
                 id still runs (S-09); once it was answered, another body is a new request \
                 (see below)"
            }
            MalformedCursor => "`Last-Event-ID` is not an id this endpoint issues",
            UnknownCursor => {
                "`Last-Event-ID` names a stream of another session, or one never issued (R-03)"
            }
            CursorEvicted => "events after `Last-Event-ID` were evicted from the buffer",
            ForgedHop => {
                "`Tether-Hop` headers without a valid peer MAC (only sidecars of the endpoint may \
                 send them)"
            }
            OriginForbidden => {
                "`Origin` not allowed, or missing while `allowMissing` is false (O-01, O-02)"
            }
            SessionNotFound(_) => {
                "unknown, forged, deleted, expired or upstream-lost session, or no pod holds it \
                 (home gone, hop limit reached) (S-05); re-initialize (S-06)"
            }
            PathNotFound => "a path other than `listen.path`",
            TaskNotFound(TaskMiss::Unknown) => {
                "`tasks/get`, `tasks/update`, `tasks/cancel` (or 2025-11-25 `tasks/result`) naming \
                 a task id this endpoint did not issue: forged, altered, or sealed with a retired \
                 key (-32602, the tasks extension's not-found error)"
            }
            TaskNotFound(TaskMiss::Gone) => {
                "`tasks/update`, `tasks/cancel` or `tasks/result` naming a task whose pod left \
                 the endpoint (-32602); a `tasks/get` of it is answered with the task in its \
                 terminal status `failed` instead (its error inlined, `data.reason` \
                 `task_gone`), so that polling ends"
            }
            TaskIdTooLong => "the MCP server named a task with an id longer than 256 bytes",
            CredentialExpired => {
                "a GET (the standalone stream, or a resume with `Last-Event-ID`) whose bearer JWT \
                 is past its `exp`, with `WWW-Authenticate: Bearer error=\"invalid_token\"`, \
                 without asking the MCP server (which may accept a token some seconds past its \
                 `exp`): the client refreshes its token; what the stream holds stays buffered \
                 for a resume with the fresh one"
            }
            RequestStateInvalid => {
                "a `tools/call`, `prompts/get` or `resources/read` retry (2026-07-28 multi \
                 round-trip request) whose `requestState` this endpoint did not seal for the \
                 request's principal: forged, altered, another principal's, or sealed with a \
                 retired key (-32602; the client starts the request over)"
            }
            RequestStateTooLong => {
                "the MCP server answered an `InputRequiredResult` with a `requestState` longer \
                 than 64 KiB"
            }
            MethodNotFound(_) => {
                "`Mcp-Method: initialize` with `MCP-Protocol-Version: 2026-07-28` (-32601, P-04; \
                 the version has no handshake)"
            }
            MethodNotAllowed => "a method other than GET, POST, DELETE, OPTIONS (with `Allow`)",
            NotAcceptable(_) => {
                "POST `Accept` lacks `application/json` or `text/event-stream` (T-03); GET \
                 `Accept` lacks `text/event-stream`, `text/*` or `*/*` (T-04)"
            }
            RequestTimeout => "the body did not arrive within `--request-timeout`",
            PayloadTooLarge(_) => "body larger than `--max-request-bytes`",
            InitializeTooLarge(_) => {
                "`initialize` params larger than `--max-initialize-bytes` (the session keeps them \
                 to rebuild its upstream session)"
            }
            JournalFull(_) => {
                "a `resources/subscribe` or `logging/setLevel` that would grow the session's \
                 journal past `--max-journal-bytes` or 1,024 subscriptions; the session goes on"
            }
            PodFull => {
                "what the pod cannot free now — journals, tombstones, events no client has read \
                 yet — takes its whole `--pod-retained-bytes`, after the events clients were \
                 sent and the answers of spent requests were given up (with `Retry-After: 1`)"
            }
            PrincipalRetained => {
                "a request or `initialize` of a caller (`spec.auth.binding`) whose sessions pin \
                 `--max-principal-retained-bytes` — journals, tombstones, events no client was \
                 sent — or, on a full pod, more than its fair share of `--pod-retained-bytes` \
                 (the budget divided among the callers pinning bytes; with `Retry-After: 1`)"
            }
            PrincipalSessions => {
                "an `initialize` of a caller (`spec.auth.binding`) whose sessions on the pod \
                 number `--max-principal-sessions` already (with `Retry-After: 1`)"
            }
            TooManyCalls(CallScope::Session) => {
                "a request of a session with `--max-session-calls` calls in flight (running at the \
                 MCP server, read or not); the request is not sent (with `Retry-After: 1`)"
            }
            TooManyCalls(CallScope::Principal) => {
                "a request of a caller whose sessions (`spec.auth.binding`) have \
                 `--max-principal-calls` calls in flight; not sent (with `Retry-After: 1`)"
            }
            TooManyCalls(CallScope::Pod) => {
                "a request on a pod with `--max-calls` calls in flight; not sent (with \
                 `Retry-After: 1`)"
            }
            RetryStateFull(_) => {
                "a new request of a session whose retry records and stored replies still take \
                 `--max-session-retry-bytes` after its oldest answered requests were forgotten \
                 (what is left belongs to requests in flight or unread)"
            }
            UnsupportedMediaType => "POST `Content-Type` is not `application/json`",
            ResumeBudget => {
                "more resumes (`GET` + `Last-Event-ID`) reached this pod in a second than \
                 `--resume-budget` allows (a reconnect storm); retry after `Retry-After`"
            }
            CredentialUnconfirmed => {
                "a resume, standalone GET, retry answered from memory or DELETE whose credential \
                 the MCP server has not accepted for the session within `spec.auth.revalidate`, \
                 while the server cannot judge it (unreachable, not ready, failing): nothing is \
                 served or ended on an unconfirmed credential (with `Retry-After: 1`)"
            }
            UpstreamUnavailable => {
                "the MCP server cannot be reached — it refuses connections — so the request \
                 provably never reached it: `data.notProcessed` is `true` and sending it again is \
                 safe (with `Retry-After: 1`)"
            }
            UpstreamLost => {
                "the exchange with the MCP server broke after the request was sent, or its answer \
                 could not be read: the request may have run (`data.notProcessed`: `false`); no \
                 `Retry-After`, as a retry could run it twice"
            }
            UpstreamNotReady => {
                "the session's upstream session must be rebuilt (the MCP server restarted, or the \
                 session was handed over) and the MCP server is not ready yet — it refuses \
                 connections or answers 502/503/504 — for at most `--rebuild-retry-for` (with \
                 `Retry-After: 1`)"
            }
            PeerUnavailable => {
                "the pod holding the session accepts connections but does not answer (frozen, \
                 overloaded), or a request without a session found no pod to take it (with \
                 `Retry-After: 1`)"
            }
            TooManySessions => "the pod holds `--max-sessions` sessions (with `Retry-After: 1`)",
            TooManyConnections => {
                "the first request of a connection beyond `--max-connections` open ones (with \
                 `Retry-After: 1`; the connection is closed)"
            }
            SourceConnections => {
                "the first request of a connection from a source address that holds \
                 `--max-connections-per-source` open ones (with `Retry-After: 1`; the connection \
                 is closed)"
            }
            TakeoverBudget => {
                "a GET that would take a stream of its session over from another connection (T-09) \
                 beyond `--max-takeovers` per second (with `Retry-After: 1`)"
            }
            UpstreamTimeout => {
                "the MCP server did not answer within `--upstream-timeout`: the request may have \
                 run (`data.notProcessed`: `false`; with `Retry-After: 1`)"
            }
        }
    }

    /// `docs/reference/status-codes.md`: every rejection by status, with its reason and when it
    /// happens, and what the sidecar passes through.
    fn status_codes_reference() -> String {
        let mut rows: Vec<(u16, String)> = every_rejection()
            .iter()
            .map(|r| {
                let row = format!(
                    "| {} | `{}` | {} |",
                    r.status().as_u16(),
                    r.reason(),
                    when(r)
                );
                (r.status().as_u16(), row)
            })
            .collect();
        rows.sort_by_key(|(status, _)| *status);
        let table: Vec<String> = rows.into_iter().map(|(_, row)| row).collect();
        format!(
            "# Status codes\n\n\
             <!-- Generated from the sidecar's rejection catalogue (sidecar/src/mcp/rejection.rs); \
             do not edit. Regenerate with: make references -->\n\n\
             Errors the sidecar produces itself are JSON-RPC error bodies without an id\n\
             (`{{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{{\"code\":…,\"message\":…,\
             \"data\":{{\"reason\":…}}}}}}`), carry the CORS headers and never carry \
             `Mcp-Session-Id`. `data.reason` is also the `reason` label of \
             `tether_rejections_total` ([metrics.md](metrics.md)); the spec ids (S-04, R-03…) are \
             listed in [spec-checklist.md](spec-checklist.md).\n\n\
             | status | reason | when (spec id) |\n|---|---|---|\n{}\n\n\
             Answered before the sidecar sees a request: pingora's own 400 (no JSON body, no CORS \
             headers) for a request head it cannot parse, with more than 256 header fields or over \
             1 MiB (1,048,575 bytes) of head, and its 405 for `CONNECT`; a head still arriving \
             `--header-timeout` after its first byte (the first head of a connection: after it was \
             accepted) closes the connection without an answer, and \
             so does a write to a client that waits `--client-write-timeout` (its stream stays \
             buffered for a resume).\n\n\
             Errors on a stream: a request whose answer cannot come ends with a JSON-RPC error \
             for its id on its stream (code -32603), `data.reason` one of `event_too_large` (the \
             MCP server sent an SSE event over `--max-event-bytes`; the event is never buffered), \
             `upstream_stream_lost`, `session_ended`, `handoff_interrupted` (the pod a session \
             was handed off from stopped while the request ran there), `holder_lost` (the pod \
             holding the session was lost without warning while the request ran there; its \
             replica took the session over, docs/design/replication.md), `drain_deadline`.\n\n\
             Everything else is the MCP server's own answer, passed through unchanged: 200 with \
             JSON or SSE, 202 (empty) for notifications (T-05), the server's 405 for a GET when it \
             offers no standalone stream (T-09), DELETE's 2xx. CORS preflights (`OPTIONS`) are \
             answered 204 from the allowlist.\n\n\
             Choices the spec leaves open:\n\n\
             - an unknown or evicted `Last-Event-ID` is 400, never an empty 200 and never another \
             stream's events;\n\
             - a GET with `Accept: */*` or `text/*` is served like `text/event-stream`;\n\
             - a plain GET (no `Last-Event-ID`) of the standalone stream starts after the last \
             event written to any connection; a client that wants everything resumes with its \
             last event id;\n\
             - a retried POST replays its stream from the start (or returns the stored JSON \
             answer);\n\
             - a repeated request id is a retry when its body is the same as its request's: it \
             joins the request while it runs, and gets its answer again while the session keeps \
             it (`--retry-window`), `result_expired` after. With another body it is a new request \
             once the first was answered (clients that send `id: 1` every time), and 400 \
             `request_id_reused` while the first still runs; in a session that has sent another \
             body under an answered id, a forgotten id is a new request too \
             ([buffering.md](../design/buffering.md#retries));\n\
             - priming events (id + empty data) only for sessions that negotiated 2025-11-25 or \
             later (R-05), and only where they cannot make a resuming client skip anything: at \
             the start of a stream (`<key>-0`) or at its end (a fresh number); a resume with \
             events to catch up on gets them at once instead;\n\
             - a request without `MCP-Protocol-Version` counts as its session's negotiated \
             version, and as 2025-03-26 outside a session (P-02).\n",
            table.join("\n")
        )
    }

    #[test]
    fn the_status_codes_reference_documents_every_rejection() {
        let reference = status_codes_reference();
        for r in every_rejection() {
            let row = format!("| {} | `{}` |", r.status().as_u16(), r.reason());
            assert!(
                reference.contains(&row),
                "the reference lacks the row {row}"
            );
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let path = "docs/reference/status-codes.md";
        if let Err(e) = tether_crds::reference::check_generated(&root, path, &reference) {
            panic!("{e}");
        }
    }

    /// MCP allocates -32020..-32099 for its own codes (2026-07-28, "Error codes"): a rejection
    /// uses one only for what it means there, every other code is JSON-RPC's or in -32000..-32019.
    #[test]
    fn every_code_is_json_rpc_s_implementation_defined_or_mcp_s_own_meaning() {
        for r in every_rejection() {
            let code = r.code();
            let mcp_meaning = match &r {
                Rejection::HeaderMismatch(_) => code == CODE_HEADER_MISMATCH,
                Rejection::UnsupportedVersion(v) if !v.modern().is_empty() => {
                    code == CODE_UNSUPPORTED_PROTOCOL_VERSION
                }
                _ => false,
            };
            let allowed = (-32019..=-32000).contains(&code)
                || (-32700..=-32600).contains(&code)
                || mcp_meaning;
            assert!(allowed, "{r:?} answers {code}");
        }
    }

    /// A dual-era client falls back to `initialize` on a 400 whose body is no MCP code (SEP-2575,
    /// "Backwards compatibility"); one that speaks 2026-07-28 retries with a listed version.
    #[test]
    fn p04_unsupported_versions_speak_the_era_the_endpoint_admits() {
        use ProtocolVersion::*;
        let old = Rejection::UnsupportedVersion(VersionMismatch::new(
            "2026-07-28",
            &[V2025_06_18, V2025_11_25],
        ));
        let v: serde_json::Value = serde_json::from_slice(&old.body_for(None)).unwrap();
        assert_eq!(v["error"]["code"], CODE_TRANSPORT);
        assert_eq!(
            v["error"]["data"]["supported"],
            json!(["2025-06-18", "2025-11-25"])
        );
        let dual = Rejection::UnsupportedVersion(VersionMismatch::new(
            "2099-01-01",
            &[V2025_11_25, V2026_07_28],
        ));
        let id = RequestKey::of(&json!(301));
        let v: serde_json::Value = serde_json::from_slice(&dual.body_for(Some(&id))).unwrap();
        assert_eq!(v["id"], 301);
        assert_eq!(v["error"]["code"], CODE_UNSUPPORTED_PROTOCOL_VERSION);
        assert_eq!(v["error"]["data"]["supported"], json!(["2026-07-28"]));
        assert_eq!(v["error"]["data"]["requested"], "2099-01-01");
        assert_eq!(dual.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn rejection_bodies_are_json_rpc_errors_without_id() {
        for r in [
            Rejection::SessionNotFound(NotFound::Forged),
            Rejection::OriginForbidden,
            Rejection::CursorEvicted,
            Rejection::ParseError("x".into()),
        ] {
            let v: serde_json::Value = serde_json::from_slice(&r.body_for(None)).unwrap();
            assert_eq!(v["jsonrpc"], "2.0");
            assert!(v["id"].is_null());
            assert_eq!(v["error"]["data"]["reason"], r.reason());
        }
    }
}

//! Header names of MCP Streamable HTTP and the rules for passing headers through.
//!
//! End-to-end headers pass unchanged in both directions (`fr15_end_to_end_headers_pass_through`);
//! hop-by-hop headers (RFC 9110 §7.6.1) and the ones the sidecar rewrites (`Host`,
//! `Content-Length`, `Mcp-Session-Id`, `Last-Event-ID`, `Accept-Encoding`) do not, nor do tether's
//! own hop headers (`Tether-*`, between sidecars only).

use http::HeaderName;
use http::header::{self, HeaderMap};

/// `Mcp-Session-Id` (spec S-01..S-05).
pub(crate) const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
/// `MCP-Protocol-Version` (spec P-01..P-04).
pub(crate) const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// `Mcp-Method` (spec P-05, 2026-07-28).
pub(crate) const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
/// `Last-Event-ID` (spec R-03; WHATWG SSE).
pub(crate) const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

/// Whether a client request header is forwarded to the upstream.
pub(crate) fn forward_request_header(name: &HeaderName) -> bool {
    !(HOP_BY_HOP.contains(&name.as_str())
        || name == header::HOST
        || name == header::CONTENT_LENGTH
        || name == header::TRANSFER_ENCODING
        || name == header::ACCEPT_ENCODING
        || name == MCP_SESSION_ID
        || name == LAST_EVENT_ID
        || name.as_str().starts_with("tether-"))
}

/// Whether an upstream response header is passed to the client.
pub(crate) fn forward_response_header(name: &HeaderName) -> bool {
    !(HOP_BY_HOP.contains(&name.as_str())
        || name == header::CONTENT_LENGTH
        || name == header::TRANSFER_ENCODING
        || name == MCP_SESSION_ID
        || name.as_str().starts_with("access-control-"))
}

/// The client headers to forward upstream.
pub(crate) fn forwarded_request_headers(client: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(client.len());
    for (name, value) in client {
        if forward_request_header(name) {
            out.append(name.clone(), value.clone());
        }
    }
    // The `Connection` header may name further hop-by-hop headers (RFC 9110 §7.6.1).
    for listed in client
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
    {
        if let Ok(name) = HeaderName::from_bytes(listed.trim().as_bytes()) {
            out.remove(name);
        }
    }
    out
}

/// The upstream response headers to pass to the client.
pub(crate) fn forwarded_response_headers(upstream: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(upstream.len());
    for (name, value) in upstream {
        if forward_response_header(name) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn end_to_end_headers_pass_and_rewritten_ones_do_not() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("mcp-protocol-version", "2025-06-18"),
            ("authorization", "Bearer x"),
            ("mcp-param-region", "eu"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-session-id", "client-id"),
            ("last-event-id", "abc-1"),
            ("host", "example"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("content-length", "10"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let out = forwarded_request_headers(&h);
        for kept in [
            "mcp-protocol-version",
            "authorization",
            "mcp-param-region",
            "accept",
        ] {
            assert!(out.contains_key(kept), "{kept} must be forwarded");
        }
        for dropped in [
            "mcp-session-id",
            "last-event-id",
            "host",
            "connection",
            "x-private",
            "content-length",
        ] {
            assert!(
                !out.contains_key(dropped),
                "{dropped} must not be forwarded"
            );
        }
    }
}

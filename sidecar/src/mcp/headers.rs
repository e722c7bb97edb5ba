//! Header names of MCP Streamable HTTP and the rules for passing headers through.
//!
//! End-to-end headers pass unchanged in both directions (`fr15_end_to_end_headers_pass_through`);
//! hop-by-hop headers (RFC 9110 §7.6.1) and the ones the sidecar rewrites (`Host`,
//! `Content-Length`, `Mcp-Session-Id`, `Last-Event-ID`, `Accept-Encoding`) do not, nor do tether's
//! own hop headers (`Tether-*`, between sidecars only).
//!
//! Towards the MCP server the sidecar is a proxy hop ([`identity_edits`]): `Host` names the
//! server as the sidecar dials it (or `spec.upstream.host`; set where the request is sent), the
//! client's `Host` travels in `X-Forwarded-Host` and
//! `Forwarded` (RFC 7239), and the client's `Origin` — which the sidecar checks itself against
//! `spec.origins` — is not passed on unless `spec.upstream.forwardOrigin` says so: SDK servers on
//! loopback defend against DNS rebinding and refuse a `Host` or `Origin` that is not local.

use http::header::{self, HeaderMap};
use http::{HeaderName, HeaderValue};

/// `Mcp-Session-Id` (spec S-01..S-05).
pub(crate) const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
/// `MCP-Protocol-Version` (spec P-01..P-04).
pub(crate) const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// `Mcp-Method` (spec P-05, 2026-07-28).
pub(crate) const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
/// `Mcp-Name` (spec P-05, 2026-07-28): the tool, prompt or resource a request names.
pub(crate) const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");
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

/// What changes in a client request's identity headers towards the MCP server: headers to set
/// (`X-Forwarded-Host` unless a proxy in front set it, `Forwarded` with this hop's `host=`
/// appended) and headers to remove (`Origin`, unless `forward_origin`).
pub(crate) fn identity_edits(
    client: &HeaderMap,
    forward_origin: bool,
) -> (Vec<(HeaderName, HeaderValue)>, Vec<HeaderName>) {
    let mut set = Vec::new();
    let mut remove = Vec::new();
    if let Some(host) = client.get(header::HOST) {
        if !client.contains_key(X_FORWARDED_HOST) {
            set.push((X_FORWARDED_HOST, host.clone()));
        }
        let element = format!("host=\"{}\"", String::from_utf8_lossy(host.as_bytes()));
        let chain = match client.get(header::FORWARDED) {
            Some(earlier) => format!("{}, {element}", String::from_utf8_lossy(earlier.as_bytes())),
            None => element,
        };
        if let Ok(value) = HeaderValue::from_str(&chain) {
            set.push((header::FORWARDED, value));
        }
    }
    if !forward_origin {
        remove.push(header::ORIGIN);
    }
    (set, remove)
}

/// `X-Forwarded-Host`.
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The client headers to forward upstream, with the proxy hop's identity edits
/// ([`identity_edits`]; `forward_origin`: `spec.upstream.forwardOrigin`).
pub(crate) fn forwarded_request_headers(client: &HeaderMap, forward_origin: bool) -> HeaderMap {
    let mut out = forwarded_end_to_end(client);
    let (set, remove) = identity_edits(client, forward_origin);
    for name in remove {
        out.remove(name);
    }
    for (name, value) in set {
        out.insert(name, value);
    }
    out
}

/// The client's end-to-end headers (hop-by-hop ones and those the sidecar rewrites dropped).
fn forwarded_end_to_end(client: &HeaderMap) -> HeaderMap {
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

/// The credential headers of `request`: every value of each header in `names`
/// (`spec.auth.forwardHeaders`), in order; empty for an anonymous request.
pub(crate) fn credential_headers(request: &HeaderMap, names: &[HeaderName]) -> HeaderMap {
    let mut found = HeaderMap::new();
    for name in names {
        for value in request.get_all(name) {
            found.append(name.clone(), value.clone());
        }
    }
    found
}

/// `headers` with `credentials` (as [`credential_headers`] finds them) in place of any
/// credential headers of the same names it had.
pub(crate) fn replace_credentials(mut headers: HeaderMap, credentials: &HeaderMap) -> HeaderMap {
    for name in credentials.keys() {
        headers.remove(name);
    }
    for (name, value) in credentials {
        headers.append(name.clone(), value.clone());
    }
    headers
}

/// The upstream response headers to pass to the client, in a map of their own: the values are
/// copied, so keeping the map (a stored reply, a stream's head) does not keep the connection's
/// whole read buffer alive, which the parsed values are slices of.
pub(crate) fn forwarded_response_headers(upstream: &HeaderMap) -> HeaderMap {
    let kept = upstream
        .keys()
        .filter(|name| forward_response_header(name))
        .count();
    let mut out = HeaderMap::with_capacity(kept);
    for (name, value) in upstream {
        if forward_response_header(name) {
            let mut owned =
                HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
            owned.set_sensitive(value.is_sensitive());
            out.append(name.clone(), owned);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let out = forwarded_end_to_end(&h);
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

    #[test]
    fn the_upstream_sees_its_own_host_the_clients_in_forwarded_and_no_origin() {
        let mut client = HeaderMap::new();
        client.insert(header::HOST, HeaderValue::from_static("mcp.example.com"));
        client.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://app.example.com"),
        );
        let out = forwarded_request_headers(&client, false);
        assert!(
            !out.contains_key(header::HOST),
            "set where the request is sent"
        );
        assert_eq!(out["x-forwarded-host"], "mcp.example.com");
        assert_eq!(out[header::FORWARDED], "host=\"mcp.example.com\"");
        assert!(!out.contains_key(header::ORIGIN));
        client.insert(
            "x-forwarded-host",
            HeaderValue::from_static("public.example"),
        );
        client.insert(header::FORWARDED, HeaderValue::from_static("for=10.0.0.1"));
        let out = forwarded_request_headers(&client, true);
        assert_eq!(out[header::ORIGIN], "https://app.example.com");
        assert_eq!(
            out["x-forwarded-host"], "public.example",
            "a proxy in front set it"
        );
        assert_eq!(
            out[header::FORWARDED],
            "for=10.0.0.1, host=\"mcp.example.com\"",
            "this hop is appended"
        );
    }
}

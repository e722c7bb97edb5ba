//! Admission: the checks every request passes before it reaches a session
//! (`docs/design/architecture.md#request-path`), in this order:
//!
//! 1. path is `spec.listen.path` (404 otherwise);
//! 2. `Origin` against the allowlist (403; spec O-01, O-02);
//! 3. CORS preflight (`OPTIONS`) answered from the allowlist;
//! 4. method GET, POST or DELETE (405 with `Allow`);
//! 5. `MCP-Protocol-Version` known and listed in `spec.protocolVersions` (400; P-03); a
//!    missing header means the session's negotiated version, else 2025-03-26 (P-02);
//! 6. `Accept` (406; T-03 for POST, T-04 for GET) and `Content-Type` (415);
//! 7. `Mcp-Session-Id` syntax, visible ASCII 0x21–0x7E (400; S-02);
//! 8. `Last-Event-ID` length (400);
//! 9. `Content-Length` against the body limit (413);
//! 10. for 2026-07-28 POSTs, `Mcp-Method` not `initialize` (404; P-04).
//!
//! JSON-RPC envelope checks (batches B-01/B-02, S-04) need the body and run in the broker; so do
//! the checks of a 2026-07-28 request's standard headers against its body
//! ([`crate::mcp::modern`]).

use http::{HeaderMap, Method, header};
use tether_crds::ProtocolVersion;

use crate::mcp::cursor::MAX_CURSOR_LEN;
use crate::mcp::headers::{LAST_EVENT_ID, MCP_METHOD, MCP_PROTOCOL_VERSION, MCP_SESSION_ID};
use crate::mcp::jsonrpc::EnvelopeLimits;
use crate::mcp::origin::{OriginCheck, OriginPolicy, preflight_headers};
use crate::mcp::rejection::{Rejection, VersionMismatch};

/// Longest `Mcp-Session-Id` accepted, in bytes. Ids we mint have 55.
pub(crate) const MAX_SESSION_ID_LEN: usize = 256;

/// The protocol family of a request (`docs/design/architecture.md#vocabulary`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::VariantArray)]
pub(crate) enum Era {
    /// 2025-03-26, 2025-06-18, 2025-11-25: sessions, resumable streams.
    Sessionful,
    /// 2026-07-28: no sessions, a disconnect cancels (spec L-05, S-10).
    Stateless,
}

impl Era {
    /// Metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Era::Sessionful => "sessionful",
            Era::Stateless => "stateless",
        }
    }
}

/// Configuration of admission, from the endpoint spec and flags.
#[derive(Clone, Debug)]
pub(crate) struct AdmissionPolicy {
    /// `spec.listen.path`.
    pub(crate) path: String,
    /// `spec.origins`.
    pub(crate) origins: OriginPolicy,
    /// `spec.protocolVersions`.
    pub(crate) versions: Vec<ProtocolVersion>,
    /// Largest request body, in bytes.
    pub(crate) max_body_bytes: usize,
    /// What one body may hold (`--max-batch`).
    pub(crate) envelope: EnvelopeLimits,
}

/// A request that passed admission.
#[derive(Clone, Debug)]
pub(crate) struct Admitted {
    /// GET, POST or DELETE.
    pub(crate) method: Method,
    /// The client's headers.
    pub(crate) headers: HeaderMap,
    /// The `MCP-Protocol-Version` header, when present.
    pub(crate) version: Option<ProtocolVersion>,
    /// The era the request belongs to.
    pub(crate) era: Era,
    /// `Mcp-Session-Id` (ignored, hence `None`, for stateless requests: spec S-10).
    pub(crate) session_id: Option<String>,
    /// `Last-Event-ID` (ignored for stateless requests: spec R-08).
    pub(crate) last_event_id: Option<String>,
    /// The `Origin` check, for the CORS headers of the reply.
    pub(crate) origin: OriginCheck,
    /// What its body may hold.
    pub(crate) limits: EnvelopeLimits,
}

/// The outcome of admission.
#[derive(Debug)]
pub(crate) enum Admission {
    /// Serve the request.
    Request(Admitted),
    /// A CORS preflight: answer 204 with these headers.
    Preflight(HeaderMap),
}

/// A refused request: the rejection and the `Origin` check (CORS headers go on errors too).
#[derive(Debug)]
pub(crate) struct Refused {
    /// Why.
    pub(crate) rejection: Rejection,
    /// The `Origin` check.
    pub(crate) origin: OriginCheck,
}

impl AdmissionPolicy {
    /// Runs the checks on a request's head.
    ///
    /// # Errors
    /// [`Refused`] with the first check that failed.
    pub(crate) fn admit(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<Admission, Refused> {
        let origin = self.origins.check(headers);
        let refuse = |rejection| Refused {
            rejection,
            origin: origin.clone(),
        };
        if path != self.path {
            return Err(refuse(Rejection::PathNotFound));
        }
        if origin == OriginCheck::Forbidden {
            return Err(refuse(Rejection::OriginForbidden));
        }
        if method == Method::OPTIONS {
            return Ok(Admission::Preflight(preflight_headers(headers, &origin)));
        }
        if !matches!(*method, Method::GET | Method::POST | Method::DELETE) {
            return Err(refuse(Rejection::MethodNotAllowed));
        }
        let version = self.version(headers).map_err(refuse)?;
        let era = match version {
            Some(v) if v.is_stateless() => Era::Stateless,
            _ => Era::Sessionful,
        };
        check_media_types(method, era, headers).map_err(refuse)?;
        if era == Era::Stateless && *method == Method::POST {
            refuse_initialize(headers).map_err(refuse)?;
        }
        let (session_id, last_event_id) = match era {
            Era::Stateless => (None, None),
            Era::Sessionful => (
                session_id(headers).map_err(refuse)?,
                last_event_id(headers).map_err(refuse)?,
            ),
        };
        if let Some(len) = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            && len > self.max_body_bytes as u64
        {
            return Err(refuse(Rejection::PayloadTooLarge(self.max_body_bytes)));
        }
        Ok(Admission::Request(Admitted {
            method: method.clone(),
            headers: headers.clone(),
            version,
            era,
            session_id,
            last_event_id,
            origin,
            limits: self.envelope,
        }))
    }

    fn version(&self, headers: &HeaderMap) -> Result<Option<ProtocolVersion>, Rejection> {
        let Some(value) = single(headers, &MCP_PROTOCOL_VERSION, "MCP-Protocol-Version")? else {
            return Ok(None);
        };
        match ProtocolVersion::parse(value) {
            Some(v) if self.versions.contains(&v) => Ok(Some(v)),
            // A session negotiated at a version a reload removed keeps it: the broker checks
            // that the header names the session's own version.
            Some(v) if !v.is_stateless() && headers.contains_key(MCP_SESSION_ID) => Ok(Some(v)),
            _ => Err(Rejection::UnsupportedVersion(VersionMismatch::new(
                value,
                &self.versions,
            ))),
        }
    }
}

/// The one value of a header as visible ASCII text, if present.
fn single<'a>(
    headers: &'a HeaderMap,
    name: &http::HeaderName,
    display: &'static str,
) -> Result<Option<&'a str>, Rejection> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Rejection::MalformedHeader(display));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| Rejection::MalformedHeader(display))
}

fn session_id(headers: &HeaderMap) -> Result<Option<String>, Rejection> {
    let mut values = headers.get_all(MCP_SESSION_ID).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let bytes = value.as_bytes();
    let valid = values.next().is_none()
        && !bytes.is_empty()
        && bytes.len() <= MAX_SESSION_ID_LEN
        && bytes.iter().all(|b| (0x21..=0x7e).contains(b));
    if !valid {
        return Err(Rejection::MalformedSessionId);
    }
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

fn last_event_id(headers: &HeaderMap) -> Result<Option<String>, Rejection> {
    let Some(value) = single(headers, &LAST_EVENT_ID, "Last-Event-ID")? else {
        return Ok(None);
    };
    if value.len() > MAX_CURSOR_LEN {
        return Err(Rejection::MalformedCursor);
    }
    Ok(Some(value.to_owned()))
}

/// `initialize` does not exist in 2026-07-28 (SEP-2575) and would open an upstream session
/// nobody ends: a POST that names it in `Mcp-Method` gets 404 before its body is read (one that
/// names it in the body only, [`crate::mcp::modern::check`]).
fn refuse_initialize(headers: &HeaderMap) -> Result<(), Rejection> {
    match single(headers, &MCP_METHOD, "Mcp-Method")? {
        Some(m) if m.trim().eq_ignore_ascii_case("initialize") => {
            Err(Rejection::MethodNotFound("initialize"))
        }
        _ => Ok(()),
    }
}

/// The media ranges of `Accept` (lowercase essences, parameters dropped).
fn accepted(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|r| {
            r.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .filter(|r| !r.is_empty())
        .collect()
}

fn check_media_types(method: &Method, era: Era, headers: &HeaderMap) -> Result<(), Rejection> {
    let accept = accepted(headers);
    let has = |m: &str| accept.iter().any(|a| a == m);
    match *method {
        Method::POST => {
            // T-03: both types must be listed explicitly (SDKs answer 406 otherwise).
            if !(has("application/json") && has("text/event-stream")) {
                return Err(Rejection::NotAcceptable(
                    "POST must accept both application/json and text/event-stream",
                ));
            }
            let json = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.split(';').next().unwrap_or("").trim())
                .is_some_and(|v| v.eq_ignore_ascii_case("application/json"));
            if !json {
                return Err(Rejection::UnsupportedMediaType);
            }
        }
        // T-04; `*/*` and `text/*` also admit SSE (a documented choice: such clients are common).
        Method::GET
            if era == Era::Sessionful
                && !(has("text/event-stream") || has("text/*") || has("*/*")) =>
        {
            return Err(Rejection::NotAcceptable(
                "GET must accept text/event-stream",
            ));
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn policy() -> AdmissionPolicy {
        AdmissionPolicy {
            path: "/mcp".into(),
            origins: OriginPolicy::new(&["https://app.example.com".into()], true),
            versions: vec![
                ProtocolVersion::V2025_03_26,
                ProtocolVersion::V2025_06_18,
                ProtocolVersion::V2025_11_25,
                ProtocolVersion::V2026_07_28,
            ],
            max_body_bytes: 1000,
            envelope: EnvelopeLimits { max_batch: 64 },
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_bytes(v.as_bytes()).unwrap());
        }
        h
    }

    const POST_OK: [(&str, &str); 2] = [
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
    ];

    fn reject(method: Method, h: &HeaderMap) -> Rejection {
        match policy().admit(&method, "/mcp", h) {
            Err(r) => r.rejection,
            Ok(a) => panic!("expected a rejection, got {a:?}"),
        }
    }

    #[test]
    fn t03_post_needs_both_media_types_and_json() {
        let h = headers(&[
            ("accept", "application/json"),
            ("content-type", "application/json"),
        ]);
        assert_eq!(reject(Method::POST, &h).status(), 406);
        let h = headers(&[
            ("accept", "application/json, text/event-stream"),
            ("content-type", "text/plain"),
        ]);
        assert_eq!(reject(Method::POST, &h), Rejection::UnsupportedMediaType);
        assert!(
            policy()
                .admit(&Method::POST, "/mcp", &headers(&POST_OK))
                .is_ok()
        );
    }

    #[test]
    fn t04_get_needs_event_stream() {
        assert_eq!(
            reject(Method::GET, &headers(&[("accept", "application/json")])).status(),
            406
        );
        for ok in ["text/event-stream", "*/*", "text/*;q=0.5"] {
            assert!(
                policy()
                    .admit(&Method::GET, "/mcp", &headers(&[("accept", ok)]))
                    .is_ok(),
                "{ok}"
            );
        }
    }

    #[test]
    fn p03_unknown_or_unlisted_versions_are_400() {
        let mut h = headers(&POST_OK);
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("1999-01-01"),
        );
        assert_eq!(reject(Method::POST, &h).status(), 400);
        let mut narrow = policy();
        narrow.versions = vec![ProtocolVersion::V2025_06_18];
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2025-03-26"),
        );
        assert!(narrow.admit(&Method::POST, "/mcp", &h).is_err());
        // With a session id an unlisted sessionful version passes admission (a reload may have
        // removed the session's own version; the broker compares it with the session's).
        h.insert("mcp-session-id", HeaderValue::from_static("abc"));
        assert!(narrow.admit(&Method::POST, "/mcp", &h).is_ok());
        for never in ["1999-01-01", "2026-07-28"] {
            h.insert("mcp-protocol-version", HeaderValue::from_static(never));
            narrow.versions = vec![ProtocolVersion::V2025_06_18];
            assert!(narrow.admit(&Method::POST, "/mcp", &h).is_err(), "{never}");
        }
    }

    #[test]
    fn p02_missing_version_is_admitted_as_sessionful() {
        match policy().admit(&Method::POST, "/mcp", &headers(&POST_OK)) {
            Ok(Admission::Request(a)) => {
                assert_eq!(a.version, None);
                assert_eq!(a.era, Era::Sessionful);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn s10_stateless_requests_ignore_session_and_cursor() {
        let mut h = headers(&POST_OK);
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2026-07-28"),
        );
        h.insert("mcp-method", HeaderValue::from_static("tools/call"));
        h.insert("mcp-session-id", HeaderValue::from_static("stale"));
        h.insert("last-event-id", HeaderValue::from_static("x-1"));
        match policy().admit(&Method::POST, "/mcp", &h) {
            Ok(Admission::Request(a)) => {
                assert_eq!(a.era, Era::Stateless);
                assert_eq!(a.session_id, None);
                assert_eq!(a.last_event_id, None);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn p04_initialize_does_not_exist_in_2026_07_28() {
        let mut h = headers(&POST_OK);
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2026-07-28"),
        );
        // Without `Mcp-Method` the body decides (`crate::mcp::modern`).
        assert!(policy().admit(&Method::POST, "/mcp", &h).is_ok());
        h.insert("mcp-method", HeaderValue::from_static("initialize"));
        assert_eq!(
            reject(Method::POST, &h),
            Rejection::MethodNotFound("initialize")
        );
        h.insert("mcp-method", HeaderValue::from_static("tools/list"));
        assert!(policy().admit(&Method::POST, "/mcp", &h).is_ok());
    }

    #[test]
    fn s02_session_ids_must_be_visible_ascii() {
        for bad in [&b"has space"[..], b"caf\xc3\xa9", b""] {
            let mut h = headers(&POST_OK);
            h.insert("mcp-session-id", HeaderValue::from_bytes(bad).unwrap());
            assert_eq!(reject(Method::POST, &h), Rejection::MalformedSessionId);
        }
    }

    #[test]
    fn o02_bad_origin_is_403_before_anything_else() {
        let h = headers(&[("origin", "http://evil.example")]);
        assert_eq!(reject(Method::PUT, &h), Rejection::OriginForbidden);
        assert!(matches!(
            policy().admit(
                &Method::OPTIONS,
                "/mcp",
                &headers(&[("origin", "https://app.example.com")])
            ),
            Ok(Admission::Preflight(_))
        ));
    }

    #[test]
    fn other_checks() {
        assert_eq!(
            reject(Method::PUT, &HeaderMap::new()),
            Rejection::MethodNotAllowed
        );
        let mut h = headers(&POST_OK);
        h.insert("content-length", HeaderValue::from_static("1001"));
        assert_eq!(reject(Method::POST, &h), Rejection::PayloadTooLarge(1000));
        let h = headers(&[
            ("accept", "text/event-stream"),
            ("last-event-id", &"a".repeat(1_000_000)),
        ]);
        assert_eq!(reject(Method::GET, &h), Rejection::MalformedCursor);
        assert!(matches!(
            policy().admit(&Method::GET, "/other", &HeaderMap::new()),
            Err(Refused {
                rejection: Rejection::PathNotFound,
                ..
            })
        ));
    }
}

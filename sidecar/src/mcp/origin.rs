//! The `Origin` allowlist and CORS (spec O-01, O-02; `fr16_preflight_allows_the_mcp_headers`,
//! `o02_fr24_bad_origin_is_403_and_listed_or_missing_origins_pass`).
//!
//! Every request is checked, on every hop: an `Origin` that is present and not listed gets 403; a
//! missing `Origin` is admitted only when `spec.origins.allowMissing` is true. Origins compare as
//! RFC 6454 tuples ([`Origin`]). Browsers get CORS
//! headers on every response, errors included, with `Mcp-Session-Id` exposed.

use http::header::{self, HeaderMap, HeaderValue};
use tether_crds::Origin;

/// Headers a browser client may read from responses.
pub(crate) const EXPOSE_HEADERS: &str =
    "Mcp-Session-Id, MCP-Protocol-Version, WWW-Authenticate, Retry-After";
/// Methods announced in preflight responses.
pub(crate) const ALLOW_METHODS: &str = "GET, POST, DELETE, OPTIONS";
/// Headers allowed in preflight responses when the browser does not list any.
pub(crate) const ALLOW_HEADERS: &str =
    "Content-Type, Accept, Authorization, Mcp-Session-Id, MCP-Protocol-Version, Last-Event-ID";

/// The outcome of checking a request's `Origin`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum OriginCheck {
    /// No `Origin` header, and missing origins are allowed.
    Missing,
    /// An allowed origin, echoed in `Access-Control-Allow-Origin`.
    Allowed(HeaderValue),
    /// Refused: 403.
    Forbidden,
}

/// The compiled `spec.origins`.
#[derive(Clone, Debug)]
pub(crate) struct OriginPolicy {
    allow: Vec<Origin>,
    allow_missing: bool,
}

impl OriginPolicy {
    /// Compiles the allowlist. Entries were validated with the manifest; an entry that still
    /// does not parse matches nothing.
    pub(crate) fn new(allow: &[String], allow_missing: bool) -> Self {
        Self {
            allow: allow.iter().filter_map(|o| Origin::parse(o).ok()).collect(),
            allow_missing,
        }
    }

    /// Checks the `Origin` header of a request.
    pub(crate) fn check(&self, headers: &HeaderMap) -> OriginCheck {
        let mut values = headers.get_all(header::ORIGIN).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return if headers.contains_key(header::ORIGIN) || !self.allow_missing {
                OriginCheck::Forbidden
            } else {
                OriginCheck::Missing
            };
        };
        match value.to_str().ok().map(Origin::parse) {
            Some(Ok(o)) if self.allow.contains(&o) => OriginCheck::Allowed(value.clone()),
            _ => OriginCheck::Forbidden,
        }
    }
}

/// Adds the CORS response headers every reply carries (errors too:
/// `o02_fr24_bad_origin_is_403_and_listed_or_missing_origins_pass`).
pub(crate) fn add_response_headers(headers: &mut HeaderMap, check: &OriginCheck) {
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSE_HEADERS),
    );
    if let OriginCheck::Allowed(origin) = check {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
    }
}

/// Headers of a 204 preflight answer for an allowed origin.
pub(crate) fn preflight_headers(request: &HeaderMap, check: &OriginCheck) -> HeaderMap {
    let mut out = HeaderMap::new();
    add_response_headers(&mut out, check);
    out.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(ALLOW_METHODS),
    );
    let requested = request
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned()
        .unwrap_or(HeaderValue::from_static(ALLOW_HEADERS));
    out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, requested);
    out.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    out.insert(header::ALLOW, HeaderValue::from_static(ALLOW_METHODS));
    out.append(
        header::VARY,
        HeaderValue::from_static("Access-Control-Request-Method, Access-Control-Request-Headers"),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(policy: &OriginPolicy, origin: Option<&str>) -> OriginCheck {
        let mut h = HeaderMap::new();
        if let Some(o) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_str(o).unwrap());
        }
        policy.check(&h)
    }

    #[test]
    fn o02_listed_origins_pass_and_others_are_forbidden() {
        let p = OriginPolicy::new(
            &[
                "https://app.example.com".into(),
                "http://localhost:3000".into(),
            ],
            true,
        );
        assert!(matches!(
            check(&p, Some("https://app.example.com")),
            OriginCheck::Allowed(_)
        ));
        assert!(matches!(
            check(&p, Some("https://APP.example.com:443")),
            OriginCheck::Allowed(_)
        ));
        assert!(matches!(
            check(&p, Some("http://localhost:3000")),
            OriginCheck::Allowed(_)
        ));
        for bad in [
            "http://evil.example",
            "http://app.example.com",
            "https://app.example.com:8443",
            "http://localhost:3001",
            "null",
            "https://app.example.com.evil.example",
            "https://app.example.com/",
        ] {
            assert_eq!(check(&p, Some(bad)), OriginCheck::Forbidden, "{bad}");
        }
        assert_eq!(check(&p, None), OriginCheck::Missing);
    }

    #[test]
    fn o01_missing_origin_follows_allow_missing() {
        let strict = OriginPolicy::new(&["https://app.example.com".into()], false);
        assert_eq!(check(&strict, None), OriginCheck::Forbidden);
    }

    #[test]
    fn two_origin_headers_are_forbidden() {
        let p = OriginPolicy::new(&["https://app.example.com".into()], true);
        let mut h = HeaderMap::new();
        h.append(
            header::ORIGIN,
            HeaderValue::from_static("https://app.example.com"),
        );
        h.append(
            header::ORIGIN,
            HeaderValue::from_static("https://app.example.com"),
        );
        assert_eq!(p.check(&h), OriginCheck::Forbidden);
    }
}

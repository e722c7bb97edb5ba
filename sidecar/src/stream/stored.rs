//! An upstream's complete non-SSE answer, kept on its stream and replayed verbatim.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};

use crate::mcp::jsonrpc::{RequestKey, is_response};
use crate::mcp::rejection::Rejection;

/// An upstream's non-SSE answer kept for retried requests and replayed verbatim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredReply {
    /// HTTP status.
    pub(crate) status: StatusCode,
    /// End-to-end headers worth replaying (`content-type`, `allow`, `www-authenticate`...).
    pub(crate) headers: HeaderMap,
    /// Body.
    pub(crate) body: Bytes,
}

/// Bytes a stored reply takes besides its body and header fields (the struct, the map).
const REPLY_OVERHEAD: u64 = 64;

impl StoredReply {
    /// Whether the answer refuses the request instead of answering it: 401, 403, 407, 429 or
    /// 503, or another 4xx without a JSON-RPC body. A refusal passes to the client but is not
    /// the outcome of its request ids, so the same message sent again (with a refreshed token,
    /// after `Retry-After`) is dispatched again.
    pub(crate) fn is_refusal(&self) -> bool {
        refuses_caller(self.status)
            || self.status == StatusCode::SERVICE_UNAVAILABLE
            || (self.status.is_client_error() && !is_response(&self.body))
    }

    /// Whether the answer refuses the caller rather than the request: 401, 403, 407 (its
    /// credentials) or 429 (its rate). A rebuild refused so waits for the session's next
    /// request, which may bring a refreshed token.
    pub(crate) fn refuses_caller(&self) -> bool {
        refuses_caller(self.status)
    }

    /// What keeping the reply costs, in bytes: body, header names and values, and overhead
    /// (`tether_retained_bytes{kind="replies"}`).
    pub(crate) fn retained_bytes(&self) -> u64 {
        let headers: usize = self
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len())
            .sum();
        REPLY_OVERHEAD + (self.body.len() + headers) as u64
    }
}

/// Whether `status` refuses the caller rather than the request: 401, 403, 407 (its
/// credentials) or 429 (its rate).
pub(crate) fn refuses_caller(status: StatusCode) -> bool {
    matches!(status.as_u16(), 401 | 403 | 407 | 429)
}

impl From<&Rejection> for StoredReply {
    fn from(r: &Rejection) -> Self {
        Self::rejection(r, None)
    }
}

impl StoredReply {
    /// The answer rejection `r` gives request `id` (its JSON-RPC error names the id, `null`
    /// when unknown), with the headers it calls for (`Allow`, `Retry-After`).
    pub(crate) fn rejection(r: &Rejection, id: Option<&RequestKey>) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        match r {
            Rejection::MethodNotAllowed => {
                headers.insert(
                    header::ALLOW,
                    HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
                );
            }
            Rejection::CredentialExpired => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(
                        "Bearer error=\"invalid_token\", error_description=\"The access token expired\"",
                    ),
                );
            }
            Rejection::TooManySessions
            | Rejection::UpstreamUnavailable
            | Rejection::UpstreamNotReady
            | Rejection::PeerUnavailable
            | Rejection::ResumeBudget
            | Rejection::PodFull
            | Rejection::TooManyCalls(_)
            | Rejection::PrincipalSessions
            | Rejection::PrincipalRetained
            | Rejection::CredentialUnconfirmed
            | Rejection::TooManyConnections
            | Rejection::SourceConnections
            | Rejection::TakeoverBudget
            | Rejection::UpstreamTimeout => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        StoredReply {
            status: r.status(),
            headers,
            body: r.body_for(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: &str) -> StoredReply {
        StoredReply {
            status: StatusCode::from_u16(status).unwrap(),
            headers: HeaderMap::new(),
            body: Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn refusals_are_auth_rate_and_availability_answers_and_4xx_without_json_rpc() {
        let error = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"bad"}}"#;
        for status in [401, 403, 407, 429, 503] {
            assert!(reply(status, error).is_refusal(), "{status}");
        }
        assert!(
            reply(400, "bad request").is_refusal(),
            "a 4xx without JSON-RPC"
        );
        assert!(reply(404, "").is_refusal());
        assert!(
            !reply(400, error).is_refusal(),
            "the server's JSON-RPC error is an answer"
        );
        assert!(!reply(200, r#"{"jsonrpc":"2.0","id":1,"result":{}}"#).is_refusal());
        assert!(!reply(202, "").is_refusal());
        assert!(
            !reply(500, "oops").is_refusal(),
            "a 5xx other than 503 is an outcome"
        );
    }

    #[test]
    fn only_credential_and_rate_refusals_refuse_the_caller() {
        for status in [401, 403, 407, 429] {
            assert!(reply(status, "").refuses_caller(), "{status}");
        }
        for status in [200, 400, 404, 500, 502, 503] {
            assert!(!reply(status, "").refuses_caller(), "{status}");
        }
    }
}

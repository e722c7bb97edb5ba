//! An upstream's complete non-SSE answer, kept on its stream and replayed verbatim.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};

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

impl From<&Rejection> for StoredReply {
    fn from(r: &Rejection) -> Self {
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
            Rejection::TooManySessions
            | Rejection::UpstreamUnavailable
            | Rejection::PeerUnavailable
            | Rejection::ResumeBudget
            | Rejection::PodJournalsFull
            | Rejection::PodRetryFull
            | Rejection::TooManyConnections
            | Rejection::TakeoverBudget
            | Rejection::UpstreamTimeout => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        StoredReply {
            status: r.status(),
            headers,
            body: r.body(),
        }
    }
}

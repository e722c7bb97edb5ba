//! What the sidecar writes to a client: a [`Reply`] (status, headers, a full body or an SSE
//! feed of a stream's buffer).

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};

use crate::mcp::headers::MCP_SESSION_ID;
use crate::mcp::rejection::Rejection;
use crate::stream::{Feed, StoredReply};

/// The body of a [`Reply`].
#[derive(Debug)]
pub(crate) enum ReplyBody {
    /// No body (202, 204, 405…).
    Empty,
    /// A complete body.
    Full(Bytes),
    /// An SSE stream served from a session stream's buffer.
    Sse(Feed),
}

/// A response the sidecar writes to the client.
#[derive(Debug)]
pub(crate) struct Reply {
    /// HTTP status.
    pub(crate) status: StatusCode,
    /// Headers (CORS headers are added on the way out).
    pub(crate) headers: HeaderMap,
    /// Body.
    pub(crate) body: ReplyBody,
}

impl From<Rejection> for Reply {
    fn from(r: Rejection) -> Self {
        StoredReply::from(&r).into()
    }
}

impl From<StoredReply> for Reply {
    fn from(s: StoredReply) -> Self {
        let body = if s.body.is_empty() {
            ReplyBody::Empty
        } else {
            ReplyBody::Full(s.body)
        };
        Reply {
            status: s.status,
            headers: s.headers,
            body,
        }
    }
}

impl Reply {
    /// An empty reply with `status` (e.g. 202 Accepted for notifications, spec T-05).
    pub(crate) fn empty(status: StatusCode) -> Self {
        Reply {
            status,
            headers: HeaderMap::new(),
            body: ReplyBody::Empty,
        }
    }

    /// A 200 SSE reply reading `feed`, with the headers proxies need to stream it (`Cache-Control:
    /// no-cache`, `X-Accel-Buffering: no`; `fr14_sse_headers_and_each_event_flushed_at_once`).
    pub(crate) fn sse(feed: Feed) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache, no-transform"),
        );
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        Reply {
            status: StatusCode::OK,
            headers,
            body: ReplyBody::Sse(feed),
        }
    }

    /// Adds the upstream's end-to-end headers that the reply does not set itself
    /// (`WWW-Authenticate`, `Mcp-Param-*`… pass through on SSE replies too;
    /// `fr15_end_to_end_headers_pass_through`).
    pub(crate) fn with_upstream_headers(mut self, upstream: &HeaderMap) -> Self {
        for name in upstream.keys() {
            if !self.headers.contains_key(name) {
                for value in upstream.get_all(name) {
                    self.headers.append(name.clone(), value.clone());
                }
            }
        }
        self
    }

    /// Adds `Mcp-Session-Id` (only on successful replies within a session).
    pub(crate) fn with_session_id(mut self, id: &str) -> Self {
        if let Ok(v) = HeaderValue::from_str(id) {
            self.headers.insert(MCP_SESSION_ID, v);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::rejection::NotFound;

    #[test]
    fn rejection_replies_carry_no_session_id() {
        let reply = Reply::from(Rejection::SessionNotFound(NotFound::Unknown));
        assert_eq!(reply.status, StatusCode::NOT_FOUND);
        assert!(reply.headers.get(MCP_SESSION_ID).is_none());
    }
}

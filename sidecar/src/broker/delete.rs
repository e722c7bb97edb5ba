//! DELETE: the client ends its session (spec S-05, S-07).
//!
//! The upstream is told first. An upstream that forbids client termination answers 405, which is
//! passed through and the session stays. Otherwise the session is freed here whatever the
//! upstream said, and later requests for it get 404; the upstream's success status (200, 202…)
//! passes through, or 204 when the upstream could not be asked.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, StatusCode};

use super::Broker;
use crate::mcp::admission::Admitted;
use crate::mcp::headers::forwarded_request_headers;
use crate::mcp::rejection::{NotFound, Rejection};
use crate::reply::Reply;
use crate::session::EnterGuard;
use crate::upstream::Exchange;

impl Broker {
    pub(super) async fn delete(
        self: &Arc<Self>,
        call: &Admitted,
        entered: Option<EnterGuard>,
    ) -> Result<Reply, Rejection> {
        let session = self.entered_session(call, entered.as_ref())?;
        let answer = match session.upstream_id() {
            None => None,
            Some(upstream_session) => {
                let exchange = Exchange {
                    upstream_session: Some(&upstream_session),
                    headers: forwarded_request_headers(&call.headers),
                    last_event_id: None,
                };
                self.upstream
                    .send(Method::DELETE, exchange, Bytes::new())
                    .await
                    .ok()
            }
        };
        let reply = match answer {
            Some(resp) if resp.status() == StatusCode::METHOD_NOT_ALLOWED => {
                return Ok(self.read_stored(resp).await?.into());
            }
            Some(resp) if resp.status().is_success() => {
                // The session is over even if its body cannot be read.
                self.read_stored(resp)
                    .await
                    .map_or_else(|_| Reply::empty(StatusCode::NO_CONTENT), Reply::from)
            }
            _ => Reply::empty(StatusCode::NO_CONTENT),
        };
        self.end_session(&session, NotFound::Deleted);
        Ok(reply)
    }
}

//! DELETE: the client ends its session (spec S-05, S-07).
//!
//! The upstream is told first, with the DELETE's own headers (its credentials). Only an
//! upstream 2xx or a 404 (the upstream session is gone already) ends the session here; later
//! requests for it get 404. Any other answer — 405 from an upstream that forbids client
//! termination, 401/403 for a caller it does not accept, a 5xx — passes through and the session
//! stays; so does an upstream that cannot be reached (503 + `Retry-After`): nothing ends on a
//! credential the MCP server did not judge. A session with no upstream session to end (handed
//! over and not rebuilt yet, or an MCP server without sessions) has the DELETE's credentials
//! judged first, as an answer from memory has (`broker/revalidate.rs`). The upstream's success
//! status (200, 202…) passes through; 204 when it answered 404 or had no session to end.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, StatusCode};

use super::Broker;
use crate::mcp::admission::Admitted;
use crate::mcp::principal::Owner;
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
        if session.upstream_id().is_none()
            && let Err(refusal) = self.revalidate(&session, &call.headers).await
        {
            return Ok(refusal);
        }
        let answer = match session.upstream_id() {
            None => None,
            Some(upstream_session) => {
                let exchange = Exchange {
                    upstream_session: Some(&upstream_session),
                    headers: self.upstream_headers(&call.headers),
                    last_event_id: None,
                };
                let sent = self
                    .upstream
                    .send(Method::DELETE, exchange, Bytes::new())
                    .await;
                Some(sent.map_err(|e| self.upstream_rejection(&e))?)
            }
        };
        let reply = match answer {
            Some(resp) if resp.status().is_success() => {
                // The session is over even if its body cannot be read.
                self.read_stored(resp, &Owner::of_session(session.binding()))
                    .await
                    .map_or_else(|_| Reply::empty(StatusCode::NO_CONTENT), Reply::from)
            }
            Some(resp) if resp.status() != StatusCode::NOT_FOUND => {
                let owner = Owner::of_session(session.binding());
                return Ok(self.read_stored(resp, &owner).await?.into());
            }
            _ => Reply::empty(StatusCode::NO_CONTENT),
        };
        self.end_session(&session, NotFound::Deleted);
        Ok(reply)
    }
}

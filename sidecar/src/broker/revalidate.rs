//! Answers from memory authorized by the MCP server (`spec.auth.revalidate`): a resume, a
//! standalone GET or a retry is served from the sidecar's buffers, so the MCP server never
//! sees it. Before serving one with a credential the server has not accepted for the session
//! within the window, the sidecar asks the server with a `ping` in the session carrying that
//! credential; the server's 401 or 403 (with its `WWW-Authenticate`) goes to the client and
//! nothing is served. It fails closed: while the server cannot say (unreachable, not ready for
//! the rebuild it needs, any answer but a success or a refusal), nothing is served either — 503
//! `credential_unconfirmed` + `Retry-After`. Every answer the server gives a dispatched request
//! that is not a 401/403 counts as an acceptance of its credential; a 401/403 withdraws one,
//! and a JWT past its `exp` is judged again whatever was accepted. A session handed over and
//! not rebuilt yet is rebuilt first, with the request's credentials: the rebuild is the
//! server's judgement (a refused one passes its answer on, `broker/rebuild.rs`). A ping the
//! server accepts makes its credential the session's (the one the sidecar's own requests
//! carry), as an accepted request does (`Broker::send_in_session`).

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use tether_crds::AuthBinding;

use super::Broker;
use super::rebuild::{Rebuild, Sent};
use crate::mcp::headers::credential_headers;
use crate::mcp::methods::PING;
use crate::mcp::principal::Owner;
use crate::mcp::principal::{Principal, credential_expired, credential_expiry, principal};
use crate::mcp::rejection::{NotFound, Rejection};
use crate::reply::Reply;
use crate::session::Session;
use crate::stream::refuses_caller;
use crate::upstream::post_headers;

/// The `ping` of one revalidation (its answer is read and dropped), with a request id of its
/// own: the spec forbids reusing one in a session, and an MCP server routes each answer by its
/// request's id — with one id for every ping, two revalidations at once (a resume and the
/// standalone stream's reconnect after a token refresh) got each other's answer or none, and
/// the other answer reached the standalone stream.
fn ping() -> Bytes {
    let id: u64 = rand::random();
    Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":"tether-revalidate-{id:016x}","method":"{PING}"}}"#
    ))
}

impl Broker {
    /// The digest standing for the credential a request of `session` with `headers` presents
    /// (`None`: none), keyed by the session's key.
    pub(super) fn credential_key(
        &self,
        session: &Session,
        headers: &HeaderMap,
    ) -> Option<Principal> {
        let cfg = self.cfg();
        principal(
            headers,
            &cfg.forward_headers,
            AuthBinding::Credential,
            session.key(),
        )
    }

    /// `reply` (a `subscriptions/listen` stream opened by a request with `headers`), ending
    /// when the JWT that opened it expires (its `exp`): a token-validating intermediary does not
    /// go on serving a stream on a credential past its lifetime; the client listens again with
    /// a fresh token.
    pub(crate) fn until_credential_expires(&self, reply: Reply, headers: &HeaderMap) -> Reply {
        let Some(exp) = credential_expiry(headers) else {
            return reply;
        };
        let left = exp
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        let at = tokio::time::Instant::now() + left;
        reply.until(at, self.metrics.streams_credential_expired())
    }

    /// Records that the MCP server answered a request of `session` with `headers` `status`:
    /// anything but a refusal of the caller (401, 403, 407, 429: a gateway may rate-limit
    /// before it checks credentials) accepts its credential; a 401 or 403 withdraws an earlier
    /// acceptance of it, so nothing more is served from memory on its word.
    pub(super) fn note_acceptance(
        &self,
        session: &Session,
        headers: &HeaderMap,
        status: StatusCode,
    ) {
        let Some(key) = self.credential_key(session, headers) else {
            return;
        };
        if !refuses_caller(status) {
            session.accept_credential(key);
        } else if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            session.withdraw_credential(key);
        }
    }

    /// Whether a request of `session` with `headers` may be answered from memory: `Err` with
    /// the MCP server's 401/403 when the server refuses its credential now, and 503
    /// `credential_unconfirmed` while it cannot say (unreachable, not ready for the rebuild it
    /// needs, an answer that is neither a success nor a refusal). A request without credentials
    /// or with a credential accepted within the window is served; a session its rebuild ended
    /// gets 404.
    pub(super) async fn revalidate(
        self: &Arc<Self>,
        session: &Arc<Session>,
        headers: &HeaderMap,
    ) -> Result<(), Reply> {
        let window = self.cfg().revalidate;
        let Some(key) = self.credential_key(session, headers) else {
            return Ok(());
        };
        // A JWT past its `exp` is not vouched for by an earlier acceptance: the server judges
        // it again.
        let expired = credential_expired(headers, std::time::SystemTime::now());
        if window.is_zero() || (!expired && session.credential_accepted(key, window)) {
            return Ok(());
        }
        if session.needs_rebuild() {
            // A session handed over, not rebuilt here yet: the rebuild, with this request's
            // credentials, is the MCP server's judgement of them.
            match self.ensure_upstream(session, headers).await {
                Rebuild::Done if session.credential_accepted(key, window) => return Ok(()),
                Rebuild::Done => {}
                Rebuild::Denied(refusal) => return Err(Reply::from(refusal)),
                Rebuild::NotReady => return Err(Rejection::CredentialUnconfirmed.into()),
                Rebuild::Ended => {
                    return Err(Rejection::SessionNotFound(NotFound::UpstreamGone).into());
                }
            }
        }
        // The request's own credentials, whatever another request of the session sent since.
        let mut ping_headers = post_headers(Some(session.version().as_str()));
        ping_headers.extend(credential_headers(headers, &self.cfg().forward_headers));
        let resp = match self
            .send_in_session(session, Method::POST, &ping_headers, None, ping(), true)
            .await
        {
            Ok(Sent::Answer(resp)) => resp,
            Ok(Sent::Denied(refusal)) => return Err(Reply::from(refusal)),
            Ok(Sent::Gone) => {
                return Err(Rejection::SessionNotFound(NotFound::UpstreamGone).into());
            }
            Ok(Sent::Rebuilt) | Err(_) => return Err(Rejection::CredentialUnconfirmed.into()),
        };
        let status = resp.status();
        let answer = self
            .read_stored(resp, &Owner::of_session(session.binding()))
            .await;
        self.metrics.revalidation(status);
        match answer {
            Ok(refusal) if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => {
                Err(Reply::from(refusal))
            }
            _ if status.is_success() => {
                session.accept_credential(key);
                Ok(())
            }
            _ => Err(Rejection::CredentialUnconfirmed.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ping;
    use crate::mcp::jsonrpc::{Envelope, EnvelopeLimits, Message};

    #[test]
    fn each_revalidation_ping_has_a_request_id_of_its_own() {
        let id = || {
            let body = ping();
            let env = Envelope::parse(&body, EnvelopeLimits { max_batch: 1 }).unwrap();
            match &env.messages[0].0 {
                Message::Request { id, method } => {
                    assert_eq!(method, "ping");
                    id.clone()
                }
                other => panic!("not a request: {other:?}"),
            }
        };
        let ids: std::collections::HashSet<_> = (0..100).map(|_| id()).collect();
        assert_eq!(ids.len(), 100, "{ids:?}");
    }
}

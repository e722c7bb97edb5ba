//! Cancellations of requests that run on another pod (spec L-02): a session handed here keeps
//! requests running at the pod it came from until they finish; a client's
//! `notifications/cancelled` for one of them goes to that pod ([`CancelRelay`]) with the
//! canceller's own credentials, and a pod that handed a session off sends, on its own upstream,
//! what its new holder relays with those credentials — never the session's — and forgets the
//! request only when the MCP server accepted the cancellation ([`Broker::cancel_upstream`]).
//! A credential the MCP server refuses cancels nothing.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;

use super::Broker;
use crate::mcp::headers::{credential_headers, replace_credentials};
use crate::mcp::jsonrpc::RequestKey;
use crate::session::Session;
use crate::stream::refuses_caller;
use crate::upstream::post_headers;

/// Passes a client's cancellation of a request that runs on another pod (the one that handed
/// the session here) to that pod. Installed by the handoff ([`Broker::set_cancel_relay`]), so
/// the broker needs no knowledge of the peer protocol.
pub(crate) trait CancelRelay: Send + Sync + std::fmt::Debug {
    /// Sends `notification` (cancelling `request` of session `session`) to pod `writer`, with
    /// the canceller's `credentials` (its `spec.auth.forwardHeaders`).
    fn relay(
        &self,
        writer: String,
        session: String,
        request: RequestKey,
        notification: serde_json::Value,
        credentials: HeaderMap,
    );
}

impl Broker {
    /// Installs the relay of cancellations for requests running on another pod.
    pub(crate) fn set_cancel_relay(&self, relay: Arc<dyn CancelRelay>) {
        let _ = self.cancel_relay.set(relay);
    }

    /// Relays a cancellation sent with `client` headers to the pod still running the request,
    /// if it runs elsewhere.
    pub(super) fn relay_cancel(
        &self,
        session: &Session,
        request: &RequestKey,
        notification: &serde_json::Value,
        client: &HeaderMap,
    ) {
        let writer = session
            .stream_of_request(request)
            .and_then(|s| s.following());
        if let (Some(writer), Some(relay)) = (writer, self.cancel_relay.get()) {
            relay.relay(
                writer,
                session.id().to_owned(),
                request.clone(),
                notification.clone(),
                credential_headers(client, &self.cfg().forward_headers),
            );
        }
    }

    /// Sends a client's `notification` cancelling `request` (relayed by the session's new
    /// holder) to this pod's upstream, where the request runs, with the canceller's
    /// `credentials`, and forgets the request on its stream once the MCP server accepted it.
    /// Best effort: the request may have finished meanwhile.
    pub(crate) async fn cancel_upstream(
        self: &Arc<Self>,
        session: &Arc<Session>,
        request: &RequestKey,
        notification: &serde_json::Value,
        credentials: &HeaderMap,
    ) {
        let headers =
            replace_credentials(post_headers(Some(session.version().as_str())), credentials);
        let body = Bytes::from(notification.to_string());
        let accepted = self
            .forward(session, headers, body)
            .await
            .is_ok_and(|answer| !refuses_caller(answer.status));
        if accepted && let Some(stream) = session.stream_of_request(request) {
            stream.cancel_request(request);
        }
    }
}

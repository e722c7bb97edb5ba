//! Cancellations of requests that run on another pod (spec L-02): a session handed here keeps
//! requests running at the pod it came from until they finish; a client's
//! `notifications/cancelled` for one of them goes to that pod ([`CancelRelay`]), and a pod that
//! handed a session off cancels, on its own upstream, what its new holder relays
//! ([`Broker::cancel_upstream`]).

use std::sync::Arc;

use bytes::Bytes;

use super::Broker;
use crate::mcp::jsonrpc::RequestKey;
use crate::session::Session;
use crate::upstream::post_headers;

/// Passes a client's cancellation of a request that runs on another pod (the one that handed
/// the session here) to that pod. Installed by the handoff ([`Broker::set_cancel_relay`]), so
/// the broker needs no knowledge of the peer protocol.
pub(crate) trait CancelRelay: Send + Sync + std::fmt::Debug {
    /// Sends `notification` (cancelling `request` of session `session`) to pod `writer`.
    fn relay(
        &self,
        writer: String,
        session: String,
        request: RequestKey,
        notification: serde_json::Value,
    );
}

impl Broker {
    /// Installs the relay of cancellations for requests running on another pod.
    pub(crate) fn set_cancel_relay(&self, relay: Arc<dyn CancelRelay>) {
        let _ = self.cancel_relay.set(relay);
    }

    /// Relays a cancellation to the pod still running the request, if it runs elsewhere.
    pub(super) fn relay_cancel(
        &self,
        session: &Session,
        request: &RequestKey,
        notification: &serde_json::Value,
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
            );
        }
    }

    /// Sends a client's `notification` cancelling `request` (relayed by the session's new
    /// holder) to this pod's upstream, where the request runs, and forgets the request on its
    /// stream. Best effort: the request may have finished meanwhile.
    pub(crate) async fn cancel_upstream(
        self: &Arc<Self>,
        session: &Arc<Session>,
        request: &RequestKey,
        notification: &serde_json::Value,
    ) {
        let headers = session.with_credentials(post_headers(Some(session.version().as_str())));
        let body = Bytes::from(notification.to_string());
        let _ = self.forward(session, headers, body).await;
        if let Some(stream) = session.stream_of_request(request) {
            stream.cancel_request(request);
        }
    }
}

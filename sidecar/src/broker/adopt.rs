//! The receiving side of a handoff (DESIGN.md §3.4 steps 2–4, `docs/design/handoff.md`).
//!
//! - [`Broker::adopt`] registers a session pushed by a peer: its streams with their buffered
//!   events and numbering, retry records, journal. Streams whose request still runs at the
//!   sender *follow* it: their later events arrive through [`Broker::apply_tail`].
//! - The upstream session is rebuilt from the journal before the session's first upstream
//!   request ([`Broker::ensure_upstream`], `migration: Replay`); the rebuild also starts in the
//!   background at once, so the first request rarely waits.
//! - [`Broker::abandon_orphans`] ends followed streams whose sender died mid-handoff: their
//!   pending requests get a JSON-RPC error, so no client hangs.

use std::sync::Arc;

use super::Broker;
use crate::handoff::wire::{CancelPush, SessionPush, TailPush};
use crate::jsonrpc::RequestKey;
use crate::upstream::{own_headers, post_headers};

/// Passes a client's cancellation of a request that runs on another pod (the one that handed
/// the session here) to that pod. Set by the handoff machinery ([`Broker::set_cancel_relay`]).
pub trait CancelRelay: Send + Sync + std::fmt::Debug {
    /// Sends `notification` (cancelling `request` of session `session`) to pod `writer`.
    fn relay(
        &self,
        writer: String,
        session: String,
        request: RequestKey,
        notification: serde_json::Value,
    );
}
use crate::session::{Session, TooManySessions};

/// Adopted sessions rebuilt in the background at the same time.
pub const BACKGROUND_REBUILDS: usize = 8;

/// Why a pushed session or tail was not taken.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// The session id fails its MAC: not a session of this endpoint.
    #[error("the session id is not one of this endpoint's")]
    Forged,
    /// The image cannot be used (unknown protocol version…).
    #[error("unusable session image: {0}")]
    Invalid(String),
    /// This pod drains and takes no session.
    #[error("this pod is draining")]
    Draining,
    /// This pod holds its maximum of sessions.
    #[error(transparent)]
    Full(#[from] TooManySessions),
    /// A tail for a session this pod does not hold.
    #[error("this pod does not hold the session")]
    NotHeld,
}

impl Broker {
    /// Adopts a session pushed by a peer; returns once it is registered (the acknowledgement).
    /// A repeated push of a session already held is acknowledged again without change.
    ///
    /// # Errors
    /// [`AdoptError`]: forged id, unusable image, draining, full.
    pub fn adopt(self: &Arc<Self>, push: &SessionPush) -> Result<(), AdoptError> {
        let image = &push.session;
        self.minter
            .verify(&image.id)
            .map_err(|_| AdoptError::Forged)?;
        if self.is_draining() {
            return Err(AdoptError::Draining);
        }
        let digest = self.secret.log_digest(&image.id);
        let session = Session::restore(image, digest, &push.from, self.cfg().buffer, &self.budget)
            .map_err(AdoptError::Invalid)?;
        if !self.registry.adopt(Arc::clone(&session))? {
            return Ok(());
        }
        self.metrics.sessions.inc();
        self.metrics.handoffs_received.inc();
        tracing::info!(
            session = session.digest(),
            from = %push.from,
            streams = image.streams.len(),
            "session adopted"
        );
        // Rebuilt in the background, a few at a time (a drain hands over hundreds of sessions at
        // once); a request for the session rebuilds it at once if it comes first.
        let broker = Arc::clone(self);
        tokio::spawn(async move {
            let _slot = broker.rebuild_slots.acquire().await;
            broker.ensure_upstream(&session).await;
        });
        Ok(())
    }

    /// Applies a tail message to a session adopted from its sender; returns the new events.
    /// A session this pod handed on meanwhile still takes it (its own follower passes it on).
    ///
    /// # Errors
    /// [`AdoptError::NotHeld`] when this pod does not hold the session (the sender stops).
    pub fn apply_tail(&self, tail: &TailPush) -> Result<usize, AdoptError> {
        let session = self
            .registry
            .get(&tail.session)
            .or_else(|| self.registry.departed(&tail.session))
            .ok_or(AdoptError::NotHeld)?;
        Ok(session.import_streams(
            &tail.streams,
            &tail.requests,
            &tail.from,
            self.cfg().buffer,
            &self.budget,
        ))
    }

    /// Cancels, on this pod's upstream, a request of a session handed off from here whose new
    /// holder received `notifications/cancelled` for it (spec L-02, field report 19).
    ///
    /// # Errors
    /// [`AdoptError::NotHeld`] when no session with that id is here any more.
    pub async fn cancel_here(self: &Arc<Self>, push: &CancelPush) -> Result<(), AdoptError> {
        let session = self
            .registry
            .departed(&push.session)
            .or_else(|| self.registry.get(&push.session))
            .ok_or(AdoptError::NotHeld)?;
        let headers = post_headers(Some(session.version().as_str()));
        let body = bytes::Bytes::from(push.notification.to_string());
        // Best effort: the request may have finished meanwhile.
        let _ = self.forward(&session, headers, body).await;
        if let Some(stream) = session.stream_of_request(&push.request) {
            stream.cancel_request(&push.request);
        }
        Ok(())
    }

    /// Installs the relay of cancellations for requests running on another pod.
    pub fn set_cancel_relay(&self, relay: Arc<dyn CancelRelay>) {
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

    /// Rebuilds the upstream session of an adopted session from its journal, once; returns
    /// whether the session can be used (a failed rebuild ends it: later requests get 404).
    pub(super) async fn ensure_upstream(self: &Arc<Self>, session: &Arc<Session>) -> bool {
        if !session.needs_rebuild() {
            return !session.is_ended();
        }
        let _one_at_a_time = session.rebuilding.lock().await;
        if !session.needs_rebuild() || session.is_ended() {
            return !session.is_ended();
        }
        if !self.rebuild_now(session).await {
            return false;
        }
        // A standalone stream open at the sender goes on there until its calls finish; this
        // pod opens its own before any request of the session reaches the upstream, so server
        // messages of calls made here are buffered for the client's next GET.
        if session.take_reopen_standalone() {
            let headers = own_headers(session.version().as_str(), true);
            if let Err(e) = Arc::clone(self)
                .open_standalone_boxed(headers, Arc::clone(session))
                .await
            {
                tracing::debug!(session = session.digest(), error = ?e, "cannot open the standalone stream");
            }
        }
        true
    }

    /// Ends followed streams whose writer is no longer `alive` (killed mid-handoff).
    pub fn abandon_orphans(&self, alive: &dyn Fn(&str) -> bool) {
        for session in self.registry.all() {
            for stream in session.streams() {
                if stream.following().is_some_and(|from| !alive(&from)) {
                    tracing::warn!(
                        session = session.digest(),
                        "the pod writing a handed-off stream is gone; its pending requests end"
                    );
                    stream.abandon_following();
                }
            }
        }
    }
}

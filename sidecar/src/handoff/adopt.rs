//! The receiving side of a handoff (`docs/design/handoff.md`): a session pushed by a peer is
//! restored from its image and registered ([`adopt`]); later events of its streams still written
//! at the sender arrive as tails ([`apply_tail`]); cancellations of requests still running here
//! after a session left come back from its new holder ([`cancel_here`]); followed streams whose
//! writer died end ([`abandon_orphans`]).

use std::sync::Arc;

use super::image;
use crate::broker::Broker;
use crate::handoff::wire::{CancelPush, SessionPush, TailPush};
use crate::lifecycle::Lifecycle;
use crate::session::TooManySessions;

/// Why a pushed session or tail was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdoptError {
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

/// Adopts a session pushed by a peer; returns once it is registered (the acknowledgement). Its
/// upstream session is rebuilt from the journal before first use (`migration: Replay`). A
/// repeated push of a session already held is acknowledged again without change.
///
/// # Errors
/// [`AdoptError`]: forged id, unusable image, draining, full.
pub(crate) fn adopt(
    broker: &Arc<Broker>,
    lifecycle: &Lifecycle,
    push: &SessionPush,
) -> Result<(), AdoptError> {
    let pushed = &push.session;
    if !broker.is_genuine(&pushed.id) {
        return Err(AdoptError::Forged);
    }
    if lifecycle.is_draining() {
        return Err(AdoptError::Draining);
    }
    let digest = broker.log_digest(&pushed.id);
    let session = image::restore_session(
        pushed,
        digest,
        &push.from,
        broker.buffer_limits(),
        broker.retained(),
    )
    .map_err(AdoptError::Invalid)?;
    if broker.adopt_session(Arc::clone(&session))? {
        tracing::info!(
            session = session.digest(),
            from = %push.from,
            streams = pushed.streams.len(),
            "session adopted"
        );
    }
    Ok(())
}

/// Applies a tail message to a session adopted from its sender; returns the new events. A
/// session this pod handed on meanwhile still takes it (its own follower passes it on).
///
/// # Errors
/// [`AdoptError::NotHeld`] when this pod does not hold the session (the sender stops).
pub(crate) fn apply_tail(broker: &Broker, tail: &TailPush) -> Result<usize, AdoptError> {
    let session = broker
        .held(&tail.session)
        .or_else(|| broker.departed_session(&tail.session))
        .ok_or(AdoptError::NotHeld)?;
    Ok(image::import(
        &session,
        &tail.streams,
        &tail.requests,
        &tail.from,
        broker.buffer_limits(),
    ))
}

/// Cancels, on this pod's upstream, a request of a session handed off from here whose new
/// holder received `notifications/cancelled` for it (spec L-02).
///
/// # Errors
/// [`AdoptError::NotHeld`] when no session with that id is here any more.
pub(crate) async fn cancel_here(broker: &Arc<Broker>, push: &CancelPush) -> Result<(), AdoptError> {
    let session = broker
        .departed_session(&push.session)
        .or_else(|| broker.held(&push.session))
        .ok_or(AdoptError::NotHeld)?;
    broker
        .cancel_upstream(&session, &push.request, &push.notification)
        .await;
    Ok(())
}

/// Ends followed streams whose writer is no longer `alive` (killed mid-handoff): their pending
/// requests get a JSON-RPC error, so no client hangs.
pub(crate) fn abandon_orphans(broker: &Broker, alive: &dyn Fn(&str) -> bool) {
    for session in broker.sessions() {
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

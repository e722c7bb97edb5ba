//! The receiving side of a handoff (`docs/design/handoff.md`): a session pushed by a peer is
//! restored from its image and registered by its epoch ([`adopt`]); a sender whose push went
//! unacknowledged asks whether it was taken ([`took`]); later events of its streams still written
//! at the sender arrive as tails ([`apply_tail`]); cancellations of requests still running here
//! after a session left come back from its new holder ([`cancel_here`]); followed streams whose
//! writer died end ([`abandon_orphans`]).

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::image;
use crate::broker::Broker;
use crate::lifecycle::Lifecycle;
use crate::peer::wire::{CancelPush, HeldQuery, MAX_CANCEL_CREDENTIALS, SessionPush, TailPush};
use crate::session::Refused;

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
    #[error("this pod holds its maximum of sessions")]
    Full,
    /// The push is stale: the session is held here at a later epoch, or was handed on from
    /// here at that epoch or later (a replay, an earlier attempt).
    #[error("the push is older than the session's epoch here ({0})")]
    Stale(u64),
    /// The session ended on this pod; it is never taken again.
    #[error("the session ended on this pod")]
    Ended,
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
    let Some(genuine) = broker.genuine(&pushed.id) else {
        return Err(AdoptError::Forged);
    };
    if lifecycle.is_draining() {
        return Err(AdoptError::Draining);
    }
    let session = image::restore_session(
        pushed,
        genuine.key,
        &push.from,
        broker.buffer_limits(),
        broker.retained(),
    )
    .map_err(AdoptError::Invalid)?;
    let adopted = broker
        .adopt_session(Arc::clone(&session))
        .map_err(|refused| match refused {
            Refused::Full(_) => AdoptError::Full,
            Refused::Stale(epoch) => AdoptError::Stale(epoch),
            Refused::Ended => AdoptError::Ended,
        })?;
    if adopted {
        tracing::info!(
            session = session.digest(),
            from = %push.from,
            epoch = session.epoch(),
            streams = pushed.streams.len(),
            "session adopted"
        );
    }
    Ok(())
}

/// Whether this pod took the session of `query` at its epoch or a later one (it holds it, or
/// handed it on since): the answer a sender waits for before it tries another pod.
pub(crate) fn took(broker: &Broker, query: &HeldQuery) -> bool {
    broker.took(&query.session, query.epoch)
}

/// Applies a tail message to a session adopted from its sender; returns the new events. A
/// session this pod handed on meanwhile still takes it (its own follower passes it on).
///
/// # Errors
/// [`AdoptError::Ended`] when the session ended here (the sender ends its copy too);
/// [`AdoptError::NotHeld`] when this pod does not hold it otherwise (it lost it: the sender
/// pushes the session again).
pub(crate) fn apply_tail(broker: &Broker, tail: &TailPush) -> Result<usize, AdoptError> {
    let Some(session) = broker
        .held(&tail.session)
        .or_else(|| broker.departed_session(&tail.session))
    else {
        return Err(if broker.ended_here(&tail.session) {
            AdoptError::Ended
        } else {
            AdoptError::NotHeld
        });
    };
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
    let credentials = cancel_credentials(&push.credentials.0, &broker.cfg().forward_headers)
        .map_err(AdoptError::Invalid)?;
    let session = broker
        .departed_session(&push.session)
        .or_else(|| broker.held(&push.session))
        .ok_or(AdoptError::NotHeld)?;
    broker
        .cancel_upstream(&session, &push.request, &push.notification, &credentials)
        .await;
    Ok(())
}

/// The credential headers a [`CancelPush`] carries, as headers: at most
/// [`MAX_CANCEL_CREDENTIALS`], each named in `forward_headers`, each a valid header value.
///
/// # Errors
/// What is wrong with them.
fn cancel_credentials(
    pairs: &[(String, String)],
    forward_headers: &[HeaderName],
) -> Result<HeaderMap, String> {
    if pairs.len() > MAX_CANCEL_CREDENTIALS {
        return Err(format!(
            "a cancellation carries at most {MAX_CANCEL_CREDENTIALS} credential headers"
        ));
    }
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        let Some(name) = forward_headers.iter().find(|h| h.as_str() == name) else {
            return Err("a cancellation's credential header is not a forwarded one".into());
        };
        let value = HeaderValue::from_str(value)
            .map_err(|_| "a cancellation's credential header value is invalid".to_owned())?;
        headers.append(name.clone(), value);
    }
    Ok(headers)
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
                stream.abandon_following(crate::stream::WriterLost::Handoff);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relayed_cancellation_carries_only_forwarded_credential_headers() {
        let forwarded = [HeaderName::from_static("authorization")];
        let pair = |name: &str, value: &str| (name.to_owned(), value.to_owned());
        let ok = cancel_credentials(&[pair("authorization", "Bearer t")], &forwarded).unwrap();
        assert_eq!(ok.get("authorization").unwrap(), "Bearer t");
        assert!(cancel_credentials(&[], &forwarded).unwrap().is_empty());
        for (pairs, why) in [
            (vec![pair("cookie", "a=b")], "not a forwarded header"),
            (
                vec![pair("authorization", "bad\nvalue")],
                "not a header value",
            ),
            (
                vec![pair("authorization", "Bearer t"); MAX_CANCEL_CREDENTIALS + 1],
                "too many",
            ),
        ] {
            assert!(cancel_credentials(&pairs, &forwarded).is_err(), "{why}");
        }
    }
}

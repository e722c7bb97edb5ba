//! Who a session speaks for (`docs/design/architecture.md#sessions`,
//! `docs/design/handoff.md#credentials`): the credentials its clients present
//! (`spec.auth.forwardHeaders`), the principal it is bound to (`spec.auth.binding`) and the
//! credentials the MCP server accepted for it (`spec.auth.revalidate`).
//!
//! ```text
//!   credentials:  none ── a request carries some ──▶ remembered ◀─┐
//!                                                        └────────┘ a later request's replace them
//!   binding:      unbound ── bind (at initialize, or adopted with the image) ──▶ bound (for good)
//!   a credential: unknown ── accepted by the MCP server ──▶ accepted ── refused since ──▶ unknown
//!                                    (at most ACCEPTED_CREDENTIALS, the oldest forgotten first;
//!                                     accepted counts within a window from then)
//! ```
//!
//! - The credential headers are what requests the sidecar makes on the session's behalf carry:
//!   memory only, never logged, never in a handoff image. The image carries only that the
//!   session *is* credentialed ([`Credentials::is_credentialed`]), so the new holder rebuilds
//!   the upstream session with the next request's credentials.
//! - A session is bound once; a second binding changes nothing.
//! - Accepted credentials are keyed digests ([`Principal`]), never the credentials themselves.

use std::collections::VecDeque;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderName};
use parking_lot::Mutex;

use crate::mcp::headers::{credential_headers, replace_credentials};
use crate::mcp::principal::{Binding, Principal};

/// Most accepted credentials a session remembers (`spec.auth.revalidate`).
const ACCEPTED_CREDENTIALS: usize = 8;

/// The credentials and binding of one session.
#[derive(Debug, Default)]
pub(super) struct Credentials {
    /// The credential headers of the session's latest client request that carried any.
    headers: Mutex<HeaderMap>,
    /// Some client request of the session carried credentials (here or on an earlier holder).
    credentialed: AtomicBool,
    /// The principal every request of the session must present; unset: no binding.
    binding: OnceLock<Binding>,
    /// Digests of credentials the MCP server accepted for the session, with when (newest last).
    accepted: Mutex<VecDeque<(Principal, Instant)>>,
}

impl Credentials {
    /// Takes what the image of a session adopted from a peer says: `credentialed`, and the
    /// credentials accepted there `age` ago (oldest first; those older than the longest
    /// revalidation window are of no use, and maybe beyond this pod's clock).
    pub(super) fn adopt(&self, credentialed: bool, accepted: Vec<(Principal, Duration)>) {
        let now = Instant::now();
        let skip = accepted.len().saturating_sub(ACCEPTED_CREDENTIALS);
        *self.accepted.lock() = accepted
            .into_iter()
            .skip(skip)
            .filter(|(_, age)| *age <= tether_crds::MAX_REVALIDATE)
            .filter_map(|(key, age)| Some((key, now.checked_sub(age)?)))
            .collect();
        self.credentialed.store(credentialed, Ordering::Relaxed);
    }

    /// Keeps the headers `names` of a client request as the credentials, when it carries any;
    /// a request without them changes nothing.
    pub(super) fn remember(&self, request: &HeaderMap, names: &[HeaderName]) {
        let found = credential_headers(request, names);
        if found.is_empty() {
            return;
        }
        self.credentialed.store(true, Ordering::Relaxed);
        *self.headers.lock() = found;
    }

    /// `headers` with the remembered credentials in place of any the headers had.
    pub(super) fn apply(&self, headers: HeaderMap) -> HeaderMap {
        replace_credentials(headers, &self.headers.lock())
    }

    /// Whether some client request presented credentials, here or on an earlier holder.
    pub(super) fn is_credentialed(&self) -> bool {
        self.credentialed.load(Ordering::Relaxed)
    }

    /// Binds the session to `binding`; whether it was unbound (a second binding changes
    /// nothing).
    pub(super) fn bind(&self, binding: Binding) -> bool {
        self.binding.set(binding).is_ok()
    }

    /// The binding, if any.
    pub(super) fn binding(&self) -> Option<Binding> {
        self.binding.get().copied()
    }

    /// Records that the MCP server accepted credential `key` just now.
    pub(super) fn accept(&self, key: Principal) {
        let mut accepted = self.accepted.lock();
        accepted.retain(|(k, _)| *k != key);
        if accepted.len() == ACCEPTED_CREDENTIALS {
            accepted.pop_front();
        }
        accepted.push_back((key, Instant::now()));
    }

    /// Forgets that the MCP server accepted credential `key` (it refused it since).
    pub(super) fn withdraw(&self, key: Principal) {
        self.accepted.lock().retain(|(k, _)| *k != key);
    }

    /// Whether the MCP server accepted credential `key` within `window`.
    pub(super) fn accepted(&self, key: Principal, window: Duration) -> bool {
        self.accepted
            .lock()
            .iter()
            .any(|(k, at)| *k == key && at.elapsed() < window)
    }

    /// The accepted credentials with how long ago, oldest first (what an image carries).
    pub(super) fn accepted_ages(&self) -> Vec<(Principal, Duration)> {
        self.accepted
            .lock()
            .iter()
            .map(|(key, at)| (*key, at.elapsed()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use tether_crds::AuthBinding;

    use super::*;

    fn principal(n: u8) -> Principal {
        Principal([n; 16])
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn the_latest_request_with_credentials_is_what_the_session_presents() {
        let c = Credentials::default();
        let names = [http::header::AUTHORIZATION];
        let with = |token: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(http::header::AUTHORIZATION, HeaderValue::from_static(token));
            h
        };
        assert!(!c.is_credentialed());
        c.remember(&HeaderMap::new(), &names);
        assert!(!c.is_credentialed(), "a request without credentials");
        c.remember(&with("Bearer a"), &names);
        c.remember(&HeaderMap::new(), &names);
        c.remember(&with("Bearer b"), &names);
        assert!(c.is_credentialed());
        let sent = c.apply(with("Bearer stale"));
        assert_eq!(
            sent.get_all(http::header::AUTHORIZATION)
                .iter()
                .collect::<Vec<_>>(),
            ["Bearer b"],
            "the latest replaces what the headers had"
        );
    }

    #[test]
    fn a_session_is_bound_once() {
        let c = Credentials::default();
        assert_eq!(c.binding(), None);
        let first = Binding {
            kind: AuthBinding::Subject,
            principal: Some(principal(1)),
        };
        assert!(c.bind(first));
        let second = Binding {
            principal: Some(principal(2)),
            ..first
        };
        assert!(!c.bind(second), "bound for good");
        assert_eq!(c.binding(), Some(first));
    }

    #[test]
    fn accepted_credentials_are_bounded_and_withdrawn() {
        let c = Credentials::default();
        for n in 0..=ACCEPTED_CREDENTIALS as u8 {
            c.accept(principal(n));
        }
        assert!(!c.accepted(principal(0), MINUTE), "the oldest forgotten");
        assert!(c.accepted(principal(1), MINUTE));
        assert!(
            !c.accepted(principal(1), Duration::ZERO),
            "outside the window"
        );
        c.accept(principal(1));
        assert_eq!(
            c.accepted_ages().last().map(|(k, _)| *k),
            Some(principal(1)),
            "accepted again: the newest"
        );
        c.withdraw(principal(1));
        assert!(!c.accepted(principal(1), MINUTE));
        assert_eq!(c.accepted_ages().len(), ACCEPTED_CREDENTIALS - 1);
    }

    #[test]
    fn an_adopted_session_keeps_what_the_image_says() {
        let ages: Vec<_> = (0..10u8)
            .map(|n| (principal(n), Duration::from_secs(u64::from(10 - n))))
            .chain([(principal(99), tether_crds::MAX_REVALIDATE * 2)])
            .collect();
        let c = Credentials::default();
        c.adopt(true, ages);
        assert!(c.is_credentialed());
        let kept: Vec<_> = c.accepted_ages().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            kept,
            (3..10u8).map(principal).collect::<Vec<_>>(),
            "the newest eight of the image, without one older than any window"
        );
        assert!(c.accepted(principal(9), MINUTE));
    }
}

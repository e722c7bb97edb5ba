//! The pods of an endpoint and the way between them: [`membership`] (who serves, in which
//! state), the session [`ring`], [`routing`] of a request to the pod that holds its session and
//! [`peer_health`] (`docs/design/routing.md`).

pub(crate) mod membership;
pub(crate) mod metrics;
pub(crate) mod peer_health;
pub(crate) mod ring;
pub(crate) mod routing;

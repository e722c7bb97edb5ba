//! Running the pod: the admin listener ([`admin`]), the drain socket ([`control`]), the drain
//! ([`drain`]) and the signals that stop the process ([`shutdown`])
//! (`docs/design/architecture.md#lifecycle`).

pub(crate) mod admin;
pub(crate) mod control;
pub(crate) mod drain;
pub(crate) mod metrics;
pub(crate) mod shutdown;

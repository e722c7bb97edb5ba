//! `tether-operator`: the control plane of tether. It reconciles each `McpEndpoint` in a
//! pipeline, dereference → validate → plan → apply → status (`docs/design/operator.md`).
//! The floors, top down; a module imports only from the floors below its own:
//!
//! - process: `watches` (the controller and what wakes it), `leader` (the Lease), `admin`;
//! - reconcile: `controller` (the pipeline under a finalizer, Events, the error policy),
//!   `preview` (the same pipeline on manifests, printed instead of sent: `tether-operator plan`);
//! - writes: `apply` (ensure, create once, patch the key ring, delete a retired child; the
//!   status);
//! - pure steps: `plan` (the children and the steps against the live ones, and `plan::decide`,
//!   the decision of one reconcile that `controller` and `preview` share), `status`;
//! - the key ring, pure: `keys` (its creation and the steps of a rotation, from what was read);
//! - reads: `dereference` (the target and the live children, read once before any write),
//!   `reports` (what each pod's sidecar loaded of the key ring);
//! - checks: `admission` (did the target opt in, is the image allowed), `validate` (the
//!   endpoint and its target Deployment, or the conflict);
//! - ground: `names`, `diff`, `fields` (who manages a field), `access` (the RBAC rules),
//!   `events` (publishing Events), `metrics`, `error`.

pub mod access;
pub mod admin;
pub mod admission;
pub(crate) mod apply;
pub mod controller;
pub(crate) mod dereference;
pub mod diff;
pub mod error;
pub mod events;
pub(crate) mod fields;
#[cfg(test)]
mod fixtures;
pub mod keys;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod plan;
pub mod preview;
pub mod reports;
pub(crate) mod status;
pub mod validate;
pub mod watches;

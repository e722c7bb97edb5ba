//! `tether-operator`: the control plane of tether (DESIGN.md §4).
//!
//! It reconciles `McpEndpoint` objects in a pipeline of validate → build → apply → status
//! (stackable's shape, rust-notes §1.5). This crate holds the pure steps:
//!
//! - [`access`]: the RBAC rules the operator needs (one source for the chart and the tests);
//! - [`names`]: names, labels and identities of what the operator writes;
//! - [`validate`]: the endpoint and its target Deployment, with the conflicts that become
//!   `Degraded` (a missing target, a container name clash, a user `preStop`, a port clash, an
//!   invalid spec);
//! - [`plan`]: the objects a reconcile applies (sidecar injection, ConfigMap, Secret, Services,
//!   RBAC, PodDisruptionBudget), each holding only the fields the operator owns;
//! - [`diff`]: whether a live object already holds what would be applied (a no-op reconcile
//!   writes nothing);
//! - [`status`]: the `Ready`, `Progressing` and `Degraded` conditions from what a reconcile saw;
//! - [`children`]: writing a plan's children (only what changed) and deleting the ones it no
//!   longer wants;
//! - [`controller`]: the reconcile against the API server (finalizer, server-side apply of what
//!   changed, status);
//! - [`watches`]: running the controller, and which endpoint a change of a watched object wakes;
//! - [`metrics`] and [`admin`]: reconciles by result, duration and failures, on `/metrics`
//!   next to `/healthz` and `/readyz`;
//! - [`leader`]: leader election over a Lease, for more than one replica.

pub mod access;
pub mod admin;
pub mod children;
pub mod controller;
pub mod diff;
pub mod error;
#[cfg(test)]
mod fixtures;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod plan;
pub mod status;
pub mod validate;
pub mod watches;

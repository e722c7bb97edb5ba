//! `tether-fake-kube`: one in-memory Kubernetes API server for tether's tests (the operator's
//! `it` tests and the multi-process harness's fake cluster), behaving like a real one where the
//! tests look.
//!
//! - [`ApiServer`] (`server.rs`): the object store. GET of an object or of a namespaced
//!   collection (honouring `labelSelector`, `selector.rs`), POST, PUT, DELETE (with finalizers
//!   and preconditions), and PATCH as server-side apply, JSON patch (`patch.rs`), merge patch or
//!   strategic merge patch, on objects and their `status` subresource. Every write tracks field
//!   ownership in `metadata.managedFields` (`fields.rs`, `apply.rs`), gets the API server's
//!   defaults and canonical quantities (`defaults.rs`), is validated (`validation.rs`), gets a
//!   `resourceVersion` and an event in the log the watches read ([`Event`]). Every request of
//!   the clients that is not a GET is recorded, in order ([`Write`]).
//! - [`Rbac`]: the clients' RBAC rules, passed in by the test (the operator's tests pass
//!   `tether_operator::access`); a request they do not allow is refused (403), and an apply that
//!   creates an object needs `create` too. Without rules, everything is allowed.
//! - Serving (`serve.rs`): as a `tower::Service` behind a [`kube::Client`] ([`client_of`],
//!   [`client_holding`], which holds one request until the test releases it), or over plain
//!   HTTP on a listener ([`serve_http`]). Both stream a WATCH (`watch=true&resourceVersion=R`:
//!   the `ADDED` / `MODIFIED` / `DELETED` events after `R` of the objects the selector matches,
//!   one JSON line each) and hold every LIST while [`ApiServer::hold_lists`] says so (an API
//!   server slow to answer, or not reachable yet).
//! - Writes as a user would send them (`user.rs`: not subject to the rules, not recorded):
//!   [`apply_as`], [`update_as`], [`json_patch_as`], [`create_as`], [`delete`]; servers seeded
//!   with objects ([`api_with`], [`api_created_by`]).

mod apply;
mod defaults;
mod fields;
mod patch;
mod selector;
mod serve;
mod server;
mod user;
mod validation;

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

pub use defaults::canonical_quantity;
pub use fields::{Entry, managed_fields, owners};
pub use serve::{Hold, client_holding, client_of, serve_http};
pub use server::{ApiServer, Attributes, Event, Rbac, Write};
pub use user::{
    api_created_by, api_with, apply_as, create_as, delete, json_patch_as, namespace, paths, stored,
    update_as,
};

/// The server's state, shared with the test.
pub type Shared = Arc<Mutex<ApiServer>>;

/// A `Status` failure, as the API server sends it with an error code.
fn failure(code: u16, reason: &str, message: &str, details: Value) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "details": details, "code": code})
}

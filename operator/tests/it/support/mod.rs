//! The operator's side of the in-memory API server (`tether_fake_kube`, re-exported here): the
//! operator's RBAC rules (`tether_operator::access`), which a server of [`api_with`] or
//! [`api_created_by`] enforces — it refuses (403) what they do not allow.
//!
//! [`cluster`] does what controllers and the kubelet would; [`operator`] runs the operator's
//! reconcile against the server.

pub mod cluster;
pub mod operator;

use serde_json::Value;
use tether_fake_kube::{Attributes, Rbac};
use tether_operator::access::{self, Grant, LEADER_ELECTION, RECONCILE, allows};

pub use tether_fake_kube::{
    Shared, Write, apply_as, client_holding, client_of, create_as, delete, json_patch_as,
    namespace, paths, stored, update_as,
};

/// The operator's rules: [`RECONCILE`] where the [`Grant`] grants them, and [`LEADER_ELECTION`].
struct Rules(Grant);

impl Rbac for Rules {
    fn attributes(&self, method: &http::Method, path: &str, query: &str) -> Option<Attributes> {
        let asked = access::request_attributes(method, path, query)?;
        Some(Attributes {
            group: asked.group,
            resource: asked.resource,
            verb: asked.verb,
            namespace: asked.namespace,
        })
    }

    fn allows(&self, attributes: &Attributes) -> bool {
        let asked = access::Attributes {
            group: attributes.group.clone(),
            resource: attributes.resource.clone(),
            verb: attributes.verb,
            namespace: attributes.namespace.clone(),
        };
        self.0.allows(RECONCILE, &asked)
            || allows(
                LEADER_ELECTION,
                &attributes.group,
                &attributes.resource,
                attributes.verb,
            )
    }
}

/// Grants the operator [`RECONCILE`] where `grant` says (cluster-wide, or in some namespaces: a
/// namespaced install) from now on.
pub fn grant(api: &Shared, grant: Grant) {
    api.lock().unwrap().rbac = Some(Box::new(Rules(grant)));
}

/// [`tether_fake_kube::api_with`], enforcing the operator's rules (granted cluster-wide).
pub fn api_with(objects: &[(&str, Value)]) -> Shared {
    let api = tether_fake_kube::api_with(objects);
    grant(&api, Grant::default());
    api
}

/// [`tether_fake_kube::api_created_by`], enforcing the operator's rules (granted cluster-wide).
pub fn api_created_by(manager: &str, objects: &[(&str, Value)]) -> Shared {
    let api = tether_fake_kube::api_created_by(manager, objects);
    grant(&api, Grant::default());
    api
}

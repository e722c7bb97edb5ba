//! Names, labels and identities of everything the operator writes for one `McpEndpoint`.
//!
//! Children are named after the endpoint (`<endpoint>-<suffix>`), so two endpoints in one
//! namespace never collide, and labelled with the `app.kubernetes.io/*` set below so the
//! operator can find (and prune) its own objects.

use tether_crds::McpEndpoint;

/// The field manager of every server-side apply the operator sends: one stable name, so the
/// API server knows which fields the operator owns.
pub(crate) const FIELD_MANAGER: &str = "tether-operator";
pub use tether_crds::SIDECAR_CONTAINER;
/// Label on every child the operator creates, with [`FIELD_MANAGER`] as its value.
pub(crate) const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Pod-template annotation naming the endpoint whose sidecar is injected; a `tether-sidecar`
/// container without it is the user's, and a clash.
pub const INJECTED_ANNOTATION: &str = "mcp.tether.dev/endpoint";
/// Finalizer that removes the injection when the endpoint is deleted.
pub(crate) const FINALIZER: &str = "mcp.tether.dev/injection";
/// Volume (and mount) of the config ConfigMap in the pod.
pub(crate) const CONFIG_VOLUME: &str = "tether-config";
/// Volume (and mount) of the HMAC Secret in the pod.
pub(crate) const SECRET_VOLUME: &str = "tether-secret";
/// Mount path of the config volume; the sidecar reads `endpoint.yaml` there.
pub(crate) const CONFIG_DIR: &str = "/etc/tether";
/// Mount path of the Secret volume; the sidecar reads `secret` there.
pub(crate) const SECRET_DIR: &str = "/etc/tether-secret";
/// Key of the endpoint manifest in the ConfigMap.
pub const CONFIG_KEY: &str = "endpoint.yaml";
/// Key of the HMAC key in the Secret.
pub const SECRET_KEY: &str = "secret";
/// Path of the sidecar's drain endpoint on its admin port (the injected `preStop` hooks call it).
pub(crate) const DRAIN_PATH: &str = "/drain";
/// Longest name of a Service (an RFC 1035 label).
pub(crate) const MAX_SERVICE_NAME: usize = 63;

/// The names of one endpoint's children.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    /// The endpoint's name.
    pub endpoint: String,
    /// Its namespace.
    pub namespace: String,
}

impl Names {
    /// The names for `ep`; `None` when it has no name or namespace (not from the API server).
    pub fn of(ep: &McpEndpoint) -> Option<Self> {
        Some(Self {
            endpoint: ep.metadata.name.clone()?,
            namespace: ep.metadata.namespace.clone()?,
        })
    }

    /// The config ConfigMap (the spec the sidecars read) and the HMAC Secret.
    pub fn config(&self) -> String {
        format!("{}-tether", self.endpoint)
    }

    /// The client Service (routable pods, the MCP port).
    pub(crate) fn client_service(&self) -> String {
        format!("{}-mcp", self.endpoint)
    }

    /// The headless peer Service (every pod, ready or not).
    pub(crate) fn peer_service(&self) -> String {
        format!("{}-peers", self.endpoint)
    }

    /// The sidecar's Role, RoleBinding and (when the pods name none) ServiceAccount.
    pub(crate) fn sidecar_rbac(&self) -> String {
        format!("{}-tether-sidecar", self.endpoint)
    }

    /// The PodDisruptionBudget.
    pub(crate) fn pdb(&self) -> String {
        format!("{}-tether", self.endpoint)
    }

    /// Labels on every child: `app.kubernetes.io/managed-by`, `part-of`, `instance`.
    pub(crate) fn labels(&self) -> std::collections::BTreeMap<String, String> {
        [
            (MANAGED_BY_LABEL, FIELD_MANAGER),
            ("app.kubernetes.io/part-of", "tether"),
            ("app.kubernetes.io/instance", self.endpoint.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }
}

/// The endpoint whose sidecar a Deployment's pod template carries (its [`INJECTED_ANNOTATION`]),
/// for waking that endpoint's reconcile when someone edits the Deployment; `None` for the others.
pub(crate) fn injected_by(
    deployment: &k8s_openapi::api::apps::v1::Deployment,
) -> Option<kube::runtime::reflector::ObjectRef<McpEndpoint>> {
    let endpoint = deployment
        .spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(INJECTED_ANNOTATION)?;
    let namespace = deployment.metadata.namespace.as_deref()?;
    Some(kube::runtime::reflector::ObjectRef::new(endpoint).within(namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, DEPLOYMENT};

    #[test]
    fn an_injected_deployment_names_its_endpoint() {
        assert!(injected_by(&fixtures::deployment(DEPLOYMENT)).is_none());
        let injected = fixtures::deployment_with(|d| {
            d["spec"]["template"]["metadata"]["annotations"] =
                serde_json::json!({INJECTED_ANNOTATION: "weather"});
        });
        let found = injected_by(&injected).expect("an endpoint");
        assert_eq!(
            (found.name.as_str(), found.namespace.as_deref()),
            ("weather", Some("tools"))
        );
    }
}

//! Names, labels and identities of everything the operator writes for one `McpEndpoint`.
//!
//! Children are named after the endpoint (`<endpoint>-<suffix>`), so two endpoints in one
//! namespace never collide, and labelled with the `app.kubernetes.io/*` set below so the
//! operator can find (and prune) its own objects.

use tether_crds::McpEndpoint;

/// The operator's name: the `managed-by` label of its children, the reporting controller of
/// its Events, and the prefix of its field managers ([`Names::field_manager`]).
pub(crate) const OPERATOR: &str = "tether-operator";
pub use tether_crds::SIDECAR_CONTAINER;
/// Label on every child the operator creates, with [`OPERATOR`] as its value.
pub(crate) const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Pod-template annotation naming the endpoint whose sidecar is injected; a `tether-sidecar`
/// container without it is the user's, and a clash.
pub const INJECTED_ANNOTATION: &str = tether_crds::ENDPOINT_ANNOTATION;
/// Finalizer that removes the injection when the endpoint is deleted.
pub(crate) const FINALIZER: &str = "mcp.tether.dev/injection";
/// Volume (and mount) of the config ConfigMap in the pod.
pub(crate) const CONFIG_VOLUME: &str = "tether-config";
/// Volume (and mount) of the key-ring Secret in the pod.
pub(crate) const SECRET_VOLUME: &str = "tether-secret";
/// Volume (and mount) of the sidecar's projected ServiceAccount token.
pub(crate) const TOKEN_VOLUME: &str = "tether-token";
/// Mount path of the token volume: where Kubernetes clients look for the in-cluster token.
pub(crate) const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Mount path of the config volume; the sidecar reads `endpoint.yaml` there.
pub(crate) const CONFIG_DIR: &str = "/etc/tether";
/// Mount path of the Secret volume: the sidecar reads the key ring there (`--secret-dir`).
pub const SECRET_DIR: &str = "/etc/tether-secret";
/// Key of the endpoint manifest in the ConfigMap.
pub const CONFIG_KEY: &str = "endpoint.yaml";
/// Key of the current HMAC key in the Secret ([`tether_crds::keyring::CURRENT_KEY`]).
pub const SECRET_KEY: &str = tether_crds::keyring::CURRENT_KEY;
/// Path on the sidecar's admin port that waits for the pod's drain to end (the MCP server's
/// injected `preStop httpGet`); it never starts a drain.
pub(crate) const DRAINED_PATH: &str = "/drained";
/// Where the sidecar image has its binary (`images/sidecar.Dockerfile`); the sidecar's `preStop`
/// runs `<binary> drain`.
pub(crate) const SIDECAR_BINARY: &str = "/usr/local/bin/tether-sidecar";
/// Volume (and mount) of the sidecar's own runtime directory, which holds the drain socket; only
/// the sidecar container mounts it.
pub(crate) const RUN_VOLUME: &str = "tether-run";
/// Mount path of the runtime volume.
pub(crate) const RUN_DIR: &str = "/run/tether";
/// The drain socket in the runtime volume (`--drain-socket`).
pub(crate) const DRAIN_SOCKET: &str = "/run/tether/drain.sock";
/// Longest name of a Service (an RFC 1035 label).
pub(crate) const MAX_SERVICE_NAME: usize = 63;

/// Characters of the endpoint's UID in the name of its key-ring Secret ([`Names::secret`]).
const SECRET_UID_CHARS: usize = 8;

/// The names of one endpoint's children.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    /// The endpoint's name.
    pub endpoint: String,
    /// Its namespace.
    pub namespace: String,
    /// Its UID (an endpoint re-created under the same name has another).
    pub uid: String,
}

impl Names {
    /// The names for `ep`; `None` when it has no name, namespace or UID (not from the API
    /// server).
    pub fn of(ep: &McpEndpoint) -> Option<Self> {
        Some(Self {
            endpoint: ep.metadata.name.clone()?,
            namespace: ep.metadata.namespace.clone()?,
            uid: ep.metadata.uid.clone()?,
        })
    }

    /// The config ConfigMap (the spec the sidecars read).
    pub fn config(&self) -> String {
        format!("{}-tether", self.endpoint)
    }

    /// The key-ring Secret (`tether_crds::keyring`): `<endpoint>-tether-keys-<first 8
    /// characters of the endpoint's UID>`. The UID makes the name new when an endpoint is
    /// deleted and re-created under the same name: a kubelet may keep serving a cached Secret of
    /// a name it has mounted before, and pods that read different keys reject each other's
    /// session ids and handoffs.
    pub fn secret(&self) -> String {
        let uid: String = self.uid.chars().take(SECRET_UID_CHARS).collect();
        format!("{}-tether-keys-{uid}", self.endpoint)
    }

    /// The field manager of the endpoint's applies, `tether-operator/<endpoint>`: one per
    /// endpoint, so removing one endpoint's injection (an apply of nothing with its manager)
    /// never strips what another endpoint applied to the same Deployment.
    pub fn field_manager(&self) -> String {
        format!("{OPERATOR}/{}", self.endpoint)
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
            (MANAGED_BY_LABEL, OPERATOR),
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
    fn the_key_ring_is_named_after_the_endpoint_and_its_uid() {
        let names = fixtures::names(&fixtures::endpoint(fixtures::MINIMAL_ENDPOINT));
        assert_eq!(names.secret(), "weather-tether-keys-6f1c2a9e");
    }

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

//! Small YAML fixtures for the crate's unit tests (an endpoint, its target Deployment, their
//! names and owner reference).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use tether_crds::McpEndpoint;

use crate::names::Names;

/// The minimal endpoint: only its target.
pub(crate) const MINIMAL_ENDPOINT: &str = r#"
apiVersion: mcp.tether.dev/v1alpha1
kind: McpEndpoint
metadata: {name: weather, namespace: tools, uid: 6f1c2a9e-0000-4000-8000-000000000001}
spec:
  targetRef: {kind: Deployment, name: weather}
"#;

/// The example server's Deployment: one container serving MCP on 3000, opted in to the
/// endpoint `weather`.
pub(crate) const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: weather
  namespace: tools
  labels: {mcp.tether.dev/endpoint: weather}
spec:
  selector:
    matchLabels: {app: weather}
  template:
    metadata:
      labels: {app: weather}
    spec:
      containers:
        - name: server
          image: ghcr.io/tether-dev/tether-example-server:0.1.0
          ports: [{containerPort: 3000}]
"#;

/// Parses an endpoint fixture.
pub(crate) fn endpoint(yaml: &str) -> McpEndpoint {
    yaml_serde::from_str(yaml).expect("an McpEndpoint fixture")
}

/// Parses a Deployment fixture.
pub(crate) fn deployment(yaml: &str) -> Deployment {
    yaml_serde::from_str(yaml).expect("a Deployment fixture")
}

/// [`DEPLOYMENT`] with `edit` applied to its JSON form.
pub(crate) fn deployment_with(edit: impl FnOnce(&mut serde_json::Value)) -> Deployment {
    let mut value = serde_json::to_value(deployment(DEPLOYMENT)).expect("to JSON");
    edit(&mut value);
    serde_json::from_value(value).expect("still a Deployment")
}

/// The names of `ep`.
pub(crate) fn names(ep: &McpEndpoint) -> Names {
    Names::of(ep).expect("fixtures have a name and namespace")
}

/// An owner reference to `ep`.
pub(crate) fn owner(ep: &McpEndpoint) -> OwnerReference {
    OwnerReference {
        api_version: tether_crds::API_VERSION.to_owned(),
        kind: tether_crds::KIND.to_owned(),
        name: ep.metadata.name.clone().unwrap_or_default(),
        uid: ep.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Merges JSON `patch` into `into` (objects key by key, anything else replaced).
pub(crate) fn merge(into: &mut serde_json::Value, patch: serde_json::Value) {
    match (into, patch) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

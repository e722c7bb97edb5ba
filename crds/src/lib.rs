//! `tether-crds`: the `McpEndpoint` custom resource (`mcp.tether.dev/v1alpha1`).
//!
//! This crate holds the one configuration schema of tether: the operator reconciles
//! `McpEndpoint` objects and the sidecar reads the same spec, from a ConfigMap file in
//! Kubernetes or from a manifest file locally ([`load_manifest`]).
//!
//! - [`spec`]: the serde + schemars types with their documented defaults and CEL rules;
//! - [`schema`]: schema pieces schemars does not produce for Kubernetes (list-map conditions,
//!   only the `format`s the API server recognises);
//! - [`crd_yaml`]: the CustomResourceDefinition as committed in `crds/` (`make crds`);
//! - [`origin`]: the syntax of web origins (allowlist entries and `Origin` headers);
//! - [`validate`]: checks that the schema cannot express (ports, paths, Origins, versions) and
//!   the bounds of sizes and durations the CEL rules mirror;
//! - [`keyring`]: the endpoint Secret's key ring (HMAC keys, the peer CA and certificate), key
//!   ids, and what a sidecar reports of it;
//! - [`reload`]: which fields a running sidecar reloads and which need new pods
//!   ([`PodSettings`]);
//! - `duration`: reading the duration fields without letting a value out of range panic;
//! - [`manifest`]: loading a YAML manifest, rejecting unknown fields and invalid values with a
//!   message that names the field;
//! - [`reference`](mod@reference): the configuration reference (`docs/reference/crd.md`)
//!   generated from the CRD's schema.

#[cfg(feature = "client")]
pub mod client;
mod duration;
pub mod keyring;
pub mod manifest;
pub mod origin;
pub mod reference;
pub mod reload;
pub mod schema;
pub mod spec;
pub mod validate;

pub use manifest::{ManifestError, load_manifest, parse_manifest};
pub use origin::Origin;
pub use reload::{POD_SETTINGS_ANNOTATION, PodSettings};
pub use spec::{
    AdminSpec, AuthBinding, AuthSpec, BufferSpec, DrainSpec, ListenSpec, McpEndpoint,
    McpEndpointSpec, McpEndpointStatus, Migration, OriginsSpec, PeerSpec, ProtocolVersion,
    Replication, SessionSpec, SidecarSpec, TargetRef, UpstreamSpec,
};
pub use validate::{FieldError, MAX_REVALIDATE, validate_spec};

/// Kubernetes duration (Go `time.ParseDuration` syntax), as used by every duration field.
pub use kube::core::Duration;

/// The API group of every tether resource.
pub const API_GROUP: &str = "mcp.tether.dev";
/// The `apiVersion` of [`McpEndpoint`] manifests.
pub const API_VERSION: &str = "mcp.tether.dev/v1alpha1";
/// The `kind` of [`McpEndpoint`] manifests.
pub const KIND: &str = "McpEndpoint";

/// Name of the injected sidecar container (a native sidecar init container), shared by the
/// operator, which injects it, and the sidecar's membership source, which reads its ports.
pub const SIDECAR_CONTAINER: &str = "tether-sidecar";
/// Name of the MCP port (`spec.listen.port`) of the endpoint's Services, `<endpoint>-mcp` and
/// `<endpoint>-peers`: what clients and the API server's service proxy name
/// (`<endpoint>-mcp:mcp`), and how the sidecars find a peer's MCP port in the EndpointSlices.
pub const MCP_PORT_NAME: &str = "mcp";
/// Name of the sidecar container's MCP port (`spec.listen.port`). Prefixed as its admin and peer
/// ports are, so that an MCP server's own container may name its port `mcp`.
pub const SIDECAR_MCP_PORT_NAME: &str = "tether-mcp";
/// Name of the sidecar container's admin port (`spec.admin.port`).
pub const ADMIN_PORT_NAME: &str = "tether-admin";
/// Name of the sidecar container's peer port (`spec.peer.port`).
pub const PEER_PORT_NAME: &str = "tether-peer";
/// Pod-template annotation naming the endpoint whose sidecar the operator injected: written by
/// the operator, read by the sidecar's membership, which admits only the pods that carry it.
pub const ENDPOINT_ANNOTATION: &str = "mcp.tether.dev/endpoint";

/// Name of the committed CRD file in `crds/` (`kubectl apply -f crds/`).
pub const CRD_FILE: &str = "mcpendpoints.mcp.tether.dev.yaml";

/// The `McpEndpoint` CustomResourceDefinition as YAML, exactly as committed in `crds/`
/// ([`CRD_FILE`]); `tether-operator crd` prints it and a test fails when the file differs.
///
/// # Errors
/// The YAML serializer's error (not expected for a derived CRD).
pub fn crd_yaml() -> Result<String, yaml_serde::Error> {
    use kube::CustomResourceExt;
    yaml_serde::to_string(&McpEndpoint::crd())
}

/// Path of the Helm chart's CRD template, from the repository root.
pub const CHART_CRD_TEMPLATE: &str = "charts/tether/templates/crd.yaml";

/// The Helm chart's CRD template ([`CHART_CRD_TEMPLATE`]): [`crd_yaml`] with the annotation
/// `helm.sh/resource-policy: keep` (`helm uninstall` leaves the CRD, and with it every
/// McpEndpoint), rendered only when the value `crds.install` is true. Helm never upgrades a
/// chart's `crds/` folder, hence a template; `make crds` writes it and a test
/// fails when it differs.
///
/// # Errors
/// The YAML serializer's error (not expected for a derived CRD).
pub fn crd_helm_template() -> Result<String, yaml_serde::Error> {
    use kube::CustomResourceExt;
    let mut crd = McpEndpoint::crd();
    crd.metadata.annotations =
        Some([("helm.sh/resource-policy".to_owned(), "keep".to_owned())].into());
    Ok(format!(
        "{{{{- if .Values.crds.install }}}}\n# Generated by `make crds` from the McpEndpoint types: crds/{CRD_FILE} plus the keep\n# annotation. Do not edit.\n{}{{{{- end }}}}\n",
        yaml_serde::to_string(&crd)?
    ))
}

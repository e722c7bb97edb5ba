//! `tether-crds`: the `McpEndpoint` custom resource (`mcp.tether.dev/v1alpha1`).
//!
//! This crate holds the one configuration schema of tether (DESIGN.md §2): the operator
//! reconciles `McpEndpoint` objects and the sidecar reads the same spec, from a ConfigMap file
//! in Kubernetes or from a manifest file locally ([`load_manifest`]).
//!
//! - [`spec`]: the serde + schemars types with their documented defaults and CEL rules;
//! - [`schema`]: schema pieces schemars does not produce for Kubernetes (list-map conditions);
//! - [`crd_yaml`]: the CustomResourceDefinition as committed in `crds/` (`make crds`);
//! - [`origin`]: the syntax of web origins (allowlist entries and `Origin` headers);
//! - [`validate`]: checks that the schema cannot express (ports, paths, Origins, versions);
//! - [`reload`]: which fields a running sidecar reloads and which need new pods
//!   ([`PodSettings`]);
//! - [`manifest`]: loading a YAML manifest, rejecting unknown fields and invalid values with a
//!   message that names the field.

pub mod manifest;
pub mod origin;
pub mod reload;
pub mod schema;
pub mod spec;
pub mod validate;

pub use manifest::{ManifestError, load_manifest, parse_manifest};
pub use origin::Origin;
pub use reload::{POD_SETTINGS_ANNOTATION, PodSettings};
pub use spec::{
    AdminSpec, BufferSpec, DrainSpec, ListenSpec, McpEndpoint, McpEndpointSpec, McpEndpointStatus,
    Migration, OriginsSpec, PeerSpec, ProtocolVersion, SessionSpec, SidecarSpec, TargetRef,
    UpstreamSpec,
};
pub use validate::{FieldError, validate_spec};

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
/// Name of the sidecar container's MCP port (`spec.listen.port`); Services target it by name.
pub const MCP_PORT_NAME: &str = "mcp";
/// Name of the sidecar container's admin port (`spec.admin.port`).
pub const ADMIN_PORT_NAME: &str = "tether-admin";
/// Name of the sidecar container's peer port (`spec.peer.port`).
pub const PEER_PORT_NAME: &str = "tether-peer";

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

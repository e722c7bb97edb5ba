//! `tether-crds`: the `McpEndpoint` custom resource (`mcp.tether.dev/v1alpha1`).
//!
//! This crate holds the one configuration schema of tether (DESIGN.md §2): the operator
//! reconciles `McpEndpoint` objects and the sidecar reads the same spec, from a ConfigMap file
//! in Kubernetes or from a manifest file locally ([`load_manifest`]).
//!
//! - [`spec`]: the serde + schemars types with their documented defaults;
//! - [`origin`]: the syntax of web origins (allowlist entries and `Origin` headers);
//! - [`validate`]: checks that the schema cannot express (ports, paths, Origins, versions);
//! - [`manifest`]: loading a YAML manifest, rejecting unknown fields and invalid values with a
//!   message that names the field.

pub mod manifest;
pub mod origin;
pub mod spec;
pub mod validate;

pub use manifest::{ManifestError, load_manifest, parse_manifest};
pub use origin::Origin;
pub use spec::{
    AdminSpec, BufferSpec, DrainSpec, ListenSpec, McpEndpoint, McpEndpointSpec, Migration,
    OriginsSpec, PeerSpec, ProtocolVersion, SessionSpec, TargetRef, UpstreamSpec,
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

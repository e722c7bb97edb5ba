//! Loading an `McpEndpoint` manifest (YAML) as the sidecar does at start-up.
//!
//! The manifest has the shape of the Kubernetes object (`apiVersion`, `kind`, `metadata`,
//! `spec`). Unknown fields anywhere, a wrong `apiVersion`/`kind`, values of the wrong type and
//! values that fail [`validate_spec`] are errors whose message names the field by its path.

use std::path::{Path, PathBuf};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::spec::{McpEndpoint, McpEndpointSpec};
use crate::validate::{FieldError, validate_spec};
use crate::{API_VERSION, KIND};

/// Why a manifest could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file could not be read.
    #[error("cannot read McpEndpoint manifest {path}: {source}")]
    Read {
        /// The manifest's path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The YAML is malformed or a value has the wrong type (the message names the field and
    /// its line).
    #[error("invalid McpEndpoint manifest: {0}")]
    Syntax(String),
    /// Fields the schema does not know (typos are not silently ignored).
    #[error("invalid McpEndpoint manifest: unknown field(s) {}", .0.join(", "))]
    UnknownFields(Vec<String>),
    /// Values the schema accepts but tether does not.
    #[error("invalid McpEndpoint manifest: {}", join_errors(.0))]
    Invalid(Vec<FieldError>),
}

fn join_errors(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The manifest document as written by users and the operator.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: McpEndpointSpec,
}

/// Reads and validates the manifest at `path`.
///
/// # Errors
/// [`ManifestError`] when the file cannot be read or the manifest is invalid.
pub fn load_manifest(path: &Path) -> Result<McpEndpoint, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_manifest(&text)
}

/// Parses and validates a manifest given as YAML text.
///
/// # Errors
/// [`ManifestError::Syntax`], [`ManifestError::UnknownFields`] or [`ManifestError::Invalid`].
pub fn parse_manifest(text: &str) -> Result<McpEndpoint, ManifestError> {
    let mut unknown = Vec::new();
    let deserializer = yaml_serde::Deserializer::from_str(text);
    let doc: Document = serde_ignored::deserialize(deserializer, |path| {
        unknown.push(path.to_string());
    })
    .map_err(|e| ManifestError::Syntax(e.to_string()))?;
    if !unknown.is_empty() {
        return Err(ManifestError::UnknownFields(unknown));
    }
    let mut errors = Vec::new();
    if doc.api_version != API_VERSION {
        errors.push(FieldError {
            path: "apiVersion".into(),
            message: format!("expected {API_VERSION:?}, got {:?}", doc.api_version),
        });
    }
    if doc.kind != KIND {
        errors.push(FieldError {
            path: "kind".into(),
            message: format!("expected {KIND:?}, got {:?}", doc.kind),
        });
    }
    if doc.metadata.name.as_deref().is_none_or(str::is_empty) {
        errors.push(FieldError {
            path: "metadata.name".into(),
            message: "must not be empty".into(),
        });
    }
    errors.extend(validate_spec(&doc.spec));
    if !errors.is_empty() {
        return Err(ManifestError::Invalid(errors));
    }
    Ok(McpEndpoint {
        metadata: doc.metadata,
        spec: doc.spec,
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Migration;

    /// A full `weather` manifest, in the shape the docs show (`docs/guide/local.md#one-pod`,
    /// which also sets `peer`).
    pub(crate) const WEATHER: &str = r#"
apiVersion: mcp.tether.dev/v1alpha1
kind: McpEndpoint
metadata: {name: weather, namespace: default}
spec:
  targetRef: {kind: Deployment, name: weather}
  upstream: {port: 3000, path: /mcp}
  listen: {port: 8080, path: /mcp}
  admin: {port: 9901}
  origins: {allow: ["https://app.example.com"], allowMissing: true}
  protocolVersions: ["2025-03-26", "2025-06-18", "2025-11-25"]
  buffer: {maxEvents: 1024, maxBytes: 4194304, ttl: 10m}
  session: {idleTimeout: 30m, migration: Replay}
  drain: {timeout: 60s}
"#;

    #[test]
    fn the_pinned_manifest_loads() {
        let ep = parse_manifest(WEATHER).expect("pinned manifest loads");
        assert_eq!(ep.metadata.name.as_deref(), Some("weather"));
        assert_eq!(ep.metadata.namespace.as_deref(), Some("default"));
        let s = &ep.spec;
        assert_eq!(s.upstream.port, 3000);
        assert_eq!(s.listen.path, "/mcp");
        assert_eq!(s.admin.port, 9901);
        assert_eq!(s.origins.allow, vec!["https://app.example.com".to_owned()]);
        assert!(s.origins.allow_missing);
        assert_eq!(s.protocol_versions.len(), 3);
        assert_eq!(s.buffer.max_events, 1024);
        assert_eq!(s.buffer.max_bytes, 4_194_304);
        assert_eq!(
            std::time::Duration::from(s.buffer.ttl),
            std::time::Duration::from_secs(600)
        );
        assert_eq!(
            std::time::Duration::from(s.session.idle_timeout),
            std::time::Duration::from_secs(1800)
        );
        assert_eq!(s.session.migration, Migration::Replay);
        assert_eq!(
            std::time::Duration::from(s.drain.timeout),
            std::time::Duration::from_secs(60)
        );
        assert_eq!(
            std::time::Duration::from(s.drain.shutdown_delay),
            std::time::Duration::from_secs(5)
        );
    }

    #[test]
    fn a_minimal_manifest_takes_the_defaults() {
        let ep = parse_manifest(
            "apiVersion: mcp.tether.dev/v1alpha1\nkind: McpEndpoint\nmetadata: {name: m}\n\
             spec: {targetRef: {kind: Deployment, name: m}}\n",
        )
        .expect("minimal manifest loads");
        assert_eq!(ep.spec.listen.port, 8080);
        assert_eq!(ep.spec.upstream.port, 3000);
        assert_eq!(ep.spec.peer.port, 9902);
        assert_eq!(ep.spec.protocol_versions.len(), 4);
        assert_eq!(ep.spec.buffer.max_events, 1024);
        assert!(ep.spec.origins.allow.is_empty());
    }

    #[test]
    fn unknown_fields_are_named_with_their_path() {
        let text = WEATHER.replace("maxEvents: 1024", "maxEvent: 1024");
        let err = parse_manifest(&text).unwrap_err().to_string();
        assert!(err.contains("spec.buffer.maxEvent"), "{err}");
        let text = WEATHER.replace("kind: McpEndpoint\n", "kind: McpEndpoint\nextra: 1\n");
        let err = parse_manifest(&text).unwrap_err().to_string();
        assert!(err.contains("extra"), "{err}");
    }

    #[test]
    fn invalid_values_are_named_with_their_path() {
        let cases = [
            ("maxEvents: 1024", "maxEvents: 0", "spec.buffer.maxEvents"),
            (
                "maxEvents: 1024",
                "maxEvents: 100001",
                "spec.buffer.maxEvents",
            ),
            (
                "maxBytes: 4194304",
                "maxBytes: 67108865",
                "spec.buffer.maxBytes",
            ),
            ("ttl: 10m", "ttl: 0s", "spec.buffer.ttl"),
            ("ttl: 10m", "ttl: 24h1s", "spec.buffer.ttl"),
            (
                "idleTimeout: 30m",
                "idleTimeout: 25h",
                "spec.session.idleTimeout",
            ),
            ("ttl: 10m", "ttl: ten minutes", "ttl"),
            (
                "idleTimeout: 30m",
                "idleTimeout: -5m",
                "spec.session.idleTimeout",
            ),
            ("timeout: 60s", "timeout: 2h", "spec.drain.timeout"),
            (
                "path: /mcp}\n  listen",
                "path: /mcp, host: \"user@evil\"}\n  listen",
                "spec.upstream.host",
            ),
            (
                "admin: {port: 9901}",
                "admin: {port: 9901}\n  auth: {forwardHeaders: [authorization, X-Api-Key]}",
                "spec.auth.forwardHeaders[1]",
            ),
            (
                "\"2025-03-26\", ",
                "\"1999-01-01\", ",
                "spec.protocolVersions[0]",
            ),
            (
                "https://app.example.com",
                "app.example.com",
                "spec.origins.allow[0]",
            ),
            ("migration: Replay", "migration: Sometimes", "migration"),
            (
                "admin: {port: 9901}",
                "admin: {port: 8080}",
                "spec.admin.port",
            ),
            (
                "admin: {port: 9901}",
                "admin: {port: 9901}\n  peer: {port: 9901}",
                "spec.peer.port",
            ),
            (
                "path: /mcp}\n  listen",
                "path: mcp}\n  listen",
                "spec.upstream.path",
            ),
            (
                "kind: Deployment",
                "kind: StatefulSet",
                "spec.targetRef.kind",
            ),
            ("port: 3000", "port: 70000", "port"),
            ("v1alpha1", "v1", "apiVersion"),
        ];
        for (from, to, field) in cases {
            assert!(WEATHER.contains(from), "fixture lacks {from:?}");
            let text = WEATHER.replacen(from, to, 1);
            let err = parse_manifest(&text)
                .expect_err(&format!("{to:?} must be rejected"))
                .to_string();
            assert!(err.contains(field), "{to:?}: error {err:?} lacks {field:?}");
        }
    }
}

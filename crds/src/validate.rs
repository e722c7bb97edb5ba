//! Semantic checks of an [`McpEndpointSpec`] that its schema cannot express.
//!
//! Each failure is a [`FieldError`] naming the field by its manifest path (for example
//! `spec.buffer.maxEvents`), so start-up errors and (later) status conditions can point at it.

use crate::origin::Origin;
use crate::spec::{McpEndpointSpec, ProtocolVersion};

/// Longest drain timeout accepted: one hour. A pod that drains longer than that blocks rollouts.
pub const MAX_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Longest `spec.auth.revalidate` accepted: one hour. Longer, a revoked credential would keep
/// being served from memory for too long.
pub const MAX_REVALIDATE: std::time::Duration = std::time::Duration::from_secs(3600);

/// One invalid field of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct FieldError {
    /// Manifest path of the field, e.g. `spec.origins.allow[1]`.
    pub path: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl FieldError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// Checks every field of `spec`; returns all failures (empty when the spec is valid).
pub fn validate_spec(spec: &McpEndpointSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if spec.target_ref.kind != "Deployment" {
        errors.push(FieldError::new(
            "spec.targetRef.kind",
            format!(
                "unsupported kind {:?}; only \"Deployment\" is supported",
                spec.target_ref.kind
            ),
        ));
    }
    if spec.target_ref.name.is_empty() {
        errors.push(FieldError::new("spec.targetRef.name", "must not be empty"));
    }
    check_port(&mut errors, "spec.upstream.port", spec.upstream.port);
    check_port(&mut errors, "spec.listen.port", spec.listen.port);
    check_port(&mut errors, "spec.admin.port", spec.admin.port);
    check_port(&mut errors, "spec.peer.port", spec.peer.port);
    if spec.listen.port == spec.admin.port {
        errors.push(FieldError::new(
            "spec.admin.port",
            format!("must differ from spec.listen.port ({})", spec.listen.port),
        ));
    }
    if spec.peer.port == spec.listen.port || spec.peer.port == spec.admin.port {
        errors.push(FieldError::new(
            "spec.peer.port",
            format!(
                "must differ from spec.listen.port ({}) and spec.admin.port ({})",
                spec.listen.port, spec.admin.port
            ),
        ));
    }
    check_path(&mut errors, "spec.upstream.path", &spec.upstream.path);
    if let Some(host) = &spec.upstream.host
        && (host.is_empty()
            || host.len() > 261
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b)))
    {
        errors.push(FieldError::new(
            "spec.upstream.host",
            "must be a host name or IP address with an optional port, like \"localhost:3000\"",
        ));
    }
    check_path(&mut errors, "spec.listen.path", &spec.listen.path);
    for (i, origin) in spec.origins.allow.iter().enumerate() {
        if let Err(why) = Origin::parse(origin) {
            errors.push(FieldError::new(format!("spec.origins.allow[{i}]"), why));
        }
    }
    check_versions(&mut errors, &spec.protocol_versions);
    if spec.buffer.max_events == 0 {
        errors.push(FieldError::new(
            "spec.buffer.maxEvents",
            "must be at least 1",
        ));
    }
    if spec.buffer.max_bytes == 0 {
        errors.push(FieldError::new(
            "spec.buffer.maxBytes",
            "must be at least 1",
        ));
    }
    check_positive(&mut errors, "spec.buffer.ttl", &spec.buffer.ttl);
    check_positive(
        &mut errors,
        "spec.session.idleTimeout",
        &spec.session.idle_timeout,
    );
    for (i, name) in spec.auth.forward_headers.iter().enumerate() {
        let token = !name.is_empty()
            && name.len() <= 64
            && name.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&*+.^_|~-".contains(&b)
            });
        if !token {
            errors.push(FieldError::new(
                format!("spec.auth.forwardHeaders[{i}]"),
                "must be a lowercase HTTP header name of at most 64 characters",
            ));
        }
    }
    let revalidate: std::time::Duration = spec.auth.revalidate.into();
    if revalidate > MAX_REVALIDATE {
        errors.push(FieldError::new(
            "spec.auth.revalidate",
            format!("must be at most {}s", MAX_REVALIDATE.as_secs()),
        ));
    }
    if spec.auth.forward_headers.len() > 16 {
        errors.push(FieldError::new(
            "spec.auth.forwardHeaders",
            "must list at most 16 headers",
        ));
    }
    check_positive(&mut errors, "spec.drain.timeout", &spec.drain.timeout);
    if spec.drain.timeout > MAX_DRAIN_TIMEOUT {
        errors.push(FieldError::new(
            "spec.drain.timeout",
            format!("must be at most {}s", MAX_DRAIN_TIMEOUT.as_secs()),
        ));
    }
    errors
}

fn check_port(errors: &mut Vec<FieldError>, path: &str, port: u16) {
    if port == 0 {
        errors.push(FieldError::new(path, "must be between 1 and 65535"));
    }
}

fn check_path(errors: &mut Vec<FieldError>, path: &str, value: &str) {
    let valid = value.starts_with('/')
        && value
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'?' && b != b'#');
    if !valid {
        errors.push(FieldError::new(
            path,
            format!(
                "{value:?} must be an absolute URL path without query or fragment, like \"/mcp\""
            ),
        ));
    }
}

fn check_positive(errors: &mut Vec<FieldError>, path: &str, value: &kube::core::Duration) {
    if value.is_negative() || std::time::Duration::from(*value).is_zero() {
        errors.push(FieldError::new(
            path,
            format!("must be a positive duration such as \"30s\" (got {value})"),
        ));
    }
}

fn check_versions(errors: &mut Vec<FieldError>, versions: &[String]) {
    if versions.is_empty() {
        errors.push(FieldError::new(
            "spec.protocolVersions",
            "must list at least one version",
        ));
    }
    for (i, v) in versions.iter().enumerate() {
        if ProtocolVersion::parse(v).is_none() {
            let known: Vec<_> = ProtocolVersion::ALL.iter().map(|v| v.as_str()).collect();
            errors.push(FieldError::new(
                format!("spec.protocolVersions[{i}]"),
                format!("unknown version {v:?}; known: {}", known.join(", ")),
            ));
        } else if versions[..i].contains(v) {
            errors.push(FieldError::new(
                format!("spec.protocolVersions[{i}]"),
                format!("duplicate version {v:?}"),
            ));
        }
    }
}

//! Semantic checks of an [`McpEndpointSpec`] that its schema cannot express.
//!
//! Each failure is a [`FieldError`] naming the field by its manifest path (for example
//! `spec.buffer.maxEvents`), so start-up errors and (later) status conditions can point at it.

use crate::origin::Origin;
use crate::spec::{McpEndpointSpec, ProtocolVersion};

/// Longest drain timeout accepted: one hour. A pod that drains longer than that blocks rollouts.
pub const MAX_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Longest `spec.drain.shutdownDelay` accepted: five minutes, far beyond what endpoint
/// propagation takes; longer, a pod would hold its grace period for nothing.
pub const MAX_SHUTDOWN_DELAY: std::time::Duration = std::time::Duration::from_secs(300);

/// Longest `spec.auth.revalidate` accepted: one hour. Longer, a revoked credential would keep
/// being served from memory for too long.
pub const MAX_REVALIDATE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Most events one stream's replay buffer may keep (`spec.buffer.maxEvents`): 100,000. Each
/// event costs about 100 bytes of bookkeeping beyond its data, which no byte bound counts, so
/// this caps that at about 10 MB per stream; a tool call that streams 50,000 progress
/// notifications is still replayed whole with room to spare.
pub const MAX_BUFFER_EVENTS: u32 = 100_000;

/// Most bytes of event data one stream's replay buffer may keep (`spec.buffer.maxBytes`):
/// 64 MiB. The sidecar also accepts an upstream response body of that size, and a session's
/// share of the pod's buffer budget (`--max-session-buffer-bytes`) is 32 MiB by default.
pub const MAX_BUFFER_BYTES: u64 = 64 * 1024 * 1024;

/// Longest `spec.buffer.ttl` accepted: 24 hours. A client gone longer than a day does not
/// resume its stream; the events it missed would only hold the pod's memory.
pub const MAX_BUFFER_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Longest `spec.session.idleTimeout` accepted: 24 hours. An idle session holds its journal,
/// retry state and replay buffers on the pod until it ends.
pub const MAX_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

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
    if !(1..=MAX_BUFFER_EVENTS).contains(&spec.buffer.max_events) {
        errors.push(FieldError::new(
            "spec.buffer.maxEvents",
            format!(
                "must be between 1 and {MAX_BUFFER_EVENTS} (got {})",
                spec.buffer.max_events
            ),
        ));
    }
    if !(1..=MAX_BUFFER_BYTES).contains(&spec.buffer.max_bytes) {
        errors.push(FieldError::new(
            "spec.buffer.maxBytes",
            format!(
                "must be between 1 and {MAX_BUFFER_BYTES} (64 MiB) (got {})",
                spec.buffer.max_bytes
            ),
        ));
    }
    check_positive_at_most(
        &mut errors,
        "spec.buffer.ttl",
        &spec.buffer.ttl,
        MAX_BUFFER_TTL,
    );
    check_positive_at_most(
        &mut errors,
        "spec.session.idleTimeout",
        &spec.session.idle_timeout,
        MAX_IDLE_TIMEOUT,
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
    // `0s` (no revalidation) is allowed.
    check_at_most(
        &mut errors,
        "spec.auth.revalidate",
        &spec.auth.revalidate,
        MAX_REVALIDATE,
    );
    if spec.auth.forward_headers.len() > 16 {
        errors.push(FieldError::new(
            "spec.auth.forwardHeaders",
            "must list at most 16 headers",
        ));
    }
    check_positive_at_most(
        &mut errors,
        "spec.drain.timeout",
        &spec.drain.timeout,
        MAX_DRAIN_TIMEOUT,
    );
    // `0s` (close the listeners once the drain ends) is allowed.
    check_at_most(
        &mut errors,
        "spec.drain.shutdownDelay",
        &spec.drain.shutdown_delay,
        MAX_SHUTDOWN_DELAY,
    );
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

/// Checks that the duration at `path` is above zero and at most `max`.
fn check_positive_at_most(
    errors: &mut Vec<FieldError>,
    path: &str,
    value: &kube::core::Duration,
    max: std::time::Duration,
) {
    if value.is_negative() || std::time::Duration::from(*value).is_zero() || *value > max {
        errors.push(FieldError::new(
            path,
            format!(
                "must be a positive duration of at most {} (got {value})",
                go_duration(max)
            ),
        ));
    }
}

/// A duration from `0s` to `max`; a negative one is refused (its sign would be lost).
fn check_at_most(
    errors: &mut Vec<FieldError>,
    path: &str,
    value: &kube::core::Duration,
    max: std::time::Duration,
) {
    if value.is_negative() || *value > max {
        errors.push(FieldError::new(
            path,
            format!(
                "must be a duration between 0s and {} (got {value})",
                go_duration(max)
            ),
        ));
    }
}

/// `duration` in whole seconds as a Kubernetes duration is written, e.g. `1h`, `1h30m`, `90s`
/// → `1m30s`; the sub-second part is left out (every bound here is whole seconds).
fn go_duration(duration: std::time::Duration) -> String {
    let secs = duration.as_secs();
    let (hours, minutes, seconds) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut text = String::new();
    if hours > 0 {
        text += &format!("{hours}h");
    }
    if minutes > 0 {
        text += &format!("{minutes}m");
    }
    if seconds > 0 || text.is_empty() {
        text += &format!("{seconds}s");
    }
    text
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{McpEndpointSpec, TargetRef};

    fn spec() -> McpEndpointSpec {
        serde_json::from_value(serde_json::json!({
            "targetRef": TargetRef { kind: "Deployment".into(), name: "weather".into() },
        }))
        .unwrap()
    }

    fn duration(text: &str) -> kube::core::Duration {
        crate::duration::parse(text).unwrap()
    }

    #[test]
    fn bound_errors_name_the_field_the_limit_and_the_value() {
        let mut s = spec();
        s.buffer.max_events = MAX_BUFFER_EVENTS + 1;
        s.buffer.max_bytes = MAX_BUFFER_BYTES + 1;
        s.buffer.ttl = duration("24h1s");
        s.session.idle_timeout = duration("0s");
        s.drain.timeout = duration("2h");
        s.auth.revalidate = duration("-1s");
        s.drain.shutdown_delay = duration("5m1s");
        let errors: Vec<String> = validate_spec(&s).iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                "spec.buffer.maxEvents: must be between 1 and 100000 (got 100001)",
                "spec.buffer.maxBytes: must be between 1 and 67108864 (64 MiB) (got 67108865)",
                "spec.buffer.ttl: must be a positive duration of at most 24h (got 86401s)",
                "spec.session.idleTimeout: must be a positive duration of at most 24h (got 0ns)",
                "spec.auth.revalidate: must be a duration between 0s and 1h (got -1s)",
                "spec.drain.timeout: must be a positive duration of at most 1h (got 7200s)",
                "spec.drain.shutdownDelay: must be a duration between 0s and 5m (got 301s)",
            ]
        );
    }

    #[test]
    fn bounds_are_written_as_kubernetes_durations() {
        for (secs, text) in [
            (0, "0s"),
            (59, "59s"),
            (90, "1m30s"),
            (3600, "1h"),
            (86_461, "24h1m1s"),
        ] {
            assert_eq!(go_duration(std::time::Duration::from_secs(secs)), text);
        }
    }
}

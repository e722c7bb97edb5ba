//! The sidecar injection: the server-side apply body for the target Deployment, holding only
//! what the operator owns in the pod template (listed in `docs/design/operator.md`), so it
//! merges with the user's fields and an empty apply with the same field manager removes exactly
//! it.

use serde_json::{Value, json};
use tether_crds::{
    ADMIN_PORT_NAME, McpEndpoint, PEER_PORT_NAME, POD_SETTINGS_ANNOTATION, SIDECAR_MCP_PORT_NAME,
};

use super::{Defaults, GRACE_MARGIN_SECS};
use crate::fields;
use crate::names::{
    CONFIG_DIR, CONFIG_KEY, CONFIG_VOLUME, DRAIN_SOCKET, DRAINED_PATH, INJECTED_ANNOTATION, Names,
    RUN_DIR, RUN_VOLUME, SECRET_DIR, SECRET_VOLUME, SIDECAR_BINARY, SIDECAR_CONTAINER, TOKEN_DIR,
    TOKEN_VOLUME,
};
use crate::validate::Target;

/// UID and GID the sidecar runs as by default (non-root, as the distroless `nonroot` user).
pub const SIDECAR_USER: i64 = 65532;
/// The label a Deployment's ReplicaSet puts on its pods: their revision, which each sidecar
/// reports to its peers (`TETHER_REVISION`, through the downward API).
pub(crate) const REVISION_LABEL: &str = "pod-template-hash";
/// `terminationGracePeriodSeconds` the API server gives a pod template that sets none.
pub(crate) const DEFAULT_GRACE_SECS: i64 = 30;
/// Lifetime of the sidecar's projected ServiceAccount token, in seconds (the kubelet renews
/// it before it expires; 3,607 s is the kubelet's own choice for automounted tokens).
const TOKEN_SECS: i64 = 3607;

/// The Deployment apply body for `ep` on `target`; `own_service_account` when the pods get the
/// sidecar's dedicated ServiceAccount; `secret` names the key-ring Secret the pods mount (whole:
/// the sidecar reads the ring's files there and again when the kubelet updates them).
///
/// Fields of the user's pod template are claimed only when no other field manager manages
/// them ([`fields::managers`]): the grace period only when the template's is too short, the
/// MCP server's `preStop` only when the user's manifest does not carry it. A field someone else
/// manages and tether must change makes the apply conflict (it is never forced).
pub(crate) fn deployment(
    ep: &McpEndpoint,
    names: &Names,
    target: &Target<'_>,
    defaults: &Defaults,
    own_service_account: bool,
    secret: &str,
) -> Value {
    let mut pod_spec = json!({
        "initContainers": [sidecar(ep, names, defaults)],
        "volumes": [
            {"name": CONFIG_VOLUME, "configMap": {"name": names.config()}},
            {"name": SECRET_VOLUME, "secret": {"secretName": secret}},
            token_volume(),
            {"name": RUN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ],
    });
    if let Some(seconds) = grace_period(ep, names, target) {
        pod_spec["terminationGracePeriodSeconds"] = json!(seconds);
    }
    if fields::tether_alone_manages_pre_stop(names, target.deployment, &target.upstream_container) {
        pod_spec["containers"] = json!([{
            "name": target.upstream_container,
            "lifecycle": {"preStop": server_pre_stop(ep)},
        }]);
    }
    if own_service_account {
        pod_spec["serviceAccountName"] = json!(names.sidecar_rbac());
        pod_spec["serviceAccount"] = json!(names.sidecar_rbac());
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": target.deployment.metadata.name,
            "namespace": names.namespace,
        },
        "spec": {"template": {
            "metadata": {
                "labels": {INJECTED_ANNOTATION: names.endpoint},
                "annotations": {
                    INJECTED_ANNOTATION: names.endpoint,
                    POD_SETTINGS_ANNOTATION: ep.spec.pod_settings().annotation(),
                },
            },
            "spec": pod_spec,
        }},
    })
}

/// Seconds the pods need to drain: the longer of `drain.timeout` and `drain.shutdownDelay`
/// (the sidecar's listeners stay open that long after the drain began), rounded up, +
/// [`GRACE_MARGIN_SECS`].
pub(crate) fn needed_grace(ep: &McpEndpoint) -> i64 {
    let drain = &ep.spec.drain;
    let longest = std::time::Duration::from(drain.timeout)
        .max(std::time::Duration::from(drain.shutdown_delay));
    longest.as_secs_f64().ceil() as i64 + GRACE_MARGIN_SECS
}

/// The `terminationGracePeriodSeconds` to apply, if any. Another manager's value is left alone
/// when it covers the drain (and conflicts when it does not); without one, the operator sets
/// what the drain needs when the API server's default would be shorter — following
/// `drain.timeout` down as well as up.
pub(crate) fn grace_period(ep: &McpEndpoint, names: &Names, target: &Target<'_>) -> Option<i64> {
    let needed = needed_grace(ep);
    let path = fields::pod_spec_field("terminationGracePeriodSeconds");
    let managers = fields::managers(&target.deployment.metadata, &path);
    let others = managers.iter().any(|m| !fields::is_ours(m, names));
    let without_us = if others || managers.is_empty() {
        target
            .pod
            .termination_grace_period_seconds
            .unwrap_or(DEFAULT_GRACE_SECS)
    } else {
        DEFAULT_GRACE_SECS
    };
    (needed > without_us).then_some(needed)
}

/// Whether the field at `path` (a server-side apply field path, as a conflict names it:
/// `.spec.template.spec.initContainers[name="tether-sidecar"].image`) lies in what only tether
/// puts into the pod template — the sidecar container, its volumes, its label and annotations.
/// Someone else's value there (a hand edit) is overwritten, as on the endpoint's own children;
/// a conflict anywhere else is the user's to resolve.
pub(crate) fn is_own_field(path: &str) -> bool {
    let spec = ".spec.template.spec";
    let meta = ".spec.template.metadata";
    let parts = [
        format!("{spec}.initContainers[name=\"{SIDECAR_CONTAINER}\"]"),
        format!("{spec}.volumes[name=\"{CONFIG_VOLUME}\"]"),
        format!("{spec}.volumes[name=\"{SECRET_VOLUME}\"]"),
        format!("{spec}.volumes[name=\"{TOKEN_VOLUME}\"]"),
        format!("{spec}.volumes[name=\"{RUN_VOLUME}\"]"),
        format!("{meta}.labels.{INJECTED_ANNOTATION}"),
        format!("{meta}.annotations.{INJECTED_ANNOTATION}"),
        format!("{meta}.annotations.{POD_SETTINGS_ANNOTATION}"),
    ];
    parts.iter().any(|part| {
        path.strip_prefix(part.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
    })
}

/// The MCP server's `preStop`: wait on the admin port until the pod's drain has ended, so the
/// server gets SIGTERM only once its requests in flight are done or handed off.
pub(crate) fn server_pre_stop(ep: &McpEndpoint) -> Value {
    json!({"httpGet": {"path": DRAINED_PATH, "port": ep.spec.admin.port}})
}

/// The sidecar's `preStop`: drain through the drain socket and wait until done.
fn sidecar_pre_stop() -> Value {
    json!({"exec": {"command": [SIDECAR_BINARY, "drain"]}})
}

/// A ServiceAccount token, the cluster CA and the namespace, for the sidecar's own API client
/// (the EndpointSlice watch), mounted into the sidecar only: it works with
/// `automountServiceAccountToken: false`, and the API server's automount skips a container
/// that already mounts this path.
fn token_volume() -> Value {
    json!({"name": TOKEN_VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_SECS}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}})
}

/// The sidecar's security context: non-root, read-only, no privilege escalation, no
/// capabilities, the runtime's default seccomp profile (Pod Security `restricted`); a fixed
/// user and group only when the operator is configured with one (platforms such as OpenShift
/// assign their own).
fn security_context(defaults: &Defaults) -> Value {
    let mut context = json!({
        "runAsNonRoot": true,
        "readOnlyRootFilesystem": true,
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    });
    if let Some(user) = defaults.sidecar_user {
        context["runAsUser"] = json!(user);
        context["runAsGroup"] = json!(user);
    }
    context
}

fn sidecar(ep: &McpEndpoint, names: &Names, defaults: &Defaults) -> Value {
    let spec = &ep.spec;
    let image = spec
        .sidecar
        .image
        .clone()
        .unwrap_or_else(|| defaults.sidecar_image.clone());
    let resources = spec
        .sidecar
        .resources
        .clone()
        .unwrap_or_else(|| defaults.sidecar_resources.clone());
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    let probe = |path: &str| json!({"httpGet": {"path": path, "port": spec.admin.port}});
    json!({
        "name": SIDECAR_CONTAINER,
        "image": image,
        "restartPolicy": "Always",
        "env": [
            {"name": "TETHER_ENDPOINT", "value": format!("{CONFIG_DIR}/{CONFIG_KEY}")},
            {"name": "TETHER_SECRET_DIR", "value": SECRET_DIR},
            // Membership: the peer Service's EndpointSlices, and the revision this pod reports
            // to its peers (the newest one gets new sessions and handoffs).
            {"name": "TETHER_PEER_SERVICE", "value": names.peer_service()},
            {"name": "TETHER_REVISION", "valueFrom": field(&format!("metadata.labels['{REVISION_LABEL}']"))},
            {"name": "TETHER_LOG_FORMAT", "value": "json"},
            {"name": "TETHER_DRAIN_SOCKET", "value": DRAIN_SOCKET},
            {"name": "POD_IP", "valueFrom": field("status.podIP")},
            {"name": "POD_UID", "valueFrom": field("metadata.uid")},
            {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
            {"name": "TETHER_POD_SETTINGS", "valueFrom": field(&format!("metadata.annotations['{POD_SETTINGS_ANNOTATION}']"))},
            // The pod's byte budget defaults to half of it (`--pod-retained-bytes`); without a
            // limit Kubernetes gives the node's allocatable memory.
            {"name": "TETHER_MEMORY_LIMIT", "valueFrom": {"resourceFieldRef": {"containerName": SIDECAR_CONTAINER, "resource": "limits.memory"}}},
        ],
        "ports": [
            {"name": SIDECAR_MCP_PORT_NAME, "containerPort": spec.listen.port, "protocol": "TCP"},
            {"name": ADMIN_PORT_NAME, "containerPort": spec.admin.port, "protocol": "TCP"},
            {"name": PEER_PORT_NAME, "containerPort": spec.peer.port, "protocol": "TCP"},
        ],
        "readinessProbe": probe("/readyz"),
        "livenessProbe": probe("/healthz"),
        "lifecycle": {"preStop": sidecar_pre_stop()},
        "resources": resources,
        "volumeMounts": [
            {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": true},
            {"name": SECRET_VOLUME, "mountPath": SECRET_DIR, "readOnly": true},
            {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": true},
            {"name": RUN_VOLUME, "mountPath": RUN_DIR},
        ],
        "securityContext": security_context(defaults),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_tether_alone_puts_into_the_template_is_its_own() {
        for own in [
            r#".spec.template.spec.initContainers[name="tether-sidecar"].image"#,
            r#".spec.template.spec.initContainers[name="tether-sidecar"].env[name="POD_IP"].valueFrom"#,
            r#".spec.template.spec.volumes[name="tether-token"]"#,
            ".spec.template.metadata.annotations.mcp.tether.dev/pod-settings",
            ".spec.template.metadata.labels.mcp.tether.dev/endpoint",
        ] {
            assert!(is_own_field(own), "{own}");
        }
        for theirs in [
            ".spec.template.spec.terminationGracePeriodSeconds",
            ".spec.template.spec.serviceAccountName",
            r#".spec.template.spec.containers[name="server"].lifecycle.preStop"#,
            r#".spec.template.spec.initContainers[name="tether-sidecar-2"].image"#,
            ".spec.template.metadata.annotations.mcp.tether.dev/endpoint-owner",
        ] {
            assert!(!is_own_field(theirs), "{theirs}");
        }
    }
}

//! The sidecar injection: the server-side apply body for the target Deployment, holding only
//! what the operator owns in the pod template (listed in `docs/design/operator.md`), so it
//! merges with the user's fields and an empty apply with the same field manager removes exactly
//! it.

use serde_json::{Value, json};
use tether_crds::{
    ADMIN_PORT_NAME, MCP_PORT_NAME, McpEndpoint, PEER_PORT_NAME, POD_SETTINGS_ANNOTATION,
};

use super::{Defaults, GRACE_MARGIN_SECS};
use crate::names::{
    CONFIG_DIR, CONFIG_KEY, CONFIG_VOLUME, DRAIN_PATH, INJECTED_ANNOTATION, Names, SECRET_DIR,
    SECRET_KEY, SECRET_VOLUME, SIDECAR_CONTAINER,
};
use crate::validate::Target;

/// UID and GID the sidecar runs as (non-root, as the distroless `nonroot` user).
pub const SIDECAR_USER: i64 = 65532;

/// The Deployment apply body for `ep` on `target`; `own_service_account` when the pods get the
/// sidecar's dedicated ServiceAccount.
pub(crate) fn deployment(
    ep: &McpEndpoint,
    names: &Names,
    target: &Target<'_>,
    defaults: &Defaults,
    own_service_account: bool,
) -> Value {
    let mut pod_spec = json!({
        "initContainers": [sidecar(ep, target, defaults)],
        "containers": [{
            "name": target.upstream_container,
            "lifecycle": {"preStop": drain_hook(ep)},
        }],
        "volumes": [
            {"name": CONFIG_VOLUME, "configMap": {"name": names.config()}},
            {"name": SECRET_VOLUME, "secret": {"secretName": names.config()}},
        ],
        "terminationGracePeriodSeconds": grace_period(ep, target),
    });
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
            "metadata": {"annotations": {
                INJECTED_ANNOTATION: names.endpoint,
                POD_SETTINGS_ANNOTATION: ep.spec.pod_settings().annotation(),
            }},
            "spec": pod_spec,
        }},
    })
}

/// `terminationGracePeriodSeconds`: `drain.timeout` + margin, or the template's when larger.
pub(crate) fn grace_period(ep: &McpEndpoint, target: &Target<'_>) -> i64 {
    let drain = std::time::Duration::from(ep.spec.drain.timeout)
        .as_secs_f64()
        .ceil() as i64;
    let needed = drain + GRACE_MARGIN_SECS;
    target
        .pod
        .termination_grace_period_seconds
        .map_or(needed, |theirs| theirs.max(needed))
}

/// The `preStop` hook that waits for the sidecar's drain.
fn drain_hook(ep: &McpEndpoint) -> Value {
    json!({"httpGet": {"path": DRAIN_PATH, "port": ep.spec.admin.port}})
}

fn sidecar(ep: &McpEndpoint, target: &Target<'_>, defaults: &Defaults) -> Value {
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
            {"name": "TETHER_SECRET_FILE", "value": format!("{SECRET_DIR}/{SECRET_KEY}")},
            {"name": "TETHER_POD_SELECTOR", "value": target.selector},
            {"name": "TETHER_LOG_FORMAT", "value": "json"},
            {"name": "POD_IP", "valueFrom": field("status.podIP")},
            {"name": "POD_UID", "valueFrom": field("metadata.uid")},
            {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
            {"name": "TETHER_POD_SETTINGS", "valueFrom": field(&format!("metadata.annotations['{POD_SETTINGS_ANNOTATION}']"))},
        ],
        "ports": [
            {"name": MCP_PORT_NAME, "containerPort": spec.listen.port, "protocol": "TCP"},
            {"name": ADMIN_PORT_NAME, "containerPort": spec.admin.port, "protocol": "TCP"},
            {"name": PEER_PORT_NAME, "containerPort": spec.peer.port, "protocol": "TCP"},
        ],
        "readinessProbe": probe("/readyz"),
        "livenessProbe": probe("/healthz"),
        "lifecycle": {"preStop": drain_hook(ep)},
        "resources": resources,
        "volumeMounts": [
            {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": true},
            {"name": SECRET_VOLUME, "mountPath": SECRET_DIR, "readOnly": true},
        ],
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": SIDECAR_USER,
            "runAsGroup": SIDECAR_USER,
            "readOnlyRootFilesystem": true,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
        },
    })
}

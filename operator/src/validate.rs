//! The validation step of the reconcile: pure checks of an endpoint and its target Deployment
//! for what the operator must not paper over. Each failure is a [`Conflict`] whose `reason`
//! becomes the `Degraded` condition's and the Event's; nothing of the user's is ever
//! overwritten to make a conflict go away (`docs/design/operator.md`).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use tether_crds::{
    ADMIN_PORT_NAME, McpEndpoint, PEER_PORT_NAME, SIDECAR_MCP_PORT_NAME, validate_spec,
};

use crate::names::{DRAINED_PATH, INJECTED_ANNOTATION, MAX_SERVICE_NAME, Names, SIDECAR_CONTAINER};

/// Why an endpoint cannot be reconciled as asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct Conflict {
    /// PascalCase reason (condition and Event): `InvalidSpec`, `TargetWithoutSelector`,
    /// `ContainerNameClash`, `PreStopConflict`, `PortConflict`, `UpstreamContainerNotFound`,
    /// `NameInvalid`, `NameTooLong`, `NameTaken`, `FieldConflict`, and those of the key ring:
    /// `SecretNotOwned`, `SecretMissing`, `SecretInvalid`.
    pub reason: &'static str,
    /// What is wrong and what to do, for `kubectl describe`.
    pub message: String,
}

impl Conflict {
    pub(crate) fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// Who controls the object with metadata `meta`, for the message of a conflict over it.
pub(crate) fn controller_of(meta: &ObjectMeta) -> String {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map_or_else(
            || "it has no controller owner".to_owned(),
            |r| format!("{} {:?} (uid {}) controls it", r.kind, r.name, r.uid),
        )
}

/// What the plan needs from a valid target.
#[derive(Clone, Debug)]
pub struct Target<'a> {
    /// The Deployment.
    pub(crate) deployment: &'a Deployment,
    /// Its pod template's spec.
    pub(crate) pod: &'a PodSpec,
    /// The selector's `matchLabels` (Service and PodDisruptionBudget selectors).
    pub(crate) match_labels: std::collections::BTreeMap<String, String>,
    /// Name of the container running the MCP server (it gets the `preStop` that waits for the
    /// drain).
    pub upstream_container: String,
}

impl Target<'_> {
    /// The ServiceAccount the pod template names when it is one of the user's: neither unset,
    /// nor `default`, nor the sidecar's dedicated one ([`Names::sidecar_rbac`]). The operator
    /// never replaces it; without one the pods get the dedicated ServiceAccount.
    pub(crate) fn users_service_account(&self, names: &Names) -> Option<&str> {
        self.pod
            .service_account_name
            .as_deref()
            .filter(|n| !n.is_empty() && *n != "default" && *n != names.sidecar_rbac())
    }
}

/// Checks `ep` (its spec, the names of its children) and its target `deployment`.
///
/// # Errors
/// The first [`Conflict`] found.
pub fn validate<'a>(
    ep: &McpEndpoint,
    names: &Names,
    deployment: &'a Deployment,
) -> Result<Target<'a>, Conflict> {
    let errors = validate_spec(&ep.spec);
    if !errors.is_empty() {
        let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
        return Err(Conflict::new("InvalidSpec", all.join("; ")));
    }
    if !is_dns_label(&names.endpoint) {
        return Err(Conflict::new(
            "NameInvalid",
            format!(
                "the name {:?} cannot start the Services' names (a DNS-1035 label: lowercase letters, digits and '-', starting with a letter, ending with a letter or digit, no '.'); create the McpEndpoint under such a name",
                names.endpoint
            ),
        ));
    }
    for name in [names.client_service(), names.peer_service()] {
        if name.len() > MAX_SERVICE_NAME {
            return Err(Conflict::new(
                "NameTooLong",
                format!(
                    "Service name {name:?} would exceed {MAX_SERVICE_NAME} characters; use a shorter McpEndpoint name"
                ),
            ));
        }
    }
    let spec = deployment
        .spec
        .as_ref()
        .ok_or_else(|| Conflict::new("TargetWithoutSelector", "the Deployment has no spec"))?;
    let match_labels = spec.selector.match_labels.clone().unwrap_or_default();
    if match_labels.is_empty() {
        return Err(Conflict::new(
            "TargetWithoutSelector",
            "the Deployment's selector has no matchLabels; tether's Services and PodDisruptionBudget need them",
        ));
    }
    let pod = spec.template.spec.as_ref().ok_or_else(|| {
        Conflict::new(
            "TargetWithoutSelector",
            "the Deployment has no pod template spec",
        )
    })?;
    check_sidecar_name(pod, deployment, names)?;
    check_ports(ep, pod)?;
    let upstream = upstream_container(ep, pod)?;
    check_pre_stop(ep, upstream)?;
    Ok(Target {
        deployment,
        pod,
        match_labels,
        upstream_container: upstream.name.clone(),
    })
}

/// A container named `tether-sidecar` is ours only when the pod template says this endpoint
/// injected it.
fn check_sidecar_name(
    pod: &PodSpec,
    deployment: &Deployment,
    names: &Names,
) -> Result<(), Conflict> {
    let injected_by = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(INJECTED_ANNOTATION));
    let in_main = pod.containers.iter().any(|c| c.name == SIDECAR_CONTAINER);
    let in_init = init_containers(pod).any(|c| c.name == SIDECAR_CONTAINER);
    if in_main || (in_init && injected_by != Some(&names.endpoint)) {
        return Err(Conflict::new(
            "ContainerNameClash",
            format!(
                "the pod template already has a container named {SIDECAR_CONTAINER:?} that tether did not inject; rename it"
            ),
        ));
    }
    Ok(())
}

/// Names of the sidecar's container ports: no other container of the pod may use them.
const SIDECAR_PORT_NAMES: [&str; 3] = [SIDECAR_MCP_PORT_NAME, ADMIN_PORT_NAME, PEER_PORT_NAME];

/// The sidecar's ports must be free in the pod's network namespace, and their names unused by
/// the other containers (a duplicate port name is not rejected by the API server).
fn check_ports(ep: &McpEndpoint, pod: &PodSpec) -> Result<(), Conflict> {
    let ours = [
        ("spec.listen.port", ep.spec.listen.port),
        ("spec.admin.port", ep.spec.admin.port),
        ("spec.peer.port", ep.spec.peer.port),
    ];
    let theirs = pod
        .containers
        .iter()
        .chain(init_containers(pod).filter(|c| c.name != SIDECAR_CONTAINER))
        .flat_map(|c| c.ports.iter().flatten().map(move |p| (c, p)));
    for (container, port) in theirs {
        if let Some((field, _)) = ours
            .iter()
            .find(|(_, p)| i32::from(*p) == port.container_port)
        {
            return Err(Conflict::new(
                "PortConflict",
                format!(
                    "container {:?} declares port {}, which {field} gives the sidecar; change one of them",
                    container.name, port.container_port
                ),
            ));
        }
        if let Some(name) = port
            .name
            .as_deref()
            .filter(|n| SIDECAR_PORT_NAMES.contains(n))
        {
            return Err(Conflict::new(
                "PortConflict",
                format!(
                    "container {:?} names a port {name:?}, a name tether gives a sidecar port (peers find each other's ports by name); rename that port",
                    container.name
                ),
            ));
        }
    }
    Ok(())
}

/// The container serving MCP: the one declaring `spec.upstream.port`, else the only one.
fn upstream_container<'a>(ep: &McpEndpoint, pod: &'a PodSpec) -> Result<&'a Container, Conflict> {
    let port = i32::from(ep.spec.upstream.port);
    let declaring = pod
        .containers
        .iter()
        .find(|c| c.ports.iter().flatten().any(|p| p.container_port == port));
    match (declaring, pod.containers.as_slice()) {
        (Some(c), _) | (None, [c]) => Ok(c),
        _ => Err(Conflict::new(
            "UpstreamContainerNotFound",
            format!(
                "{} containers and none declares containerPort {port} (spec.upstream.port); declare it on the MCP server's container",
                pod.containers.len()
            ),
        )),
    }
}

/// The MCP server's container gets a `preStop` that waits for the drain; one the user set is
/// never replaced, unless it is that very hook.
fn check_pre_stop(ep: &McpEndpoint, container: &Container) -> Result<(), Conflict> {
    let Some(pre_stop) = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
    else {
        return Ok(());
    };
    let waits_for_the_drain = pre_stop.http_get.as_ref().is_some_and(|g| {
        g.path.as_deref() == Some(DRAINED_PATH)
            && g.port
                == k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i32::from(
                    ep.spec.admin.port,
                ))
    });
    if waits_for_the_drain {
        return Ok(());
    }
    Err(Conflict::new(
        "PreStopConflict",
        format!(
            "container {:?} already has a preStop hook; tether needs it to wait for the drain (httpGet {} on port {}): move your hook's work elsewhere or remove it",
            container.name, DRAINED_PATH, ep.spec.admin.port
        ),
    ))
}

/// Whether `name` is a DNS-1035 label without its length limit (the length is checked on the
/// Services' full names): `[a-z]([-a-z0-9]*[a-z0-9])?`.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes.first().is_some_and(u8::is_ascii_lowercase)
        && bytes
            .last()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

fn init_containers(pod: &PodSpec) -> impl Iterator<Item = &Container> {
    pod.init_containers.iter().flatten()
}

/// `selector` in label-selector syntax: `k=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`, joined
/// by commas, in a stable order.
pub(crate) fn render_selector(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::{self, DEPLOYMENT, MINIMAL_ENDPOINT};

    fn reason(ep: &McpEndpoint, d: &Deployment) -> Option<&'static str> {
        validate(ep, &fixtures::names(ep), d)
            .err()
            .map(|c| c.reason)
    }

    fn with_containers(containers: serde_json::Value) -> Deployment {
        fixtures::deployment_with(|d| d["spec"]["template"]["spec"]["containers"] = containers)
    }

    #[test]
    fn a_plain_deployment_is_a_valid_target() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let d = fixtures::deployment(DEPLOYMENT);
        let t = validate(&ep, &fixtures::names(&ep), &d).expect("valid");
        assert_eq!(t.upstream_container, "server");
        assert_eq!(t.match_labels["app"], "weather");
    }

    #[test]
    fn conflicts_are_named_and_nothing_is_taken_over() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let server = |extra: serde_json::Value| {
            let mut c = json!({"name": "server", "image": "s", "ports": [{"containerPort": 3000}]});
            crate::fixtures::merge(&mut c, extra);
            c
        };
        let clash =
            with_containers(json!([server(json!({})), {"name": "tether-sidecar", "image": "x"}]));
        assert_eq!(reason(&ep, &clash), Some("ContainerNameClash"));
        let foreign_init = fixtures::deployment_with(|d| {
            d["spec"]["template"]["spec"]["initContainers"] =
                json!([{"name": "tether-sidecar", "image": "theirs"}]);
        });
        assert_eq!(reason(&ep, &foreign_init), Some("ContainerNameClash"));
        let ours = fixtures::deployment_with(|d| {
            d["spec"]["template"]["spec"]["initContainers"] =
                json!([{"name": "tether-sidecar", "image": "ours"}]);
            d["spec"]["template"]["metadata"]["annotations"] =
                json!({"mcp.tether.dev/endpoint": "weather"});
        });
        assert_eq!(reason(&ep, &ours), None);
        let hook = json!({"lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}}});
        assert_eq!(
            reason(&ep, &with_containers(json!([server(hook)]))),
            Some("PreStopConflict")
        );
        let our_hook =
            json!({"lifecycle": {"preStop": {"httpGet": {"path": "/drained", "port": 9901}}}});
        assert_eq!(
            reason(&ep, &with_containers(json!([server(our_hook)]))),
            None
        );
        let port = json!({"ports": [{"containerPort": 3000}, {"containerPort": 8080}]});
        assert_eq!(
            reason(&ep, &with_containers(json!([server(port)]))),
            Some("PortConflict")
        );
        let named = json!({"ports": [{"containerPort": 3000, "name": "tether-mcp"}]});
        assert_eq!(
            reason(&ep, &with_containers(json!([server(named)]))),
            Some("PortConflict")
        );
        // `mcp`, the natural name of an MCP server's port, is the user's to take.
        let mcp = json!({"ports": [{"containerPort": 3000, "name": "mcp"}]});
        assert_eq!(reason(&ep, &with_containers(json!([server(mcp)]))), None);
        let peer_named = fixtures::deployment_with(|d| {
            d["spec"]["template"]["spec"]["initContainers"] = json!([{"name": "proxy", "image": "p", "ports": [{"containerPort": 7000, "name": "tether-peer"}]}]);
        });
        assert_eq!(reason(&ep, &peer_named), Some("PortConflict"));
        let two = with_containers(json!([
            {"name": "a", "image": "a", "ports": [{"containerPort": 4000}]},
            {"name": "b", "image": "b"},
        ]));
        assert_eq!(reason(&ep, &two), Some("UpstreamContainerNotFound"));
        let no_labels = fixtures::deployment_with(|d| {
            d["spec"]["selector"] =
                json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]});
        });
        assert_eq!(reason(&ep, &no_labels), Some("TargetWithoutSelector"));
        let mut invalid = ep.clone();
        invalid.spec.admin.port = invalid.spec.listen.port;
        assert_eq!(
            reason(&invalid, &fixtures::deployment(DEPLOYMENT)),
            Some("InvalidSpec")
        );
        for bad in ["weather.v2", "1weather", "weather-", "Weather"] {
            let mut named = ep.clone();
            named.metadata.name = Some(bad.to_owned());
            assert_eq!(
                reason(&named, &fixtures::deployment(DEPLOYMENT)),
                Some("NameInvalid"),
                "{bad}"
            );
        }
        let mut long = ep.clone();
        long.metadata.name = Some("x".repeat(60));
        assert_eq!(
            reason(&long, &fixtures::deployment(DEPLOYMENT)),
            Some("NameTooLong")
        );
    }

    #[test]
    fn the_selector_renders_in_label_selector_syntax() {
        let selector: LabelSelector = serde_json::from_value(json!({
            "matchLabels": {"app": "weather", "tier": "mcp"},
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a", "b"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "track", "operator": "NotIn", "values": ["beta"]},
                {"key": "team", "operator": "Exists"},
            ],
        }))
        .unwrap();
        assert_eq!(
            render_selector(&selector),
            "app=weather,tier=mcp,zone in (a,b),!canary,track notin (beta),team"
        );
    }
}

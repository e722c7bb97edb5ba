//! The client Service, the headless peer Service and the PodDisruptionBudget, all selecting the
//! target Deployment's pods by its `matchLabels` (the Services also by the pod-template label of
//! the operator's injection, so that they list the endpoint's injected pods only) — and
//! [`covering_pdb`], which finds a PodDisruptionBudget of the user's over the same pods (then
//! the operator adds none).

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::{Selector, SelectorExt};
use tether_crds::{MCP_PORT_NAME, McpEndpoint, PEER_PORT_NAME};

use super::child_meta;
use crate::names::{INJECTED_ANNOTATION, Names};
use crate::validate::Target;

/// A Service port `name` forwarding to the same container port number. The `targetPort` is the
/// number, not the container port's name: the EndpointSlice controller resolves names of
/// restartable init containers (the native sidecar) only from Kubernetes 1.33 (kubernetes PRs
/// #127976, #128850), and a name would first match a user container's port of that name.
fn port(name: &str, port: u16) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port: i32::from(port),
        target_port: Some(IntOrString::Int(i32::from(port))),
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    }
}

/// A Service named `name` selecting the target's pods whose template the operator injected for
/// this endpoint (label [`INJECTED_ANNOTATION`]): a pod without the sidecar has nothing on its
/// ports — while the injection rolls out, the Deployment's old pods would refuse the
/// connections kube-proxy sent them — and another workload that happens to share the
/// Deployment's labels is never selected.
fn service(
    names: &Names,
    name: String,
    target: &Target<'_>,
    owner: &OwnerReference,
    spec: ServiceSpec,
) -> Service {
    let mut selector = target.match_labels.clone();
    selector.insert(INJECTED_ANNOTATION.to_owned(), names.endpoint.clone());
    Service {
        metadata: child_meta(names, name, owner),
        spec: Some(ServiceSpec {
            selector: Some(selector),
            ..spec
        }),
        ..Service::default()
    }
}

/// The Service clients use: the sidecars' MCP port on ready injected pods.
pub(crate) fn client_service(
    ep: &McpEndpoint,
    names: &Names,
    target: &Target<'_>,
    owner: &OwnerReference,
) -> Service {
    let ports = vec![port(MCP_PORT_NAME, ep.spec.listen.port)];
    let spec = ServiceSpec {
        ports: Some(ports),
        ..ServiceSpec::default()
    };
    service(names, names.client_service(), target, owner, spec)
}

/// The headless Service of every injected pod, ready or not (`publishNotReadyAddresses`): peers
/// find a draining pod through it, and the sidecars' membership is its EndpointSlices.
pub(crate) fn peer_service(
    ep: &McpEndpoint,
    names: &Names,
    target: &Target<'_>,
    owner: &OwnerReference,
) -> Service {
    let ports = vec![
        port(PEER_PORT_NAME, ep.spec.peer.port),
        port(MCP_PORT_NAME, ep.spec.listen.port),
    ];
    let spec = ServiceSpec {
        cluster_ip: Some("None".to_owned()),
        publish_not_ready_addresses: Some(true),
        ports: Some(ports),
        ..ServiceSpec::default()
    };
    service(names, names.peer_service(), target, owner, spec)
}

/// At most one pod disrupted at a time, so a voluntary eviction never drains two pods' sessions
/// onto each other at once.
pub(crate) fn pdb(
    names: &Names,
    target: &Target<'_>,
    owner: &OwnerReference,
) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: child_meta(names, names.pdb(), owner),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(target.match_labels.clone()),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

/// The name of the first PodDisruptionBudget of `existing`, other than ours, that selects the
/// target's pods (by their template labels). The eviction API refuses to evict a pod two budgets
/// cover (node drains stall), so the operator then adds none of its own. Per `policy/v1`, a
/// budget without a selector selects nothing and one with an empty selector every pod of the
/// namespace; a selector that does not parse is taken to select nothing.
pub(crate) fn covering_pdb<'a>(
    existing: &'a [PodDisruptionBudget],
    names: &Names,
    target: &Target<'_>,
) -> Option<&'a str> {
    let labels = target
        .deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    existing.iter().find_map(|pdb| {
        let name = pdb.metadata.name.as_deref()?;
        let selector = pdb.spec.as_ref()?.selector.clone()?;
        let selects = Selector::try_from(selector).is_ok_and(|s| s.matches(&labels));
        (name != names.pdb() && selects).then_some(name)
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::{self, DEPLOYMENT, MINIMAL_ENDPOINT};
    use crate::validate::validate;

    fn budget(name: &str, selector: serde_json::Value) -> PodDisruptionBudget {
        let mut pdb = json!({"metadata": {"name": name}, "spec": {"maxUnavailable": 1}});
        if !selector.is_null() {
            pdb["spec"]["selector"] = selector;
        }
        serde_json::from_value(pdb).unwrap()
    }

    #[test]
    fn a_users_budget_over_the_same_pods_is_found_and_ours_is_not() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let names = fixtures::names(&ep);
        let deployment = fixtures::deployment(DEPLOYMENT);
        let target = validate(&ep, &names, &deployment).unwrap();
        let ours = pdb(&names, &target, &fixtures::owner(&ep));
        let by_label = json!({"matchLabels": {"app": "weather"}});
        let other_app = json!({"matchLabels": {"app": "billing"}});
        let by_expression = json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["weather", "x"]}]});
        let cases = [
            (vec![ours.clone()], None),
            (vec![budget("theirs", by_label)], Some("theirs")),
            (vec![budget("billing", other_app)], None),
            (vec![budget("expr", by_expression)], Some("expr")),
            (vec![budget("everything", json!({}))], Some("everything")),
            (vec![budget("nothing", serde_json::Value::Null)], None),
            (
                vec![
                    ours,
                    budget("billing", json!({"matchLabels": {"app": "billing"}})),
                    budget("all", json!({})),
                ],
                Some("all"),
            ),
        ];
        for (existing, expected) in cases {
            assert_eq!(
                covering_pdb(&existing, &names, &target),
                expected,
                "{existing:?}"
            );
        }
    }
}

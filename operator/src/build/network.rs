//! The client Service, the headless peer Service and the PodDisruptionBudget, all selecting the
//! target Deployment's pods by its `matchLabels`.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tether_crds::McpEndpoint;

use super::child_meta;
use crate::names::Names;
use crate::validate::Target;

fn port(name: &str, port: u16) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port: i32::from(port),
        target_port: Some(IntOrString::String(name.to_owned())),
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    }
}

/// A Service named `name` selecting the target's pods on `ports`.
fn service(
    names: &Names,
    name: String,
    target: &Target<'_>,
    owner: &OwnerReference,
    spec: ServiceSpec,
) -> Service {
    Service {
        metadata: child_meta(names, name, owner),
        spec: Some(ServiceSpec {
            selector: Some(target.match_labels.clone()),
            ..spec
        }),
        ..Service::default()
    }
}

/// The Service clients use: the sidecars' MCP port on ready pods.
pub fn client_service(
    ep: &McpEndpoint,
    names: &Names,
    target: &Target<'_>,
    owner: &OwnerReference,
) -> Service {
    let ports = vec![port("mcp", ep.spec.listen.port)];
    let spec = ServiceSpec {
        ports: Some(ports),
        ..ServiceSpec::default()
    };
    service(names, names.client_service(), target, owner, spec)
}

/// The headless Service of every pod, ready or not (`publishNotReadyAddresses`): peers find a
/// draining pod through it.
pub fn peer_service(
    ep: &McpEndpoint,
    names: &Names,
    target: &Target<'_>,
    owner: &OwnerReference,
) -> Service {
    let ports = vec![
        port("tether-peer", ep.spec.peer.port),
        port("mcp", ep.spec.listen.port),
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
pub fn pdb(names: &Names, target: &Target<'_>, owner: &OwnerReference) -> PodDisruptionBudget {
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

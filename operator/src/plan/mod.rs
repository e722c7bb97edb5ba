//! The pure planning step of the reconcile (`docs/design/operator.md`): [`plan`] builds the
//! children the operator wants for one endpoint, each holding only the fields the operator owns
//! (a typed object with defaults would make server-side apply claim fields the user set), and
//! `Plan::steps` sets them against the live objects, deletions included. Nothing here talks
//! to the API server.
//!
//! - [`inject`]: the Deployment apply body (native sidecar, volumes, `preStop`, grace period,
//!   ServiceAccount when the pods name none);
//! - [`config`]: the config ConfigMap (the manifest the sidecars read) and the HMAC Secret;
//! - `network`: the client Service, the headless peer Service, the PodDisruptionBudget;
//! - `rbac`: the sidecar's Role, RoleBinding and, when needed, ServiceAccount;
//! - `steps`: the plan against the live objects, with the retirements.

pub mod config;
pub mod inject;
pub(crate) mod network;
pub(crate) mod rbac;
pub(crate) mod steps;

use k8s_openapi::api::core::v1::{ConfigMap, ResourceRequirements, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use tether_crds::McpEndpoint;

use crate::names::Names;
use crate::validate::Target;

/// Seconds added to `spec.drain.timeout` for `terminationGracePeriodSeconds`: the sidecar's
/// exit after the drain and the kubelet's own delays.
pub(crate) const GRACE_MARGIN_SECS: i64 = 15;

/// Operator-wide defaults for what an endpoint's spec leaves out.
#[derive(Clone, Debug)]
pub struct Defaults {
    /// Sidecar image when `spec.sidecar.image` is unset.
    pub sidecar_image: String,
    /// Sidecar resources when `spec.sidecar.resources` is unset.
    pub sidecar_resources: ResourceRequirements,
}

impl Defaults {
    /// Defaults with `image` and the documented resources (requests 50m CPU, 64Mi memory;
    /// limit 256Mi memory).
    pub fn with_image(image: impl Into<String>) -> Self {
        let q = |s: &str| Quantity(s.to_owned());
        Self {
            sidecar_image: image.into(),
            sidecar_resources: ResourceRequirements {
                requests: Some(
                    [
                        ("cpu".to_owned(), q("50m")),
                        ("memory".to_owned(), q("64Mi")),
                    ]
                    .into(),
                ),
                limits: Some([("memory".to_owned(), q("256Mi"))].into()),
                ..ResourceRequirements::default()
            },
        }
    }
}

/// The children the operator wants for one endpoint, whatever is live (`Plan::steps` sets
/// them against the live objects).
#[derive(Clone, Debug)]
pub struct Plan {
    /// Server-side apply body for the target Deployment.
    pub injection: serde_json::Value,
    /// The config ConfigMap (the HMAC Secret is built only when missing: [`config::secret`]).
    pub config_map: ConfigMap,
    /// Client Service, then headless peer Service.
    pub services: [Service; 2],
    /// The sidecar's ServiceAccount, when the pod template names none.
    pub(crate) service_account: Option<ServiceAccount>,
    /// The sidecar's Role (read Pods).
    pub role: Role,
    /// Binds the Role to the pods' ServiceAccount.
    pub(crate) role_binding: RoleBinding,
    /// At most one pod of the endpoint disrupted at a time (unless a budget of the user's
    /// covers the pods).
    pub(crate) pdb: PodDisruptionBudget,
}

/// Builds the [`Plan`] for `ep` on its validated `target`; `owner` is the endpoint's controller
/// owner reference.
pub fn plan(
    ep: &McpEndpoint,
    names: &Names,
    target: &Target<'_>,
    defaults: &Defaults,
    owner: &OwnerReference,
) -> Plan {
    let service_account = rbac::service_account(names, target, owner);
    let subject = service_account
        .as_ref()
        .and_then(|sa| sa.metadata.name.clone())
        .or_else(|| target.pod.service_account_name.clone())
        .unwrap_or_else(|| "default".to_owned());
    Plan {
        injection: inject::deployment(ep, names, target, defaults, service_account.is_some()),
        config_map: config::config_map(ep, names, owner),
        services: [
            network::client_service(ep, names, target, owner),
            network::peer_service(ep, names, target, owner),
        ],
        service_account,
        role: rbac::role(names, owner),
        role_binding: rbac::role_binding(names, owner, &subject),
        pdb: network::pdb(names, target, owner),
    }
}

/// Metadata of a child: name, namespace, our labels, `owner` as controller.
pub(crate) fn child_meta(names: &Names, name: String, owner: &OwnerReference) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(names.namespace.clone()),
        labels: Some(names.labels()),
        owner_references: Some(vec![owner.clone()]),
        ..ObjectMeta::default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::{self, DEPLOYMENT, MINIMAL_ENDPOINT};
    use crate::validate::validate;

    fn plan_for(ep: &McpEndpoint, deployment: &k8s_openapi::api::apps::v1::Deployment) -> Plan {
        let names = fixtures::names(ep);
        let target = validate(ep, &names, deployment).expect("a valid target");
        plan(
            ep,
            &names,
            &target,
            &Defaults::with_image("tether-sidecar:test"),
            &fixtures::owner(ep),
        )
    }

    #[test]
    fn the_sidecar_is_a_native_sidecar_wired_to_the_config_and_the_pod() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let p = plan_for(&ep, &fixtures::deployment(DEPLOYMENT));
        let pod = &p.injection["spec"]["template"]["spec"];
        let sidecar = &pod["initContainers"][0];
        assert_eq!(sidecar["name"], "tether-sidecar");
        assert_eq!(sidecar["restartPolicy"], "Always");
        assert_eq!(sidecar["image"], "tether-sidecar:test");
        let env: std::collections::BTreeMap<&str, &serde_json::Value> = sidecar["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap(), e))
            .collect();
        assert_eq!(env["TETHER_ENDPOINT"]["value"], "/etc/tether/endpoint.yaml");
        assert_eq!(
            env["TETHER_SECRET_FILE"]["value"],
            "/etc/tether-secret/secret"
        );
        assert_eq!(env["TETHER_POD_SELECTOR"]["value"], "app=weather");
        assert_eq!(
            env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"],
            "status.podIP"
        );
        assert_eq!(
            env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.uid"
        );
        assert_eq!(
            env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.namespace"
        );
        assert_eq!(
            sidecar["readinessProbe"]["httpGet"],
            json!({"path": "/readyz", "port": 9901})
        );
        let drain = json!({"httpGet": {"path": "/drain", "port": 9901}});
        assert_eq!(sidecar["lifecycle"]["preStop"], drain);
        // The MCP server waits for the drain too: it gets SIGTERM when termination starts.
        assert_eq!(
            pod["containers"],
            json!([{"name": "server", "lifecycle": {"preStop": drain}}])
        );
        assert_eq!(
            pod["volumes"],
            json!([
                {"name": "tether-config", "configMap": {"name": "weather-tether"}},
                {"name": "tether-secret", "secret": {"secretName": "weather-tether"}},
            ])
        );
        assert_eq!(sidecar["resources"]["requests"]["memory"], "64Mi");
        assert_eq!(sidecar["securityContext"]["runAsNonRoot"], true);
        // Only fields we own: nothing of the user's container, no replicas, no selector.
        assert!(pod["containers"][0].get("image").is_none());
        assert!(p.injection["spec"].get("replicas").is_none());
        assert!(p.injection["spec"].get("selector").is_none());
        assert_eq!(
            p.injection["spec"]["template"]["metadata"]["annotations"]["mcp.tether.dev/endpoint"],
            "weather"
        );
    }

    #[test]
    fn the_grace_period_covers_the_drain_and_keeps_a_longer_one() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let grace = |d: &k8s_openapi::api::apps::v1::Deployment| {
            plan_for(&ep, d).injection["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
                .as_i64()
                .unwrap()
        };
        // drain.timeout defaults to 60s.
        assert_eq!(
            grace(&fixtures::deployment(DEPLOYMENT)),
            60 + GRACE_MARGIN_SECS
        );
        let short = fixtures::deployment_with(|d| {
            d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(30)
        });
        assert_eq!(grace(&short), 60 + GRACE_MARGIN_SECS);
        let long = fixtures::deployment_with(|d| {
            d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(600)
        });
        assert_eq!(grace(&long), 600);
        let mut quick = ep.clone();
        quick.spec.drain.timeout = std::time::Duration::from_millis(4500).into();
        let names = fixtures::names(&quick);
        let d = fixtures::deployment(DEPLOYMENT);
        let target = validate(&quick, &names, &d).unwrap();
        assert_eq!(inject::grace_period(&quick, &target), 5 + GRACE_MARGIN_SECS);
    }

    #[test]
    fn a_chosen_service_account_is_bound_never_replaced() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let chosen = fixtures::deployment_with(|d| {
            d["spec"]["template"]["spec"]["serviceAccountName"] = json!("weather-sa")
        });
        let p = plan_for(&ep, &chosen);
        assert!(p.service_account.is_none());
        assert!(
            p.injection["spec"]["template"]["spec"]
                .get("serviceAccountName")
                .is_none()
        );
        let subject = &p.role_binding.subjects.as_ref().unwrap()[0];
        assert_eq!(
            (subject.name.as_str(), subject.namespace.as_deref()),
            ("weather-sa", Some("tools"))
        );
        // None named: a dedicated one, set in the template (both fields: the API server copies
        // `serviceAccountName` back from `serviceAccount`).
        let p = plan_for(&ep, &fixtures::deployment(DEPLOYMENT));
        let sa = p.service_account.expect("a dedicated ServiceAccount");
        assert_eq!(sa.metadata.name.as_deref(), Some("weather-tether-sidecar"));
        let pod = &p.injection["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], "weather-tether-sidecar");
        assert_eq!(pod["serviceAccount"], "weather-tether-sidecar");
        assert_eq!(
            p.role_binding.subjects.unwrap()[0].name,
            "weather-tether-sidecar"
        );
        let rule = &p.role.rules.unwrap()[0];
        assert_eq!(rule.resources.as_deref(), Some(&["pods".to_owned()][..]));
        assert_eq!(rule.verbs, ["get", "list", "watch"]);
    }

    #[test]
    fn the_config_map_holds_the_manifest_the_sidecar_reads() {
        let mut ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        ep.spec.buffer.max_events = 64;
        ep.spec.origins.allow = vec!["https://app.example.com".into()];
        let p = plan_for(&ep, &fixtures::deployment(DEPLOYMENT));
        let text = &p.config_map.data.as_ref().unwrap()["endpoint.yaml"];
        let read = tether_crds::parse_manifest(text).expect("the sidecar accepts it");
        assert_eq!(read.spec, ep.spec);
        assert_eq!(read.metadata.name.as_deref(), Some("weather"));
        assert_eq!(
            p.config_map.metadata.owner_references.as_ref().unwrap()[0].kind,
            "McpEndpoint"
        );
        let secret = config::secret(&fixtures::names(&ep), &fixtures::owner(&ep), &[7; 32]);
        assert_eq!(secret.immutable, Some(true));
        assert_eq!(secret.data.as_ref().unwrap()["secret"].0, vec![7; 32]);
    }

    #[test]
    fn services_and_the_budget_select_the_targets_pods() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let p = plan_for(&ep, &fixtures::deployment(DEPLOYMENT));
        let [client, peers] = &p.services;
        let selector = Some([("app".to_owned(), "weather".to_owned())].into());
        assert_eq!(client.metadata.name.as_deref(), Some("weather-mcp"));
        let spec = client.spec.as_ref().unwrap();
        assert_eq!(spec.selector, selector);
        assert_eq!(spec.ports.as_ref().unwrap()[0].port, 8080);
        let spec = peers.spec.as_ref().unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert_eq!(spec.ports.as_ref().unwrap()[0].port, 9902);
        let pdb = p.pdb.spec.unwrap();
        assert_eq!(pdb.selector.unwrap().match_labels, selector);
        for labels in [&client.metadata.labels, &peers.metadata.labels] {
            assert_eq!(
                labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
                "tether-operator"
            );
        }
    }
}

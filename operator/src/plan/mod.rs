//! The pure planning step of the reconcile (`docs/design/operator.md`): [`plan`] builds the
//! children the operator wants for one endpoint, each holding only the fields the operator owns
//! (a typed object with defaults would make server-side apply claim fields the user set), and
//! `Plan::steps` sets them against the live objects, deletions included. Nothing here talks
//! to the API server.
//!
//! - [`inject`]: the Deployment apply body (native sidecar, volumes, `preStop`, grace period,
//!   ServiceAccount when the pods name none);
//! - [`config`]: the config ConfigMap (the manifest the sidecars read);
//! - [`keys`]: the key-ring Secret, whole when it is created, a JSON patch per rotation step;
//! - `network`: the client Service, the headless peer Service, the PodDisruptionBudget;
//! - `rbac`: the sidecar's Role, RoleBinding and, when needed, ServiceAccount;
//! - `steps`: the plan against the live objects, with the retirements;
//! - `decide`: the decision of one reconcile that the controller and the preview share
//!   (`target`: admitted and validated; `decide`: the key ring's step and the steps, or the
//!   conflict).

pub mod config;
pub(crate) mod decide;
pub mod inject;
pub mod keys;
pub(crate) mod network;
pub(crate) mod rbac;
pub(crate) mod steps;

pub(crate) use decide::{Rotation, decide, target};

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
    /// UID and GID the sidecar runs as; `None` leaves them to the platform (OpenShift's
    /// `restricted-v2` assigns a UID of the namespace's range and rejects a fixed one).
    pub sidecar_user: Option<i64>,
}

impl Defaults {
    /// Defaults with `image`, the documented resources (requests 50m CPU, 64Mi memory; limit
    /// 256Mi memory) and user [`inject::SIDECAR_USER`].
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
            sidecar_user: Some(inject::SIDECAR_USER),
        }
    }
}

/// The children the operator wants for one endpoint, whatever is live (`Plan::steps` sets
/// them against the live objects).
#[derive(Clone, Debug)]
pub struct Plan {
    /// Server-side apply body for the target Deployment.
    pub injection: serde_json::Value,
    /// The config ConfigMap (the key-ring Secret is written as the reconcile decides:
    /// [`keys::KeyStep`]).
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
    /// Seconds of `terminationGracePeriodSeconds` the drain needs (for the message of a
    /// conflict over that field).
    pub(crate) grace_needed: i64,
}

/// Builds the [`Plan`] for `ep` on its validated `target`; `owner` is the endpoint's controller
/// owner reference, `secret` the name of the key-ring Secret the pods mount
/// ([`Names::secret`]).
pub fn plan(
    ep: &McpEndpoint,
    names: &Names,
    target: &Target<'_>,
    defaults: &Defaults,
    owner: &OwnerReference,
    secret: &str,
) -> Plan {
    let service_account = rbac::service_account(names, target, owner);
    let subject = service_account
        .as_ref()
        .and_then(|sa| sa.metadata.name.clone())
        .or_else(|| target.pod.service_account_name.clone())
        .unwrap_or_else(|| "default".to_owned());
    Plan {
        injection: inject::deployment(
            ep,
            names,
            target,
            defaults,
            service_account.is_some(),
            secret,
        ),
        config_map: config::config_map(ep, names, owner),
        services: [
            network::client_service(ep, names, target, owner),
            network::peer_service(ep, names, target, owner),
        ],
        service_account,
        role: rbac::role(names, owner),
        role_binding: rbac::role_binding(names, owner, &subject),
        pdb: network::pdb(names, target, owner),
        grace_needed: inject::needed_grace(ep),
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
            &names.secret(),
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
        assert_eq!(env["TETHER_SECRET_DIR"]["value"], "/etc/tether-secret");
        assert!(
            !env.contains_key("TETHER_SECRET_FILE"),
            "the whole ring, not one key"
        );
        assert_eq!(env["TETHER_PEER_SERVICE"]["value"], "weather-peers");
        assert_eq!(
            env["TETHER_REVISION"]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.labels['pod-template-hash']",
            "each sidecar reports its pod's revision"
        );
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
        // The sidecar drains through its drain socket, in a volume only it mounts; the MCP
        // server only waits for the drain (it would get SIGTERM when termination starts).
        assert_eq!(
            sidecar["lifecycle"]["preStop"],
            json!({"exec": {"command": ["/usr/local/bin/tether-sidecar", "drain"]}})
        );
        assert_eq!(
            env["TETHER_DRAIN_SOCKET"]["value"],
            "/run/tether/drain.sock"
        );
        assert_eq!(
            sidecar["volumeMounts"][3],
            json!({"name": "tether-run", "mountPath": "/run/tether"})
        );
        assert_eq!(
            pod["containers"],
            json!([{"name": "server", "lifecycle": {"preStop": {"httpGet": {"path": "/drained", "port": 9901}}}}])
        );
        assert_eq!(
            pod["volumes"],
            json!([
                {"name": "tether-config", "configMap": {"name": "weather-tether"}},
                {"name": "tether-secret", "secret": {"secretName": "weather-tether-keys-6f1c2a9e"}},
                {"name": "tether-token", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ]}},
                {"name": "tether-run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            ])
        );
        // The token reaches the sidecar only, where in-cluster clients look for it.
        assert_eq!(
            sidecar["volumeMounts"][2],
            json!({"name": "tether-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true})
        );
        assert!(pod["containers"][0].get("volumeMounts").is_none());
        assert_eq!(sidecar["resources"]["requests"]["memory"], "64Mi");
        let security = &sidecar["securityContext"];
        assert_eq!(security["runAsNonRoot"], true);
        assert_eq!(security["runAsUser"], inject::SIDECAR_USER);
        assert_eq!(
            security["seccompProfile"],
            json!({"type": "RuntimeDefault"})
        );
        assert_eq!(security["allowPrivilegeEscalation"], false);
        assert_eq!(security["capabilities"], json!({"drop": ["ALL"]}));
        // Only fields we own: nothing of the user's container, no replicas, no selector.
        assert!(pod["containers"][0].get("image").is_none());
        assert!(p.injection["spec"].get("replicas").is_none());
        assert!(p.injection["spec"].get("selector").is_none());
        assert_eq!(
            p.injection["spec"]["template"]["metadata"]["annotations"]["mcp.tether.dev/endpoint"],
            "weather"
        );
    }

    /// [`DEPLOYMENT`] whose pod template sets `terminationGracePeriodSeconds` to `seconds`,
    /// managed by `manager`.
    fn grace_managed_by(seconds: i64, manager: &str) -> k8s_openapi::api::apps::v1::Deployment {
        fixtures::deployment_with(|d| {
            d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(seconds);
            d["metadata"]["managedFields"] = json!([{"manager": manager, "operation": "Apply",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:template": {"f:spec": {
                    "f:terminationGracePeriodSeconds": {}}}}}}]);
        })
    }

    #[test]
    fn the_grace_period_is_claimed_only_when_no_one_else_gives_the_drain_enough() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let grace = |ep: &McpEndpoint, d: &k8s_openapi::api::apps::v1::Deployment| {
            plan_for(ep, d).injection["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
                .as_i64()
        };
        let needed = 60 + GRACE_MARGIN_SECS; // drain.timeout defaults to 60s
        // Unset or defaulted (no manager): tether sets what the drain needs.
        assert_eq!(grace(&ep, &fixtures::deployment(DEPLOYMENT)), Some(needed));
        let defaulted = fixtures::deployment_with(|d| {
            d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(30)
        });
        assert_eq!(grace(&ep, &defaulted), Some(needed));
        // The user's value: left alone when long enough; applied (and so a conflict) when not.
        assert_eq!(grace(&ep, &grace_managed_by(600, "helm")), None);
        assert_eq!(grace(&ep, &grace_managed_by(30, "helm")), Some(needed));
        // Ours follows drain.timeout down, to the API server's default at the least.
        let mut shorter = ep.clone();
        shorter.spec.drain.timeout = std::time::Duration::from_secs(30).into();
        let ours = grace_managed_by(135, "tether-operator/weather");
        assert_eq!(grace(&shorter, &ours), Some(30 + GRACE_MARGIN_SECS));
        let mut quick = ep.clone();
        quick.spec.drain.timeout = std::time::Duration::from_millis(4500).into();
        assert_eq!(inject::needed_grace(&quick), 5 + GRACE_MARGIN_SECS);
        // A shutdown delay longer than the drain's timeout is what the pods need.
        let mut lingering = quick.clone();
        lingering.spec.drain.shutdown_delay = std::time::Duration::from_secs(90).into();
        assert_eq!(inject::needed_grace(&lingering), 90 + GRACE_MARGIN_SECS);
        assert_eq!(grace(&quick, &ours), None);
        assert_eq!(grace(&quick, &fixtures::deployment(DEPLOYMENT)), None);
    }

    #[test]
    fn the_servers_pre_stop_is_claimed_only_when_the_users_manifest_lacks_it() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let containers = |d: &k8s_openapi::api::apps::v1::Deployment| {
            plan_for(&ep, d).injection["spec"]["template"]["spec"]["containers"].clone()
        };
        let hook = json!({"preStop": {"httpGet": {"path": "/drained", "port": 9901}}});
        assert_eq!(
            containers(&fixtures::deployment(DEPLOYMENT)),
            json!([{"name": "server", "lifecycle": hook}])
        );
        let carried = fixtures::deployment_with(|d| {
            d["spec"]["template"]["spec"]["containers"][0]["lifecycle"] = hook.clone();
            d["metadata"]["managedFields"] = json!([{"manager": "argocd-controller",
                "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {
                    "f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"server\"}": {
                        "f:lifecycle": {"f:preStop": {"f:httpGet": {"f:path": {}, "f:port": {}}}}}}}}}}}]);
        });
        assert_eq!(containers(&carried), serde_json::Value::Null);
    }

    #[test]
    fn a_platform_assigned_user_sets_no_uid() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let names = fixtures::names(&ep);
        let d = fixtures::deployment(DEPLOYMENT);
        let target = validate(&ep, &names, &d).unwrap();
        let mut defaults = Defaults::with_image("s");
        defaults.sidecar_user = None;
        let p = plan(&ep, &names, &target, &defaults, &fixtures::owner(&ep), "k");
        let security =
            &p.injection["spec"]["template"]["spec"]["initContainers"][0]["securityContext"];
        assert!(security.get("runAsUser").is_none() && security.get("runAsGroup").is_none());
        assert_eq!(security["runAsNonRoot"], true);
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
        let rules = p.role.rules.unwrap();
        assert_eq!(
            rules.len(),
            1,
            "the EndpointSlices only, no Pod specs: {rules:?}"
        );
        let rule = &rules[0];
        assert_eq!(
            rule.api_groups.as_deref(),
            Some(&["discovery.k8s.io".to_owned()][..])
        );
        assert_eq!(
            rule.resources.as_deref(),
            Some(&["endpointslices".to_owned()][..])
        );
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
    }

    #[test]
    fn services_and_the_budget_select_the_targets_pods() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let p = plan_for(&ep, &fixtures::deployment(DEPLOYMENT));
        let [client, peers] = &p.services;
        let selector = Some([("app".to_owned(), "weather".to_owned())].into());
        let injected = Some(
            [
                ("app".to_owned(), "weather".to_owned()),
                ("mcp.tether.dev/endpoint".to_owned(), "weather".to_owned()),
            ]
            .into(),
        );
        assert_eq!(client.metadata.name.as_deref(), Some("weather-mcp"));
        let spec = client.spec.as_ref().unwrap();
        assert_eq!(
            spec.selector, injected,
            "clients reach only pods with the sidecar: an old pod of the injection's rollout \
             has nothing on the MCP port"
        );
        let int = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int;
        assert_eq!(spec.ports.as_ref().unwrap()[0].port, 8080);
        assert_eq!(spec.ports.as_ref().unwrap()[0].target_port, Some(int(8080)));
        let spec = peers.spec.as_ref().unwrap();
        assert_eq!(peers.metadata.name.as_deref(), Some("weather-peers"));
        assert_eq!(
            spec.selector, injected,
            "the peer Service lists only the pods injected for this endpoint"
        );
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        let ports = spec.ports.as_ref().unwrap();
        assert_eq!(ports[0].port, 9902);
        assert_eq!(ports[0].target_port, Some(int(9902)));
        assert_eq!(ports[1].target_port, Some(int(8080)));
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

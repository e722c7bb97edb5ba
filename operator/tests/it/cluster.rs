//! Scenarios of what a real cluster does to the operator, against the in-memory API server
//! ([`crate::support`]) with its field ownership, conflicts, defaults, validation and the behaviour of
//! other controllers ([`crate::support::cluster`]). Each states the behaviour the operator must have:
//! numeric Service target ports, an unforced injection under a field manager per endpoint,
//! stable resource notation, port names, two endpoints on one Deployment, names taken or
//! invalid, leader election with one field manager per candidate, the restricted Pod Security
//! Standard, a Secret per endpoint uid, and deletion, Events and their notes.

use std::time::Duration;

use crate::support::cluster::{collect_garbage, restricted_violations, service_endpoint_ports};
use crate::support::operator::{
    DEPLOY_PATH, ENDPOINTS, EP_PATH, EVENTS_PATH, NS, Operator, applied_by_kubectl,
    assert_degraded_at, assert_degraded_only, condition, degraded, deployment, endpoint,
    endpoint_named, events, injected, manifest, objects, pod_spec, pods_rolled, reconcile_once,
};
use crate::support::{
    Shared, api_created_by, api_with, apply_as, client_holding, client_of, create_as, delete,
    namespace, paths, stored, update_as,
};
use http::Method;
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use tether_fake_kube::owners;
use tether_operator::admission::NAMESPACE_OPT_IN_LABEL;
use tether_operator::leader::{Election, LEASE_SECONDS, lead};

const GRACE: &str = ".spec.template.spec.terminationGracePeriodSeconds";
const SERVICE_ACCOUNT: &str = ".spec.template.spec.serviceAccountName";
const SERVICES: &str = "/api/v1/namespaces/tools/services";
const PODS: &str = "/api/v1/namespaces/tools/pods";

#[tokio::test]
async fn every_service_port_reaches_the_sidecar_on_kubernetes_1_32() {
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())]);
    reconcile_once(&api).await;
    let template = stored(&api, DEPLOY_PATH)["spec"]["template"].clone();
    for (service, wanted) in [
        ("weather-mcp", vec![8080]),
        ("weather-peers", vec![8080, 9902]),
    ] {
        let path = format!("{SERVICES}/{service}");
        let ports = service_endpoint_ports(&api, &path, &template, (1, 32));
        let mut resolved: Vec<Option<i64>> = ports.iter().map(|(_, p)| *p).collect();
        resolved.sort_unstable();
        let wanted: Vec<Option<i64>> = wanted.into_iter().map(Some).collect();
        assert_eq!(resolved, wanted, "{service}: {ports:?}");
    }
}

#[tokio::test]
async fn a_grace_period_helm_owns_is_a_field_conflict_until_it_is_long_enough() {
    let mut d = deployment();
    d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(30);
    let api = api_created_by("helm", &[(EP_PATH, endpoint(true)), (DEPLOY_PATH, d)]);
    let before = stored(&api, DEPLOY_PATH);
    let (result, _) = Operator::new(&api).reconcile(EP_PATH).await;
    assert!(result.is_ok(), "a conflict is no error: {result:?}");
    let condition = degraded(&api, EP_PATH);
    assert_eq!(
        (&condition["status"], &condition["reason"]),
        (&json!("True"), &json!("FieldConflict")),
        "{condition}"
    );
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains(GRACE) && message.contains("helm"),
        "{message}"
    );
    assert_eq!(
        stored(&api, DEPLOY_PATH),
        before,
        "the Deployment is left alone"
    );
    assert_eq!(owners(&before, GRACE), ["helm"]);
    // The user raises it in the chart: long enough, the sidecar goes in and the value stays theirs.
    let mut raised = before;
    raised["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(600);
    update_as(&api, "helm", DEPLOY_PATH, &raised).unwrap();
    let (result, _) = Operator::new(&api).reconcile(EP_PATH).await;
    assert!(result.is_ok(), "{result:?}");
    assert!(injected(&api), "{}", pod_spec(&api));
    let after = stored(&api, DEPLOY_PATH);
    assert_eq!(
        after["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
        600
    );
    assert_eq!(
        owners(&after, GRACE),
        ["helm"],
        "the operator does not co-own it"
    );
}

#[tokio::test]
async fn the_grace_period_the_operator_sets_survives_the_users_applies_without_a_roll() {
    let api = applied_by_kubectl(endpoint(true), &manifest());
    reconcile_once(&api).await;
    pods_rolled(&api);
    reconcile_once(&api).await;
    let generation = stored(&api, DEPLOY_PATH)["metadata"]["generation"].clone();
    for _ in 0..2 {
        apply_as(&api, "kubectl", DEPLOY_PATH, &manifest(), false)
            .expect("the user's own manifest applies");
        reconcile_once(&api).await;
        let d = stored(&api, DEPLOY_PATH);
        assert_eq!(
            d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
            75
        );
        assert_eq!(d["metadata"]["generation"], generation, "no flip, no roll");
    }
    let d = stored(&api, DEPLOY_PATH);
    assert_eq!(owners(&d, GRACE), ["tether-operator/weather"]);
}

#[tokio::test]
async fn the_grace_period_follows_the_drain_timeout_down() {
    let mut ep = endpoint(true);
    ep["spec"]["drain"] = json!({"timeout": "120s"});
    let api = applied_by_kubectl(ep, &manifest());
    reconcile_once(&api).await;
    let grace = |api: &Shared| pod_spec(api)["terminationGracePeriodSeconds"].clone();
    assert_eq!(grace(&api), 135);
    {
        let mut a = api.lock().unwrap();
        let ep = a.objects.get_mut(EP_PATH).unwrap();
        ep["spec"]["drain"]["timeout"] = json!("30s");
        ep["metadata"]["generation"] = json!(2);
    }
    reconcile_once(&api).await;
    assert_eq!(grace(&api), 45);
}

#[tokio::test]
async fn a_service_account_helm_owns_is_a_field_conflict() {
    let mut d = deployment();
    let pod = &mut d["spec"]["template"]["spec"];
    pod["serviceAccountName"] = json!("default");
    pod["terminationGracePeriodSeconds"] = json!(600);
    let api = api_created_by("helm", &[(EP_PATH, endpoint(true)), (DEPLOY_PATH, d)]);
    let before = stored(&api, DEPLOY_PATH);
    let (result, _) = Operator::new(&api).reconcile(EP_PATH).await;
    assert!(result.is_ok(), "{result:?}");
    let condition = degraded(&api, EP_PATH);
    assert_eq!(condition["reason"], "FieldConflict", "{condition}");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains(SERVICE_ACCOUNT) && message.contains("helm"),
        "{message}"
    );
    assert_eq!(stored(&api, DEPLOY_PATH), before);
}

#[tokio::test]
async fn the_user_renames_a_container_whose_manifest_carries_the_drain_hook() {
    let mut theirs = manifest();
    theirs["spec"]["template"]["spec"]["containers"][0]["lifecycle"] =
        json!({"preStop": {"httpGet": {"path": "/drained", "port": 9901}}});
    let api = applied_by_kubectl(endpoint(true), &theirs);
    reconcile_once(&api).await;
    assert!(injected(&api));
    let mut renamed = theirs;
    renamed["spec"]["template"]["spec"]["containers"][0]["name"] = json!("app");
    apply_as(&api, "kubectl", DEPLOY_PATH, &renamed, false)
        .expect("the operator co-owns nothing of the user's container");
    let names: Vec<Value> = pod_spec(&api)["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].clone())
        .collect();
    assert_eq!(names, ["app"]);
}

#[tokio::test]
async fn sidecar_resources_in_another_notation_are_written_once() {
    let mut ep = endpoint(true);
    ep["spec"]["sidecar"] = json!({"resources": {"requests": {"cpu": "0.5", "memory": "1024Mi"}}});
    let api = api_with(&[(EP_PATH, ep), (DEPLOY_PATH, deployment())]);
    reconcile_once(&api).await;
    reconcile_once(&api).await;
    // The Deployment controller rolled the pods to the injected template; the status says so.
    pods_rolled(&api);
    reconcile_once(&api).await;
    for _ in 0..2 {
        let (_, writes) = reconcile_once(&api).await;
        assert_eq!(
            paths(&writes),
            Vec::<String>::new(),
            "{:?}",
            events(&writes)
        );
        let progressing = condition(&stored(&api, EP_PATH)["status"], "Progressing");
        assert_ne!(progressing["reason"], "RollingOut", "{progressing}");
    }
}

#[tokio::test]
async fn a_user_port_named_like_the_sidecars_is_a_port_conflict() {
    let mut d = deployment();
    d["spec"]["template"]["spec"]["containers"][0]["ports"] =
        json!([{"containerPort": 3000, "name": "tether-admin"}]);
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, d)]);
    let before = stored(&api, DEPLOY_PATH);
    let (_, writes) = reconcile_once(&api).await;
    assert_degraded_only(&writes, "PortConflict");
    assert_eq!(stored(&api, DEPLOY_PATH), before);
}

#[tokio::test]
async fn deleting_a_second_endpoint_of_a_deployment_keeps_the_first_ones_injection() {
    let [a, b] = ["a", "b"].map(|n| format!("{ENDPOINTS}/{n}"));
    let api = api_with(&[
        (&a, endpoint_named("a", "e-a", true)),
        (&b, endpoint_named("b", "e-b", true)),
        (DEPLOY_PATH, deployment()),
    ]);
    // Two endpoints on one Deployment: the namespace opts every Deployment in.
    namespace(&api, NS, json!({NAMESPACE_OPT_IN_LABEL: "enabled"}));
    let operator = Operator::new(&api);
    operator.reconcile(&a).await.0.expect("a injects");
    assert!(injected(&api));
    let (result, writes) = operator.reconcile(&b).await;
    result.expect("b's conflict is no error");
    assert_degraded_at(&writes, &b, "ContainerNameClash");
    let template = stored(&api, DEPLOY_PATH)["spec"]["template"].clone();
    delete(&api, &b).unwrap();
    operator.reconcile(&b).await.0.expect("b's cleanup");
    assert!(!api.lock().unwrap().objects.contains_key(&b), "b is gone");
    let after = stored(&api, DEPLOY_PATH)["spec"]["template"].clone();
    assert_eq!(
        after["metadata"]["annotations"]["mcp.tether.dev/endpoint"],
        "a"
    );
    assert_eq!(after, template, "a's sidecar, annotations and volumes stay");
}

#[tokio::test]
async fn a_service_of_the_same_name_that_is_not_ours_is_name_taken_and_left_alone() {
    let theirs = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "weather-mcp", "namespace": NS},
        "spec": {"selector": {"app": "weather"}, "ports": [{"port": 80, "targetPort": 3000}]}});
    let mut controlled = theirs.clone();
    controlled["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
        "kind": "Deployment", "name": "other", "uid": "other-uid", "controller": true}]);
    let path = format!("{SERVICES}/weather-mcp");
    for service in [theirs, controlled] {
        let api = api_with(&[
            (EP_PATH, endpoint(true)),
            (DEPLOY_PATH, deployment()),
            (&path, service),
        ]);
        let before = stored(&api, &path);
        let (result, _) = Operator::new(&api).reconcile(EP_PATH).await;
        assert!(result.is_ok(), "no API error loop: {result:?}");
        let condition = degraded(&api, EP_PATH);
        assert_eq!(condition["reason"], "NameTaken", "{condition}");
        let message = condition["message"].as_str().unwrap();
        assert!(message.contains("Service/weather-mcp"), "{message}");
        assert_eq!(stored(&api, &path), before, "the Service is untouched");
    }
}

#[tokio::test]
async fn a_second_candidate_does_not_take_the_lease_the_first_holds() {
    const LEASE: &str =
        "/apis/coordination.k8s.io/v1/namespaces/tether-system/leases/tether-operator";
    let election = |identity: &str| Election {
        namespace: "tether-system".into(),
        name: "tether-operator".into(),
        identity: identity.into(),
    };
    let api = api_with(&[]);
    // operator-1 finds the Lease free and claims it; its claim waits until operator-0 holds it.
    let (client, mut claim) = client_holding(&api, "tether-system", Method::PATCH, LEASE);
    let second = tokio::spawn(async move { lead(client, &election("operator-1")).await });
    tokio::time::timeout(Duration::from_secs(5), claim.arrived())
        .await
        .expect("operator-1 claims the free Lease");
    let first = lead(client_of(&api, "tether-system"), &election("operator-0"))
        .await
        .expect("operator-0 takes the Lease");
    assert!(*first.borrow());
    claim.release();
    let waited = Duration::from_secs(2 * LEASE_SECONDS / 3);
    let took = tokio::time::timeout(waited, second).await;
    assert!(took.is_err(), "operator-1 took the Lease operator-0 holds");
    let lease = stored(&api, LEASE);
    assert_eq!(lease["spec"]["holderIdentity"], "operator-0", "{lease}");
}

#[tokio::test]
async fn the_injected_sidecar_passes_the_restricted_pod_security_standard() {
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())]);
    reconcile_once(&api).await;
    assert!(injected(&api));
    let violations = restricted_violations(&pod_spec(&api));
    assert_eq!(violations.get("tether-sidecar"), None, "{violations:?}");
}

#[tokio::test]
async fn an_endpoint_created_again_under_its_name_mounts_a_secret_of_its_own() {
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())]);
    let secret = |api: &Shared| {
        let volumes = pod_spec(api)["volumes"].clone();
        let volume = volumes
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["secret"].is_object()).cloned());
        volume.expect("a Secret volume")["secret"]["secretName"].clone()
    };
    reconcile_once(&api).await;
    let first = secret(&api);
    delete(&api, EP_PATH).unwrap();
    reconcile_once(&api).await;
    assert!(!api.lock().unwrap().objects.contains_key(EP_PATH));
    assert!(
        !collect_garbage(&api).is_empty(),
        "the children go with their owner"
    );
    let created = create_as(&api, "kubectl", ENDPOINTS, &endpoint(false)).unwrap();
    reconcile_once(&api).await;
    reconcile_once(&api).await;
    let second = secret(&api);
    assert_ne!(second, first, "the new endpoint's Secret is its own");
    let path = format!(
        "/api/v1/namespaces/tools/secrets/{}",
        second.as_str().unwrap()
    );
    let owner = &stored(&api, &path)["metadata"]["ownerReferences"][0];
    assert_eq!(owner["uid"], created["metadata"]["uid"]);
}

#[tokio::test]
async fn an_endpoint_name_no_service_can_carry_is_name_invalid() {
    for name in ["weather.v2", "1weather"] {
        let path = format!("{ENDPOINTS}/{name}");
        let api = api_with(&[
            (&path, endpoint_named(name, "e-1", true)),
            (DEPLOY_PATH, deployment()),
        ]);
        namespace(&api, NS, json!({NAMESPACE_OPT_IN_LABEL: "enabled"}));
        let (result, writes) = Operator::new(&api).reconcile(&path).await;
        assert!(result.is_ok(), "{name}: {result:?}");
        assert_degraded_at(&writes, &path, "NameInvalid");
    }
}

#[tokio::test]
async fn the_finalizer_stays_while_pods_run_with_the_injection() {
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())]);
    reconcile_once(&api).await;
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "weather-7d4b9-x2x9z", "namespace": NS,
                     "labels": {"app": "weather"},
                     "annotations": {"mcp.tether.dev/endpoint": "weather"}},
        "spec": {"containers": [{"name": "server", "image": "srv"}],
                 "initContainers": [{"name": "tether-sidecar", "image": "tether-sidecar:test",
                                     "restartPolicy": "Always"}]}});
    create_as(&api, "kube-controller-manager", PODS, &pod).unwrap();
    delete(&api, EP_PATH).unwrap();
    let operator = Operator::new(&api);
    let (result, _) = operator.reconcile(EP_PATH).await;
    if let Ok(action) = &result {
        assert_ne!(*action, Action::await_change(), "it is looked at again");
    }
    assert!(!injected(&api), "the injection is released at once");
    let ep = api.lock().unwrap().objects.get(EP_PATH).cloned();
    let ep = ep.expect("the endpoint stays while a pod runs with its sidecar");
    assert_eq!(
        ep["metadata"]["finalizers"],
        json!(["mcp.tether.dev/injection"]),
        "{ep}"
    );
    delete(&api, &format!("{PODS}/weather-7d4b9-x2x9z")).unwrap();
    let (result, _) = operator.reconcile(EP_PATH).await;
    result.expect("the last cleanup");
    assert!(
        !api.lock().unwrap().objects.contains_key(EP_PATH),
        "the finalizer went"
    );
}

/// The Events stored for the endpoint `weather` with `reason`, as their notes.
fn stored_notes(api: &Shared, reason: &str) -> Vec<String> {
    let a = api.lock().unwrap();
    let prefix = format!("{EVENTS_PATH}/");
    a.objects
        .iter()
        .filter(|(k, e)| k.starts_with(&prefix) && e["reason"] == reason)
        .map(|(_, e)| e["note"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn a_long_message_is_kept_whole_in_the_status_and_truncated_in_its_event() {
    let mut ep = endpoint(true);
    let origins: Vec<String> = (0..12)
        .map(|i| format!("https://app{i}.example.com:99999"))
        .collect();
    ep["spec"]["origins"] = json!({"allow": origins});
    let typed: tether_crds::McpEndpoint = serde_json::from_value(ep.clone()).unwrap();
    kube::core::cel::validate_cel(&typed)
        .expect("the CRD's rules admit it; only the ports are out of range");
    let api = api_with(&[(EP_PATH, ep), (DEPLOY_PATH, deployment())]);
    let (result, _) = Operator::new(&api).reconcile(EP_PATH).await;
    assert!(result.is_ok(), "{result:?}");
    let condition = degraded(&api, EP_PATH);
    assert_eq!(condition["reason"], "InvalidSpec", "{condition}");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.len() > 1024 && message.contains("allow[11]"),
        "the whole message: {message}"
    );
    let notes = stored_notes(&api, "InvalidSpec");
    assert_eq!(notes.len(), 1, "one Event is published: {notes:?}");
    assert!(
        !notes[0].is_empty() && notes[0].len() <= 1024,
        "{} bytes",
        notes[0].len()
    );
}

#[tokio::test]
async fn two_degraded_episodes_with_one_reason_publish_their_own_notes() {
    let with_ports = |api: &Shared, ports: Value| {
        let mut d = stored(api, DEPLOY_PATH);
        d["spec"]["template"]["spec"]["containers"][0]["ports"] = ports;
        update_as(api, "kubectl-edit", DEPLOY_PATH, &d).unwrap();
    };
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())]);
    let operator = Operator::new(&api);
    with_ports(
        &api,
        json!([{"containerPort": 3000}, {"containerPort": 8080}]),
    );
    operator.reconcile(EP_PATH).await.0.unwrap();
    let first = degraded(&api, EP_PATH)["message"].clone();
    with_ports(&api, json!([{"containerPort": 3000}]));
    let (_, writes) = operator.reconcile(EP_PATH).await;
    assert!(
        objects(&writes).contains(&format!("PATCH {DEPLOY_PATH}")),
        "fixed: injected"
    );
    with_ports(
        &api,
        json!([{"containerPort": 3000}, {"containerPort": 9902}]),
    );
    operator.reconcile(EP_PATH).await.0.unwrap();
    let second = degraded(&api, EP_PATH)["message"].clone();
    assert_eq!(degraded(&api, EP_PATH)["reason"], "PortConflict");
    assert_ne!(first, second);
    let mut notes = stored_notes(&api, "PortConflict");
    notes.sort();
    let mut wanted = vec![
        first.as_str().unwrap().to_owned(),
        second.as_str().unwrap().to_owned(),
    ];
    wanted.sort();
    assert_eq!(notes, wanted);
}

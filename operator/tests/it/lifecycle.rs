//! What a platform team meets over an endpoint's life, against the in-memory API server
//! ([`crate::support`]): deploy tools that own the grace period or apply with server-side
//! apply, deletion while pods still run, an endpoint re-created before the garbage collector
//! caught up, hand edits of what the operator owns, and sidecar resources taken out of the spec.

use serde_json::{Value, json};

use crate::support::cluster::collect_garbage;
use crate::support::operator::{
    DEPLOY_PATH, ENDPOINTS, EP_PATH, NS, Operator, applied_by_kubectl, degraded, deployment,
    endpoint, injected, injected_example, manifest, pod_spec, pods_rolled,
};
use crate::support::{
    Shared, api_created_by, api_with, apply_as, create_as, delete, paths, stored, update_as,
};
use tether_fake_kube::{managed_fields, owners};

const GRACE: &str = ".spec.template.spec.terminationGracePeriodSeconds";
const PODS: &str = "/api/v1/namespaces/tools/pods";
const CONFIG_MAP_PATH: &str = "/api/v1/namespaces/tools/configmaps/weather-tether";

/// The Deployment's pod template.
fn template(api: &Shared) -> Value {
    stored(api, DEPLOY_PATH)["spec"]["template"].clone()
}

/// The field managers of the object at `path`.
fn managers(api: &Shared, path: &str) -> Vec<String> {
    let entries = managed_fields(&stored(api, path));
    entries.into_iter().map(|e| e.manager).collect()
}

/// Edits the stored endpoint `weather` with `edit` and writes it back as `kubectl edit` does.
fn edit_endpoint(api: &Shared, edit: impl FnOnce(&mut Value)) {
    let mut ep = stored(api, EP_PATH);
    edit(&mut ep);
    update_as(api, "kubectl-edit", EP_PATH, &ep).expect("the user's edit");
}

/// Reconciles until the endpoint settles (the pods rolled after each), asserting that no
/// reconcile fails; returns the pod templates the Deployment went through, the first included.
async fn settle(operator: &Operator, api: &Shared) -> Vec<Value> {
    let mut templates = vec![template(api)];
    for _ in 0..3 {
        let (result, _) = operator.reconcile(EP_PATH).await;
        result.expect("no reconcile fails");
        pods_rolled(api);
        let now = template(api);
        if templates.last() != Some(&now) {
            templates.push(now);
        }
    }
    templates
}

/// Reconciles the example endpoint once and asserts that it is `Degraded` with `FieldConflict`
/// (no error); returns the condition's message.
async fn field_conflict(operator: &Operator, api: &Shared) -> String {
    let (result, _) = operator.reconcile(EP_PATH).await;
    result.expect("a conflict is no error");
    let conflict = degraded(api, EP_PATH);
    assert_eq!(conflict["reason"], "FieldConflict", "{conflict}");
    conflict["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_helm_3_deployment_without_a_grace_period_conflicts_until_the_chart_sets_one() {
    let api = api_created_by(
        "helm",
        &[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())],
    );
    let operator = Operator::new(&api);
    let fresh = stored(&api, DEPLOY_PATH);
    // Helm's create owns the API server's default of 30 s: too short for the drain.
    assert_eq!(owners(&fresh, GRACE), ["helm"]);
    let message = field_conflict(&operator, &api).await;
    assert!(
        message.contains(GRACE) && message.contains("\"helm\"") && message.contains("at least 75"),
        "{message}"
    );
    assert!(!injected(&api));
    assert_eq!(
        stored(&api, DEPLOY_PATH),
        fresh,
        "the Deployment is left alone"
    );

    // The chart sets 75 s (helm upgrade, an update as "helm").
    let mut chart = stored(&api, DEPLOY_PATH);
    chart["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(75);
    update_as(&api, "helm", DEPLOY_PATH, &chart).unwrap();
    operator.reconcile(EP_PATH).await.0.expect("the injection");
    assert!(injected(&api), "{}", pod_spec(&api));
    assert_eq!(degraded(&api, EP_PATH)["status"], "False");
    assert_eq!(pod_spec(&api)["terminationGracePeriodSeconds"], 75);
    assert_eq!(owners(&stored(&api, DEPLOY_PATH), GRACE), ["helm"]);

    // A longer drain needs 135 s: Helm's 75 s conflicts again, and the message says so.
    edit_endpoint(&api, |ep| ep["spec"]["drain"] = json!({"timeout": "120s"}));
    let injected_template = template(&api);
    let message = field_conflict(&operator, &api).await;
    assert!(message.contains("at least 135"), "{message}");
    assert_eq!(template(&api), injected_template, "the pods keep running");
}

#[tokio::test]
async fn a_server_side_applied_manifest_without_a_grace_period_reapplies_unchanged() {
    let api = applied_by_kubectl(endpoint(true), &manifest());
    let operator = Operator::new(&api);
    settle(&operator, &api).await;
    assert!(injected(&api));
    assert_eq!(degraded(&api, EP_PATH)["status"], "False");
    let before = stored(&api, DEPLOY_PATH);
    let reapplied = apply_as(&api, "kubectl", DEPLOY_PATH, &manifest(), false)
        .expect("the user's unchanged manifest applies without a conflict");
    assert_eq!(
        reapplied["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"],
        "it changes nothing"
    );
    assert_eq!(
        reapplied["metadata"]["generation"],
        before["metadata"]["generation"]
    );
    operator.assert_quiet(EP_PATH).await;
}

#[tokio::test]
async fn a_deleted_endpoints_children_stay_until_its_last_pod_is_gone() {
    let (api, operator) = injected_example().await;
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "weather-7d4b9-x2x9z", "namespace": NS,
                     "labels": {"app": "weather", "mcp.tether.dev/endpoint": "weather"}},
        "spec": {"containers": [{"name": "server", "image": "srv"}]}});
    create_as(&api, "kube-controller-manager", PODS, &pod).unwrap();
    delete(&api, EP_PATH).unwrap();
    for round in 0..2 {
        let (result, writes) = operator.reconcile(EP_PATH).await;
        assert!(
            result.is_err(),
            "round {round}: waits for the pod: {result:?}"
        );
        if round > 0 {
            assert_eq!(
                paths(&writes),
                Vec::<String>::new(),
                "a wait writes nothing"
            );
        }
        assert!(!injected(&api), "the injection is released at once");
        assert!(api.lock().unwrap().objects.contains_key(EP_PATH));
        assert_eq!(
            collect_garbage(&api),
            Vec::<String>::new(),
            "the children stay"
        );
    }
    assert!(api.lock().unwrap().objects.contains_key(CONFIG_MAP_PATH));
    delete(&api, &format!("{PODS}/weather-7d4b9-x2x9z")).unwrap();
    operator
        .reconcile(EP_PATH)
        .await
        .0
        .expect("the last cleanup");
    assert!(!api.lock().unwrap().objects.contains_key(EP_PATH));
    let mut collected = collect_garbage(&api);
    collected.sort();
    let kinds: Vec<&str> = collected
        .iter()
        .map(|p| p.rsplit('/').nth(1).unwrap_or_default())
        .collect();
    assert_eq!(
        kinds,
        [
            "configmaps",
            "secrets",
            "serviceaccounts",
            "services",
            "services",
            "poddisruptionbudgets",
            "rolebindings",
            "roles",
        ],
        "{collected:?}"
    );
}

#[tokio::test]
async fn an_endpoint_created_again_before_the_garbage_collector_ran_waits_then_converges() {
    let (api, operator) = injected_example().await;
    delete(&api, EP_PATH).unwrap();
    operator.reconcile(EP_PATH).await.0.expect("the cleanup");
    assert!(!api.lock().unwrap().objects.contains_key(EP_PATH));
    // The garbage collector has not run yet: the old children are still there.
    create_as(&api, "kubectl", ENDPOINTS, &endpoint(false)).unwrap();
    operator.reconcile(EP_PATH).await.0.expect("the finalizer");
    operator
        .reconcile(EP_PATH)
        .await
        .0
        .expect("a taken name is no error");
    let taken = degraded(&api, EP_PATH);
    assert_eq!(taken["reason"], "NameTaken", "{taken}");
    let (result, writes) = operator.reconcile(EP_PATH).await;
    result.expect("no error loop");
    assert_eq!(
        paths(&writes),
        Vec::<String>::new(),
        "a repeat writes nothing"
    );
    assert!(!collect_garbage(&api).is_empty());
    operator.reconcile(EP_PATH).await.0.expect("the injection");
    assert_eq!(degraded(&api, EP_PATH)["status"], "False");
    assert!(injected(&api));
}

#[tokio::test]
async fn a_hand_edit_of_the_endpoints_config_map_is_restored() {
    let (api, operator) = injected_example().await;
    let ours = stored(&api, CONFIG_MAP_PATH);
    let mut edited = ours.clone();
    edited["data"]["endpoint.yaml"] = json!("tampered: true\n");
    update_as(&api, "kubectl-edit", CONFIG_MAP_PATH, &edited).unwrap();
    let (result, writes) = operator.reconcile(EP_PATH).await;
    result.expect("restored without an error");
    assert!(paths(&writes).contains(&format!("PATCH {CONFIG_MAP_PATH}")));
    let restored = stored(&api, CONFIG_MAP_PATH);
    assert_eq!(restored["data"], ours["data"]);
    assert!(
        !managers(&api, CONFIG_MAP_PATH)
            .iter()
            .any(|m| m == "kubectl-edit")
    );
    operator.assert_quiet(EP_PATH).await;
}

#[tokio::test]
async fn a_hand_edit_of_the_sidecar_image_is_restored_like_a_childs() {
    let (api, operator) = injected_example().await;
    let injected_image =
        stored(&api, DEPLOY_PATH)["spec"]["template"]["spec"]["initContainers"][0]["image"].clone();
    let mut edited = stored(&api, DEPLOY_PATH);
    let image = &mut edited["spec"]["template"]["spec"]["initContainers"][0]["image"];
    *image = json!("tether-sidecar:hotfix");
    update_as(&api, "kubectl-edit", DEPLOY_PATH, &edited).unwrap();
    // The sidecar container is tether's alone (spec.sidecar.image chooses its image): the edit
    // is overwritten, as on the endpoint's own children, and no conflict is reported.
    let (result, writes) = operator.reconcile(EP_PATH).await;
    result.expect("restored without an error");
    assert!(paths(&writes).contains(&format!("PATCH {DEPLOY_PATH}")));
    assert_eq!(degraded(&api, EP_PATH)["status"], "False");
    let restored = stored(&api, DEPLOY_PATH);
    assert_eq!(
        restored["spec"]["template"]["spec"]["initContainers"][0]["image"],
        injected_image
    );
    let image_path = r#".spec.template.spec.initContainers[name="tether-sidecar"].image"#;
    assert_eq!(owners(&restored, image_path), ["tether-operator/weather"]);
    pods_rolled(&api);
    operator.reconcile(EP_PATH).await.0.expect("settled");
    operator.assert_quiet(EP_PATH).await;
}

#[tokio::test]
async fn sidecar_resources_taken_out_of_the_spec_fall_back_to_the_defaults() {
    let mut ep = endpoint(true);
    ep["spec"]["sidecar"] = json!({"resources": {
        "requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi", "cpu": "1"}}});
    let api = api_with(&[(EP_PATH, ep), (DEPLOY_PATH, deployment())]);
    let operator = Operator::new(&api);
    let resources = |api: &Shared| pod_spec(api)["initContainers"][0]["resources"].clone();
    settle(&operator, &api).await;
    edit_endpoint(&api, |ep| {
        ep["spec"]["sidecar"]["resources"]["limits"] = json!({"memory": "512Mi"});
    });
    settle(&operator, &api).await;
    assert_eq!(
        resources(&api),
        json!({"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}),
        "a limit taken out goes"
    );
    edit_endpoint(&api, |ep| {
        ep["spec"]["sidecar"]
            .as_object_mut()
            .unwrap()
            .remove("resources");
    });
    settle(&operator, &api).await;
    assert_eq!(
        resources(&api),
        json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}),
        "the operator's defaults"
    );
    // An explicit `{}` asks for none, as in a pod spec, with one rollout and no flapping.
    edit_endpoint(&api, |ep| ep["spec"]["sidecar"]["resources"] = json!({}));
    let templates = settle(&operator, &api).await;
    assert_eq!(resources(&api), json!({}));
    assert_eq!(templates.len(), 2, "one rollout");
}

//! What a platform team meets over an endpoint's life, against the in-memory API server
//! ([`crate::support`]): an operator upgrade over injections of the previous release (its shared
//! field manager `tether-operator`, the Secret of the name without the UID), deploy tools that
//! own the grace period or apply with server-side apply, deletion while pods still run, an
//! endpoint re-created before the garbage collector caught up, hand edits of what the operator
//! owns, sidecar resources taken out of the spec, and the sidecars' Role of a release whose
//! sidecars watched Pods.

use http::Method;
use serde_json::{Value, json};

use crate::support::cluster::collect_garbage;
use crate::support::fields::{managed_fields, owners};
use crate::support::operator::{
    DEPLOY_PATH, ENDPOINTS, EP_PATH, NS, Operator, SECRET_PATH, SECRETS, applied_by_kubectl,
    degraded, deployment, endpoint, injected, injected_example, manifest, pod_spec, pods_rolled,
};
use crate::support::{
    Shared, api_created_by, api_with, apply_as, create_as, delete, paths, stored, update_as,
};

/// The field manager of every apply of the previous operator release.
const LEGACY_MANAGER: &str = "tether-operator";
const GRACE: &str = ".spec.template.spec.terminationGracePeriodSeconds";
const PODS: &str = "/api/v1/namespaces/tools/pods";
const CONFIG_MAP_PATH: &str = "/api/v1/namespaces/tools/configmaps/weather-tether";

/// The HMAC Secret as the previous release created it: named after the endpoint alone,
/// controlled by the endpoint `weather` (uid `e-1`).
fn legacy_secret() -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "weather-tether", "namespace": NS,
            "labels": {"app.kubernetes.io/managed-by": "tether-operator"},
            "ownerReferences": [{"apiVersion": "mcp.tether.dev/v1alpha1", "kind": "McpEndpoint",
                "name": "weather", "uid": "e-1", "controller": true, "blockOwnerDeletion": true}]},
        "type": "Opaque", "immutable": true,
        "data": {"secret": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="}})
}

/// The endpoint `weather` and its Deployment, both created by Helm 3, and the Secret of the old
/// name.
fn helm_release_with_legacy_secret() -> Shared {
    let api = api_created_by(
        "helm",
        &[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())],
    );
    create_as(&api, LEGACY_MANAGER, SECRETS, &legacy_secret()).expect("the old Secret");
    api
}

/// A cluster as the previous operator release left it: [`helm_release_with_legacy_secret`],
/// then every apply of one reconcile of today's plan (children and injection), sent forced with
/// the shared field manager `tether-operator`; `older` edits the injection body first (what an
/// older release injected). The pods run the injected template.
async fn left_by_the_previous_operator(older: impl Fn(&mut Value)) -> Shared {
    let api = helm_release_with_legacy_secret();
    let scratch = helm_release_with_legacy_secret();
    let (_, writes) = Operator::new(&scratch).reconcile(EP_PATH).await;
    let applies = writes.iter().filter(|w| {
        w.method == Method::PATCH
            && w.query.contains("fieldManager=tether-operator/weather")
            && !w.path.starts_with(ENDPOINTS)
    });
    let mut injected_by_old = false;
    for write in applies {
        let mut body = write.body.clone();
        if write.path == DEPLOY_PATH {
            older(&mut body);
            injected_by_old = true;
        }
        apply_as(&api, LEGACY_MANAGER, &write.path, &body, true).unwrap_or_else(|status| {
            panic!("the old operator's apply of {}: {status}", write.path)
        });
    }
    assert!(injected_by_old, "the plan has an injection");
    pods_rolled(&api);
    api
}

/// The Deployment's pod template.
fn template(api: &Shared) -> Value {
    stored(api, DEPLOY_PATH)["spec"]["template"].clone()
}

/// The Deployment's `metadata.generation`.
fn generation(api: &Shared) -> i64 {
    stored(api, DEPLOY_PATH)["metadata"]["generation"]
        .as_i64()
        .expect("a generation")
}

/// The field managers of the object at `path`.
fn managers(api: &Shared, path: &str) -> Vec<String> {
    let entries = managed_fields(&stored(api, path));
    entries.into_iter().map(|e| e.manager).collect()
}

/// The name of the Secret the pod template mounts.
fn mounted_secret(api: &Shared) -> Value {
    let volumes = pod_spec(api)["volumes"].clone();
    let secret = volumes
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["secret"].is_object()).cloned());
    secret.expect("a Secret volume")["secret"]["secretName"].clone()
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

/// What an operator upgrade over `api` ([`left_by_the_previous_operator`]) must do: no
/// conflict, `rollouts` changes of the pod template (one at most), the old Secret kept, the
/// shared manager gone, then no writes; and deleting the endpoint leaves the Deployment as Helm
/// created it.
async fn assert_upgrade_takes_over(api: &Shared, rollouts: usize) {
    let helm_created = template(&helm_release_with_legacy_secret());
    let before = generation(api);
    let operator = Operator::new(api);
    let templates = settle(&operator, api).await;
    let condition = degraded(api, EP_PATH);
    assert_eq!(condition["status"], "False", "{condition}");
    assert!(injected(api), "{}", pod_spec(api));
    let pod = pod_spec(api);
    assert_eq!(
        (
            &pod["containers"][0]["lifecycle"]["preStop"],
            &pod["initContainers"][0]["lifecycle"]["preStop"]["exec"]["command"][1],
        ),
        (
            &json!({"httpGet": {"path": "/drained", "port": 9901, "scheme": "HTTP"}}),
            &json!("drain")
        ),
        "the drain starts in the pod, the MCP server waits for it"
    );
    assert_eq!(
        (templates.len() - 1, generation(api) - before),
        (rollouts, i64::try_from(rollouts).unwrap()),
        "rollouts, through the templates {templates:#?}"
    );
    assert_eq!(
        mounted_secret(api),
        "weather-tether-keys-e-1",
        "the key ring"
    );
    let ring = stored(api, SECRET_PATH);
    assert_eq!(
        ring["data"]["secret"],
        legacy_secret()["data"]["secret"],
        "running pods keep their key"
    );
    assert_eq!(
        stored(api, &format!("{SECRETS}/weather-tether"))["data"],
        legacy_secret()["data"],
        "the old Secret stays as it was, for the pods that still mount it"
    );
    let deployment_managers = managers(api, DEPLOY_PATH);
    assert!(
        !deployment_managers.iter().any(|m| m == LEGACY_MANAGER),
        "{deployment_managers:?}"
    );
    let (_, writes) = operator.reconcile(EP_PATH).await;
    assert_eq!(paths(&writes), Vec::<String>::new(), "settled: no writes");

    delete(api, EP_PATH).unwrap();
    operator.reconcile(EP_PATH).await.0.expect("the cleanup");
    assert!(!api.lock().unwrap().objects.contains_key(EP_PATH));
    let left = managers(api, DEPLOY_PATH);
    assert!(
        !left.iter().any(|m| m.starts_with(LEGACY_MANAGER)),
        "{left:?}"
    );
    assert_eq!(
        template(api),
        helm_created,
        "nothing of the injection stays"
    );
}

#[tokio::test]
async fn an_injection_of_the_previous_release_is_taken_over_with_one_rollout() {
    // The release before today's injected no template label, no token volume, no seccomp
    // profile, `preStop` hooks that started the drain over the network (`httpGet /drain`)
    // instead of the drain socket, and one key from the Secret of the name without the UID
    // instead of the key ring.
    let api = left_by_the_previous_operator(|body| {
        let t = &mut body["spec"]["template"];
        t["metadata"].as_object_mut().unwrap().remove("labels");
        let pod = &mut t["spec"];
        let network_drain = json!({"preStop": {"httpGet": {"path": "/drain", "port": 9901}}});
        pod["containers"][0]["lifecycle"] = network_drain.clone();
        pod["volumes"]
            .as_array_mut()
            .unwrap()
            .retain(|v| v["name"] != "tether-token" && v["name"] != "tether-run");
        for volume in pod["volumes"].as_array_mut().unwrap() {
            if volume["name"] == "tether-secret" {
                volume["secret"]["secretName"] = json!("weather-tether");
            }
        }
        let sidecar = &mut pod["initContainers"][0];
        sidecar["lifecycle"] = network_drain;
        let mounts = sidecar["volumeMounts"].as_array_mut().unwrap();
        mounts.retain(|m| m["name"] != "tether-token" && m["name"] != "tether-run");
        let env = sidecar["env"].as_array_mut().unwrap();
        env.retain(|e| e["name"] != "TETHER_DRAIN_SOCKET");
        for var in env.iter_mut().filter(|e| e["name"] == "TETHER_SECRET_DIR") {
            *var = json!({"name": "TETHER_SECRET_FILE", "value": "/etc/tether-secret/secret"});
        }
        sidecar["securityContext"]
            .as_object_mut()
            .unwrap()
            .remove("seccompProfile");
    })
    .await;
    assert_eq!(
        pod_spec(&api)["containers"][0]["lifecycle"]["preStop"]["httpGet"]["path"],
        "/drain"
    );
    assert_upgrade_takes_over(&api, 1).await;
}

#[tokio::test]
async fn an_injection_the_shared_manager_applied_as_today_is_taken_over_without_a_rollout() {
    // Taken over as it is: releasing the shared manager first would drop the sidecar, then put
    // it back (two rollouts, and pods without the sidecar in between).
    let api = left_by_the_previous_operator(|_| {}).await;
    assert_upgrade_takes_over(&api, 0).await;
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

#[tokio::test]
async fn the_sidecars_keep_their_pod_watch_until_no_pod_runs_an_older_sidecar() {
    const ROLE: &str =
        "/apis/rbac.authorization.k8s.io/v1/namespaces/tools/roles/weather-tether-sidecar";
    let (api, operator) = injected_example().await;
    let resources = |api: &Shared| -> Vec<String> {
        let role = stored(api, ROLE);
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["resources"].as_array().unwrap().clone())
            .map(|r| r.as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(resources(&api), ["endpointslices"], "no Pod read");
    // The previous release's Role, and one of its pods still running: its sidecar watches Pods.
    api.lock().unwrap().objects.get_mut(ROLE).unwrap()["rules"] =
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]);
    let old_pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "weather-5c6d7-old", "namespace": NS, "labels": {"app": "weather"}},
        "spec": {"containers": [{"name": "server", "image": "srv"}],
                 "initContainers": [{"name": "tether-sidecar", "image": "tether-sidecar:old",
                     "restartPolicy": "Always",
                     "env": [{"name": "TETHER_POD_SELECTOR", "value": "app=weather"}]}]}});
    create_as(&api, "kube-controller-manager", PODS, &old_pod).unwrap();
    operator.reconcile(EP_PATH).await.0.unwrap();
    assert_eq!(
        resources(&api),
        ["endpointslices", "pods"],
        "kept while the old pod runs"
    );
    operator.assert_quiet(EP_PATH).await;
    // The rollout replaced it: the next reconcile takes the Pod read away.
    delete(&api, &format!("{PODS}/weather-5c6d7-old")).unwrap();
    operator.reconcile(EP_PATH).await.0.unwrap();
    assert_eq!(resources(&api), ["endpointslices"]);
    operator.assert_quiet(EP_PATH).await;
}

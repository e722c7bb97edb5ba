//! The reconcile against a mock API server ([`crate::support`]: kube-rs's `ApiServerVerifier` pattern on
//! `tower_test::mock`, an in-memory server that records every write), so the tests count what a
//! reconcile writes (objects and Events) on create, on a no-op, on a spec change, on delete and on
//! a missing target — and that `tether-operator plan` previews exactly those writes.

use crate::support::operator::{
    DEPLOY_PATH, EP_PATH, EVENTS_PATH, NS, Operator, SECRET_PATH, assert_degraded_only, condition,
    deployment, endpoint, injected, objects, one_event, pods_rolled, reconcile_once,
};
use crate::support::{Shared, Write, api_with, paths};
use http::Method;
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use tether_operator::controller::RECHECK;
use tether_operator::plan::Defaults;

#[tokio::test]
async fn create_adds_the_finalizer_then_applies_everything_once_and_a_no_op_writes_nothing() {
    let api = api_with(&[(EP_PATH, endpoint(false)), (DEPLOY_PATH, deployment())]);
    // 1. Only the finalizer (a JSON patch guarded by a test op).
    let (_, writes) = reconcile_once(&api).await;
    assert_eq!(paths(&writes), [format!("PATCH {EP_PATH}")]);
    assert_eq!(writes[0].body[1]["op"], "add");
    // 2. Everything.
    let (action, writes) = reconcile_once(&api).await;
    assert_eq!(action, Action::requeue(RECHECK));
    let (type_, reason, note) = one_event(&writes);
    assert_eq!((type_.as_str(), reason.as_str()), ("Normal", "Applied"));
    assert!(
        note.contains("ConfigMap/weather-tether") && note.contains("Deployment/weather"),
        "{note}"
    );
    assert_eq!(
        objects(&writes),
        [
            "PATCH /api/v1/namespaces/tools/configmaps/weather-tether".to_owned(),
            "POST /api/v1/namespaces/tools/secrets".to_owned(),
            "PATCH /api/v1/namespaces/tools/services/weather-mcp".to_owned(),
            "PATCH /api/v1/namespaces/tools/services/weather-peers".to_owned(),
            "PATCH /api/v1/namespaces/tools/serviceaccounts/weather-tether-sidecar".to_owned(),
            "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/tools/roles/weather-tether-sidecar"
                .to_owned(),
            "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/tools/rolebindings/weather-tether-sidecar"
                .to_owned(),
            "PATCH /apis/policy/v1/namespaces/tools/poddisruptionbudgets/weather-tether".to_owned(),
            format!("PATCH {DEPLOY_PATH}"),
            format!("PATCH {EP_PATH}/status"),
        ]
    );
    // Each apply with the endpoint's field manager; forced on the endpoint's own children and
    // status, never on the user's Deployment.
    for w in writes.iter().filter(|w| w.method == Method::PATCH) {
        let forced = w.query.contains("force=true");
        assert!(
            w.query.contains("fieldManager=tether-operator/weather")
                && forced != (w.path == DEPLOY_PATH),
            "{w:?}"
        );
    }
    // The key ring's creation too: without one, the API server would name the manager after the
    // client's User-Agent, or `unknown`.
    let secret = writes
        .iter()
        .find(|w| w.method == Method::POST && w.path.ends_with("/secrets"))
        .unwrap();
    assert!(
        secret
            .query
            .contains("fieldManager=tether-operator/weather"),
        "{secret:?}"
    );
    let stored = api.lock().unwrap().objects.clone();
    let created = stored
        .iter()
        .find(|(path, _)| path.starts_with("/api/v1/namespaces/tools/secrets/"))
        .map(|(_, secret)| secret["metadata"]["managedFields"][0]["manager"].clone());
    assert_eq!(created, Some(json!("tether-operator/weather")));
    let status = api.lock().unwrap().objects[EP_PATH]["status"].clone();
    assert_eq!(
        condition(&status, "Progressing")["status"],
        "True",
        "{status}"
    );
    assert_eq!(
        condition(&status, "Degraded")["status"],
        "False",
        "{status}"
    );
    // 3. Nothing changed (the Deployment controller has not rolled the pods yet): nothing
    // written.
    let (_, writes) = reconcile_once(&api).await;
    assert_eq!(paths(&writes), Vec::<String>::new());
    // 4. The pods rolled: only the status moves (Ready, Progressing complete).
    pods_rolled(&api);
    let (_, writes) = reconcile_once(&api).await;
    assert_eq!(paths(&writes), [format!("PATCH {EP_PATH}/status")]);
    let status = &writes[0].body["status"];
    assert_eq!(condition(status, "Ready")["status"], "True", "{status}");
    assert_eq!(
        condition(status, "Progressing")["reason"],
        "Complete",
        "{status}"
    );
    assert_eq!(status["routable"], 2);
}

#[tokio::test]
async fn a_data_plane_change_patches_only_the_config_map_and_the_status() {
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())]);
    reconcile_once(&api).await;
    pods_rolled(&api);
    reconcile_once(&api).await;
    let secret_before = api.lock().unwrap().objects[SECRET_PATH].clone();
    {
        let mut a = api.lock().unwrap();
        let ep = a.objects.get_mut(EP_PATH).unwrap();
        ep["spec"]["buffer"] = json!({"maxEvents": 64});
        ep["metadata"]["generation"] = json!(2);
    }
    let (_, writes) = reconcile_once(&api).await;
    assert_eq!(
        objects(&writes),
        [
            "PATCH /api/v1/namespaces/tools/configmaps/weather-tether".to_owned(),
            format!("PATCH {EP_PATH}/status"),
        ]
    );
    assert_eq!(
        one_event(&writes).2,
        "applied ConfigMap/weather-tether; running sidecars reload the configuration without a restart"
    );
    let manifest = writes[0].body["data"]["endpoint.yaml"].as_str().unwrap();
    assert!(manifest.contains("maxEvents: 64"), "{manifest}");
    let a = api.lock().unwrap();
    assert_eq!(a.objects[SECRET_PATH], secret_before);
    assert_eq!(a.objects[EP_PATH]["status"]["observedGeneration"], 2);
    let progressing = condition(&a.objects[EP_PATH]["status"], "Progressing");
    assert_eq!(progressing["status"], "False", "{progressing}");
}

#[tokio::test]
async fn a_pod_setting_change_also_rolls_the_pods_and_progressing_says_so() {
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())]);
    reconcile_once(&api).await;
    pods_rolled(&api);
    reconcile_once(&api).await;
    let before = api.lock().unwrap().objects[DEPLOY_PATH]["spec"]["template"].clone();
    {
        let mut a = api.lock().unwrap();
        let ep = a.objects.get_mut(EP_PATH).unwrap();
        ep["spec"]["upstream"] = json!({"port": 3000, "path": "/v2/mcp"});
        ep["metadata"]["generation"] = json!(2);
    }
    let (_, writes) = reconcile_once(&api).await;
    assert_eq!(
        objects(&writes),
        [
            "PATCH /api/v1/namespaces/tools/configmaps/weather-tether".to_owned(),
            format!("PATCH {DEPLOY_PATH}"),
            format!("PATCH {EP_PATH}/status"),
        ]
    );
    assert!(
        one_event(&writes)
            .2
            .ends_with("the pod template changed, so the pods are replaced"),
        "{:?}",
        one_event(&writes)
    );
    let a = api.lock().unwrap();
    let after = &a.objects[DEPLOY_PATH]["spec"]["template"];
    let settings = |t: &Value| t["metadata"]["annotations"]["mcp.tether.dev/pod-settings"].clone();
    assert_ne!(settings(&before), settings(after));
    assert!(settings(after).as_str().unwrap().contains("/v2/mcp"));
    let progressing = condition(&a.objects[EP_PATH]["status"], "Progressing");
    assert_eq!(progressing["status"], "True", "{progressing}");
    assert_eq!(progressing["reason"], "RollingOut", "{progressing}");
    assert!(
        progressing["message"]
            .as_str()
            .unwrap()
            .contains("need new pods"),
        "{progressing}"
    );
}

#[tokio::test]
async fn delete_removes_the_injection_then_the_finalizer() {
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())]);
    reconcile_once(&api).await;
    let injected = api.lock().unwrap().objects[DEPLOY_PATH].clone();
    assert_eq!(
        injected["spec"]["template"]["spec"]["initContainers"][0]["name"],
        "tether-sidecar"
    );
    api.lock().unwrap().objects.get_mut(EP_PATH).unwrap()["metadata"]["deletionTimestamp"] =
        json!("2026-11-29T20:00:00Z");
    let (action, writes) = reconcile_once(&api).await;
    assert_eq!(action, Action::await_change());
    assert_eq!(
        objects(&writes),
        [format!("PATCH {DEPLOY_PATH}"), format!("PATCH {EP_PATH}")]
    );
    assert_eq!(one_event(&writes).1, "InjectionRemoved");
    // An empty apply with the endpoint's field manager: the API server drops every field it
    // owns and nothing else.
    assert_eq!(
        writes[0].body,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "weather", "namespace": NS}})
    );
    assert!(
        writes[0]
            .query
            .contains("fieldManager=tether-operator/weather")
    );
    let released = api.lock().unwrap().objects[DEPLOY_PATH].clone();
    let pod = &released["spec"]["template"]["spec"];
    assert!(pod.get("initContainers").is_none(), "{pod}");
    assert_eq!(
        pod["containers"][0]["image"], "srv",
        "the user's container stays"
    );
    assert!(pod["containers"][0].get("lifecycle").is_none(), "{pod}");
    // Its last finalizer gone, the API server deletes the endpoint.
    assert!(!api.lock().unwrap().objects.contains_key(EP_PATH));
}

#[tokio::test]
async fn a_missing_target_is_degraded_and_nothing_else_is_written() {
    let api = api_with(&[(EP_PATH, endpoint(true))]);
    let (action, writes) = reconcile_once(&api).await;
    assert_eq!(action, Action::requeue(RECHECK));
    assert_degraded_only(&writes, "TargetNotFound");
    // Looked at again: the same status, no write, no second Event.
    let (_, writes) = reconcile_once(&api).await;
    assert!(writes.is_empty(), "{:?}", paths(&writes));
}

#[tokio::test]
async fn a_conflict_writes_nothing_of_the_users_and_says_why_once() {
    let mut d = deployment();
    d["spec"]["template"]["spec"]["containers"][0]["lifecycle"] =
        json!({"preStop": {"exec": {"command": ["sleep", "5"]}}});
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, d)]);
    let before = api.lock().unwrap().objects[DEPLOY_PATH].clone();
    let (_, writes) = reconcile_once(&api).await;
    assert_degraded_only(&writes, "PreStopConflict");
    assert_eq!(api.lock().unwrap().objects[DEPLOY_PATH], before);
    let (_, writes) = reconcile_once(&api).await;
    assert!(writes.is_empty(), "{:?}", paths(&writes));
}

#[tokio::test]
async fn a_users_budget_replaces_ours_and_a_users_service_account_retires_ours() {
    const PDB_PATH: &str = "/apis/policy/v1/namespaces/tools/poddisruptionbudgets";
    const SA_PATH: &str = "/api/v1/namespaces/tools/serviceaccounts/weather-tether-sidecar";
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())]);
    reconcile_once(&api).await;
    pods_rolled(&api);
    reconcile_once(&api).await;
    assert!(api.lock().unwrap().objects.contains_key(SA_PATH));
    // The user adds a budget over the same pods: ours goes (two budgets stall evictions), once.
    api.lock().unwrap().objects.insert(
        format!("{PDB_PATH}/weather-budget"),
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {"name": "weather-budget", "namespace": NS},
               "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "weather"}}}}),
    );
    let (_, writes) = reconcile_once(&api).await;
    assert_eq!(
        objects(&writes),
        [format!("DELETE {PDB_PATH}/weather-tether")]
    );
    assert!(
        one_event(&writes)
            .2
            .contains("PodDisruptionBudget/weather-tether (deleted)")
    );
    let (_, writes) = reconcile_once(&api).await;
    assert_eq!(paths(&writes), Vec::<String>::new(), "not created again");
    // The user names their own ServiceAccount. While an old pod runs with ours, the RoleBinding
    // binds both (its sidecar keeps its membership watch); ours is deleted once no pod runs with
    // it.
    const POD_PATH: &str = "/api/v1/namespaces/tools/pods/weather-old";
    {
        let mut a = api.lock().unwrap();
        let d = a.objects.get_mut(DEPLOY_PATH).unwrap();
        d["spec"]["template"]["spec"]["serviceAccountName"] = json!("app-sa");
        d["spec"]["template"]["spec"]["serviceAccount"] = json!("app-sa");
        d["metadata"]["generation"] = json!(d["metadata"]["generation"].as_i64().unwrap() + 1);
        a.objects.insert(
            POD_PATH.to_owned(),
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "weather-old", "namespace": NS, "labels": {"app": "weather"}},
                   "spec": {"serviceAccountName": "weather-tether-sidecar", "containers": []}}),
        );
    }
    let binding =
        "/apis/rbac.authorization.k8s.io/v1/namespaces/tools/rolebindings/weather-tether-sidecar";
    let subjects = |writes: &[Write]| -> Vec<String> {
        let written = writes.iter().find(|w| w.path == binding).unwrap();
        written.body["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, writes) = reconcile_once(&api).await;
    assert_eq!(
        objects(&writes),
        [
            format!("PATCH {binding}"),
            format!("PATCH {EP_PATH}/status")
        ]
    );
    assert_eq!(subjects(&writes), ["app-sa", "weather-tether-sidecar"]);
    let (_, writes) = reconcile_once(&api).await;
    assert_eq!(
        paths(&writes),
        Vec::<String>::new(),
        "nothing moves while it runs"
    );
    // The old pod is gone.
    pods_rolled(&api);
    api.lock().unwrap().objects.remove(POD_PATH);
    let (_, writes) = reconcile_once(&api).await;
    assert_eq!(
        objects(&writes),
        [
            format!("DELETE {SA_PATH}"),
            format!("PATCH {binding}"),
            format!("PATCH {EP_PATH}/status")
        ]
    );
    assert_eq!(subjects(&writes), ["app-sa"]);
    let delete = writes.iter().find(|w| w.path == SA_PATH).unwrap();
    assert!(
        delete.body["preconditions"]["uid"]
            .as_str()
            .is_some_and(|u| u.starts_with("uid-")),
        "deleted only if it is still the object read: {}",
        delete.body
    );
    assert!(
        delete.body["preconditions"]["uid"].is_string() || delete.body["preconditions"].is_object(),
        "{:?}",
        delete.body
    );
    let (_, writes) = reconcile_once(&api).await;
    assert_eq!(paths(&writes), Vec::<String>::new());
    let a = api.lock().unwrap();
    assert!(
        a.objects
            .contains_key(&format!("{PDB_PATH}/weather-budget")),
        "theirs stays"
    );
    assert_eq!(
        a.objects[DEPLOY_PATH]["spec"]["template"]["spec"]["serviceAccountName"],
        "app-sa"
    );
}

/// `METHOD <resource>/<name>` of each write of `writes` to a child or the target (not the
/// endpoint, its status or Events).
fn child_writes(writes: &[Write]) -> Vec<String> {
    writes
        .iter()
        .filter(|w| w.path != EVENTS_PATH && !w.path.starts_with(EP_PATH))
        .map(|w| {
            let path = match w.method {
                Method::POST => format!(
                    "{}/{}",
                    w.path,
                    w.body["metadata"]["name"].as_str().unwrap()
                ),
                _ => w.path.clone(),
            };
            let mut segments = path.rsplit('/');
            let name = segments.next().unwrap();
            format!("{} {}/{name}", w.method, segments.next().unwrap())
        })
        .collect()
}

/// The same for what `tether-operator plan` previews on the stored endpoint, target and
/// children (each kind's resource: its lowercase plural).
async fn previewed(api: &Shared) -> Vec<String> {
    use tether_operator::admission::Policy;
    use tether_operator::preview::{Inputs, Outcome, Write, preview};
    let inputs = {
        let a = api.lock().unwrap();
        let ep = serde_json::from_value(a.objects[EP_PATH].clone()).unwrap();
        let deployment = serde_json::from_value(a.objects[DEPLOY_PATH].clone()).unwrap();
        Inputs::new(ep, deployment, a.objects.values().cloned().collect()).unwrap()
    };
    let defaults = Defaults::with_image("tether-sidecar:test");
    let policy = Policy::for_default_image(&defaults.sidecar_image);
    let Outcome::Planned(planned) = preview(&inputs, &defaults, &policy).await.unwrap() else {
        panic!("Degraded");
    };
    planned
        .items
        .iter()
        .filter_map(|i| {
            let method = match i.write {
                Write::Apply(_) => "PATCH",
                Write::Create(_) => "POST",
                Write::Delete { .. } => "DELETE",
                Write::Unchanged => return None,
            };
            Some(format!("{method} {}s/{}", i.kind.to_lowercase(), i.name))
        })
        .collect()
}

/// Previews, then reconciles, the stored endpoint; the reconcile sent what the preview said.
async fn reconcile_as_previewed(api: &Shared) -> Vec<String> {
    let expected = previewed(api).await;
    let (_, writes) = reconcile_once(api).await;
    assert_eq!(child_writes(&writes), expected);
    expected
}

#[tokio::test]
async fn the_plan_preview_names_every_write_of_a_reconcile_in_order() {
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())]);
    assert_eq!(reconcile_as_previewed(&api).await.len(), 9, "every child");
    assert_eq!(reconcile_as_previewed(&api).await, Vec::<String>::new());
    {
        let mut a = api.lock().unwrap();
        a.objects.get_mut(EP_PATH).unwrap()["spec"]["buffer"] = json!({"maxEvents": 64});
        a.objects.insert(
            "/apis/policy/v1/namespaces/tools/poddisruptionbudgets/weather-budget".to_owned(),
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                   "metadata": {"name": "weather-budget", "namespace": NS},
                   "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "weather"}}}}),
        );
    }
    assert_eq!(
        reconcile_as_previewed(&api).await,
        [
            "PATCH configmaps/weather-tether",
            "DELETE poddisruptionbudgets/weather-tether"
        ]
    );
    // The user names a ServiceAccount while a pod runs with ours, then that pod goes.
    const POD_PATH: &str = "/api/v1/namespaces/tools/pods/weather-old";
    {
        let mut a = api.lock().unwrap();
        let d = a.objects.get_mut(DEPLOY_PATH).unwrap();
        d["spec"]["template"]["spec"]["serviceAccountName"] = json!("app-sa");
        a.objects.insert(
            POD_PATH.to_owned(),
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "weather-old", "namespace": NS, "labels": {"app": "weather"}},
                   "spec": {"serviceAccountName": "weather-tether-sidecar", "containers": []}}),
        );
    }
    assert_eq!(
        reconcile_as_previewed(&api).await,
        ["PATCH rolebindings/weather-tether-sidecar"]
    );
    api.lock().unwrap().objects.remove(POD_PATH);
    assert_eq!(
        reconcile_as_previewed(&api).await,
        [
            "DELETE serviceaccounts/weather-tether-sidecar",
            "PATCH rolebindings/weather-tether-sidecar"
        ]
    );
}

#[tokio::test]
async fn a_stale_copy_of_the_endpoint_adds_no_finalizer_and_writes_no_status_again() {
    let api = api_with(&[(EP_PATH, endpoint(false)), (DEPLOY_PATH, deployment())]);
    let operator = Operator::new(&api);
    let stored = |api: &Shared| api.lock().unwrap().objects[EP_PATH].clone();
    let unfinalized = stored(&api);
    operator.reconcile(EP_PATH).await.0.expect("the finalizer");
    // Woken before the cache saw the finalizer: the live copy has it, nothing adds it again
    // (a guarded patch that would fail with 422), and the pipeline runs.
    let (result, writes) = operator.reconcile_as(unfinalized).await;
    result.expect("no failed guard");
    assert!(
        !paths(&writes).contains(&format!("PATCH {EP_PATH}")),
        "{:?}",
        paths(&writes)
    );
    assert!(injected(&api));
    // Woken before the cache saw the status it wrote: nothing is written again.
    let mut without_status = stored(&api);
    without_status.as_object_mut().unwrap().remove("status");
    let (result, writes) = operator.reconcile_as(without_status).await;
    result.expect("a quiet reconcile");
    assert_eq!(paths(&writes), Vec::<String>::new());
}

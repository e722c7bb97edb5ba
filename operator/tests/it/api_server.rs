//! The in-memory API server ([`crate::support`]) held to what a Kubernetes API server does: apply
//! conflicts and forcing, shared ownership, pruning, updates taking ownership (and the defaults
//! they add), canonical quantities, name validation, label selectors, finalizers, immutable
//! Secrets and JSON patches that test what they change.

use crate::support::{
    Shared, api_with, apply_as, client_of, create_as, delete, json_patch_as, stored, update_as,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use tether_fake_kube::{canonical_quantity, owners};

const CONFIG_MAPS: &str = "/api/v1/namespaces/tools/configmaps";
const CM: &str = "/api/v1/namespaces/tools/configmaps/settings";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/tools/deployments";
const DEPLOY: &str = "/apis/apps/v1/namespaces/tools/deployments/weather";
const GRACE: &str = ".spec.template.spec.terminationGracePeriodSeconds";

fn config_map(data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "settings", "namespace": "tools"}, "data": data})
}

/// The Deployment `weather` with `containers` (each `[name, image]`).
fn deployment(containers: &[[&str; 2]]) -> Value {
    let containers: Vec<Value> = containers
        .iter()
        .map(|[name, image]| json!({"name": name, "image": image}))
        .collect();
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "weather", "namespace": "tools"},
           "spec": {"selector": {"matchLabels": {"app": "weather"}},
                    "template": {"metadata": {"labels": {"app": "weather"}},
                                 "spec": {"containers": containers}}}})
}

/// `kubectl`'s server-side apply (not forced) of [`deployment`] `weather` with `containers`.
fn apply_deployment(api: &Shared, containers: &[[&str; 2]]) -> Result<Value, Value> {
    apply_as(api, "kubectl", DEPLOY, &deployment(containers), false)
}

/// Asserts that the `Status` of a refused write has HTTP `code` and `reason`.
fn assert_refused(status: &Value, code: u16, reason: &str) {
    assert_eq!(
        (&status["code"], &status["reason"]),
        (&json!(code), &json!(reason)),
        "{status}"
    );
}

#[test]
fn an_apply_that_changes_another_managers_field_conflicts_until_forced() {
    let api = api_with(&[]);
    create_as(
        &api,
        "helm",
        CONFIG_MAPS,
        &config_map(json!({"a": "1", "b": "1"})),
    )
    .unwrap();
    let before = stored(&api, CM);
    let status = apply_as(&api, "kubectl", CM, &config_map(json!({"a": "2"})), false).unwrap_err();
    assert_refused(&status, 409, "Conflict");
    assert_eq!(
        status["message"],
        "Apply failed with 1 conflict: conflict with \"helm\" using v1: .data.a"
    );
    assert_eq!(
        status["details"]["causes"],
        json!([{"reason": "FieldManagerConflict", "message": "conflict with \"helm\" using v1", "field": ".data.a"}])
    );
    assert_eq!(stored(&api, CM), before, "a refused apply changes nothing");
    apply_as(&api, "kubectl", CM, &config_map(json!({"a": "2"})), true).unwrap();
    let after = stored(&api, CM);
    assert_eq!(after["data"], json!({"a": "2", "b": "1"}));
    assert_eq!(
        owners(&after, ".data.a"),
        ["kubectl"],
        "forcing moves the field"
    );
    assert_eq!(owners(&after, ".data.b"), ["helm"]);
}

#[test]
fn appliers_of_the_same_value_share_the_field_and_a_change_then_conflicts() {
    let api = api_with(&[]);
    let same = config_map(json!({"x": "1"}));
    apply_as(&api, "a", CM, &same, false).unwrap();
    apply_as(&api, "b", CM, &same, false).unwrap();
    assert_eq!(owners(&stored(&api, CM), ".data.x"), ["a", "b"]);
    let status = apply_as(&api, "a", CM, &config_map(json!({"x": "2"})), false).unwrap_err();
    assert_eq!(
        status["message"],
        "Apply failed with 1 conflict: conflict with \"b\": .data.x"
    );
    // `b` gives the field up by applying without it: `a` alone owns it, and may change it.
    apply_as(&api, "b", CM, &config_map(json!({})), false).unwrap();
    apply_as(&api, "a", CM, &config_map(json!({"x": "2"})), false).unwrap();
    assert_eq!(stored(&api, CM)["data"], json!({"x": "2"}));
}

#[test]
fn what_an_applier_stops_applying_goes_unless_another_manager_owns_it() {
    let api = api_with(&[]);
    apply_deployment(&api, &[["server", "srv:1"], ["helper", "h:1"]]).unwrap();
    apply_deployment(&api, &[["server", "srv:1"]]).unwrap();
    let names: Vec<Value> = stored(&api, DEPLOY)["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].clone())
        .collect();
    assert_eq!(names, ["server"], "the list item is pruned");
    // Another manager sets a field in `server`: it co-owns the item, keys included.
    let hook = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "weather", "namespace": "tools"},
        "spec": {"template": {"spec": {"containers": [
            {"name": "server", "lifecycle": {"preStop": {"httpGet": {"path": "/drained", "port": 9901}}}}]}}}});
    apply_as(&api, "hooks", DEPLOY, &hook, false).unwrap();
    let entry = stored(&api, DEPLOY)["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == "hooks")
        .cloned()
        .unwrap();
    assert_eq!(
        (&entry["operation"], &entry["fieldsType"]),
        (&json!("Apply"), &json!("FieldsV1"))
    );
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"server\"}": {
            ".": {}, "f:name": {},
            "f:lifecycle": {"f:preStop": {"f:httpGet": {"f:path": {}, "f:port": {}}}}}}}}}})
    );
    // Renaming the container leaves `server` behind with only what `hooks` owns: no image.
    let status = apply_deployment(&api, &[["app", "srv:1"]]).unwrap_err();
    assert_refused(&status, 422, "Invalid");
    assert_eq!(
        status["details"]["causes"][0]["field"], "spec.template.spec.containers[0].image",
        "{status}"
    );
    // `hooks` lets go: the hook goes whole, the `scheme: HTTP` the API server added included.
    let server =
        |api: &Shared| stored(api, DEPLOY)["spec"]["template"]["spec"]["containers"][0].clone();
    assert_eq!(
        server(&api)["lifecycle"]["preStop"]["httpGet"]["scheme"],
        "HTTP"
    );
    let mut empty = hook;
    empty.as_object_mut().unwrap().remove("spec");
    apply_as(&api, "hooks", DEPLOY, &empty, false).unwrap();
    assert_eq!(server(&api).get("lifecycle"), None, "{}", server(&api));
}

#[test]
fn an_update_takes_the_fields_it_changes_and_owns_the_defaults_it_adds() {
    let api = api_with(&[]);
    apply_deployment(&api, &[["server", "srv:1"]]).unwrap();
    let applied = stored(&api, DEPLOY);
    assert_eq!(
        applied["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
        30
    );
    assert_eq!(
        owners(&applied, GRACE),
        Vec::<String>::new(),
        "a default after an apply"
    );
    let mut edited = applied.clone();
    edited["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(600);
    update_as(&api, "kubectl-edit", DEPLOY, &edited).unwrap();
    let after = stored(&api, DEPLOY);
    assert_eq!(owners(&after, GRACE), ["kubectl-edit"]);
    let image = ".spec.template.spec.containers[name=\"server\"].image";
    assert_eq!(owners(&after, image), ["kubectl"], "unchanged fields stay");
    assert_eq!(after["metadata"]["generation"], 2);
    let stale = update_as(&api, "kubectl-edit", DEPLOY, &edited).unwrap_err();
    assert_eq!(stale["code"], 409, "{stale}");
    // Created by an update (Helm 3), the defaults of the write are the creator's.
    let api = api_with(&[]);
    create_as(
        &api,
        "helm",
        DEPLOYMENTS,
        &deployment(&[["server", "srv:1"]]),
    )
    .unwrap();
    assert_eq!(owners(&stored(&api, DEPLOY), GRACE), ["helm"]);
}

#[test]
fn quantities_are_stored_in_canonical_form() {
    for (given, canonical) in [
        ("0.5", "500m"),
        ("1000m", "1"),
        ("1500m", "1500m"),
        ("1000", "1k"),
        ("2", "2"),
        ("1024Mi", "1Gi"),
        ("1536Mi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        ("0.5Ki", "512"),
        ("100M", "100M"),
        ("1e3", "1e3"),
    ] {
        assert_eq!(
            canonical_quantity(given).as_deref(),
            Some(canonical),
            "{given}"
        );
    }
    assert_eq!(canonical_quantity("lots"), None);
    let api = api_with(&[]);
    let mut d = deployment(&[["server", "srv:1"]]);
    d["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"requests": {"cpu": "0.5", "memory": "1024Mi"}, "limits": {}});
    apply_as(&api, "kubectl", DEPLOY, &d, false).unwrap();
    let resources = &stored(&api, DEPLOY)["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert_eq!(
        *resources,
        json!({"requests": {"cpu": "500m", "memory": "1Gi"}})
    );
}

#[test]
fn names_are_validated_per_kind() {
    let api = api_with(&[]);
    let service = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
               "spec": {"ports": [{"port": 80}]}})
    };
    let services = "/api/v1/namespaces/tools/services";
    for bad in ["weather.v2-mcp", "1weather-mcp", &"x".repeat(64)] {
        let status = create_as(&api, "kubectl", services, &service(bad)).unwrap_err();
        assert_eq!(status["code"], 422, "{bad}: {status}");
        assert_eq!(status["details"]["causes"][0]["field"], "metadata.name");
    }
    let ok = create_as(&api, "kubectl", services, &service("weather-mcp")).unwrap();
    assert_eq!(
        ok["spec"]["ports"][0]["targetPort"], 80,
        "defaulted to the port"
    );
    let mut cm = config_map(json!({}));
    cm["metadata"]["name"] = json!("weather.v2-tether");
    create_as(&api, "kubectl", CONFIG_MAPS, &cm).expect("a subdomain names a ConfigMap");
}

#[tokio::test]
async fn lists_honour_label_selectors() {
    let pod = |name: &str, labels: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "tools", "labels": labels},
               "spec": {"containers": [{"name": "c", "image": "i"}]}})
    };
    let api = api_with(&[
        (
            "/api/v1/namespaces/tools/pods/a",
            pod("a", json!({"app": "weather"})),
        ),
        (
            "/api/v1/namespaces/tools/pods/b",
            pod("b", json!({"app": "weather", "canary": "yes"})),
        ),
        (
            "/api/v1/namespaces/tools/pods/c",
            pod("c", json!({"app": "billing"})),
        ),
    ]);
    let pods: Api<Pod> = Api::namespaced(client_of(&api, "tools"), "tools");
    for (selector, expected) in [
        ("app=weather", vec!["a", "b"]),
        ("app=weather,!canary", vec!["a"]),
        ("app in (weather,billing),canary", vec!["b"]),
        ("app!=weather", vec!["c"]),
        ("", vec!["a", "b", "c"]),
    ] {
        let listed = pods
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap();
        let names: Vec<String> = listed
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        assert_eq!(names, expected, "{selector}");
    }
}

#[test]
fn a_taken_name_is_refused_and_a_deletion_waits_for_the_finalizers() {
    let api = api_with(&[]);
    let mut cm = config_map(json!({"a": "1"}));
    cm["metadata"]["finalizers"] = json!(["example.com/keep"]);
    create_as(&api, "kubectl", CONFIG_MAPS, &cm).unwrap();
    let taken = create_as(&api, "kubectl", CONFIG_MAPS, &cm).unwrap_err();
    assert_refused(&taken, 409, "AlreadyExists");
    delete(&api, CM).unwrap();
    let marked = stored(&api, CM);
    assert!(
        marked["metadata"]["deletionTimestamp"].is_string(),
        "{marked}"
    );
    let mut released = marked;
    released["metadata"]["finalizers"] = json!([]);
    update_as(&api, "kubectl", CM, &released).unwrap();
    assert!(
        !api.lock().unwrap().objects.contains_key(CM),
        "gone with its last finalizer"
    );
}

#[test]
fn an_immutable_secret_keeps_its_data_and_a_json_patch_tests_what_it_read() {
    const SECRETS: &str = "/api/v1/namespaces/tools/secrets";
    let secret = |name: &str, immutable: bool| {
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": name, "namespace": "tools"},
               "immutable": immutable, "data": {"secret": "AAAA"}})
    };
    let api = api_with(&[]);
    let frozen = create_as(&api, "tether", SECRETS, &secret("frozen", true)).unwrap();
    let change = json!([{"op": "add", "path": "/data/secret", "value": "BBBB"}]);
    let refused = json_patch_as(&api, "tether", &format!("{SECRETS}/frozen"), &change).unwrap_err();
    assert_refused(&refused, 422, "Invalid");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("data: Forbidden: field is immutable"),
        "{refused}"
    );
    let thaw = json!([{"op": "replace", "path": "/immutable", "value": false}]);
    let refused = json_patch_as(&api, "tether", &format!("{SECRETS}/frozen"), &thaw).unwrap_err();
    assert_refused(&refused, 422, "Invalid");
    assert_eq!(
        stored(&api, &format!("{SECRETS}/frozen"))["data"],
        frozen["data"]
    );
    // A mutable one changes, only at the version a patch tested.
    let path = format!("{SECRETS}/ring");
    let created = create_as(&api, "tether", SECRETS, &secret("ring", false)).unwrap();
    let version = created["metadata"]["resourceVersion"].clone();
    let guarded = |value: &str| {
        json!([{"op": "test", "path": "/metadata/resourceVersion", "value": version},
               {"op": "add", "path": "/data/next", "value": value}])
    };
    let patched = json_patch_as(&api, "tether", &path, &guarded("CCCC")).unwrap();
    assert_eq!(patched["data"]["next"], "CCCC");
    let stale = json_patch_as(&api, "tether", &path, &guarded("DDDD")).unwrap_err();
    assert_refused(&stale, 422, "Invalid");
    assert_eq!(stored(&api, &path)["data"]["next"], "CCCC");
}

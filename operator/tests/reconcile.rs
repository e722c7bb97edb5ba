//! The reconcile against a mock API server (kube-rs's `ApiServerVerifier` pattern on
//! `tower_test::mock`): a small in-memory API server answers GET, server-side apply, JSON patch
//! and POST, and records every write, so the tests count what a reconcile writes on create, on
//! a no-op, on a spec change, on delete and on a missing target.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use kube::{Client, runtime::controller::Action};
use serde_json::{Value, json};
use tether_crds::McpEndpoint;
use tether_operator::build::Defaults;
use tether_operator::controller::{Context, RECHECK, reconcile};
use tether_operator::metrics::Metrics;

const NS: &str = "tools";
const EP_PATH: &str = "/apis/mcp.tether.dev/v1alpha1/namespaces/tools/mcpendpoints/weather";
const DEPLOY_PATH: &str = "/apis/apps/v1/namespaces/tools/deployments/weather";
const SECRET_PATH: &str = "/api/v1/namespaces/tools/secrets/weather-tether";

/// One write the reconcile sent: method, path, query (field manager, force) and body.
#[derive(Clone, Debug)]
struct Write {
    method: Method,
    path: String,
    query: String,
    body: Value,
}

#[derive(Default)]
struct ApiServer {
    objects: BTreeMap<String, Value>,
    writes: Vec<Write>,
    /// The operator's metrics over the reconciles of a test.
    metrics: Arc<Metrics>,
}

type Shared = Arc<Mutex<ApiServer>>;

fn not_found() -> Response<Body> {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404, "message": "not found"});
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .body(Body::from(serde_json::to_vec(&status).unwrap()))
        .unwrap()
}

fn ok(v: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .body(Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

/// Server-side apply as far as these tests need it: objects merge key by key, lists of named
/// items merge by name, other values are replaced.
fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (Value::Array(a), Value::Array(b)) if b.iter().all(|i| i.get("name").is_some()) => {
            for item in b {
                match a.iter_mut().find(|x| x.get("name") == item.get("name")) {
                    Some(x) => merge(x, item),
                    None => a.push(item.clone()),
                }
            }
        }
        (slot, v) => *slot = v.clone(),
    }
}

/// Applies the `add` / `remove` operations of a JSON patch on `metadata.finalizers`.
fn json_patch(obj: &mut Value, ops: &Value) {
    for op in ops.as_array().into_iter().flatten() {
        let path = op["path"].as_str().unwrap_or_default();
        match op["op"].as_str() {
            Some("add") if path == "/metadata/finalizers" => {
                obj["metadata"]["finalizers"] = op["value"].clone();
            }
            Some("add") => obj["metadata"]["finalizers"]
                .as_array_mut()
                .unwrap()
                .push(op["value"].clone()),
            Some("remove") => {
                let i: usize = path.rsplit('/').next().unwrap().parse().unwrap();
                obj["metadata"]["finalizers"]
                    .as_array_mut()
                    .unwrap()
                    .remove(i);
            }
            _ => {}
        }
    }
}

async fn serve(mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>, api: Shared) {
    while let Some((request, respond)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let path = parts.uri.path().to_owned();
        let mut api = api.lock().unwrap();
        if parts.method != Method::GET {
            api.writes.push(Write {
                method: parts.method.clone(),
                path: path.clone(),
                query: parts.uri.query().unwrap_or_default().to_owned(),
                body: body.clone(),
            });
        }
        let answer = match parts.method {
            Method::GET => api.objects.get(&path).map_or_else(not_found, ok),
            Method::POST => {
                let name = body["metadata"]["name"].as_str().unwrap().to_owned();
                api.objects.insert(format!("{path}/{name}"), body.clone());
                ok(&body)
            }
            Method::PATCH => {
                let (key, status) = match path.strip_suffix("/status") {
                    Some(object) => (object.to_owned(), true),
                    None => (path.clone(), false),
                };
                let json_patch_body = parts
                    .headers
                    .get("content-type")
                    .is_some_and(|v| v == "application/json-patch+json");
                let obj = api.objects.entry(key).or_insert_with(|| json!({}));
                if json_patch_body {
                    json_patch(obj, &body);
                } else if status {
                    obj["status"] = body["status"].clone();
                } else {
                    // Like the API server, a change of the spec is a new generation.
                    let spec_before = obj.get("spec").cloned();
                    merge(obj, &body);
                    if obj.get("spec").cloned() != spec_before {
                        let generation = obj["metadata"]["generation"].as_i64().unwrap_or(0);
                        obj["metadata"]["generation"] = json!(generation + 1);
                    }
                }
                ok(&obj.clone())
            }
            _ => not_found(),
        };
        respond.send_response(answer);
    }
}

fn endpoint(finalized: bool) -> Value {
    let mut ep = json!({
        "apiVersion": "mcp.tether.dev/v1alpha1",
        "kind": "McpEndpoint",
        "metadata": {"name": "weather", "namespace": NS, "uid": "e-1", "generation": 1},
        "spec": {"targetRef": {"kind": "Deployment", "name": "weather"}},
    });
    if finalized {
        ep["metadata"]["finalizers"] = json!(["mcp.tether.dev/injection"]);
    }
    ep
}

fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "weather", "namespace": NS, "generation": 1},
        "spec": {
            "selector": {"matchLabels": {"app": "weather"}},
            "template": {
                "metadata": {"labels": {"app": "weather"}},
                "spec": {"containers": [{"name": "server", "image": "srv", "ports": [{"containerPort": 3000}]}]},
            },
        },
        "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2},
    })
}

/// Runs one reconcile of the stored endpoint; returns its action and the writes it sent.
async fn reconcile_once(api: &Shared) -> (Action, Vec<Write>) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(serve(handle, Arc::clone(api)));
    let ctx = Arc::new(Context {
        client: Client::new(service, NS),
        defaults: Defaults::with_image("tether-sidecar:test"),
        metrics: Arc::clone(&api.lock().unwrap().metrics),
    });
    let stored = api.lock().unwrap().objects[EP_PATH].clone();
    let ep: McpEndpoint = serde_json::from_value(stored).unwrap();
    let before = api.lock().unwrap().writes.len();
    let action = reconcile(Arc::new(ep), ctx)
        .await
        .expect("reconcile succeeds");
    server.abort();
    let writes = api.lock().unwrap().writes[before..].to_vec();
    (action, writes)
}

fn api_with(objects: &[(&str, Value)]) -> Shared {
    let api = ApiServer {
        objects: objects
            .iter()
            .map(|(p, v)| ((*p).to_owned(), v.clone()))
            .collect(),
        ..ApiServer::default()
    };
    Arc::new(Mutex::new(api))
}

fn paths(writes: &[Write]) -> Vec<String> {
    writes
        .iter()
        .map(|w| format!("{} {}", w.method, w.path))
        .collect()
}

fn condition(status: &Value, type_: &str) -> Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn create_adds_the_finalizer_then_applies_everything_once_and_a_no_op_writes_nothing() {
    let api = api_with(&[(EP_PATH, endpoint(false)), (DEPLOY_PATH, deployment())]);
    // 1. Only the finalizer (a JSON patch guarded by a test op).
    let (_, writes) = reconcile_once(&api).await;
    assert_eq!(paths(&writes), [format!("PATCH {EP_PATH}")]);
    assert_eq!(writes[0].body[1]["op"], "add");
    // 2. Everything, each apply with our field manager, forced.
    let (action, writes) = reconcile_once(&api).await;
    assert_eq!(action, Action::requeue(RECHECK));
    assert_eq!(
        paths(&writes),
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
    for w in writes.iter().filter(|w| w.method == Method::PATCH) {
        assert!(
            w.query.contains("fieldManager=tether-operator") && w.query.contains("force=true"),
            "{w:?}"
        );
    }
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
    {
        let mut a = api.lock().unwrap();
        let d = a.objects.get_mut(DEPLOY_PATH).unwrap();
        d["status"]["observedGeneration"] = d["metadata"]["generation"].clone();
    }
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
    let secret_before = api.lock().unwrap().objects[SECRET_PATH].clone();
    {
        let mut a = api.lock().unwrap();
        let ep = a.objects.get_mut(EP_PATH).unwrap();
        ep["spec"]["buffer"] = json!({"maxEvents": 64});
        ep["metadata"]["generation"] = json!(2);
    }
    let (_, writes) = reconcile_once(&api).await;
    assert_eq!(
        paths(&writes),
        [
            "PATCH /api/v1/namespaces/tools/configmaps/weather-tether".to_owned(),
            format!("PATCH {EP_PATH}/status"),
        ]
    );
    let manifest = writes[0].body["data"]["endpoint.yaml"].as_str().unwrap();
    assert!(manifest.contains("maxEvents: 64"), "{manifest}");
    let a = api.lock().unwrap();
    assert_eq!(a.objects[SECRET_PATH], secret_before);
    assert_eq!(a.objects[EP_PATH]["status"]["observedGeneration"], 2);
}

#[tokio::test]
async fn delete_removes_the_injection_then_the_finalizer() {
    let mut ep = endpoint(true);
    ep["metadata"]["deletionTimestamp"] = json!("2026-11-29T20:00:00Z");
    let api = api_with(&[(EP_PATH, ep), (DEPLOY_PATH, deployment())]);
    let (action, writes) = reconcile_once(&api).await;
    assert_eq!(action, Action::await_change());
    assert_eq!(
        paths(&writes),
        [format!("PATCH {DEPLOY_PATH}"), format!("PATCH {EP_PATH}")]
    );
    // An empty apply with our field manager: the API server drops every field we own and
    // nothing else.
    assert_eq!(
        writes[0].body,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "weather", "namespace": NS}})
    );
    assert!(writes[0].query.contains("fieldManager=tether-operator"));
    let finalizers = api.lock().unwrap().objects[EP_PATH]["metadata"]["finalizers"].clone();
    assert_eq!(finalizers, json!([]));
}

#[tokio::test]
async fn a_missing_target_is_degraded_and_nothing_else_is_written() {
    let api = api_with(&[(EP_PATH, endpoint(true))]);
    let (action, writes) = reconcile_once(&api).await;
    assert_eq!(action, Action::requeue(RECHECK));
    assert_eq!(paths(&writes), [format!("PATCH {EP_PATH}/status")]);
    let degraded = condition(&writes[0].body["status"], "Degraded");
    assert_eq!(
        (degraded["status"].as_str(), degraded["reason"].as_str()),
        (Some("True"), Some("TargetNotFound"))
    );
    // Looked at again: the same status, no write.
    let (_, writes) = reconcile_once(&api).await;
    assert!(writes.is_empty(), "{:?}", paths(&writes));
}

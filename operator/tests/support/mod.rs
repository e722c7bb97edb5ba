//! An in-memory API server for `tower_test::mock` (kube-rs's `ApiServerVerifier` pattern, made
//! generic): it answers GET of an object or of a namespaced collection (a list), server-side
//! apply (merged into the stored object, a spec change bumping `metadata.generation`), JSON
//! patches of `metadata.finalizers`, status patches, POST and DELETE, and records every write.
//! Like a cluster, it refuses (403) what the operator's RBAC rules (`tether_operator::access`)
//! do not allow.

#![allow(dead_code)] // each test file uses its part

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tether_operator::access::{CLUSTER, LEADER_ELECTION, allows, request_attributes};
use tether_operator::diff::ATOMIC;
use tether_operator::metrics::Metrics;

/// One write the reconcile sent: method, path, query (field manager, force) and body.
#[derive(Clone, Debug)]
pub struct Write {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub body: Value,
}

#[derive(Default)]
pub struct ApiServer {
    pub objects: BTreeMap<String, Value>,
    pub writes: Vec<Write>,
    /// Requests refused because the operator's RBAC rules ([`CLUSTER`], [`LEADER_ELECTION`])
    /// do not allow them, as `verb group/resource`.
    pub forbidden: Vec<String>,
    /// The operator's metrics over the reconciles of a test.
    pub metrics: Arc<Metrics>,
}

/// The server's state, shared with the test.
pub type Shared = Arc<Mutex<ApiServer>>;

/// A `Status` failure answer, as the API server sends.
fn failure(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": reason, "code": code.as_u16(), "message": message});
    Response::builder()
        .status(code)
        .body(Body::from(serde_json::to_vec(&status).unwrap()))
        .unwrap()
}

fn not_found() -> Response<Body> {
    failure(StatusCode::NOT_FOUND, "NotFound", "not found")
}

fn forbidden() -> Response<Body> {
    failure(
        StatusCode::FORBIDDEN,
        "Forbidden",
        "not in the operator's RBAC rules",
    )
}

fn ok(v: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .body(Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

/// Server-side apply as far as these tests need it: objects merge key by key, lists of named
/// items merge by name (but the atomic ones, [`ATOMIC`], are replaced), other values are
/// replaced.
fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                let slot = a.entry(k.clone()).or_insert(Value::Null);
                if ATOMIC.contains(&k.as_str()) {
                    *slot = v.clone();
                } else {
                    merge(slot, v);
                }
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

/// Whether `path` names a namespaced collection (`…/namespaces/<ns>/<resource>`).
fn is_collection(path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').collect();
    segments.len() >= 3 && segments[segments.len() - 3] == "namespaces"
}

/// Answers the requests of `handle` from `api` until the client is dropped.
pub async fn serve(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    api: Shared,
) {
    while let Some((request, respond)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let path = parts.uri.path().to_owned();
        let mut api = api.lock().unwrap();
        // The operator's RBAC, as a cluster would enforce it.
        let query = parts.uri.query().unwrap_or_default();
        if let Some((group, resource, verb)) = request_attributes(&parts.method, &path, query)
            && !allows(CLUSTER, &group, &resource, verb)
            && !allows(LEADER_ELECTION, &group, &resource, verb)
        {
            api.forbidden.push(format!("{verb} {group}/{resource}"));
            respond.send_response(forbidden());
            continue;
        }
        if parts.method != Method::GET {
            api.writes.push(Write {
                method: parts.method.clone(),
                path: path.clone(),
                query: parts.uri.query().unwrap_or_default().to_owned(),
                body: body.clone(),
            });
        }
        let answer = match parts.method {
            Method::GET if is_collection(&path) => {
                let prefix = format!("{path}/");
                let items: Vec<Value> = api
                    .objects
                    .iter()
                    .filter(|(k, _)| k.strip_prefix(&prefix).is_some_and(|n| !n.contains('/')))
                    .map(|(_, v)| v.clone())
                    .collect();
                ok(&json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}))
            }
            Method::GET => api.objects.get(&path).map_or_else(not_found, ok),
            Method::DELETE => api.objects.remove(&path).map_or_else(not_found, |v| ok(&v)),
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
                // Like the API server, a new object gets a UID.
                let uid = format!("uid-{}", api.writes.len());
                let obj = api
                    .objects
                    .entry(key)
                    .or_insert_with(|| json!({"metadata": {"uid": uid}}));
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

/// A client of a new in-memory server holding `objects`; the server runs until the client and
/// its clones are dropped.
pub fn client_of(api: &Shared, namespace: &str) -> Client {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(serve(handle, Arc::clone(api)));
    Client::new(service, namespace)
}

/// A server holding `objects` (path → object).
pub fn api_with(objects: &[(&str, Value)]) -> Shared {
    let api = ApiServer {
        objects: objects
            .iter()
            .map(|(p, v)| ((*p).to_owned(), v.clone()))
            .collect(),
        ..ApiServer::default()
    };
    Arc::new(Mutex::new(api))
}

/// `METHOD path` of each write.
pub fn paths(writes: &[Write]) -> Vec<String> {
    writes
        .iter()
        .map(|w| format!("{} {}", w.method, w.path))
        .collect()
}

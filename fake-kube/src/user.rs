//! Requests as a user sends them (`kubectl`, Helm, another controller): not subject to
//! [`ApiServer::rbac`], not recorded in [`ApiServer::writes`]; servers seeded with objects, and
//! readers of what is stored.

use std::sync::{Arc, Mutex};

use http::Method;
use serde_json::{Value, json};

use crate::Shared;
use crate::server::{ApiServer, Call, Write, decode_query};

/// Sends a request as a user; the stored object, or the `Status` of the failure.
fn as_user(
    api: &Shared,
    method: Method,
    path: &str,
    query: &str,
    content_type: &str,
    body: &Value,
) -> Result<Value, Value> {
    let call = Call {
        method,
        path,
        query: decode_query(query),
        content_type,
        agent: None,
        body: body.clone(),
    };
    api.lock().unwrap().handle(&call).map(|(_, v)| v)
}

/// Server-side applies `body` to the object at `path` as field manager `manager` (`force`d or
/// not), as `kubectl apply --server-side` would; the stored object, or the `Status`.
///
/// # Errors
/// The `Status` of the failure (409 `Conflict` with its causes, 422 `Invalid`).
pub fn apply_as(
    api: &Shared,
    manager: &str,
    path: &str,
    body: &Value,
    force: bool,
) -> Result<Value, Value> {
    let query = format!("fieldManager={manager}&force={force}");
    as_user(
        api,
        Method::PATCH,
        path,
        &query,
        "application/apply-patch+yaml",
        body,
    )
}

/// Replaces the object at `path` with `object` as field manager `manager`, as Helm 3 and
/// `kubectl edit` do: no conflicts, and `manager` owns every field the write changed; a stale
/// `metadata.resourceVersion` is a 409.
///
/// # Errors
/// The `Status` of the failure.
pub fn update_as(api: &Shared, manager: &str, path: &str, object: &Value) -> Result<Value, Value> {
    let query = format!("fieldManager={manager}");
    as_user(api, Method::PUT, path, &query, "application/json", object)
}

/// Sends the JSON patch (RFC 6902) `ops` to the object at `path` as field manager `manager`,
/// as `kubectl patch --type=json` does.
///
/// # Errors
/// The `Status` of the failure (422 when an operation fails, a `test` included).
pub fn json_patch_as(api: &Shared, manager: &str, path: &str, ops: &Value) -> Result<Value, Value> {
    let query = format!("fieldManager={manager}");
    as_user(
        api,
        Method::PATCH,
        path,
        &query,
        "application/json-patch+json",
        ops,
    )
}

/// Creates `object` in the collection at `collection` as field manager `manager`.
///
/// # Errors
/// The `Status` of the failure (409 `AlreadyExists`, 422 `Invalid`).
pub fn create_as(
    api: &Shared,
    manager: &str,
    collection: &str,
    object: &Value,
) -> Result<Value, Value> {
    let query = format!("fieldManager={manager}");
    as_user(
        api,
        Method::POST,
        collection,
        &query,
        "application/json",
        object,
    )
}

/// Deletes the object at `path`, as `kubectl delete` would: one with finalizers is only marked
/// (`deletionTimestamp`) until they are gone.
///
/// # Errors
/// The `Status` of the failure (404).
pub fn delete(api: &Shared, path: &str) -> Result<Value, Value> {
    as_user(
        api,
        Method::DELETE,
        path,
        "",
        "application/json",
        &Value::Null,
    )
}

/// A server holding `objects` (path → object), each applied by the field manager `seed` (it
/// owns every field it sets, none of the defaults). The object's own `uid`, `generation`,
/// timestamps and `status` are kept as given: the state of a cluster when the test starts.
///
/// # Panics
/// When the API server refuses an object.
pub fn api_with(objects: &[(&str, Value)]) -> Shared {
    seeded(objects, |api, path, obj| {
        apply_as(api, "seed", path, obj, true)
    })
}

/// A server holding `objects` (path → object), each created (POST) by the field manager
/// `manager`, as Helm 3 creates them: the manager owns every field of the stored object,
/// defaults included. Kept from each object as in [`api_with`].
///
/// # Panics
/// When the API server refuses an object.
pub fn api_created_by(manager: &str, objects: &[(&str, Value)]) -> Shared {
    seeded(objects, |api, path, obj| {
        let collection = path.rsplit_once('/').map_or(path, |(c, _)| c);
        create_as(api, manager, collection, obj)
    })
}

fn seeded(
    objects: &[(&str, Value)],
    write: impl Fn(&Shared, &str, &Value) -> Result<Value, Value>,
) -> Shared {
    let api = Arc::new(Mutex::new(ApiServer::default()));
    for (path, obj) in objects {
        write(&api, path, obj).unwrap_or_else(|status| panic!("seeding {path}: {status}"));
        let mut server = api.lock().unwrap();
        let stored = server.objects.get_mut(*path).expect("seeded");
        for field in [
            "uid",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
        ] {
            let given = &obj["metadata"][field];
            if !given.is_null() {
                stored["metadata"][field] = given.clone();
            }
        }
        if let Some(status) = obj.get("status") {
            stored["status"] = status.clone();
        }
    }
    api
}

/// Stores the Namespace `name` with `labels`.
pub fn namespace(api: &Shared, name: &str, labels: Value) {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": name, "labels": labels}});
    let path = format!("/api/v1/namespaces/{name}");
    api.lock().unwrap().objects.insert(path, ns);
}

/// The object stored at `path`.
///
/// # Panics
/// When nothing is stored there.
pub fn stored(api: &Shared, path: &str) -> Value {
    api.lock().unwrap().objects[path].clone()
}

/// `METHOD path` of each write.
pub fn paths(writes: &[Write]) -> Vec<String> {
    writes
        .iter()
        .map(|w| format!("{} {}", w.method, w.path))
        .collect()
}

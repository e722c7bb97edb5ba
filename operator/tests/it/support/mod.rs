//! An in-memory Kubernetes API server for `tower_test::mock` (kube-rs's `ApiServerVerifier`
//! pattern, made generic) that behaves like a real one where the operator's tests look: GET of an
//! object or of a namespaced collection (honouring `labelSelector`), POST, PUT, DELETE (with
//! finalizers and preconditions), and PATCH as server-side apply, JSON patch, merge patch or
//! strategic merge patch, on objects and their `status` subresource. Every write tracks field
//! ownership in `metadata.managedFields` ([`fields`], [`apply`]), gets the API server's defaults
//! and canonical quantities ([`defaults`]) and is validated ([`validation`]). Like a cluster, it
//! refuses (403) what the operator's RBAC rules (`tether_operator::access`) do not allow, and an
//! apply that creates an object needs `create` too. Every request the clients send that is not a
//! GET is recorded, in order ([`Write`]).
//!
//! [`cluster`] does what controllers and the kubelet would; [`operator`] runs the operator's
//! reconcile against the server.

mod apply;
pub mod cluster;
pub mod defaults;
pub mod fields;
pub mod operator;
mod selector;
mod validation;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Map, Value, json};
use tether_operator::access::{Grant, LEADER_ELECTION, RECONCILE, allows, request_attributes};
use tether_operator::metrics::Metrics;
use tokio::sync::oneshot;

use fields::{Entry, Operation, managed_fields, merge, render};

/// One write a client sent: method, path, query (field manager, force) and body.
#[derive(Clone, Debug)]
pub struct Write {
    /// The HTTP method.
    pub method: Method,
    /// The request path.
    pub path: String,
    /// The query parameters, percent-decoded (`fieldManager=tether-operator&force=true`).
    pub query: String,
    /// The body (`null` when there is none).
    pub body: Value,
}

/// The server's state.
#[derive(Default)]
pub struct ApiServer {
    /// Every stored object by its path (`/api/v1/namespaces/tools/secrets/weather-tether`).
    pub objects: BTreeMap<String, Value>,
    /// Every request of the clients that is not a GET, in order.
    pub writes: Vec<Write>,
    /// Requests refused because the operator's RBAC rules ([`RECONCILE`] where [`Self::grant`]
    /// grants them, [`LEADER_ELECTION`]) do not allow them, as `verb group/resource`.
    pub forbidden: Vec<String>,
    /// Where [`RECONCILE`] is granted: cluster-wide (the default), or in some namespaces (a
    /// namespaced install).
    pub grant: Grant,
    /// Every namespace a request of the clients was in (`*` for one across namespaces).
    pub namespaces_asked: std::collections::BTreeSet<String>,
    /// The operator's metrics over the reconciles of a test.
    pub metrics: Arc<Metrics>,
    /// The last `resourceVersion` and uid number given out.
    serial: u64,
    /// Cluster IPs given out.
    cluster_ips: u32,
}

/// The server's state, shared with the test.
pub type Shared = Arc<Mutex<ApiServer>>;

/// A `Status` failure, as the API server sends it with an error code.
fn failure(code: u16, reason: &str, message: &str, details: Value) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "details": details, "code": code})
}

/// The kinds the server stores, by resource (plural) name.
const KINDS: &[(&str, &str)] = &[
    ("configmaps", "ConfigMap"),
    ("deployments", "Deployment"),
    ("events", "Event"),
    ("leases", "Lease"),
    ("mcpendpoints", "McpEndpoint"),
    ("poddisruptionbudgets", "PodDisruptionBudget"),
    ("pods", "Pod"),
    ("rolebindings", "RoleBinding"),
    ("roles", "Role"),
    ("secrets", "Secret"),
    ("serviceaccounts", "ServiceAccount"),
    ("services", "Service"),
];

/// Kinds whose `metadata.generation` counts the changes of their `spec`.
const GENERATION_KINDS: &[&str] = &["Deployment", "McpEndpoint", "PodDisruptionBudget"];

/// A namespaced resource path, parsed.
struct Route {
    /// `/api/v1` or `/apis/<group>/<version>`.
    prefix: String,
    group: String,
    version: String,
    namespace: String,
    plural: String,
    kind: &'static str,
    name: Option<String>,
    /// `Some("status")` for the status subresource.
    sub: Option<String>,
}

impl Route {
    fn parse(path: &str) -> Option<Route> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match segments.as_slice() {
            ["api", version, "namespaces", rest @ ..] => ("", *version, rest),
            ["apis", group, version, "namespaces", rest @ ..] => (*group, *version, rest),
            _ => return None,
        };
        let (namespace, plural, name, sub) = match rest {
            [ns, plural] => (*ns, *plural, None, None),
            [ns, plural, name] => (*ns, *plural, Some(*name), None),
            [ns, plural, name, sub] => (*ns, *plural, Some(*name), Some(*sub)),
            _ => return None,
        };
        let kind = KINDS.iter().find(|(p, _)| *p == plural)?.1;
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        Some(Route {
            prefix,
            group: group.to_owned(),
            version: version.to_owned(),
            namespace: namespace.to_owned(),
            plural: plural.to_owned(),
            kind,
            name: name.map(str::to_owned),
            sub: sub.map(str::to_owned),
        })
    }

    fn collection(&self) -> String {
        format!(
            "{}/namespaces/{}/{}",
            self.prefix, self.namespace, self.plural
        )
    }

    /// The storage key of the object `name`.
    fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.collection())
    }

    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `deployments.apps` (`secrets` in the core group), as messages name a resource.
    fn resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn not_found(&self, name: &str) -> Value {
        let message = format!("{} {name:?} not found", self.resource());
        let details = json!({"name": name, "group": self.group, "kind": self.plural});
        failure(404, "NotFound", &message, details)
    }
}

/// One request, as the server handles it.
struct Call<'a> {
    method: Method,
    path: &'a str,
    /// The decoded query parameters.
    query: BTreeMap<String, String>,
    content_type: &'a str,
    /// The client's `User-Agent` (the default field manager of updates).
    agent: Option<&'a str>,
    body: Value,
}

impl Call<'_> {
    /// The field manager: the `fieldManager` parameter, else the user agent's product.
    fn manager(&self) -> Option<String> {
        self.query.get("fieldManager").cloned().or_else(|| {
            self.agent
                .and_then(|a| a.split('/').next())
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
        })
    }

    fn is_apply(&self) -> bool {
        self.method == Method::PATCH && self.content_type == "application/apply-patch+yaml"
    }

    /// A WATCH (`watch=true` or `1`), not a LIST.
    fn is_watch(&self) -> bool {
        self.query
            .get("watch")
            .is_some_and(|w| w == "true" || w == "1")
    }
}

/// The parameters of a query string, percent-decoded (`+` is a space).
fn decode_query(query: &str) -> BTreeMap<String, String> {
    let decode = |s: &str| {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match (bytes[i], hex) {
                (b'+', _) => out.push(b' '),
                (b'%', Some(b)) => {
                    out.push(b);
                    i += 2;
                }
                (b, _) => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// What a write does to an object.
enum Change<'a> {
    /// Server-side apply of this body.
    Apply { config: &'a Value, force: bool },
    /// Any other write, resulting in this object.
    Update(Value),
}

/// The current time, in seconds, as the API server writes it.
fn now() -> String {
    use k8s_openapi::jiff::Timestamp;
    let second = Timestamp::now().as_second();
    Timestamp::from_second(second)
        .expect("now is a valid time")
        .to_string()
}

/// `obj` without what changes on every write (resourceVersion, managedFields).
fn essence(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(meta) = v["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    v
}

impl ApiServer {
    fn next_serial(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }

    /// Answers one request of a client: the operator's RBAC first, then [`Self::handle`].
    fn serve_one(&mut self, call: &Call<'_>) -> (u16, Value) {
        let query = if call.is_watch() { "watch=true" } else { "" };
        if let Some(attributes) = request_attributes(&call.method, call.path, query) {
            let namespace = attributes.namespace.clone();
            self.namespaces_asked
                .insert(namespace.clone().unwrap_or_else(|| "*".into()));
            let (group, resource, verb) =
                (&attributes.group, &attributes.resource, attributes.verb);
            let allowed = |verb: &'static str| {
                let asked = tether_operator::access::Attributes {
                    verb,
                    ..attributes.clone()
                };
                self.grant.allows(RECONCILE, &asked)
                    || allows(LEADER_ELECTION, group, resource, verb)
            };
            let creates = call.is_apply()
                && Route::parse(call.path).is_some_and(|r| {
                    r.sub.is_none()
                        && r.name
                            .as_ref()
                            .is_some_and(|n| !self.objects.contains_key(&r.key(n)))
                });
            let refused = [(verb, true), ("create", creates)]
                .into_iter()
                .find(|(v, needed)| *needed && !allowed(v));
            if let Some((verb, _)) = refused {
                self.forbidden.push(format!("{verb} {group}/{resource}"));
                let scope = namespace.map_or_else(
                    || "at the cluster scope".to_owned(),
                    |ns| format!("in the namespace {ns:?}"),
                );
                let message = format!(
                    "User \"system:serviceaccount:tether-system:tether-operator\" cannot {verb} resource {resource:?} in API group {group:?} {scope}"
                );
                return (403, failure(403, "Forbidden", &message, json!({})));
            }
        }
        if call.method != Method::GET {
            self.writes.push(Write {
                method: call.method.clone(),
                path: call.path.to_owned(),
                query: call
                    .query
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join("&"),
                body: call.body.clone(),
            });
        }
        match self.handle(call) {
            Ok(answer) => answer,
            Err(status) => (status["code"].as_u64().unwrap_or(500) as u16, status),
        }
    }

    /// Handles one request; `Ok((code, object))` or `Err(Status)`.
    fn handle(&mut self, call: &Call<'_>) -> Result<(u16, Value), Value> {
        let missing = || {
            let message = "the server could not find the requested resource";
            failure(404, "NotFound", message, json!({}))
        };
        if let ["api", "v1", "namespaces", name] =
            call.path.trim_matches('/').split('/').collect::<Vec<_>>()[..]
            && call.method == Method::GET
        {
            // A Namespace (the tests store it with [`namespace`]).
            return self
                .objects
                .get(call.path)
                .map(|ns| (200, ns.clone()))
                .ok_or_else(|| {
                    let message = format!("namespaces \"{name}\" not found");
                    failure(
                        404,
                        "NotFound",
                        &message,
                        json!({"name": name, "kind": "namespaces"}),
                    )
                });
        }
        let route = Route::parse(call.path).ok_or_else(missing)?;
        let Some(name) = route.name.clone() else {
            return match call.method {
                Method::GET => self.list(&route, call).map(|list| (200, list)),
                Method::POST => self.create(&route, call).map(|obj| (201, obj)),
                _ => Err(missing()),
            };
        };
        let key = route.key(&name);
        let live = self.objects.get(&key).cloned();
        match call.method {
            Method::GET => live.map(|v| (200, v)).ok_or_else(|| route.not_found(&name)),
            Method::DELETE => self.delete_object(&route, &name, call).map(|v| (200, v)),
            Method::PUT => {
                let live = live.ok_or_else(|| route.not_found(&name))?;
                let sent = &call.body["metadata"]["resourceVersion"];
                if !sent.is_null() && *sent != live["metadata"]["resourceVersion"] {
                    let message = format!(
                        "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                        route.resource()
                    );
                    return Err(failure(409, "Conflict", &message, json!({"name": name})));
                }
                let manager = call.manager().unwrap_or_else(|| "unknown".to_owned());
                let change = Change::Update(call.body.clone());
                self.commit(&route, &name, Some(live), &manager, change)
                    .map(|v| (200, v))
            }
            Method::PATCH if call.is_apply() => {
                if route.sub.is_some() && live.is_none() {
                    return Err(route.not_found(&name));
                }
                let Some(manager) = call.query.get("fieldManager").cloned() else {
                    let message = "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch";
                    return Err(failure(422, "Invalid", message, json!({})));
                };
                let force = call.query.get("force").is_some_and(|f| f == "true");
                let change = Change::Apply {
                    config: &call.body,
                    force,
                };
                let created = live.is_none();
                self.commit(&route, &name, live, &manager, change)
                    .map(|v| (if created { 201 } else { 200 }, v))
            }
            Method::PATCH => {
                let live = live.ok_or_else(|| route.not_found(&name))?;
                let patched = match call.content_type {
                    "application/json-patch+json" => json_patch(&live, &call.body).map_err(|why| {
                        let message = format!("the server rejected our request due to an error in our request: {why}");
                        failure(422, "Invalid", &message, json!({}))
                    })?,
                    "application/merge-patch+json" => merge(&live, &call.body, false),
                    "application/strategic-merge-patch+json" => merge(&live, &call.body, true),
                    other => {
                        let message = format!("the body of the request was in an unknown format: {other}");
                        return Err(failure(415, "UnsupportedMediaType", &message, json!({})));
                    }
                };
                let manager = call.manager().unwrap_or_else(|| "unknown".to_owned());
                self.commit(&route, &name, Some(live), &manager, Change::Update(patched))
                    .map(|v| (200, v))
            }
            _ => Err(missing()),
        }
    }

    fn list(&self, route: &Route, call: &Call<'_>) -> Result<Value, Value> {
        let selector = call.query.get("labelSelector").map_or("", String::as_str);
        let prefix = format!("{}/", route.collection());
        let mut items = Vec::new();
        for (key, obj) in &self.objects {
            if key.strip_prefix(&prefix).is_some_and(|n| !n.contains('/')) {
                let selected = selector::matches(selector, obj)
                    .map_err(|why| failure(400, "BadRequest", &why, json!({})))?;
                if selected {
                    items.push(obj.clone());
                }
            }
        }
        Ok(
            json!({"apiVersion": route.api_version(), "kind": format!("{}List", route.kind),
                  "metadata": {"resourceVersion": self.serial.to_string()}, "items": items}),
        )
    }

    fn create(&mut self, route: &Route, call: &Call<'_>) -> Result<Value, Value> {
        let Some(name) = call.body["metadata"]["name"].as_str() else {
            let message = format!(
                "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                route.kind
            );
            return Err(failure(422, "Invalid", &message, json!({})));
        };
        if self.objects.contains_key(&route.key(name)) {
            let message = format!("{} {name:?} already exists", route.resource());
            let details = json!({"name": name, "group": route.group, "kind": route.plural});
            return Err(failure(409, "AlreadyExists", &message, details));
        }
        let manager = call.manager().unwrap_or_else(|| "unknown".to_owned());
        self.commit(
            route,
            name,
            None,
            &manager,
            Change::Update(call.body.clone()),
        )
    }

    /// Deletes the object `name`: marks it deleted while it has finalizers, else removes it.
    fn delete_object(
        &mut self,
        route: &Route,
        name: &str,
        call: &Call<'_>,
    ) -> Result<Value, Value> {
        let key = route.key(name);
        let mut live = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| route.not_found(name))?;
        let meta = &live["metadata"];
        let wanted = &call.body["preconditions"];
        for (field, what) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            if !wanted[field].is_null() && wanted[field] != meta[field] {
                let message = format!(
                    "Operation cannot be fulfilled on {} {name:?}: Precondition failed: {what} in precondition: {}, {what} in object meta: {}",
                    route.resource(),
                    wanted[field].as_str().unwrap_or_default(),
                    meta[field].as_str().unwrap_or_default()
                );
                return Err(failure(409, "Conflict", &message, json!({"name": name})));
            }
        }
        if meta["finalizers"].as_array().is_none_or(Vec::is_empty) {
            self.objects.remove(&key);
            return Ok(live);
        }
        if meta["deletionTimestamp"].is_null() {
            let rv = self.next_serial().to_string();
            let meta = &mut live["metadata"];
            meta["deletionTimestamp"] = json!(now());
            meta["deletionGracePeriodSeconds"] = json!(0);
            meta["resourceVersion"] = json!(rv);
            if GENERATION_KINDS.contains(&route.kind) {
                meta["generation"] = json!(meta["generation"].as_i64().unwrap_or(0) + 1);
            }
            self.objects.insert(key, live.clone());
        }
        Ok(live)
    }

    /// Stores the result of `change` as the object `name` of `route` (`live` when it exists),
    /// written by `manager`; returns the stored object.
    ///
    /// # Errors
    /// The `Status` of a conflict or of an invalid object; nothing is stored then.
    fn commit(
        &mut self,
        route: &Route,
        name: &str,
        live: Option<Value>,
        manager: &str,
        change: Change<'_>,
    ) -> Result<Value, Value> {
        let status_only = route.sub.as_deref() == Some("status");
        let base = live.clone().unwrap_or_else(|| json!({}));
        let mut entries = managed_fields(&base);
        let me = Entry {
            manager: manager.to_owned(),
            operation: match change {
                Change::Apply { .. } => Operation::Apply,
                Change::Update(_) => Operation::Update,
            },
            subresource: route.sub.clone(),
            api_version: route.api_version(),
            time: now(),
            fields: fields::FieldSet::new(),
        };
        let mut object = match change {
            Change::Apply { config, force } => {
                let config = scope(config, status_only);
                apply::apply(&base, &config, &mut entries, &me, force)
                    .map_err(|conflicts| apply::conflict_status(&conflicts))?
            }
            Change::Update(new) => match (status_only, base.get("status")) {
                (true, _) => {
                    let mut object = base.clone();
                    object["status"] = new["status"].clone();
                    object
                }
                (false, Some(status)) => {
                    let mut object = new;
                    object["status"] = status.clone();
                    object
                }
                (false, None) => {
                    let mut object = new;
                    if let Some(fields) = object.as_object_mut() {
                        fields.remove("status");
                    }
                    object
                }
            },
        };
        defaults::finalize(route.kind, &mut object, || self.next_cluster_ip());
        self.server_metadata(route, name, live.as_ref(), &mut object);
        if me.operation == Operation::Update {
            apply::update(&base, &object, &mut entries, &me);
        }
        validation::check(route.kind, &route.group, &object)?;
        if let Some(live) = &live {
            validation::frozen(route.kind, live, &object)?;
            let same_sets = |a: &[Entry], b: &[Entry]| {
                a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .all(|(x, y)| x.same_writer(y) && x.fields == y.fields)
            };
            if essence(live) == essence(&object) && same_sets(&managed_fields(live), &entries) {
                return Ok(live.clone());
            }
        }
        for entry in entries.iter_mut().filter(|e| e.same_writer(&me)) {
            entry.time = me.time.clone();
        }
        let rv = self.next_serial().to_string();
        let meta = &mut object["metadata"];
        meta["resourceVersion"] = json!(rv);
        if entries.is_empty() {
            meta.as_object_mut().map(|m| m.remove("managedFields"));
        } else {
            meta["managedFields"] = render(&entries);
        }
        let key = route.key(name);
        let finalized = meta["finalizers"].as_array().is_none_or(Vec::is_empty);
        if !meta["deletionTimestamp"].is_null() && finalized {
            self.objects.remove(&key);
        } else {
            self.objects.insert(key, object.clone());
        }
        Ok(object)
    }

    /// A new cluster IP (given to a Service only if it has none).
    fn next_cluster_ip(&mut self) -> String {
        self.cluster_ips += 1;
        let n = self.cluster_ips;
        format!("10.96.{}.{}", n / 200, n % 200 + 10)
    }

    /// The metadata the API server owns: name, namespace, apiVersion, kind, uid, creation and
    /// deletion timestamps (kept from `live`), and the generation, bumped on a change of `spec`.
    fn server_metadata(
        &mut self,
        route: &Route,
        name: &str,
        live: Option<&Value>,
        object: &mut Value,
    ) {
        object["apiVersion"] = json!(route.api_version());
        object["kind"] = json!(route.kind);
        if !object["metadata"].is_object() {
            object["metadata"] = json!({});
        }
        let uid = match live {
            Some(l) => l["metadata"]["uid"].clone(),
            None => json!(format!("uid-{}", self.next_serial())),
        };
        let meta = &mut object["metadata"];
        meta["name"] = json!(name);
        meta["namespace"] = json!(route.namespace);
        meta["uid"] = uid;
        let kept = [
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ];
        let fields = meta.as_object_mut().expect("metadata is an object");
        for field in kept {
            match live.map(|l| &l["metadata"][field]).filter(|v| !v.is_null()) {
                Some(value) => fields.insert(field.to_owned(), value.clone()),
                None => fields.remove(field),
            };
        }
        fields
            .entry("creationTimestamp")
            .or_insert_with(|| json!(now()));
        if GENERATION_KINDS.contains(&route.kind) {
            let generation = fields
                .get("generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let changed = live.is_none_or(|l| l["spec"] != object["spec"]);
            object["metadata"]["generation"] = json!(generation + i64::from(changed));
        }
    }
}

/// The part of an apply body a write of the object (`status_only`: of its status) takes: the
/// main resource ignores `status`, the status subresource everything else.
fn scope(config: &Value, status_only: bool) -> Value {
    let mut scoped: Map<String, Value> = config.as_object().cloned().unwrap_or_default();
    scoped.retain(|k, _| {
        if status_only {
            k == "status" || k == "apiVersion" || k == "kind"
        } else {
            k != "status"
        }
    });
    Value::Object(scoped)
}

/// `doc` after the JSON patch (RFC 6902) `ops`; as the API server, a `test` of `null` passes on
/// a missing path.
///
/// # Errors
/// Why an operation fails.
fn json_patch(doc: &Value, ops: &Value) -> Result<Value, String> {
    fn tokens(pointer: &str) -> Vec<String> {
        pointer
            .split('/')
            .skip(1)
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect()
    }
    fn parent<'a>(doc: &'a mut Value, path: &[String]) -> Result<(&'a mut Value, String), String> {
        let (last, up) = path.split_last().ok_or("the root cannot be changed")?;
        let mut node = doc;
        for t in up {
            node = match node {
                Value::Object(m) => m.get_mut(t),
                Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
                _ => None,
            }
            .ok_or_else(|| format!("missing path /{}", up.join("/")))?;
        }
        Ok((node, last.clone()))
    }
    let mut doc = doc.clone();
    for op in ops.as_array().ok_or("a JSON patch is a list")? {
        let path = tokens(op["path"].as_str().ok_or("an operation without path")?);
        match op["op"].as_str().unwrap_or_default() {
            "test" => {
                let found = doc.pointer(op["path"].as_str().unwrap_or_default());
                if found.unwrap_or(&Value::Null) != &op["value"] {
                    return Err(format!("testing value {} failed", op["path"]));
                }
            }
            "add" => match parent(&mut doc, &path)? {
                (Value::Object(m), key) => {
                    m.insert(key, op["value"].clone());
                }
                (Value::Array(a), key) if key == "-" => a.push(op["value"].clone()),
                (Value::Array(a), key) => {
                    let i: usize = key.parse().map_err(|_| format!("bad index {key}"))?;
                    if i > a.len() {
                        return Err(format!("index {i} out of range"));
                    }
                    a.insert(i, op["value"].clone());
                }
                _ => return Err("add to a value that is no object or list".to_owned()),
            },
            verb @ ("remove" | "replace") => {
                let (node, key) = parent(&mut doc, &path)?;
                let slot = match node {
                    Value::Object(m) => m.get_mut(&key),
                    Value::Array(a) => key.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
                    _ => None,
                }
                .ok_or_else(|| format!("{verb}: missing path {}", op["path"]))?;
                if verb == "replace" {
                    *slot = op["value"].clone();
                } else {
                    match node {
                        Value::Object(m) => {
                            m.remove(&key);
                        }
                        Value::Array(a) => {
                            a.remove(key.parse::<usize>().unwrap_or_default());
                        }
                        _ => {}
                    }
                }
            }
            other => return Err(format!("unsupported operation {other:?}")),
        }
    }
    Ok(doc)
}

/// A request the server holds until the test releases it, to order the requests of two clients.
struct Gate {
    method: Method,
    path: String,
    arrived: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
}

/// The test's end of a [`client_holding`] gate.
pub struct Hold {
    arrived: oneshot::Receiver<()>,
    release: oneshot::Sender<()>,
}

impl Hold {
    /// Waits until the held request has arrived (the server answers nothing meanwhile).
    ///
    /// # Panics
    /// When the client's server stopped first.
    pub async fn arrived(&mut self) {
        (&mut self.arrived).await.expect("the held request arrives");
    }

    /// Lets the server answer the held request, against the state of then.
    pub fn release(self) {
        let _ = self.release.send(());
    }
}

/// The body of an answer: the whole object, or a watch that stays open with no events.
type Answer = UnsyncBoxBody<Bytes, Infallible>;

/// Answers the requests of `handle` from `api` until the client is dropped. A watch the rules
/// allow stays open and sends nothing: the tests change objects through the reconcile.
async fn serve(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Answer>>,
    api: Shared,
    mut gate: Option<Gate>,
) {
    while let Some((request, respond)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let held = gate.take_if(|g| g.method == parts.method && g.path == parts.uri.path());
        if let Some(g) = held {
            let _ = g.arrived.send(());
            let _ = g.release.await;
        }
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
        let call = Call {
            method: parts.method.clone(),
            path: parts.uri.path(),
            query: decode_query(parts.uri.query().unwrap_or_default()),
            content_type: header("content-type").unwrap_or_default(),
            agent: header("user-agent"),
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        };
        let (code, answer) = api.lock().unwrap().serve_one(&call);
        let body = if call.is_watch() && code == 200 {
            StreamBody::new(futures::stream::pending::<Result<Frame<Bytes>, Infallible>>())
                .boxed_unsync()
        } else {
            Full::new(Bytes::from(serde_json::to_vec(&answer).unwrap())).boxed_unsync()
        };
        let response = Response::builder()
            .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
            .body(body)
            .unwrap();
        respond.send_response(response);
    }
}

/// A client of `api`; its server task runs until the client and its clones are dropped.
pub fn client_of(api: &Shared, namespace: &str) -> Client {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Answer>>();
    tokio::spawn(serve(handle, Arc::clone(api), None));
    Client::new(service, namespace)
}

/// A client of `api` whose first `method` request to `path` waits for the test ([`Hold`]).
pub fn client_holding(api: &Shared, namespace: &str, method: Method, path: &str) -> (Client, Hold) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Answer>>();
    let (arrived_tx, arrived) = oneshot::channel();
    let (release, release_rx) = oneshot::channel();
    let gate = Gate {
        method,
        path: path.to_owned(),
        arrived: arrived_tx,
        release: release_rx,
    };
    tokio::spawn(serve(handle, Arc::clone(api), Some(gate)));
    (Client::new(service, namespace), Hold { arrived, release })
}

/// Sends a request as a user (not subject to the operator's RBAC, not recorded in
/// [`ApiServer::writes`]); the stored object, or the `Status` of the failure.
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

/// Stores the Namespace `name` with `labels` (what the operator reads of it: its opt-in).
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

//! The object store: what each request does to the stored objects, the clients' RBAC, the
//! writes recorded and the event log the watches read.

use std::collections::{BTreeMap, BTreeSet};

use http::Method;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::fields::{self, Entry, Operation, managed_fields, merge, render};
use crate::patch::json_patch;
use crate::{apply, defaults, failure, selector, validation};

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

/// One change of a stored object, as a WATCH reports it.
#[derive(Clone, Debug)]
pub struct Event {
    /// The `resourceVersion` of the change.
    pub resource_version: u64,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    /// The object's path.
    pub path: String,
    /// The object after the change (before it, for `DELETED`).
    pub object: Value,
}

/// The RBAC attributes of an API request.
#[derive(Clone, Debug)]
pub struct Attributes {
    /// The API group (`""`: the core group).
    pub group: String,
    /// The resource (`kind` plural, `kind/subresource`).
    pub resource: String,
    /// The verb (`get`, `list`, `watch`, `create`, `patch`, …).
    pub verb: &'static str,
    /// The namespace; `None` across namespaces.
    pub namespace: Option<String>,
}

/// The RBAC rules of the clients ([`ApiServer::rbac`]).
pub trait Rbac: Send {
    /// The attributes of a request, from its method, path and query; `None` for a path that is
    /// no resource request.
    fn attributes(&self, method: &Method, path: &str, query: &str) -> Option<Attributes>;

    /// Whether the rules allow `attributes`.
    fn allows(&self, attributes: &Attributes) -> bool;
}

/// The server's state.
pub struct ApiServer {
    /// Every stored object by its path (`/api/v1/namespaces/tools/secrets/weather-tether`).
    pub objects: BTreeMap<String, Value>,
    /// Every request of the clients that is not a GET, in order.
    pub writes: Vec<Write>,
    /// The clients' rules: a request they do not allow is refused. `None`: everything is.
    pub rbac: Option<Box<dyn Rbac>>,
    /// Requests refused by [`Self::rbac`], as `verb group/resource`.
    pub forbidden: Vec<String>,
    /// Every namespace a request of the clients was in (`*` for one across namespaces), as
    /// [`Self::rbac`] reads it.
    pub namespaces_asked: BTreeSet<String>,
    /// Every change of a stored object, in order.
    pub events: Vec<Event>,
    /// LIST requests received (answered or held).
    pub lists: u64,
    /// WATCH requests received.
    pub watches: u64,
    /// Every request of the clients, `METHOD path?query`, for failure messages.
    pub requests: Vec<String>,
    /// Whether LISTs wait ([`Self::hold_lists`]).
    pub(crate) held: watch::Sender<bool>,
    /// The last event's `resourceVersion`, for the watches to wake on.
    pub(crate) changed: watch::Sender<u64>,
    /// The last `resourceVersion` and uid number given out.
    serial: u64,
    /// Cluster IPs given out.
    cluster_ips: u32,
}

impl Default for ApiServer {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            writes: Vec::new(),
            rbac: None,
            forbidden: Vec::new(),
            namespaces_asked: BTreeSet::new(),
            events: Vec::new(),
            lists: 0,
            watches: 0,
            requests: Vec::new(),
            held: watch::Sender::new(false),
            changed: watch::Sender::new(0),
            serial: 0,
            cluster_ips: 0,
        }
    }
}

/// The kinds the server stores, by resource (plural) name.
const KINDS: &[(&str, &str)] = &[
    ("configmaps", "ConfigMap"),
    ("deployments", "Deployment"),
    ("endpointslices", "EndpointSlice"),
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
pub(crate) struct Call<'a> {
    pub(crate) method: Method,
    pub(crate) path: &'a str,
    /// The decoded query parameters.
    pub(crate) query: BTreeMap<String, String>,
    pub(crate) content_type: &'a str,
    /// The client's `User-Agent` (the default field manager of updates).
    pub(crate) agent: Option<&'a str>,
    pub(crate) body: Value,
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

    /// A GET of a collection: a LIST or a WATCH.
    pub(crate) fn is_collection_get(&self) -> bool {
        self.method == Method::GET && Route::parse(self.path).is_some_and(|r| r.name.is_none())
    }

    /// A WATCH (`watch=true` or `1`), not a LIST.
    pub(crate) fn is_watch(&self) -> bool {
        self.query
            .get("watch")
            .is_some_and(|w| w == "true" || w == "1")
    }
}

/// The parameters of a query string, percent-decoded (`+` is a space).
pub(crate) fn decode_query(query: &str) -> BTreeMap<String, String> {
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

    /// Answers one request of a client: [`Self::rbac`] first, then [`Self::handle`].
    pub(crate) fn serve_one(&mut self, call: &Call<'_>) -> (u16, Value) {
        let query = if call.is_watch() { "watch=true" } else { "" };
        let attributes = self
            .rbac
            .as_ref()
            .and_then(|rbac| rbac.attributes(&call.method, call.path, query));
        if let Some(attributes) = attributes {
            let namespace = attributes.namespace.clone();
            self.namespaces_asked
                .insert(namespace.clone().unwrap_or_else(|| "*".into()));
            let creates = call.is_apply()
                && Route::parse(call.path).is_some_and(|r| {
                    r.sub.is_none()
                        && r.name
                            .as_ref()
                            .is_some_and(|n| !self.objects.contains_key(&r.key(n)))
                });
            let allowed = |verb: &'static str| {
                let asked = Attributes {
                    verb,
                    ..attributes.clone()
                };
                self.rbac.as_ref().is_none_or(|rbac| rbac.allows(&asked))
            };
            let refused = [(attributes.verb, true), ("create", creates)]
                .into_iter()
                .find(|(v, needed)| *needed && !allowed(v));
            if let Some((verb, _)) = refused {
                let (group, resource) = (&attributes.group, &attributes.resource);
                self.forbidden.push(format!("{verb} {group}/{resource}"));
                let scope = namespace.map_or_else(
                    || "at the cluster scope".to_owned(),
                    |ns| format!("in the namespace {ns:?}"),
                );
                let user = call
                    .agent
                    .and_then(|a| a.split('/').next())
                    .unwrap_or("unknown");
                let message = format!(
                    "User {user:?} cannot {verb} resource {resource:?} in API group {group:?} {scope}"
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
    pub(crate) fn handle(&mut self, call: &Call<'_>) -> Result<(u16, Value), Value> {
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
            let rv = self.next_serial();
            live["metadata"]["resourceVersion"] = json!(rv.to_string());
            self.record(rv, "DELETED", key, &live);
            return Ok(live);
        }
        if meta["deletionTimestamp"].is_null() {
            let rv = self.next_serial();
            let meta = &mut live["metadata"];
            meta["deletionTimestamp"] = json!(now());
            meta["deletionGracePeriodSeconds"] = json!(0);
            meta["resourceVersion"] = json!(rv.to_string());
            if GENERATION_KINDS.contains(&route.kind) {
                meta["generation"] = json!(meta["generation"].as_i64().unwrap_or(0) + 1);
            }
            self.objects.insert(key.clone(), live.clone());
            self.record(rv, "MODIFIED", key, &live);
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
        let rv = self.next_serial();
        let meta = &mut object["metadata"];
        meta["resourceVersion"] = json!(rv.to_string());
        if entries.is_empty() {
            meta.as_object_mut().map(|m| m.remove("managedFields"));
        } else {
            meta["managedFields"] = render(&entries);
        }
        let key = route.key(name);
        let finalized = meta["finalizers"].as_array().is_none_or(Vec::is_empty);
        let kind = if !meta["deletionTimestamp"].is_null() && finalized {
            self.objects.remove(&key);
            "DELETED"
        } else if self.objects.insert(key.clone(), object.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.record(rv, kind, key, &object);
        Ok(object)
    }

    /// Records the change `kind` of the object at `path` at `resource_version`, and wakes the
    /// watches.
    fn record(&mut self, resource_version: u64, kind: &'static str, path: String, object: &Value) {
        self.events.push(Event {
            resource_version,
            kind,
            path,
            object: object.clone(),
        });
        self.changed.send_replace(resource_version);
    }

    /// Makes every LIST wait (`true`) until released (`false`); a LIST already waiting is
    /// answered, with the objects of that moment, once released.
    pub fn hold_lists(&self, hold: bool) {
        self.held.send_replace(hold);
    }

    /// The watch events after `resource_version` of the objects of the collection at
    /// `collection` that match `selector`, as JSON lines, and the last version they reach.
    ///
    /// # Errors
    /// The `Status` of a selector that does not parse.
    pub(crate) fn events_after(
        &self,
        collection: &str,
        resource_version: u64,
        selector: &str,
    ) -> Result<(u64, Vec<Vec<u8>>), Value> {
        let prefix = format!("{}/", collection.trim_end_matches('/'));
        let mut last = resource_version;
        let mut lines = Vec::new();
        for event in self
            .events
            .iter()
            .filter(|e| e.resource_version > resource_version)
        {
            last = event.resource_version;
            let inside = event
                .path
                .strip_prefix(&prefix)
                .is_some_and(|n| !n.contains('/'));
            let selected = selector::matches(selector, &event.object)
                .map_err(|why| failure(400, "BadRequest", &why, json!({})))?;
            if inside && selected {
                let mut line =
                    serde_json::to_vec(&json!({"type": event.kind, "object": event.object}))
                        .unwrap_or_default();
                line.push(b'\n');
                lines.push(line);
            }
        }
        Ok((last, lines))
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

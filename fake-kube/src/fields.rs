//! Field paths and field sets as structured-merge-diff defines them, with the little of the
//! Kubernetes schemas the mock needs (which lists are maps and by which keys, which are sets, the
//! rest atomic), and `metadata.managedFields` in the FieldsV1 format.
//!
//! A set holds the leaves of an object (scalars, atomic lists, empty or `null` values) and the
//! items of its list-maps and sets; the objects on the way are not members. Kubernetes also makes
//! a struct a member when an update added it and its Go type is a pointer; without the Go types
//! the mock never does.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value, json};

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// `f:<name>`: a field of an object.
    Field(String),
    /// `k:<keys>`: the item of a list-map with these key fields (compact JSON, keys sorted).
    Key(String),
    /// `v:<value>`: the item of a set (compact JSON).
    Value(String),
}

impl Step {
    fn encode(&self) -> String {
        match self {
            Step::Field(name) => format!("f:{name}"),
            Step::Key(keys) => format!("k:{keys}"),
            Step::Value(value) => format!("v:{value}"),
        }
    }

    fn decode(text: &str) -> Option<Step> {
        let (kind, rest) = text.split_once(':')?;
        match kind {
            "f" => Some(Step::Field(rest.to_owned())),
            "k" => Some(Step::Key(rest.to_owned())),
            "v" => Some(Step::Value(rest.to_owned())),
            _ => None,
        }
    }

    fn is_item(&self) -> bool {
        !matches!(self, Step::Field(_))
    }
}

/// A path from an object's root, printed as the API server prints it in conflicts:
/// `.spec.template.spec.containers[name="server"].image`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Path(pub Vec<Step>);

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for step in &self.0 {
            match step {
                Step::Field(name) => write!(f, ".{name}")?,
                Step::Key(keys) => {
                    let keys: Map<String, Value> = serde_json::from_str(keys).unwrap_or_default();
                    let pairs: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    write!(f, "[{}]", pairs.join(","))?;
                }
                Step::Value(value) => write!(f, "[={value}]")?,
            }
        }
        Ok(())
    }
}

/// A set of field paths.
pub type FieldSet = BTreeSet<Path>;

/// How the items of a list merge (structured-merge-diff's `listType`).
enum ListType {
    /// Items are identified by these key fields.
    Map(&'static [&'static str]),
    /// Items are scalars identified by their value.
    Set,
    /// The list is one value.
    Atomic,
}

/// The lists that hold containers.
const CONTAINER_LISTS: &[&str] = &["containers", "initContainers", "ephemeralContainers"];

/// The type of the list at `path` (its last step is the list's field), as the Kubernetes schemas
/// declare it; every list not named here is atomic (RoleBinding `subjects`, Role `rules`,
/// `args`, `command`, `capabilities.drop`, `tolerations`, …).
fn list_type(path: &[Step]) -> ListType {
    let Some((Step::Field(name), parent)) = path.split_last() else {
        return ListType::Atomic;
    };
    let in_container = matches!(parent, [.., Step::Field(list), Step::Key(_)] if CONTAINER_LISTS.contains(&list.as_str()));
    let service_spec = matches!(parent, [Step::Field(spec)] if spec == "spec");
    match name.as_str() {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets" => ListType::Map(&["name"]),
        "ports" if in_container => ListType::Map(&["containerPort", "protocol"]),
        "ports" if service_spec => ListType::Map(&["port", "protocol"]),
        "volumeMounts" => ListType::Map(&["mountPath"]),
        "ownerReferences" => ListType::Map(&["uid"]),
        "conditions" => ListType::Map(&["type"]),
        "finalizers" => ListType::Set,
        _ => ListType::Atomic,
    }
}

/// The key of a list-map item (a missing `protocol` is `TCP`, its default); `None` when a key
/// field is missing.
fn item_key(keys: &[&str], item: &Value) -> Option<String> {
    let mut fields = Map::new();
    for key in keys {
        let value = item
            .get(*key)
            .cloned()
            .or_else(|| (*key == "protocol").then(|| json!("TCP")))?;
        fields.insert((*key).to_owned(), value);
    }
    Some(Value::Object(fields).to_string())
}

/// The granular children of `v` at `path`: the fields of a non-empty object, the items of a
/// non-empty list-map or set; `None` for a leaf (and for a list-map with an item lacking a key,
/// which then counts as one value).
fn children<'a>(path: &[Step], v: &'a Value) -> Option<Vec<(Step, &'a Value)>> {
    match v {
        Value::Object(fields) if !fields.is_empty() => Some(
            fields
                .iter()
                .map(|(k, child)| (Step::Field(k.clone()), child))
                .collect(),
        ),
        Value::Array(items) if !items.is_empty() => match list_type(path) {
            ListType::Map(keys) => items
                .iter()
                .map(|item| Some((Step::Key(item_key(keys, item)?), item)))
                .collect(),
            ListType::Set => Some(
                items
                    .iter()
                    .map(|item| (Step::Value(item.to_string()), item))
                    .collect(),
            ),
            ListType::Atomic => None,
        },
        _ => None,
    }
}

/// Whether the API server tracks ownership of `path`: not `apiVersion`, `kind` and the metadata
/// it sets itself (name, namespace, uid, resourceVersion, generation, timestamps, managedFields).
fn tracked(path: &Path) -> bool {
    const SERVER_METADATA: &[&str] = &[
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
    ];
    match path.0.as_slice() {
        [] => false,
        [Step::Field(f), ..] if f == "apiVersion" || f == "kind" => false,
        [Step::Field(m)] if m == "metadata" => false,
        [Step::Field(m), Step::Field(f), ..] if m == "metadata" => {
            !SERVER_METADATA.contains(&f.as_str())
        }
        _ => true,
    }
}

/// The fields `v` sets.
pub fn set_of(v: &Value) -> FieldSet {
    fn collect(path: &mut Vec<Step>, v: &Value, out: &mut FieldSet) {
        match children(path, v) {
            None if !path.is_empty() => {
                out.insert(Path(path.clone()));
            }
            None => {}
            Some(kids) => {
                if path.last().is_some_and(Step::is_item) {
                    out.insert(Path(path.clone()));
                }
                for (step, child) in kids {
                    path.push(step);
                    collect(path, child, out);
                    path.pop();
                }
            }
        }
    }
    let mut out = FieldSet::new();
    collect(&mut Vec::new(), v, &mut out);
    out.retain(tracked);
    out
}

/// `set` with every struct field on the way to its members a member too, as structured-merge-diff
/// counts them when it prunes: a struct in which only the pruning manager had fields goes whole,
/// with the defaults the API server put in it.
pub fn with_struct_fields(set: &FieldSet) -> FieldSet {
    let mut out = set.clone();
    for path in set {
        for end in 1..path.0.len() {
            let prefix = Path(path.0[..end].to_vec());
            if matches!(path.0[end - 1], Step::Field(_)) && tracked(&prefix) {
                out.insert(prefix);
            }
        }
    }
    out
}

/// What differs from an old object to a new one.
#[derive(Debug, Default)]
pub struct Changes {
    /// Fields added or given another value (and every node added on the way).
    pub changed: FieldSet,
    /// Fields removed (and every node removed with them).
    pub removed: FieldSet,
}

/// The changes from `old` to `new`, as structured-merge-diff compares them.
pub fn compare(old: &Value, new: &Value) -> Changes {
    fn walk(path: &mut Vec<Step>, old: Option<&Value>, new: Option<&Value>, out: &mut Changes) {
        let old_kids = old.and_then(|v| children(path, v));
        let new_kids = new.and_then(|v| children(path, v));
        let here = || Path(path.clone());
        match (old, new) {
            (None, Some(_)) => {
                out.changed.insert(here());
            }
            (Some(_), None) => {
                out.removed.insert(here());
            }
            (Some(a), Some(b)) => {
                let leaves = old_kids.is_none() && new_kids.is_none();
                let reshaped = std::mem::discriminant(a) != std::mem::discriminant(b);
                if (leaves && a != b) || reshaped {
                    out.changed.insert(here());
                }
            }
            (None, None) => {}
        }
        if old_kids.is_none() && new_kids.is_none() {
            return;
        }
        let old_kids: BTreeMap<Step, &Value> = old_kids.into_iter().flatten().collect();
        let new_kids: BTreeMap<Step, &Value> = new_kids.into_iter().flatten().collect();
        let steps: BTreeSet<&Step> = old_kids.keys().chain(new_kids.keys()).collect();
        for step in steps {
            path.push(step.clone());
            walk(
                path,
                old_kids.get(step).copied(),
                new_kids.get(step).copied(),
                out,
            );
            path.pop();
        }
    }
    let mut out = Changes::default();
    walk(&mut Vec::new(), Some(old), Some(new), &mut out);
    out.changed.retain(tracked);
    out.removed.retain(tracked);
    out
}

/// `patch` merged into `live`: objects field by field (a `null` removes the field), list-maps and
/// sets item by item when `keyed` (server-side apply, strategic merge patch), other values
/// replaced. Without `keyed` every list is replaced whole (JSON merge patch).
pub fn merge(live: &Value, patch: &Value, keyed: bool) -> Value {
    merge_at(&mut Vec::new(), Some(live), patch, keyed)
}

fn merge_at(path: &mut Vec<Step>, live: Option<&Value>, patch: &Value, keyed: bool) -> Value {
    match (live, patch) {
        (live, Value::Object(fields)) => {
            let live = live.and_then(Value::as_object);
            let mut out = live.cloned().unwrap_or_default();
            for (k, v) in fields {
                if v.is_null() {
                    out.remove(k);
                } else {
                    path.push(Step::Field(k.clone()));
                    let merged = merge_at(path, live.and_then(|l| l.get(k)), v, keyed);
                    path.pop();
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        (Some(live @ Value::Array(_)), Value::Array(_)) if keyed => {
            match (children(path, live), children(path, patch)) {
                (Some(old), Some(new)) => merge_items(path, &old, &new),
                _ => patch.clone(),
            }
        }
        _ => patch.clone(),
    }
}

/// The items of a list-map or set merged as structured-merge-diff orders them: the live order,
/// each new item placed before the next item of the patch that is live, the others at the end.
fn merge_items(path: &mut Vec<Step>, live: &[(Step, &Value)], patch: &[(Step, &Value)]) -> Value {
    let mut item = |step: &Step, old: Option<&Value>, new: &Value| {
        path.push(step.clone());
        let merged = merge_at(path, old, new, true);
        path.pop();
        merged
    };
    let is_live = |step: &Step| live.iter().any(|(s, _)| s == step);
    let mut before: BTreeMap<&Step, Vec<Value>> = BTreeMap::new();
    let mut pending = Vec::new();
    for (step, new) in patch {
        if is_live(step) {
            before.insert(step, std::mem::take(&mut pending));
        } else {
            pending.push(item(step, None, new));
        }
    }
    let mut out = Vec::new();
    for (step, old) in live {
        out.extend(before.remove(step).into_iter().flatten());
        match patch.iter().find(|(s, _)| s == step) {
            Some((_, new)) => out.push(item(step, Some(old), new)),
            None => out.push((*old).clone()),
        }
    }
    out.extend(pending);
    Value::Array(out)
}

/// Removes the fields of `set` from `v`: a leaf or list item named there goes whole, and so
/// does an object or a list that this leaves empty.
pub fn remove(v: &mut Value, set: &FieldSet) {
    fn under(set: &FieldSet, path: &[Step]) -> bool {
        let start = Path(path.to_vec());
        set.range(&start..)
            .take_while(|p| p.0.starts_with(path))
            .any(|p| p.0.len() > path.len())
    }
    fn emptied(v: &Value) -> bool {
        matches!(v, Value::Object(m) if m.is_empty())
            || matches!(v, Value::Array(a) if a.is_empty())
    }
    fn walk(path: &mut Vec<Step>, v: &mut Value, set: &FieldSet) {
        let steps: Vec<Step> = match children(path, v) {
            Some(kids) => kids.into_iter().map(|(step, _)| step).collect(),
            None => return,
        };
        let mut keep = Vec::with_capacity(steps.len());
        for (i, step) in steps.into_iter().enumerate() {
            path.push(step.clone());
            let child = match (&mut *v, &step) {
                (Value::Object(fields), Step::Field(name)) => fields.get_mut(name),
                (Value::Array(items), _) => items.get_mut(i),
                _ => None,
            };
            let gone = match child {
                _ if set.contains(&Path(path.clone())) => true,
                Some(child) if under(set, path) => {
                    walk(path, child, set);
                    emptied(child)
                }
                _ => false,
            };
            path.pop();
            keep.push((step, !gone));
        }
        match v {
            Value::Object(fields) => {
                for (step, kept) in keep {
                    if let (Step::Field(name), false) = (step, kept) {
                        fields.remove(&name);
                    }
                }
            }
            Value::Array(items) => {
                let mut kept = keep.iter().map(|(_, k)| *k);
                items.retain(|_| kept.next().unwrap_or(true));
            }
            _ => {}
        }
    }
    walk(&mut Vec::new(), v, set);
}

/// The operation of a managedFields entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Server-side apply: the entry holds exactly what the manager applied last.
    Apply,
    /// Any other write: the entry holds what the manager changed.
    Update,
}

/// One entry of `metadata.managedFields`.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The field manager.
    pub manager: String,
    /// How it wrote.
    pub operation: Operation,
    /// `Some("status")` for writes of the status subresource.
    pub subresource: Option<String>,
    /// The API version it wrote with.
    pub api_version: String,
    /// When the entry last changed (RFC 3339).
    pub time: String,
    /// The fields it owns.
    pub fields: FieldSet,
}

impl Entry {
    /// Whether `other` is the same manager, operation and subresource (one entry each).
    pub fn same_writer(&self, other: &Entry) -> bool {
        self.manager == other.manager
            && self.operation == other.operation
            && self.subresource == other.subresource
    }

    /// The manager as the API server names it in a conflict: `"helm" using apps/v1` for an
    /// update, `"kubectl"` for an apply.
    pub fn describe(&self) -> String {
        let mut text = format!("{:?}", self.manager);
        if let Some(sub) = &self.subresource {
            text.push_str(&format!(" with subresource {sub:?}"));
        }
        if self.operation == Operation::Update {
            text.push_str(&format!(" using {}", self.api_version));
        }
        text
    }
}

/// The entries of `obj`'s `metadata.managedFields`.
pub fn managed_fields(obj: &Value) -> Vec<Entry> {
    let entries = obj["metadata"]["managedFields"].as_array();
    entries
        .into_iter()
        .flatten()
        .map(|e| Entry {
            manager: e["manager"].as_str().unwrap_or_default().to_owned(),
            operation: if e["operation"] == "Apply" {
                Operation::Apply
            } else {
                Operation::Update
            },
            subresource: e["subresource"].as_str().map(str::to_owned),
            api_version: e["apiVersion"].as_str().unwrap_or_default().to_owned(),
            time: e["time"].as_str().unwrap_or_default().to_owned(),
            fields: parse_fields_v1(&e["fieldsV1"]),
        })
        .collect()
}

/// `entries` as `metadata.managedFields`.
pub fn render(entries: &[Entry]) -> Value {
    let rendered = entries.iter().map(|e| {
        let mut entry = json!({
            "manager": e.manager,
            "operation": match e.operation { Operation::Apply => "Apply", Operation::Update => "Update" },
            "apiVersion": e.api_version,
            "time": e.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": fields_v1(&e.fields),
        });
        if let Some(sub) = &e.subresource {
            entry["subresource"] = json!(sub);
        }
        entry
    });
    Value::Array(rendered.collect())
}

/// `set` in the FieldsV1 format: nested `f:`/`k:`/`v:` keys, a member with children marked `.`.
pub fn fields_v1(set: &FieldSet) -> Value {
    fn node<'a>(root: &'a mut Map<String, Value>, path: &Path) -> &'a mut Map<String, Value> {
        path.0.iter().fold(root, |node, step| {
            node.entry(step.encode())
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("FieldsV1 nodes are objects")
        })
    }
    let mut root = Map::new();
    for path in set {
        node(&mut root, path);
    }
    for path in set {
        let n = node(&mut root, path);
        if !n.is_empty() {
            n.insert(".".to_owned(), json!({}));
        }
    }
    Value::Object(root)
}

/// The set a FieldsV1 value holds.
pub fn parse_fields_v1(v: &Value) -> FieldSet {
    fn walk(path: &mut Vec<Step>, node: &Map<String, Value>, out: &mut FieldSet) {
        for (key, child) in node {
            if key == "." {
                out.insert(Path(path.clone()));
                continue;
            }
            let Some(step) = Step::decode(key) else {
                continue;
            };
            path.push(step);
            match child.as_object() {
                Some(grand) if !grand.is_empty() => walk(path, grand, out),
                _ => {
                    out.insert(Path(path.clone()));
                }
            }
            path.pop();
        }
    }
    let mut out = FieldSet::new();
    if let Some(root) = v.as_object() {
        walk(&mut Vec::new(), root, &mut out);
    }
    out
}

/// The managers of `obj` that own the field printed as `field` (see [`Path`]), in entry order.
pub fn owners(obj: &Value, field: &str) -> Vec<String> {
    managed_fields(obj)
        .into_iter()
        .filter(|e| e.fields.iter().any(|p| p.to_string() == field))
        .map(|e| e.manager)
        .collect()
}

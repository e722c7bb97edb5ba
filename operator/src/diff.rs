//! Whether a live object already holds every field the operator would apply, so a reconcile
//! with nothing to change writes nothing: identical server-side applies change nothing visible
//! in the object, yet they are writes (`docs/design/operator.md`).
//!
//! `covers` compares the JSON of a live object with the JSON of a desired one: fields the
//! API server added (defaults, status, other managers' fields) are ignored; lists whose items all
//! carry a `name` are matched by name (containers, env, volumes, ports, ownerReferences), other
//! lists — and the [`ATOMIC`] ones, whose items are named but which an apply replaces whole —
//! must match item by item; values compare as the API server stores them (quantities by value,
//! empty values as absent).

use kube_quantity::ParsedQuantity;
use serde_json::Value;

/// Fields holding lists of named items that the API server treats as atomic (no list-map
/// markers): a RoleBinding's `subjects`. A live list with an extra item does not cover them.
pub const ATOMIC: &[&str] = &["subjects"];

/// Whether `live` contains `desired`: every field of `desired` is in `live` with an equal value.
/// Values compare as the API server stores them: quantities (the values of `requests` and
/// `limits`) by value, since it keeps them in canonical form (`0.5` as `500m`, `1024Mi` as
/// `1Gi`); empty strings, lists and maps as absent, since it drops them.
pub(crate) fn covers(live: &Value, desired: &Value) -> bool {
    covers_in(live, desired, false)
}

/// [`covers`], where `quantities` says that string values are Kubernetes quantities (inside
/// `requests` or `limits`).
fn covers_in(live: &Value, desired: &Value, quantities: bool) -> bool {
    match (live, desired) {
        (_, Value::Null) => true,
        (Value::Object(_) | Value::Null, Value::Object(d)) if d.is_empty() => true,
        (_, d) if is_empty(d) => is_empty(live),
        (Value::Object(l), Value::Object(d)) => d.iter().all(|(k, dv)| {
            let lv = l.get(k).unwrap_or(&Value::Null);
            if ATOMIC.contains(&k.as_str()) {
                same_items(lv, dv)
            } else {
                covers_in(lv, dv, quantities || QUANTITIES.contains(&k.as_str()))
            }
        }),
        (Value::Array(l), Value::Array(d)) if d.iter().all(named) => d.iter().all(|di| {
            l.iter()
                .find(|li| li.get("name") == di.get("name"))
                .is_some_and(|li| covers(li, di))
        }),
        (Value::Array(_), Value::Array(_)) => same_items(live, desired),
        (Value::Number(l), Value::Number(d)) => l.as_f64() == d.as_f64(),
        (Value::String(l), Value::String(d)) if quantities => same_quantity(l, d),
        (l, d) => l == d,
    }
}

/// Maps whose values are quantities (a container's `resources`).
const QUANTITIES: &[&str] = &["requests", "limits"];

/// `null`, `""`, `[]` or `{}`: what the API server does not store. (A desired `null` is
/// covered by anything, a desired `{}` by any map.)
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Whether two quantities are equal in value (equal text when either does not parse).
fn same_quantity(live: &str, desired: &str) -> bool {
    let parse = |q: &str| ParsedQuantity::try_from(q).ok();
    match (parse(live), parse(desired)) {
        (Some(l), Some(d)) => l == d,
        _ => live == desired,
    }
}

/// Both are lists of the same length whose items cover each other in order.
fn same_items(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (Value::Array(l), Value::Array(d)) => {
            l.len() == d.len() && l.iter().zip(d).all(|(li, di)| covers(li, di))
        }
        _ => false,
    }
}

fn named(v: &Value) -> bool {
    v.get("name").is_some_and(Value::is_string)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::covers;

    #[test]
    fn added_fields_and_other_items_are_ignored() {
        let desired = json!({
            "metadata": {"name": "w", "labels": {"a": "1"}},
            "spec": {"template": {"spec": {
                "initContainers": [{"name": "tether-sidecar", "image": "s:1", "env": [{"name": "X", "value": "1"}]}],
                "containers": [{"name": "server", "lifecycle": {"preStop": {"httpGet": {"path": "/drained", "port": 9901}}}}],
                "terminationGracePeriodSeconds": 75,
            }}},
        });
        let live = json!({
            "metadata": {"name": "w", "labels": {"a": "1", "b": "2"}, "resourceVersion": "7"},
            "spec": {"replicas": 3, "template": {"spec": {
                "initContainers": [
                    {"name": "theirs", "image": "t"},
                    {"name": "tether-sidecar", "image": "s:1", "imagePullPolicy": "IfNotPresent",
                     "env": [{"name": "X", "value": "1"}], "terminationMessagePath": "/dev/termination-log"},
                ],
                "containers": [{"name": "server", "image": "srv", "lifecycle": {"preStop": {"httpGet": {"path": "/drained", "port": 9901, "scheme": "HTTP"}}}}],
                "terminationGracePeriodSeconds": 75,
            }}},
            "status": {"replicas": 3},
        });
        assert!(covers(&live, &desired));
    }

    #[test]
    fn any_missing_or_different_field_is_a_change() {
        let live = json!({"spec": {"containers": [{"name": "a", "image": "1"}], "verbs": ["get", "list"], "n": 75}});
        for desired in [
            json!({"spec": {"containers": [{"name": "a", "image": "2"}]}}),
            json!({"spec": {"containers": [{"name": "b", "image": "1"}]}}),
            json!({"spec": {"verbs": ["get", "list", "watch"]}}),
            json!({"spec": {"verbs": ["list", "get"]}}),
            json!({"spec": {"n": 76}}),
            json!({"spec": {"missing": true}}),
            json!({"other": {"x": 1}}),
        ] {
            assert!(!covers(&live, &desired), "{desired}");
        }
        assert!(covers(
            &live,
            &json!({"spec": {"n": 75.0, "verbs": ["get", "list"]}})
        ));
    }

    #[test]
    fn values_compare_as_the_api_server_stores_them() {
        let desired = json!({"resources": {"requests": {"cpu": "0.5", "memory": "1024Mi"},
                                           "limits": {"memory": "1536Mi"}},
                             "annotations": {}, "env": [], "name": ""});
        let canonical = json!({"resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                             "limits": {"memory": "1536Mi"}}});
        assert!(covers(&canonical, &desired));
        let more = json!({"resources": {"requests": {"cpu": "501m", "memory": "1Gi"},
                                        "limits": {"memory": "1536Mi"}}});
        assert!(!covers(&more, &desired));
        // Only quantities compare by value: other strings stay exact.
        assert!(!covers(
            &json!({"image": "1Gi"}),
            &json!({"image": "1024Mi"})
        ));
        // An empty desired value is covered by an absent or empty one, not by a value.
        assert!(!covers(
            &json!({"env": [{"name": "X"}]}),
            &json!({"env": []})
        ));
        assert!(covers(&json!({"env": []}), &json!({"env": []})));
    }

    #[test]
    fn an_atomic_list_with_an_extra_item_is_not_covered() {
        let subject = |n: &str| json!({"kind": "ServiceAccount", "name": n, "namespace": "tools"});
        let desired = json!({"subjects": [subject("app-sa")]});
        let live = json!({"subjects": [subject("app-sa"), subject("old")]});
        assert!(!covers(&live, &desired));
        assert!(covers(&json!({"subjects": [subject("app-sa")]}), &desired));
        // A map list (containers) with an extra item still covers.
        let desired = json!({"containers": [{"name": "a"}]});
        assert!(covers(
            &json!({"containers": [{"name": "b"}, {"name": "a"}]}),
            &desired
        ));
    }
}

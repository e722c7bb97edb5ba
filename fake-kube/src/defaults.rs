//! What the API server does to every object it stores: the defaults of the built-in kinds the
//! tests write, their resource quantities in canonical form (a custom resource keeps its
//! quantities as written), and empty values dropped as Go's `omitempty` drops them.
//!
//! Who owns a default follows the API server: an apply's field set is its body, so the defaults
//! added after the merge belong to nobody; an update (create, patch, replace) is defaulted before
//! the server compares it with the live object, so its manager owns the defaults that write
//! added — a Deployment created by Helm owns `terminationGracePeriodSeconds: 30` even when the
//! chart leaves it out.
//!
//! Empty values: `null` goes everywhere. In built-in kinds (and in every kind's `metadata`) empty
//! strings and empty lists go, and so do empty maps of the map-typed fields (`labels`,
//! `annotations`, `data`, `requests`, `limits`, `matchLabels`, a Service's `selector`, …); an
//! empty struct stays (`resources: {}`, `securityContext: {}`), as Go's `omitempty` never drops
//! a struct. Custom resources keep everything else as written.

use serde_json::{Map, Value, json};

/// Fields whose Go type is a map: omitted when empty.
const MAPS: &[&str] = &[
    "labels",
    "annotations",
    "data",
    "binaryData",
    "stringData",
    "requests",
    "limits",
    "nodeSelector",
    "matchLabels",
];

/// Defaults, canonical quantities and `omitempty` for an object of `kind`; `cluster_ip` gives a
/// new Service its address.
pub(super) fn finalize(kind: &str, obj: &mut Value, cluster_ip: impl FnOnce() -> String) {
    match kind {
        "Deployment" => deployment(&mut obj["spec"]),
        "Pod" => {
            pod_spec(&mut obj["spec"]);
            or_set(&mut obj["spec"], "serviceAccountName", json!("default"));
        }
        "Service" => service(&mut obj["spec"], cluster_ip),
        "Secret" => or_set(obj, "type", json!("Opaque")),
        _ => {}
    }
    if built_in(kind) {
        canonicalize(obj);
    }
    omit_empty(kind, obj);
}

/// Whether `kind` is Kubernetes' own (Go-typed), not a custom resource stored as written.
fn built_in(kind: &str) -> bool {
    kind != "McpEndpoint"
}

/// Sets `field` of the object `v` to `value` unless it is set.
fn or_set(v: &mut Value, field: &str, value: Value) {
    if let Some(fields) = v.as_object_mut() {
        fields.entry(field).or_insert(value);
    }
}

/// Each item of the list `v` (nothing when it is no list).
fn each(v: &mut Value) -> impl Iterator<Item = &mut Value> {
    v.as_array_mut().into_iter().flatten()
}

fn deployment(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    or_set(spec, "replicas", json!(1));
    or_set(spec, "revisionHistoryLimit", json!(10));
    or_set(spec, "progressDeadlineSeconds", json!(600));
    or_set(spec, "strategy", json!({}));
    or_set(&mut spec["strategy"], "type", json!("RollingUpdate"));
    if spec["strategy"]["type"] == "RollingUpdate" {
        let strategy = &mut spec["strategy"];
        or_set(strategy, "rollingUpdate", json!({}));
        or_set(&mut strategy["rollingUpdate"], "maxSurge", json!("25%"));
        or_set(
            &mut strategy["rollingUpdate"],
            "maxUnavailable",
            json!("25%"),
        );
    }
    if spec["template"]["spec"].is_object() {
        pod_spec(&mut spec["template"]["spec"]);
    }
}

fn pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    or_set(spec, "terminationGracePeriodSeconds", json!(30));
    or_set(spec, "restartPolicy", json!("Always"));
    or_set(spec, "dnsPolicy", json!("ClusterFirst"));
    or_set(spec, "schedulerName", json!("default-scheduler"));
    or_set(spec, "securityContext", json!({}));
    for list in ["containers", "initContainers"] {
        each(&mut spec[list]).for_each(container);
    }
    for volume in each(&mut spec["volumes"]) {
        for source in ["configMap", "secret"] {
            if volume[source].is_object() {
                or_set(&mut volume[source], "defaultMode", json!(420));
            }
        }
    }
}

fn container(c: &mut Value) {
    or_set(c, "terminationMessagePath", json!("/dev/termination-log"));
    or_set(c, "terminationMessagePolicy", json!("File"));
    let policy = pull_policy(c["image"].as_str().unwrap_or_default());
    or_set(c, "imagePullPolicy", json!(policy));
    or_set(c, "resources", json!({}));
    for port in each(&mut c["ports"]) {
        or_set(port, "protocol", json!("TCP"));
    }
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        let probe = &mut c[probe];
        if probe.is_object() {
            or_set(probe, "timeoutSeconds", json!(1));
            or_set(probe, "periodSeconds", json!(10));
            or_set(probe, "successThreshold", json!(1));
            or_set(probe, "failureThreshold", json!(3));
            handler(probe);
        }
    }
    for hook in ["postStart", "preStop"] {
        if c["lifecycle"][hook].is_object() {
            handler(&mut c["lifecycle"][hook]);
        }
    }
    for env in each(&mut c["env"]) {
        if env["valueFrom"]["fieldRef"].is_object() {
            or_set(&mut env["valueFrom"]["fieldRef"], "apiVersion", json!("v1"));
        }
    }
}

/// An `httpGet` handler (probe or lifecycle hook): path `/`, scheme `HTTP`.
fn handler(h: &mut Value) {
    if h["httpGet"].is_object() {
        or_set(&mut h["httpGet"], "path", json!("/"));
        or_set(&mut h["httpGet"], "scheme", json!("HTTP"));
    }
}

/// `Always` for an image without a tag or tagged `latest`, else `IfNotPresent`.
fn pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        _ if last.contains('@') => "IfNotPresent",
        None => "Always",
        Some((_, "latest")) => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn service(spec: &mut Value, cluster_ip: impl FnOnce() -> String) {
    if !spec.is_object() {
        return;
    }
    or_set(spec, "type", json!("ClusterIP"));
    or_set(spec, "sessionAffinity", json!("None"));
    or_set(spec, "internalTrafficPolicy", json!("Cluster"));
    for port in each(&mut spec["ports"]) {
        or_set(port, "protocol", json!("TCP"));
        let number = port["port"].clone();
        or_set(port, "targetPort", number);
    }
    if spec["type"] != "ExternalName" {
        if spec.get("clusterIP").is_none() {
            spec["clusterIP"] = json!(cluster_ip());
        }
        let ip = spec["clusterIP"].clone();
        or_set(spec, "clusterIPs", json!([ip]));
        or_set(spec, "ipFamilies", json!(["IPv4"]));
        or_set(spec, "ipFamilyPolicy", json!("SingleStack"));
    }
}

/// Every `resources.requests` and `resources.limits` value in canonical form.
fn canonicalize(v: &mut Value) {
    match v {
        Value::Object(fields) => {
            for (k, child) in fields.iter_mut() {
                if k == "resources" && child.is_object() {
                    for list in ["requests", "limits"] {
                        let values = child.get_mut(list).and_then(Value::as_object_mut);
                        for q in values.into_iter().flat_map(Map::values_mut) {
                            let text = match &*q {
                                Value::String(s) => s.clone(),
                                other => other.to_string(),
                            };
                            *q = json!(canonical_quantity(&text).unwrap_or(text));
                        }
                    }
                }
                canonicalize(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(canonicalize),
        _ => {}
    }
}

/// A resource quantity in the form the API server stores: `0.5` → `500m`, `1000m` → `1`,
/// `1000` → `1k`, `1024Mi` → `1Gi`, `0.5Gi` → `512Mi`, `1536Mi` and `100M` unchanged. Binary
/// suffixes stay binary when the value is a whole number of bytes of at least 1024, else it is
/// written in decimal; decimal values take the largest suffix that keeps the number whole (a
/// multiple of 1000), exponent forms (`1e3`) keep an exponent; values below `1n` round up to it.
/// `None` for what does not parse (or negative values, which the tests do not need).
pub fn canonical_quantity(text: &str) -> Option<String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let n: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    let scale = i32::try_from(fraction.len()).ok()?;
    let binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if let Some(power) = binary.iter().position(|s| *s == suffix) {
        let bytes = n.checked_mul(1u128.checked_shl(10 * (power as u32 + 1))?)?;
        let divisor = 10u128.checked_pow(scale as u32)?;
        if bytes % divisor != 0 || bytes / divisor < 1024 {
            return decimal(bytes, -scale, false);
        }
        let mut value = bytes / divisor;
        let mut power = 0;
        while power < binary.len() && value % 1024 == 0 {
            value /= 1024;
            power += 1;
        }
        let suffix = if power == 0 { "" } else { binary[power - 1] };
        return Some(format!("{value}{suffix}"));
    }
    let decimal_suffix = match suffix {
        "n" => Some(-9),
        "u" => Some(-6),
        "m" => Some(-3),
        "" => Some(0),
        "k" => Some(3),
        "M" => Some(6),
        "G" => Some(9),
        "T" => Some(12),
        "P" => Some(15),
        "E" => Some(18),
        _ => None,
    };
    match decimal_suffix {
        Some(exponent) => decimal(n, exponent - scale, false),
        None => {
            let exponent: i32 = suffix.strip_prefix(['e', 'E'])?.parse().ok()?;
            decimal(n, exponent - scale, true)
        }
    }
}

/// `n × 10^exponent` with an exponent that is a multiple of 3, as large as keeps `n` whole.
fn decimal(mut n: u128, mut exponent: i32, exponent_form: bool) -> Option<String> {
    if n == 0 {
        return Some("0".to_owned());
    }
    while exponent.rem_euclid(3) != 0 {
        n = n.checked_mul(10)?;
        exponent -= 1;
    }
    if exponent < -9 {
        let divisor = 10u128.checked_pow((-9 - exponent) as u32)?;
        n = n.div_ceil(divisor);
        exponent = -9;
    }
    while n.is_multiple_of(1000) && exponent < 18 {
        n /= 1000;
        exponent += 3;
    }
    let suffix = if exponent_form {
        if exponent == 0 {
            String::new()
        } else {
            format!("e{exponent}")
        }
    } else {
        let suffixes = ["n", "u", "m", "", "k", "M", "G", "T", "P", "E"];
        suffixes[((exponent + 9) / 3) as usize].to_owned()
    };
    Some(format!("{n}{suffix}"))
}

/// Drops empty values as described in the module documentation.
fn omit_empty(kind: &str, obj: &mut Value) {
    fn prune(v: &mut Value, service_spec: bool, drop_empties: bool) {
        match v {
            Value::Object(fields) => {
                for child in fields.values_mut() {
                    prune(child, false, drop_empties);
                }
                fields.retain(|name, child| {
                    let map_typed =
                        MAPS.contains(&name.as_str()) || (service_spec && name == "selector");
                    let empty = match child {
                        Value::Null => return false,
                        Value::String(s) => s.is_empty(),
                        Value::Array(items) => items.is_empty(),
                        Value::Object(m) => m.is_empty() && map_typed,
                        _ => false,
                    };
                    !(drop_empties && empty)
                });
            }
            Value::Array(items) => {
                for item in items {
                    prune(item, false, drop_empties);
                }
            }
            _ => {}
        }
    }
    if let Some(fields) = obj.as_object_mut() {
        for (name, child) in fields.iter_mut() {
            let service_spec = kind == "Service" && name == "spec";
            prune(child, service_spec, built_in(kind) || name == "metadata");
        }
        fields.retain(|_, child| !child.is_null());
    }
}

//! The committed CustomResourceDefinition against the Rust types: the file in `crds/` is
//! current, its schema is structural (as the API server requires of a CRD: every node typed, no
//! `$ref`, no types under `anyOf`/`oneOf`) and holds only `format`s the API server recognises
//! (Kubernetes 1.34 warns about any other), and its CEL rules reject at admission exactly what
//! [`validate_spec`] rejects in the operator and the sidecar (evaluated client-side with kube's
//! `cel` feature, as the apiserver would after defaulting).

use std::path::Path;

use kube::CustomResourceExt;
use kube::core::cel::{ErrorKind, validate_cel, validate_cel_update};
use serde_json::{Value, json};
use tether_crds::schema::recognized_format;
use tether_crds::{
    CHART_CRD_TEMPLATE, CRD_FILE, McpEndpoint, crd_helm_template, crd_yaml, validate_spec,
};

#[test]
fn the_committed_crd_matches_the_types() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(CRD_FILE);
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let current = crd_yaml().expect("the CRD renders");
    assert!(
        committed == current,
        "{} differs from the McpEndpoint types: run `make crds` and commit the file",
        path.display()
    );
}

#[test]
fn the_charts_crd_template_matches_the_types() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(CHART_CRD_TEMPLATE);
    let current = crd_helm_template().expect("the template renders");
    if std::env::var_os("TETHER_BLESS").is_some() {
        std::fs::write(&path, &current).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == current,
        "{} differs from the McpEndpoint types: run `make crds` and commit the file",
        path.display()
    );
    // Without its two Helm directives it is the committed CRD plus the keep annotation.
    let body: String = committed
        .lines()
        .filter(|l| !l.starts_with("{{"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        !body.contains("{{"),
        "a description holds `{{{{`, which Helm would take for a directive"
    );
    let mut from_chart: serde_json::Value = yaml_serde::from_str(&body).unwrap();
    assert_eq!(
        from_chart["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    from_chart["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    let plain: serde_json::Value = yaml_serde::from_str(&crd_yaml().unwrap()).unwrap();
    assert_eq!(from_chart, plain);
}

#[test]
fn the_schema_is_structural_with_recognised_formats_and_descriptions_in_paragraphs() {
    let crd = McpEndpoint::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("an openAPIV3Schema");
    let schema = serde_json::to_value(schema).expect("the schema serializes");
    let mut problems = Vec::new();
    lint(&schema, "openAPIV3Schema", false, &mut problems);
    assert!(
        problems.is_empty(),
        "schema nodes a Kubernetes 1.34 API server refuses or warns about, or kubectl explain \
         shows ragged:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_lint_finds_non_structural_nodes() {
    let mut problems = Vec::new();
    let free_form = json!({"type": "object", "properties": {"extra": {}}});
    lint(&free_form, "x", false, &mut problems);
    let referenced = json!({"type": "object", "properties": {"r": {"$ref": "#/defs/r"}}});
    lint(&referenced, "y", false, &mut problems);
    let typed_branch = json!({"anyOf": [{"type": "string"}, {"type": "integer"}]});
    lint(&typed_branch, "z", false, &mut problems);
    let formats = json!({"type": "object", "properties": {
        "port": {"type": "integer", "format": "uint16"},
        "at": {"type": "string", "format": "date-time"},
        "ids": {"type": "array", "items": {"type": "string", "format": "ip"}},
    }});
    lint(&formats, "f", false, &mut problems);
    let described = json!({"type": "object", "description": "A paragraph.\n\nAnother one.",
        "properties": {"p": {"type": "string", "description": "Broken\nat the source's width."}}});
    lint(&described, "d", false, &mut problems);
    assert_eq!(
        problems,
        [
            "x.properties.extra: no type",
            "y.properties.r: no type",
            "y.properties.r: $ref",
            "z: no type",
            "z.anyOf[0]: a type inside anyOf",
            "z.anyOf[1]: a type inside anyOf",
            "f.properties.ids.items: format \"ip\", which the API server does not recognise",
            "f.properties.port: format \"uint16\", which the API server does not recognise",
            "d.properties.p: a description with a line break inside a paragraph",
        ]
    );
}

/// Collects the nodes of `node` that a structural schema forbids: a node without `type` (unless
/// `x-kubernetes-preserve-unknown-fields` or `x-kubernetes-int-or-string`), `$ref`, and a type
/// inside `anyOf`/`oneOf`/`allOf`/`not` (except the int-or-string pattern); those with a
/// `format` the API server does not recognise for their type (1.34 warns about each); and those
/// whose description breaks a line inside a paragraph (`kubectl explain` wraps descriptions
/// itself, and would print the break mid-sentence).
fn lint(node: &Value, path: &str, in_branch: bool, problems: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        problems.push(format!("{path}: not an object"));
        return;
    };
    let flag = |k: &str| obj.get(k) == Some(&Value::Bool(true));
    let int_or_string = flag("x-kubernetes-int-or-string");
    let open = int_or_string || flag("x-kubernetes-preserve-unknown-fields");
    if !in_branch && !obj.contains_key("type") && !open {
        problems.push(format!("{path}: no type"));
    }
    if in_branch && obj.contains_key("type") {
        let branch = path.rsplit('.').next().unwrap_or(path);
        let kind = branch.split('[').next().unwrap_or(branch);
        problems.push(format!("{path}: a type inside {kind}"));
    }
    if obj.contains_key("$ref") {
        problems.push(format!("{path}: $ref"));
    }
    if let Some(text) = obj.get("description").and_then(Value::as_str)
        && text.split("\n\n").any(|p| p.contains('\n'))
    {
        problems.push(format!(
            "{path}: a description with a line break inside a paragraph"
        ));
    }
    if let Some(format) = obj.get("format").and_then(Value::as_str) {
        let type_ = obj.get("type").and_then(Value::as_str);
        if !recognized_format(type_, format) {
            problems.push(format!(
                "{path}: format {format:?}, which the API server does not recognise"
            ));
        }
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            lint(child, &format!("{path}.properties.{name}"), false, problems);
        }
    }
    if let Some(items) = obj.get("items") {
        lint(items, &format!("{path}.items"), false, problems);
    }
    if let Some(extra) = obj.get("additionalProperties").filter(|v| v.is_object()) {
        lint(
            extra,
            &format!("{path}.additionalProperties"),
            false,
            problems,
        );
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for (i, branch) in obj
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if !int_or_string {
                lint(branch, &format!("{path}.{key}[{i}]"), true, problems);
            }
        }
    }
}

/// An McpEndpoint with `spec` (defaults filled in by serde, as the apiserver's defaulting does).
fn endpoint(spec: Value) -> McpEndpoint {
    serde_json::from_value(json!({
        "apiVersion": "mcp.tether.dev/v1alpha1",
        "kind": "McpEndpoint",
        "metadata": {"name": "weather", "namespace": "default"},
        "spec": spec,
    }))
    .expect("a well-typed McpEndpoint")
}

/// Merges `patch` into the minimal spec.
fn spec_with(patch: Value) -> Value {
    let mut spec = json!({"targetRef": {"kind": "Deployment", "name": "weather"}});
    merge(&mut spec, patch);
    spec
}

fn merge(into: &mut Value, patch: Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Specs CEL and `validate_spec` must both reject, each with the field its message names.
fn invalid_specs() -> Vec<(&'static str, Value)> {
    vec![
        (
            "spec.targetRef.kind",
            spec_with(json!({"targetRef": {"kind": "StatefulSet"}})),
        ),
        (
            "spec.targetRef.name",
            spec_with(json!({"targetRef": {"name": ""}})),
        ),
        (
            "spec.upstream.port",
            spec_with(json!({"upstream": {"port": 0}})),
        ),
        (
            "spec.listen.port",
            spec_with(json!({"listen": {"port": 0}})),
        ),
        ("spec.admin.port", spec_with(json!({"admin": {"port": 0}}))),
        ("spec.peer.port", spec_with(json!({"peer": {"port": 0}}))),
        (
            "spec.admin.port",
            spec_with(json!({"admin": {"port": 8080}})),
        ),
        ("spec.peer.port", spec_with(json!({"peer": {"port": 9901}}))),
        (
            "spec.upstream.path",
            spec_with(json!({"upstream": {"path": "mcp"}})),
        ),
        (
            "spec.listen.path",
            spec_with(json!({"listen": {"path": "/mcp?x=1"}})),
        ),
        (
            "spec.listen.path",
            spec_with(json!({"listen": {"path": "/m c p"}})),
        ),
        (
            "spec.origins.allow",
            spec_with(json!({"origins": {"allow": ["app.example.com"]}})),
        ),
        (
            "spec.origins.allow",
            spec_with(json!({"origins": {"allow": ["ftp://a.example"]}})),
        ),
        (
            "spec.origins.allow",
            spec_with(json!({"origins": {"allow": ["https://a.example/"]}})),
        ),
        (
            "spec.origins.allow",
            spec_with(json!({"origins": {"allow": ["https://a.example:0"]}})),
        ),
        (
            "spec.origins.allow",
            spec_with(json!({"origins": {"allow": ["https://u@a.example"]}})),
        ),
        (
            "spec.origins.allow",
            spec_with(json!({"origins": {"allow": ["null"]}})),
        ),
        (
            "spec.protocolVersions",
            spec_with(json!({"protocolVersions": []})),
        ),
        (
            "spec.protocolVersions",
            spec_with(json!({"protocolVersions": ["2024-11-05"]})),
        ),
        (
            "spec.protocolVersions",
            spec_with(json!({"protocolVersions": ["2025-06-18", "2025-06-18"]})),
        ),
        (
            "spec.buffer.maxEvents",
            spec_with(json!({"buffer": {"maxEvents": 0}})),
        ),
        (
            "spec.buffer.maxBytes",
            spec_with(json!({"buffer": {"maxBytes": 0}})),
        ),
        (
            "spec.buffer.ttl",
            spec_with(json!({"buffer": {"ttl": "0s"}})),
        ),
        (
            "spec.session.idleTimeout",
            spec_with(json!({"session": {"idleTimeout": "-5m"}})),
        ),
        (
            "spec.drain.timeout",
            spec_with(json!({"drain": {"timeout": "0s"}})),
        ),
        (
            "spec.drain.timeout",
            spec_with(json!({"drain": {"timeout": "2h"}})),
        ),
        (
            "spec.drain.shutdownDelay",
            spec_with(json!({"drain": {"shutdownDelay": "-1s"}})),
        ),
    ]
}

fn valid_specs() -> Vec<Value> {
    vec![
        spec_with(json!({})),
        spec_with(json!({
            "upstream": {"port": 8000, "path": "/v1/mcp"},
            "listen": {"port": 8443, "path": "/mcp"},
            "admin": {"port": 9000},
            "peer": {"port": 9001},
            "origins": {"allow": [
                "https://app.example.com", "HTTP://LOCALHOST:3000", "http://[::1]:8080",
                "http://10.0.0.7", "https://a-b.example:00443"
            ], "allowMissing": false},
            "protocolVersions": ["2025-06-18", "2025-11-25"],
            "buffer": {"maxEvents": 1, "maxBytes": 1, "ttl": "1h30m"},
            "session": {"idleTimeout": "90s", "migration": "Pin"},
            "drain": {"timeout": "1h"},
            "sidecar": {"image": "ghcr.io/tether-dev/tether-sidecar:0.1.0",
                        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}},
        })),
    ]
}

#[test]
fn cel_rules_accept_what_validate_spec_accepts() {
    for spec in valid_specs() {
        let obj = endpoint(spec.clone());
        assert_eq!(validate_spec(&obj.spec), [], "validate_spec rejects {spec}");
        if let Err(errors) = validate_cel(&obj) {
            panic!("CEL rejects {spec}: {errors:?}");
        }
    }
}

#[test]
fn cel_rules_reject_what_validate_spec_rejects_naming_the_same_field() {
    for (field, spec) in invalid_specs() {
        let obj = endpoint(spec.clone());
        let by_rust = validate_spec(&obj.spec);
        assert!(
            by_rust.iter().any(|e| e.path.starts_with(field)),
            "validate_spec does not reject {field} in {spec}: {by_rust:?}"
        );
        let errors = match validate_cel(&obj) {
            Ok(()) => panic!("CEL accepts {spec} ({field})"),
            Err(errors) => errors.into_vec(),
        };
        for e in &errors {
            assert_eq!(e.kind, ErrorKind::ValidationFailure, "{e:?}");
        }
        assert!(
            errors.iter().any(|e| e.message.starts_with(field)),
            "no CEL message names {field} for {spec}: {errors:?}"
        );
    }
}

/// Each bounded field at its limit and one past it: `(field, at the limit, one past)`. The
/// limits are `tether_crds::validate`'s `MAX_*` constants and the lower bounds, written out so
/// that a change to one side alone (the CEL rule or `validate_spec`) fails here.
fn bounds() -> Vec<(&'static str, Value, Value)> {
    const MIB: u64 = 1024 * 1024;
    [
        ("spec.buffer.maxEvents", json!(100_000), json!(100_001)),
        ("spec.buffer.maxEvents", json!(1), json!(0)),
        ("spec.buffer.maxBytes", json!(64 * MIB), json!(64 * MIB + 1)),
        ("spec.buffer.maxBytes", json!(1), json!(0)),
        ("spec.buffer.ttl", json!("24h"), json!("24h1s")),
        (
            "spec.buffer.ttl",
            json!("1440m"),
            json!("24h0m0.000000001s"),
        ),
        ("spec.buffer.ttl", json!("1ns"), json!("0s")),
        ("spec.session.idleTimeout", json!("24h"), json!("24h1s")),
        (
            "spec.session.idleTimeout",
            json!("86400s"),
            json!("86400001ms"),
        ),
        ("spec.session.idleTimeout", json!("1ns"), json!("-1ns")),
        ("spec.drain.timeout", json!("1h"), json!("1h1s")),
        ("spec.drain.timeout", json!("1ns"), json!("0s")),
        ("spec.drain.shutdownDelay", json!("5m"), json!("5m1s")),
        ("spec.drain.shutdownDelay", json!("0s"), json!("-1s")),
        ("spec.auth.revalidate", json!("1h"), json!("1h1s")),
        ("spec.auth.revalidate", json!("0s"), json!("-1s")),
    ]
    .into_iter()
    .map(|(field, at, past)| {
        let set = |value: Value| {
            let mut patch = value;
            for key in field.rsplit('.').take_while(|k| *k != "spec") {
                patch = json!({key: patch});
            }
            spec_with(patch)
        };
        (field, set(at), set(past))
    })
    .collect()
}

#[test]
fn cel_rules_and_validate_spec_accept_each_bound_and_reject_one_past_it() {
    for (field, at, past) in bounds() {
        let obj = endpoint(at.clone());
        assert_eq!(validate_spec(&obj.spec), [], "validate_spec rejects {at}");
        if let Err(errors) = validate_cel(&obj) {
            panic!("CEL rejects {at}: {errors:?}");
        }
        let obj = endpoint(past.clone());
        let by_rust = validate_spec(&obj.spec);
        assert!(
            by_rust.len() == 1 && by_rust[0].path == field,
            "validate_spec does not reject {field} alone in {past}: {by_rust:?}"
        );
        let by_cel = match validate_cel(&obj) {
            Ok(()) => panic!("CEL accepts {past} ({field})"),
            Err(errors) => errors.into_vec(),
        };
        assert!(
            by_cel.len() == 1
                && by_cel[0].kind == ErrorKind::ValidationFailure
                && by_cel[0].message.starts_with(field),
            "CEL does not reject {field} alone in {past}: {by_cel:?}"
        );
    }
}

#[test]
fn target_ref_is_immutable_but_the_rest_of_the_spec_is_not() {
    let old = endpoint(spec_with(json!({})));
    let retargeted = endpoint(spec_with(json!({"targetRef": {"name": "other"}})));
    let errors = validate_cel_update(&retargeted, &old)
        .expect_err("a new targetRef is refused")
        .into_vec();
    assert!(
        errors
            .iter()
            .any(|e| e.message.starts_with("spec.targetRef is immutable")),
        "{errors:?}"
    );
    let tuned = endpoint(spec_with(
        json!({"buffer": {"maxEvents": 64}, "drain": {"timeout": "30s"}}),
    ));
    assert!(validate_cel_update(&tuned, &old).is_ok());
}

//! The configuration reference of `McpEndpoint` (`docs/reference/crd.md`), generated from the
//! CustomResourceDefinition's OpenAPI schema, so the document cannot drift from the types.
//!
//! [`markdown`] walks the schema of `spec` (then `status`) depth-first and renders one table per
//! object: each field's path, type, default, description (the Rust doc comments schemars put into
//! the schema) and what the API server checks at admission (bounds, enums and the messages of
//! the CEL rules). A test in `crds/tests/reference.rs` fails when the committed file differs and
//! rewrites it with `TETHER_BLESS=1`.

use std::fmt::Write as _;

use kube::CustomResourceExt;
use serde_json::{Map, Value};

use crate::McpEndpoint;

/// Path of the generated document, relative to the workspace root.
pub const REFERENCE_FILE: &str = "docs/reference/crd.md";

/// The command that regenerates [`REFERENCE_FILE`] and every other generated reference.
pub const REGENERATE: &str = "make references";

/// Checks that the generated file at `path` (under the workspace root `root`) holds exactly
/// `current`; with `TETHER_BLESS=1` in the environment it writes `current` there instead. Used
/// by the tests of every generated reference (this crate's, the sidecar's flags and status
/// codes).
///
/// # Errors
/// A message naming the file, the first line that differs and [`REGENERATE`].
pub fn check_generated(root: &std::path::Path, path: &str, current: &str) -> Result<(), String> {
    let full = root.join(path);
    if std::env::var("TETHER_BLESS").is_ok_and(|v| v == "1") {
        return std::fs::write(&full, current)
            .map_err(|e| format!("cannot write {}: {e}", full.display()));
    }
    let committed = std::fs::read_to_string(&full).unwrap_or_default();
    if committed == current {
        return Ok(());
    }
    let line = committed
        .lines()
        .zip(current.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| committed.lines().count().min(current.lines().count()))
        + 1;
    Err(format!(
        "{path} differs from what the code generates (first difference at line {line}): \
         regenerate it with `{REGENERATE}` and commit it"
    ))
}

/// The configuration reference as Markdown: the content of [`REFERENCE_FILE`].
pub fn markdown() -> String {
    let crd = McpEndpoint::crd();
    let version = &crd.spec.versions[0];
    let root = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .map(|s| serde_json::to_value(s).unwrap_or(Value::Null))
        .unwrap_or(Value::Null);
    let mut out = String::new();
    let _ = write!(
        out,
        "# `McpEndpoint` configuration reference\n\n\
         <!-- Generated from the McpEndpoint CRD by tether_crds::reference::markdown(); do not edit.\n     \
         Regenerate with: {REGENERATE} -->\n\n\
         `apiVersion: {group}/{ver}`, `kind: {kind}` (plural `{plural}`, short name `{short}`), \
         namespaced. {description}\n\n\
         This page is generated from the CustomResourceDefinition in \
         `crds/mcpendpoints.mcp.tether.dev.yaml`; the descriptions are the doc comments of the Rust \
         types in `crds/src/spec.rs`. Durations are Kubernetes durations (`500ms`, `30s`, `5m`, \
         `1h30m`; the API server stores defaults in seconds, so `600s` is `10m`); sizes are bytes. \
         The *admission* column lists what the API server rejects when an object is created or \
         updated: schema bounds and the messages of the CEL rules (`x-kubernetes-validations`). \
         Which fields a running sidecar reloads and which roll the pods is explained in \
         [Changing an endpoint](../guide/upgrade.md#changing-an-endpoint).\n",
        group = crd.spec.group,
        ver = version.name,
        kind = crd.spec.names.kind,
        plural = crd.spec.names.plural,
        short = crd
            .spec
            .names
            .short_names
            .as_ref()
            .and_then(|s| s.first())
            .map_or("", String::as_str),
        description = one_line(root.get("description")),
    );
    if let Some(columns) = &version.additional_printer_columns {
        out.push_str(
            "\n## `kubectl get mcpe` columns\n\n| column | type | value | description |\n|---|---|---|---|\n",
        );
        for c in columns {
            let _ = writeln!(
                out,
                "| {} | {} | `{}` | {} |",
                c.name,
                c.type_,
                cell(&c.json_path),
                cell(c.description.as_deref().unwrap_or("")),
            );
        }
    }
    let properties = root.get("properties");
    for top in ["spec", "status"] {
        if let Some(schema) = properties.and_then(|p| p.get(top)) {
            object(&mut out, top, schema);
        }
    }
    out
}

/// Renders the table of the object at `path` (`spec`, `spec.buffer`, …), then the tables of
/// the objects below it, depth-first in field order.
fn object(out: &mut String, path: &str, schema: &Value) {
    let _ = write!(out, "\n## `{path}`\n\n");
    let description = paragraphs(schema.get("description"));
    if !description.is_empty() {
        let _ = write!(out, "{description}\n\n");
    }
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    out.push_str("| field | type | default | description | admission |\n|---|---|---|---|---|\n");
    let mut nested = Vec::new();
    for (name, field) in properties {
        let field_path = format!("{path}.{name}");
        let (ty, child) = type_of(&field_path, field);
        let default = match field.get("default") {
            Some(d) => format!("`{}`", cell(&compact(d))),
            None if required.contains(&name.as_str()) => "required".to_owned(),
            None => "—".to_owned(),
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} |",
            field_path,
            ty,
            default,
            cell(&one_line(field.get("description"))),
            cell(&admission(field)),
        );
        if let Some(child) = child {
            nested.push(child);
        }
    }
    let rules = rules(schema);
    if !rules.is_empty() {
        out.push_str("\nRules on the whole object, checked at admission:\n\n");
        for (message, field) in rules {
            match field {
                Some(f) => {
                    let _ = writeln!(out, "- {message} (reported on `{path}{f}`)");
                }
                None => {
                    let _ = writeln!(out, "- {message}");
                }
            }
        }
    }
    for (child_path, child_schema) in nested {
        object(out, &child_path, child_schema);
    }
}

/// The type column of `field` at `path`, and the object to render below when the field is (or
/// holds) one with properties.
fn type_of<'a>(path: &str, field: &'a Value) -> (String, Option<(String, &'a Value)>) {
    if field.get("properties").is_some() {
        let link = format!("object ([{path}](#{}))", anchor(path));
        return (link, Some((path.to_owned(), field)));
    }
    if let Some(items) = field.get("items") {
        let item_path = format!("{path}[]");
        let (item_type, child) = type_of(&item_path, items);
        return (format!("array of {item_type}"), child);
    }
    if let Some(values) = field.get("additionalProperties") {
        let (value_type, child) = type_of(&format!("{path}.*"), values);
        return (format!("map of string to {value_type}"), child);
    }
    if field.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return ("integer or string".to_owned(), None);
    }
    let base = field.get("type").and_then(Value::as_str).unwrap_or("any");
    let ty = match field.get("format").and_then(Value::as_str) {
        Some(format) => format!("{base} ({format})"),
        None => base.to_owned(),
    };
    (ty, None)
}

/// What the API server checks on one field: enum, bounds, lengths, and CEL rule messages.
fn admission(field: &Value) -> String {
    let mut checks = Vec::new();
    if let Some(values) = field.get("enum").and_then(Value::as_array) {
        let list: Vec<String> = values.iter().map(|v| format!("`{}`", plain(v))).collect();
        checks.push(format!("one of {}", list.join(", ")));
    }
    let bound = |key: &str| field.get(key).map(number);
    match (bound("minimum"), bound("maximum")) {
        (Some(lo), Some(hi)) => checks.push(format!("{lo} to {hi}")),
        (Some(lo), None) => checks.push(format!("at least {lo}")),
        (None, Some(hi)) => checks.push(format!("at most {hi}")),
        (None, None) => {}
    }
    if let Some(n) = field.get("maxLength") {
        checks.push(format!("at most {} characters", number(n)));
    }
    if let Some(n) = field.get("maxItems") {
        checks.push(format!("at most {} items", number(n)));
    }
    if let Some(n) = field.get("items").and_then(|i| i.get("maxLength")) {
        checks.push(format!("items at most {} characters", number(n)));
    }
    for (message, _) in rules(field) {
        checks.push(message);
    }
    checks.join("; ")
}

/// The CEL rules of `schema`: message (or the rule itself when it has none) and `fieldPath`.
fn rules(schema: &Value) -> Vec<(String, Option<String>)> {
    schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .map(|rules| {
            rules
                .iter()
                .map(|r| {
                    let message = r
                        .get("message")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                        .unwrap_or_else(|| {
                            format!("`{}`", r.get("rule").and_then(Value::as_str).unwrap_or(""))
                        });
                    let field = r
                        .get("fieldPath")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                    (message, field)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A JSON number as written by hand: `65535`, not `65535.0`.
fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => v.to_string(),
    }
}

/// A value as text: strings without quotes, anything else as JSON.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A default value, compact: `9901`, `/mcp`, `{"port":9901}`.
fn compact(v: &Value) -> String {
    match v {
        Value::Number(_) => number(v),
        Value::Object(_) | Value::Array(_) => normalize(v).to_string(),
        other => plain(other),
    }
}

/// `v` with whole floats turned into integers (the schema stores bounds as floats).
fn normalize(v: &Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => Value::from(f as i64),
            _ => v.clone(),
        },
        Value::Array(a) => Value::Array(a.iter().map(normalize).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), normalize(v))).collect())
        }
        other => other.clone(),
    }
}

/// A description on one line: the lines of each paragraph joined with spaces, paragraphs
/// separated by `<br>` (table cells cannot hold line breaks).
fn one_line(description: Option<&Value>) -> String {
    paragraphs(description)
        .split("\n\n")
        .collect::<Vec<_>>()
        .join("<br>")
}

/// A description as Markdown paragraphs (the CRD's descriptions are reflowed already,
/// `schema::reflowed_descriptions`).
fn paragraphs(description: Option<&Value>) -> String {
    description.and_then(Value::as_str).unwrap_or("").to_owned()
}

/// Text safe inside a table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The anchor GitHub gives a heading whose text is `` `heading` ``: lower case, without
/// characters other than letters, digits, `-` and `_`.
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
        .flat_map(char::to_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_field_has_a_row() {
        let md = markdown();
        for field in [
            "spec.targetRef.kind",
            "spec.targetRef.name",
            "spec.upstream.port",
            "spec.upstream.path",
            "spec.listen.port",
            "spec.listen.path",
            "spec.admin.port",
            "spec.peer.port",
            "spec.origins.allow",
            "spec.origins.allowMissing",
            "spec.protocolVersions",
            "spec.buffer.maxEvents",
            "spec.buffer.maxBytes",
            "spec.buffer.ttl",
            "spec.session.idleTimeout",
            "spec.session.migration",
            "spec.drain.timeout",
            "spec.drain.shutdownDelay",
            "spec.sidecar.image",
            "spec.sidecar.resources",
            "spec.auth.forwardHeaders",
            "spec.auth.binding",
            "spec.auth.revalidate",
            "spec.upstream.host",
            "spec.upstream.forwardOrigin",
        ] {
            assert!(md.contains(&format!("| `{field}` |")), "no row for {field}");
        }
    }

    #[test]
    fn rows_carry_defaults_requirements_and_rule_messages() {
        let md = markdown();
        let row = |field: &str| {
            md.lines()
                .find(|l| l.starts_with(&format!("| `{field}` |")))
                .unwrap_or_else(|| panic!("no row for {field}"))
                .to_owned()
        };
        assert!(row("spec.admin.port").contains("| `9901` |"));
        assert!(row("spec.admin.port").contains("spec.admin.port must be between 1 and 65535"));
        assert!(row("spec.targetRef").contains("| required |"));
        assert!(row("spec.targetRef").contains("spec.targetRef is immutable"));
        assert!(row("spec.session.migration").contains("one of `Replay`, `Pin`"));
        assert!(row("spec.buffer").contains("[spec.buffer](#specbuffer)"));
        assert!(md.contains("spec.peer.port must differ from spec.listen.port and spec.admin.port (reported on `spec.peer.port`)"));
        assert!(md.contains("\n## `spec.sidecar.resources.claims[]`\n"));
    }

    #[test]
    fn anchors_follow_github() {
        assert_eq!(anchor("spec.targetRef"), "spectargetref");
        assert_eq!(
            anchor("spec.sidecar.resources.claims[]"),
            "specsidecarresourcesclaims"
        );
    }
}

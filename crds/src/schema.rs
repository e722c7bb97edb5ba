//! Schema pieces that schemars does not produce for Kubernetes on its own: list-map conditions,
//! and only the `format`s the API server recognises.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::transform::transform_subschemas;
use schemars::{Schema, SchemaGenerator};
use serde_json::Value;

/// The schema of `status.conditions`: a list of `metav1.Condition` that server-side apply merges
/// by `type` (`x-kubernetes-list-type: map`, keys `[type]`) instead of replacing it whole.
pub fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    schema.insert("x-kubernetes-list-type".to_owned(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".to_owned(),
        serde_json::json!(["type"]),
    );
    schema
}

/// The string formats every supported Kubernetes version (1.29 on) validates in a CRD schema,
/// spelled without dashes as the API server compares them (`date-time` is `datetime`). The
/// `k8s-short-name` and `k8s-long-name` of 1.34 are left out: older servers ignore them.
const STRING_FORMATS: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "quantity",
];

/// Whether the API server recognises `format` on a schema of `type_` (none: a string), as its
/// CRD validation does (Kubernetes 1.34 warns about any other): `int32`, `int64` on integers,
/// `float`, `double` on numbers, [`STRING_FORMATS`] on strings, nothing on other types.
pub fn recognized_format(type_: Option<&str>, format: &str) -> bool {
    match type_ {
        Some("integer") => matches!(format, "int32" | "int64"),
        Some("number") => matches!(format, "float" | "double"),
        None | Some("string") => STRING_FORMATS.contains(&format.replace('-', "").as_str()),
        Some(_) => false,
    }
}

/// The bounds an integer `format` of schemars stands for, as far as they are narrower than the
/// API server's own integers (int64): `uint16` is 0 to 65535, `uint32` 0 to 4294967295,
/// `uint64` and `uint` (usize) at least 0, `int8` −128 to 127; `(None, None)` for any other.
fn integer_bounds(format: &str) -> (Option<i64>, Option<i64>) {
    let (signed, bits) = match (format.strip_prefix("uint"), format.strip_prefix("int")) {
        (Some(bits), _) => (false, bits),
        (None, Some(bits)) => (true, bits),
        (None, None) => return (None, None),
    };
    // `uint` and `int` are usize and isize: 64 bits.
    match (signed, bits.parse::<u32>().unwrap_or(64)) {
        (false, bits @ ..63) => (Some(0), Some((1 << bits) - 1)),
        (false, _) => (Some(0), None),
        (true, bits @ 1..64) => (Some(-(1 << (bits - 1))), Some((1 << (bits - 1)) - 1)),
        (true, _) => (None, None),
    }
}

/// A schemars transform, on `schema` and every schema below it: removes each `format` the API
/// server does not recognise ([`recognized_format`]); for the integer formats schemars gives
/// Rust's integers (`uint16`, `uint32`, `uint64`, …) it first sets the `minimum` and `maximum`
/// they stood for, unless the schema already has a narrower one.
pub(crate) fn kubernetes_formats(schema: &mut Schema) {
    transform_subschemas(&mut kubernetes_formats, schema);
    let Some(format) = schema
        .get("format")
        .and_then(|f| f.as_str())
        .map(str::to_owned)
    else {
        return;
    };
    // An `Option`'s schema is still `[type, "null"]` here: kube's `AddNullable` runs later.
    let type_ = match schema.get("type") {
        Some(Value::String(type_)) => Some(type_.as_str()),
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null"),
        _ => None,
    };
    if recognized_format(type_, &format) {
        return;
    }
    if type_ == Some("integer") {
        let (low, high) = integer_bounds(&format);
        let number = |key: &str, schema: &Schema| schema.get(key).and_then(|v| v.as_f64());
        if let Some(low) = low
            && number("minimum", schema).is_none_or(|m| m < low as f64)
        {
            schema.insert("minimum".to_owned(), low.into());
        }
        if let Some(high) = high
            && number("maximum", schema).is_none_or(|m| m > high as f64)
        {
            schema.insert("maximum".to_owned(), high.into());
        }
    }
    schema.remove("format");
}

/// A schemars transform, on `schema` and every schema below it: each `description` reflowed, the
/// lines of a paragraph joined with single spaces and paragraphs kept apart by a blank line. Doc
/// comments break their lines at the source's width; `kubectl explain` wraps a description to the
/// terminal itself, and would print those breaks mid-sentence.
pub(crate) fn reflowed_descriptions(schema: &mut Schema) {
    transform_subschemas(&mut reflowed_descriptions, schema);
    if let Some(Value::String(text)) = schema.get_mut("description") {
        *text = reflow(text);
    }
}

/// `text` with the lines of each paragraph joined by single spaces; paragraphs (separated by a
/// blank line) stay apart, one blank line between two.
pub(crate) fn reflow(text: &str) -> String {
    let mut paragraphs = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() {
            if !current.is_empty() {
                paragraphs.push(current.join(" "));
                current.clear();
            }
        } else {
            current.push(line);
        }
    }
    if !current.is_empty() {
        paragraphs.push(current.join(" "));
    }
    paragraphs.join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn transformed(value: Value) -> Value {
        let mut schema = Schema::try_from(value).unwrap();
        kubernetes_formats(&mut schema);
        schema.to_value()
    }

    #[test]
    fn the_api_servers_formats_are_recognised_and_no_other() {
        for (type_, format) in [
            (Some("integer"), "int32"),
            (Some("integer"), "int64"),
            (Some("number"), "double"),
            (Some("string"), "date-time"),
            (Some("string"), "byte"),
            (None, "uri"),
        ] {
            assert!(recognized_format(type_, format), "{type_:?} {format}");
        }
        for (type_, format) in [
            (Some("integer"), "uint16"),
            (Some("integer"), "uint64"),
            (Some("integer"), "int"),
            (Some("integer"), "double"),
            (Some("string"), "ip"),
            (Some("string"), "int32"),
            (Some("array"), "cidr"),
            (Some("object"), "date"),
        ] {
            assert!(!recognized_format(type_, format), "{type_:?} {format}");
        }
    }

    #[test]
    fn unsigned_formats_become_bounds_and_recognised_ones_stay() {
        let schema = json!({"type": "object", "properties": {
            "port": {"type": "integer", "format": "uint16", "minimum": 0, "maximum": 65535},
            "events": {"type": "integer", "format": "uint32", "minimum": 0},
            "bytes": {"type": "integer", "format": "uint64", "minimum": 0},
            "strict": {"type": "integer", "format": "uint32", "minimum": 1, "maximum": 10},
            "tiny": {"type": "integer", "format": "int8"},
            "gen": {"type": "integer", "format": "int64"},
            "pods": {"type": ["integer", "null"], "format": "int32"},
            "big": {"type": ["integer", "null"], "format": "uint64"},
            "at": {"type": "string", "format": "date-time"},
            "ips": {"type": "array", "items": {"type": "string", "format": "ip"}},
            "sizes": {"type": "object", "additionalProperties": {"type": "integer", "format": "uint"}},
        }});
        assert_eq!(
            transformed(schema)["properties"],
            json!({
                "port": {"type": "integer", "minimum": 0, "maximum": 65535},
                "events": {"type": "integer", "minimum": 0, "maximum": 4_294_967_295_i64},
                "bytes": {"type": "integer", "minimum": 0},
                "strict": {"type": "integer", "minimum": 1, "maximum": 10},
                "tiny": {"type": "integer", "minimum": -128, "maximum": 127},
                "gen": {"type": "integer", "format": "int64"},
                "pods": {"type": ["integer", "null"], "format": "int32"},
                "big": {"type": ["integer", "null"], "minimum": 0},
                "at": {"type": "string", "format": "date-time"},
                "ips": {"type": "array", "items": {"type": "string"}},
                "sizes": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
            })
        );
    }

    #[test]
    fn descriptions_are_reflowed_into_paragraphs() {
        for (text, want) in [
            ("one line", "one line"),
            (
                "a sentence broken\nat the source's width.",
                "a sentence broken at the source's width.",
            ),
            ("  indented\n  lines  ", "indented lines"),
            (
                "first\nparagraph\n\nsecond\n\n\n\nthird",
                "first paragraph\n\nsecond\n\nthird",
            ),
            ("\n\nleading and trailing\n\n", "leading and trailing"),
            ("", ""),
        ] {
            assert_eq!(reflow(text), want, "{text:?}");
        }
        let mut schema = Schema::try_from(json!({
            "description": "The spec,\nbroken.",
            "properties": {"port": {"type": "integer", "description": "A port\nnumber.\n\nChanging it\nrolls."}},
            "items": {"description": "one"},
        }))
        .unwrap();
        reflowed_descriptions(&mut schema);
        assert_eq!(
            schema.to_value(),
            json!({
                "description": "The spec, broken.",
                "properties": {"port": {"type": "integer", "description": "A port number.\n\nChanging it rolls."}},
                "items": {"description": "one"},
            })
        );
    }
}

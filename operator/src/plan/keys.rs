//! The key-ring Secret as the reconcile writes it: the whole Secret when the ring is created,
//! and one JSON patch per rotation step, guarded by the `resourceVersion` it was read at (a
//! Secret changed since is refused with 422 and read again by the next reconcile). Never
//! `immutable`: a rotation rewrites it.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};
use tether_crds::keyring::Generation;

use super::child_meta;
use crate::dereference::Found;
use crate::keys::{ROTATION_ANNOTATION, Ring, Write};
use crate::names::Names;

/// What a reconcile sends to the key-ring Secret.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum KeyStep {
    /// Nothing.
    Leave,
    /// Create it (it did not exist when read).
    Create(Box<Secret>),
    /// Change it with this JSON patch.
    Patch {
        /// The Secret's name.
        name: String,
        /// The JSON patch (RFC 6902), a `test` of the `resourceVersion` first.
        body: Value,
    },
}

/// The key-ring Secret of a new endpoint `names` (controller `owner`) holding only `generation`.
pub fn secret(names: &Names, owner: &OwnerReference, generation: &Generation) -> Secret {
    ring_secret(names, owner, &Ring::of(generation), None)
}

/// The key-ring Secret holding `ring`, with [`ROTATION_ANNOTATION`] `rotation` when given.
pub(crate) fn ring_secret(
    names: &Names,
    owner: &OwnerReference,
    ring: &Ring,
    rotation: Option<&str>,
) -> Secret {
    let mut metadata = child_meta(names, names.secret(), owner);
    if let Some(rotation) = rotation {
        metadata.annotations = Some([(ROTATION_ANNOTATION.to_owned(), rotation.to_owned())].into());
    }
    Secret {
        metadata,
        data: Some(ring.data()),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    }
}

/// The step that makes `write` of the endpoint `names` (controller `owner`), `found` as read.
pub(crate) fn step(names: &Names, owner: &OwnerReference, found: &Found, write: &Write) -> KeyStep {
    match (write, found) {
        (Write::Create { ring, rotation }, _) => KeyStep::Create(Box::new(ring_secret(
            names,
            owner,
            ring,
            rotation.as_deref(),
        ))),
        (Write::Update { ring, rotation }, Found::Ring(live)) => KeyStep::Patch {
            name: names.secret(),
            body: patch(live, ring, rotation.as_deref()),
        },
        _ => KeyStep::Leave,
    }
}

/// The JSON patch that turns `live`'s data into `ring`'s and its [`ROTATION_ANNOTATION`] into
/// `rotation`: only the files that change, after a `test` of the `resourceVersion` read.
pub(crate) fn patch(live: &Secret, ring: &Ring, rotation: Option<&str>) -> Value {
    let pointer =
        |parent: &str, key: &str| format!("{parent}/{}", key.replace('~', "~0").replace('/', "~1"));
    let encoded = |bytes: &ByteString| serde_json::to_value(bytes).unwrap_or(Value::Null);
    let mut ops = vec![json!({
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": live.metadata.resource_version,
    })];
    let old = live.data.clone().unwrap_or_default();
    let new = ring.data();
    if live.data.is_none() {
        ops.push(json!({"op": "add", "path": "/data", "value": {}}));
    }
    for (file, content) in &new {
        if old.get(file) != Some(content) {
            ops.push(
                json!({"op": "add", "path": pointer("/data", file), "value": encoded(content)}),
            );
        }
    }
    for file in old.keys().filter(|f| !new.contains_key(*f)) {
        ops.push(json!({"op": "remove", "path": pointer("/data", file)}));
    }
    let annotations = live.metadata.annotations.as_ref();
    let held = annotations.and_then(|a| a.get(ROTATION_ANNOTATION));
    match (rotation, annotations) {
        (r, _) if r == held.map(String::as_str) => {}
        (Some(r), None) => ops.push(json!({
            "op": "add", "path": "/metadata/annotations", "value": {ROTATION_ANNOTATION: r},
        })),
        (Some(r), Some(_)) => ops.push(json!({
            "op": "add", "path": pointer("/metadata/annotations", ROTATION_ANNOTATION), "value": r,
        })),
        (None, Some(_)) => ops.push(json!({
            "op": "remove", "path": pointer("/metadata/annotations", ROTATION_ANNOTATION),
        })),
        (None, None) => {}
    }
    Value::Array(ops)
}

#[cfg(test)]
mod tests {
    use tether_crds::keyring::{CA_BUNDLE, CURRENT_KEY, NEXT_KEY, NEXT_TLS_CERT, NEXT_TLS_KEY};

    use super::*;
    use crate::fixtures::{self, MINIMAL_ENDPOINT};

    #[test]
    fn a_new_ring_is_a_mutable_secret_of_the_endpoints() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let names = fixtures::names(&ep);
        let g = Generation::new("tools/weather").unwrap();
        let s = secret(&names, &fixtures::owner(&ep), &g);
        assert_eq!(
            s.metadata.name.as_deref(),
            Some("weather-tether-keys-6f1c2a9e")
        );
        assert_eq!(s.immutable, None, "a rotation rewrites it");
        assert_eq!(s.data.as_ref().unwrap()[CURRENT_KEY].0, g.key);
        assert_eq!(
            s.metadata.owner_references.as_ref().unwrap()[0].kind,
            "McpEndpoint"
        );
        assert!(s.metadata.annotations.is_none());
    }

    #[test]
    fn a_patch_tests_the_version_read_and_changes_only_what_a_step_changes() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let names = fixtures::names(&ep);
        let ring = Ring::of(&Generation::new("tools/weather").unwrap());
        let mut live = ring_secret(&names, &fixtures::owner(&ep), &ring, None);
        live.metadata.resource_version = Some("41".into());
        let staged = ring.stage(&Generation::new("tools/weather").unwrap());
        let ops = patch(&live, &staged, Some("r1"));
        let summary: Vec<String> = ops
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                format!(
                    "{} {}",
                    o["op"].as_str().unwrap(),
                    o["path"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                "test /metadata/resourceVersion".to_owned(),
                format!("add /data/{CA_BUNDLE}"),
                format!("add /data/{NEXT_KEY}"),
                format!("add /data/{NEXT_TLS_CERT}"),
                format!("add /data/{NEXT_TLS_KEY}"),
                "add /metadata/annotations".to_owned(),
            ]
        );
        assert_eq!(ops[0]["value"], "41");
        assert_eq!(ops[5]["value"], json!({"mcp.tether.dev/rotation": "r1"}));
        // Retiring drops files; the annotation held is kept.
        live.data = Some(staged.promote().data());
        live.metadata.annotations = Some([(ROTATION_ANNOTATION.to_owned(), "r1".into())].into());
        let ops = patch(&live, &staged.promote().retire(), Some("r1"));
        let last = ops.as_array().unwrap().last().unwrap();
        assert_eq!(last, &json!({"op": "remove", "path": "/data/previous"}));
        assert_eq!(ops.as_array().unwrap().len(), 3, "{ops}");
        let ops = patch(&live, &staged.promote(), Some("r2"));
        assert_eq!(
            ops[1],
            json!({"op": "add", "path": "/metadata/annotations/mcp.tether.dev~1rotation", "value": "r2"})
        );
    }
}

//! Schema pieces that schemars does not produce for Kubernetes on its own.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::{Schema, SchemaGenerator};

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

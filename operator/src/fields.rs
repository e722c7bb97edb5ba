//! Who manages a field of a live object: the field managers whose `metadata.managedFields` sets
//! (server-side apply's `FieldsV1` trees) hold a path. The plan reads it so that the operator
//! claims a field of the user's Deployment only when no one else manages it
//! (`docs/design/operator.md`, "Field ownership").

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::names::Names;

/// One step of a field path in `FieldsV1` terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step<'a> {
    /// A field of an object (`f:<name>`).
    Field(&'a str),
    /// The item of a list keyed by `name` (`k:{"name":"<value>"}`), as containers are.
    Named(&'a str),
}

impl Step<'_> {
    fn key(&self) -> String {
        match self {
            Step::Field(name) => format!("f:{name}"),
            Step::Named(name) => format!("k:{}", serde_json::json!({ "name": name })),
        }
    }
}

/// The pod template spec's field `name` of a Deployment.
pub(crate) fn pod_spec_field(name: &str) -> [Step<'_>; 4] {
    [
        Step::Field("spec"),
        Step::Field("template"),
        Step::Field("spec"),
        Step::Field(name),
    ]
}

/// The managers of the main (not status) subresource whose field set holds `path` or a field
/// under it, in the order `managedFields` lists them.
pub(crate) fn managers<'m>(meta: &'m ObjectMeta, path: &[Step<'_>]) -> Vec<&'m str> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|entry| entry.subresource.as_deref().unwrap_or_default().is_empty())
        .filter(|entry| {
            entry
                .fields_v1
                .as_ref()
                .is_some_and(|set| holds(&set.0, path))
        })
        .filter_map(|entry| entry.manager.as_deref())
        .collect()
}

/// Whether only the endpoint's field manager manages the `preStop` of `deployment`'s MCP server
/// container `container` (or none does): then the injection carries that hook. Not when the
/// user's manifest carries it ([`crate::validate`] checked it is ours) — then the operator
/// co-owns nothing in the user's container, and renaming or removing it in the user's manifest
/// needs nothing of the operator.
pub(crate) fn tether_alone_manages_pre_stop(
    names: &Names,
    deployment: &Deployment,
    container: &str,
) -> bool {
    let path = [
        Step::Field("spec"),
        Step::Field("template"),
        Step::Field("spec"),
        Step::Field("containers"),
        Step::Named(container),
        Step::Field("lifecycle"),
        Step::Field("preStop"),
    ];
    managers(&deployment.metadata, &path)
        .iter()
        .all(|m| is_ours(m, names))
}

/// Whether field manager `manager` is this endpoint's.
pub(crate) fn is_ours(manager: &str, names: &Names) -> bool {
    manager == names.field_manager()
}

/// Whether `manager` has server-side applied fields of the object itself (not of a
/// subresource) that are still recorded: what an apply of nothing with that manager releases.
/// An `Update` entry of the same name is not released that way.
pub(crate) fn applies(meta: &ObjectMeta, manager: &str) -> bool {
    meta.managed_fields.iter().flatten().any(|entry| {
        entry.manager.as_deref() == Some(manager)
            && entry.operation.as_deref() == Some("Apply")
            && entry.subresource.as_deref().unwrap_or_default().is_empty()
    })
}

fn holds(set: &Value, path: &[Step<'_>]) -> bool {
    path.iter()
        .try_fold(set, |node, step| node.get(step.key()))
        .is_some()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_managers_of_a_field_are_read_from_the_managed_fields() {
        let meta: ObjectMeta = serde_json::from_value(json!({
            "managedFields": [
                {"manager": "helm", "operation": "Update", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:template": {"f:spec": {
                     "f:terminationGracePeriodSeconds": {},
                     "f:containers": {"k:{\"name\":\"server\"}": {".": {}, "f:image": {}}},
                 }}}}},
                {"manager": "tether-operator/weather", "operation": "Apply", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:template": {"f:spec": {
                     "f:containers": {"k:{\"name\":\"server\"}": {"f:lifecycle": {"f:preStop": {}}}},
                 }}}}},
                {"manager": "tether-operator/weather", "operation": "Apply", "subresource": "status",
                 "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:terminationGracePeriodSeconds": {}}}}}},
                {"manager": "tether-operator/other", "operation": "Apply", "subresource": "status",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:pods": {}}}},
            ],
        }))
        .unwrap();
        let grace = pod_spec_field("terminationGracePeriodSeconds");
        assert_eq!(managers(&meta, &grace), ["helm"]);
        let server = [
            Step::Field("spec"),
            Step::Field("template"),
            Step::Field("spec"),
            Step::Field("containers"),
            Step::Named("server"),
        ];
        assert_eq!(
            managers(&meta, &server),
            ["helm", "tether-operator/weather"]
        );
        let pre_stop = [
            server.as_slice(),
            &[Step::Field("lifecycle"), Step::Field("preStop")],
        ]
        .concat();
        assert_eq!(managers(&meta, &pre_stop), ["tether-operator/weather"]);
        assert!(managers(&meta, &pod_spec_field("serviceAccountName")).is_empty());
        assert!(managers(&ObjectMeta::default(), &grace).is_empty());
        assert!(applies(&meta, "tether-operator/weather"));
        assert!(!applies(&meta, "helm"), "an Update entry");
        assert!(!applies(&meta, "kubectl"));
        assert!(
            !applies(&meta, "tether-operator/other"),
            "of the status only"
        );
    }
}

//! The config ConfigMap: the endpoint as a manifest (`endpoint.yaml`: `apiVersion`, `kind`,
//! name, namespace and the spec, no status), exactly what the sidecar's `--endpoint` reads
//! ([`tether_crds::load_manifest`]); a spec change updates it and the sidecars reload it without
//! new pods.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use tether_crds::McpEndpoint;

use super::child_meta;
use crate::names::{CONFIG_KEY, Names};

/// The endpoint manifest the sidecars read.
pub fn manifest(ep: &McpEndpoint, names: &Names) -> String {
    let doc = McpEndpoint {
        metadata: ObjectMeta {
            name: Some(names.endpoint.clone()),
            namespace: Some(names.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: ep.spec.clone(),
        status: None,
    };
    yaml_serde::to_string(&doc).expect("an McpEndpoint serializes to YAML")
}

/// The config ConfigMap.
pub(crate) fn config_map(ep: &McpEndpoint, names: &Names, owner: &OwnerReference) -> ConfigMap {
    ConfigMap {
        metadata: child_meta(names, names.config(), owner),
        data: Some([(CONFIG_KEY.to_owned(), manifest(ep, names))].into()),
        ..ConfigMap::default()
    }
}

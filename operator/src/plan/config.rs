//! The config ConfigMap and the HMAC Secret.
//!
//! The ConfigMap holds the endpoint as a manifest (`endpoint.yaml`: `apiVersion`, `kind`, name,
//! namespace and the spec, no status), exactly what the sidecar's `--endpoint` reads
//! ([`tether_crds::load_manifest`]); a spec change updates it and the sidecars reload it without
//! new pods. The Secret holds the key of session-id and peer-message MACs; it is created once and
//! marked immutable, so no reconcile ever rotates it under running sessions.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use tether_crds::McpEndpoint;

use super::child_meta;
use crate::names::{CONFIG_KEY, Names, SECRET_KEY};

/// Bytes of a new HMAC key.
pub(crate) const HMAC_KEY_BYTES: usize = 32;

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

/// The HMAC Secret with `key` (immutable once created), named [`Names::secret`].
pub fn secret(names: &Names, owner: &OwnerReference, key: &[u8]) -> Secret {
    Secret {
        metadata: child_meta(names, names.secret(), owner),
        data: Some([(SECRET_KEY.to_owned(), ByteString(key.to_vec()))].into()),
        immutable: Some(true),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    }
}

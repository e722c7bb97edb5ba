//! The endpoint manifest as the sidecar loads it (`crds/src/manifest.rs`,
//! `sidecar/src/config/mod.rs`).
//!
//! Invariants: an accepted manifest passes `validate_spec`; written back as YAML it loads as the
//! same metadata and spec, and writing that again gives the same text; its pod settings survive
//! the pod annotation (`PodSettings::annotation` → `PodSettings::parse` → `with_pod_settings`)
//! unchanged, and reloading it from itself changes nothing; the sidecar admits a request carrying
//! any `Origin` the manifest allows (and one without `Origin` exactly when it says so), and
//! offers every protocol version it lists.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tether_crds::{API_VERSION, KIND, McpEndpoint, PodSettings, parse_manifest, validate_spec};
use tether_sidecar::fuzzing::endpoint_policy;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(endpoint) = parse_manifest(text) else {
        return;
    };
    let spec = &endpoint.spec;
    assert_eq!(validate_spec(spec), vec![]);

    let written = write(&endpoint);
    let reread = parse_manifest(&written).unwrap_or_else(|e| panic!("{e} reading\n{written}"));
    assert_eq!(
        reread.metadata, endpoint.metadata,
        "written back:\n{written}"
    );
    assert_eq!(&reread.spec, spec, "written back:\n{written}");
    assert_eq!(write(&reread), written);

    let settings = spec.pod_settings();
    let annotation = settings.annotation();
    let parsed = PodSettings::parse(&annotation).expect("the annotation parses");
    assert_eq!(parsed, settings, "{annotation}");
    assert_eq!(&spec.with_pod_settings(&parsed), spec);
    assert_eq!(&spec.with_reloaded_from(spec), spec);

    let policy = endpoint_policy(spec);
    for (origin, admitted) in &policy.origins {
        assert_eq!(*admitted, Some(true), "allowed origin {origin:?}");
    }
    assert_eq!(policy.missing_origin_admitted, spec.origins.allow_missing);
    assert_eq!(policy.versions, spec.protocol_versions);
});

/// The manifest as YAML, in the shape it was read in.
fn write(endpoint: &McpEndpoint) -> String {
    let doc = serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": endpoint.metadata,
        "spec": endpoint.spec,
    });
    yaml_serde::to_string(&doc).expect("a manifest writes as YAML")
}

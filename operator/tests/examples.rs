//! The manifests of `examples/k8s/` are what the docs say: each McpEndpoint passes the sidecar's
//! loader and the CRD's CEL rules, and the operator accepts the example Deployment as its target.

use std::path::Path;

use k8s_openapi::api::apps::v1::Deployment;
use tether_operator::names::Names;
use tether_operator::validate::validate;

fn read(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/k8s")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_example_endpoint_is_valid_and_targets_the_example_deployment() {
    let deployment: Deployment =
        yaml_serde::from_str(&read("deployment.yaml")).expect("a Deployment");
    for file in ["mcpendpoint-minimal.yaml", "mcpendpoint-full.yaml"] {
        let mut ep = tether_crds::parse_manifest(&read(file))
            .unwrap_or_else(|e| panic!("{file}: the sidecar refuses it: {e}"));
        if let Err(errors) = kube::core::cel::validate_cel(&ep) {
            panic!("{file}: the CRD's CEL rules refuse it: {errors:?}");
        }
        // What the API server adds on create.
        ep.metadata.namespace = Some("tools".into());
        ep.metadata.uid = Some("6f1c2a9e-0000-4000-8000-000000000001".into());
        let names = Names::of(&ep).expect("named");
        let target = validate(&ep, &names, &deployment)
            .unwrap_or_else(|c| panic!("{file}: the operator refuses the example Deployment: {c}"));
        assert_eq!(target.upstream_container, "server", "{file}");
        assert_eq!(target.selector, "app=weather", "{file}");
    }
}

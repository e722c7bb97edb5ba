//! The manifests of `examples/k8s/` are what the docs say: each McpEndpoint passes the sidecar's
//! loader and the CRD's CEL rules, the operator accepts the example Deployment as its target (its
//! container meets the `restricted` Pod Security Standard on its own), and `tether-operator plan`
//! previews the injection for each (the binary, with its exit statuses).

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use tether_operator::names::Names;
use tether_operator::validate::validate;

use crate::support::cluster::restricted_violations;

/// The path of `name` in `examples/k8s/`.
fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/k8s")
        .join(name)
}

fn read(name: &str) -> String {
    let path = example(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `McpEndpoint` manifest of `examples/k8s/`.
fn example_endpoints() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(example(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.starts_with("mcpendpoint-") && f.ends_with(".yaml"))
        .collect();
    files.sort();
    files
}

/// Runs `tether-operator plan` with `args`; returns its exit status, stdout and stderr.
fn plan(args: &[&std::ffi::OsStr]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tether-operator"))
        .arg("plan")
        .args(args)
        .env_remove("TETHER_SIDECAR_IMAGE")
        .env_remove("TETHER_SIDECAR_RESOURCES")
        .output()
        .expect("tether-operator runs");
    let text = |b: Vec<u8>| String::from_utf8(b).expect("UTF-8");
    (out.status.code(), text(out.stdout), text(out.stderr))
}

#[test]
fn every_example_endpoint_is_valid_and_targets_the_example_deployment() {
    let deployment: Deployment =
        yaml_serde::from_str(&read("deployment.yaml")).expect("a Deployment");
    let files = example_endpoints();
    assert_eq!(files.len(), 2, "{files:?}");
    for file in &files {
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
    }
}

#[test]
fn the_example_deployment_meets_the_restricted_pod_security_standard() {
    let deployment: serde_json::Value =
        yaml_serde::from_str(&read("deployment.yaml")).expect("a Deployment");
    let pod_spec = &deployment["spec"]["template"]["spec"];
    let violations = restricted_violations(pod_spec);
    assert!(violations.is_empty(), "{violations:?}");
    // The check itself: the container without its seccomp profile fails it.
    let mut without = pod_spec.clone();
    without["containers"][0]["securityContext"]
        .as_object_mut()
        .unwrap()
        .remove("seccompProfile");
    assert!(!restricted_violations(&without).is_empty());
}

#[test]
fn plan_previews_the_injection_of_every_example_and_says_why_it_would_not() {
    let deployment = example("deployment.yaml");
    for file in example_endpoints() {
        let endpoint = example(&file);
        let (status, stdout, stderr) = plan(&[
            "--endpoint".as_ref(),
            endpoint.as_os_str(),
            "--deployment".as_ref(),
            deployment.as_os_str(),
        ]);
        assert_eq!(status, Some(0), "{file}: {stderr}");
        assert!(
            stderr.contains("00000000-0000-0000-0000-000000000000"),
            "{file}: {stderr}"
        );
        let documents: Vec<serde_json::Value> = yaml_serde::Deserializer::from_str(&stdout)
            .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
            .collect();
        let injection = documents
            .iter()
            .find(|d| d["kind"] == "Deployment")
            .unwrap_or_else(|| panic!("{file}: no Deployment apply in\n{stdout}"));
        let sidecar = &injection["spec"]["template"]["spec"]["initContainers"][0];
        assert_eq!(sidecar["name"], "tether-sidecar", "{file}");
        assert_eq!(sidecar["restartPolicy"], "Always", "{file}");
        assert_eq!(documents.len(), 9, "{file}: every child and the injection");
    }

    // The example Deployment taking the sidecar's port: Degraded, exit status 2.
    let dir = tempfile::tempdir().unwrap();
    let clash = dir.path().join("deployment.yaml");
    let taken = read("deployment.yaml").replace("containerPort: 3000", "containerPort: 8080");
    std::fs::write(&clash, taken).unwrap();
    let minimal = example("mcpendpoint-minimal.yaml");
    let endpoint = [
        "--endpoint".as_ref(),
        minimal.as_os_str(),
        "--deployment".as_ref(),
    ];
    let (status, stdout, stderr) = plan(&[&endpoint[..], &[clash.as_os_str()]].concat());
    assert_eq!((status, stdout.as_str()), (Some(2), ""), "{stderr}");
    assert!(stderr.contains("Degraded: PortConflict: "), "{stderr}");
    // A file that is not there: exit status 1, naming it.
    let missing = dir.path().join("missing.yaml");
    let (status, _, stderr) = plan(&[&endpoint[..], &[missing.as_os_str()]].concat());
    assert_eq!(status, Some(1), "{stderr}");
    assert!(stderr.contains(&*missing.to_string_lossy()), "{stderr}");
}

//! The operator as a user installs it: `helm lint --strict`, then `helm upgrade --install` of
//! `charts/tether`, with the test's images, 2 replicas and leader election, waiting until the
//! release is ready. Once per test process; the release stays installed afterwards
//! (`docs/dev/e2e.md`). [`upgrade`] changes its values for a scenario and back.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;

use crate::Settings;
use crate::cluster::{Cluster, Outcome};

/// The Helm release (its objects are named after it: Deployment, Lease holder's pods).
pub(crate) const RELEASE: &str = "tether-e2e";
/// Its namespace.
pub(crate) const RELEASE_NAMESPACE: &str = "tether-e2e-system";
/// The leader-election Lease (the chart's `leaderElection.leaseName`).
pub(crate) const LEASE: &str = "tether-operator";
/// Operator replicas (the chart's `replicaCount`).
pub(crate) const REPLICAS: usize = 2;

/// Installs (or upgrades) the release once per process; later calls return the first result.
///
/// # Errors
/// What `helm` printed when it failed, or why an image is not `repository:tag`.
pub(crate) fn operator(settings: &Settings) -> Result<(), String> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            helm(settings, &["lint".to_owned(), "--strict".to_owned()], &[])?;
            upgrade(settings, &[])
        })
        .clone()
}

/// `helm upgrade --install` of the release with the test's values, then `extra` (`key=value`,
/// as `--set` takes them), waiting until it is ready; with no `extra`, the release as
/// [`operator`] installs it.
///
/// # Errors
/// What `helm` printed when it failed, or why an image is not `repository:tag`.
pub(crate) fn upgrade(settings: &Settings, extra: &[&str]) -> Result<(), String> {
    let (repository, tag) = split_image(&settings.operator_image)?;
    let (sidecar_repository, sidecar_tag) = split_image(&settings.sidecar_image)?;
    let mut values = vec![
        format!("image.repository={repository}"),
        format!("image.tag={tag}"),
        format!("sidecar.image.repository={sidecar_repository}"),
        format!("sidecar.image.tag={sidecar_tag}"),
        format!("replicaCount={REPLICAS}"),
        "leaderElection.enabled=true".to_owned(),
        format!("leaderElection.leaseName={LEASE}"),
        "logging.format=text".to_owned(),
    ];
    values.extend(extra.iter().map(|v| (*v).to_owned()));
    let args = [
        "upgrade",
        "--install",
        RELEASE,
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        &format!("{}s", settings.timeout.as_secs()),
    ]
    .map(str::to_owned);
    helm(settings, &args, &values)
}

/// Runs `helm <args> charts/tether --set <value>…` against the settings' cluster.
fn helm(settings: &Settings, args: &[String], values: &[String]) -> Result<(), String> {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/tether");
    let mut helm = Command::new("helm");
    helm.args(args)
        .arg(&chart)
        .arg("--kubeconfig")
        .arg(&settings.kubeconfig);
    for value in values {
        helm.args(["--set", value]);
    }
    eprintln!(
        "e2e: helm {} charts/tether --set {}",
        args.join(" "),
        values.join(",")
    );
    let out = helm
        .output()
        .map_err(|e| format!("cannot run helm (is it installed?): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "helm {} exited with {}: {}{}",
            args[0],
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// The user the operator's requests are made as: its pods' ServiceAccount, as the audit log
/// names it (`system:serviceaccount:<namespace>:<name>`).
pub(crate) async fn operator_user(cluster: &Cluster) -> Outcome<String> {
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), RELEASE_NAMESPACE);
    let account = deployments
        .get(RELEASE)
        .await?
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.service_account_name)
        .ok_or("the operator's Deployment names no ServiceAccount")?;
    Ok(format!(
        "system:serviceaccount:{RELEASE_NAMESPACE}:{account}"
    ))
}

/// `repository:tag` split at the tag's colon (a registry's port is part of the repository).
fn split_image(image: &str) -> Result<(&str, &str), String> {
    image
        .rsplit_once(':')
        .filter(|(_, tag)| !tag.contains('/') && !tag.is_empty())
        .ok_or_else(|| format!("image {image:?} is not repository:tag"))
}

#[test]
fn images_split_at_the_tag() {
    assert_eq!(
        split_image("tether-sidecar:e2e"),
        Ok(("tether-sidecar", "e2e"))
    );
    assert_eq!(
        split_image("localhost:5000/tether/tether-operator:0.1.0"),
        Ok(("localhost:5000/tether/tether-operator", "0.1.0"))
    );
    assert!(split_image("localhost:5000/tether-operator").is_err());
    assert!(split_image("tether-operator").is_err());
}

//! What the operator writes next to others' writes: a GitOps tool applying the user's manifest
//! with server-side apply, a spec the API server stores in another form (quantities), a second
//! endpoint on the same Deployment, and an endpoint deleted and re-created under its name.

use std::process::Command;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use serde_json::json;
use tether_operator::names::INJECTED_ANNOTATION;

use crate::cluster::{A_RECONCILE, Cluster, EXAMPLE_PODS, Outcome, sidecar};
use crate::traffic::roll_under_load;

/// `Degraded` reasons of a second endpoint on an injected Deployment: the Deployment opted in
/// to the first only (`TargetNotOptedIn`); in a namespace that opts every Deployment in, the
/// sidecar is the other's (`ContainerNameClash`), or its apply would take the other's fields
/// (`FieldConflict`).
const SECOND_ENDPOINT: &[&str] = &["TargetNotOptedIn", "ContainerNameClash", "FieldConflict"];

/// What a rollout or a re-apply would change in a Deployment.
#[derive(Debug, PartialEq)]
struct Template {
    /// `metadata.generation`: a new pod template is a new one.
    generation: Option<i64>,
    /// The pod template's `terminationGracePeriodSeconds`.
    grace: Option<i64>,
    /// ReplicaSets of its pods: a rollout adds one.
    replica_sets: usize,
    /// The endpoint whose sidecar is injected, if one is.
    injected_by: Option<String>,
}

impl Cluster {
    /// The [`Template`] of Deployment `name` (the example's pods).
    async fn template(&self, ns: &str, name: &str) -> Outcome<Template> {
        let d = self.deployments(ns).get(name).await?;
        let sets: Api<ReplicaSet> = Api::namespaced(self.client.clone(), ns);
        let template = d.spec.as_ref().map(|s| &s.template);
        Ok(Template {
            generation: d.metadata.generation,
            grace: template
                .and_then(|t| t.spec.as_ref())
                .and_then(|s| s.termination_grace_period_seconds),
            replica_sets: sets
                .list(&ListParams::default().labels(EXAMPLE_PODS))
                .await?
                .items
                .len(),
            injected_by: template
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.annotations.as_ref())
                .and_then(|a| a.get(INJECTED_ANNOTATION).cloned())
                .filter(|_| sidecar(&d).is_some()),
        })
    }

    /// Fails unless Deployment `name`'s [`Template`] is still `before`, `after` saying when.
    async fn template_kept(&self, ns: &str, name: &str, before: &Template, after: &str) -> Outcome {
        let now = self.template(ns, name).await?;
        if now != *before {
            return Err(format!("after {after}: {now:?}, before {before:?}").into());
        }
        Ok(())
    }
}

/// `kubectl apply --server-side --field-manager=gitops` of `manifest`, as a GitOps tool applies
/// the user's Deployment; fails with kubectl's message (a conflict, say).
fn gitops_apply(cluster: &Cluster, manifest: &serde_json::Value) -> Outcome {
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), serde_json::to_vec(manifest)?)?;
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&cluster.settings.kubeconfig)
        .args(["apply", "--server-side", "--field-manager=gitops", "-f"])
        .arg(file.path())
        .output()
        .map_err(|e| format!("cannot run kubectl: {e}"))?;
    if !out.status.success() {
        return Err(format!("kubectl apply: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gitops_tools_server_side_applies_neither_conflict_nor_roll_the_pods() {
    crate::scenario(&[], async |cluster, ns| {
        // The GitOps tool owns the Deployment from the start.
        let manifest = cluster.example_deployment(ns, |_| {})?;
        gitops_apply(cluster, &manifest)?;
        cluster.ready_endpoint(ns, "weather", json!({})).await?;
        let before = cluster.template(ns, "weather").await?;
        for round in 1..=2 {
            gitops_apply(cluster, &manifest).map_err(|e| format!("apply {round}: {e}"))?;
            tokio::time::sleep(A_RECONCILE).await;
            let after = format!("apply {round}");
            cluster
                .template_kept(ns, "weather", &before, &after)
                .await?;
        }
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_canonical_sidecar_quantity_turns_ready_and_stays_quiet() {
    crate::scenario(&[], async |cluster, ns| {
        // The endpoint keeps the limits as written; the Deployment holds them as 500m and 1Gi.
        // (Small requests: the pods must fit on a kind node.)
        let resources = json!({
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "0.5", "memory": "1024Mi"},
        });
        let spec = json!({"sidecar": {"resources": resources}});
        cluster.serve(ns, "weather", spec).await?;
        let applied = cluster.events(ns, "weather", "Applied").await?;
        let before = cluster.template(ns, "weather").await?;
        tokio::time::sleep(2 * A_RECONCILE).await;
        let again = cluster.events(ns, "weather", "Applied").await? - applied;
        if again > 0 {
            return Err(format!("{again} more Applied Events over two rechecks").into());
        }
        cluster
            .template_kept(ns, "weather", &before, "two rechecks")
            .await?;
        cluster.ensure_ready(ns, "weather").await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_endpoint_on_the_deployment_is_degraded_and_its_deletion_keeps_the_first() {
    crate::scenario(&[], async |cluster, ns| {
        cluster.serve(ns, "first", json!({})).await?;
        let before = cluster.template(ns, "weather").await?;
        cluster.endpoint(ns, "second", json!({})).await?;
        let reason = cluster.wait_degraded(ns, "second").await?;
        if !SECOND_ENDPOINT.contains(&reason.as_str()) {
            return Err(format!("the second endpoint is Degraded with {reason}").into());
        }
        cluster.delete_endpoint(ns, "second").await?;
        // Its cleanup must not have removed the first's injection, now or after a recheck.
        for (after, wait) in [("the second's deletion", false), ("a recheck", true)] {
            if wait {
                tokio::time::sleep(A_RECONCILE).await;
            }
            cluster.template_kept(ns, "weather", &before, after).await?;
        }
        cluster.ensure_ready(ns, "first").await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_deleted_and_re_created_keeps_one_key_across_its_pods() {
    crate::scenario(&[], async |cluster, ns| {
        let target = cluster.serve(ns, "weather", json!({})).await?;
        cluster.delete_endpoint(ns, "weather").await?;
        // The finalizer ran: the injection is gone.
        if cluster.template(ns, &target).await?.injected_by.is_some() {
            return Err("the sidecar is still injected after the endpoint's deletion".into());
        }
        cluster.ready_endpoint(ns, "weather", json!({})).await?;
        // Let the garbage collector delete what the first endpoint owned, and a recheck repair
        // what that breaks.
        tokio::time::sleep(A_RECONCILE).await;
        cluster.wait_ready(ns, "weather").await?;
        let uid = cluster.endpoints(ns).get("weather").await?.metadata.uid;
        let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), ns);
        for pod in cluster.pods(ns, EXAMPLE_PODS).await? {
            let volume = pod
                .spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .find_map(|v| v.secret.as_ref()?.secret_name.clone())
                .ok_or("a pod without the Secret volume")?;
            let secret = secrets.get(&volume).await?;
            let owner = secret.metadata.owner_references.iter().flatten().next();
            if owner.map(|o| Some(&o.uid)) != Some(uid.as_ref()) {
                return Err(format!("Secret {volume} is not the re-created endpoint's").into());
            }
            // The kubelet read the key when the pod started: a Secret made later holds another
            // one.
            if pod.metadata.creation_timestamp < secret.metadata.creation_timestamp {
                return Err(format!(
                    "pod {:?} started before Secret {volume} was created",
                    pod.metadata.name
                )
                .into());
            }
        }
        let report = roll_under_load(cluster, ns, "weather", &target).await?;
        if report.not_found > 0 {
            return Err(format!(
                "{} sessions lost (404) after the re-create",
                report.not_found
            )
            .into());
        }
        Ok(())
    })
    .await;
}

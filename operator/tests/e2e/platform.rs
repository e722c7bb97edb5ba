//! The platform around the operator: its two replicas elect one leader (the chart's
//! `replicaCount: 2` with leader election), the example Deployment with the pods' injected
//! sidecars passes the `restricted` Pod Security Standard, and `kubectl explain` shows the CRD's
//! descriptions as whole paragraphs.

use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, LogParams};
use serde_json::{Value, json};
use tether_crds::API_GROUP;

use crate::cluster::{Cluster, Outcome, wait_until};
use crate::install::{LEASE, RELEASE, RELEASE_NAMESPACE, REPLICAS};

/// What the holder of the Lease logs once it holds it (`tether_operator::leader::lead`).
const LEADING: &str = "holding the lease; reconciling";
/// What a replica logs while it waits for the Lease.
const WAITING: &str = "waiting for the lease";
/// How long a standby replica may take to go once deleted: far less than the grace period
/// (30 s), which a process that ignored SIGTERM would wait out.
const STANDBY_STOP: std::time::Duration = std::time::Duration::from_secs(10);

impl Cluster {
    /// The operator's running pods and the Lease's holder, once the holder is one of them.
    async fn leader(&self) -> Outcome<(Vec<String>, String)> {
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), RELEASE_NAMESPACE);
        let spec = deployments.get(RELEASE).await?.spec.unwrap_or_default();
        let labels = spec.selector.match_labels.unwrap_or_default();
        let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let selector = selector.join(",");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), RELEASE_NAMESPACE);
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), RELEASE_NAMESPACE);
        wait_until(
            "one operator pod holding the Lease",
            self.settings.timeout,
            async || {
                let listed = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(|e| e.to_string())?;
                let running: Vec<String> = listed
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .filter_map(|p| p.metadata.name.clone())
                    .collect();
                let lease = leases.get(LEASE).await.map_err(|e| e.to_string())?;
                let holder = lease
                    .spec
                    .and_then(|s| s.holder_identity)
                    .unwrap_or_default();
                if running.len() == REPLICAS && running.contains(&holder) {
                    Ok((running, holder))
                } else {
                    Err(format!("pods {running:?}, holder {holder:?}"))
                }
            },
        )
        .await
    }

    /// Whether operator pod `name` logged that it holds the Lease.
    async fn logs_leading(&self, name: &str) -> Outcome<bool> {
        Ok(self.operator_log(name).await?.contains(LEADING))
    }

    /// The log of operator pod `name`.
    async fn operator_log(&self, name: &str) -> Result<String, kube::Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), RELEASE_NAMESPACE);
        pods.logs(name, &LogParams::default()).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operator_replicas_elect_one_leader_and_the_other_takes_over() {
    crate::scenario(&[], async |cluster, _| {
        let (pods, leader) = cluster.leader().await?;
        for pod in &pods {
            if cluster.logs_leading(pod).await? != (*pod == leader) {
                return Err(
                    format!("pod {pod} (leader {leader}) says otherwise in its logs").into(),
                );
            }
        }
        let pods_api: Api<Pod> = Api::namespaced(cluster.client.clone(), RELEASE_NAMESPACE);
        pods_api.delete(&leader, &DeleteParams::default()).await?;
        let (_, next) = cluster.leader().await?;
        if next == leader || !cluster.logs_leading(&next).await? {
            return Err(format!("after deleting {leader}, the Lease names {next}").into());
        }
        // The standby, waiting for the Lease, stops at once when deleted.
        let (pods, _) = cluster.leader().await?;
        let standby = pods
            .into_iter()
            .find(|p| *p != next)
            .ok_or("no standby replica")?;
        wait_until(
            &format!("{standby} waiting for the Lease"),
            cluster.settings.timeout,
            async || match cluster.operator_log(&standby).await {
                Ok(log) if log.contains(WAITING) => Ok(()),
                Ok(_) => Err("not yet".to_owned()),
                Err(e) => Err(e.to_string()),
            },
        )
        .await?;
        let started = std::time::Instant::now();
        pods_api.delete(&standby, &DeleteParams::default()).await?;
        wait_until(
            &format!("{standby} gone"),
            STANDBY_STOP,
            async || match pods_api.get_opt(&standby).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_owned()),
                Err(e) => Err(e.to_string()),
            },
        )
        .await?;
        eprintln!(
            "e2e: {leader} led, then {next}; standby {standby} went in {:?}",
            started.elapsed()
        );
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restricted_namespace_admits_the_injected_pods() {
    let restricted = [("pod-security.kubernetes.io/enforce", "restricted")];
    crate::scenario(&restricted, async |cluster, ns| {
        // The example's container meets the standard as it is; the sidecar must too.
        cluster.deploy(ns, |_| {}).await?;
        cluster.ready_endpoint(ns, "weather", json!({})).await
    })
    .await;
}

/// The descriptions of the OpenAPI schema `schema` and of every schema below it, with their
/// paths.
fn descriptions(path: &str, schema: &Value, out: &mut Vec<(String, String)>) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("description", Value::String(text)) => {
                        out.push((path.to_owned(), text.clone()))
                    }
                    _ => descriptions(&format!("{path}.{key}"), value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| descriptions(path, v, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explains_the_crd_in_whole_paragraphs() {
    crate::scenario(&[], async |cluster, _| {
        // What `kubectl explain` reads: the API server's OpenAPI v3 document of the group.
        let request =
            http::Request::get(format!("/openapi/v3/apis/{API_GROUP}/v1alpha1")).body(Vec::new())?;
        let document: Value = serde_json::from_str(&cluster.client.request_text(request).await?)?;
        let schemas = &document["components"]["schemas"];
        let (name, schema) = schemas
            .as_object()
            .and_then(|s| s.iter().find(|(name, _)| name.ends_with(".McpEndpoint")))
            .ok_or("no McpEndpoint schema in the OpenAPI document")?;
        let mut found = Vec::new();
        for part in ["spec", "status"] {
            descriptions(part, &schema["properties"][part], &mut found);
        }
        // A line break inside a paragraph is where kubectl would break a sentence.
        let ragged: Vec<_> = found
            .iter()
            .filter(|(_, text)| text.split("\n\n").any(|p| p.contains('\n')))
            .collect();
        if found.len() < 20 || !ragged.is_empty() {
            return Err(format!(
                "{name}: {} descriptions, broken mid-paragraph: {ragged:?}",
                found.len()
            )
            .into());
        }
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&cluster.settings.kubeconfig)
            .args(["explain", "mcpendpoints.spec.auth.binding"])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let flowing = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if !out.status.success() || !flowing.contains("What a session is bound to, fixed at its") {
            return Err(format!(
                "kubectl explain: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        Ok(())
    })
    .await;
}

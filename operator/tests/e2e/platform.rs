//! The platform around the operator: its two replicas elect one leader (the chart's
//! `replicaCount: 2` with leader election), and the pods it injects pass the `restricted` Pod
//! Security Standard.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, LogParams};
use serde_json::json;

use crate::cluster::{Cluster, Outcome, wait_until};
use crate::install::{LEASE, RELEASE, RELEASE_NAMESPACE, REPLICAS};

/// What the holder of the Lease logs once it holds it (`tether_operator::leader::lead`).
const LEADING: &str = "holding the lease; reconciling";

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
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), RELEASE_NAMESPACE);
        Ok(pods
            .logs(name, &LogParams::default())
            .await?
            .contains(LEADING))
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
        eprintln!("e2e: {leader} led, then {next}");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restricted_namespace_admits_the_injected_pods() {
    let restricted = [("pod-security.kubernetes.io/enforce", "restricted")];
    crate::scenario(&restricted, async |cluster, ns| {
        // The user's container meets the standard on its own; the sidecar must too.
        cluster
            .deploy(ns, |d| {
                d["spec"]["template"]["spec"]["containers"][0]["securityContext"]
                    ["seccompProfile"] = json!({"type": "RuntimeDefault"});
            })
            .await?;
        cluster.ready_endpoint(ns, "weather", json!({})).await
    })
    .await;
}

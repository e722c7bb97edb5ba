//! The chart in its other shape and over its own upgrade: an install that watches named
//! namespaces only (`watchNamespaces`, Roles instead of the ClusterRole), and `helm upgrade` of
//! the operator while MCP clients keep calling through an endpoint it serves. Each changes the
//! installation the other tests use, so each runs alone ([`crate::exclusive_scenario`]) and puts
//! the installation back as [`install::operator`] made it, whatever happened.

use std::time::Instant;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use serde_json::json;
use tether_operator::admission::OPT_IN_LABEL;

use crate::cluster::{A_RECONCILE, Cluster, Outcome};
use crate::install::{self, RELEASE, RELEASE_NAMESPACE};
use crate::traffic::{ServerLogs, clean, load_through};

/// Runs `body` with the release upgraded to the test's values and `extra`, then upgrades it
/// back to the test's values alone, whatever the upgrade or `body` did; their failure comes
/// first.
async fn with_values(
    cluster: &Cluster,
    extra: &[&str],
    body: impl AsyncFnOnce() -> Outcome,
) -> Outcome {
    // helm runs for a while: its thread is given up meanwhile, so the load goes on.
    let upgrade =
        |extra: &[&str]| tokio::task::block_in_place(|| install::upgrade(&cluster.settings, extra));
    // A failed upgrade (a timeout of `--wait`, say) may have changed the release: it is put
    // back all the same.
    let outcome = match upgrade(extra) {
        Ok(()) => body().await,
        Err(e) => Err(e.into()),
    };
    let restored = upgrade(&[]);
    outcome?;
    Ok(restored?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_install_reconciles_its_namespaces_only() {
    crate::exclusive_scenario(async |cluster, ns| {
        // Another namespace, which the namespaced install does not watch.
        let other = format!("{ns}-other");
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(other.clone()),
                labels: Some(
                    [(
                        "app.kubernetes.io/created-by".to_owned(),
                        "tether-e2e".to_owned(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(cluster.client.clone())
            .create(&PostParams::default(), &namespace)
            .await?;
        let watched = format!("watchNamespaces={{{ns}}}");
        let outcome = with_values(cluster, &[&watched], async || {
            cluster.serve(ns, "weather", json!({})).await?;
            cluster
                .deploy(&other, |d| {
                    d["metadata"]["labels"][OPT_IN_LABEL] = json!("weather")
                })
                .await?;
            cluster.endpoint(&other, "weather", json!({})).await?;
            tokio::time::sleep(A_RECONCILE).await;
            let untouched = cluster.endpoints(&other).get("weather").await?;
            if untouched.status.is_some() || untouched.metadata.finalizers.is_some() {
                return Err(format!(
                    "the endpoint in unwatched namespace {other} was reconciled: {:?}",
                    untouched.status
                )
                .into());
            }
            Ok(())
        })
        .await;
        // Back to the cluster-wide install: it takes the other namespace's endpoint up.
        let taken_up = match outcome {
            Ok(()) => cluster.wait_ready(&other, "weather").await,
            Err(e) => Err(e),
        };
        let deleted = cluster.delete_namespace(&other).await;
        taken_up?;
        deleted
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chart_upgrade_under_load_keeps_the_sessions_and_the_servers() {
    crate::exclusive_scenario(async |cluster, ns| {
        let target = cluster.serve(ns, "weather", json!({})).await?;
        let generation = cluster.generation(ns, &target).await?;
        let logs = ServerLogs::follow(&cluster.client, ns);
        let load = load_through(cluster, ns, "weather").await?;
        let started = Instant::now();
        // A new operator pod template (its log format): the operator rolls, the servers must not.
        with_values(cluster, &["logging.format=json"], async || {
            let upgraded = started.elapsed();
            let operator = cluster.generation(RELEASE_NAMESPACE, RELEASE).await?;
            eprintln!(
                "e2e: the operator's upgrade rolled out in {upgraded:?} (generation {operator:?})"
            );
            tokio::time::sleep(A_RECONCILE).await;
            cluster.ensure_ready(ns, "weather").await
        })
        .await?;
        let mut report = load.finish().await?;
        logs.count_executions(&mut report, cluster.settings.timeout)
            .await;
        clean(&report, "the chart's upgrade")?;
        let now = cluster.generation(ns, &target).await?;
        if now != generation {
            return Err(format!(
                "the chart's upgrade rolled the servers: generation {generation:?} → {now:?}"
            )
            .into());
        }
        Ok(())
    })
    .await;
}

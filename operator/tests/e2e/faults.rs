//! A pod lost without warning while sessions call through the client Service
//! (`docs/design/replication.md`), with the endpoint's default `spec.session.replication`
//! (`Sessions`):
//!
//! - `kubectl delete pod --force --grace-period=0` of one of the MCP server's pods: the API
//!   server forgets it at once, the kubelet stops its containers, the Deployment starts a
//!   replacement;
//! - its sidecar container killed (SIGKILL, what an OOM kill does): the kubelet starts it again
//!   in the same pod, with an empty memory.
//!
//! Either way no client sees a 404, no event is lost without the sidecar saying so, and no tool
//! runs twice; calls that were running on the lost sidecar end with an explicit error. The
//! clients send a request again after its connection failed before any answer
//! ([`McpClient::reconnecting`]): a connection that went to the lost sidecar fails, and the
//! kube-proxy may send the next one there too until the pod's readiness probe fails. The
//! force-deleted pod's kubelet still sends SIGTERM, so its sidecar begins to hand its sessions
//! off before it is killed; the killed sidecar has no warning at all.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use tether_operator::names::SIDECAR_CONTAINER;
use tether_tests::client::McpClient;
use tether_tests::load;

use crate::cluster::{Cluster, EXAMPLE_PODS, Outcome, wait_until};
use crate::traffic::{ServerLogs, load_of};

/// How long the load goes on once the pods are whole again: sessions of the lost pod call
/// where they were moved.
const AFTER: Duration = Duration::from_secs(5);

/// The explicit errors of calls that were running on a lost sidecar: `handoff_interrupted` when
/// it still began to hand its sessions off (the kubelet's SIGTERM before the kill), else
/// `holder_lost`.
const ANNOUNCED: [&str; 2] = ["handoff_interrupted", "holder_lost"];

/// Fails unless `report` shows what replication promises: no client-visible 404 (no session
/// lost), no event lost silently, duplicated or of another stream, no tool executed twice, and
/// no client error but the explicit errors ([`ANNOUNCED`]) of calls that were running on the
/// lost sidecar — of which there was one at least (the lost sidecar mattered). `reconnected`:
/// the requests the clients sent again after a failed connection.
fn survived(report: &load::Report, reconnected: u64, after: &str) -> Outcome {
    eprintln!(
        "e2e: {after} under load:\n{}\nannounced: {:?}; requests sent again after a failed \
         connection: {reconnected}\nclient errors: {:?}",
        report.table(),
        report.announced,
        report.failures
    );
    let announced: u64 = report.announced.values().sum();
    let clean = report.sessions > 0
        && announced > 0
        && report
            .announced
            .keys()
            .all(|r| ANNOUNCED.contains(&r.as_str()))
        && report.failures.len() as u64 == announced
        && report.not_found == 0
        && report.lost_silently() == 0
        && report.duplicated == 0
        && report.foreign == 0
        && report.executed_twice == 0;
    if !clean {
        return Err(format!(
            "after {after}: sessions lost, events lost silently, tools run twice, client errors, \
             or no call of the lost sidecar announced"
        )
        .into());
    }
    Ok(())
}

/// The load of [`crate::traffic::load_through`] with clients that reconnect after a failed
/// connection ([`McpClient::reconnecting`]), and one of those clients (its count is theirs).
async fn reconnecting_load(
    cluster: &Cluster,
    ns: &str,
) -> Outcome<(crate::traffic::Load, McpClient)> {
    let mut kept = None;
    let load = load_of(cluster, ns, "weather", |client| {
        let client = client.reconnecting();
        kept = Some(client.clone());
        client
    })
    .await?;
    Ok((load, kept.ok_or("the load made no client")?))
}

/// Lets the load of `load` (and its client) go on for [`AFTER`], ends it and judges what its
/// clients saw ([`survived`]), the servers' executions counted from `logs`.
async fn judge(
    cluster: &Cluster,
    (load, client): (crate::traffic::Load, McpClient),
    logs: &ServerLogs,
    after: &str,
) -> Outcome {
    tokio::time::sleep(AFTER).await;
    let mut report = load.finish().await?;
    logs.count_executions(&mut report, cluster.settings.timeout)
        .await;
    survived(&report, client.reconnected(), after)
}

/// The first running example pod of `ns`: its name and UID.
async fn victim(cluster: &Cluster, ns: &str) -> Outcome<(String, String)> {
    let pod = cluster
        .pods(ns, EXAMPLE_PODS)
        .await?
        .into_iter()
        .next()
        .ok_or("no example pod runs")?;
    let name = pod.metadata.name.ok_or("a pod without a name")?;
    let uid = pod.metadata.uid.ok_or("a pod without a UID")?;
    Ok((name, uid))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_force_deleted_under_load_shows_clients_no_404() {
    crate::scenario(&[], async |cluster, ns| {
        let target = cluster.serve(ns, "weather", serde_json::json!({})).await?;
        let logs = ServerLogs::follow(&cluster.client, ns);
        let (load, client) = reconnecting_load(cluster, ns).await?;
        let (name, _) = victim(cluster, ns).await?;
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
        let force = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        pods.delete(&name, &force).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        cluster.wait_rolled(ns, &target).await?;
        let after = format!("kubectl delete pod {name} --force --grace-period=0");
        judge(cluster, (load, client), &logs, &after).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_under_load_shows_clients_no_404() {
    crate::scenario(&[], async |cluster, ns| {
        cluster.serve(ns, "weather", serde_json::json!({})).await?;
        let logs = ServerLogs::follow(&cluster.client, ns);
        let (load, client) = reconnecting_load(cluster, ns).await?;
        let (name, uid) = victim(cluster, ns).await?;
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
        let before = sidecar_restarts(&pods, &name).await?;
        let pid = sidecar_process(&uid)?;
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()?;
        if !killed.success() {
            return Err(format!("kill -KILL {pid}: {killed}").into());
        }
        wait_until(
            &format!("the kubelet to restart pod {name}'s sidecar"),
            cluster.settings.timeout,
            async || match sidecar_restarts(&pods, &name).await {
                Ok(n) if n > before && sidecar_ready(&pods, &name).await => Ok(()),
                Ok(n) => Err(format!("{n} restarts")),
                Err(e) => Err(e.to_string()),
            },
        )
        .await?;
        let after = format!("kill -KILL of pod {name}'s sidecar");
        judge(cluster, (load, client), &logs, &after).await
    })
    .await;
}

/// The restarts of pod `name`'s sidecar container.
async fn sidecar_restarts(pods: &Api<Pod>, name: &str) -> Outcome<i32> {
    let pod = pods.get(name).await?;
    Ok(sidecar_status(&pod).map_or(0, |s| s.restart_count))
}

/// Whether pod `name`'s sidecar container is ready.
async fn sidecar_ready(pods: &Api<Pod>, name: &str) -> bool {
    pods.get(name)
        .await
        .ok()
        .and_then(|pod| sidecar_status(&pod).map(|s| s.ready))
        .unwrap_or(false)
}

fn sidecar_status(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status
        .as_ref()?
        .init_container_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == SIDECAR_CONTAINER)
}

/// The process ID of the sidecar of the pod with UID `uid` on this machine: the process named
/// `tether-sidecar` whose cgroup names the pod (`pod<uid>`, with `_` for `-` under systemd).
/// The test must run on the node, as the local cluster's tests do.
fn sidecar_process(uid: &str) -> Outcome<u32> {
    let systemd = uid.replace('-', "_");
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let read =
            |file: &str| std::fs::read_to_string(entry.path().join(file)).unwrap_or_default();
        if read("comm").trim() != "tether-sidecar" {
            continue;
        }
        let cgroup = read("cgroup");
        if cgroup.contains(&format!("pod{uid}")) || cgroup.contains(&format!("pod{systemd}")) {
            return Ok(pid);
        }
    }
    Err(format!(
        "no tether-sidecar process of pod {uid} on this machine (the test kills it from the node, \
         as in the local cluster)"
    )
    .into())
}

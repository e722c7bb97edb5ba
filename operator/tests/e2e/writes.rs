//! What the operator writes: the writes of a new endpoint and none while it is idle (counted
//! from the API server's audit log, with the `User-Agent` of the operator and the sidecars),
//! and next to others' writes: a GitOps tool applying the user's manifest with server-side apply,
//! a spec the API server stores in another form (quantities), a second endpoint on the same
//! Deployment, and an endpoint deleted and re-created under its name.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use serde_json::json;
use tether_operator::names::INJECTED_ANNOTATION;

use crate::audit::{AuditLog, writes_by};
use crate::cluster::{A_RECONCILE, Cluster, EXAMPLE_PODS, Outcome, sidecar};
use crate::install::operator_user;
use crate::traffic::{Rollout, clean, load_through, roll_under_load};

/// `Degraded` reasons of a second endpoint on an injected Deployment: the Deployment opted in
/// to the first only (`TargetNotOptedIn`); in a namespace that opts every Deployment in, the
/// sidecar is the other's (`ContainerNameClash`), or its apply would take the other's fields
/// (`FieldConflict`).
const SECOND_ENDPOINT: &[&str] = &["TargetNotOptedIn", "ContainerNameClash", "FieldConflict"];

/// `spec.drain.timeout` of the endpoint deleted under load (shorter than the default 60 s, to
/// keep the test short).
const DRAIN: Duration = Duration::from_secs(20);
/// The longest an endpoint deleted under load may take to be finalized: its pods' drains, and
/// 30 s for the rollout around them.
const DELETION: Duration = Duration::from_secs(DRAIN.as_secs() + 30);

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

/// The operator's writes for a new endpoint named `weather` (`docs/design/operator.md`, "Writes
/// per scenario"), each exactly once, by [`crate::audit::AuditEvent::describe`]; besides them
/// only status patches (one per change, as the pods roll) and Events. `{secret}` is the key
/// ring's name, which holds the endpoint's UID.
const CREATION: &[&str] = &[
    "patch mcpendpoints/weather", // the finalizer
    "patch configmaps/weather-tether",
    "create secrets/{secret}",
    "patch services/weather-mcp",
    "patch services/weather-peers",
    "patch serviceaccounts/weather-tether-sidecar",
    "patch roles/weather-tether-sidecar",
    "patch rolebindings/weather-tether-sidecar",
    "patch poddisruptionbudgets/weather-tether",
    "patch deployments/weather",
];

/// Fails unless the requests of `log` from `start` to `idle` hold exactly the [`CREATION`]
/// writes (plus status patches and Events) of `operator` in `ns`, those after `idle` none, and
/// every request of the operator and of the sidecars carries its own `User-Agent`.
fn audited(
    log: &AuditLog,
    marks: [crate::audit::Mark; 2],
    operator: &str,
    ns: &str,
    secret: &str,
) -> Outcome {
    let [start, idle] = marks;
    let created = log.between(start, Some(idle))?;
    let mut writes = writes_by(&created, operator, ns);
    let statuses = writes
        .remove("patch mcpendpoints/status/weather")
        .unwrap_or(0);
    writes.retain(|w, _| !w.contains(" events/"));
    let want: BTreeMap<String, usize> = CREATION
        .iter()
        .map(|w| (w.replace("{secret}", secret), 1))
        .collect();
    if writes != want || statuses == 0 {
        return Err(format!(
            "the creation's writes (besides {statuses} status patches and the Events): \
             {writes:?}, want {want:?}"
        )
        .into());
    }
    // Each status patch changed the status: the same body twice in a row is a write of nothing.
    let bodies: Vec<_> = created
        .iter()
        .filter(|r| {
            r.user.username == operator && r.describe() == "patch mcpendpoints/status/weather"
        })
        .map(|r| r.request_object.clone())
        .collect();
    if let Some(same) = bodies.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(format!("a status patch that changed nothing: {:?}", same[1]).into());
    }
    let after = log.since(idle)?;
    let idle_writes = writes_by(&after, operator, ns);
    if !idle_writes.is_empty() {
        return Err(
            format!("writes of an idle endpoint over two rechecks: {idle_writes:?}").into(),
        );
    }
    let sidecars = format!("system:serviceaccount:{ns}:weather-tether-sidecar");
    for (user, agent) in [
        (operator, "tether-operator/v"),
        (sidecars.as_str(), "tether-sidecar/v"),
    ] {
        let sent: Vec<_> = created
            .iter()
            .chain(&after)
            .filter(|r| r.user.username == user)
            .collect();
        let other = sent.iter().find(|r| !r.user_agent.starts_with(agent));
        if sent.is_empty() || other.is_some() {
            return Err(format!(
                "{} requests of {user}, one with User-Agent {:?} (want {agent}…)",
                sent.len(),
                other.map(|r| &r.user_agent)
            )
            .into());
        }
    }
    eprintln!(
        "e2e: a creation wrote {} objects once, the status {statuses} times; idle: 0 writes",
        want.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_endpoint_makes_the_documented_writes_then_none_while_idle() {
    crate::scenario(&[], async |cluster, ns| {
        let log = cluster.settings.audit_log.clone().map(AuditLog::new);
        let start = log.as_ref().map(AuditLog::mark).transpose()?;
        // The endpoint keeps the limits as written; the Deployment holds them as 500m and 1Gi:
        // a comparison of the two as text would write the Deployment at every recheck.
        // (Small requests: the pods must fit on a one-node cluster.)
        let resources = json!({
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "0.5", "memory": "1024Mi"},
        });
        let spec = json!({"sidecar": {"resources": resources}});
        cluster.serve(ns, "weather", spec).await?;
        cluster.wait_settled(ns, "weather").await?;
        let idle = log.as_ref().map(AuditLog::mark).transpose()?;
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
        cluster.ensure_ready(ns, "weather").await?;
        // The key ring was created with the endpoint's field manager, not `unknown`.
        let uid = cluster.endpoints(ns).get("weather").await?.metadata.uid;
        let secret = format!("weather-tether-keys-{}", &uid.unwrap_or_default()[..8]);
        let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), ns);
        let managers: Vec<String> = secrets
            .get(&secret)
            .await?
            .metadata
            .managed_fields
            .into_iter()
            .flatten()
            .filter_map(|f| f.manager)
            .collect();
        if managers != ["tether-operator/weather"] {
            return Err(format!("Secret {secret}'s field managers: {managers:?}").into());
        }
        let (Some(log), Some(start), Some(idle)) = (log, start, idle) else {
            eprintln!("e2e: no TETHER_E2E_AUDIT_LOG: the writes were not counted");
            return Ok(());
        };
        let operator = operator_user(cluster).await?;
        audited(&log, [start, idle], &operator, ns, &secret)
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
        let drain = json!({"drain": {"timeout": format!("{}s", DRAIN.as_secs())}});
        let target = cluster.serve(ns, "weather", drain).await?;
        // Deleted while clients call (their sessions end with it: docs/guide/uninstall.md), it
        // is gone once no pod runs its sidecar: with clients still calling, the old pods serve
        // their sessions until `spec.drain.timeout`, then the rollout ends.
        let load = load_through(cluster, ns, "weather").await?;
        let started = Instant::now();
        cluster.delete_endpoint(ns, "weather").await?;
        let took = started.elapsed();
        load.abort();
        eprintln!("e2e: the endpoint deleted under load was finalized in {took:?}");
        if took > DELETION {
            return Err(format!("deleting the endpoint took {took:?}, over {DELETION:?}").into());
        }
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
        let report = roll_under_load(cluster, ns, "weather", &target, Rollout::Restart).await?;
        clean(&report, "a rollout after the re-create")
    })
    .await;
}

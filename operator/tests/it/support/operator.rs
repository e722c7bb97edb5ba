//! The operator's reconcile against the in-memory API server, as the reconcile and cluster tests
//! run it: the endpoint and Deployment fixtures (the user's Deployment as applied with
//! `kubectl`), reconciles with the writes they sent, the sidecars' key reports the tests set
//! ([`Reports`]), and readers of those writes (objects, Events, conditions) and of what is
//! stored (the pod spec, the conditions).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use tether_crds::McpEndpoint;
use tether_crds::keyring::KeyReport;
use tether_operator::admission::{OPT_IN_LABEL, Policy};
use tether_operator::controller::{Context, reconcile};
use tether_operator::error::Error;
use tether_operator::plan::Defaults;
use tether_operator::reports::KeyReports;

use super::{Shared, Write, api_with, apply_as, client_of, paths, stored};
use tether_operator::metrics::Metrics;

/// The namespace of the fixtures.
pub const NS: &str = "tools";
/// The collection of endpoints.
pub const ENDPOINTS: &str = "/apis/mcp.tether.dev/v1alpha1/namespaces/tools/mcpendpoints";
/// The endpoint `weather`.
pub const EP_PATH: &str = "/apis/mcp.tether.dev/v1alpha1/namespaces/tools/mcpendpoints/weather";
/// Its target Deployment.
pub const DEPLOY_PATH: &str = "/apis/apps/v1/namespaces/tools/deployments/weather";
/// The key-ring Secret: its name carries the first characters of the endpoint's UID (`e-1`).
pub const SECRET_PATH: &str = "/api/v1/namespaces/tools/secrets/weather-tether-keys-e-1";
/// Where Secrets are created.
pub const SECRETS: &str = "/api/v1/namespaces/tools/secrets";
/// Where Events are created.
pub const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/tools/events";

/// The endpoint `name` (uid `uid`) targeting the Deployment `weather`, with the operator's
/// finalizer when `finalized`.
pub fn endpoint_named(name: &str, uid: &str, finalized: bool) -> Value {
    let mut ep = json!({
        "apiVersion": "mcp.tether.dev/v1alpha1",
        "kind": "McpEndpoint",
        "metadata": {"name": name, "namespace": NS, "uid": uid, "generation": 1},
        "spec": {"targetRef": {"kind": "Deployment", "name": "weather"}},
    });
    if finalized {
        ep["metadata"]["finalizers"] = json!(["mcp.tether.dev/injection"]);
    }
    ep
}

/// The endpoint `weather` (uid `e-1`).
pub fn endpoint(finalized: bool) -> Value {
    endpoint_named("weather", "e-1", finalized)
}

/// The Deployment `weather`: one container `server` on port 3000, two ready pods of its
/// current template, opted in to the endpoint `weather`.
pub fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "weather", "namespace": NS, "generation": 1,
                     "labels": {OPT_IN_LABEL: "weather"}},
        "spec": {
            "selector": {"matchLabels": {"app": "weather"}},
            "template": {
                "metadata": {"labels": {"app": "weather"}},
                "spec": {"containers": [{"name": "server", "image": "srv", "ports": [{"containerPort": 3000}]}]},
            },
        },
        "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2},
    })
}

/// The operator-wide defaults of the tests: the sidecar image `tether-sidecar:test`.
pub fn defaults() -> Defaults {
    Defaults::with_image("tether-sidecar:test")
}

/// The sidecars' key reports as the tests set them, by pod IP; a pod without one is
/// unreachable. Records every address asked.
#[derive(Default)]
pub struct Reports {
    answers: Mutex<BTreeMap<IpAddr, KeyReport>>,
    asked: Mutex<Vec<SocketAddr>>,
}

impl Reports {
    /// The sidecar at `ip` reports `report` from now on.
    ///
    /// # Panics
    /// When `ip` is no IP address.
    pub fn set(&self, ip: &str, report: KeyReport) {
        let ip = ip.parse().expect("an IP address");
        self.answers.lock().unwrap().insert(ip, report);
    }

    /// Every address asked so far, in order.
    pub fn asked(&self) -> Vec<SocketAddr> {
        self.asked.lock().unwrap().clone()
    }
}

impl KeyReports for Reports {
    fn report(&self, addr: SocketAddr) -> BoxFuture<'_, Result<KeyReport, String>> {
        self.asked.lock().unwrap().push(addr);
        let answer = self.answers.lock().unwrap().get(&addr.ip()).cloned();
        Box::pin(async move { answer.ok_or_else(|| "unreachable: connection refused".to_owned()) })
    }
}

/// The operator as its controller runs it: one context, so one Event recorder, for every
/// reconcile.
pub struct Operator {
    api: Shared,
    ctx: Arc<Context>,
    reports: Arc<Reports>,
    metrics: Arc<Metrics>,
}

impl Operator {
    /// The operator against `api`, with the sidecar image `tether-sidecar:test`; the sidecars'
    /// key reports are [`Operator::reports`].
    pub fn new(api: &Shared) -> Self {
        Self::allowing(api, None)
    }

    /// [`Operator::new`], allowing the sidecar images of `policy` (default: the repository of
    /// `tether-sidecar:test`).
    pub fn allowing(api: &Shared, policy: Option<Policy>) -> Self {
        let metrics = Arc::new(Metrics::default());
        let reports = Arc::new(Reports::default());
        let mut ctx = Context::new(client_of(api, NS), defaults(), Arc::clone(&metrics), None)
            .with_reports(Arc::clone(&reports) as Arc<dyn KeyReports>);
        if let Some(policy) = policy {
            ctx = ctx.with_policy(policy);
        }
        Self {
            api: Arc::clone(api),
            ctx: Arc::new(ctx),
            reports,
            metrics,
        }
    }

    /// The operator's metrics over its reconciles.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// What the sidecars report of their key rings.
    pub fn reports(&self) -> &Reports {
        &self.reports
    }

    /// Reconciles the endpoint stored at `path` once; returns the result and the writes sent.
    ///
    /// # Panics
    /// When a request was outside the operator's RBAC rules.
    pub async fn reconcile(&self, path: &str) -> (Result<Action, Error>, Vec<Write>) {
        let stored = self.api.lock().unwrap().objects[path].clone();
        self.reconcile_as(stored).await
    }

    /// Reconciles endpoint `ep` once, as the controller does with the copy its cache holds
    /// (which may be older than the stored one); returns the result and the writes sent.
    ///
    /// # Panics
    /// When a request was outside the operator's RBAC rules.
    pub async fn reconcile_as(&self, ep: Value) -> (Result<Action, Error>, Vec<Write>) {
        let ep: McpEndpoint = serde_json::from_value(ep).unwrap();
        let before = self.api.lock().unwrap().writes.len();
        let result = reconcile(Arc::new(ep), Arc::clone(&self.ctx)).await;
        let a = self.api.lock().unwrap();
        assert_eq!(
            a.forbidden,
            Vec::<String>::new(),
            "requests outside the operator's RBAC rules"
        );
        (result, a.writes[before..].to_vec())
    }

    /// Reconciles the endpoint at `path` once more and asserts that nothing is written.
    ///
    /// # Panics
    /// When the reconcile writes anything.
    pub async fn assert_quiet(&self, path: &str) {
        let (_, writes) = self.reconcile(path).await;
        assert_eq!(paths(&writes), Vec::<String>::new());
    }
}

/// A server holding [`endpoint`] and [`deployment`], and the operator that injected the one into
/// the other with a first reconcile.
///
/// # Panics
/// When that reconcile fails.
pub async fn injected_example() -> (Shared, Operator) {
    let api = crate::support::api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())]);
    let operator = Operator::new(&api);
    operator.reconcile(EP_PATH).await.0.expect("the injection");
    (api, operator)
}

/// Runs one reconcile of the endpoint at `path` (a new operator); returns its action and the
/// writes it sent.
///
/// # Panics
/// When the reconcile fails.
pub async fn reconcile_at(api: &Shared, path: &str) -> (Action, Vec<Write>) {
    let (result, writes) = Operator::new(api).reconcile(path).await;
    (result.expect("reconcile succeeds"), writes)
}

/// Runs one reconcile of the endpoint `weather`; returns its action and the writes it sent.
///
/// # Panics
/// When the reconcile fails.
pub async fn reconcile_once(api: &Shared) -> (Action, Vec<Write>) {
    reconcile_at(api, EP_PATH).await
}

fn is_event(w: &Write) -> bool {
    w.path.starts_with(EVENTS_PATH)
}

/// The writes that are not Events, as `METHOD path`.
pub fn objects(writes: &[Write]) -> Vec<String> {
    let others: Vec<Write> = writes.iter().filter(|w| !is_event(w)).cloned().collect();
    paths(&others)
}

/// The Events published (created, or patched as a series), as `(type, reason, note)`.
pub fn events(writes: &[Write]) -> Vec<(String, String, String)> {
    writes
        .iter()
        .filter(|w| is_event(w))
        .map(|w| {
            let field = |k: &str| w.body[k].as_str().unwrap_or_default().to_owned();
            (field("type"), field("reason"), field("note"))
        })
        .collect()
}

/// The one Event `writes` published, as `(type, reason, note)`.
pub fn one_event(writes: &[Write]) -> (String, String, String) {
    let mut published = events(writes);
    assert_eq!(published.len(), 1, "{published:?}");
    published.remove(0)
}

/// `writes` are the status of the endpoint `weather` only, `Degraded` with `reason`, and one
/// Warning Event saying so.
pub fn assert_degraded_only(writes: &[Write], reason: &str) {
    assert_degraded_at(writes, EP_PATH, reason);
}

/// `writes` are the status of the endpoint at `path` only, `Degraded` with `reason`, and one
/// Warning Event saying so.
pub fn assert_degraded_at(writes: &[Write], path: &str, reason: &str) {
    assert_eq!(objects(writes), [format!("PATCH {path}/status")]);
    let (type_, why, _) = one_event(writes);
    assert_eq!((type_.as_str(), why.as_str()), ("Warning", reason));
    let status = writes.iter().find(|w| !is_event(w)).expect("the status");
    let degraded = condition(&status.body["status"], "Degraded");
    assert_eq!(
        (degraded["status"].as_str(), degraded["reason"].as_str()),
        (Some("True"), Some(reason)),
        "{degraded}"
    );
}

/// The Deployment controller caught up with the newest pod template.
pub fn pods_rolled(api: &Shared) {
    let mut a = api.lock().unwrap();
    let d = a.objects.get_mut(DEPLOY_PATH).unwrap();
    d["status"]["observedGeneration"] = d["metadata"]["generation"].clone();
}

/// The condition `type_` of `status` (`null` when there is none).
pub fn condition(status: &Value, type_: &str) -> Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or(Value::Null)
}

/// The `Degraded` condition of the endpoint stored at `path`.
pub fn degraded(api: &Shared, path: &str) -> Value {
    condition(&stored(api, path)["status"], "Degraded")
}

/// The pod spec of the Deployment `weather`.
pub fn pod_spec(api: &Shared) -> Value {
    stored(api, DEPLOY_PATH)["spec"]["template"]["spec"].clone()
}

/// Whether the pod template of the Deployment `weather` carries the sidecar.
pub fn injected(api: &Shared) -> bool {
    let init = pod_spec(api)["initContainers"].clone();
    init.as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["name"] == "tether-sidecar"))
}

/// The user's manifest of the Deployment `weather` (what `kubectl apply` sends: no status).
pub fn manifest() -> Value {
    let mut d = deployment();
    d.as_object_mut().unwrap().remove("status");
    d
}

/// A server holding `ep` and the Deployment the user applied (`kubectl apply --server-side`)
/// from `manifest`, its two pods ready.
///
/// # Panics
/// When the API server refuses the user's apply.
pub fn applied_by_kubectl(ep: Value, manifest: &Value) -> Shared {
    let api = api_with(&[(EP_PATH, ep)]);
    apply_as(&api, "kubectl", DEPLOY_PATH, manifest, false).expect("the user's apply");
    let status = deployment()["status"].clone();
    api.lock().unwrap().objects.get_mut(DEPLOY_PATH).unwrap()["status"] = status;
    api
}

//! A fake Kubernetes API server for the sidecar's Pod watch
//! (`docs/design/routing.md#kubernetes-pod-watch`): plain HTTP on a loopback address, serving
//! the Pods of one namespace as a kube-apiserver does for a `kube::runtime::watcher` —
//!
//! - `GET /api/v1/namespaces/<ns>/pods?labelSelector=…` (a LIST): a `PodList` of the pods that
//!   match the selector (equality terms `k=v`, comma-separated), with the list's
//!   `resourceVersion`;
//! - the same with `watch=true` (or `1`) and `resourceVersion=R` (a WATCH): the response stays
//!   open and carries, one JSON line each, the `ADDED` / `MODIFIED` / `DELETED` events after `R`
//!   of the matching pods, as the test makes them ([`FakeKube::apply`], [`FakeKube::delete`]);
//! - anything else: 404 with a `Status`.
//!
//! The test controls the answers: [`FakeKube::hold_lists`] keeps every LIST waiting (an API
//! server slow to answer, or not reachable yet) until it is released. A sidecar reaches it with
//! [`FakeKube::pod_watch`]: `--pod-selector`, `--namespace` and `KUBECONFIG` naming a kubeconfig
//! whose cluster is `http://<fake>` with no credentials (`kube::Client::try_default` reads
//! `KUBECONFIG` first).
//!
//! Pods are described by [`PodObject`]: a pod of the endpoint's target Deployment as the operator
//! injects it ([`PodObject::of_endpoint`]: the endpoint annotation, the controlling ReplicaSet
//! `<deployment>-<pod-template-hash>`, the `tether-sidecar` init container with its ports `mcp`
//! and `tether-peer`), or a pod that only matches the label selector ([`PodObject::stranger`]).
//! The fake stops (every connection with it) when dropped.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tether_crds::{ENDPOINT_ANNOTATION, MCP_PORT_NAME, PEER_PORT_NAME, SIDECAR_CONTAINER};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::pod::{ADMIN_PORT, LISTEN_PORT, PEER_PORT, PodSpec, uid};
use crate::{Result, addr};

/// The port the fake listens on, on an address of its own.
pub const PORT: u16 = 6443;
/// The label a Deployment's ReplicaSet puts on its pods: the revision.
pub const REVISION_LABEL: &str = "pod-template-hash";

type Body = BoxBody<Bytes, Infallible>;

/// A pod as the fake API server lists it.
#[derive(Clone, Debug)]
pub struct PodObject {
    /// `metadata.name`.
    pub name: String,
    /// `status.podIP`; `metadata.uid` is the harness's UID of the pod on it ([`uid`]).
    pub ip: Ipv4Addr,
    /// `metadata.labels` (with [`REVISION_LABEL`] for a ReplicaSet's pod).
    pub labels: BTreeMap<String, String>,
    /// The value of the pod-template annotation [`ENDPOINT_ANNOTATION`], if any.
    pub endpoint: Option<String>,
    /// The controlling ReplicaSet's name, if any.
    pub owner: Option<String>,
    /// Condition `Ready` is `True`.
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// `metadata.creationTimestamp`, in seconds after 2026-01-01T00:00:00Z (below 3600): pods
    /// are ordered by it, oldest first.
    pub created: u32,
    /// The `tether-sidecar` init container with its named ports (`mcp`, `tether-admin`,
    /// `tether-peer`), as the operator injects it.
    pub sidecar: bool,
}

impl PodObject {
    /// A Ready pod of endpoint `endpoint` whose target is Deployment `deployment`, at revision
    /// `hash`, with `labels`: as the operator's injection and the Deployment's ReplicaSet make
    /// it.
    pub fn of_endpoint(
        ip: Ipv4Addr,
        endpoint: &str,
        deployment: &str,
        hash: &str,
        labels: &[(&str, &str)],
        created: u32,
    ) -> Self {
        let mut pod = Self::stranger(ip, hash, labels, created);
        pod.name = format!("{deployment}-{hash}-{}", ip.octets()[3]);
        pod.endpoint = Some(endpoint.to_owned());
        pod.owner = Some(format!("{deployment}-{hash}"));
        pod.sidecar = true;
        pod
    }

    /// A Ready pod with `labels` (and revision `hash`) that is no pod of an endpoint: no
    /// endpoint annotation, no controller, no sidecar container — another workload that
    /// happens to match the label selector.
    pub fn stranger(ip: Ipv4Addr, hash: &str, labels: &[(&str, &str)], created: u32) -> Self {
        let mut labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.insert(REVISION_LABEL.to_owned(), hash.to_owned());
        Self {
            name: format!("stranger-{}", ip.octets()[3]),
            ip,
            labels,
            endpoint: None,
            owner: None,
            ready: true,
            terminating: false,
            created,
            sidecar: false,
        }
    }

    /// The pod's UID.
    pub fn uid(&self) -> String {
        uid(self.ip)
    }

    /// The pod as the API server serves it, at `resource_version`.
    pub fn to_json(&self, namespace: &str, resource_version: u64) -> Value {
        let mut annotations = serde_json::Map::new();
        if let Some(endpoint) = &self.endpoint {
            annotations.insert(ENDPOINT_ANNOTATION.to_owned(), json!(endpoint));
        }
        let owners: Vec<Value> = self
            .owner
            .iter()
            .map(|name| {
                json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name,
                    "uid": format!("rs-{name}"), "controller": true, "blockOwnerDeletion": true,
                })
            })
            .collect();
        let mut init = Vec::new();
        if self.sidecar {
            init.push(json!({
                "name": SIDECAR_CONTAINER,
                "image": "tether-sidecar",
                "restartPolicy": "Always",
                "ports": [
                    {"name": MCP_PORT_NAME, "containerPort": LISTEN_PORT},
                    {"name": "tether-admin", "containerPort": ADMIN_PORT},
                    {"name": PEER_PORT_NAME, "containerPort": PEER_PORT},
                ],
            }));
        }
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": namespace,
                "uid": self.uid(),
                "resourceVersion": resource_version.to_string(),
                "creationTimestamp": format!(
                    "2026-01-01T00:{:02}:{:02}Z", self.created / 60 % 60, self.created % 60
                ),
                "labels": self.labels,
                "annotations": annotations,
                "ownerReferences": owners,
            },
            "spec": {
                "initContainers": init,
                "containers": [{"name": "server", "image": "mcp-server"}],
            },
            "status": {
                "phase": "Running",
                "podIP": self.ip.to_string(),
                "conditions": [
                    {"type": "Ready", "status": if self.ready { "True" } else { "False" }},
                ],
            },
        });
        if self.terminating {
            pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T01:00:00Z");
        }
        pod
    }
}

/// What the fake serves.
struct State {
    namespace: String,
    inner: Mutex<Inner>,
    /// The latest resource version, for the watches to wake on.
    changed: watch::Sender<u64>,
    /// Whether LISTs wait ([`FakeKube::hold_lists`]).
    hold: watch::Sender<bool>,
    lists: AtomicU64,
    watches: AtomicU64,
    /// Every request: method, path and query.
    requests: Mutex<Vec<String>>,
}

#[derive(Default)]
struct Inner {
    resource_version: u64,
    /// The pods by UID, with their labels for the selector.
    pods: BTreeMap<String, (BTreeMap<String, String>, Value)>,
    /// Every change: resource version, event type, labels, object.
    log: Vec<(u64, &'static str, BTreeMap<String, String>, Value)>,
}

/// A fake kube-apiserver (module docs).
pub struct FakeKube {
    /// Its base URL, `http://ip:port`.
    pub url: String,
    state: Arc<State>,
    kubeconfig: tempfile::NamedTempFile,
    server: JoinHandle<()>,
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeKube {
    /// Starts a fake API server on a fresh loopback address, serving the (at first no) pods of
    /// `namespace`.
    ///
    /// # Errors
    /// [`crate::HarnessError::Io`] when it cannot listen or write its kubeconfig.
    pub async fn start(namespace: &str) -> Result<Self> {
        let ip = addr::next_ip();
        let listener = TcpListener::bind(SocketAddr::from((ip, PORT))).await?;
        let url = format!("http://{ip}:{PORT}");
        let kubeconfig = tempfile::NamedTempFile::new()?;
        std::fs::write(
            kubeconfig.path(),
            format!(
                "apiVersion: v1\n\
                 kind: Config\n\
                 clusters:\n\
                 - name: fake\n\
                 \x20 cluster: {{server: '{url}'}}\n\
                 users:\n\
                 - name: nobody\n\
                 \x20 user: {{}}\n\
                 contexts:\n\
                 - name: fake\n\
                 \x20 context: {{cluster: fake, user: nobody, namespace: {namespace}}}\n\
                 current-context: fake\n"
            ),
        )?;
        let state = Arc::new(State {
            namespace: namespace.to_owned(),
            inner: Mutex::default(),
            changed: watch::Sender::new(0),
            hold: watch::Sender::new(false),
            lists: AtomicU64::new(0),
            watches: AtomicU64::new(0),
            requests: Mutex::default(),
        });
        let server = tokio::spawn(serve(listener, Arc::clone(&state)));
        Ok(Self {
            url,
            state,
            kubeconfig,
            server,
        })
    }

    /// `spec` with the flags and environment of a sidecar whose membership is a Pod watch of
    /// this fake: `--pod-selector selector --namespace <ns>`, `KUBECONFIG`, `POD_NAMESPACE`.
    pub fn pod_watch(&self, selector: &str, mut spec: PodSpec) -> PodSpec {
        spec.sidecar_args.extend([
            "--pod-selector".to_owned(),
            selector.to_owned(),
            "--namespace".to_owned(),
            self.state.namespace.clone(),
        ]);
        spec.sidecar_env.extend([
            (
                "KUBECONFIG".to_owned(),
                self.kubeconfig.path().display().to_string(),
            ),
            ("POD_NAMESPACE".to_owned(), self.state.namespace.clone()),
        ]);
        spec
    }

    /// Adds `pod` or replaces the pod of its UID: an `ADDED` or `MODIFIED` event for the
    /// watches.
    pub fn apply(&self, pod: &PodObject) {
        let mut inner = self.state.lock();
        inner.resource_version += 1;
        let rv = inner.resource_version;
        let object = pod.to_json(&self.state.namespace, rv);
        let kind = match inner
            .pods
            .insert(pod.uid(), (pod.labels.clone(), object.clone()))
        {
            Some(_) => "MODIFIED",
            None => "ADDED",
        };
        inner.log.push((rv, kind, pod.labels.clone(), object));
        drop(inner);
        self.state.changed.send_replace(rv);
    }

    /// Removes the pod on `ip`: a `DELETED` event. Whether it was there.
    pub fn delete(&self, ip: Ipv4Addr) -> bool {
        let mut inner = self.state.lock();
        let Some((labels, mut object)) = inner.pods.remove(&uid(ip)) else {
            return false;
        };
        inner.resource_version += 1;
        let rv = inner.resource_version;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        inner.log.push((rv, "DELETED", labels, object));
        drop(inner);
        self.state.changed.send_replace(rv);
        true
    }

    /// Makes every LIST wait (`true`) until released (`false`); a LIST already waiting is
    /// answered, with the pods of that moment, once released.
    pub fn hold_lists(&self, hold: bool) {
        self.state.hold.send_replace(hold);
    }

    /// LIST requests received so far (answered or held).
    pub fn lists(&self) -> u64 {
        self.state.lists.load(Ordering::Relaxed)
    }

    /// WATCH requests received so far.
    pub fn watches(&self) -> u64 {
        self.state.watches.load(Ordering::Relaxed)
    }

    /// Polls (every 20 ms, at most `within`) until at least `n` LISTs arrived; whether they did.
    pub async fn wait_for_lists(&self, n: u64, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while self.lists() < n {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Every request received, one line each (method, path and query), for failure messages.
    pub fn requests(&self) -> String {
        self.state
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .join("\n")
    }
}

impl State {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pods matching `selector` and the list's resource version.
    fn list(&self, selector: &Selector) -> (u64, Vec<Value>) {
        let inner = self.lock();
        let items = inner
            .pods
            .values()
            .filter(|(labels, _)| selector.matches(labels))
            .map(|(_, object)| object.clone())
            .collect();
        (inner.resource_version, items)
    }

    /// The watch events after resource version `after` of pods matching `selector`, as JSON
    /// lines, and the last version they reach.
    fn events_after(&self, after: u64, selector: &Selector) -> (u64, Vec<Bytes>) {
        let inner = self.lock();
        let mut last = after;
        let mut lines = Vec::new();
        for (rv, kind, labels, object) in inner.log.iter().filter(|(rv, ..)| *rv > after) {
            last = *rv;
            if selector.matches(labels) {
                let mut line = serde_json::to_vec(&json!({"type": kind, "object": object}))
                    .unwrap_or_default();
                line.push(b'\n');
                lines.push(Bytes::from(line));
            }
        }
        (last, lines)
    }
}

/// A label selector of equality terms (`a=b,c==d`).
#[derive(Clone, Debug, Default)]
struct Selector(Vec<(String, String)>);

impl Selector {
    fn parse(text: &str) -> Option<Self> {
        let mut terms = Vec::new();
        for term in text.split(',').filter(|t| !t.trim().is_empty()) {
            let (k, v) = term.split_once("==").or_else(|| term.split_once('='))?;
            if k.ends_with('!') {
                return None;
            }
            terms.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        Some(Self(terms))
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// `application/x-www-form-urlencoded` decoding of one query component.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Accepts connections until the fake is dropped (which aborts this task and, with it, every
/// connection's).
async fn serve(listener: TcpListener, state: Arc<State>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((io, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let state = Arc::clone(&state);
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let state = Arc::clone(&state);
                async move { Ok::<_, Infallible>(answer(&state, &req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(io), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

fn full(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap_or_default()
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    full(
        code,
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code.as_u16(),
        }),
    )
}

async fn answer(state: &Arc<State>, req: &Request<Incoming>) -> Response<Body> {
    let path = req.uri().path();
    let query: BTreeMap<String, String> = req
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect();
    state
        .requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(format!("{} {path} {query:?}", req.method()));
    let pods = format!("/api/v1/namespaces/{}/pods", state.namespace);
    if req.method() != http::Method::GET || path != pods {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the fake serves pods only",
        );
    }
    let Some(selector) = Selector::parse(query.get("labelSelector").map_or("", String::as_str))
    else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the fake knows equality selectors only",
        );
    };
    let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    if !watching {
        state.lists.fetch_add(1, Ordering::Relaxed);
        let mut hold = state.hold.subscribe();
        let _ = hold.wait_for(|held| !*held).await;
        let (rv, items) = state.list(&selector);
        return full(
            StatusCode::OK,
            &json!({
                "apiVersion": "v1", "kind": "PodList",
                "metadata": {"resourceVersion": rv.to_string()},
                "items": items,
            }),
        );
    }
    state.watches.fetch_add(1, Ordering::Relaxed);
    let from = query
        .get("resourceVersion")
        .and_then(|rv| rv.parse::<u64>().ok())
        .unwrap_or(0);
    let events = futures::stream::unfold(
        (
            Arc::clone(state),
            state.changed.subscribe(),
            from,
            selector,
            std::collections::VecDeque::new(),
        ),
        |(state, mut changed, mut after, selector, mut pending)| async move {
            loop {
                if let Some(line) = pending.pop_front() {
                    let frame = Ok::<_, Infallible>(Frame::data(line));
                    return Some((frame, (state, changed, after, selector, pending)));
                }
                changed.borrow_and_update();
                let (last, lines) = state.events_after(after, &selector);
                after = last;
                pending.extend(lines);
                if pending.is_empty() && changed.changed().await.is_err() {
                    return None;
                }
            }
        },
    );
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(StreamBody::new(events).boxed())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_and_query_components() {
        let labels: BTreeMap<String, String> = [("app", "x"), ("tier", "mcp")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into();
        assert!(Selector::parse("app=x").unwrap().matches(&labels));
        assert!(Selector::parse("app==x,tier=mcp").unwrap().matches(&labels));
        assert!(!Selector::parse("app=y").unwrap().matches(&labels));
        assert!(Selector::parse("").unwrap().matches(&labels));
        assert!(Selector::parse("app!=x").is_none());
        assert_eq!(decode("app%3Dx%2Ctier%3Dmcp"), "app=x,tier=mcp");
        assert_eq!(decode("a+b%"), "a b%");
    }

    #[test]
    fn an_endpoint_pod_carries_what_admission_checks() {
        let ip = Ipv4Addr::new(127, 9, 0, 7);
        let pod = PodObject::of_endpoint(ip, "test", "test", "r1", &[("app", "x")], 3);
        let json = pod.to_json("ns", 5);
        assert_eq!(json["metadata"]["uid"], uid(ip));
        assert_eq!(json["metadata"]["annotations"][ENDPOINT_ANNOTATION], "test");
        assert_eq!(json["metadata"]["ownerReferences"][0]["name"], "test-r1");
        assert_eq!(json["metadata"]["labels"][REVISION_LABEL], "r1");
        assert_eq!(
            json["metadata"]["creationTimestamp"],
            "2026-01-01T00:00:03Z"
        );
        assert_eq!(
            json["spec"]["initContainers"][0]["ports"][2]["name"],
            PEER_PORT_NAME
        );
        let stranger = PodObject::stranger(ip, "r2", &[("app", "x")], 4).to_json("ns", 6);
        assert_eq!(stranger["metadata"]["annotations"], json!({}));
        assert_eq!(stranger["metadata"]["ownerReferences"], json!([]));
    }
}

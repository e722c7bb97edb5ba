//! A fake Kubernetes API server for the sidecar's EndpointSlice watch
//! (`docs/design/routing.md#kubernetes-endpointslice-watch`): plain HTTP on a loopback address,
//! serving the EndpointSlices of one Service of one namespace as a kube-apiserver does for a
//! `kube::runtime::watcher` —
//!
//! - `GET /apis/discovery.k8s.io/v1/namespaces/<ns>/endpointslices?labelSelector=…` (a LIST):
//!   an `EndpointSliceList` of the slices that match the selector (equality terms `k=v`,
//!   comma-separated; the sidecar asks for `kubernetes.io/service-name=<service>`), with the
//!   list's `resourceVersion`;
//! - the same with `watch=true` (or `1`) and `resourceVersion=R` (a WATCH): the response stays
//!   open and carries, one JSON line each, the `ADDED` / `MODIFIED` / `DELETED` events after `R`
//!   of the matching slices;
//! - anything else: 404 with a `Status`.
//!
//! The test describes pods ([`PodObject`], [`FakeKube::apply`], [`FakeKube::delete`]); the fake
//! plays the EndpointSlice controller of the Service it was started with: the pods its selector
//! matches are its endpoints (conditions `ready` always true, since the peer Service publishes
//! not-ready addresses; `serving` the pod's readiness; `terminating` its deletion), packed
//! [`SLICE_CAPACITY`] to a slice so that a few pods already make several slices, with the ports
//! `tether-peer` and `mcp`.
//!
//! The test controls the answers: [`FakeKube::hold_lists`] keeps every LIST waiting (an API
//! server slow to answer, or not reachable yet) until it is released. A sidecar reaches it with
//! [`FakeKube::slice_watch`]: `--peer-service`, `--namespace` and `KUBECONFIG` naming a
//! kubeconfig whose cluster is `http://<fake>` with no credentials (`kube::Client::try_default`
//! reads `KUBECONFIG` first). The fake stops (every connection with it) when dropped.

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
use tether_crds::{ENDPOINT_ANNOTATION, MCP_PORT_NAME, PEER_PORT_NAME};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::pod::{LISTEN_PORT, PEER_PORT, PodSpec, uid};
use crate::{Result, addr};

/// The port the fake listens on, on an address of its own.
pub const PORT: u16 = 6443;
/// The label a Deployment's ReplicaSet puts on its pods: the revision.
pub const REVISION_LABEL: &str = "pod-template-hash";
/// The label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Endpoints per slice (the EndpointSlice controller packs up to 100; fewer here, so that tests
/// see several slices).
pub const SLICE_CAPACITY: usize = 2;

type Body = BoxBody<Bytes, Infallible>;

/// A pod, as the fake's EndpointSlice controller sees it.
#[derive(Clone, Debug)]
pub struct PodObject {
    /// `metadata.name`.
    pub name: String,
    /// `status.podIP`; `metadata.uid` is the harness's UID of the pod on it ([`uid`]).
    pub ip: Ipv4Addr,
    /// `metadata.labels` (with [`REVISION_LABEL`], and the injection's
    /// [`ENDPOINT_ANNOTATION`] label for a pod of an endpoint).
    pub labels: BTreeMap<String, String>,
    /// Condition `Ready` is `True` (the endpoint's `serving`).
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set (the endpoint's `terminating`).
    pub terminating: bool,
}

impl PodObject {
    /// A Ready pod of endpoint `endpoint` whose target is Deployment `deployment`, at revision
    /// `hash`, with `labels`: as the operator's injection (its label naming the endpoint) and
    /// the Deployment's ReplicaSet make it.
    pub fn of_endpoint(
        ip: Ipv4Addr,
        endpoint: &str,
        deployment: &str,
        hash: &str,
        labels: &[(&str, &str)],
    ) -> Self {
        let mut pod = Self::stranger(ip, hash, labels);
        pod.name = format!("{deployment}-{hash}-{}", ip.octets()[3]);
        pod.labels
            .insert(ENDPOINT_ANNOTATION.to_owned(), endpoint.to_owned());
        pod
    }

    /// A Ready pod with `labels` (and revision `hash`) that is no pod of an endpoint (no
    /// injection label): another workload that happens to share the Deployment's labels.
    pub fn stranger(ip: Ipv4Addr, hash: &str, labels: &[(&str, &str)]) -> Self {
        let mut labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.insert(REVISION_LABEL.to_owned(), hash.to_owned());
        Self {
            name: format!("stranger-{}", ip.octets()[3]),
            ip,
            labels,
            ready: true,
            terminating: false,
        }
    }

    /// The pod's UID.
    pub fn uid(&self) -> String {
        uid(self.ip)
    }

    /// The pod as an endpoint of an EndpointSlice.
    pub fn endpoint(&self, namespace: &str) -> Value {
        json!({
            "addresses": [self.ip.to_string()],
            "conditions": {"ready": true, "serving": self.ready, "terminating": self.terminating},
            "targetRef": {"kind": "Pod", "namespace": namespace, "name": self.name, "uid": self.uid()},
        })
    }
}

/// What the fake serves.
struct State {
    namespace: String,
    /// The Service whose slices it serves, and its selector.
    service: String,
    selector: Selector,
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
    /// The pods by UID, with their place (pods are packed into slices in the order they came).
    pods: BTreeMap<String, (usize, PodObject)>,
    /// Places given so far.
    places: usize,
    /// The slices by number, as last served.
    slices: BTreeMap<usize, Value>,
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
    /// Starts a fake API server on a fresh loopback address, serving the EndpointSlices of
    /// Service `service` of `namespace`, which selects the pods carrying every label of
    /// `selector` (at first none).
    ///
    /// # Errors
    /// [`crate::HarnessError::Io`] when it cannot listen or write its kubeconfig.
    pub async fn start(namespace: &str, service: &str, selector: &[(&str, &str)]) -> Result<Self> {
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
            service: service.to_owned(),
            selector: Selector(
                selector
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
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

    /// `spec` with the flags and environment of a sidecar whose membership is a watch of this
    /// fake's Service: `--peer-service <service> --namespace <ns>`, `KUBECONFIG`,
    /// `POD_NAMESPACE`.
    pub fn slice_watch(&self, mut spec: PodSpec) -> PodSpec {
        spec.sidecar_args.extend([
            "--peer-service".to_owned(),
            self.state.service.clone(),
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

    /// Adds `pod` or replaces the pod of its UID; the slice that holds it changes.
    pub fn apply(&self, pod: &PodObject) {
        let mut inner = self.state.lock();
        let place = match inner.pods.get(&pod.uid()) {
            Some((place, _)) => *place,
            None => {
                inner.places += 1;
                inner.places - 1
            }
        };
        inner.pods.insert(pod.uid(), (place, pod.clone()));
        self.state.update(&mut inner, place / SLICE_CAPACITY);
    }

    /// Removes the pod on `ip` (its endpoint leaves its slice). Whether it was there.
    pub fn delete(&self, ip: Ipv4Addr) -> bool {
        let mut inner = self.state.lock();
        let Some((place, _)) = inner.pods.remove(&uid(ip)) else {
            return false;
        };
        self.state.update(&mut inner, place / SLICE_CAPACITY);
        true
    }

    /// Makes every LIST wait (`true`) until released (`false`); a LIST already waiting is
    /// answered, with the slices of that moment, once released.
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

    /// The labels of every slice of the Service.
    fn slice_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (SERVICE_NAME_LABEL.to_owned(), self.service.clone()),
            (
                "endpointslice.kubernetes.io/managed-by".to_owned(),
                "endpointslice-controller.k8s.io".to_owned(),
            ),
        ])
    }

    /// Slice number `slice` as the pods make it now, at `resource_version`; `None` when none
    /// of its pods is selected.
    fn slice(&self, inner: &Inner, slice: usize, resource_version: u64) -> Option<Value> {
        let endpoints: Vec<Value> = inner
            .pods
            .values()
            .filter(|(place, pod)| {
                place / SLICE_CAPACITY == slice && self.selector.matches(&pod.labels)
            })
            .map(|(_, pod)| pod.endpoint(&self.namespace))
            .collect();
        (!endpoints.is_empty()).then(|| {
            json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": format!("{}-{slice}", self.service),
                    "namespace": self.namespace,
                    "resourceVersion": resource_version.to_string(),
                    "labels": self.slice_labels(),
                },
                "addressType": "IPv4",
                "ports": [
                    {"name": PEER_PORT_NAME, "port": PEER_PORT, "protocol": "TCP"},
                    {"name": MCP_PORT_NAME, "port": LISTEN_PORT, "protocol": "TCP"},
                ],
                "endpoints": endpoints,
            })
        })
    }

    /// Makes slice number `slice` again from the pods: an `ADDED`, `MODIFIED` or `DELETED`
    /// event when it changed.
    fn update(&self, inner: &mut Inner, slice: usize) {
        let rv = inner.resource_version + 1;
        let made = self.slice(inner, slice, rv);
        let old = inner.slices.get(&slice).cloned();
        let same = |a: &Value, b: &Value| a["endpoints"] == b["endpoints"];
        let (kind, object) = match (old, made) {
            (None, None) => return,
            (Some(old), Some(made)) if same(&old, &made) => return,
            (None, Some(made)) => ("ADDED", made),
            (Some(_), Some(made)) => ("MODIFIED", made),
            (Some(mut old), None) => {
                old["metadata"]["resourceVersion"] = json!(rv.to_string());
                ("DELETED", old)
            }
        };
        inner.resource_version = rv;
        if kind == "DELETED" {
            inner.slices.remove(&slice);
        } else {
            inner.slices.insert(slice, object.clone());
        }
        inner.log.push((rv, kind, self.slice_labels(), object));
        self.changed.send_replace(rv);
    }

    /// The slices matching `selector` and the list's resource version.
    fn list(&self, selector: &Selector) -> (u64, Vec<Value>) {
        let inner = self.lock();
        let items = if selector.matches(&self.slice_labels()) {
            inner.slices.values().cloned().collect()
        } else {
            Vec::new()
        };
        (inner.resource_version, items)
    }

    /// The watch events after resource version `after` of slices matching `selector`, as JSON
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
    let slices = format!(
        "/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices",
        state.namespace
    );
    if req.method() != http::Method::GET || path != slices {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the fake serves EndpointSlices only",
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
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
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

    #[tokio::test]
    async fn pods_become_endpoints_of_the_services_slices() {
        let api = FakeKube::start(
            "ns",
            "test-peers",
            &[("app", "x"), (ENDPOINT_ANNOTATION, "test")],
        )
        .await
        .unwrap();
        let ips = [1, 2, 3].map(|n| Ipv4Addr::new(127, 9, 0, n));
        for ip in ips {
            api.apply(&PodObject::of_endpoint(
                ip,
                "test",
                "test",
                "r1",
                &[("app", "x")],
            ));
        }
        let stranger = Ipv4Addr::new(127, 9, 0, 9);
        api.apply(&PodObject::stranger(stranger, "r1", &[("app", "x")]));
        let selector = Selector::parse("kubernetes.io/service-name=test-peers").unwrap();
        let (_, slices) = api.state.list(&selector);
        assert_eq!(slices.len(), 2, "{SLICE_CAPACITY} endpoints a slice");
        let endpoints: Vec<&Value> = slices
            .iter()
            .flat_map(|s| s["endpoints"].as_array().unwrap())
            .collect();
        assert_eq!(endpoints.len(), 3, "not the stranger");
        assert_eq!(endpoints[0]["targetRef"]["uid"], uid(ips[0]));
        assert_eq!(endpoints[0]["conditions"]["serving"], true);
        assert_eq!(slices[0]["ports"][1]["name"], MCP_PORT_NAME);
        assert!(
            api.state
                .list(&Selector::parse("kubernetes.io/service-name=other").unwrap())
                .1
                .is_empty()
        );

        let mut leaving = PodObject::of_endpoint(ips[2], "test", "test", "r1", &[("app", "x")]);
        leaving.terminating = true;
        api.apply(&leaving);
        assert!(api.delete(ips[2]));
        assert!(!api.delete(ips[2]));
        let (rv, lines) = api.state.events_after(0, &selector);
        let kinds: Vec<String> = lines
            .iter()
            .map(|l| {
                serde_json::from_slice::<Value>(l).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(kinds, ["ADDED", "MODIFIED", "ADDED", "MODIFIED", "DELETED"]);
        assert_eq!(rv, 5);
        assert_eq!(api.state.list(&selector).1.len(), 1);
    }
}

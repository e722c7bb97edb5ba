//! The Kubernetes membership source: a watch on the endpoint's Pods.
//!
//! [`KubernetesPods`] runs a kube-runtime [`watcher`] on the Pods of one namespace that match a
//! label selector (the endpoint's pod selector, e.g. `app=weather`) and, after every change,
//! publishes a [`Snapshot`] of them, oldest first, into the [`MembershipSink`]. How a Pod becomes
//! a [`Peer`] ([`peer_of`], [`state_of`]), how watch errors keep the last good view, and the Role
//! the sidecar's service account needs: `docs/design/routing.md#kubernetes-pod-watch` and
//! `docs/design/routing.md#the-sidecars-role`. Before the watcher's first complete list the sink
//! keeps its initial view; every relist (`Init` … `InitDone`, after a restart or a `410 Gone`)
//! replaces the whole set.
//!
//! Only pods of the endpoint's target are peers ([`KubernetesPods::of_target`], [`belongs_to`]):
//! a pod whose template carries the operator's [`ENDPOINT_ANNOTATION`] naming this endpoint and
//! whose controller is a ReplicaSet of the target Deployment. Another Ready pod that happens to
//! match the label selector never joins the ring, so it never becomes a handoff target.
//!
//! # Runtime
//! The [`kube::Client`] is created inside [`Membership::run`] (with [`Client::try_default`]:
//! in-cluster service-account config, or `KUBECONFIG` outside a cluster), i.e. on the runtime of
//! the pingora background service that runs the source, never before pingora starts its
//! runtimes. A client that cannot be created is logged as an error and retried with the same
//! backoff until shutdown.
//!
//! # Configuration expected from the operator
//! - the namespace, from the downward API:
//!   `env: [{name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}]`;
//! - the label selector of the endpoint's pods (Kubernetes label-selector syntax, e.g.
//!   `app=weather,tier in (mcp)`), e.g. as `TETHER_POD_SELECTOR`; an empty selector watches
//!   every pod of the namespace;
//! - the MCP listen port (`spec.listen.port`), appended to the IP of a pod whose sidecar
//!   container does not name its ports (the operator's always does: `mcp`, `tether-peer`).

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, DefaultBackoff, Event};
use kube::{Api, Client, ResourceExt};
use pingora::server::ShutdownWatch;
use tether_crds::{ENDPOINT_ANNOTATION, MCP_PORT_NAME, PEER_PORT_NAME, SIDECAR_CONTAINER};

use super::{Membership, MembershipSink, Peer, PeerState, Snapshot};

/// The source's name (metric label).
pub(crate) const SOURCE: &str = "kubernetes";
/// The label that carries a pod's revision (set by the Deployment's ReplicaSet).
pub(crate) const REVISION_LABEL: &str = "pod-template-hash";
/// The longest wait between two attempts to create the Kubernetes client.
const MAX_CLIENT_RETRY: Duration = Duration::from_secs(30);

/// The Kubernetes membership source: a watch on the Pods matching a label selector in one
/// namespace (see the [module docs](self)).
pub(crate) struct KubernetesPods {
    namespace: String,
    label_selector: String,
    listen_port: u16,
    client: Option<Client>,
    /// This pod's UID: its deletion timestamp starts the drain
    /// (`docs/design/handoff.md#when-a-pod-drains`).
    own_uid: Option<String>,
    /// The endpoint and its target Deployment: only their pods are peers.
    target: Option<(String, String)>,
}

impl fmt::Debug for KubernetesPods {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubernetesPods")
            .field("namespace", &self.namespace)
            .field("label_selector", &self.label_selector)
            .field("listen_port", &self.listen_port)
            .field("injected_client", &self.client.is_some())
            .finish()
    }
}

impl KubernetesPods {
    /// A source watching the Pods of `namespace` that match `label_selector` (Kubernetes
    /// label-selector syntax, e.g. `app=weather`; empty: every pod of the namespace), whose MCP
    /// listener is `pod IP:listen_port`.
    ///
    /// The Kubernetes client is created when [`Membership::run`] starts, with
    /// [`Client::try_default`] (in-cluster config or `KUBECONFIG`).
    pub(crate) fn new(namespace: String, label_selector: String, listen_port: u16) -> Self {
        Self {
            namespace,
            label_selector,
            listen_port,
            client: None,
            own_uid: None,
            target: None,
        }
    }

    /// Admits only the pods of endpoint `endpoint`'s target Deployment `deployment`
    /// ([`belongs_to`]).
    pub(crate) fn of_target(self, endpoint: String, deployment: String) -> Self {
        Self {
            target: Some((endpoint, deployment)),
            ..self
        }
    }

    /// Whether `pod` is a peer (every pod of the selector without a target).
    fn admits(&self, pod: &Pod) -> bool {
        self.target
            .as_ref()
            .is_none_or(|(endpoint, deployment)| belongs_to(pod, endpoint, deployment))
    }

    /// Also watches this pod (`uid`): once its deletion timestamp is set, the sink is told
    /// ([`MembershipSink::mark_terminating`]) and the sidecar drains.
    pub(crate) fn watching_own_pod(self, uid: String) -> Self {
        Self {
            own_uid: Some(uid),
            ..self
        }
    }

    /// Like [`KubernetesPods::new`], but talks to the API server through `client` (tests inject
    /// a mock here). A `Client` is bound to the Tokio runtime it was created on: create it on the
    /// runtime that will run the source.
    #[cfg(test)]
    pub(crate) fn with_client(
        client: Client,
        namespace: String,
        label_selector: String,
        listen_port: u16,
    ) -> Self {
        Self {
            client: Some(client),
            ..Self::new(namespace, label_selector, listen_port)
        }
    }

    /// The injected client, or a new default one, retried with a backoff until `shutdown`
    /// fires (then `None`).
    async fn client(&self, shutdown: &mut ShutdownWatch) -> Option<Client> {
        if let Some(client) = &self.client {
            return Some(client.clone());
        }
        let mut backoff = DefaultBackoff::default();
        loop {
            match Client::try_default().await {
                Ok(client) => return Some(client),
                Err(error) => {
                    let retry = backoff.next().unwrap_or(MAX_CLIENT_RETRY);
                    tracing::error!(
                        %error,
                        retry_in_ms = u64::try_from(retry.as_millis()).unwrap_or(u64::MAX),
                        "cannot create the Kubernetes client for the pod watch; membership stays unchanged"
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(retry) => {}
                        _ = shutdown.changed() => return None,
                    }
                }
            }
        }
    }
}

#[async_trait]
impl Membership for KubernetesPods {
    fn name(&self) -> &'static str {
        SOURCE
    }

    async fn run(&self, sink: MembershipSink, mut shutdown: ShutdownWatch) {
        let Some(client) = self.client(&mut shutdown).await else {
            return;
        };
        let api = Api::<Pod>::namespaced(client, &self.namespace);
        let mut config = watcher::Config::default();
        if !self.label_selector.is_empty() {
            config = config.labels(&self.label_selector);
        }
        let mut events = pin!(
            watcher::watcher(api, config)
                .default_backoff()
                .modify(|pod| pod.managed_fields_mut().clear())
        );
        tracing::info!(
            namespace = %self.namespace,
            selector = %self.label_selector,
            port = self.listen_port,
            "watching pods for membership"
        );
        let mut pods = PodSet::default();
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                _ = shutdown.changed() => return,
            };
            match event {
                Some(Ok(event)) => {
                    let changed = pods.apply(event);
                    if pods.listed {
                        sink.confirm();
                    }
                    if changed {
                        let peers = pods.live().filter(|pod| self.admits(pod));
                        sink.publish(SOURCE, snapshot_of(peers, self.listen_port));
                        if let Some(uid) = &self.own_uid
                            && is_terminating(pods.live(), uid)
                        {
                            sink.mark_terminating();
                        }
                    }
                }
                Some(Err(error)) => {
                    sink.failing();
                    tracing::warn!(
                        %error,
                        namespace = %self.namespace,
                        selector = %self.label_selector,
                        "pod watch failed; keeping the last good membership and retrying with backoff"
                    );
                }
                None => {
                    // The watcher retries forever; an end of stream is unexpected.
                    tracing::error!(
                        namespace = %self.namespace,
                        "pod watch ended; membership stays as it is"
                    );
                    return;
                }
            }
        }
    }
}

/// The pods the watcher has reported, keyed by UID, with the relist in progress.
#[derive(Debug, Default)]
struct PodSet {
    live: HashMap<String, Pod>,
    /// Pods of the list in progress (`Init` … `InitDone`); replaces `live` on `InitDone`.
    relist: Option<HashMap<String, Pod>>,
    /// A first complete list arrived.
    listed: bool,
}

impl PodSet {
    /// Applies one watcher event; returns whether the live set may have changed.
    fn apply(&mut self, event: Event<Pod>) -> bool {
        match event {
            Event::Init => {
                self.relist = Some(HashMap::new());
                false
            }
            Event::InitApply(pod) => {
                if let Some(uid) = uid_of(&pod) {
                    self.relist
                        .get_or_insert_with(HashMap::new)
                        .insert(uid, pod);
                }
                false
            }
            Event::InitDone => {
                self.live = self.relist.take().unwrap_or_default();
                self.listed = true;
                true
            }
            Event::Apply(pod) => match uid_of(&pod) {
                Some(uid) => {
                    self.live.insert(uid, pod);
                    true
                }
                None => false,
            },
            Event::Delete(pod) => match uid_of(&pod) {
                Some(uid) => self.live.remove(&uid).is_some(),
                None => false,
            },
        }
    }

    fn live(&self) -> impl Iterator<Item = &Pod> {
        self.live.values()
    }
}

/// The pod's UID, if it has a non-empty one (every pod from the API server does).
fn uid_of(pod: &Pod) -> Option<String> {
    let uid = pod.metadata.uid.as_deref().filter(|u| !u.is_empty());
    if uid.is_none() {
        tracing::debug!(pod = %pod.name_any(), "ignoring a pod without a uid");
    }
    uid.map(str::to_owned)
}

/// The membership state of `pod` (first matching rule):
/// phase `Succeeded`/`Failed` → [`PeerState::Gone`]; `deletionTimestamp` set →
/// [`PeerState::Draining`]; condition `Ready` = `"True"` → [`PeerState::Routable`]; otherwise
/// [`PeerState::Draining`] (running but not ready, or not started yet).
pub(crate) fn state_of(pod: &Pod) -> PeerState {
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return PeerState::Gone;
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return PeerState::Draining;
    }
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
    if ready {
        PeerState::Routable
    } else {
        PeerState::Draining
    }
}

/// The [`Peer`] of `pod`, whose MCP listener is `status.podIP` on its sidecar container's `mcp`
/// port (`listen_port` when it names none) and whose peer listener is on its `tether-peer` port.
/// A pod's own ports keep both sides of a rollout that changes them in reach of each other.
///
/// `None` when the pod has no UID or no (parseable) `status.podIP` yet: such a pod cannot
/// receive requests and is left out of the snapshot. The name falls back to the UID; the revision
/// is the `pod-template-hash` label, empty when absent.
pub fn peer_of(pod: &Pod, listen_port: u16) -> Option<Peer> {
    let uid = pod.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    let ip: IpAddr = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
    Some(Peer {
        uid: uid.to_owned(),
        name: pod.metadata.name.clone().unwrap_or_else(|| uid.to_owned()),
        address: SocketAddr::new(ip, sidecar_port(pod, MCP_PORT_NAME).unwrap_or(listen_port)),
        peer_port: sidecar_port(pod, PEER_PORT_NAME),
        state: state_of(pod),
        revision: pod
            .labels()
            .get(REVISION_LABEL)
            .cloned()
            .unwrap_or_default(),
    })
}

/// The port named `name` of the pod's `tether-sidecar` container (init or regular).
fn sidecar_port(pod: &Pod, name: &str) -> Option<u16> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| c.name == SIDECAR_CONTAINER)?
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .filter(|p| *p != 0)
}

/// Whether `pod` belongs to endpoint `endpoint` targeting Deployment `deployment`: its template
/// carries [`ENDPOINT_ANNOTATION`] naming the endpoint, and its controller is a ReplicaSet of
/// the Deployment (named `<deployment>-<pod-template-hash>`).
pub(crate) fn belongs_to(pod: &Pod, endpoint: &str, deployment: &str) -> bool {
    let annotated = pod
        .annotations()
        .get(ENDPOINT_ANNOTATION)
        .is_some_and(|e| e == endpoint);
    let hash = pod.labels().get(REVISION_LABEL);
    let owned = pod.owner_references().iter().any(|o| {
        o.controller == Some(true)
            && o.kind == "ReplicaSet"
            && o.name
                .strip_prefix(deployment)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|rest| hash.is_some_and(|h| h == rest))
    });
    annotated && owned
}

/// Whether the pod with `uid` among `pods` has its deletion timestamp set.
pub(crate) fn is_terminating<'a>(pods: impl IntoIterator<Item = &'a Pod>, uid: &str) -> bool {
    pods.into_iter()
        .any(|p| p.metadata.uid.as_deref() == Some(uid) && p.metadata.deletion_timestamp.is_some())
}

/// The snapshot of `pods`: one [`Peer`] per pod that has one ([`peer_of`]), oldest first by
/// `metadata.creationTimestamp`, ties broken by name, then UID (a pod without a creation time
/// sorts first).
pub(crate) fn snapshot_of<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    listen_port: u16,
) -> Snapshot {
    let mut aged: Vec<_> = pods
        .into_iter()
        .filter_map(|pod| {
            let peer = peer_of(pod, listen_port)?;
            Some((pod.metadata.creation_timestamp.clone(), peer))
        })
        .collect();
    aged.sort_by(|(a_time, a), (b_time, b)| {
        a_time
            .cmp(b_time)
            .then_with(|| a.name.cmp(&b.name))
            .then_with(|| a.uid.cmp(&b.uid))
    });
    Snapshot {
        peers: aged.into_iter().map(|(_, peer)| peer).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use http::{Method, Request, Response, StatusCode};
    use kube::client::Body;
    use serde_json::{Value, json};

    use crate::metrics::Metrics;

    const PORT: u16 = 8080;
    const NAMESPACE: &str = "tether-test";
    const SELECTOR: &str = "app=weather";
    const STEP: Duration = Duration::from_secs(10);

    /// A pod as the API server returns it, as JSON: created at second `created` of the day,
    /// ready or not, with an IP (`10.0.0.<ip>`) unless `ip` is 0.
    fn pod_json(name: &str, created: u32, ip: u8, ready: bool) -> Value {
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "uid": format!("uid-{name}"),
                "resourceVersion": "1",
                "creationTimestamp": format!("2026-01-01T00:00:{created:02}Z"),
                "labels": {"app": "weather", "pod-template-hash": "rev1"},
                "annotations": {ENDPOINT_ANNOTATION: "weather"},
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "weather-rev1",
                    "uid": "rs-uid", "controller": true,
                }],
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            },
        });
        if ip != 0 {
            pod["status"]["podIP"] = json!(format!("10.0.0.{ip}"));
        }
        pod
    }

    fn pod(name: &str, created: u32, ip: u8, ready: bool) -> Pod {
        serde_json::from_value(pod_json(name, created, ip, ready)).unwrap()
    }

    fn expect(name: &str, ip: u8, state: PeerState) -> Peer {
        Peer {
            uid: format!("uid-{name}"),
            name: name.into(),
            address: SocketAddr::from(([10, 0, 0, ip], PORT)),
            peer_port: None,
            state,
            revision: "rev1".into(),
        }
    }

    #[test]
    fn only_pods_of_the_endpoints_target_are_peers() {
        let ours = pod_json("a", 1, 1, true);
        assert!(belongs_to(
            &serde_json::from_value(ours.clone()).unwrap(),
            "weather",
            "weather"
        ));
        let variant = |path: &str, value: Value| {
            let mut p = ours.clone();
            *p.pointer_mut(path).unwrap() = value;
            serde_json::from_value::<Pod>(p).unwrap()
        };
        let refused = [
            ("no annotation", variant("/metadata/annotations", json!({}))),
            (
                "another endpoint's",
                variant(
                    &format!(
                        "/metadata/annotations/{}",
                        ENDPOINT_ANNOTATION.replace('/', "~1")
                    ),
                    json!("other"),
                ),
            ),
            ("no owner", variant("/metadata/ownerReferences", json!([]))),
            (
                "another Deployment's ReplicaSet",
                variant("/metadata/ownerReferences/0/name", json!("weatherx-rev1")),
            ),
            (
                "a ReplicaSet of another revision",
                variant("/metadata/ownerReferences/0/name", json!("weather-rev2")),
            ),
            (
                "not the controller",
                variant("/metadata/ownerReferences/0/controller", json!(false)),
            ),
            (
                "a StatefulSet's",
                variant("/metadata/ownerReferences/0/kind", json!("StatefulSet")),
            ),
        ];
        for (what, pod) in refused {
            assert!(!belongs_to(&pod, "weather", "weather"), "{what}");
        }
    }

    #[test]
    fn a_ready_running_pod_is_routable() {
        let peer = peer_of(&pod("a", 1, 1, true), PORT).unwrap();
        assert_eq!(peer, expect("a", 1, PeerState::Routable));
    }

    #[test]
    fn a_pod_is_reached_on_its_own_sidecar_ports() {
        let mut json = pod_json("a", 1, 1, true);
        json["spec"] = serde_json::json!({
            "containers": [{"name": "server", "ports": [{"name": "mcp", "containerPort": 3000}]}],
            "initContainers": [{"name": SIDECAR_CONTAINER, "ports": [
                {"name": MCP_PORT_NAME, "containerPort": 8181},
                {"name": "tether-admin", "containerPort": 9901},
                {"name": PEER_PORT_NAME, "containerPort": 9992},
            ]}],
        });
        let injected: Pod = serde_json::from_value(json).unwrap();
        let peer = peer_of(&injected, PORT).unwrap();
        assert_eq!(peer.address, SocketAddr::from(([10, 0, 0, 1], 8181)));
        assert_eq!(peer.peer_port, Some(9992));
        // Without named sidecar ports (a pod not injected by the operator): this pod's ports.
        let plain = peer_of(&pod("b", 1, 2, true), PORT).unwrap();
        assert_eq!((plain.address.port(), plain.peer_port), (PORT, None));
    }

    #[test]
    fn a_pod_that_is_not_ready_is_draining() {
        assert_eq!(state_of(&pod("a", 1, 1, false)), PeerState::Draining);
        let mut no_conditions = pod("a", 1, 1, true);
        no_conditions.status.as_mut().unwrap().conditions = None;
        assert_eq!(state_of(&no_conditions), PeerState::Draining);
        let mut no_status = pod("a", 1, 1, true);
        no_status.status = None;
        assert_eq!(state_of(&no_status), PeerState::Draining);
    }

    #[test]
    fn a_terminating_pod_is_draining_even_when_ready() {
        let mut json = pod_json("a", 1, 1, true);
        json["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:01:00Z");
        let terminating: Pod = serde_json::from_value(json).unwrap();
        assert_eq!(state_of(&terminating), PeerState::Draining);
        let other = pod("b", 1, 2, true);
        assert!(is_terminating([&other, &terminating], "uid-a"));
        assert!(!is_terminating([&other, &terminating], "uid-b"));
        assert!(!is_terminating([&other], "uid-a"));
    }

    #[test]
    fn finished_pods_are_gone() {
        for phase in ["Succeeded", "Failed"] {
            let mut json = pod_json("a", 1, 1, true);
            json["status"]["phase"] = json!(phase);
            json["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:01:00Z");
            let finished: Pod = serde_json::from_value(json).unwrap();
            assert_eq!(state_of(&finished), PeerState::Gone, "{phase}");
        }
    }

    #[test]
    fn pods_without_an_ip_or_uid_are_omitted() {
        assert_eq!(peer_of(&pod("a", 1, 0, true), PORT), None);
        let mut bad_ip = pod("a", 1, 1, true);
        bad_ip.status.as_mut().unwrap().pod_ip = Some("not-an-ip".into());
        assert_eq!(peer_of(&bad_ip, PORT), None);
        let mut no_uid = pod("a", 1, 1, true);
        no_uid.metadata.uid = None;
        assert_eq!(peer_of(&no_uid, PORT), None);
        let snap = snapshot_of(&[pod("a", 1, 0, true), pod("b", 2, 2, true)], PORT);
        assert_eq!(snap.peers, vec![expect("b", 2, PeerState::Routable)]);
    }

    #[test]
    fn ipv6_pod_ips_get_the_listen_port() {
        let mut v6 = pod("a", 1, 1, true);
        v6.status.as_mut().unwrap().pod_ip = Some("fd00::7".into());
        assert_eq!(
            peer_of(&v6, PORT).unwrap().address,
            "[fd00::7]:8080".parse::<SocketAddr>().unwrap()
        );
    }

    #[test]
    fn the_revision_is_the_pod_template_hash() {
        let mut json = pod_json("a", 1, 1, true);
        json["metadata"]["labels"]["pod-template-hash"] = json!("5d8f7c9b6");
        let labelled: Pod = serde_json::from_value(json).unwrap();
        assert_eq!(peer_of(&labelled, PORT).unwrap().revision, "5d8f7c9b6");
        let mut unlabelled = pod("a", 1, 1, true);
        unlabelled.metadata.labels = None;
        assert_eq!(peer_of(&unlabelled, PORT).unwrap().revision, "");
    }

    #[test]
    fn snapshots_are_oldest_first_then_by_name() {
        let pods = [
            pod("young", 30, 3, true),
            pod("twin-b", 10, 2, true),
            pod("old", 5, 1, false),
            pod("twin-a", 10, 4, true),
        ];
        let names: Vec<_> = snapshot_of(&pods, PORT)
            .peers
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["old", "twin-a", "twin-b", "young"]);
    }

    #[test]
    fn a_relist_replaces_the_set() {
        let mut set = PodSet::default();
        assert!(set.apply(Event::Apply(pod("a", 1, 1, true))));
        assert!(!set.apply(Event::Init));
        assert!(!set.apply(Event::InitApply(pod("b", 2, 2, true))));
        assert_eq!(set.live().count(), 1, "the old set serves until InitDone");
        assert!(set.apply(Event::InitDone));
        let snap = snapshot_of(set.live(), PORT);
        assert_eq!(snap.peers, vec![expect("b", 2, PeerState::Routable)]);
        assert!(set.apply(Event::Delete(pod("b", 2, 2, true))));
        assert!(!set.apply(Event::Delete(pod("b", 2, 2, true))));
        assert_eq!(set.live().count(), 0);
    }

    // ---- "events in, snapshots out" against a mock API server ----

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    /// The query parameters of `request`, decoded.
    fn query(request: &Request<Body>) -> HashMap<String, String> {
        request
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (k.to_owned(), v.replace("%3D", "=").replace("%2C", ","))
            })
            .collect()
    }

    /// Waits for the watcher's next request, checks it is a LIST (`watch == false`) or a WATCH
    /// of our pods, and returns its query and the responder.
    async fn next_request(
        handle: &mut Handle,
        watch: bool,
    ) -> (
        HashMap<String, String>,
        tower_test::mock::SendResponse<Response<Body>>,
    ) {
        let (request, respond) = tokio::time::timeout(STEP, handle.next_request())
            .await
            .expect("the watcher sends a request")
            .expect("the client is alive");
        assert_eq!(request.method(), Method::GET);
        assert_eq!(
            request.uri().path(),
            format!("/api/v1/namespaces/{NAMESPACE}/pods")
        );
        let q = query(&request);
        assert_eq!(q.get("labelSelector").map(String::as_str), Some(SELECTOR));
        assert_eq!(
            q.get("watch").map(String::as_str) == Some("true"),
            watch,
            "{q:?}"
        );
        (q, respond)
    }

    fn ok(body: Vec<u8>) -> Response<Body> {
        Response::builder()
            .status(StatusCode::OK)
            .body(Body::from(body))
            .unwrap()
    }

    fn pod_list(resource_version: &str, items: Vec<Value>) -> Response<Body> {
        let list = json!({
            "apiVersion": "v1",
            "kind": "PodList",
            "metadata": {"resourceVersion": resource_version},
            "items": items,
        });
        ok(serde_json::to_vec(&list).unwrap())
    }

    /// A watch response: newline-delimited watch events, then the end of the stream.
    fn watch_events(events: &[(&str, Value)]) -> Response<Body> {
        let mut body = Vec::new();
        for (kind, object) in events {
            serde_json::to_writer(&mut body, &json!({"type": kind, "object": object})).unwrap();
            body.push(b'\n');
        }
        ok(body)
    }

    fn with_rv(mut pod: Value, rv: &str) -> Value {
        pod["metadata"]["resourceVersion"] = json!(rv);
        pod
    }

    async fn wait_for(sink: &MembershipSink, expected: &[Peer]) {
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            if sink.view().snapshot().peers == expected {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "snapshot never became {expected:#?}; last: {:#?}",
                sink.view().snapshot()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn watch_events_become_snapshots() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let source = KubernetesPods::with_client(client, NAMESPACE.into(), SELECTOR.into(), PORT)
            .watching_own_pod("uid-a".into())
            .of_target("weather".into(), "weather".into());
        assert_eq!(source.name(), "kubernetes");
        let sink = MembershipSink::new(Snapshot::default(), Arc::new(Metrics::new()));
        assert!(!sink.is_known(), "no list yet: the pod is not ready");
        let deleting = sink.terminating();
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let task = {
            let sink = sink.clone();
            tokio::spawn(async move { source.run(sink, shutdown).await })
        };

        // 1. The initial LIST: two ready pods of the target, and a ready pod that matches the
        //    selector but is not the target's.
        let (_, respond) = next_request(&mut handle, false).await;
        let mut stranger = pod_json("s", 1, 9, true);
        stranger["metadata"]["annotations"] = json!({});
        respond.send_response(pod_list(
            "100",
            vec![
                pod_json("a", 1, 1, true),
                pod_json("b", 2, 2, true),
                stranger,
            ],
        ));
        wait_for(
            &sink,
            &[
                expect("a", 1, PeerState::Routable),
                expect("b", 2, PeerState::Routable),
            ],
        )
        .await;
        assert!(sink.is_known(), "listed: the pod may be ready");
        assert_eq!(sink.age(std::time::Instant::now()), Duration::ZERO);
        assert!(!*deleting.borrow(), "this pod is not being deleted yet");

        // 2. WATCH from the list's version: `a` starts terminating, a new ready `c` appears.
        let (q, respond) = next_request(&mut handle, true).await;
        assert_eq!(q.get("resourceVersion").map(String::as_str), Some("100"));
        let mut terminating = with_rv(pod_json("a", 1, 1, true), "101");
        terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:05:00Z");
        respond.send_response(watch_events(&[
            ("MODIFIED", terminating),
            ("ADDED", with_rv(pod_json("c", 3, 3, true), "102")),
        ]));
        wait_for(
            &sink,
            &[
                expect("a", 1, PeerState::Draining),
                expect("b", 2, PeerState::Routable),
                expect("c", 3, PeerState::Routable),
            ],
        )
        .await;
        assert!(
            *deleting.borrow(),
            "this pod's deletion timestamp starts its drain"
        );

        // 3. The stream ended; the watcher resumes from the last event: `a` is deleted and `b`
        //    fails its readiness probe.
        let (q, respond) = next_request(&mut handle, true).await;
        assert_eq!(q.get("resourceVersion").map(String::as_str), Some("102"));
        respond.send_response(watch_events(&[
            ("DELETED", with_rv(pod_json("a", 1, 1, true), "103")),
            ("MODIFIED", with_rv(pod_json("b", 2, 2, false), "104")),
        ]));
        wait_for(
            &sink,
            &[
                expect("b", 2, PeerState::Draining),
                expect("c", 3, PeerState::Routable),
            ],
        )
        .await;

        // 4. The version expired (410 Gone): the last good membership stays while the watcher
        //    backs off, then relists, and the new list replaces the set.
        let (_, respond) = next_request(&mut handle, true).await;
        let gone = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "too old resource version: 104 (200)", "reason": "Expired", "code": 410,
        });
        respond.send_response(watch_events(&[("ERROR", gone)]));
        let (_, respond) = next_request(&mut handle, false).await;
        assert_eq!(
            sink.view().snapshot().peers.len(),
            2,
            "the last good membership is kept"
        );
        let mut failed = pod_json("d", 4, 4, true);
        failed["status"]["phase"] = json!("Failed");
        respond.send_response(pod_list(
            "200",
            vec![
                pod_json("c", 3, 3, true),
                failed,
                pod_json("e", 5, 0, false),
                pod_json("f", 6, 6, true),
            ],
        ));
        wait_for(
            &sink,
            &[
                expect("c", 3, PeerState::Routable),
                expect("d", 4, PeerState::Gone),
                expect("f", 6, PeerState::Routable),
            ],
        )
        .await;

        // 5. Shutdown ends `run`, even with a watch request in flight.
        let _pending = next_request(&mut handle, true).await;
        stop.send(true).unwrap();
        tokio::time::timeout(STEP, task)
            .await
            .expect("run returns on shutdown")
            .unwrap();
    }
}

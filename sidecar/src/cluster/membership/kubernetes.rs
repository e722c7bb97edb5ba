//! The Kubernetes membership source: a watch on the EndpointSlices of the endpoint's peer
//! Service, merged with what each peer reports of itself.
//!
//! [`EndpointSlices`] runs a kube-runtime [`watcher`] on the EndpointSlices of one namespace
//! that the EndpointSlice controller made for the peer Service ([`selector`]; [`slices`]: which
//! pods, their addresses and conditions) and asks every pod it finds for its [`Report`]
//! (revision, start, ports; [`super::reports`]). After every change it publishes a [`Snapshot`], oldest first,
//! into the [`MembershipSink`]. How an endpoint becomes a [`Peer`] ([`snapshot_of`]), how watch
//! errors keep the last good view, and the Role the sidecar's service account needs:
//! `docs/design/routing.md#kubernetes-endpointslice-watch` and
//! `docs/design/routing.md#the-sidecars-role`. Before the watcher's first complete list the sink
//! keeps its initial view; every relist (`Init` … `InitDone`, after a restart or a `410 Gone`)
//! replaces the whole set.
//!
//! A view that does not hold this pod (the Service's slices were deleted, or the controller has
//! not listed the new pod yet) is not published unless this pod drains: the last good view stays
//! and the sink counts its source as failing ([`MembershipSink::failing`]), so the view ages and
//! requests for sessions it cannot place get 503, not 404. The first view is published (and
//! confirmed, [`MembershipSink::confirm`]) only once the slices list this pod. What the watch
//! does with each view is decided by a pure [`judge`] (its [`Verdict`]: wait, hold the last good
//! view, or publish); the watch loop only carries the verdict out.
//!
//! A pod whose report is not known yet (not asked yet, unreachable, or not holding the
//! endpoint's key ring) is [`PeerState::Draining`] whatever its conditions say: it keeps the
//! sessions it holds reachable, but it gets no new session and no handoff and cannot make its
//! revision the newest. Its ask is retried every [`ASK_RETRY`] for as long as it learns nothing.
//!
//! Only the endpoint's pods are peers: the peer Service selects the target Deployment's
//! `matchLabels` and the pod-template label the operator's injection adds
//! (`mcp.tether.dev/endpoint: <endpoint>`), and a pod becomes routable only once it proved, over
//! the authenticated peer protocol, that it holds the endpoint's key ring.
//!
//! This pod's own endpoint turning `terminating` (its deletion) starts its drain
//! ([`MembershipSink::mark_terminating`], `docs/design/handoff.md#when-a-pod-drains`).
//!
//! # Runtime
//! The [`kube::Client`] is created inside [`Membership::run`] (with [`tether_crds::client::with_user_agent`]:
//! in-cluster service-account config, or `KUBECONFIG` outside a cluster), i.e. on the runtime of
//! the pingora background service that runs the source, never before pingora starts its
//! runtimes. A client that cannot be created is logged as an error and retried with the same
//! backoff until shutdown.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, DefaultBackoff};
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use pingora::server::ShutdownWatch;
use tokio::task::JoinSet;

use super::reports::{Exchange, Report, Reports};
use super::slices::{Endpoint, SliceSet, address_type};
use super::{Membership, MembershipSink, Peer, PeerState, Snapshot, Source};

/// This source, as logs and `tether_membership_changes_total{source}` name it.
pub(crate) const SOURCE: Source = Source::Kubernetes;
/// The label an EndpointSlice carries naming its Service.
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label naming who manages an EndpointSlice.
pub(crate) const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// [`MANAGED_BY_LABEL`] of the slices the EndpointSlice controller makes (the only ones read).
pub(crate) const MANAGED_BY_CONTROLLER: &str = "endpointslice-controller.k8s.io";
/// How long after an ask that left a pod's report unknown the pod is asked again.
pub(crate) const ASK_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two attempts to create the Kubernetes client.
const MAX_CLIENT_RETRY: Duration = Duration::from_secs(30);

/// The Kubernetes membership source (see the [module docs](self)).
pub(crate) struct EndpointSlices {
    namespace: String,
    service: String,
    /// This pod's IP: slices of its address family are read.
    pod_ip: IpAddr,
    reports: Arc<Reports>,
    exchange: Arc<dyn Exchange>,
    client: Option<Client>,
}

impl fmt::Debug for EndpointSlices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointSlices")
            .field("namespace", &self.namespace)
            .field("service", &self.service)
            .field("injected_client", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

impl EndpointSlices {
    /// A source watching the EndpointSlices of Service `service` in `namespace`, for the pod
    /// on `pod_ip` whose report (and UID) `reports` holds; peers' reports are asked through
    /// `exchange` and kept in `reports`.
    ///
    /// The Kubernetes client is created when [`Membership::run`] starts, with
    /// [`tether_crds::client::with_user_agent`] (in-cluster config or `KUBECONFIG`, the sidecar's `User-Agent`).
    pub(crate) fn new(
        namespace: String,
        service: String,
        pod_ip: IpAddr,
        reports: Arc<Reports>,
        exchange: Arc<dyn Exchange>,
    ) -> Self {
        Self {
            namespace,
            service,
            pod_ip,
            reports,
            exchange,
            client: None,
        }
    }

    /// The same source talking to the API server through `client` (tests inject a mock here).
    /// A `Client` is bound to the Tokio runtime it was created on: create it on the runtime that
    /// will run the source.
    #[cfg(test)]
    pub(crate) fn with_client(self, client: Client) -> Self {
        Self {
            client: Some(client),
            ..self
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
            match tether_crds::client::with_user_agent(concat!(
                "tether-sidecar/v",
                env!("CARGO_PKG_VERSION")
            ))
            .await
            {
                Ok(client) => return Some(client),
                Err(error) => {
                    let retry = backoff.next().unwrap_or(MAX_CLIENT_RETRY);
                    tracing::error!(
                        %error,
                        retry_in_ms = u64::try_from(retry.as_millis()).unwrap_or(u64::MAX),
                        "cannot create the Kubernetes client for the EndpointSlice watch; membership stays unchanged"
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(retry) => {}
                        _ = shutdown.changed() => return None,
                    }
                }
            }
        }
    }

    /// Starts an ask of every pod of `endpoints` whose report is unknown and that is not being
    /// asked already; the peer port tried first is the slice's, then this pod's own (a pod of
    /// the same template when a rollout changes `spec.peer.port`). The ask records the report it
    /// gets; while the pod is still unknown after it (no answer, a report [`Report::valid`]
    /// rejects, or no room left in [`Reports`]) it waits [`ASK_RETRY`] before it ends, so the
    /// next ask of that pod comes one retry later at the earliest.
    fn ask_unknown(
        &self,
        endpoints: &HashMap<&str, Endpoint>,
        asking: &Arc<Mutex<HashSet<String>>>,
        asks: &mut JoinSet<()>,
    ) {
        let own = self.reports.own();
        for endpoint in endpoints.values() {
            if self.reports.get(&endpoint.uid).is_some() {
                continue;
            }
            let Some(guard) = Asking::start(asking, &endpoint.uid) else {
                continue;
            };
            let mut ports = vec![endpoint.peer_port.unwrap_or(own.peer_port)];
            if !ports.contains(&own.peer_port) {
                ports.push(own.peer_port);
            }
            let (uid, ip) = (endpoint.uid.clone(), endpoint.ip);
            let (exchange, reports) = (Arc::clone(&self.exchange), Arc::clone(&self.reports));
            asks.spawn(async move {
                let _asking = guard;
                for port in ports {
                    let peer = SocketAddr::new(ip, port);
                    if let Some(report) = exchange.exchange(&uid, peer, reports.own()).await {
                        reports.record(&uid, report);
                        break;
                    }
                }
                if reports.get(&uid).is_none() {
                    tokio::time::sleep(ASK_RETRY).await;
                }
            });
        }
    }
}

/// A pod being asked for its report: its UID stays in the set of pods being asked until this
/// guard drops, however its ask ends (done, panicked, or aborted with the source).
struct Asking {
    set: Arc<Mutex<HashSet<String>>>,
    uid: String,
}

impl Asking {
    /// Adds `uid` to `set`; `None` when it is being asked already.
    fn start(set: &Arc<Mutex<HashSet<String>>>, uid: &str) -> Option<Self> {
        set.lock().insert(uid.to_owned()).then(|| Self {
            set: Arc::clone(set),
            uid: uid.to_owned(),
        })
    }
}

impl Drop for Asking {
    fn drop(&mut self) {
        self.set.lock().remove(&self.uid);
    }
}

#[async_trait]
impl Membership for EndpointSlices {
    fn name(&self) -> &'static str {
        SOURCE.label()
    }

    async fn run(&self, sink: MembershipSink, mut shutdown: ShutdownWatch) {
        let Some(client) = self.client(&mut shutdown).await else {
            return;
        };
        let api = Api::<EndpointSlice>::namespaced(client, &self.namespace);
        let config = watcher::Config::default().labels(&selector(&self.service));
        let mut events = pin!(
            watcher::watcher(api, config)
                .default_backoff()
                .modify(|slice| slice.managed_fields_mut().clear())
        );
        tracing::info!(
            namespace = %self.namespace,
            service = %self.service,
            "watching the peer Service's EndpointSlices for membership"
        );
        let mut slices = SliceSet::new(address_type(self.pod_ip));
        let mut reported = self.reports.changes();
        let asking: Arc<Mutex<HashSet<String>>> = Arc::default();
        let mut asks: JoinSet<()> = JoinSet::new();
        // A spell without this pod is on: a watch event's view lacked it since the last one
        // published (a failing `Verdict::Hold` starts it, a confirmed `Verdict::Publish` ends it).
        let mut without_self = false;
        loop {
            // Whether the watch delivered an event (the view may be confirmed as current).
            let mut watched = false;
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(event)) => {
                        slices.apply(event);
                        watched = true;
                    }
                    Some(Err(error)) => {
                        sink.failing();
                        tracing::warn!(
                            %error,
                            namespace = %self.namespace,
                            service = %self.service,
                            "EndpointSlice watch failed; keeping the last good membership and retrying with backoff"
                        );
                        continue;
                    }
                    None => {
                        // The watcher retries forever; an end of stream is unexpected.
                        tracing::error!(
                            namespace = %self.namespace,
                            "EndpointSlice watch ended; membership stays as it is"
                        );
                        return;
                    }
                },
                Some(_) = asks.join_next() => {}
                Ok(()) = reported.changed() => {}
                _ = shutdown.changed() => return,
            }
            let endpoints = slices.endpoints();
            let own = endpoints.get(self.reports.own_uid());
            let draining = sink.is_terminating();
            match judge(slices.listed, own, draining, watched, without_self) {
                Verdict::Wait => {}
                Verdict::Hold {
                    failing,
                    warn_missing,
                } => {
                    if failing {
                        sink.failing();
                        without_self = true;
                    }
                    if warn_missing {
                        tracing::warn!(
                            namespace = %self.namespace,
                            service = %self.service,
                            pods = endpoints.len(),
                            "the peer Service's EndpointSlices do not list this pod; keeping the last good membership"
                        );
                    }
                    self.ask_unknown(&endpoints, &asking, &mut asks);
                }
                Verdict::Publish {
                    listed_again,
                    confirm,
                    terminating,
                } => {
                    if listed_again {
                        tracing::info!(
                            namespace = %self.namespace,
                            service = %self.service,
                            "the peer Service's EndpointSlices list this pod again"
                        );
                    }
                    if confirm {
                        sink.confirm();
                        without_self = false;
                    }
                    if terminating {
                        sink.mark_terminating();
                    }
                    self.reports.retain(|uid| endpoints.contains_key(uid));
                    sink.publish(SOURCE, snapshot_of(endpoints.values(), &self.reports));
                    self.ask_unknown(&endpoints, &asking, &mut asks);
                }
            }
        }
    }
}

/// What the EndpointSlice watch does with its view after a watch event or a change of the
/// peers' reports ([`judge`]). `EndpointSlices::run` executes it: the fields' effects in their
/// order, then the variant's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The watcher's first complete list has not arrived: nothing is done (the sink keeps its
    /// initial view).
    Wait,
    /// The view does not hold this pod, which does not drain (the Service's slices were
    /// deleted, or the controller has not listed the new pod yet): it is not current (every
    /// other pod's sessions would have an unknown home) and is not published, the last good
    /// view stays in force; the pods of the view whose report is unknown are still asked.
    Hold {
        /// The view came from a watch event: the sink counts its source as failing
        /// ([`MembershipSink::failing`]), so the last good view ages, and a spell without this
        /// pod is on until a watch event's view is published.
        failing: bool,
        /// The event is the spell's first: a warning is logged (once per spell).
        warn_missing: bool,
    },
    /// The view is published: the reports kept of pods it no longer lists are dropped, its
    /// snapshot is published ([`snapshot_of`]) and its pods whose report is unknown are asked.
    Publish {
        /// The event ends a spell without this pod: that is logged.
        listed_again: bool,
        /// The view came from a watch event: it is confirmed current
        /// ([`MembershipSink::confirm`]), and a spell without this pod ends.
        confirm: bool,
        /// This pod's own endpoint is `terminating`: its drain starts
        /// ([`MembershipSink::mark_terminating`], idempotent).
        terminating: bool,
    },
}

/// What the EndpointSlice watch does with its view ([`Verdict`]), given whether the watcher's
/// first complete list arrived (`listed`), this pod's own endpoint in the view (`own`), whether
/// this pod drains already (`draining`: its endpoint turned `terminating` before, so a view
/// without it is published), whether the view came from a watch event (`watched`; else from a
/// change of the peers' reports) and whether a spell without this pod is on (`without_self`: a
/// watch event's view lacked it since the last one published). Pure: the rules of
/// `docs/design/routing.md#kubernetes-endpointslice-watch`, without the I/O.
pub(crate) fn judge(
    listed: bool,
    own: Option<&Endpoint>,
    draining: bool,
    watched: bool,
    without_self: bool,
) -> Verdict {
    if !listed {
        return Verdict::Wait;
    }
    match own {
        None if !draining => Verdict::Hold {
            failing: watched,
            warn_missing: watched && !without_self,
        },
        _ => Verdict::Publish {
            listed_again: watched && without_self,
            confirm: watched,
            terminating: own.is_some_and(|own| own.terminating),
        },
    }
}

/// The label selector of the EndpointSlices watched for Service `service`: those the
/// EndpointSlice controller made for it (a slice anyone else made is not read).
pub(crate) fn selector(service: &str) -> String {
    format!("{SERVICE_NAME_LABEL}={service},{MANAGED_BY_LABEL}={MANAGED_BY_CONTROLLER}")
}

/// The [`Peer`] of `endpoint`, given its `report` (`None`: not known yet) and this pod's own
/// report `own`: reached on its IP and the ports it reports, else the slice's ports (else this
/// pod's); its state the conditions' ([`Endpoint::state`]) once its report is known,
/// [`PeerState::Draining`] before; its revision the reported one.
pub(crate) fn peer_of(endpoint: &Endpoint, report: Option<&Report>, own: &Report) -> Peer {
    let listen_port = report
        .map(|r| r.listen_port)
        .or(endpoint.mcp_port)
        .unwrap_or(own.listen_port);
    Peer {
        uid: endpoint.uid.clone(),
        name: endpoint.name.clone(),
        address: SocketAddr::new(endpoint.ip, listen_port),
        peer_port: report.map(|r| r.peer_port).or(endpoint.peer_port),
        state: report.map_or(PeerState::Draining, |_| endpoint.state()),
        revision: report.map(|r| r.revision.clone()).unwrap_or_default(),
    }
}

/// The snapshot of `endpoints` with what `reports` knows: one [`Peer`] each ([`peer_of`]),
/// oldest first by reported start, ties broken by name, then UID (a pod whose report is unknown
/// sorts first).
pub(crate) fn snapshot_of<'a>(
    endpoints: impl IntoIterator<Item = &'a Endpoint>,
    reports: &Reports,
) -> Snapshot {
    let mut aged: Vec<(u64, Peer)> = endpoints
        .into_iter()
        .map(|endpoint| {
            let report = reports.get(&endpoint.uid);
            let started = report.as_ref().map_or(0, |r| r.started_ms);
            (started, peer_of(endpoint, report.as_ref(), reports.own()))
        })
        .collect();
    aged.sort_by(|(a_started, a), (b_started, b)| {
        a_started
            .cmp(b_started)
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

    use http::{Method, Request, Response, StatusCode};
    use kube::client::Body;
    use serde_json::{Value, json};

    use super::super::slices::tests::{endpoint_json, slice_json};

    const NAMESPACE: &str = "tether-test";
    const SERVICE: &str = "weather-peers";
    const STEP: Duration = Duration::from_secs(10);
    /// The ports the slices of the tests name.
    const MCP: u16 = 8080;
    const PEER: u16 = 9090;

    /// What pod `name` reports: revision `revision`, started at `started` ms, on the slices'
    /// ports.
    fn report(revision: &str, started: u64) -> Report {
        Report {
            revision: revision.into(),
            started_ms: started,
            listen_port: MCP,
            peer_port: PEER,
        }
    }

    /// This pod: `a`, of revision `r1`, started at 1.
    fn reports() -> Arc<Reports> {
        Arc::new(Reports::new("uid-a".into(), report("r1", 1)))
    }

    fn expect(name: &str, ip: u8, state: PeerState, revision: &str) -> Peer {
        Peer {
            uid: format!("uid-{name}"),
            name: name.into(),
            address: SocketAddr::from(([10, 0, 0, ip], MCP)),
            peer_port: Some(PEER),
            state,
            revision: revision.into(),
        }
    }

    /// Peers that answer an ask with a report set by the test (and the asks they got).
    #[derive(Default)]
    struct Peers {
        reports: parking_lot::Mutex<HashMap<String, Report>>,
        /// Every ask: the pod asked, where, and the report sent.
        asked: parking_lot::Mutex<Vec<(String, SocketAddr, Report)>>,
        /// Pods whose next ask panics (once).
        panics: parking_lot::Mutex<HashSet<String>>,
    }

    impl Peers {
        fn answers(&self, uid: &str, report: Report) {
            self.reports.lock().insert(uid.into(), report);
        }

        /// How often pod `uid` was asked.
        fn asks_of(&self, uid: &str) -> usize {
            self.asked.lock().iter().filter(|(u, ..)| u == uid).count()
        }
    }

    #[async_trait]
    impl Exchange for Peers {
        async fn exchange(&self, uid: &str, peer: SocketAddr, own: &Report) -> Option<Report> {
            self.asked.lock().push((uid.to_owned(), peer, own.clone()));
            assert!(!self.panics.lock().remove(uid), "the ask of {uid} panics");
            self.reports.lock().get(uid).cloned()
        }
    }

    fn endpoints(values: Vec<Value>) -> Vec<Endpoint> {
        super::super::slices::endpoints_of(
            &serde_json::from_value(slice_json("s", values)).unwrap(),
        )
    }

    #[test]
    fn the_judge_decides_what_each_view_gets() {
        let endpoint = |terminating: bool| Endpoint {
            uid: "uid-a".into(),
            name: "a".into(),
            ip: [10, 0, 0, 1].into(),
            mcp_port: Some(MCP),
            peer_port: Some(PEER),
            serving: !terminating,
            terminating,
        };
        let (serving, terminating) = (endpoint(false), endpoint(true));
        let hold = |failing, warn_missing| Verdict::Hold {
            failing,
            warn_missing,
        };
        let publish = |listed_again, confirm, terminating| Verdict::Publish {
            listed_again,
            confirm,
            terminating,
        };
        // (case, (listed, this pod's endpoint, draining, watched, without_self), verdict)
        let table = [
            (
                "not listed yet",
                (false, None, false, true, false),
                Verdict::Wait,
            ),
            (
                "not listed yet, a report changed",
                (false, None, false, false, false),
                Verdict::Wait,
            ),
            (
                "without this pod, a watch event, first",
                (true, None, false, true, false),
                hold(true, true),
            ),
            (
                "without this pod, a watch event, again",
                (true, None, false, true, true),
                hold(true, false),
            ),
            (
                "without this pod, a report changed",
                (true, None, false, false, true),
                hold(false, false),
            ),
            (
                "without this pod, which drains",
                (true, None, true, true, false),
                publish(false, true, false),
            ),
            (
                "with this pod after a spell without it",
                (true, Some(&serving), false, true, true),
                publish(true, true, false),
            ),
            (
                "with this pod terminating",
                (true, Some(&terminating), false, true, false),
                publish(false, true, true),
            ),
            (
                "with this pod terminating, draining already",
                (true, Some(&terminating), true, true, false),
                publish(false, true, true),
            ),
            (
                "with this pod",
                (true, Some(&serving), false, true, false),
                publish(false, true, false),
            ),
            (
                "with this pod, a report changed",
                (true, Some(&serving), false, false, false),
                publish(false, false, false),
            ),
        ];
        for (case, (listed, own, draining, watched, without_self), verdict) in table {
            assert_eq!(
                judge(listed, own, draining, watched, without_self),
                verdict,
                "{case}"
            );
        }
    }

    #[test]
    fn a_peer_is_routable_only_once_its_report_is_known() {
        let reports = reports();
        let eps = endpoints(vec![
            endpoint_json("a", 1, true, false),
            endpoint_json("b", 2, true, false),
        ]);
        let snap = snapshot_of(&eps, &reports);
        assert_eq!(
            snap.peers,
            [
                expect("b", 2, PeerState::Draining, ""),
                expect("a", 1, PeerState::Routable, "r1"),
            ],
            "b's report is unknown: draining, and sorted first"
        );
        assert_eq!(snap.newest_revision(), Some("r1"));
        reports.record("uid-b", report("r2", 2));
        let snap = snapshot_of(&eps, &reports);
        assert_eq!(
            snap.peers,
            [
                expect("a", 1, PeerState::Routable, "r1"),
                expect("b", 2, PeerState::Routable, "r2"),
            ]
        );
        assert_eq!(snap.newest_revision(), Some("r2"), "the youngest's");
    }

    #[test]
    fn a_peer_is_reached_on_the_ports_it_reports() {
        let reports = reports();
        let eps = endpoints(vec![endpoint_json("b", 2, true, false)]);
        let before = &snapshot_of(&eps, &reports).peers[0];
        assert_eq!(
            (before.address.port(), before.peer_port),
            (MCP, Some(PEER)),
            "the slice's ports until it reports"
        );
        // A rollout changed spec.listen.port and spec.peer.port: the Service names the new
        // ports, the pod of the old template still listens on its own.
        reports.record(
            "uid-b",
            Report {
                listen_port: 7070,
                peer_port: 7171,
                ..report("r0", 1)
            },
        );
        let after = &snapshot_of(&eps, &reports).peers[0];
        assert_eq!(after.address, SocketAddr::from(([10, 0, 0, 2], 7070)));
        assert_eq!(after.peer_port, Some(7171));
        // Without named ports in the slice: this pod's.
        let mut unnamed = slice_json("s", vec![endpoint_json("c", 3, true, false)]);
        unnamed["ports"] = json!([]);
        let eps = super::super::slices::endpoints_of(&serde_json::from_value(unnamed).unwrap());
        let peer = &snapshot_of(&eps, &reports).peers[0];
        assert_eq!((peer.address.port(), peer.peer_port), (MCP, None));
    }

    #[test]
    fn snapshots_are_oldest_first_by_reported_start_then_by_name() {
        let reports = reports();
        for (uid, started) in [("uid-young", 30), ("uid-twin-b", 10), ("uid-twin-a", 10)] {
            reports.record(uid, report("r1", started));
        }
        let eps = endpoints(vec![
            endpoint_json("young", 3, true, false),
            endpoint_json("twin-b", 2, true, false),
            endpoint_json("a", 1, false, false),
            endpoint_json("twin-a", 4, true, false),
            endpoint_json("unknown", 5, true, false),
        ]);
        let names: Vec<_> = snapshot_of(&eps, &reports)
            .peers
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["unknown", "a", "twin-a", "twin-b", "young"]);
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
                (
                    k.to_owned(),
                    v.replace("%3D", "=")
                        .replace("%2C", ",")
                        .replace("%2F", "/"),
                )
            })
            .collect()
    }

    /// Waits for the watcher's next request, checks it is a LIST (`watch == false`) or a WATCH
    /// of the peer Service's slices, and returns its query and the responder.
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
            format!("/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices")
        );
        let q = query(&request);
        assert_eq!(
            q.get("labelSelector").map(String::as_str),
            Some(
                format!(
                    "kubernetes.io/service-name={SERVICE},\
                     endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io"
                )
                .as_str()
            )
        );
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

    fn slice_list(resource_version: &str, items: Vec<Value>) -> Response<Body> {
        let list = json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSliceList",
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

    /// Slice `name` with `endpoints` at resource version `rv`.
    fn slice_at(name: &str, rv: &str, endpoints: Vec<Value>) -> Value {
        let mut slice = slice_json(name, endpoints);
        slice["metadata"]["namespace"] = json!(NAMESPACE);
        slice["metadata"]["resourceVersion"] = json!(rv);
        slice["metadata"]["labels"] =
            json!({SERVICE_NAME_LABEL: SERVICE, MANAGED_BY_LABEL: MANAGED_BY_CONTROLLER});
        slice["metadata"]["managedFields"] = json!([{"manager": "endpointslice-controller"}]);
        slice
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
        let peers = Arc::new(Peers::default());
        for (uid, revision, started) in [
            ("uid-b", "r1", 2),
            ("uid-c", "r2", 3),
            ("uid-d", "r2", 4),
            ("uid-e", "r2", 5),
        ] {
            peers.answers(uid, report(revision, started));
        }
        let source = EndpointSlices::new(
            NAMESPACE.into(),
            SERVICE.into(),
            "10.0.0.1".parse().unwrap(),
            reports(),
            Arc::clone(&peers) as Arc<dyn Exchange>,
        )
        .with_client(client);
        assert_eq!(source.name(), "kubernetes");
        let sink = MembershipSink::new(Snapshot::default(), Arc::default());
        assert!(!sink.is_known(), "no list yet: the pod is not ready");
        let deleting = sink.terminating();
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let task = {
            let sink = sink.clone();
            tokio::spawn(async move { source.run(sink, shutdown).await })
        };

        // 1. The initial LIST: two slices, this pod `a` and `b` in one, `x` (which holds no key
        //    ring: it never answers an ask) in the other.
        let (_, respond) = next_request(&mut handle, false).await;
        respond.send_response(slice_list(
            "100",
            vec![
                slice_at(
                    "peers-1",
                    "90",
                    vec![
                        endpoint_json("a", 1, true, false),
                        endpoint_json("b", 2, true, false),
                    ],
                ),
                slice_at("peers-2", "91", vec![endpoint_json("x", 9, true, false)]),
            ],
        ));
        wait_for(
            &sink,
            &[
                expect("x", 9, PeerState::Draining, ""),
                expect("a", 1, PeerState::Routable, "r1"),
                expect("b", 2, PeerState::Routable, "r1"),
            ],
        )
        .await;
        assert!(sink.is_known(), "listed: the pod may be ready");
        assert_eq!(sink.age(std::time::Instant::now()), Duration::ZERO);
        assert!(!*deleting.borrow(), "this pod is not being deleted yet");
        {
            let asked = peers.asked.lock();
            assert!(
                asked.iter().all(|(uid, ..)| uid != "uid-a"),
                "a pod never asks itself"
            );
            assert!(
                asked.contains(&(
                    "uid-b".into(),
                    SocketAddr::from(([10, 0, 0, 2], PEER)),
                    report("r1", 1)
                )),
                "b is asked on the slice's peer port, told this pod's report: {asked:?}"
            );
        }

        // 2. WATCH from the list's version: `c` (revision r2) joins slice 2, not ready yet, then
        //    ready; `b` turns terminating.
        let (q, respond) = next_request(&mut handle, true).await;
        assert_eq!(q.get("resourceVersion").map(String::as_str), Some("100"));
        respond.send_response(watch_events(&[
            (
                "MODIFIED",
                slice_at(
                    "peers-2",
                    "101",
                    vec![
                        endpoint_json("x", 9, true, false),
                        endpoint_json("c", 3, false, false),
                    ],
                ),
            ),
            (
                "MODIFIED",
                slice_at(
                    "peers-1",
                    "102",
                    vec![
                        endpoint_json("a", 1, true, false),
                        endpoint_json("b", 2, true, true),
                    ],
                ),
            ),
        ]));
        wait_for(
            &sink,
            &[
                expect("x", 9, PeerState::Draining, ""),
                expect("a", 1, PeerState::Routable, "r1"),
                expect("b", 2, PeerState::Draining, "r1"),
                expect("c", 3, PeerState::Draining, "r2"),
            ],
        )
        .await;
        assert_eq!(sink.view().snapshot().newest_revision(), Some("r1"));

        // 3. The stream ended; the watcher resumes from the last event: `c` is ready (serving),
        //    `b` leaves (removed: gone), and this pod turns terminating — its drain starts.
        let (q, respond) = next_request(&mut handle, true).await;
        assert_eq!(q.get("resourceVersion").map(String::as_str), Some("102"));
        respond.send_response(watch_events(&[
            (
                "MODIFIED",
                slice_at(
                    "peers-2",
                    "103",
                    vec![
                        endpoint_json("x", 9, true, false),
                        endpoint_json("c", 3, true, false),
                    ],
                ),
            ),
            (
                "MODIFIED",
                slice_at("peers-1", "104", vec![endpoint_json("a", 1, false, true)]),
            ),
        ]));
        wait_for(
            &sink,
            &[
                expect("x", 9, PeerState::Draining, ""),
                expect("a", 1, PeerState::Draining, "r1"),
                expect("c", 3, PeerState::Routable, "r2"),
            ],
        )
        .await;
        assert!(
            *deleting.borrow(),
            "this pod's endpoint terminating starts its drain"
        );
        assert_eq!(sink.view().snapshot().newest_revision(), Some("r2"));

        // 4. The version expired (410 Gone): the last good membership stays while the watcher
        //    backs off, then relists, and the new list replaces the set: slice 1 was deleted,
        //    slice 3 holds `d` and `e`.
        let (_, respond) = next_request(&mut handle, true).await;
        let gone = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "too old resource version: 104 (200)", "reason": "Expired", "code": 410,
        });
        respond.send_response(watch_events(&[("ERROR", gone)]));
        let (_, respond) = next_request(&mut handle, false).await;
        assert_eq!(
            sink.view().snapshot().peers.len(),
            3,
            "the last good membership is kept"
        );
        respond.send_response(slice_list(
            "200",
            vec![
                slice_at("peers-2", "150", vec![endpoint_json("c", 3, true, false)]),
                slice_at(
                    "peers-3",
                    "160",
                    vec![
                        endpoint_json("d", 4, true, false),
                        endpoint_json("e", 5, false, false),
                    ],
                ),
            ],
        ));
        wait_for(
            &sink,
            &[
                expect("c", 3, PeerState::Routable, "r2"),
                expect("d", 4, PeerState::Routable, "r2"),
                expect("e", 5, PeerState::Draining, "r2"),
            ],
        )
        .await;

        // 5. A slice deleted in the watch: its pods leave.
        let (_, respond) = next_request(&mut handle, true).await;
        respond.send_response(watch_events(&[(
            "DELETED",
            slice_at("peers-3", "201", vec![]),
        )]));
        wait_for(&sink, &[expect("c", 3, PeerState::Routable, "r2")]).await;

        // 6. Shutdown ends `run`, even with a watch request in flight.
        let _pending = next_request(&mut handle, true).await;
        stop.send(true).unwrap();
        tokio::time::timeout(STEP, task)
            .await
            .expect("run returns on shutdown")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_answers_late_becomes_routable_and_an_askers_report_counts() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let peers = Arc::new(Peers::default());
        let reports = reports();
        let source = EndpointSlices::new(
            NAMESPACE.into(),
            SERVICE.into(),
            "10.0.0.1".parse().unwrap(),
            Arc::clone(&reports),
            Arc::clone(&peers) as Arc<dyn Exchange>,
        )
        .with_client(Client::new(service, "default"));
        let sink = MembershipSink::new(Snapshot::default(), Arc::default());
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        tokio::spawn({
            let sink = sink.clone();
            async move { source.run(sink, shutdown).await }
        });
        let _watch = list_one_slice(
            &mut handle,
            vec![
                endpoint_json("a", 1, true, false),
                endpoint_json("b", 2, true, false),
                endpoint_json("c", 3, true, false),
            ],
        )
        .await;
        wait_for(
            &sink,
            &[
                expect("b", 2, PeerState::Draining, ""),
                expect("c", 3, PeerState::Draining, ""),
                expect("a", 1, PeerState::Routable, "r1"),
            ],
        )
        .await;
        // `b` answers from now on: the next ask, one retry later, learns its report.
        peers.answers("uid-b", report("r1", 2));
        tokio::time::sleep(ASK_RETRY * 2).await;
        // `c` asked this pod (the peer listener records what an asker sends).
        reports.record("uid-c", report("r1", 3));
        wait_for(
            &sink,
            &[
                expect("a", 1, PeerState::Routable, "r1"),
                expect("b", 2, PeerState::Routable, "r1"),
                expect("c", 3, PeerState::Routable, "r1"),
            ],
        )
        .await;
    }

    /// A source for this pod (`a`, on 10.0.0.1) asking `peers`, run on a mock API server until
    /// the test ends: its sink and the API server's handle.
    fn started(peers: &Arc<Peers>) -> (MembershipSink, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let source = EndpointSlices::new(
            NAMESPACE.into(),
            SERVICE.into(),
            "10.0.0.1".parse().unwrap(),
            reports(),
            Arc::clone(peers) as Arc<dyn Exchange>,
        )
        .with_client(Client::new(service, "default"));
        let sink = MembershipSink::new(Snapshot::default(), Arc::default());
        tokio::spawn({
            let sink = sink.clone();
            // Never fires: the source runs until the runtime ends with the test.
            let (stop, shutdown) = tokio::sync::watch::channel(false);
            async move {
                source.run(sink, shutdown).await;
                drop(stop);
            }
        });
        (sink, handle)
    }

    #[tokio::test(start_paused = true)]
    async fn a_view_without_this_pod_is_not_published() {
        let peers = Arc::new(Peers::default());
        peers.answers("uid-b", report("r1", 2));
        let (sink, mut handle) = started(&peers);
        let mut changes = sink.changes();
        let later = || std::time::Instant::now() + Duration::from_secs(1);

        // 1. Start-up: the controller lists `b` but not this pod yet. Nothing is published and
        //    the view is not known (the pod is not ready).
        let (_, respond) = next_request(&mut handle, false).await;
        respond.send_response(slice_list(
            "1",
            vec![slice_at(
                "peers-1",
                "1",
                vec![endpoint_json("b", 2, true, false)],
            )],
        ));
        let (_, respond) = next_request(&mut handle, true).await;
        tokio::time::sleep(ASK_RETRY).await;
        assert!(peers.asks_of("uid-b") >= 1, "b is asked meanwhile");
        assert!(!changes.has_changed().unwrap(), "no view published");
        assert!(!sink.is_known());
        assert_eq!(sink.view().snapshot(), &Snapshot::default());

        // 2. This pod is listed: the first view is published.
        respond.send_response(watch_events(&[(
            "ADDED",
            slice_at("peers-2", "2", vec![endpoint_json("a", 1, true, false)]),
        )]));
        let both = [
            expect("a", 1, PeerState::Routable, "r1"),
            expect("b", 2, PeerState::Routable, "r1"),
        ];
        wait_for(&sink, &both).await;
        assert!(sink.is_known());
        assert_eq!(sink.age(later()), Duration::ZERO);
        changes.mark_unchanged();

        // 3. The Service's slices are deleted: the last view stays, no longer current.
        let (_, respond) = next_request(&mut handle, true).await;
        respond.send_response(watch_events(&[
            ("DELETED", slice_at("peers-2", "3", vec![])),
            ("DELETED", slice_at("peers-1", "4", vec![])),
        ]));
        // The watcher asks again only once the run loop took every event of the stream.
        let (_, respond) = next_request(&mut handle, true).await;
        assert!(!changes.has_changed().unwrap(), "no view published");
        assert_eq!(sink.view().snapshot().peers, both, "the last view is kept");
        assert!(sink.is_known());
        assert!(
            sink.age(later()) > Duration::ZERO,
            "the view is not current"
        );

        // 4. This pod is listed again (alone): published, and current.
        respond.send_response(watch_events(&[(
            "ADDED",
            slice_at("peers-3", "5", vec![endpoint_json("a", 1, true, false)]),
        )]));
        wait_for(&sink, &[expect("a", 1, PeerState::Routable, "r1")]).await;
        assert_eq!(sink.age(later()), Duration::ZERO);
    }

    /// Starts the source with `peers`, answers its first list with pods `a` (this one) and `b`,
    /// both serving, and waits for the view `wanted`; returns what must live while the test runs
    /// (the sink, the mock's handle, the watch request held open).
    async fn listing_a_and_b(peers: &Arc<Peers>, wanted: &[Peer]) -> impl Sized + use<> {
        let (sink, mut handle) = started(peers);
        let both = vec![
            endpoint_json("a", 1, true, false),
            endpoint_json("b", 2, true, false),
        ];
        let watch = list_one_slice(&mut handle, both).await;
        wait_for(&sink, wanted).await;
        (sink, handle, watch)
    }

    /// Answers the watcher's first list with one slice of `endpoints`; returns the watch
    /// request that follows, held open.
    async fn list_one_slice(
        handle: &mut Handle,
        endpoints: Vec<Value>,
    ) -> (
        HashMap<String, String>,
        tower_test::mock::SendResponse<Response<Body>>,
    ) {
        let (_, respond) = next_request(handle, false).await;
        respond.send_response(slice_list("1", vec![slice_at("peers-1", "1", endpoints)]));
        next_request(handle, true).await
    }

    #[tokio::test(start_paused = true)]
    async fn an_ask_that_learns_nothing_waits_before_the_next() {
        let peers = Arc::new(Peers::default());
        // `b` answers, but with a report no pod can have (no MCP port).
        peers.answers(
            "uid-b",
            Report {
                listen_port: 0,
                ..report("r1", 2)
            },
        );
        let _running = listing_a_and_b(
            &peers,
            &[
                expect("b", 2, PeerState::Draining, ""),
                expect("a", 1, PeerState::Routable, "r1"),
            ],
        )
        .await;
        // Without moving the clock, the source may run as often as it likes: one ask.
        for _ in 0..200 {
            tokio::task::yield_now().await;
        }
        assert_eq!(peers.asks_of("uid-b"), 1, "no ask before a retry interval");
        tokio::time::sleep(ASK_RETRY * 3 + ASK_RETRY / 2).await;
        assert_eq!(peers.asks_of("uid-b"), 4, "one ask per retry interval");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_whose_ask_panicked_is_asked_again() {
        let peers = Arc::new(Peers::default());
        peers.answers("uid-b", report("r1", 2));
        peers.panics.lock().insert("uid-b".into());
        let _running = listing_a_and_b(
            &peers,
            &[
                expect("a", 1, PeerState::Routable, "r1"),
                expect("b", 2, PeerState::Routable, "r1"),
            ],
        )
        .await;
        assert_eq!(
            peers.asks_of("uid-b"),
            2,
            "the ask that panicked, then one more"
        );
    }
}

//! A pod for the crate's in-process component tests (`#[cfg(test)]`): pod `pod-a` (or a
//! sibling, `pod-b` or `pod-c`, with the same key ring) in a membership view of three routable
//! pods, with its real
//! broker, membership, router, lifecycle and [`Handoff`] wired as `server.rs` wires them,
//! and the [`PeerLink`] the test gives in place of the peers. Nothing here talks to an MCP
//! server.

use std::sync::Arc;

use prometheus_client::registry::Registry;

use serde_json::Value;
use tether_crds::ProtocolVersion;

use super::Handoff;
use super::metrics::HandoffMetrics;
use crate::broker::metrics::BrokerMetrics;
use crate::broker::{Broker, Here};
use crate::cluster::membership::fixtures::peer;
use crate::cluster::membership::{MembershipSink, PeerState, Snapshot};
use crate::cluster::metrics::ClusterMetrics;
use crate::cluster::peer_health::PeerHealth;
use crate::cluster::routing::Router;
use crate::config::{Config, test_cli};
use crate::keys::Key;
use crate::lifecycle::Lifecycle;
use crate::mcp::home::HomeToken;
use crate::mcp::session_id::IdMinter;
use crate::peer::client::PeerLink;
use crate::session::Session;
use crate::session::journal::Journal;

/// The endpoint file of the least endpoint: `weather`, every setting at its default
/// (`spec.drain.timeout` 60 s).
pub(crate) const ENDPOINT: &str = "apiVersion: mcp.tether.dev/v1alpha1\nkind: McpEndpoint\n\
     metadata: {name: weather}\nspec:\n  targetRef: {kind: Deployment, name: weather}\n";

/// [`ENDPOINT`] with `spec.session.replication: Sessions`.
pub(crate) const REPLICATED: &str = "apiVersion: mcp.tether.dev/v1alpha1\nkind: McpEndpoint\n\
     metadata: {name: weather}\nspec:\n  targetRef: {kind: Deployment, name: weather}\n\
     \x20 session: {replication: Sessions}\n";

/// Pod `pod-a` of three routable pods.
pub(crate) struct Pod {
    pub(crate) cfg: Config,
    /// Where the pod's metrics (broker, membership, handoff) are registered; a test registers
    /// the parts of the layer it drives here too, before it shares the pod.
    pub(crate) registry: Registry,
    pub(crate) broker: Arc<Broker>,
    /// The membership view the router reads; a test publishes another to change it.
    pub(crate) sink: MembershipSink,
    pub(crate) router: Router,
    pub(crate) lifecycle: Arc<Lifecycle>,
    /// Moves sessions unless `--handoff=false` (or `migration: Pin`) says otherwise.
    pub(crate) handoff: Arc<Handoff>,
    _dir: tempfile::TempDir,
}

impl Pod {
    /// The pod of the endpoint file `endpoint` (e.g. [`ENDPOINT`]) and the flags `args`, whose
    /// messages to peers go to `peers`.
    pub(crate) fn start(endpoint: &str, args: &[&str], peers: Arc<dyn PeerLink>) -> Self {
        Self::start_as("pod-a", None, endpoint, args, peers)
    }

    /// Pod `uid` (`pod-b` or `pod-c`) of the same endpoint and flags as this one, with its key
    /// ring (an id one mints is genuine at the other), whose messages go to `peers`.
    pub(crate) fn sibling(&self, uid: &str, peers: Arc<dyn PeerLink>) -> Self {
        let endpoint = std::fs::read_to_string(self._dir.path().join("endpoint.yaml")).unwrap();
        Self::start_as(uid, Some(self), &endpoint, &[], peers)
    }

    fn start_as(
        uid: &str,
        keys_of: Option<&Self>,
        endpoint: &str,
        args: &[&str],
        peers: Arc<dyn PeerLink>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("endpoint.yaml"), endpoint).unwrap();
        let mut cli = test_cli(dir.path(), args);
        cli.pod_uid = uid.to_owned();
        if let Some(other) = keys_of {
            for file in std::fs::read_dir(other._dir.path().join("keys")).unwrap() {
                let file = file.unwrap();
                std::fs::copy(file.path(), dir.path().join("keys").join(file.file_name())).unwrap();
            }
        }
        let cfg = Config::load(&cli).unwrap();
        let mut registry = Registry::with_prefix("tether");
        let broker = cfg.broker_of(
            cfg.upstream_client(),
            Arc::new(BrokerMetrics::new(&mut registry)),
        );
        let snapshot = Snapshot {
            peers: ["pod-a", "pod-b", "pod-c"]
                .iter()
                .map(|uid| peer(uid, PeerState::Routable))
                .collect(),
        };
        let sink = MembershipSink::new(snapshot, Arc::new(ClusterMetrics::new(&mut registry)));
        let router = Router::new(
            sink.clone(),
            PeerHealth::new(),
            cfg.listen_addr,
            cfg.pod_uid.clone(),
            cfg.keys.clone(),
        )
        .stale_after(cfg.membership_stale_after);
        let lifecycle = Arc::new(Lifecycle::default());
        let handoff = Handoff::new(
            Arc::clone(&broker),
            router.clone(),
            Arc::clone(&lifecycle),
            Arc::new(HandoffMetrics::new(&mut registry)),
            peers,
            cfg.peer_addr.port(),
            cfg.peer_max_message_bytes,
            cfg.handoff,
            cfg.drain_timeout,
            cfg.rebalance_dwell,
        );
        Self {
            cfg,
            registry,
            broker,
            sink,
            router,
            lifecycle,
            handoff,
            _dir: dir,
        }
    }

    /// The pod's metrics in the Prometheus text format.
    pub(crate) fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text
    }

    /// A new session held here, its id minted for home `home` (its MAC is genuine),
    /// negotiated 2025-06-18, with no upstream session yet.
    pub(crate) fn hold(&self, home: &str) -> Arc<Session> {
        let (id, key) = self.mint(home);
        let session = Session::new(
            id,
            key,
            None,
            ProtocolVersion::V2025_06_18,
            Journal::new(Value::Null),
            self.broker.retained(),
        );
        assert!(self.broker.adopt_session(Arc::clone(&session)).unwrap());
        session
    }

    /// A session id minted for home `home` with the pod's key ring (its MAC is genuine), and
    /// its key.
    pub(crate) fn mint(&self, home: &str) -> (String, Arc<Key>) {
        IdMinter::new(self.cfg.keys.clone(), HomeToken::for_pod(home)).mint()
    }

    /// Where session `id` is, as a request for it would find it: `held`, `moved to <uid>`,
    /// `ended: <reason>`, `absent`, or why its id is refused.
    pub(crate) fn place(&self, id: &str) -> String {
        match self.broker.locate(id) {
            Ok((_, Here::Held(_))) => "held".into(),
            Ok((_, Here::Moved(uid))) => format!("moved to {uid}"),
            Ok((_, Here::Ended(reason))) => format!("ended: {}", reason.label()),
            Ok((_, Here::Absent)) => "absent".into(),
            Err(e) => format!("{e:?}"),
        }
    }
}

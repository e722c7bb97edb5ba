//! Assembles the pingora server: the MCP listener, the admin listener, the peer (handoff)
//! listener, the sweeper, the rebalancer, the endpoint file's reloader and the membership
//! source.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server, ShutdownWatch};
use pingora::services::background::{BackgroundService, background_service};
use pingora::services::listening::Service;

use crate::cluster::membership::kubernetes::EndpointSlices;
use crate::cluster::membership::peers_file::PeersFile;
use crate::cluster::membership::reports::{Report, Reports};
use crate::cluster::membership::{Membership, MembershipSink, Peer, PeerState, Snapshot};
use crate::cluster::peer_health::{PeerHealth, Prober};
use crate::cluster::routing::Router;
use crate::config::metrics::{ConfigMetrics, KeyRingReload};
use crate::config::reload::Reloader;
use crate::config::{Config, ConfigError, MembershipConfig};
use crate::handoff::Handoff;
use crate::handoff::listener::PeerListener;
use crate::keys::{KeyRing, RELOAD_INTERVAL};
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::ops::admin::{Admin, Exposition};
use crate::ops::control::DrainControl;
use crate::ops::drain::Drain;
use crate::ops::shutdown::DrainOnTerm;
use crate::peer::client::PeerClient;
use crate::proxy::{ConnectionLimits, HeadTimed, Listener, Listening, McpProxy, SlotLimits};

/// How often idle sessions and expired events are swept.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Seconds pingora waits after its listeners close, then gives runtimes to stop. Requests in
/// flight have already finished by then ([`DrainOnTerm`]); what remains are idle keep-alive
/// connections and standalone GET streams, which clients reopen.
const GRACE_SECS: u64 = 1;
const SHUTDOWN_TIMEOUT_SECS: u64 = 5;
/// Added to the peer's own deadlines to bound each read from a peer.
const PEER_READ_MARGIN: Duration = Duration::from_secs(10);

/// How often adopted sessions are checked against `owner(S)`
/// (`docs/design/handoff.md#adopted-sessions-follow-the-owner`) and followed streams against their
/// writer's liveness.
pub(crate) const REBALANCE_INTERVAL: Duration = Duration::from_secs(1);

/// A task run every `interval` until shutdown (the sweeper, the rebalancer).
struct Periodic<F> {
    interval: Duration,
    task: F,
}

#[async_trait]
impl<F, Fut> BackgroundService for Periodic<F>
where
    F: Fn() -> Fut + Send + Sync,
    Fut: std::future::Future<Output = ()> + Send,
{
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.interval);
        loop {
            tokio::select! {
                _ = tick.tick() => (self.task)().await,
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// The holder's side of replication: a round every [`crate::handoff::replication::INTERVAL`],
/// and one at once when a request waits for its record to be kept (a request that arrives
/// during a round gets the next one).
struct Replicator(Arc<Handoff>);

#[async_trait]
impl BackgroundService for Replicator {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(crate::handoff::replication::INTERVAL);
        loop {
            let ticked = tokio::select! {
                _ = tick.tick() => true,
                () = self.0.round_wanted() => false,
                _ = shutdown.changed() => return,
            };
            self.0.replicate_round(ticked).await;
        }
    }
}

/// Drains the pod once membership reports its deletion (its endpoint turned `terminating`).
struct DrainOnDelete {
    terminating: tokio::sync::watch::Receiver<bool>,
    drain: Arc<Drain>,
}

#[async_trait]
impl BackgroundService for DrainOnDelete {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut terminating = self.terminating.clone();
        let deleted = tokio::select! {
            deleted = terminating.wait_for(|t| *t) => deleted.is_ok(),
            _ = shutdown.changed() => false,
        };
        if deleted {
            tracing::info!("this pod is being deleted: draining");
            self.drain.run().await;
        }
    }
}

/// Runs a [`Membership`] source until shutdown.
struct MembershipService {
    source: Box<dyn Membership>,
    sink: MembershipSink,
}

#[async_trait]
impl BackgroundService for MembershipService {
    async fn start(&self, shutdown: ShutdownWatch) {
        self.source.run(self.sink.clone(), shutdown).await;
    }
}

/// This pod's report to its peers: its revision, its start (now) and its ports.
fn own_report(cfg: &Config) -> Reports {
    let started_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let own = Report {
        revision: cfg.revision.clone(),
        started_ms,
        listen_port: cfg.listen_addr.port(),
        peer_port: cfg.peer_addr.port(),
    };
    Reports::new(cfg.pod_uid.clone(), own)
}

/// The membership at start-up and the source that keeps it current (`None`: no peers); a
/// Kubernetes source keeps peers' reports in `reports`.
fn membership(cfg: &Config, reports: &Arc<Reports>) -> (Snapshot, Option<Box<dyn Membership>>) {
    let alone = Snapshot {
        peers: vec![Peer {
            uid: cfg.pod_uid.clone(),
            name: cfg.pod_uid.clone(),
            address: cfg.listen_addr,
            peer_port: None,
            state: PeerState::Routable,
            revision: cfg.revision.clone(),
        }],
    };
    match &cfg.membership {
        MembershipConfig::Alone => (alone, None),
        MembershipConfig::PeersFile(path, initial) => (
            initial.clone(),
            Some(Box::new(PeersFile::new(path.clone()))),
        ),
        MembershipConfig::Kubernetes { namespace, service } => {
            let client = PeerClient::new(cfg.keys.clone(), cfg.pod_uid.clone(), cfg.peer_tls);
            let source = EndpointSlices::new(
                namespace.clone(),
                service.clone(),
                cfg.listen_addr.ip(),
                Arc::clone(reports),
                Arc::new(client),
            );
            (alone, Some(Box::new(source)))
        }
    }
}

/// Reads the key ring again (`docs/design/peer-trust.md#the-key-ring`): a change is applied
/// whole and logged with the key ids; a ring that does not load keeps the last good one.
fn reload_keys(keys: &KeyRing, metrics: &ConfigMetrics) {
    match keys.reload() {
        Ok(false) => {}
        Ok(true) => {
            metrics.key_ring_reload(KeyRingReload::Applied);
            let ring = keys.load();
            let ids: Vec<String> = ring
                .keys()
                .map(|(role, key)| format!("{role:?}={}", key.id()))
                .collect();
            tracing::info!(keys = %ids.join(" "), tls = ring.tls().is_some(), "key ring reloaded");
        }
        Err(e) => {
            metrics.key_ring_reload(KeyRingReload::Invalid);
            tracing::warn!(error = %e, "keeping the last good key ring");
        }
    }
}

/// Fails when the drain socket cannot be created at `path` (pingora would only log it from its
/// listener thread). A socket file left by an earlier run is replaced, as pingora does.
fn check_drain_socket(path: &std::path::Path) -> Result<(), ConfigError> {
    let error = |source| ConfigError::DrainSocket {
        path: path.to_owned(),
        source,
    };
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(error(e)),
        _ => {}
    }
    std::os::unix::net::UnixListener::bind(path).map_err(error)?;
    std::fs::remove_file(path).map_err(error)
}

/// Runs the sidecar until SIGTERM/SIGINT; returns only when it cannot start.
///
/// # Errors
/// [`ConfigError::Bind`] when a listener address is unusable (pingora itself would only log
/// from its listener threads and keep the process alive without listeners).
pub fn run(cfg: Config) -> Result<std::convert::Infallible, ConfigError> {
    for (what, addr) in [
        ("MCP listener", cfg.listen_addr),
        ("admin listener", cfg.admin_addr),
        ("peer listener", cfg.peer_addr),
    ] {
        std::net::TcpListener::bind(addr).map_err(|source| ConfigError::Bind {
            what,
            addr,
            source,
        })?;
    }
    check_drain_socket(&cfg.drain_socket)?;
    crate::keys::tls::install_default_provider();
    let conf = ServerConf {
        threads: cfg.threads,
        grace_period_seconds: Some(GRACE_SECS),
        graceful_shutdown_timeout_seconds: Some(SHUTDOWN_TIMEOUT_SECS),
        upstream_keepalive_pool_size: cfg.peer_pool_size,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let metrics = Arc::new(Metrics::new());
    let lifecycle = Arc::new(Lifecycle::default());
    let upstream = cfg.upstream_client();
    let reports = Arc::new(own_report(&cfg));
    let (initial, source) = membership(&cfg, &reports);
    let health = PeerHealth::new();
    let broker = cfg.broker_of(upstream.clone(), Arc::clone(&metrics.broker));
    let sink = MembershipSink::new(initial, Arc::clone(&metrics.cluster));
    sink.set_dwell(cfg.rebalance_dwell);
    if !matches!(cfg.membership, MembershipConfig::Kubernetes { .. }) {
        // Alone, or a peers file read at start: the view is complete from the start; an
        // EndpointSlice watch's is once its first list arrived.
        sink.confirm();
    }
    let router = Router::new(
        sink.clone(),
        Arc::clone(&health),
        cfg.listen_addr,
        cfg.pod_uid.clone(),
        cfg.keys.clone(),
    )
    .stale_after(cfg.membership_stale_after);
    // Only a peer that stopped answering exceeds this: a live one answers within its upstream
    // deadline and sends keep-alive comments on idle streams.
    let peer_read_timeout =
        cfg.broker.upstream_body_timeout.max(cfg.broker.keep_alive) + PEER_READ_MARGIN;
    let handoff = Handoff::new(
        Arc::clone(&broker),
        router.clone(),
        Arc::clone(&lifecycle),
        Arc::clone(&metrics.handoff),
        Arc::new(PeerClient::new(
            cfg.keys.clone(),
            cfg.pod_uid.clone(),
            cfg.peer_tls,
        )),
        cfg.peer_addr.port(),
        cfg.peer_max_message_bytes,
        cfg.handoff,
        cfg.drain_timeout,
        cfg.rebalance_dwell,
    );
    handoff.attach_to_broker();
    let admission = Arc::new(ArcSwap::from_pointee(cfg.admission.clone()));
    let reloader = Reloader::new(
        cfg.source.clone(),
        Arc::clone(&admission),
        Arc::clone(&broker),
        Arc::clone(&metrics.config),
    );
    let proxy = McpProxy {
        broker: Arc::clone(&broker),
        router: router.clone(),
        policy: admission,
        lifecycle: Arc::clone(&lifecycle),
        metrics: Arc::clone(&metrics.proxy),
        body_timeout: cfg.request_timeout,
        peer_read_timeout,
        client_write_timeout: cfg.client_write_timeout,
        peer: Arc::new(PeerListener::new(
            Arc::clone(&broker),
            Arc::clone(&handoff),
            Arc::clone(&lifecycle),
            Arc::clone(&metrics.handoff),
            cfg.keys.clone(),
            cfg.pod_uid.clone(),
            cfg.peer_max_message_bytes,
            router.clone(),
            reports,
        )),
        peer_port: cfg.peer_addr.port(),
        peer_tls: cfg.peer_tls,
        peer_max_streams: cfg.peer_max_streams,
        handoff: Arc::clone(&handoff),
    };
    let limits = ConnectionLimits {
        slots: SlotLimits {
            max: cfg.max_connections,
            per_source: cfg.max_connections_per_source,
        },
        header_timeout: cfg.header_timeout,
    };
    let proxy = Arc::new(pingora::proxy::http_proxy(&server.configuration, proxy));
    let listener = Listener::new(
        Arc::clone(&proxy),
        limits,
        Arc::clone(&metrics.proxy),
        Listening::Mcp,
    );
    let mut mcp = Service::new("mcp".to_owned(), listener);
    mcp.add_tcp(&cfg.listen_addr.to_string());
    // The peer port: peers' messages and requests forwarded to this pod, through the same proxy.
    let listener = Listener::new(
        proxy,
        limits,
        Arc::clone(&metrics.proxy),
        Listening::Peer {
            keys: cfg.keys.clone(),
            tls: cfg.peer_tls,
            max_streams: cfg.peer_max_streams,
            refusals: Arc::clone(&metrics.handoff),
        },
    );
    let mut peer = Service::new("peer".to_owned(), listener);
    peer.add_tcp(&cfg.peer_addr.to_string());
    let drain = Drain::new(
        Arc::clone(&broker),
        Arc::clone(&handoff),
        Arc::clone(&lifecycle),
        Arc::clone(&metrics.ops),
        cfg.drain_timeout,
    );
    let admin = Admin::new(
        upstream,
        cfg.listen_addr,
        Arc::clone(&drain),
        lifecycle,
        Arc::clone(&metrics) as Arc<dyn Exposition>,
        Arc::clone(&metrics.ops),
        cfg.keys.clone(),
        Arc::clone(&broker),
        router.clone(),
    );
    let admin_limits = ConnectionLimits {
        slots: SlotLimits {
            max: cfg.admin_max_connections,
            per_source: cfg.admin_max_connections_per_source,
        },
        header_timeout: cfg.header_timeout,
    };
    let mut admin = Service::new(
        "admin".to_owned(),
        Listener::new(
            Arc::new(HeadTimed(admin)),
            admin_limits,
            Arc::clone(&metrics.proxy),
            Listening::Admin,
        ),
    );
    admin.add_tcp(&cfg.admin_addr.to_string());
    let mut control = Service::new(
        "drain-socket".to_owned(),
        DrainControl::new(Arc::clone(&drain)),
    );
    control.add_uds(
        &cfg.drain_socket.to_string_lossy(),
        Some(std::fs::Permissions::from_mode(0o600)),
    );
    let sweeper = {
        let broker = Arc::clone(&broker);
        background_service(
            "sweeper",
            Periodic {
                interval: SWEEP_INTERVAL,
                task: move || {
                    broker.sweep(Instant::now());
                    std::future::ready(())
                },
            },
        )
    };
    server.add_service(mcp);
    server.add_service(admin);
    server.add_service(control);
    server.add_service(peer);
    server.add_service(sweeper);
    server.add_service(background_service(
        "config-reload",
        Periodic {
            interval: cfg.config_poll,
            task: move || {
                reloader.poll();
                std::future::ready(())
            },
        },
    ));
    let keys = cfg.keys.clone();
    let key_metrics = Arc::clone(&metrics.config);
    server.add_service(background_service(
        "key-ring-reload",
        Periodic {
            interval: RELOAD_INTERVAL,
            task: move || {
                reload_keys(&keys, &key_metrics);
                std::future::ready(())
            },
        },
    ));
    let replicator = Arc::clone(&handoff);
    server.add_service(background_service(
        "rebalancer",
        Periodic {
            interval: REBALANCE_INTERVAL,
            task: move || {
                let handoff = Arc::clone(&handoff);
                async move { handoff.rebalance().await }
            },
        },
    ));
    server.add_service(background_service("replicator", Replicator(replicator)));
    server.add_service(background_service(
        "drain-on-delete",
        DrainOnDelete {
            terminating: sink.terminating(),
            drain: Arc::clone(&drain),
        },
    ));
    if let Some(source) = source {
        let name = source.name();
        let prober = Prober::new(health, sink.clone(), cfg.pod_uid.clone());
        server.add_service(background_service("peer-prober", prober));
        server.add_service(background_service(name, MembershipService { source, sink }));
    }
    tracing::info!(
        endpoint = %cfg.endpoint,
        listen = %cfg.listen_addr,
        admin = %cfg.admin_addr,
        drain_socket = %cfg.drain_socket.display(),
        peer = %cfg.peer_addr,
        handoff = cfg.handoff,
        upstream = %cfg.upstream,
        "tether-sidecar starting"
    );
    let shutdown = DrainOnTerm::new(drain, cfg.shutdown_delay);
    server.run(RunArgs {
        shutdown_signal: Box::new(shutdown),
    });
    std::process::exit(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drain_socket_needs_a_writable_directory_and_replaces_a_stale_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-dir/drain.sock");
        let err = check_drain_socket(&missing).unwrap_err();
        assert!(matches!(err, ConfigError::DrainSocket { .. }), "{err}");
        assert!(err.to_string().contains("--drain-socket"), "{err}");
        let stale = dir.path().join("drain.sock");
        std::fs::write(&stale, "left by an earlier run").unwrap();
        check_drain_socket(&stale).unwrap();
        assert!(!stale.exists(), "pingora binds a fresh socket there");
    }
}

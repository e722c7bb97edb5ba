//! Which peers failed to answer lately, so routing skips them (DESIGN.md §3.1 step 4: "the next
//! pod not visited yet").
//!
//! Two signals mark a peer down for [`DOWN_HOLD`]:
//! - a forward that cannot connect to it (connection refused, connect timeout);
//! - [`FAILURES_TO_MARK_DOWN`] consecutive failed probes of its admin `/healthz` by the
//!   [`Prober`] (every [`PROBE_INTERVAL`], each bounded by [`PROBE_TIMEOUT`]), which also catches
//!   a frozen pod that still accepts connections but never answers.
//!
//! A successful probe clears the mark at once. Routing treats a down peer like a visited one:
//! a session whose home is down is looked for on the ring, and ends in 404 when nobody holds it
//! (spec S-05). The set is an immutable map swapped atomically; a lookup takes no lock.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::membership::MembershipSink;

/// How long a failed peer is skipped after its last failure.
pub const DOWN_HOLD: Duration = Duration::from_secs(3);
/// How often every live peer's `/healthz` is probed.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How long one probe may take (connect + answer).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Consecutive failed probes that mark a peer down.
pub const FAILURES_TO_MARK_DOWN: u32 = 2;

/// Peers currently considered down, by UID, with the instant the mark expires.
#[derive(Debug, Default)]
pub struct PeerHealth {
    down: ArcSwap<HashMap<String, Instant>>,
}

impl PeerHealth {
    /// Nobody down.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Marks `uid` down for [`DOWN_HOLD`] from `now`.
    pub fn mark_down(&self, uid: &str, now: Instant) {
        self.down.rcu(|map| {
            let mut map: HashMap<String, Instant> = map
                .iter()
                .filter(|(_, until)| **until > now)
                .map(|(u, t)| (u.clone(), *t))
                .collect();
            map.insert(uid.to_owned(), now + DOWN_HOLD);
            map
        });
    }

    /// Clears the mark of `uid`.
    pub fn mark_up(&self, uid: &str) {
        if !self.down.load().contains_key(uid) {
            return;
        }
        self.down.rcu(|map| {
            let mut map = HashMap::clone(map);
            map.remove(uid);
            map
        });
    }

    /// Whether `uid` is marked down at `now`.
    pub fn is_down(&self, uid: &str, now: Instant) -> bool {
        self.down.load().get(uid).is_some_and(|until| *until > now)
    }
}

/// Probes every live peer's admin `/healthz` and keeps [`PeerHealth`] current.
pub struct Prober {
    health: Arc<PeerHealth>,
    sink: MembershipSink,
    own_uid: String,
    admin_port: u16,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Prober {
    /// A prober of the peers in `sink` (all but `own_uid`), on their `admin_port`.
    pub fn new(
        health: Arc<PeerHealth>,
        sink: MembershipSink,
        own_uid: String,
        admin_port: u16,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(PROBE_TIMEOUT));
        connector.set_nodelay(true);
        Self {
            health,
            sink,
            own_uid,
            admin_port,
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
        }
    }

    /// Whether the admin listener at `addr` answers `/healthz` with 200 in time.
    async fn probe(&self, addr: SocketAddr) -> bool {
        let Ok(uri) = format!("http://{addr}/healthz").parse::<http::Uri>() else {
            return false;
        };
        matches!(
            tokio::time::timeout(PROBE_TIMEOUT, self.client.get(uri)).await,
            Ok(Ok(resp)) if resp.status() == http::StatusCode::OK
        )
    }
}

#[async_trait]
impl BackgroundService for Prober {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut failures: HashMap<String, u32> = HashMap::new();
        let mut tick = tokio::time::interval(PROBE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let view = self.sink.view();
            let peers: Vec<(String, String, SocketAddr)> = view
                .snapshot()
                .peers
                .iter()
                .filter(|p| p.state.is_alive() && p.uid != self.own_uid)
                .map(|p| {
                    let admin = SocketAddr::new(p.address.ip(), self.admin_port);
                    (p.uid.clone(), p.name.clone(), admin)
                })
                .collect();
            let results =
                futures::future::join_all(peers.iter().map(|(_, _, addr)| self.probe(*addr))).await;
            failures.retain(|uid, _| peers.iter().any(|(u, _, _)| u == uid));
            let now = Instant::now();
            for ((uid, name, addr), ok) in peers.iter().zip(results) {
                if ok {
                    if failures
                        .remove(uid)
                        .is_some_and(|n| n >= FAILURES_TO_MARK_DOWN)
                    {
                        tracing::info!(peer = %name, "peer answers its health probe again");
                    }
                    self.health.mark_up(uid);
                    continue;
                }
                let n = failures.entry(uid.clone()).or_default();
                *n += 1;
                if *n >= FAILURES_TO_MARK_DOWN {
                    if *n == FAILURES_TO_MARK_DOWN {
                        tracing::warn!(peer = %name, admin = %addr, "peer fails its health probe; skipping it");
                    }
                    self.health.mark_down(uid, now);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_expire_and_clear() {
        let h = PeerHealth::new();
        let t0 = Instant::now();
        assert!(!h.is_down("a", t0));
        h.mark_down("a", t0);
        assert!(h.is_down("a", t0 + Duration::from_millis(10)));
        assert!(!h.is_down("a", t0 + DOWN_HOLD + Duration::from_millis(1)));
        h.mark_down("b", t0);
        h.mark_up("b");
        assert!(!h.is_down("b", t0));
        assert!(h.is_down("a", t0));
    }

    #[tokio::test]
    async fn a_frozen_peer_is_marked_down_and_a_live_one_is_not() {
        use crate::membership::{Peer, PeerState, Snapshot};
        // A listener that accepts and never answers (a frozen process), and one that answers.
        let frozen = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (frozen_addr, live_addr) = (frozen.local_addr().unwrap(), live.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = frozen.accept().await {
                held.push(s);
            }
        });
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut s, _)) = live.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n")
                            .await;
                    }
                });
            }
        });
        // Both peers on 127.0.0.1 with distinct admin ports: probe each by its own port.
        let health = PeerHealth::new();
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let peer = |uid: &str, port: u16| Peer {
            uid: uid.into(),
            name: uid.into(),
            address: SocketAddr::new("127.0.0.1".parse().unwrap(), port),
            state: PeerState::Routable,
            revision: String::new(),
        };
        for (uid, port, down) in [
            ("frozen", frozen_addr.port(), true),
            ("live", live_addr.port(), false),
        ] {
            let sink = MembershipSink::new(
                Snapshot {
                    peers: vec![peer(uid, 1)],
                },
                Arc::clone(&metrics),
            );
            let prober = Prober::new(Arc::clone(&health), sink, "me".into(), port);
            let (stop, shutdown) = tokio::sync::watch::channel(false);
            let task = tokio::spawn(async move { prober.start(shutdown).await });
            tokio::time::sleep(PROBE_INTERVAL * (FAILURES_TO_MARK_DOWN + 1)).await;
            assert_eq!(health.is_down(uid, Instant::now()), down, "{uid}");
            stop.send(true).unwrap();
            task.await.unwrap();
        }
    }
}

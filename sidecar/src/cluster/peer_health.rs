//! Which peers failed to answer lately, so routing skips them (`docs/design/routing.md#forwarding`:
//! "the next pod not visited yet").
//!
//! Two signals mark a peer down for [`DOWN_HOLD`], with a [`Down`] cause:
//! - a forward that cannot connect to it: [`Down::Refused`] when the connection is refused (no
//!   process listens: the pod's sessions are gone), [`Down::Unresponsive`] on a connect timeout;
//! - [`FAILURES_TO_MARK_DOWN`] consecutive failed probes by the [`Prober`] (every
//!   [`PROBE_INTERVAL`], each bounded by [`PROBE_TIMEOUT`]) of [`PROBE_PATH`] on the peer's
//!   MCP listener — the address forwards use, so no other port needs to be open between pods.
//!   A refused probe is [`Down::Refused`]; a probe that gets no answer in time (a frozen pod
//!   still accepts connections) is [`Down::Unresponsive`].
//!
//! A successful probe clears the mark at once. Routing skips a down peer like a visited one,
//! except the live home of a session that is merely unresponsive: that request gets 503 +
//! `Retry-After` (the session may well survive a stall), while a refused home's sessions are
//! looked for on the ring and end in 404 when nobody holds them (spec S-05). The set is an
//! immutable map swapped atomically; a lookup takes no lock.

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

use crate::cluster::membership::MembershipSink;
use crate::peer::PROBE_PATH;

/// How long a failed peer is skipped after its last failure.
pub(crate) const DOWN_HOLD: Duration = Duration::from_secs(3);
/// How often every live peer's `/healthz` is probed.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How long one probe may take (connect + answer).
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Consecutive failed probes that mark a peer down.
pub(crate) const FAILURES_TO_MARK_DOWN: u32 = 2;
/// Why a peer is down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::VariantArray)]
pub(crate) enum Down {
    /// Its address refuses connections: no sidecar runs there any more.
    Refused,
    /// It accepts connections (or drops them) but does not answer in time.
    Unresponsive,
}

impl Down {
    /// The `reason` label of `tether_peers_down`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Unresponsive => "unresponsive",
        }
    }
}

/// Peers currently considered down, by UID, with the cause and the instant the mark expires.
#[derive(Debug, Default)]
pub(crate) struct PeerHealth {
    down: ArcSwap<HashMap<String, (Down, Instant)>>,
}

impl PeerHealth {
    /// Nobody down.
    pub(crate) fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Marks `uid` down for `cause`, for [`DOWN_HOLD`] from `now`.
    pub(crate) fn mark_down(&self, uid: &str, cause: Down, now: Instant) {
        self.down.rcu(|map| {
            let mut map: HashMap<String, (Down, Instant)> = map
                .iter()
                .filter(|(_, (_, until))| *until > now)
                .map(|(u, v)| (u.clone(), *v))
                .collect();
            map.insert(uid.to_owned(), (cause, now + DOWN_HOLD));
            map
        });
    }

    /// Clears the mark of `uid`.
    pub(crate) fn mark_up(&self, uid: &str) {
        if !self.down.load().contains_key(uid) {
            return;
        }
        self.down.rcu(|map| {
            let mut map = HashMap::clone(map);
            map.remove(uid);
            map
        });
    }

    /// Why `uid` is down at `now`, if it is.
    pub(crate) fn down(&self, uid: &str, now: Instant) -> Option<Down> {
        self.down
            .load()
            .get(uid)
            .filter(|(_, until)| *until > now)
            .map(|(cause, _)| *cause)
    }
}

/// Probes every live peer's [`PROBE_PATH`] and keeps [`PeerHealth`] current.
pub(crate) struct Prober {
    health: Arc<PeerHealth>,
    sink: MembershipSink,
    own_uid: String,
    client: Client<HttpConnector, Empty<Bytes>>,
    /// Time between rounds ([`PROBE_INTERVAL`]).
    interval: Duration,
    /// Bound of one probe ([`PROBE_TIMEOUT`]).
    timeout: Duration,
}

impl Prober {
    /// A prober of the peers in `sink` (all but `own_uid`); `tether_peers_down` goes to the
    /// sink's metrics.
    pub(crate) fn new(health: Arc<PeerHealth>, sink: MembershipSink, own_uid: String) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(PROBE_TIMEOUT));
        connector.set_nodelay(true);
        Self {
            health,
            sink,
            own_uid,
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
            interval: PROBE_INTERVAL,
            timeout: PROBE_TIMEOUT,
        }
    }

    /// The same prober on shorter clocks (tests).
    #[cfg(test)]
    fn with_timing(self, interval: Duration, timeout: Duration) -> Self {
        Self {
            interval,
            timeout,
            ..self
        }
    }

    /// Probes the sidecar listening on `addr`: `Ok` when it answers 200 in time.
    async fn probe(&self, addr: SocketAddr) -> Result<(), Down> {
        let Ok(uri) = format!("http://{addr}{PROBE_PATH}").parse::<http::Uri>() else {
            return Err(Down::Unresponsive);
        };
        match tokio::time::timeout(self.timeout, self.client.get(uri)).await {
            Ok(Ok(resp)) if resp.status() == http::StatusCode::OK => Ok(()),
            Ok(Err(e)) if refused(&e) => Err(Down::Refused),
            _ => Err(Down::Unresponsive),
        }
    }
}

#[async_trait]
impl BackgroundService for Prober {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut failures: HashMap<String, u32> = HashMap::new();
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut changes = self.sink.changes();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                // A new view may hold a peer never probed: it is probed at once.
                Ok(()) = changes.changed() => {}
                _ = shutdown.changed() => return,
            }
            let view = self.sink.view();
            let peers: Vec<(String, String, SocketAddr)> = view
                .snapshot()
                .peers
                .iter()
                .filter(|p| p.state.is_alive() && p.uid != self.own_uid)
                .map(|p| (p.uid.clone(), p.name.clone(), p.address))
                .collect();
            let results =
                futures::future::join_all(peers.iter().map(|(_, _, addr)| self.probe(*addr))).await;
            failures.retain(|uid, _| peers.iter().any(|(u, _, _)| u == uid));
            let now = Instant::now();
            let mut down = [(Down::Refused, 0i64), (Down::Unresponsive, 0i64)];
            for ((uid, name, addr), result) in peers.iter().zip(results) {
                let Err(cause) = result else {
                    if failures
                        .remove(uid)
                        .is_some_and(|n| n >= FAILURES_TO_MARK_DOWN)
                    {
                        tracing::info!(peer = %name, "peer answers its health probe again");
                    }
                    self.health.mark_up(uid);
                    continue;
                };
                let n = failures.entry(uid.clone()).or_default();
                *n += 1;
                if *n >= FAILURES_TO_MARK_DOWN {
                    if *n == FAILURES_TO_MARK_DOWN {
                        tracing::warn!(peer = %name, address = %addr, ?cause, "peer fails its health probe; skipping it");
                    }
                    self.health.mark_down(uid, cause, now);
                    for (c, n) in &mut down {
                        *n += i64::from(*c == cause);
                    }
                }
            }
            for (cause, n) in down {
                self.sink.metrics().peers_down(cause, n);
            }
        }
    }
}

/// Whether a client error is a refused connection.
fn refused(e: &hyper_util::client::legacy::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        source = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_expire_and_clear() {
        let h = PeerHealth::new();
        let t0 = Instant::now();
        assert_eq!(h.down("a", t0), None);
        h.mark_down("a", Down::Refused, t0);
        assert_eq!(
            h.down("a", t0 + Duration::from_millis(10)),
            Some(Down::Refused)
        );
        assert_eq!(h.down("a", t0 + DOWN_HOLD + Duration::from_millis(1)), None);
        h.mark_down("b", Down::Unresponsive, t0);
        assert_eq!(h.down("b", t0), Some(Down::Unresponsive));
        h.mark_up("b");
        assert_eq!(h.down("b", t0), None);
        assert_eq!(h.down("a", t0), Some(Down::Refused));
    }

    #[tokio::test]
    async fn frozen_and_dead_peers_are_marked_down_and_a_live_one_is_not() {
        use crate::cluster::membership::{Peer, PeerState, Snapshot};
        // A listener that accepts and never answers (a frozen process), and one that answers.
        let frozen = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (frozen_addr, live_addr) = (frozen.local_addr().unwrap(), live.local_addr().unwrap());
        // A port nobody listens on (bound, then released).
        let dead_addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
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
        let health = PeerHealth::new();
        let peer = |uid: &str, port: u16| Peer {
            uid: uid.into(),
            name: uid.into(),
            address: SocketAddr::new("127.0.0.1".parse().unwrap(), port),
            peer_port: None,
            state: PeerState::Routable,
            revision: String::new(),
        };
        for (uid, port, expected) in [
            ("frozen", frozen_addr.port(), Some(Down::Unresponsive)),
            ("dead", dead_addr.port(), Some(Down::Refused)),
            ("live", live_addr.port(), None),
        ] {
            let sink = MembershipSink::new(
                Snapshot {
                    peers: vec![peer(uid, port)],
                },
                Arc::default(),
            );
            // Shorter clocks than in production, in the same proportions.
            let (interval, timeout) = (Duration::from_millis(50), Duration::from_millis(250));
            let prober =
                Prober::new(Arc::clone(&health), sink, "me".into()).with_timing(interval, timeout);
            let (stop, shutdown) = tokio::sync::watch::channel(false);
            let task = tokio::spawn(async move { prober.start(shutdown).await });
            tokio::time::sleep((interval + timeout) * (FAILURES_TO_MARK_DOWN + 1)).await;
            assert_eq!(health.down(uid, Instant::now()), expected, "{uid}");
            stop.send(true).unwrap();
            task.await.unwrap();
        }
    }
}

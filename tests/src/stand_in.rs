//! A stand-in for a peer: something at an address the membership lists as a pod of the
//! endpoint that is no sidecar of it, as a workload matching the endpoint's labels by accident or
//! one impersonating a peer would be. It answers `200 {"ok":true}` to every request on the MCP
//! port (peers' probes included) and on the peer port, claiming the current peer protocol
//! (`Tether-Peer-Protocol: 2`) as a sidecar does, and records the requests it got.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::pod::{LISTEN_PORT, PEER_PORT};

/// The peer protocol a stand-in claims.
const CLAIMED_PROTOCOL: &str = "2";

/// A running stand-in; dropping it stops it.
pub struct StandIn {
    /// Its address (its UID in a membership is [`crate::pod::uid`] of it).
    pub ip: Ipv4Addr,
    seen: Arc<Mutex<Vec<(u16, String)>>>,
    tasks: Vec<JoinHandle<std::io::Result<()>>>,
}

impl StandIn {
    /// Serves the MCP port and the peer port of `ip`.
    ///
    /// # Errors
    /// I/O errors of binding.
    pub async fn start(ip: Ipv4Addr) -> std::io::Result<Self> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for port in [LISTEN_PORT, PEER_PORT] {
            let listener = TcpListener::bind((ip, port)).await?;
            let seen = Arc::clone(&seen);
            let answer = move |req: Request<Incoming>| {
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((port, req.uri().path().to_owned()));
                let resp = Response::builder()
                    .header(header::CONTENT_TYPE, "application/json")
                    .header("tether-peer-protocol", CLAIMED_PROTOCOL)
                    .body(Full::new(Bytes::from_static(b"{\"ok\":true}")))
                    .unwrap_or_default();
                async move { resp }
            };
            tasks.push(tokio::spawn(async move {
                crate::serve::http1_until(listener, "stand-in", answer, std::future::pending())
                    .await
            }));
        }
        Ok(Self { ip, seen, tasks })
    }

    /// Requests it got on `port` for `path`.
    pub fn requests(&self, port: u16, path: &str) -> usize {
        self.seen()
            .iter()
            .filter(|(p, seen)| *p == port && seen == path)
            .count()
    }

    /// Every request it got, as the port and the path, in order.
    pub fn seen(&self) -> Vec<(u16, String)> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

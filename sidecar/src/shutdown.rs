//! Graceful shutdown on SIGTERM: requests in flight finish before pingora stops.
//!
//! pingora closes its listeners the moment it acts on SIGTERM and then waits a fixed grace
//! period (rust-notes §2.6–2.7). This watch takes SIGTERM first: it marks the sidecar draining
//! (`/readyz` answers 503, so no new client is sent here), keeps serving, and hands pingora its
//! terminate signal only once no request is in flight — at once for an idle sidecar — or when
//! `spec.drain.timeout` has passed. SIGINT stops at once. (Handing sessions to peers comes with
//! the drain milestone.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch};
use tokio::signal::unix::{SignalKind, signal};

use crate::broker::Broker;

/// How often the in-flight count is checked while draining.
const POLL: Duration = Duration::from_millis(100);

/// The sidecar's shutdown watch.
pub struct DrainOnTerm {
    broker: Arc<Broker>,
    deadline: Duration,
}

impl DrainOnTerm {
    /// A watch that drains `broker` for at most `deadline` after SIGTERM.
    pub fn new(broker: Arc<Broker>, deadline: Duration) -> Self {
        Self { broker, deadline }
    }
}

#[async_trait]
impl ShutdownSignalWatch for DrainOnTerm {
    async fn recv(&self) -> ShutdownSignal {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers; stopping");
            return ShutdownSignal::FastShutdown;
        };
        tokio::select! {
            _ = int.recv() => return ShutdownSignal::FastShutdown,
            _ = term.recv() => {}
        }
        self.broker.start_draining();
        let started = Instant::now();
        tracing::info!(deadline = ?self.deadline, "SIGTERM: draining requests in flight");
        loop {
            let in_flight = self.broker.in_flight();
            if in_flight == 0 {
                tracing::info!(after = ?started.elapsed(), "drained; stopping");
                return ShutdownSignal::GracefulTerminate;
            }
            if started.elapsed() >= self.deadline {
                tracing::warn!(in_flight, "drain deadline reached; stopping");
                return ShutdownSignal::GracefulTerminate;
            }
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                _ = int.recv() => return ShutdownSignal::FastShutdown,
            }
        }
    }
}

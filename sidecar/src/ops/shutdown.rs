//! Graceful shutdown on SIGTERM: requests in flight finish before pingora stops.
//!
//! pingora closes its listeners the moment it acts on SIGTERM and then gives its services a
//! fixed grace period. This watch takes SIGTERM first: it runs the pod's drain
//! ([`crate::ops::drain`], shared with the admin `/drain`) while the listeners keep serving, and
//! hands pingora its terminate signal only once the drain is over — at once for an idle sidecar
//! — or when `spec.drain.timeout` has passed. SIGINT stops at once.

use std::sync::Arc;

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch};
use tokio::signal::unix::{SignalKind, signal};

use crate::ops::drain::Drain;

/// The sidecar's shutdown watch.
pub(crate) struct DrainOnTerm {
    drain: Arc<Drain>,
}

impl DrainOnTerm {
    /// A watch that runs `drain` on SIGTERM before letting pingora stop.
    pub(crate) fn new(drain: Arc<Drain>) -> Self {
        Self { drain }
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
        tracing::info!("SIGTERM: draining before stopping");
        tokio::select! {
            _ = self.drain.run() => ShutdownSignal::GracefulTerminate,
            _ = int.recv() => ShutdownSignal::FastShutdown,
        }
    }
}

//! Graceful shutdown on SIGTERM: requests in flight finish before pingora stops, and the
//! listeners outlive the pod's endpoints.
//!
//! pingora closes its listeners the moment it acts on SIGTERM and then gives its services a
//! fixed grace period. This watch takes SIGTERM first: it runs the pod's drain
//! ([`crate::ops::drain`], shared with the admin `/drain`) while the listeners keep serving, and
//! hands pingora its terminate signal only once the drain is over — at once for an idle sidecar
//! — or when `spec.drain.timeout` has passed, and not before `spec.drain.shutdownDelay` has
//! passed since the drain began. A pod's drain begins when it is deleted, as its endpoint turns
//! terminating; kube-proxy on each node, ingress controllers and load balancers learn of it a
//! little later and until then still send it new connections, which a closed listener would
//! refuse (clients would see connection errors through the Service). SIGINT stops at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch};
use tokio::signal::unix::{SignalKind, signal};

use crate::ops::drain::Drain;

/// The sidecar's shutdown watch.
pub(crate) struct DrainOnTerm {
    drain: Arc<Drain>,
    /// `spec.drain.shutdownDelay`.
    shutdown_delay: Duration,
}

impl DrainOnTerm {
    /// A watch that runs `drain` on SIGTERM before letting pingora stop, at the earliest
    /// `shutdown_delay` after the drain began.
    pub(crate) fn new(drain: Arc<Drain>, shutdown_delay: Duration) -> Self {
        Self {
            drain,
            shutdown_delay,
        }
    }

    /// Drains, then keeps the listeners open for what is left of the shutdown delay.
    async fn drain_then_linger(&self) {
        self.drain.run().await;
        let began = self.drain.began().unwrap_or_else(Instant::now);
        let left = linger(began, self.shutdown_delay, Instant::now());
        if !left.is_zero() {
            tracing::info!(
                ?left,
                "drained; the listeners stay open until the Service's endpoints no longer list this pod"
            );
            tokio::time::sleep(left).await;
        }
    }
}

/// How long the listeners stay open after a drain that began at `began` ended, at `now`: what
/// is left of `delay` (`spec.drain.shutdownDelay`), nothing once it has passed.
fn linger(began: Instant, delay: Duration, now: Instant) -> Duration {
    (began + delay).saturating_duration_since(now)
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
            () = self.drain_then_linger() => ShutdownSignal::GracefulTerminate,
            _ = int.recv() => ShutdownSignal::FastShutdown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listeners_outlive_the_drain_until_the_delay_since_it_began() {
        let began = Instant::now();
        let s = Duration::from_secs;
        for (delay, ended_after, left) in [
            // A quick drain: the rest of the delay.
            (
                s(5),
                Duration::from_millis(200),
                Duration::from_millis(4800),
            ),
            (s(5), s(0), s(5)),
            // A drain that outlasted the delay, or ended just as it passed: nothing more.
            (s(5), s(30), s(0)),
            (s(5), s(5), s(0)),
            // No delay.
            (s(0), s(0), s(0)),
            (s(0), s(3), s(0)),
        ] {
            assert_eq!(
                linger(began, delay, began + ended_after),
                left,
                "delay {delay:?}, drain ended after {ended_after:?}"
            );
        }
    }
}

//! Drain (DESIGN.md §3.4 steps 1 and 6, first part): the pod stops taking new sessions and lets
//! the requests in flight finish, within `spec.drain.timeout`.
//!
//! Triggered by the admin `/drain` endpoint (a `preStop httpGet` waits on it) and by SIGTERM
//! ([`crate::shutdown`]). A drain runs once: every trigger, concurrent or later, waits for the
//! same [`DrainOutcome`]. Marking the pod draining makes `/readyz` answer 503 and sends new
//! sessions to routable peers ([`crate::routing`]). Handing held sessions to a peer is not part
//! of this yet: sessions stay on the pod until it stops.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use crate::broker::Broker;

/// How often the in-flight count is checked while draining.
const POLL: Duration = Duration::from_millis(50);

/// How a drain ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainOutcome {
    /// Whether every request in flight finished before the deadline.
    pub drained: bool,
    /// Sessions still with a request in flight when the drain ended (0 when `drained`).
    pub in_flight: usize,
    /// How long the drain took.
    pub elapsed: Duration,
}

/// The pod's drain: started once, awaited by every trigger.
pub struct Drain {
    broker: Arc<Broker>,
    deadline: Duration,
    outcome: OnceCell<DrainOutcome>,
}

impl Drain {
    /// The drain of `broker`'s pod, bounded by `deadline` (`spec.drain.timeout`).
    pub fn new(broker: Arc<Broker>, deadline: Duration) -> Arc<Self> {
        Arc::new(Self {
            broker,
            deadline,
            outcome: OnceCell::new(),
        })
    }

    /// Drains the pod (the first call) or waits for the drain under way; returns its outcome.
    pub async fn run(&self) -> DrainOutcome {
        *self.outcome.get_or_init(|| self.drain()).await
    }

    async fn drain(&self) -> DrainOutcome {
        self.broker.start_draining();
        let started = Instant::now();
        tracing::info!(deadline = ?self.deadline, "draining: no new sessions, waiting for requests in flight");
        let outcome = loop {
            let in_flight = self.broker.in_flight();
            let elapsed = started.elapsed();
            if in_flight == 0 || elapsed >= self.deadline {
                break DrainOutcome {
                    drained: in_flight == 0,
                    in_flight,
                    elapsed,
                };
            }
            tokio::time::sleep(POLL).await;
        };
        self.broker
            .metrics()
            .drain_seconds
            .observe(outcome.elapsed.as_secs_f64());
        if outcome.drained {
            tracing::info!(after = ?outcome.elapsed, "drained");
        } else {
            tracing::warn!(
                in_flight = outcome.in_flight,
                "drain deadline reached with requests in flight"
            );
        }
        outcome
    }
}

//! Drain (`docs/design/handoff.md#when-a-pod-drains`): the pod stops taking new sessions, hands its
//! sessions to peers, lets the requests in flight finish, within `spec.drain.timeout`.
//!
//! Started only from inside the pod: by `tether-sidecar drain` on the drain socket
//! ([`crate::ops::control`], the sidecar's `preStop` hook), by the own Pod's deletion timestamp
//! (Kubernetes membership) and by SIGTERM ([`crate::ops::shutdown`]). A drain runs once: every
//! trigger, concurrent or later, waits for the same [`DrainOutcome`]; the admin `/drained`
//! ([`crate::ops::admin`], the MCP server's `preStop` hook) waits for it without starting one.
//!
//! 1. The pod is marked draining: `/readyz` answers 503, new sessions and new 2026-07-28
//!    requests go to routable peers; its `subscriptions/listen` streams end cleanly, so that their
//!    clients listen again on a routable pod ([`Broker::end_listen_streams`]).
//! 2. Every session held here is handed off ([`Handoff::move_all`]); with `migration: Pin` or
//!    `--handoff false` none is, and the pod serves its sessions until the deadline.
//! 3. The drain ends when no request runs here any more — sessions' and 2026-07-28 ones, which
//!    cannot move and are let finish — and every handed-off stream's tail was forwarded, or at
//!    the deadline: session requests still running then end with a JSON-RPC error
//!    ([`Handoff::cut`]), forwarded to the new holder like any other event.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OnceCell, watch};
use tokio::time::Instant;

use crate::broker::Broker;
use crate::handoff::Handoff;
use crate::lifecycle::Lifecycle;
use crate::ops::metrics::OpsMetrics;

/// How often a drain looks again at what it waits for, woken or not.
const RECHECK: Duration = Duration::from_secs(1);
/// How long the errors of requests cut at the deadline may take to reach new holders.
const CUT_FLUSH: Duration = Duration::from_secs(1);

/// How a drain ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DrainOutcome {
    /// Whether every request in flight finished before the deadline.
    pub(crate) drained: bool,
    /// Sessions still with a request in flight when the drain ended (0 when `drained`).
    pub(crate) in_flight: usize,
    /// Sessions handed to a peer.
    pub(crate) handed_off: usize,
    /// Sessions no peer took (they stay until the pod stops).
    pub(crate) not_moved: usize,
    /// Requests ended with a JSON-RPC error at the deadline.
    pub(crate) cut: u64,
    /// 2026-07-28 requests in flight when the drain started, let finish.
    pub(crate) stateless_in_flight: usize,
    /// `subscriptions/listen` streams ended at the drain's start.
    pub(crate) listen_closed: usize,
    /// Tasks created here that a client could still poll when the drain started (their polls
    /// are served until a client sees them end, or the deadline).
    pub(crate) tasks_open: usize,
    /// Tasks still open when the drain ended (0 when `drained`).
    pub(crate) tasks_left: usize,
    /// How long the drain took.
    pub(crate) elapsed: Duration,
}

/// The pod's drain: started once, awaited by every trigger.
pub(crate) struct Drain {
    broker: Arc<Broker>,
    handoff: Arc<Handoff>,
    lifecycle: Arc<Lifecycle>,
    metrics: Arc<OpsMetrics>,
    deadline: Duration,
    outcome: OnceCell<DrainOutcome>,
    /// When the drain began, on tokio's clock (the system's, but paused in tests).
    began: std::sync::OnceLock<Instant>,
    /// The outcome once the drain ended, for those who wait without starting it.
    ended: watch::Sender<Option<DrainOutcome>>,
}

impl Drain {
    /// The drain of `broker`'s pod, handing sessions off with `handoff`, bounded by `deadline`
    /// (`spec.drain.timeout`); it marks `lifecycle` draining and records its duration in
    /// `metrics`.
    pub(crate) fn new(
        broker: Arc<Broker>,
        handoff: Arc<Handoff>,
        lifecycle: Arc<Lifecycle>,
        metrics: Arc<OpsMetrics>,
        deadline: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            broker,
            handoff,
            lifecycle,
            metrics,
            deadline,
            outcome: OnceCell::new(),
            began: std::sync::OnceLock::new(),
            ended: watch::Sender::new(None),
        })
    }

    /// Drains the pod (the first call) or waits for the drain under way; returns its outcome.
    pub(crate) async fn run(&self) -> DrainOutcome {
        *self.outcome.get_or_init(|| self.drain()).await
    }

    /// When the drain began (`None` before it did), on the system's clock.
    pub(crate) fn began(&self) -> Option<std::time::Instant> {
        self.began.get().map(|began| began.into_std())
    }

    /// Waits, for at most `limit`, until a drain started by someone else has ended; never
    /// starts one. `None` when `limit` passed first (no drain, or one still running).
    pub(crate) async fn ended(&self, limit: Duration) -> Option<DrainOutcome> {
        let mut ended = self.ended.subscribe();
        tokio::time::timeout(limit, ended.wait_for(Option::is_some))
            .await
            .ok()?
            .ok()
            .and_then(|outcome| *outcome)
    }

    /// The drain's deadline (`spec.drain.timeout`).
    pub(crate) fn deadline(&self) -> Duration {
        self.deadline
    }

    async fn drain(&self) -> DrainOutcome {
        self.lifecycle.start_draining();
        let started = *self.began.get_or_init(Instant::now);
        let deadline = started + self.deadline;
        let listen_closed = self.broker.end_listen_streams();
        let stateless_in_flight = self.broker.stateless_in_flight();
        let tasks_open = self.broker.open_tasks();
        tracing::info!(deadline = ?self.deadline, handoff = self.handoff.enabled(), stateless_in_flight, listen_closed, tasks_open, "draining: no new sessions");
        let (handed_off, not_moved) = self.handoff.move_all(deadline.into_std()).await;
        if handed_off + not_moved > 0 {
            tracing::info!(handed_off, not_moved, "sessions handed off");
        }
        // Sessions that stay (Pin, no handoff, no peer) are served until the deadline.
        let keep_serving = !self.handoff.enabled() || not_moved > 0;
        let busy = || {
            self.broker.in_flight() > 0
                || self.broker.stateless_in_flight() > 0
                || self.broker.open_tasks() > 0
                || self.handoff.following() > 0
                || (keep_serving && !self.broker.sessions().is_empty())
        };
        self.wait_until(deadline, || !busy()).await;
        let in_flight =
            self.broker.in_flight() + self.handoff.following() + self.broker.stateless_in_flight();
        let mut cut = 0;
        if in_flight > 0 {
            cut = self.handoff.cut();
            let flushed_by = Instant::now() + CUT_FLUSH;
            self.wait_until(flushed_by, || self.handoff.following() == 0)
                .await;
        }
        // What stays here ends with the pod: no replica of it may be promoted elsewhere.
        self.handoff.withdraw_replicas().await;
        let tasks_left = self.broker.open_tasks();
        let outcome = DrainOutcome {
            drained: in_flight == 0 && tasks_left == 0,
            in_flight,
            handed_off,
            not_moved,
            cut,
            stateless_in_flight,
            listen_closed,
            tasks_open,
            tasks_left,
            elapsed: started.elapsed(),
        };
        self.metrics.drain_took(outcome.elapsed);
        if outcome.drained {
            tracing::info!(after = ?outcome.elapsed, "drained");
        } else {
            tracing::warn!(
                in_flight = outcome.in_flight,
                cut = outcome.cut,
                "drain deadline reached with requests in flight; they ended with an error"
            );
        }
        self.ended.send_replace(Some(outcome));
        outcome
    }

    /// Waits until `done()` holds or `until` passes, re-checking whenever the pod's activity
    /// changes (a request ended, a stream completed, a session left).
    async fn wait_until(&self, until: Instant, done: impl Fn() -> bool) {
        let activity = self.broker.activity();
        loop {
            let changed = activity.notified();
            if done() || Instant::now() >= until {
                return;
            }
            tokio::select! {
                () = changed => {}
                // What ends without a wake-up (a task's `ttlMs` passing) is seen within a second.
                () = tokio::time::sleep(RECHECK) => {}
                () = tokio::time::sleep_until(until) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests;

//! Periodic upkeep: buffer TTL, idle session expiry (`session.idleTimeout`), the pod-wide
//! buffer and retry-state caps and the gauges (streams, buffers, `tether_retained_bytes`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Broker;
use crate::mcp::rejection::NotFound;
use crate::retained::Kind;
use crate::session::RetryRoom;

impl Broker {
    /// Evicts expired events, ends idle sessions (later requests get 404, reason `expired`;
    /// the upstream is told with DELETE) and refreshes the stream and buffer gauges.
    pub(crate) fn sweep(self: &Arc<Self>, now: Instant) {
        let (mut streams, mut events, mut bytes) = (0usize, 0usize, 0u64);
        let cfg = self.cfg();
        // A reload that shortened the timeout gives every session the new timeout from the
        // reload on, so sessions do not all expire in the next sweep.
        let since_reload = cfg
            .reloaded_at
            .map_or(Duration::MAX, |at| now.saturating_duration_since(at));
        let expire = since_reload >= cfg.idle_timeout;
        for session in self.registry.all() {
            let evicted = session.evict_expired(now);
            self.metrics.evictions(&evicted);
            if expire && session.is_idle(now, cfg.idle_timeout) {
                self.end_session(&session, NotFound::Expired);
                continue;
            }
            let (s, e, b) = session.buffered();
            streams += s;
            events += e;
            bytes += b;
        }
        self.enforce_pod_cap();
        self.enforce_retry_cap();
        self.metrics
            .buffered(streams, events, bytes, self.budget.unsent());
        for kind in Kind::ALL {
            self.metrics
                .retained(kind.label(), self.retained().bytes(kind));
        }
        self.metrics.retained("buffers", self.budget.used());
    }

    /// [`Broker::enforce_pod_cap`] from the data path, at most every 50 ms.
    pub(super) fn enforce_pod_cap_soon(&self) {
        if due(&self.last_cap_enforcement) {
            self.enforce_pod_cap();
        }
    }

    /// Whether events no client was sent take the pod's whole `--pod-buffer-bytes`: a new
    /// request then gets 429 `pod_buffers_full`, since its events would wait for room too.
    /// When the pod is over its cap with events that were sent, those go (soon) instead.
    pub(super) fn buffers_full(&self) -> bool {
        if self.budget.over() {
            self.enforce_pod_cap_soon();
        }
        self.budget.full_of_unsent()
    }

    /// What a new request's retry records must fit in: the session's budget, and whether the
    /// pod's retry state is over its own once the oldest spent streams were forgotten.
    pub(super) fn retry_room(&self) -> RetryRoom {
        if self.retained().retry_over() && due(&self.last_retry_enforcement) {
            self.enforce_retry_cap();
        }
        let cfg = self.cfg();
        RetryRoom {
            session_bytes: cfg.max_session_retry_bytes,
            pod_full: self.retained().retry_over(),
            window: cfg.retry_window,
        }
    }

    /// Keeps the pod's retry state (records and stored replies) under `--pod-retry-bytes`:
    /// when over, the pod's spent streams are forgotten, oldest first, then the records of
    /// streams no longer held, until it is ⅞ of the cap (room for the requests of the next
    /// 50 ms, when the data path may not enforce it again).
    pub(crate) fn enforce_retry_cap(&self) {
        if !self.retained().retry_over() {
            return;
        }
        let retained = self.retained();
        let over = || retained.retry_above(7, 8);
        let now = Instant::now();
        let sessions = self.registry.all();
        let mut spent: Vec<_> = sessions
            .iter()
            .flat_map(|s| {
                s.spent_streams(now)
                    .into_iter()
                    .map(move |(created, key)| (created, s, key))
            })
            .collect();
        spent.sort_by_key(|(created, ..)| *created);
        for (_, session, key) in spent {
            if !over() {
                return;
            }
            session.forget_spent(&key, now);
        }
        for session in &sessions {
            if !over() {
                return;
            }
            session.shed_retry_state(0);
        }
    }

    /// Keeps the pod under its buffer byte cap: when over, the events client connections were
    /// sent are evicted, the streams nobody reads first, oldest first (a later resume before
    /// them gets `cursor_evicted`). Events nobody was sent stay: while they fill the cap, their
    /// streams' upstream tasks wait and new requests are refused
    /// (`docs/design/buffering.md#backpressure`).
    pub(crate) fn enforce_pod_cap(&self) {
        if !self.budget.over() {
            return;
        }
        let mut candidates: Vec<_> = self
            .registry
            .all()
            .iter()
            .flat_map(|s| s.streams())
            .filter_map(|s| s.oldest().map(|at| (s.is_active(), at, s)))
            .collect();
        candidates.sort_by_key(|(active, at, _)| (*active, *at));
        let mut evicted = 0;
        for (.., stream) in candidates {
            if !self.budget.over() {
                break;
            }
            evicted += stream.evict_sent();
        }
        self.metrics.evictions(&crate::stream::buffer::Evictions {
            pod_cap: evicted,
            ..Default::default()
        });
    }
}

/// Whether a cap enforcement from the data path is due: none ran in the last 50 ms (and no
/// other is starting now); if so, it counts as running now.
fn due(last: &parking_lot::Mutex<Option<Instant>>) -> bool {
    let now = Instant::now();
    let Some(mut last) = last.try_lock() else {
        return false;
    };
    if last.is_some_and(|t| now.duration_since(t) < Duration::from_millis(50)) {
        return false;
    }
    *last = Some(now);
    true
}

//! Periodic upkeep: buffer TTL, idle session expiry (`session.idleTimeout`), the pod-wide
//! buffer cap and the gauges (streams, buffers, `tether_retained_bytes`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Broker;
use crate::mcp::rejection::NotFound;
use crate::session::retained::Kind;

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
        self.metrics.buffered(streams, events, bytes);
        for kind in Kind::ALL {
            self.metrics
                .retained(kind.label(), self.retained().bytes(kind));
        }
        self.metrics.retained("buffers", self.budget.used());
    }

    /// [`Broker::enforce_pod_cap`] from the data path, at most every 50 ms.
    pub(super) fn enforce_pod_cap_soon(&self) {
        let now = Instant::now();
        let Some(mut last) = self.last_cap_enforcement.try_lock() else {
            return;
        };
        if last.is_some_and(|t| now.duration_since(t) < Duration::from_millis(50)) {
            return;
        }
        *last = Some(now);
        drop(last);
        self.enforce_pod_cap();
    }

    /// Keeps the pod under its buffer byte cap: when over, the buffers of complete streams that
    /// nobody reads are emptied, oldest first (they become tombstones; a later resume into them
    /// gets `cursor_evicted`). Live streams only evict their own oldest events as they grow.
    pub(crate) fn enforce_pod_cap(&self) {
        if !self.budget.over() {
            return;
        }
        let mut candidates: Vec<_> = self
            .registry
            .all()
            .iter()
            .flat_map(|s| s.streams())
            .filter(|s| s.is_complete() && !s.is_active())
            .filter_map(|s| s.oldest().map(|at| (at, s)))
            .collect();
        candidates.sort_by_key(|(at, _)| *at);
        let mut evicted = 0;
        for (_, stream) in candidates {
            if !self.budget.over() {
                break;
            }
            evicted += stream.evict_if_idle();
        }
        self.metrics.evictions(&crate::stream::buffer::Evictions {
            pod_cap: evicted,
            ..Default::default()
        });
    }
}

//! Periodic upkeep: buffer TTL, idle session expiry (`session.idleTimeout`) and the gauges.

use std::sync::Arc;
use std::time::Instant;

use super::Broker;
use crate::reply::NotFound;

impl Broker {
    /// Evicts expired events, ends idle sessions (later requests get 404, reason `expired`;
    /// the upstream is told with DELETE) and refreshes the stream and buffer gauges.
    pub fn sweep(self: &Arc<Self>, now: Instant) {
        let (mut streams, mut events, mut bytes) = (0i64, 0i64, 0i64);
        for session in self.registry.all() {
            let evicted = session.evict_expired(now);
            self.metrics.record_evictions(&evicted);
            if session.is_idle(now, self.cfg.idle_timeout) {
                self.end_session(&session, NotFound::Expired);
                continue;
            }
            let (s, e, b) = session.buffered();
            streams += s as i64;
            events += e as i64;
            bytes += i64::try_from(b).unwrap_or(i64::MAX);
        }
        self.metrics.streams.set(streams);
        self.metrics.buffer_events.set(events);
        self.metrics.buffer_bytes.set(bytes);
    }
}

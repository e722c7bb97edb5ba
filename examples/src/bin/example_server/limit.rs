//! `--rate-limit N`: the example server as a rate-limited MCP server. Each caller (the token's
//! `sub` with `--auth-key`, else everyone as one) may make N MCP requests per window of
//! `--rate-window-ms`, counted from its first request of the window; beyond, the request gets
//! 429 with `Retry-After` (the whole seconds left of the window, at least 1) before the MCP
//! service sees it, as a gateway's or server's rate limiter answers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Requests per caller and window.
pub(crate) struct RateLimit {
    limit: u64,
    window: Duration,
    /// Caller → start of its window, requests in it.
    windows: Mutex<HashMap<String, (Instant, u64)>>,
}

impl RateLimit {
    /// `limit` requests per `window` and caller.
    pub(crate) fn new(limit: u64, window: Duration) -> Self {
        Self {
            limit,
            window,
            windows: Mutex::default(),
        }
    }

    /// Counts a request of `caller` at `now`: `None` when it may go on, else the seconds to
    /// send in `Retry-After`.
    pub(crate) fn check(&self, caller: &str, now: Instant) -> Option<u64> {
        let mut windows = self.windows.lock();
        let (start, used) = windows.entry(caller.to_owned()).or_insert((now, 0));
        if now.saturating_duration_since(*start) >= self.window {
            (*start, *used) = (now, 0);
        }
        if *used < self.limit {
            *used += 1;
            return None;
        }
        let left = self
            .window
            .saturating_sub(now.saturating_duration_since(*start));
        Some(left.as_secs_f64().ceil().max(1.0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_beyond_its_limit_waits_for_its_next_window() {
        let limit = RateLimit::new(2, Duration::from_secs(3));
        let t0 = Instant::now();
        assert_eq!(limit.check("alice", t0), None);
        assert_eq!(limit.check("alice", t0), None);
        assert_eq!(
            limit.check("alice", t0 + Duration::from_millis(500)),
            Some(3)
        );
        assert_eq!(limit.check("bob", t0), None, "callers are counted apart");
        assert_eq!(limit.check("alice", t0 + Duration::from_secs(3)), None);
    }
}

//! A session's budget of stream take-overs (`--max-takeovers`): a GET that ends another
//! connection's read of one of the session's streams (spec T-09) is allowed so many times a
//! second, so a client reopening GETs in a loop cannot churn the session's streams without end.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

/// Take-overs are counted in fixed windows of this length.
pub(crate) const WINDOW: Duration = Duration::from_secs(1);

/// The take-overs of the current window.
#[derive(Debug, Default)]
pub(crate) struct Takeovers {
    window: Option<Instant>,
    count: u32,
}

impl Takeovers {
    /// Counts a take-over at `now` when fewer than `max` happened in the current window;
    /// `false` (nothing counted) when the window's budget is spent.
    pub(crate) fn admit(&mut self, now: Instant, max: NonZeroU32) -> bool {
        if self
            .window
            .is_none_or(|start| now.saturating_duration_since(start) >= WINDOW)
        {
            self.window = Some(now);
            self.count = 0;
        }
        if self.count >= max.get() {
            return false;
        }
        self.count += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_take_overs_a_window_and_the_next_window_starts_afresh() {
        let max = NonZeroU32::new(3).unwrap();
        let t0 = Instant::now();
        let mut t = Takeovers::default();
        let first: Vec<bool> = (0..5)
            .map(|i| t.admit(t0 + Duration::from_millis(i * 100), max))
            .collect();
        assert_eq!(first, [true, true, true, false, false]);
        assert!(!t.admit(t0 + WINDOW - Duration::from_millis(1), max));
        assert!(t.admit(t0 + WINDOW, max), "a new window");
        assert!(t.admit(t0 + WINDOW, max));
        assert!(t.admit(t0 + WINDOW, max));
        assert!(!t.admit(t0 + WINDOW, max));
    }
}

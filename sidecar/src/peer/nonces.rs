//! The nonces of peer messages seen within the time window, so a captured message sent again is
//! refused (409 `replayed`, `docs/design/peer-protocol.md#authentication`).
//!
//! A message's time is within [`auth::WINDOW`](super::auth::WINDOW) of the receiver's clock, so
//! a copy of it can be accepted at most `2 × WINDOW` after the original arrived: each nonce is
//! kept that long from its arrival, then forgotten (oldest first). At most [`MAX_NONCES`] are
//! kept (only messages whose MAC verified add one): beyond that a message gets 503 `busy` until
//! the oldest expire, never an unbounded table.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::auth::Nonce;

/// Most nonces remembered.
pub(crate) const MAX_NONCES: usize = 65_536;

/// Why a nonce was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NonceError {
    /// Seen within the window: a replay.
    Replayed,
    /// The table is full of nonces still within the window.
    Full,
}

#[derive(Debug, Default)]
struct Seen {
    set: HashSet<Nonce>,
    /// Arrival order, for expiry.
    order: VecDeque<(Instant, Nonce)>,
}

/// The nonces seen within the window.
#[derive(Debug)]
pub(crate) struct Nonces {
    seen: Mutex<Seen>,
    keep: Duration,
    max: usize,
}

impl Nonces {
    /// A table keeping each nonce for `keep` (twice the time window), at most `max` of them.
    pub(crate) fn new(keep: Duration, max: usize) -> Self {
        Self {
            seen: Mutex::default(),
            keep,
            max,
        }
    }

    /// Records `nonce`, arrived at `now`.
    ///
    /// # Errors
    /// [`NonceError::Replayed`] when it was seen within the window; [`NonceError::Full`] when
    /// [`MAX_NONCES`] are still within it.
    pub(crate) fn admit(&self, nonce: Nonce, now: Instant) -> Result<(), NonceError> {
        let mut seen = self.seen.lock();
        while let Some(&(at, old)) = seen.order.front() {
            if now.saturating_duration_since(at) < self.keep {
                break;
            }
            seen.order.pop_front();
            seen.set.remove(&old);
        }
        if seen.set.contains(&nonce) {
            return Err(NonceError::Replayed);
        }
        if seen.set.len() >= self.max {
            return Err(NonceError::Full);
        }
        seen.set.insert(nonce);
        seen.order.push_back((now, nonce));
        Ok(())
    }

    /// How many nonces are remembered (`tether_peer_nonces`).
    pub(crate) fn len(&self) -> usize {
        self.seen.lock().set.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nonce_is_refused_within_the_window_and_forgotten_after_it() {
        let nonces = Nonces::new(Duration::from_secs(60), 4);
        let t0 = Instant::now();
        assert_eq!(nonces.admit([1; 16], t0), Ok(()));
        assert_eq!(
            nonces.admit([1; 16], t0 + Duration::from_secs(59)),
            Err(NonceError::Replayed)
        );
        assert_eq!(nonces.admit([1; 16], t0 + Duration::from_secs(60)), Ok(()));
        assert_eq!(nonces.len(), 1);
    }

    #[test]
    fn a_full_table_refuses_until_the_oldest_expire() {
        let nonces = Nonces::new(Duration::from_secs(10), 3);
        let t0 = Instant::now();
        for n in 0..3u8 {
            assert_eq!(
                nonces.admit([n; 16], t0 + Duration::from_secs(u64::from(n))),
                Ok(())
            );
        }
        assert_eq!(
            nonces.admit([9; 16], t0 + Duration::from_secs(5)),
            Err(NonceError::Full)
        );
        assert_eq!(nonces.len(), 3, "never more than the bound");
        assert_eq!(nonces.admit([9; 16], t0 + Duration::from_secs(10)), Ok(()));
        assert_eq!(nonces.len(), 3, "the oldest gave its place");
    }
}

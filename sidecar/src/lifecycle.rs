//! The pod's lifecycle as every service sees it (`docs/design/architecture.md#lifecycle`): the
//! pod serves, then drains — `/readyz` answers 503, new sessions are placed on peers, no handoff
//! is adopted — until it stops. One [`Lifecycle`] is shared by the services of a pod.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the pod still serves or drains.
#[derive(Debug, Default)]
pub(crate) struct Lifecycle {
    draining: AtomicBool,
}

impl Lifecycle {
    /// Marks the pod draining; `true` the first time.
    pub(crate) fn start_draining(&self) -> bool {
        !self.draining.swap(true, Ordering::Relaxed)
    }

    /// Whether the pod drains: it is not ready for new clients, new sessions or handoffs.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_drains_once_and_for_good() {
        let l = Lifecycle::default();
        assert!(!l.is_draining());
        assert!(l.start_draining());
        assert!(!l.start_draining(), "a second trigger finds it draining");
        assert!(l.is_draining());
    }
}

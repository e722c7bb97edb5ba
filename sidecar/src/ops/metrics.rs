//! What running the pod counts (`docs/reference/metrics.md`): how long the drain took, and the
//! admin requests refused.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Why the admin listener refused a request (`tether_admin_refused_total{reason}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum AdminRefusal {
    /// `/drain` on the admin port: a drain starts only through the drain socket.
    DrainNotLocal,
}

impl AdminRefusal {
    /// The `reason` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::DrainNotLocal => "drain_not_local",
        }
    }
}

label_value!(AdminRefusal);

/// Labels of `tether_admin_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabel {
    /// Why the request was refused.
    reason: AdminRefusal,
}

/// The metrics of running the pod.
#[derive(Debug)]
pub(crate) struct OpsMetrics {
    /// Time from the start of a drain to its end (all requests done, or the deadline), in
    /// seconds.
    drain_seconds: Histogram,
    /// Admin requests refused, by reason.
    admin_refused: Family<RefusalLabel, Counter>,
}

impl OpsMetrics {
    /// The metrics of running the pod, registered in `r`.
    pub(crate) fn new(r: &mut Registry) -> Self {
        let m = Self {
            drain_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            admin_refused: Family::default(),
        };
        r.register(
            "drain_seconds",
            "Time a drain took, until requests in flight finished or the deadline",
            m.drain_seconds.clone(),
        );
        r.register(
            "admin_refused",
            "Admin requests refused, by reason",
            m.admin_refused.clone(),
        );
        m
    }

    /// How long a drain took (`tether_drain_seconds`).
    pub(crate) fn drain_took(&self, took: Duration) {
        self.drain_seconds.observe(took.as_secs_f64());
    }

    /// An admin request refused (`tether_admin_refused_total{reason}`).
    pub(crate) fn admin_refused(&self, reason: AdminRefusal) {
        self.admin_refused
            .get_or_create(&RefusalLabel { reason })
            .inc();
    }
}

//! The operator's Prometheus metrics, served on the admin port's `/metrics` (text format).
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `tether_operator_reconciles_total` | `result` (`ok`, `error`) | reconciles run |
//! | `tether_operator_reconcile_seconds` | | duration of a reconcile, in seconds |
//! | `tether_operator_reconcile_failures_total` | `reason` ([`crate::error::Error::metric_label`]) | reconciles that failed |
//! | `tether_operator_key_steps_total` | `step` (`staged`, `promoted`, `retired`) | key-rotation steps written to an endpoint's key ring |

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label of a reconcile's result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabel {
    /// `ok` or `error`.
    pub(crate) result: &'static str,
}

/// Label of a failure's reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    /// The error's metric label.
    pub(crate) reason: &'static str,
}

/// Label of a key-rotation step.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StepLabel {
    /// `staged`, `promoted` or `retired`.
    pub(crate) step: &'static str,
}

/// The operator's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabel, Counter>,
    reconcile_seconds: Histogram,
    failures: Family<ReasonLabel, Counter>,
    key_steps: Family<StepLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tether_operator");
        let reconciles = Family::<ResultLabel, Counter>::default();
        // 1 ms .. ~16 s.
        let reconcile_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let failures = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles run, by result",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_seconds",
            "Duration of a reconcile, in seconds",
            reconcile_seconds.clone(),
        );
        registry.register(
            "reconcile_failures",
            "Reconciles that failed, by reason",
            failures.clone(),
        );
        let key_steps = Family::<StepLabel, Counter>::default();
        registry.register(
            "key_steps",
            "Key-rotation steps written to an endpoint's key ring, by step",
            key_steps.clone(),
        );
        Self {
            registry,
            reconciles,
            reconcile_seconds,
            failures,
            key_steps,
        }
    }
}

impl Metrics {
    /// Records one reconcile: `Err(reason)` when it failed.
    pub fn observe(&self, result: Result<(), &'static str>, elapsed: Duration) {
        let label = match result {
            Ok(()) => "ok",
            Err(reason) => {
                self.failures.get_or_create(&ReasonLabel { reason }).inc();
                "error"
            }
        };
        self.reconciles
            .get_or_create(&ResultLabel { result: label })
            .inc();
        self.reconcile_seconds.observe(elapsed.as_secs_f64());
    }

    /// Records a step of the key ring by the reason of its Event (`KeyStaged`, `KeyPromoted`,
    /// `KeyRetired`); other Events of the key ring are no rotation step.
    pub(crate) fn key_step(&self, reason: &str) {
        let step = match reason {
            "KeyStaged" => "staged",
            "KeyPromoted" => "promoted",
            "KeyRetired" => "retired",
            _ => return,
        };
        self.key_steps.get_or_create(&StepLabel { step }).inc();
    }

    /// The metrics in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_doc_lists_every_operator_metric_with_its_type() {
        use tether_tests::repo::{assert_documented, documented_metrics, exposed_families};
        let m = Metrics::default();
        // One failed reconcile and one rotation step give every family a sample.
        m.observe(Err("api"), Duration::from_millis(1));
        m.key_step("KeyStaged");
        m.key_step("NewKey");
        let text = m.encode();
        assert!(
            text.contains("tether_operator_key_steps_total{step=\"staged\"} 1"),
            "{text}"
        );
        assert!(
            !text.contains("NewKey") && !text.contains("new_key"),
            "{text}"
        );
        let families = exposed_families(&text);
        assert_eq!(
            families.len(),
            4,
            "a family has no sample here: give each new one a sample"
        );
        assert_documented(
            "the operator's",
            &families,
            &documented_metrics(Some("Operator")),
        );
    }
}

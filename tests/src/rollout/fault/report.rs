//! The report of a fault run and its table; the runs of a demo print side by side ([`table`]).
//!
//! Client figures are counted from what the clients received, as in a rollout's report; "tools
//! executed twice" merges the example servers' `/stats` (the lost pod's executions read from its
//! server's `--log-calls` lines); the peak RSS is the largest `VmHWM` of any sidecar of the run
//! (a crashed sidecar's read just before the kill).

use std::time::Duration;

use super::super::report::by_reason;
use super::{Fault, NO_REPLICATION};
use crate::load::millis;
use crate::rollout::RolloutReport;
use crate::table;

/// What one fault run showed.
#[derive(Clone, Debug)]
pub struct FaultReport {
    /// How the pod failed.
    pub fault: Fault,
    /// `spec.session.replication` of the pods.
    pub replication: String,
    /// What the clients experienced and the sidecars counted, as in a rollout (its label is the
    /// column's title; it has no drains).
    pub run: RolloutReport,
    /// Sessions the clients held at the kill that the lost pod had created.
    pub lost_pod_sessions: usize,
    /// From the kill to the first success of a request of one of those sessions sent after
    /// it; `None`: none was served again.
    pub failover: Option<Duration>,
    /// Answers 503 the clients got after the kill (each attempt of a request sent again after
    /// its `Retry-After` counts).
    pub unavailable: u64,
    /// From the kill until the crashed sidecar was ready again, or the replacement pod
    /// routable.
    pub back_after: Duration,
}

impl FaultReport {
    /// Whether the pods kept replicas (the bar applies).
    pub fn replicated(&self) -> bool {
        self.replication != NO_REPLICATION
    }

    /// The bar of a run with replication: no client-visible 404, no session lost, no tool
    /// executed twice, no event lost without the sidecar saying so.
    pub fn meets_bar(&self) -> bool {
        let l = &self.run.load;
        l.not_found == 0
            && self.run.sessions_lost == 0
            && l.executed_twice == 0
            && l.lost_silently() == 0
    }

    /// The rows of the table: label and value.
    fn rows(&self) -> Vec<(&'static str, String)> {
        let r = &self.run;
        let l = &r.load;
        let streams: u64 = l.announced.values().sum();
        let bar = match (self.replicated(), self.meets_bar()) {
            (false, _) => "-",
            (true, true) => "met",
            (true, false) => "NOT met",
        };
        vec![
            (
                "clients / sessions",
                format!("{} / {}", r.clients, l.sessions),
            ),
            (
                "sessions on the lost pod at the kill",
                self.lost_pod_sessions.to_string(),
            ),
            ("client-visible 404s", l.not_found.to_string()),
            (
                "sessions lost (client started a new one)",
                r.sessions_lost.to_string(),
            ),
            ("tools executed twice", l.executed_twice.to_string()),
            ("events lost silently", l.lost_silently().to_string()),
            (
                "events announced lost (streams)",
                format!("{} ({streams})", l.announced_lost),
            ),
            ("announced by reason (streams)", by_reason(&l.announced)),
            (
                "requests answered 503 after the kill",
                self.unavailable.to_string(),
            ),
            (
                "failover time (kill to a lost-pod session served)",
                self.failover.map_or_else(
                    || "never".to_owned(),
                    |d| format!("{:.2} s", d.as_secs_f64()),
                ),
            ),
            (
                "pod back / replaced after (s)",
                format!("{:.2}", self.back_after.as_secs_f64()),
            ),
            ("resume latency p99", millis(l.resume_quantile(0.99))),
            (
                "peak sidecar RSS (largest VmHWM)",
                format!("{:.1} MiB", r.peak_rss_bytes as f64 / (1024.0 * 1024.0)),
            ),
            ("sidecar 404s by reason", by_reason(&r.sidecar.not_found)),
            ("other client errors", l.failures.len().to_string()),
            (
                "bar (0 404s, sessions lost, tools twice, silent losses)",
                bar.to_owned(),
            ),
            ("wall time", format!("{:.1} s", l.elapsed.as_secs_f64())),
        ]
    }
}

/// Several fault runs side by side, one column each.
pub fn table(reports: &[&FaultReport]) -> String {
    let runs: Vec<(&str, Vec<(&str, String)>)> = reports
        .iter()
        .map(|r| (r.run.label.as_str(), r.rows()))
        .collect();
    table::side_by_side(&runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(replication: &str) -> FaultReport {
        FaultReport {
            fault: Fault::SidecarCrash,
            replication: replication.into(),
            run: RolloutReport::new(format!("sidecar crash / {replication}"), 3, 100),
            lost_pod_sessions: 33,
            failover: None,
            unavailable: 0,
            back_after: Duration::from_millis(300),
        }
    }

    #[test]
    fn the_bar_counts_silent_losses_not_announced_ones() {
        let mut replicated = report("Sessions");
        replicated.run.load.lost = 40;
        replicated.run.load.announced_lost = 40;
        replicated
            .run
            .load
            .announced
            .insert("holder_lost".into(), 5);
        replicated.failover = Some(Duration::from_millis(1500));
        assert!(replicated.meets_bar());
        let mut baseline = report(NO_REPLICATION);
        baseline.run.sessions_lost = 33;
        baseline.run.load.not_found = 33;
        baseline.run.load.lost = 7;
        assert!(!baseline.meets_bar() && !baseline.replicated());
        let text = table(&[&replicated, &baseline]);
        let row = |label: &str| table::row(&text, label).split_off(1);
        assert_eq!(row("events lost silently"), ["0", "7"]);
        assert_eq!(row("events announced lost (streams)"), ["40 (5)", "0 (0)"]);
        assert_eq!(
            row("failover time (kill to a lost-pod session served)"),
            ["1.50 s", "never"]
        );
        assert_eq!(
            row("bar (0 404s, sessions lost, tools twice, silent losses)"),
            ["met", "-"]
        );
    }
}

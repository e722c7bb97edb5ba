//! A soak: the same rollout run many times (`make soak`), one row per run and the totals.
//!
//! A run is *clean* for the soak when no client saw a foreign or lost event, a 404, a tool run
//! twice, or a request answered after [`crate::client::LATE_HEAD`] or more; other client errors
//! are counted beside.

use std::time::Duration;

use super::RolloutReport;
use crate::load::millis;
use crate::table;

/// What one run of a soak showed.
#[derive(Clone, Debug, Default)]
pub struct SoakRow {
    /// Sessions initialized.
    pub sessions: u64,
    /// Client-visible 404s.
    pub not_found: u64,
    /// Events lost.
    pub lost: u64,
    /// Events of another request or stream.
    pub foreign: u64,
    /// Events received twice.
    pub duplicated: u64,
    /// Tools the MCP servers ran twice.
    pub executed_twice: u64,
    /// Requests answered after 10 s or more, or never.
    pub late_heads: u64,
    /// Other client errors.
    pub other_errors: u64,
    /// Resume latency p99.
    pub resume_p99: Option<Duration>,
    /// The longest drain.
    pub longest_drain: Duration,
    /// Drains that reached `spec.drain.timeout`.
    pub drains_timed_out: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl SoakRow {
    /// The row of `report`.
    pub fn of(report: &RolloutReport) -> Self {
        let load = &report.load;
        Self {
            sessions: load.sessions,
            not_found: load.not_found,
            lost: load.lost,
            foreign: load.foreign,
            duplicated: load.duplicated,
            executed_twice: load.executed_twice,
            late_heads: report.late_heads.0,
            other_errors: load.failures.len() as u64,
            resume_p99: load.resume_quantile(0.99),
            longest_drain: report
                .drains
                .iter()
                .map(|d| d.elapsed)
                .max()
                .unwrap_or_default(),
            drains_timed_out: report.drains.iter().filter(|d| !d.drained).count() as u64,
            elapsed: load.elapsed,
        }
    }

    /// Whether the run holds the soak's bar.
    pub fn is_clean(&self) -> bool {
        self.not_found == 0
            && self.lost == 0
            && self.foreign == 0
            && self.duplicated == 0
            && self.executed_twice == 0
            && self.late_heads == 0
    }

    fn cells(&self) -> Vec<String> {
        vec![
            if self.is_clean() { "clean" } else { "FAILED" }.to_owned(),
            self.sessions.to_string(),
            self.not_found.to_string(),
            self.lost.to_string(),
            self.foreign.to_string(),
            self.duplicated.to_string(),
            self.executed_twice.to_string(),
            self.late_heads.to_string(),
            self.other_errors.to_string(),
            millis(self.resume_p99),
            format!(
                "{:.1} ({} timed out)",
                self.longest_drain.as_secs_f64(),
                self.drains_timed_out
            ),
            format!("{:.0}", self.elapsed.as_secs_f64()),
        ]
    }
}

/// The soak's table: a row per run, then the totals (clean runs out of all, counts summed, the
/// worst p99 and drain).
pub fn soak_table(rows: &[SoakRow]) -> String {
    let header = [
        "run",
        "result",
        "sessions",
        "404s",
        "lost",
        "foreign",
        "duplicated",
        "run twice",
        "answered after 10 s",
        "other errors",
        "resume p99",
        "longest drain s",
        "wall s",
    ];
    let labels: Vec<String> = (1..=rows.len()).map(|i| i.to_string()).collect();
    let mut table_rows: Vec<(&str, Vec<String>)> = labels
        .iter()
        .zip(rows)
        .map(|(label, row)| (label.as_str(), row.cells()))
        .collect();
    let sum = |f: fn(&SoakRow) -> u64| rows.iter().map(f).sum::<u64>();
    let total = SoakRow {
        sessions: sum(|r| r.sessions),
        not_found: sum(|r| r.not_found),
        lost: sum(|r| r.lost),
        foreign: sum(|r| r.foreign),
        duplicated: sum(|r| r.duplicated),
        executed_twice: sum(|r| r.executed_twice),
        late_heads: sum(|r| r.late_heads),
        other_errors: sum(|r| r.other_errors),
        resume_p99: rows.iter().filter_map(|r| r.resume_p99).max(),
        longest_drain: rows
            .iter()
            .map(|r| r.longest_drain)
            .max()
            .unwrap_or_default(),
        drains_timed_out: sum(|r| r.drains_timed_out),
        elapsed: rows.iter().map(|r| r.elapsed).sum(),
    };
    let mut cells = total.cells();
    cells[0] = format!(
        "{}/{} clean",
        rows.iter().filter(|r| r.is_clean()).count(),
        rows.len()
    );
    table_rows.push(("total", cells));
    table::render(&header, &table_rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_with_a_late_answer_is_not_clean_and_the_totals_say_so() {
        let clean = SoakRow {
            sessions: 5000,
            other_errors: 2,
            ..SoakRow::default()
        };
        let late = SoakRow {
            sessions: 5000,
            late_heads: 1,
            ..SoakRow::default()
        };
        assert!(clean.is_clean(), "other errors are counted, not failed on");
        assert!(!late.is_clean());
        let text = soak_table(&[clean, late]);
        let total = text.lines().find(|l| l.contains("total")).unwrap();
        assert!(
            total.contains("1/2 clean") && total.contains("10000"),
            "{text}"
        );
        assert!(text.contains("FAILED"), "{text}");
    }
}

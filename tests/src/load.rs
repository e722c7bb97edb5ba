//! Many concurrent MCP sessions calling `slow`, with random client disconnects and resumes.
//!
//! Every figure of the [`Report`] is counted from what clients received (see [`crate::call`]),
//! except "tools executed twice", which comes from the example server's `/stats`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Semaphore;

use crate::call::{self, CallPlan};
use crate::client::McpClient;

/// The load to run.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Sessions, all started at once (bounded by `concurrency`).
    pub sessions: usize,
    /// `slow` calls per session, one after another.
    pub calls_per_session: usize,
    /// Progress notifications per call.
    pub count: u32,
    /// Milliseconds between them.
    pub interval_ms: u64,
    /// Probability that a call gets cut (once or twice) and resumed.
    pub cut_probability: f64,
    /// Longest pause between a cut and the resume, in ms.
    pub max_pause_ms: u64,
    /// Sessions running at the same time.
    pub concurrency: usize,
    /// Protocol versions sessions ask for, round-robin.
    pub versions: Vec<String>,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            sessions: 100,
            calls_per_session: 3,
            count: 10,
            interval_ms: 20,
            cut_probability: 0.5,
            max_pause_ms: 50,
            concurrency: 100,
            versions: ["2025-03-26", "2025-06-18", "2025-11-25"]
                .map(String::from)
                .to_vec(),
        }
    }
}

/// What the clients experienced, summed over all sessions.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Sessions initialized.
    pub sessions: u64,
    /// Tool calls made.
    pub tool_calls: u64,
    /// Message events received.
    pub events: u64,
    /// Resumes with `Last-Event-ID`.
    pub resumes: u64,
    /// Expected messages never received.
    pub lost: u64,
    /// Messages received twice.
    pub duplicated: u64,
    /// Messages of another request or stream.
    pub foreign: u64,
    /// Call ids the example server executed more than once (from `/stats`).
    pub executed_twice: u64,
    /// Resume latencies (request sent → response headers).
    pub resume_latencies: Vec<Duration>,
    /// Failures, with their first messages.
    pub failures: Vec<String>,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl Report {
    /// The `q` quantile (0..=1) of resume latencies.
    pub fn resume_quantile(&self, q: f64) -> Option<Duration> {
        quantile(&self.resume_latencies, q)
    }

    /// Whether nothing was lost, duplicated, foreign or executed twice, and nothing failed.
    pub fn is_clean(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.foreign == 0
            && self.executed_twice == 0
            && self.failures.is_empty()
    }

    /// The report as a two-column table.
    pub fn table(&self) -> String {
        let ms = |d: Option<Duration>| {
            d.map_or_else(
                || "-".to_owned(),
                |d| format!("{:.2} ms", d.as_secs_f64() * 1e3),
            )
        };
        let rows = [
            ("sessions", self.sessions.to_string()),
            ("tool calls", self.tool_calls.to_string()),
            ("events", self.events.to_string()),
            ("resumes", self.resumes.to_string()),
            ("lost events", self.lost.to_string()),
            ("duplicated events", self.duplicated.to_string()),
            ("foreign events", self.foreign.to_string()),
            ("tools executed twice", self.executed_twice.to_string()),
            ("resume latency p50", ms(self.resume_quantile(0.50))),
            ("resume latency p99", ms(self.resume_quantile(0.99))),
            ("failures", self.failures.len().to_string()),
            ("wall time", format!("{:.1} s", self.elapsed.as_secs_f64())),
        ];
        let mut out = String::new();
        let _ = writeln!(out, "| {:<22} | {:>12} |", "measure", "value");
        let _ = writeln!(out, "|{:-<24}|{:->14}|", "", "");
        for (k, v) in rows {
            let _ = writeln!(out, "| {k:<22} | {v:>12} |");
        }
        out
    }

    fn add(&mut self, other: Report) {
        self.sessions += other.sessions;
        self.tool_calls += other.tool_calls;
        self.events += other.events;
        self.resumes += other.resumes;
        self.lost += other.lost;
        self.duplicated += other.duplicated;
        self.foreign += other.foreign;
        self.resume_latencies.extend(other.resume_latencies);
        self.failures.extend(other.failures);
    }
}

/// Call ids executed more than once, from an example server's `/stats` document.
pub fn executed_twice(stats: &Value) -> u64 {
    stats
        .get("duplicates")
        .and_then(Value::as_object)
        .map_or(0, |m| m.len() as u64)
}

/// The `q` quantile (0..=1, nearest rank) of `samples`; `None` when there are none.
pub fn quantile(samples: &[Duration], q: f64) -> Option<Duration> {
    let mut v = samples.to_vec();
    v.sort_unstable();
    let idx = ((v.len() as f64 - 1.0) * q.clamp(0.0, 1.0)).round() as usize;
    v.get(idx).copied()
}

/// Runs the load against `client`'s endpoint.
pub async fn run(client: &McpClient, cfg: &LoadConfig) -> Report {
    let started = Instant::now();
    let gate = Arc::new(Semaphore::new(cfg.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..cfg.sessions {
        let (client, cfg, gate) = (client.clone(), cfg.clone(), Arc::clone(&gate));
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await;
            session(&client, &cfg, i).await
        });
    }
    let mut report = Report::default();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(r) => report.add(r),
            Err(e) => report.failures.push(format!("session task failed: {e}")),
        }
    }
    report.elapsed = started.elapsed();
    report
}

async fn session(client: &McpClient, cfg: &LoadConfig, index: usize) -> Report {
    let mut report = Report::default();
    let version = &cfg.versions[index % cfg.versions.len().max(1)];
    let session = match client.initialize(version).await {
        Ok(s) => s,
        Err(e) => {
            report.failures.push(format!("session {index}: {e}"));
            return report;
        }
    };
    report.sessions = 1;
    for c in 0..cfg.calls_per_session {
        let call_id = format!("s{index}-c{c}-{:08x}", rand::random::<u32>());
        let plan = plan(cfg);
        report.tool_calls += 1;
        match call::slow(client, &session, c as u64 + 2, &call_id, &plan).await {
            Ok(out) => {
                report.events += out.events;
                report.resumes += out.resumes.len() as u64;
                report.lost += out.lost(cfg.count);
                report.duplicated += out.duplicated;
                report.foreign += out.foreign;
                report.resume_latencies.extend(out.resumes);
                report.failures.extend(out.failures);
            }
            Err(e) => {
                report.lost += u64::from(cfg.count) + 1;
                report.failures.push(format!("{call_id}: {e}"));
            }
        }
    }
    match client.delete(&session).await {
        Ok(status) if status.is_success() => {}
        Ok(status) => report
            .failures
            .push(format!("session {index}: DELETE answered {status}")),
        Err(e) => report
            .failures
            .push(format!("session {index}: DELETE failed: {e}")),
    }
    report
}

/// A random plan: with `cut_probability`, one or two cuts at random points of the call.
fn plan(cfg: &LoadConfig) -> CallPlan {
    let mut cuts = Vec::new();
    if cfg.count > 1 && rand::random_bool(cfg.cut_probability.clamp(0.0, 1.0)) {
        let times = rand::random_range(1..=2u32);
        for _ in 0..times {
            cuts.push(rand::random_range(1..cfg.count));
        }
        cuts.sort_unstable();
        cuts.dedup();
    }
    CallPlan {
        count: cfg.count,
        interval_ms: cfg.interval_ms,
        cuts,
        pause: Duration::from_millis(rand::random_range(0..=cfg.max_pause_ms)),
        close_after: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_cleanliness() {
        let mut r = Report {
            resume_latencies: (1..=100).map(Duration::from_millis).collect(),
            ..Report::default()
        };
        assert_eq!(r.resume_quantile(0.5), Some(Duration::from_millis(51)));
        assert_eq!(r.resume_quantile(0.99), Some(Duration::from_millis(99)));
        assert!(r.is_clean());
        r.foreign = 1;
        assert!(!r.is_clean());
        assert!(r.table().contains("| foreign events"));
    }

    #[test]
    fn counts_duplicate_call_ids() {
        let stats = serde_json::json!({"executions": 5, "duplicates": {"a": 2, "b": 3}});
        assert_eq!(executed_twice(&stats), 2);
    }
}

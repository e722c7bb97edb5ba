//! Many concurrent MCP sessions calling `slow`, with random client disconnects and resumes.
//!
//! Every figure of the [`Report`] is counted from what clients received (see [`crate::call`]),
//! except "tools executed twice", which comes from the example servers' `/stats`
//! ([`Executions`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;
use tokio::sync::{Mutex, MutexGuard, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::call::{self, CallOutcome, CallPlan};
use crate::client::McpClient;
use crate::incident::{Incident, IncidentKind};
use crate::{Result, addr, table};

/// Sessions of the load that share one source address: the load comes from client pods of this
/// many sessions each, each pod's connections counted against a sidecar's per-source bound
/// (`--max-connections-per-source`) like a real client pod's.
pub const SESSIONS_PER_SOURCE: usize = 100;

/// Held by the test of a process that puts the machine under load ([`heavy`]).
static HEAVY: Mutex<()> = Mutex::const_new(());

/// Waits until no other test of this process puts the machine under load, and returns the guard
/// that keeps the others waiting until it is dropped. A test that runs hundreds of sessions or a
/// rollout holds it for its whole run: `cargo test` runs a binary's tests as many at a time as
/// the machine has cores, and two loads at once would compete for them (their timeouts are
/// tuned for one).
pub async fn heavy() -> MutexGuard<'static, ()> {
    HEAVY.lock().await
}

/// The load to run.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Sessions, all started at once (bounded by `concurrency`).
    pub sessions: usize,
    /// `slow` calls per session, one after another (with [`run_until`], the fewest).
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
    /// Answers 404 Not Found to a request of a session the client holds (spec S-05).
    pub not_found: u64,
    /// Expected messages of started streams never received.
    pub lost: u64,
    /// Of those, the messages of streams a JSON-RPC error with a `data.reason` ended (the
    /// sidecar said the request was interrupted): lost, but announced.
    pub announced_lost: u64,
    /// Streams such an error ended, by its reason.
    pub announced: std::collections::BTreeMap<String, u64>,
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
    /// Lost, foreign and duplicated events and failed requests, each with what the client
    /// knows of it (the load of a rollout names their sessions).
    pub incidents: Vec<Incident>,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl Report {
    /// The `q` quantile (0..=1) of resume latencies.
    pub fn resume_quantile(&self, q: f64) -> Option<Duration> {
        quantile(&self.resume_latencies, q)
    }

    /// Expected messages never received and never announced lost ([`Report::announced_lost`]).
    pub fn lost_silently(&self) -> u64 {
        self.lost.saturating_sub(self.announced_lost)
    }

    /// Whether no session was lost (404), nothing was lost, duplicated, foreign or executed
    /// twice, and nothing failed.
    pub fn is_clean(&self) -> bool {
        self.not_found == 0
            && self.lost == 0
            && self.duplicated == 0
            && self.foreign == 0
            && self.executed_twice == 0
            && self.failures.is_empty()
    }

    /// The report as a two-column table.
    pub fn table(&self) -> String {
        let rows = [
            ("sessions", self.sessions.to_string()),
            ("tool calls", self.tool_calls.to_string()),
            ("events", self.events.to_string()),
            ("resumes", self.resumes.to_string()),
            ("404s", self.not_found.to_string()),
            ("lost events", self.lost.to_string()),
            ("duplicated events", self.duplicated.to_string()),
            ("foreign events", self.foreign.to_string()),
            ("tools executed twice", self.executed_twice.to_string()),
            ("resume latency p50", millis(self.resume_quantile(0.50))),
            ("resume latency p99", millis(self.resume_quantile(0.99))),
            ("failures", self.failures.len().to_string()),
            ("wall time", format!("{:.1} s", self.elapsed.as_secs_f64())),
        ];
        let rows: Vec<(&str, Vec<String>)> = rows.into_iter().map(|(k, v)| (k, vec![v])).collect();
        table::render(&["measure", "value"], &rows)
    }

    /// Adds `other`'s counts, latencies and failures to this report (not its wall time).
    pub fn add(&mut self, other: Report) {
        self.sessions += other.sessions;
        self.tool_calls += other.tool_calls;
        self.events += other.events;
        self.resumes += other.resumes;
        self.not_found += other.not_found;
        self.lost += other.lost;
        self.announced_lost += other.announced_lost;
        for (reason, n) in other.announced {
            *self.announced.entry(reason).or_default() += n;
        }
        self.duplicated += other.duplicated;
        self.foreign += other.foreign;
        self.executed_twice += other.executed_twice;
        self.resume_latencies.extend(other.resume_latencies);
        self.failures.extend(other.failures);
        self.incidents.extend(other.incidents);
    }

    /// Records one `slow` call with `count` progress notifications: its outcome, or the error
    /// of its first POST (a 404 counts as such, any other error as a failure; a call whose
    /// stream never started loses no event).
    pub fn record_call(&mut self, call_id: &str, count: u32, result: Result<CallOutcome>) {
        self.tool_calls += 1;
        match result {
            Ok(out) => {
                self.events += out.events;
                self.resumes += out.resumes.len() as u64;
                self.not_found += out.not_found;
                let lost = out.lost(count);
                if let Some(reason) = &out.announced {
                    // Told: the failure that carries the reason is the incident.
                    *self.announced.entry(reason.clone()).or_default() += 1;
                    self.announced_lost += lost;
                } else if lost > 0 {
                    let got: std::collections::HashSet<u32> =
                        out.progress.iter().copied().collect();
                    let missing: Vec<u32> = (1..=count).filter(|p| !got.contains(p)).collect();
                    let detail = format!(
                        "call {call_id}: progress {missing:?} never arrived, result {}; {}",
                        if out.result.is_some() {
                            "arrived"
                        } else {
                            "missing"
                        },
                        out.read()
                    );
                    self.incidents
                        .push(Incident::new(IncidentKind::Lost, detail));
                }
                if out.duplicated > 0 {
                    let detail = format!(
                        "call {call_id}: {} event(s) arrived twice; {}",
                        out.duplicated,
                        out.read()
                    );
                    self.incidents
                        .push(Incident::new(IncidentKind::Duplicated, detail));
                }
                self.lost += lost;
                self.duplicated += out.duplicated;
                self.foreign += out.foreign;
                self.resume_latencies.extend(out.resumes);
                self.failures.extend(out.failures);
            }
            Err(e) if e.is_not_found() => self.not_found += 1,
            Err(e) => self.failures.push(format!("{call_id}: {e}")),
        }
    }

    /// Records the answer to the `DELETE` that ends `session` (a 404 counts as such).
    pub fn record_delete(&mut self, session: &str, result: Result<StatusCode>) {
        match result {
            Ok(status) if status.is_success() => {}
            Ok(StatusCode::NOT_FOUND) => self.not_found += 1,
            Ok(status) => self
                .failures
                .push(format!("{session}: DELETE answered {status}")),
            Err(e) => self.failures.push(format!("{session}: DELETE failed: {e}")),
        }
    }
}

/// `d` in milliseconds with two decimals, `-` for none.
pub fn millis(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".to_owned(),
        |d| format!("{:.2} ms", d.as_secs_f64() * 1e3),
    )
}

/// Executions per `slow` call id, merged over the `/stats` of several example servers: a call
/// executed once on each of two pods was executed twice.
#[derive(Clone, Debug, Default)]
pub struct Executions(HashMap<String, u64>);

impl Executions {
    /// Adds the executions of one example server's `/stats` document (its `calls` map).
    pub fn add(&mut self, stats: &Value) {
        let calls = stats.get("calls").and_then(Value::as_object);
        for (call_id, n) in calls.into_iter().flatten() {
            *self.0.entry(call_id.clone()).or_default() += n.as_u64().unwrap_or(0);
        }
    }

    /// Adds one execution of `call_id` (an example server's `--log-calls` line, say).
    pub fn record(&mut self, call_id: &str) {
        *self.0.entry(call_id.to_owned()).or_default() += 1;
    }

    /// Executions, over every call id.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// Call ids executed more than once.
    pub fn executed_twice(&self) -> u64 {
        self.0.values().filter(|&&n| n > 1).count() as u64
    }
}

/// Call ids executed more than once, from one example server's `/stats` document.
pub fn executed_twice(stats: &Value) -> u64 {
    let mut executions = Executions::default();
    executions.add(stats);
    executions.executed_twice()
}

/// The `q` quantile (0..=1, nearest rank) of `samples`; `None` when there are none.
pub fn quantile(samples: &[Duration], q: f64) -> Option<Duration> {
    let mut v = samples.to_vec();
    v.sort_unstable();
    let idx = ((v.len() as f64 - 1.0) * q.clamp(0.0, 1.0)).round() as usize;
    v.get(idx).copied()
}

/// The clients of `sessions` sessions, one per [`SESSIONS_PER_SOURCE`] of them (session `i`
/// uses `[i / SESSIONS_PER_SOURCE]`): clones of `client` whose connections leave from a
/// loopback address of their own when `client` targets loopback pods; plain clones otherwise
/// (pods behind a Service, reached from the test's own address).
pub fn client_pods(client: &McpClient, sessions: usize) -> Vec<McpClient> {
    let loopback = client
        .url
        .parse::<http::Uri>()
        .ok()
        .and_then(|uri| uri.host()?.parse::<std::net::IpAddr>().ok())
        .is_some_and(|ip| ip.is_loopback());
    (0..sessions.div_ceil(SESSIONS_PER_SOURCE))
        .map(|_| {
            if loopback {
                client.from_source(addr::next_ip().into())
            } else {
                client.clone()
            }
        })
        .collect()
}

/// Runs the load against `client`'s endpoint: `calls_per_session` calls in each session.
pub async fn run(client: &McpClient, cfg: &LoadConfig) -> Report {
    let stopped = CancellationToken::new();
    stopped.cancel();
    run_until(client, cfg, stopped).await
}

/// Runs the load against `client`'s endpoint until `stop` is cancelled: each session makes at
/// least `calls_per_session` calls and goes on calling until then, finishes its call and ends.
/// Traffic that never stops while something else (a rollout) runs, however long that takes.
pub async fn run_until(client: &McpClient, cfg: &LoadConfig, stop: CancellationToken) -> Report {
    let started = Instant::now();
    let gate = Arc::new(Semaphore::new(cfg.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    let sources = client_pods(client, cfg.sessions);
    for i in 0..cfg.sessions {
        let (client, cfg, gate, stop) = (
            sources[i / SESSIONS_PER_SOURCE].clone(),
            cfg.clone(),
            Arc::clone(&gate),
            stop.clone(),
        );
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await;
            session(&client, &cfg, i, &stop).await
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

async fn session(
    client: &McpClient,
    cfg: &LoadConfig,
    index: usize,
    stop: &CancellationToken,
) -> Report {
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
    let mut c = 0;
    while c < cfg.calls_per_session || !stop.is_cancelled() {
        let call_id = format!("s{index}-c{c}-{:08x}", rand::random::<u32>());
        let plan = CallPlan::random(
            cfg.count,
            cfg.interval_ms,
            cfg.cut_probability,
            cfg.max_pause_ms,
        );
        let result = call::slow(client, &session, c as u64 + 2, &call_id, &plan).await;
        report.record_call(&call_id, cfg.count, result);
        c += 1;
    }
    report.record_delete(&format!("session {index}"), client.delete(&session).await);
    report
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
    fn a_lost_or_duplicated_event_is_an_incident_naming_its_stream_and_pods() {
        let mut r = Report::default();
        let out = CallOutcome {
            progress: vec![1, 2, 2],
            events: 3,
            duplicated: 1,
            stream: Some("k7".into()),
            seqs: vec![1, 2, 2],
            pods: vec!["pod 127.0.0.2".into(), "pod 127.0.0.3".into()],
            ..CallOutcome::default()
        };
        r.record_call("c1", 3, Ok(out));
        assert_eq!((r.lost, r.duplicated), (2, 1));
        let kinds: Vec<IncidentKind> = r.incidents.iter().map(|i| i.kind).collect();
        assert_eq!(kinds, [IncidentKind::Lost, IncidentKind::Duplicated]);
        let lost = &r.incidents[0].detail;
        assert!(
            lost.contains("progress [3] never arrived, result missing")
                && lost.contains(
                    "stream k7, events [1, 2, 2] read from pod 127.0.0.2, then pod 127.0.0.3"
                ),
            "{lost}"
        );
        // A clean call is no incident.
        let whole = CallOutcome {
            progress: vec![1],
            result: Some("done 1".into()),
            ..CallOutcome::default()
        };
        r.record_call("c2", 1, Ok(whole));
        assert_eq!(r.incidents.len(), 2);
    }

    #[test]
    fn counts_duplicate_call_ids() {
        let stats = serde_json::json!({"executions": 6, "calls": {"a": 2, "b": 3, "c": 1}});
        assert_eq!(executed_twice(&stats), 2);
        // Once on each of two pods is twice.
        let mut merged = Executions::default();
        merged.add(&serde_json::json!({"calls": {"a": 1, "c": 1}}));
        merged.add(&serde_json::json!({"calls": {"b": 1, "c": 1}}));
        assert_eq!(merged.executed_twice(), 1);
        assert_eq!(merged.total(), 4);
        // Executions recorded one by one (a server's log lines) count the same way.
        merged.record("a");
        merged.record("d");
        assert_eq!(merged.executed_twice(), 2);
        assert_eq!(merged.total(), 6);
    }
}

//! The report of a rollout and its table; several runs print side by side ([`table`]).
//!
//! Client figures are counted from what the clients received; "tools executed twice" merges
//! every example server's `/stats` (old pods read as they stop, new ones at the end); sidecar
//! counters are summed over every sidecar the same way, and read as 0 when a sidecar does not
//! export them.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::load::{self, millis};
use crate::pod::{family_samples, sample_value};
use crate::table;

/// One pod's drain.
#[derive(Clone, Debug)]
pub struct DrainRecord {
    /// The drained pod's IP.
    pub ip: Ipv4Addr,
    /// Wall time of its `tether-sidecar drain`.
    pub elapsed: Duration,
    /// Whether `tether-sidecar drain` exited 0 (done), not 1 (`spec.drain.timeout` passed
    /// first).
    pub drained: bool,
}

/// Sidecar counters, summed over every sidecar of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SidecarCounters {
    /// `tether_handoffs_sent_total`: sessions pushed to a peer.
    pub handoffs_sent: u64,
    /// `tether_handoffs_received_total`: sessions adopted from a peer.
    pub handoffs_received: u64,
    /// `tether_handoffs_failed_total`: pushes that failed.
    pub handoffs_failed: u64,
    /// `tether_tail_events_forwarded_total`: events of in-flight streams forwarded to the new
    /// holder.
    pub tail_events_forwarded: u64,
    /// `tether_requests_cut_total`: requests cut by the drain deadline.
    pub requests_cut: u64,
    /// `tether_sessions_rebuilt_total`: upstream sessions rebuilt from the journal.
    pub sessions_rebuilt: u64,
    /// `tether_not_found_total` by its `reason` label: the 404s sidecars answered.
    pub not_found: std::collections::BTreeMap<String, u64>,
    /// Warning lines of the sidecars' logs, by message (fields left out).
    pub warnings: std::collections::BTreeMap<String, u64>,
}

impl SidecarCounters {
    /// Counts the warnings of one sidecar's log by message (what follows the target, up to the
    /// first field).
    pub fn add_log(&mut self, log: &str) {
        for line in log.lines().filter(|l| l.contains(" WARN ")) {
            let message = line
                .split_once(": ")
                .map_or(line, |(_, m)| m)
                .split(" session=")
                .next()
                .unwrap_or_default();
            let message: String = message.chars().take(90).collect();
            *self.warnings.entry(message).or_default() += 1;
        }
    }

    /// Adds the counters of one sidecar's Prometheus text (0 for an absent one).
    pub fn add(&mut self, metrics: &str) {
        let value = |name: &str| sample_value(metrics, name) as u64;
        self.handoffs_sent += value("tether_handoffs_sent_total");
        self.handoffs_received += value("tether_handoffs_received_total");
        self.handoffs_failed += family_samples(metrics, "tether_handoffs_failed_total")
            .map(|(_, v)| v as u64)
            .sum::<u64>();
        for (labels, v) in family_samples(metrics, "tether_not_found_total") {
            let reason = labels
                .trim_start_matches("reason=\"")
                .trim_end_matches('"')
                .to_owned();
            *self.not_found.entry(reason).or_default() += v as u64;
        }
        self.tail_events_forwarded += value("tether_tail_events_forwarded_total");
        self.requests_cut += value("tether_requests_cut_total");
        self.sessions_rebuilt += value("tether_sessions_rebuilt_total");
    }
}

/// What authorization did in a rollout whose MCP servers require it.
#[derive(Clone, Debug, Default)]
pub struct AuthFigures {
    /// Whether the MCP servers required bearer tokens.
    pub on: bool,
    /// Token refreshes of the clients: (before expiry, after a 401).
    pub refreshes: (u64, u64),
    /// Requests the MCP servers answered 401 (`/stats` `unauthenticated`: expired tokens of
    /// clients that refresh late, and any request sent without credentials).
    pub upstream_unauthenticated: u64,
    /// Of those, requests without any credentials (`/stats` `missing_credentials`): a request
    /// tether made on a session's behalf without its clients' credentials.
    pub upstream_missing_credentials: u64,
    /// Requests another user sent in a client's session.
    pub probes: u64,
    /// Of those, answered 404 like an unknown session.
    pub probes_refused: u64,
}

/// What one rollout showed.
#[derive(Clone, Debug, Default)]
pub struct RolloutReport {
    /// The run's name ([`super::RolloutConfig::label`]).
    pub label: String,
    /// Pods of the endpoint (each replaced once).
    pub pods: usize,
    /// MCP clients of the load (each starts a new session after a 404).
    pub clients: usize,
    /// What the clients experienced: sessions (every one initialized, also those started again
    /// after a 404), tool calls, events, 404s, lost, duplicated and foreign events, resumes and
    /// their latencies, tools executed twice, failures, wall time.
    pub load: load::Report,
    /// Sessions whose `counter` restarted (tool state the journal does not carry).
    pub counter_restarts: u64,
    /// Sessions lost (answered 404), after each of which its client started a new one.
    pub sessions_lost: u64,
    /// `slow` calls the clients made, and `job` tasks the 2026-07-28 clients created.
    pub slow_calls: u64,
    /// `slow` and `job` executions over every example server (`/stats`): about [`Self::slow_calls`]
    /// when every server was read (less by the calls refused before reaching one).
    pub slow_executions: u64,
    /// Sidecar counters over every sidecar.
    pub sidecar: SidecarCounters,
    /// The drains, in rollout order.
    pub drains: Vec<DrainRecord>,
    /// The largest peak resident set size of any sidecar, in bytes.
    pub peak_rss_bytes: u64,
    /// When a client first got a 404, from the start of the load.
    pub first_not_found: Option<Duration>,
    /// When the first old pod's sidecar got SIGTERM, from the start of the load.
    pub first_stop: Option<Duration>,
    /// The rollout's steps, from the start of the load.
    pub timeline: Vec<(Duration, String)>,
    /// Tokens, refusals and other users' attempts, when the MCP servers required auth.
    pub auth: AuthFigures,
    /// Requests the MCP servers refused as not local (their DNS-rebinding defence: a `Host` or
    /// `Origin` tether should not have passed on).
    pub upstream_not_local: u64,
    /// The key rotation during the rollout, with [`super::RolloutConfig::rotate_key`].
    pub rotation: Option<super::RotationReport>,
    /// What the 2026-07-28 clients experienced.
    pub modern: super::ModernFigures,
    /// Requests whose response headers took [`crate::client::LATE_HEAD`] or more (or never
    /// came), and the longest wait of any request.
    pub late_heads: (u64, Duration),
    /// Every sidecar's log, `(pod, text)`: a session's lines in them explain its incidents
    /// ([`RolloutReport::explain`]).
    pub sidecar_logs: Vec<(String, String)>,
}

impl RolloutReport {
    /// An empty report of run `label` with `pods` pods and `clients` clients.
    pub fn new(label: String, pods: usize, clients: usize) -> Self {
        Self {
            label,
            pods,
            clients,
            ..Self::default()
        }
    }

    /// Whether the rollout was invisible to clients: no 404, nothing lost, duplicated or
    /// foreign, no tool executed twice, no other failure, no request refused by an MCP server
    /// as not local; and with auth, no request reached an MCP server without credentials and
    /// every other user's attempt on a session was refused.
    pub fn is_clean(&self) -> bool {
        let a = &self.auth;
        self.load.is_clean()
            && self.modern.is_clean()
            && self.upstream_not_local == 0
            && a.upstream_missing_credentials == 0
            && a.probes_refused == a.probes
    }

    /// Each incident of the load ([`load::Report::incidents`]), with the log lines of its
    /// session from every sidecar; `key` is the key that minted the sessions' ids (the
    /// endpoint's key material).
    pub fn explain(&self, key: &[u8]) -> String {
        crate::incident::explain(&self.load.incidents, key, &self.sidecar_logs)
    }

    /// Handoffs sent per session.
    pub fn moves_per_session(&self) -> f64 {
        self.sidecar.handoffs_sent as f64 / self.load.sessions.max(1) as f64
    }

    /// The report as a two-column table.
    pub fn table(&self) -> String {
        table(&[self])
    }

    /// `figure` of the auth figures, or `off` when the MCP servers required no auth.
    fn auth_figure(&self, figure: impl Fn(&AuthFigures) -> String) -> String {
        if self.auth.on {
            figure(&self.auth)
        } else {
            "off".to_owned()
        }
    }

    /// The rows of the table: label and value.
    fn rows(&self) -> Vec<(&'static str, String)> {
        let r = &self.load;
        let m = &self.modern;
        let drains: Vec<String> = self
            .drains
            .iter()
            .map(|d| format!("{:.2}", d.elapsed.as_secs_f64()))
            .collect();
        let at_deadline = self.drains.iter().filter(|d| !d.drained).count();
        vec![
            ("clients", self.clients.to_string()),
            ("sessions", r.sessions.to_string()),
            ("tool calls", r.tool_calls.to_string()),
            ("events delivered", r.events.to_string()),
            ("client-visible 404s", r.not_found.to_string()),
            ("lost events", r.lost.to_string()),
            ("duplicated events", r.duplicated.to_string()),
            ("foreign-stream events", r.foreign.to_string()),
            (
                "slow and job calls made / executed",
                format!("{} / {}", self.slow_calls, self.slow_executions),
            ),
            ("tools executed twice", r.executed_twice.to_string()),
            (
                "counter restarts (sessions)",
                self.counter_restarts.to_string(),
            ),
            ("sidecar 404s by reason", by_reason(&self.sidecar.not_found)),
            ("other client errors", r.failures.len().to_string()),
            ("2026-07-28 clients", m.clients.to_string()),
            ("2026-07-28 requests", m.requests.to_string()),
            ("2026-07-28 requests cut", m.cut.to_string()),
            (
                "listen streams re-established / cut",
                format!("{} / {}", m.listens_reestablished, m.listens_cut),
            ),
            (
                "listen streams ended with their result",
                m.listens_completed.to_string(),
            ),
            (
                "MRTR calls / retried at another pod / started over",
                format!(
                    "{} / {} / {}",
                    m.mrtr_calls, m.mrtr_across_pods, m.mrtr_started_over
                ),
            ),
            (
                "tasks created / polled across pods",
                format!("{} / {}", m.tasks, m.tasks_across_pods),
            ),
            ("task-not-found answers", m.task_not_found.to_string()),
            (
                "upstream refusals as not local (Host, Origin)",
                self.upstream_not_local.to_string(),
            ),
            (
                "token refreshes (before expiry / after 401)",
                self.auth_figure(|a| format!("{} / {}", a.refreshes.0, a.refreshes.1)),
            ),
            (
                "upstream 401s",
                self.auth_figure(|a| a.upstream_unauthenticated.to_string()),
            ),
            (
                "upstream requests without credentials",
                self.auth_figure(|a| a.upstream_missing_credentials.to_string()),
            ),
            (
                "principal mismatches refused",
                self.auth_figure(|a| format!("{} / {}", a.probes_refused, a.probes)),
            ),
            ("resumes", r.resumes.to_string()),
            ("resume latency p50", millis(r.resume_quantile(0.50))),
            ("resume latency p99", millis(r.resume_quantile(0.99))),
            (
                "requests answered after 10 s or more / longest wait",
                format!(
                    "{} / {:.1} s",
                    self.late_heads.0,
                    self.late_heads.1.as_secs_f64()
                ),
            ),
            (
                "session moves per session",
                format!("{:.2}", self.moves_per_session()),
            ),
            ("handoffs failed", self.sidecar.handoffs_failed.to_string()),
            (
                "sessions rebuilt",
                self.sidecar.sessions_rebuilt.to_string(),
            ),
            (
                "tail events forwarded",
                self.sidecar.tail_events_forwarded.to_string(),
            ),
            (
                "requests cut at deadline",
                self.sidecar.requests_cut.to_string(),
            ),
            (
                "pods replaced",
                format!("{}/{}", self.drains.len(), self.pods),
            ),
            ("drain time per pod (s)", drains.join(" ")),
            ("drains ended by timeout", at_deadline.to_string()),
            (
                "peak sidecar RSS",
                format!("{:.1} MiB", self.peak_rss_bytes as f64 / (1024.0 * 1024.0)),
            ),
            ("wall time", format!("{:.1} s", r.elapsed.as_secs_f64())),
        ]
    }
}

/// Counts by reason, `reason n, …` (those above 0), or `none`.
pub fn by_reason(counts: &std::collections::BTreeMap<String, u64>) -> String {
    let shown: Vec<String> = counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    if shown.is_empty() {
        "none".to_owned()
    } else {
        shown.join(", ")
    }
}

/// Several reports side by side, one column each (e.g. handoff, then the baseline).
pub fn table(reports: &[&RolloutReport]) -> String {
    let runs: Vec<(&str, Vec<(&str, String)>)> = reports
        .iter()
        .map(|r| (r.label.as_str(), r.rows()))
        .collect();
    table::side_by_side(&runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_sidecar_counters_read_as_zero() {
        let mut counters = SidecarCounters::default();
        counters.add("# no handoff metrics yet\ntether_sessions_rebuilt_total 2\n");
        counters.add("tether_handoffs_sent_total 5\ntether_sessions_rebuilt_total 1\n");
        counters.add(concat!(
            "tether_handoffs_failed_total{reason=\"refused\"} 2\n",
            "tether_handoffs_failed_total{reason=\"tail\"} 1\n",
            "tether_not_found_total{reason=\"no_holder\"} 4\n",
        ));
        assert_eq!(
            counters,
            SidecarCounters {
                handoffs_sent: 5,
                handoffs_failed: 3,
                sessions_rebuilt: 3,
                not_found: [("no_holder".to_owned(), 4)].into(),
                ..SidecarCounters::default()
            }
        );
    }

    #[test]
    fn reports_print_side_by_side() {
        let mut handoff = RolloutReport::new("handoff".into(), 3, 200);
        handoff.load.sessions = 200;
        handoff.sidecar.handoffs_sent = 100;
        let mut baseline = RolloutReport::new("baseline".into(), 3, 200);
        baseline.load.not_found = 67;
        let text = table(&[&handoff, &baseline]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("handoff") && lines[0].contains("baseline"));
        let row = |label: &str| table::row(&text, label);
        assert_eq!(
            row("client-visible 404s"),
            ["client-visible 404s", "0", "67"]
        );
        assert_eq!(row("session moves per session")[1], "0.50");
        assert!(handoff.is_clean() && !baseline.is_clean());
    }
}

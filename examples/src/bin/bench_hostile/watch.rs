//! What a row of the Floods table measures around its flood ([`crate::floods`]).
//!
//! - [`Victim`]: the victim's sequential `echo` calls in its session and a `/readyz` probe
//!   every 200 ms (a kubelet of its own address), both on a thread and a runtime of their own,
//!   with connections of their own: the attacker's tasks, many on this process's runtime, do
//!   not queue ahead of the victim's (the machine's cores stay shared, as on a node).
//! - [`Cpu`]: the CPU time of the sidecar, the MCP server and this process (the attacker, the
//!   victim) during the flood (every thread's, `/proc/<pid>/task/*/schedstat`), in % of one
//!   core: on loopback they all share the machine's cores, and this says whose they were.
//! - [`RssPeak`]: the sidecar's `VmRSS` (`/proc/<pid>/status`), sampled every 50 ms on a thread
//!   of its own; the largest read.
//! - [`peaks`]: the sidecar's gauges ([`GAUGES`]: connections, calls in flight, sessions, open
//!   tasks, retained bytes), scraped every 250 ms during the flood; the largest value of each.
//! - [`Counters`]: the counters of what the sidecar refused or cut ([`COUNTERS`]), read before
//!   and after a row; their differences name what the flood met.
//! - [`settle`]: after a flood, waits until the calls it started have ended and the connections
//!   it opened are gone, so the next row starts from a quiet pod.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use http::StatusCode;
use tether_tests::client::{Http, McpClient, Session};
use tether_tests::pod::{Pod, family_samples, process_cpu};

use crate::Outcome;

/// What one sequence of requests met: each answer's time, and the requests that failed.
#[derive(Debug, Default)]
pub(crate) struct Served {
    /// Time to each whole answer, failed ones included.
    pub(crate) samples: Vec<Duration>,
    /// Requests answered other than as expected (or not at all).
    pub(crate) errors: u64,
    /// The first failure, for the report.
    pub(crate) first_error: Option<String>,
}

impl Served {
    fn record(&mut self, took: Duration, outcome: Outcome<()>) {
        self.samples.push(took);
        if let Err(e) = outcome {
            self.errors += 1;
            self.first_error.get_or_insert(e);
        }
    }
}

/// Longest wait for one victim request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed victim request, so that a refusal loop does not replace the calls.
const AFTER_ERROR: Duration = Duration::from_millis(50);
/// Interval of the `/readyz` probe.
const PROBE_EVERY: Duration = Duration::from_millis(200);

/// The victim: a session of its own principal, called from its own source address.
#[derive(Clone, Debug)]
pub(crate) struct Victim {
    /// A client with the victim's bearer token.
    pub(crate) client: McpClient,
    /// The victim's session.
    pub(crate) session: Session,
    /// The victim's source address.
    pub(crate) source: Ipv4Addr,
    /// The prober's source address.
    pub(crate) probe_source: Ipv4Addr,
    /// `http://<pod>:9901/readyz`.
    pub(crate) readyz_url: String,
}

impl Victim {
    /// Calls `echo` (request ids from `first_id`) and probes `/readyz` until `until`, on a
    /// thread of its own: the calls' and the probes' times.
    pub(crate) fn spawn(
        &self,
        until: Instant,
        first_id: u64,
    ) -> JoinHandle<Outcome<(Served, Served)>> {
        let victim = self.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                // A connection pool of this runtime's own.
                let client = victim.client.from_source(victim.source.into());
                let probe = Http::from_source(victim.probe_source.into());
                // The first call opens the connection; it is not counted.
                let _ = echo(&client, &victim.session, first_id).await;
                let calls = async {
                    let mut served = Served::default();
                    let mut id = first_id;
                    while Instant::now() < until {
                        id += 1;
                        let started = Instant::now();
                        let outcome = echo(&client, &victim.session, id).await;
                        let failed = outcome.is_err();
                        served.record(started.elapsed(), outcome);
                        if failed {
                            tokio::time::sleep(AFTER_ERROR).await;
                        }
                    }
                    served
                };
                let probes = async {
                    let mut served = Served::default();
                    while Instant::now() < until {
                        let started = Instant::now();
                        let outcome = readyz(&probe, &victim.readyz_url).await;
                        served.record(started.elapsed(), outcome);
                        tokio::time::sleep(PROBE_EVERY.saturating_sub(started.elapsed())).await;
                    }
                    served
                };
                Ok(tokio::join!(calls, probes))
            })
        })
    }
}

/// One `echo` call of the victim with request id `id`: anything but a 200 carrying its result
/// within [`REQUEST_TIMEOUT`] is an error.
pub(crate) async fn echo(client: &McpClient, session: &Session, id: u64) -> Outcome<()> {
    client
        .echo(session, id, "victim", REQUEST_TIMEOUT)
        .await
        .map_err(|e| e.to_string())
}

/// `GET /readyz`, answered 200.
async fn readyz(http: &Http, url: &str) -> Outcome<()> {
    match tokio::time::timeout(REQUEST_TIMEOUT, http.get_text(url)).await {
        Err(_) => Err(format!("/readyz: no answer within {REQUEST_TIMEOUT:?}")),
        Ok(Err(e)) => Err(format!("/readyz: {e}")),
        Ok(Ok((StatusCode::OK, _))) => Ok(()),
        Ok(Ok((status, text))) => Err(format!("/readyz answered {status}: {text:.200}")),
    }
}

/// CPU time the sidecar, the MCP server and this process (the attacker, the victim, the
/// prober) have used so far (every thread's).
pub(crate) struct Cpu {
    sidecar: Duration,
    server: Duration,
    bench: Duration,
}

impl Cpu {
    /// The pod's processes' CPU time now.
    pub(crate) fn read(pod: &Pod) -> Outcome<Self> {
        let server = pod.server_pid().ok_or("the MCP server exited")?;
        Ok(Self {
            sidecar: pod.sidecar_cpu().map_err(|e| e.to_string())?,
            server: process_cpu(server).map_err(|e| e.to_string())?,
            bench: process_cpu(std::process::id()).map_err(|e| e.to_string())?,
        })
    }

    /// The CPU each used since `before`, over `span`, in % of one core: sidecar, server, bench.
    pub(crate) fn share_since(&self, before: &Self, span: Duration) -> [f64; 3] {
        let share = |now: Duration, was: Duration| {
            100.0 * now.saturating_sub(was).as_secs_f64() / span.as_secs_f64().max(1e-3)
        };
        [
            share(self.sidecar, before.sidecar),
            share(self.server, before.server),
            share(self.bench, before.bench),
        ]
    }
}

/// Process `pid`'s resident set size in bytes (`VmRSS` in `/proc/<pid>/status`).
pub(crate) fn rss(pid: u32) -> Outcome<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("/proc/{pid}/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| format!("no VmRSS in /proc/{pid}/status"))
}

/// The largest `VmRSS` of a process while it is sampled.
pub(crate) struct RssPeak {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl RssPeak {
    /// Samples process `pid`'s RSS every 50 ms until [`RssPeak::finish`].
    pub(crate) fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let mut peak = 0;
                while !stop.load(Ordering::Relaxed) {
                    peak = peak.max(rss(pid).unwrap_or(0));
                    std::thread::sleep(Duration::from_millis(50));
                }
                peak.max(rss(pid).unwrap_or(0))
            }
        });
        Self { stop, thread }
    }

    /// The largest RSS read, in bytes.
    pub(crate) fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// The gauges a row follows, with their names in the table; a family with labels is summed
/// (`tether_retained_bytes{kind}`).
pub(crate) const GAUGES: [(&str, &str); 8] = [
    ("tether_client_connections", "MCP connections"),
    ("tether_admin_connections", "admin connections"),
    ("tether_calls_in_flight", "calls in flight"),
    ("tether_sessions", "sessions"),
    ("tether_tasks_open", "tasks open"),
    ("tether_buffer_unsent_bytes", "unsent bytes"),
    ("tether_retained_bytes", "retained bytes"),
    (
        "tether_upstream_deletes_pending",
        "upstream deletes pending",
    ),
];

/// The value of gauge (or gauge family) `name` in Prometheus text `text`.
pub(crate) fn gauge(text: &str, name: &str) -> f64 {
    family_samples(text, name).map(|(_, v)| v).sum()
}

/// The largest values of [`GAUGES`] from `start` until `until`, scraped every 250 ms (a scrape
/// the admin port refuses is skipped).
pub(crate) async fn peaks(
    pod: &Pod,
    start: [f64; GAUGES.len()],
    until: Instant,
) -> [f64; GAUGES.len()] {
    let mut peaks = start;
    while Instant::now() < until {
        let scrape = tokio::time::timeout(Duration::from_secs(2), pod.metrics()).await;
        if let Ok(Ok(text)) = scrape {
            for (peak, (name, _)) in peaks.iter_mut().zip(GAUGES) {
                *peak = peak.max(gauge(&text, name));
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    peaks
}

/// The gauges whose peak rose above their value `before` by more than the victim, the prober
/// and the bench's own scrapes account for (3, or 1 MiB): `peak <name> <value>`.
pub(crate) fn risen(before: &[f64; GAUGES.len()], peaks: &[f64; GAUGES.len()]) -> Vec<String> {
    GAUGES
        .iter()
        .zip(before.iter().zip(peaks))
        .filter_map(|((name, short), (was, peak))| {
            if name.ends_with("_bytes") {
                (*peak > was + f64::from(1 << 20)).then(|| format!("peak {short} {}", mib(*peak)))
            } else {
                (*peak >= was + 3.0).then(|| format!("peak {short} {}", count(*peak)))
            }
        })
        .collect()
}

/// The values of [`GAUGES`] in `text`.
pub(crate) fn gauges(text: &str) -> [f64; GAUGES.len()] {
    GAUGES.map(|(name, _)| gauge(text, name))
}

/// The counters of what the sidecar refused or cut, with their short names in the table; each
/// sample is named by its short name and its label values (`429 session_calls`).
pub(crate) const COUNTERS: [(&str, &str); 9] = [
    ("tether_rejections_total", ""),
    ("tether_connections_refused_total", "refused conn"),
    ("tether_admin_refused_total", "admin refused"),
    ("tether_header_timeouts_total", "head timeouts"),
    ("tether_request_heads_refused_total", "heads refused"),
    ("tether_requests_cut_total", "requests cut"),
    ("tether_client_write_timeouts_total", "write timeouts"),
    ("tether_buffer_evictions_total", "evicted"),
    ("tether_tasks_untracked_total", "tasks untracked"),
];

/// The samples of [`COUNTERS`] at one moment: each one's name in the table and its value.
#[derive(Debug, Default)]
pub(crate) struct Counters(Vec<(String, f64)>);

impl Counters {
    /// The samples of [`COUNTERS`] in Prometheus text `text`.
    pub(crate) fn read(text: &str) -> Self {
        let mut samples = Vec::new();
        for (family, short) in COUNTERS {
            for (labels, value) in family_samples(text, family) {
                let values: Vec<&str> = labels
                    .split(',')
                    .filter_map(|l| l.split_once('=').map(|(_, v)| v.trim_matches('"')))
                    .collect();
                let name = [short]
                    .into_iter()
                    .chain(values)
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ");
                samples.push((name, value));
            }
        }
        Self(samples)
    }

    /// The samples that grew since `before`: `name +n`, in the order of [`COUNTERS`].
    pub(crate) fn grown_since(&self, before: &Self) -> Vec<String> {
        self.0
            .iter()
            .filter_map(|(name, value)| {
                let was = before
                    .0
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or(0.0, |(_, v)| *v);
                (*value > was).then(|| format!("{name} +{}", count(value - was)))
            })
            .collect()
    }
}

/// Waits (bounded) until the pod is as quiet as before a flood: no call in flight, no upstream
/// `DELETE` pending, no more MCP or admin connections than `before` (the gauges then) and one
/// (a pooled client may have opened a second connection for two requests in a row). What did
/// not settle in time, one note each.
pub(crate) async fn settle(pod: &Pod, before: &[f64; GAUGES.len()]) -> Outcome<Vec<String>> {
    let of = |name: &str| {
        GAUGES
            .iter()
            .position(|(n, _)| *n == name)
            .map_or(0.0, |i| before[i])
    };
    let waits = [
        ("tether_calls_in_flight", 0.0, Duration::from_secs(90)),
        (
            "tether_upstream_deletes_pending",
            0.0,
            Duration::from_secs(30),
        ),
        (
            "tether_client_connections",
            of("tether_client_connections") + 1.0,
            Duration::from_secs(30),
        ),
        (
            "tether_admin_connections",
            of("tether_admin_connections") + 1.0,
            Duration::from_secs(30),
        ),
    ];
    let mut notes = Vec::new();
    for (name, at_most, within) in waits {
        let left = pod
            .wait_for_metric(name, within, |v| v <= at_most)
            .await
            .map_err(|e| e.to_string())?;
        if left > at_most {
            notes.push(format!("{name} {left} after {within:?}"));
        }
    }
    Ok(notes)
}

/// `n` with thousands separators (`12,345`); fractions are dropped.
pub(crate) fn count(n: f64) -> String {
    let digits = format!("{:.0}", n.max(0.0).trunc());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `bytes` in MiB, one decimal.
pub(crate) fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / f64::from(1 << 20))
}

/// The `q` quantile of `samples` in ms (three decimals), `-` for none.
pub(crate) fn ms(samples: &[Duration], q: f64) -> String {
    tether_tests::load::quantile(samples, q).map_or_else(
        || "-".into(),
        |d| format!("{:.3} ms", d.as_secs_f64() * 1000.0),
    )
}

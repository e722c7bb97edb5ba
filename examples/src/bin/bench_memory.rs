//! `tether-bench-memory`: whether a sidecar's memory stays bounded and its streams keep up, on
//! loopback (`make bench`).
//!
//! Each scenario starts a fresh pod (`tether-bench-origin` behind the sidecar, its session and
//! journal caps raised so they do not end a scenario early) and reads the sidecar's resident set
//! (`VmRSS`) and metrics:
//!
//! 1. **idle sessions**: `initialize` + `notifications/initialized`, 64 at a time, up to 10,000
//!    and then 100,000 sessions; (RSS − RSS before) / sessions at each.
//! 2. **JSON requests**: 16 sessions × 2,000 `echo` calls, 32 users in a closed loop;
//!    (RSS after − before) / requests, and `tether_retained_bytes` per kind after the run.
//! 3. **a million requests**: 1,000,000 `echo` calls over 100 sessions, 32 users, RSS sampled
//!    every tenth; it plateaus when the last sample is within 10 % of the one half-way.
//! 4. **fast streams**: 16 concurrent `stream` calls × 100,000 events without pause, each read
//!    to its end, `--stream-runs` times: events lost (a `seq` missing), duplicated, reordered,
//!    streams cut (ended before their result), events per second.
//! 5. **a slow reader**: one `stream` of 20,000 events of 64 bytes of padding, read ~2 KiB every
//!    2 ms: events received, result received, cut.
//! 6. **churn**: 200 new sessions per second for 60 s, never deleted: RSS and the `initialize`
//!    p99 in the first and in the last 5 s.
//! 7. **reaped**: 2,000 sessions × 2 `echo` calls, 16 at a time, then abandoned: the sidecar
//!    (idle timeout 2 s) reaps them and ends each upstream; RSS before, after the calls, once
//!    every session is reaped (the clients' connections closed), and 20 s later (what the reap
//!    leaves), in 3 rounds on one pod (what stays is a high-water mark when later rounds do not
//!    add to it).
//!
//! 8. **replicated idle sessions**: two pods with `spec.session.replication: Sessions`; the
//!    idle sessions of scenario 1 opened at the first (their holder), which sends each one's
//!    replica to the second; once the second keeps a replica of every session
//!    (`tether_replicas`), (RSS − RSS before) / sessions at the holder and at the replica pod,
//!    and the replica pod's `tether_retained_bytes{kind="replicas"}` per session.
//!
//! With `--baseline-bin-dir DIR` each scenario also runs against `DIR/tether-sidecar` (same
//! origin, same flags where that build knows them), in a second column of the one table. Every
//! wait is bounded: a stream that stalls is counted as cut. `--quick` shrinks every scenario (a
//! smoke of about half a minute per build); a size given explicitly wins. A pod that fails ends
//! the run with the table so far and its logs, and a non-zero exit.
//!
//! Release binaries give the meaningful figures (`make bench` builds them).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use http::StatusCode;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use parking_lot::Mutex;
use serde_json::json;
use tether_tests::client::{McpClient, Session, body_text, initialize_body, tool_call};
use tether_tests::cluster::Cluster;
use tether_tests::load::{executed_twice, quantile};
use tether_tests::pod::{Pod, PodSpec, Upstream, family_samples};
use tether_tests::table;
use tether_tests::{HarnessError, bins};
use tokio::sync::Semaphore;

/// Command line.
#[derive(Debug, Parser)]
#[command(name = "tether-bench-memory", version, about)]
struct Args {
    /// Run every scenario small (about half a minute per build); sizes given explicitly win.
    #[arg(long)]
    quick: bool,
    /// A directory holding another build's `tether-sidecar`: every scenario runs against it
    /// too, and the table gets a "baseline" column.
    #[arg(long, value_name = "DIR")]
    baseline_bin_dir: Option<PathBuf>,
    /// The scenarios to run (1 to 8), comma separated. Default: all.
    #[arg(long, value_delimiter = ',', value_name = "N,..")]
    scenarios: Vec<u8>,
    /// Scenarios 1 and 8: the session counts at which RSS is read, ascending [10000,100000; quick
    /// 1000,5000].
    #[arg(long, value_delimiter = ',', value_name = "N,..")]
    idle_sessions: Vec<u64>,
    /// Scenario 1: `initialize` handshakes in flight at once.
    #[arg(long, default_value_t = 64)]
    init_concurrency: usize,
    /// Scenario 2: `echo` calls per session, over 16 sessions [2000; quick 200].
    #[arg(long)]
    json_calls: Option<u64>,
    /// Scenario 3: `echo` calls in all, over 100 sessions, RSS read every tenth [1000000;
    /// quick 20000].
    #[arg(long)]
    echo_requests: Option<u64>,
    /// Scenarios 2 and 3: users of the closed loop (each sends its next call once the last
    /// one is answered).
    #[arg(long, default_value_t = 32)]
    users: usize,
    /// Scenario 4: concurrent `stream` calls (and readers) of a run.
    #[arg(long, default_value_t = 16)]
    streams: usize,
    /// Scenario 4: events per `stream` call [100000; quick 10000].
    #[arg(long)]
    stream_events: Option<u64>,
    /// Scenario 4: runs [10; quick 2].
    #[arg(long)]
    stream_runs: Option<u64>,
    /// Scenario 5: events of the slow reader's stream [20000; quick 5000].
    #[arg(long)]
    slow_events: Option<u64>,
    /// Scenario 6: seconds of churn [60; quick 10].
    #[arg(long)]
    churn_seconds: Option<u64>,
    /// Scenario 6: new sessions per second.
    #[arg(long, default_value_t = 200)]
    churn_rate: u32,
    /// Scenario 7: sessions abandoned and reaped [2000; quick 500].
    #[arg(long)]
    reaped_sessions: Option<u64>,
}

/// The sizes of a run, `--quick` and explicit flags resolved.
#[derive(Clone, Debug)]
struct Plan {
    scenarios: Vec<u8>,
    idle_sessions: Vec<u64>,
    init_concurrency: usize,
    json_sessions: u64,
    json_calls: u64,
    echo_requests: u64,
    echo_sessions: u64,
    users: usize,
    streams: usize,
    stream_events: u64,
    stream_runs: u64,
    slow_events: u64,
    churn_seconds: u64,
    churn_rate: u32,
    reaped_sessions: u64,
}

impl Plan {
    /// The sizes, in one line.
    fn describe(&self) -> String {
        let idle: Vec<String> = self.idle_sessions.iter().map(|&n| count(n)).collect();
        format!(
            "scenarios {:?}; idle sessions {} ({} handshakes in flight); {} users; {} \
             sessions × {} `echo`; {} `echo` over {} sessions; {} streams × {} events × {} runs; \
             a slow reader of {} events; churn {}/s for {} s; {} sessions reaped",
            self.scenarios,
            idle.join(", "),
            self.init_concurrency,
            self.users,
            self.json_sessions,
            count(self.json_calls),
            count(self.echo_requests),
            self.echo_sessions,
            self.streams,
            count(self.stream_events),
            self.stream_runs,
            count(self.slow_events),
            self.churn_rate,
            self.churn_seconds,
            count(self.reaped_sessions),
        )
    }

    fn new(args: &Args) -> Self {
        let pick = |given: Option<u64>, full: u64, quick: u64| {
            given.unwrap_or(if args.quick { quick } else { full })
        };
        let mut idle_sessions = if !args.idle_sessions.is_empty() {
            args.idle_sessions.clone()
        } else if args.quick {
            vec![1_000, 5_000]
        } else {
            vec![10_000, 100_000]
        };
        idle_sessions.sort_unstable();
        idle_sessions.dedup();
        idle_sessions.retain(|&n| n > 0);
        Self {
            scenarios: if args.scenarios.is_empty() {
                (1..=8).collect()
            } else {
                args.scenarios.clone()
            },
            idle_sessions,
            init_concurrency: args.init_concurrency.max(1),
            json_sessions: 16,
            json_calls: pick(args.json_calls, 2_000, 200),
            echo_requests: pick(args.echo_requests, 1_000_000, 20_000).max(10),
            echo_sessions: 100,
            users: args.users.max(1),
            streams: args.streams.max(1),
            stream_events: pick(args.stream_events, 100_000, 10_000),
            stream_runs: pick(args.stream_runs, 10, 2).max(1),
            slow_events: pick(args.slow_events, 20_000, 5_000),
            churn_seconds: pick(args.churn_seconds, 60, 10).max(1),
            churn_rate: args.churn_rate.max(1),
            reaped_sessions: pick(args.reaped_sessions, 2_000, 500).max(1),
        }
    }
}

/// What went wrong, for the exit message (a pod's logs included).
type Outcome<T> = Result<T, String>;

/// Rows of one scenario against one build: a label and a value each.
type Rows = Vec<(String, String)>;

/// The protocol version of every session.
const VERSION: &str = "2025-06-18";
/// Longest wait for one JSON answer (headers and body).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for the next piece of a stream before it counts as cut.
const STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Time for the sidecar's work to settle before RSS is read: its retained-bytes gauges are
/// refreshed every second.
const SETTLE: Duration = Duration::from_millis(1500);
/// The sidecar flags of every pod: caps raised so that 100,000 idle sessions, plus churn, fit.
const SIDECAR_FLAGS: [(&str, &str); 3] = [
    ("--max-sessions", "250000"),
    // 4 GiB: a cap, not a reservation (the pod's one budget; older builds' journal cap).
    ("--pod-retained-bytes", "4294967296"),
    ("--pod-journal-bytes", "4294967296"),
];

/// One sidecar under test: a column of the table.
struct Build {
    column: &'static str,
    bin: PathBuf,
    /// [`SIDECAR_FLAGS`] this build knows.
    flags: Vec<String>,
    /// [`SIDECAR_FLAGS`] it does not (left out).
    unknown: Vec<&'static str>,
}

impl Build {
    /// The sidecar `bin`, with the flags its `--help` lists.
    fn new(column: &'static str, bin: PathBuf) -> Outcome<Self> {
        let help = std::process::Command::new(&bin)
            .arg("--help")
            .output()
            .map_err(|e| format!("cannot run {} --help: {e}", bin.display()))?;
        let help = String::from_utf8_lossy(&help.stdout);
        let known: HashSet<&str> = help
            .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
            .filter(|w| w.starts_with("--"))
            .collect();
        let (mut flags, mut unknown) = (Vec::new(), Vec::new());
        for (flag, value) in SIDECAR_FLAGS {
            if known.contains(flag) {
                flags.extend([flag.to_owned(), value.to_owned()]);
            } else {
                unknown.push(flag);
            }
        }
        Ok(Self {
            column,
            bin,
            flags,
            unknown,
        })
    }

    /// The spec of a pod: the origin behind this build's sidecar, whose sessions end after
    /// `idle_timeout` (`None`: the test endpoint's 30 min).
    fn spec(&self, idle_timeout: Option<&str>) -> PodSpec {
        let default = PodSpec::default();
        PodSpec {
            server: Upstream::Origin,
            sidecar_bin: Some(self.bin.clone()),
            sidecar_args: self.flags.clone(),
            idle_timeout: idle_timeout.map_or(default.idle_timeout.clone(), str::to_owned),
            ..default
        }
    }

    /// A fresh pod of [`Build::spec`].
    async fn pod(&self, idle_timeout: Option<&str>) -> Outcome<Pod> {
        Pod::start(self.spec(idle_timeout))
            .await
            .map_err(|e| format!("the pod did not start: {e}"))
    }

    /// Two fresh pods of one membership, replicating their sessions' `Sessions`.
    async fn replicating_pair(&self) -> Outcome<Cluster> {
        let spec = PodSpec {
            replication: Some("Sessions".into()),
            ..self.spec(None)
        };
        let ips: Vec<_> = (0..2).map(|_| tether_tests::addr::next_ip()).collect();
        Cluster::start(&ips, spec)
            .await
            .map_err(|e| format!("the pods did not start: {e}"))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let plan = Plan::new(&args);
    let mut builds = Vec::new();
    let this = bins::path("tether-sidecar").map_err(|e| e.to_string());
    let baseline = args
        .baseline_bin_dir
        .as_ref()
        .map(|dir| Build::new("baseline", dir.join("tether-sidecar")));
    for build in [
        Some(this.and_then(|bin| Build::new("this build", bin))),
        baseline,
    ]
    .into_iter()
    .flatten()
    {
        match build {
            Ok(build) => builds.push(build),
            Err(e) => {
                eprintln!("tether-bench-memory: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let started = Instant::now();
    let mut columns: Vec<Rows> = builds.iter().map(|_| Vec::new()).collect();
    let mut failure = None;
    'scenarios: for &n in &plan.scenarios {
        for (build, rows) in builds.iter().zip(&mut columns) {
            let at = Instant::now();
            eprintln!("tether-bench-memory: scenario {n}, {} …", build.column);
            match scenario(n, build, &plan).await {
                Ok(more) => rows.extend(more),
                Err(e) => {
                    failure = Some(format!("scenario {n}, {}: {e}", build.column));
                    break 'scenarios;
                }
            }
            eprintln!(
                "tether-bench-memory: scenario {n}, {}: {:.1} s",
                build.column,
                at.elapsed().as_secs_f64()
            );
        }
    }
    println!("{}", report(&builds, &columns, &plan, started.elapsed()));
    match failure {
        None => ExitCode::SUCCESS,
        Some(e) => {
            eprintln!("tether-bench-memory: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Scenario `n` in a fresh pod of `build`; a pod that fails (or a sidecar that exits) is an
/// error carrying the pod's logs.
async fn scenario(n: u8, build: &Build, plan: &Plan) -> Outcome<Rows> {
    if n == 8 {
        let mut cluster = build.replicating_pair().await?;
        let rows = replicated_idle_sessions(&cluster, plan).await;
        let running = cluster
            .pods
            .iter_mut()
            .all(|pod| pod.sidecar_running().unwrap_or(false));
        return match rows {
            Ok(rows) if running => Ok(rows),
            Ok(_) => Err(format!("a sidecar exited\n{}", cluster.logs())),
            Err(e) => Err(format!("{e}\n{}", cluster.logs())),
        };
    }
    let mut pod = build.pod((n == 7).then_some(REAP_IDLE_TIMEOUT)).await?;
    let rows = match n {
        1 => idle_sessions(&pod, plan).await,
        2 => json_requests(&pod, plan).await,
        3 => million_requests(&pod, plan).await,
        4 => fast_streams(&pod, plan).await,
        5 => slow_reader(&pod, plan).await,
        6 => churn(&pod, plan).await,
        7 => reaped(&pod, plan).await,
        _ => return Err(format!("no scenario {n} (1 to 8)")),
    };
    let running = pod.sidecar_running().unwrap_or(false);
    match rows {
        Ok(rows) if running => Ok(rows),
        Ok(_) => Err(format!("the sidecar exited\n{}", pod.logs())),
        Err(e) => Err(format!("{e}\n{}", pod.logs())),
    }
}

/// The report: the run's sizes and the table.
fn report(builds: &[Build], columns: &[Rows], plan: &Plan, elapsed: Duration) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "bounded memory and backpressure of one sidecar on loopback, behind tether-bench-origin \
         (RSS: the sidecar's VmRSS)\n"
    );
    for build in builds {
        let _ = write!(
            out,
            "- {}: `{}` {}",
            build.column,
            build.bin.display(),
            build.flags.join(" ")
        );
        if !build.unknown.is_empty() {
            let _ = write!(out, " (does not know {})", build.unknown.join(", "));
        }
        out.push('\n');
    }
    let _ = writeln!(out, "- {}\n", plan.describe());
    let mut header = vec!["measure"];
    header.extend(builds.iter().map(|b| b.column));
    // Rows in the first column's order; a label only a later column has goes last.
    let mut labels: Vec<&str> = Vec::new();
    for rows in columns {
        for (label, _) in rows {
            if !labels.contains(&label.as_str()) {
                labels.push(label);
            }
        }
    }
    let rows: Vec<(&str, Vec<String>)> = labels
        .iter()
        .map(|&label| {
            let values = columns
                .iter()
                .map(|rows| {
                    rows.iter()
                        .find(|(l, _)| l == label)
                        .map_or_else(|| "-".to_owned(), |(_, v)| v.clone())
                })
                .collect();
            (label, values)
        })
        .collect();
    out.push_str(&table::render(&header, &rows));
    let _ = write!(out, "\nwall time: {:.0} s", elapsed.as_secs_f64());
    out
}

// ---------------------------------------------------------------------------------------------
// Reading the sidecar

/// The sidecar's RSS once its work has settled.
async fn settled_rss(pod: &Pod) -> Outcome<u64> {
    tokio::time::sleep(SETTLE).await;
    rss(pod)
}

fn rss(pod: &Pod) -> Outcome<u64> {
    pod.sidecar_rss()
        .map_err(|e| format!("cannot read the RSS: {e}"))
}

/// `tether_retained_bytes` by kind, sorted by kind.
async fn retained(pod: &Pod) -> Outcome<Vec<(String, f64)>> {
    let text = pod.metrics().await.map_err(|e| e.to_string())?;
    let mut kinds: Vec<(String, f64)> = family_samples(&text, "tether_retained_bytes")
        .map(|(labels, v)| {
            let kind = labels
                .strip_prefix("kind=\"")
                .and_then(|l| l.strip_suffix('"'))
                .unwrap_or(labels);
            (kind.to_owned(), v)
        })
        .collect();
    kinds.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(kinds)
}

async fn metric(pod: &Pod, sample: &str) -> Outcome<f64> {
    pod.metric(sample).await.map_err(|e| e.to_string())
}

/// `bytes` as KiB or MiB, signed (RSS can shrink).
fn size(bytes: f64) -> String {
    let mib = bytes / (1024.0 * 1024.0);
    if mib.abs() >= 10.0 {
        format!("{mib:.1} MiB")
    } else if bytes.abs() >= 10_240.0 {
        format!("{:.1} KiB", bytes / 1024.0)
    } else {
        format!("{bytes:.0} B")
    }
}

/// `after − before` in bytes, as a float.
fn grown(after: u64, before: u64) -> f64 {
    after as f64 - before as f64
}

/// `n` with thousands separators.
fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".to_owned(),
        |d| format!("{:.2} ms", d.as_secs_f64() * 1e3),
    )
}

/// A failure count and the first failure, table-safe.
#[derive(Debug, Default)]
struct Failures {
    n: AtomicU64,
    first: Mutex<Option<String>>,
}

impl Failures {
    fn add(&self, what: String) {
        self.n.fetch_add(1, Ordering::Relaxed);
        self.first.lock().get_or_insert(what);
    }

    fn cell(&self) -> String {
        let n = self.n.load(Ordering::Relaxed);
        match &*self.first.lock() {
            Some(first) if n > 0 => format!("{n} (first: {})", cell_text(first, 80)),
            _ => "0".to_owned(),
        }
    }
}

/// What an unexpected answer says: `what answered 400 reason` when its body is a JSON-RPC error
/// with `data.reason`, else its status and the start of its body.
fn answered(what: &str, status: StatusCode, body: &str) -> String {
    let reason = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.pointer("/error/data/reason")?.as_str().map(str::to_owned));
    match reason {
        Some(reason) => format!("{what} answered {} {reason}", status.as_u16()),
        None => format!("{what} answered {}: {body:.80}", status.as_u16()),
    }
}

/// `text` on one line without `|`, at most `max` characters.
fn cell_text(text: &str, max: usize) -> String {
    let clean: String = text
        .chars()
        .map(|c| if c == '|' || c.is_control() { ' ' } else { c })
        .collect();
    if clean.chars().count() > max {
        format!("{}…", clean.chars().take(max).collect::<String>())
    } else {
        clean
    }
}

// ---------------------------------------------------------------------------------------------
// Requests

/// Request ids, unique over the run: a repeated id with the same body would be a retry, which
/// the sidecar answers from its stored reply.
static NEXT_ID: AtomicU64 = AtomicU64::new(10);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// The next request id of `session`: each session numbers its requests 10, 11, 12… as MCP
/// clients do (the SDKs count per session), over every loop of the run.
fn next_id_in(session: &Session) -> u64 {
    static IDS: std::sync::LazyLock<parking_lot::Mutex<std::collections::HashMap<String, u64>>> =
        std::sync::LazyLock::new(Default::default);
    let mut ids = IDS.lock();
    let next = ids.entry(session.id.clone()).or_insert(10);
    *next += 1;
    *next - 1
}

/// `initialize` then `notifications/initialized`, bounded; the session and the time the
/// `initialize` took (its answer read to the end).
async fn handshake(client: &McpClient) -> Outcome<(Session, Duration)> {
    let started = Instant::now();
    let exchange = async {
        let resp = client
            .post(None, &initialize_body(next_id(), VERSION), &[])
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let id = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = body_text(resp).await.map_err(|e| e.to_string())?;
        match id {
            Some(id) if status == StatusCode::OK => Ok((id, started.elapsed())),
            _ => Err(answered("initialize", status, &text)),
        }
    };
    let (id, took) = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| "initialize: no answer within 30 s".to_owned())??;
    let session = Session {
        id,
        version: VERSION.to_owned(),
    };
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let notify = async {
        let resp = client
            .post(Some(&session), &initialized, &[])
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let text = body_text(resp).await.map_err(|e| e.to_string())?;
        if status == StatusCode::ACCEPTED {
            Ok(())
        } else {
            Err(answered("notifications/initialized", status, &text))
        }
    };
    tokio::time::timeout(REQUEST_TIMEOUT, notify)
        .await
        .map_err(|_| "notifications/initialized: no answer within 30 s".to_owned())??;
    Ok((session, took))
}

/// `n` sessions, `concurrency` handshakes at a time; the failures are counted in `failures`.
async fn open_sessions(
    client: &McpClient,
    n: u64,
    concurrency: usize,
    failures: &Arc<Failures>,
) -> Vec<Session> {
    let left = Arc::new(AtomicU64::new(n));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, left, failures) = (client.clone(), Arc::clone(&left), Arc::clone(failures));
        workers.spawn(async move {
            let mut made = Vec::new();
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1))
                .is_ok()
            {
                match handshake(&client).await {
                    Ok((session, _)) => made.push(session),
                    Err(e) => failures.add(e),
                }
            }
            made
        });
    }
    let mut sessions = Vec::new();
    while let Some(done) = workers.join_next().await {
        match done {
            Ok(made) => sessions.extend(made),
            Err(e) => failures.add(format!("a worker failed: {e}")),
        }
    }
    sessions
}

/// One `echo` call with request id `id`, bounded; `Ok` when answered 200 with the text.
async fn echo(client: &McpClient, session: &Session, id: u64) -> Outcome<()> {
    match client.echo(session, id, "bench", REQUEST_TIMEOUT).await {
        Ok(()) => Ok(()),
        Err(HarnessError::Status { status, body, .. }) => Err(answered("echo", status, &body)),
        Err(e) => Err(e.to_string()),
    }
}

/// `total` `echo` calls by `users` users in a closed loop, user `u` on session `u % len`; the
/// failures are counted in `failures`.
async fn echo_loop(
    client: &McpClient,
    sessions: &Arc<Vec<Session>>,
    users: usize,
    total: u64,
    failures: &Arc<Failures>,
) {
    let left = Arc::new(AtomicU64::new(total));
    let mut workers = tokio::task::JoinSet::new();
    for user in 0..users {
        let (client, sessions, left, failures) = (
            client.clone(),
            Arc::clone(sessions),
            Arc::clone(&left),
            Arc::clone(failures),
        );
        workers.spawn(async move {
            let session = &sessions[user % sessions.len()];
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1))
                .is_ok()
            {
                if let Err(e) = echo(&client, session, next_id_in(session)).await {
                    failures.add(e);
                }
            }
        });
    }
    while workers.join_next().await.is_some() {}
}

/// `n` sessions for a scenario that needs them all.
async fn sessions_for(client: &McpClient, n: u64) -> Outcome<Arc<Vec<Session>>> {
    let failures = Arc::new(Failures::default());
    let sessions = open_sessions(client, n, 16, &failures).await;
    if sessions.len() as u64 == n {
        Ok(Arc::new(sessions))
    } else {
        Err(format!(
            "only {} of {n} sessions started: {}",
            sessions.len(),
            failures.cell()
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// The scenarios

/// Scenario 1: RSS per idle session.
async fn idle_sessions(pod: &Pod, plan: &Plan) -> Outcome<Rows> {
    let client = pod.client();
    let before = settled_rss(pod).await?;
    let failures = Arc::new(Failures::default());
    let mut rows = Rows::new();
    let (mut asked, mut made) = (0, 0u64);
    let started = Instant::now();
    for &target in &plan.idle_sessions {
        made += open_sessions(&client, target - asked, plan.init_concurrency, &failures)
            .await
            .len() as u64;
        asked = target;
        let after = settled_rss(pod).await?;
        rows.push((
            format!("1. idle sessions: RSS per session at {}", count(target)),
            size(grown(after, before) / made.max(1) as f64),
        ));
    }
    let elapsed = started.elapsed().as_secs_f64() - SETTLE.as_secs_f64() * rows.len() as f64;
    let journal = retained(pod)
        .await?
        .into_iter()
        .find(|(kind, _)| kind == "journal")
        .map_or(0.0, |(_, v)| v);
    let held = metric(pod, "tether_sessions").await?;
    rows.push((
        "1. idle sessions: journal per session (`tether_retained_bytes`)".into(),
        size(journal / made.max(1) as f64),
    ));
    rows.push((
        "1. idle sessions: sessions held (`tether_sessions`)".into(),
        count(held as u64),
    ));
    rows.push((
        "1. idle sessions: handshakes per second".into(),
        format!("{:.0}", made as f64 / elapsed.max(0.001)),
    ));
    rows.push((
        "1. idle sessions: failed handshakes".into(),
        failures.cell(),
    ));
    Ok(rows)
}

/// How long scenario 8 waits for every session to be replicated.
const REPLICATED_WITHIN: Duration = Duration::from_secs(60);

/// Scenario 8: RSS per idle session at its holder and at its replica pod.
async fn replicated_idle_sessions(cluster: &Cluster, plan: &Plan) -> Outcome<Rows> {
    let [holder, replica_pod] = &cluster.pods[..] else {
        return Err("scenario 8 runs on two pods".into());
    };
    let client = holder.client();
    tokio::time::sleep(SETTLE).await;
    let before = (rss(holder)?, rss(replica_pod)?);
    let failures = Arc::new(Failures::default());
    let mut rows = Rows::new();
    let (mut asked, mut made) = (0, 0u64);
    for &target in &plan.idle_sessions {
        made += open_sessions(&client, target - asked, plan.init_concurrency, &failures)
            .await
            .len() as u64;
        asked = target;
        let kept = replica_pod
            .wait_for_metric("tether_replicas", REPLICATED_WITHIN, |n| n >= made as f64)
            .await
            .map_err(|e| e.to_string())?;
        let unreplicated = metric(holder, "tether_sessions_unreplicated").await?;
        tokio::time::sleep(SETTLE).await;
        let per_session = |after: u64, before: u64| size(grown(after, before) / made.max(1) as f64);
        let at = count(target);
        rows.push((
            format!("8. replicated idle sessions: RSS per session at {at}, holder"),
            per_session(rss(holder)?, before.0),
        ));
        rows.push((
            format!("8. replicated idle sessions: RSS per session at {at}, replica pod"),
            per_session(rss(replica_pod)?, before.1),
        ));
        rows.push((
            format!("8. replicated idle sessions: replicas kept / unreplicated at {at}"),
            format!("{} / {}", count(kept as u64), count(unreplicated as u64)),
        ));
    }
    let replicas = retained(replica_pod)
        .await?
        .into_iter()
        .find(|(kind, _)| kind == "replicas")
        .map_or(0.0, |(_, v)| v);
    rows.push((
        "8. replicated idle sessions: replica per session (`tether_retained_bytes`)".into(),
        size(replicas / made.max(1) as f64),
    ));
    rows.push((
        "8. replicated idle sessions: failed handshakes".into(),
        failures.cell(),
    ));
    Ok(rows)
}

/// Scenario 2: RSS per completed JSON request, and what the sidecar retains after them.
async fn json_requests(pod: &Pod, plan: &Plan) -> Outcome<Rows> {
    let client = pod.client();
    let sessions = sessions_for(&client, plan.json_sessions).await?;
    let total = plan.json_sessions * plan.json_calls;
    let before = settled_rss(pod).await?;
    let failures = Arc::new(Failures::default());
    let started = Instant::now();
    echo_loop(&client, &sessions, plan.users, total, &failures).await;
    let elapsed = started.elapsed();
    let after = settled_rss(pod).await?;
    let label = format!(
        "2. {} sessions × {} `echo`",
        plan.json_sessions,
        count(plan.json_calls)
    );
    let mut rows = vec![
        (
            format!("{label}: RSS per request"),
            size(grown(after, before) / total as f64),
        ),
        (
            format!("{label}: requests per second"),
            format!("{:.0}", total as f64 / elapsed.as_secs_f64()),
        ),
        (format!("{label}: failed requests"), failures.cell()),
    ];
    for (kind, bytes) in retained(pod).await? {
        rows.push((
            format!("{label}: `tether_retained_bytes` {kind} after"),
            size(bytes),
        ));
    }
    Ok(rows)
}

/// Scenario 3: RSS over a million JSON requests; whether it plateaus.
async fn million_requests(pod: &Pod, plan: &Plan) -> Outcome<Rows> {
    let client = pod.client();
    let sessions = sessions_for(&client, plan.echo_sessions).await?;
    let step = plan.echo_requests / 10;
    let failures = Arc::new(Failures::default());
    let mut samples = Vec::new();
    let started = Instant::now();
    for _ in 0..10 {
        echo_loop(&client, &sessions, plan.users, step, &failures).await;
        samples.push(rss(pod)?);
    }
    let elapsed = started.elapsed();
    let label = format!(
        "3. {} `echo` over {} sessions",
        count(step * 10),
        plan.echo_sessions
    );
    let series: Vec<String> = samples
        .iter()
        .map(|&b| format!("{:.0}", b as f64 / (1024.0 * 1024.0)))
        .collect();
    let (half, last) = (samples[4] as f64, samples[9] as f64);
    let plateau = (last - half).abs() <= 0.1 * half;
    tokio::time::sleep(SETTLE).await;
    let retained_total: f64 = retained(pod).await?.iter().map(|(_, v)| v).sum();
    Ok(vec![
        (
            format!("{label}: RSS every {} (MiB)", count(step)),
            series.join(" "),
        ),
        (
            format!(
                "{label}: plateau (the last sample within 10 % of the one at {})",
                count(step * 5)
            ),
            if plateau { "yes" } else { "no" }.into(),
        ),
        (
            format!("{label}: `tether_retained_bytes` total after"),
            size(retained_total),
        ),
        (
            format!("{label}: requests per second"),
            format!("{:.0}", (step * 10) as f64 / elapsed.as_secs_f64()),
        ),
        (format!("{label}: failed requests"), failures.cell()),
    ])
}

/// What one reader of a `stream` call saw.
#[derive(Debug, Default)]
struct StreamSeen {
    /// Progress events received (with a `seq`).
    events: u64,
    /// Distinct `seq` values received, of 1..=count.
    distinct: u64,
    /// Events whose `seq` had been received already.
    duplicated: u64,
    /// New events whose `seq` is below one received before.
    reordered: u64,
    /// Whether the result arrived.
    result: bool,
    /// Why the stream ended before its result (an answer other than 200 SSE, a broken or
    /// stalled body, the end).
    cut: Option<String>,
}

impl StreamSeen {
    fn lost(&self, count: u64) -> u64 {
        count.saturating_sub(self.distinct)
    }
}

/// The events' data of an SSE body as it arrives in pieces.
#[derive(Debug, Default)]
struct SseScanner {
    pending: Vec<u8>,
    data: Vec<u8>,
}

impl SseScanner {
    /// Feeds `bytes`; calls `event` with the data of each event they complete.
    fn feed(&mut self, bytes: &[u8], mut event: impl FnMut(&[u8])) {
        self.pending.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(at) = self.pending[start..].iter().position(|&b| b == b'\n') {
            let line = &self.pending[start..start + at];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                if !self.data.is_empty() {
                    event(&self.data);
                    self.data.clear();
                }
            } else if let Some(value) = line.strip_prefix(b"data:") {
                if !self.data.is_empty() {
                    self.data.push(b'\n');
                }
                self.data
                    .extend_from_slice(value.strip_prefix(b" ").unwrap_or(value));
            }
            start += at + 1;
        }
        self.pending.drain(..start);
    }
}

/// The number after key `"key"` in JSON text `text` (the first occurrence).
fn number_after(text: &str, key: &str) -> Option<u64> {
    let rest = &text[text.find(key)? + key.len()..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Calls `stream` (`count` events of `pad` bytes) and reads it to its end, each piece within
/// [`STALL_TIMEOUT`], sleeping `pause` per 2 KiB read when given (a slow reader).
async fn read_stream(
    client: &McpClient,
    session: &Session,
    count: u64,
    pad: u64,
    pause: Option<Duration>,
) -> StreamSeen {
    let mut seen = StreamSeen::default();
    let id = next_id();
    let call_id = format!("stream-{id}");
    let call = tool_call(
        id,
        "stream",
        json!({"count": count, "size": pad, "call_id": call_id}),
        Some(&call_id),
    );
    let resp = match client.post(Some(session), &call, &[]).await {
        Ok(resp) => resp,
        Err(e) => {
            seen.cut = Some(e.to_string());
            return seen;
        }
    };
    if resp.status() != StatusCode::OK {
        let status = resp.status();
        let text = tokio::time::timeout(REQUEST_TIMEOUT, body_text(resp))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        seen.cut = Some(answered("the call", status, &text));
        return seen;
    }
    let mut body: Incoming = resp.into_body();
    let mut received = vec![false; usize::try_from(count).unwrap_or(0) + 1];
    let mut highest = 0;
    let mut scanner = SseScanner::default();
    let mut on_event = |data: &[u8]| {
        let text = String::from_utf8_lossy(data);
        if let Some(seq) = number_after(&text, "\"seq\"") {
            seen.events += 1;
            match received.get_mut(usize::try_from(seq).unwrap_or(usize::MAX)) {
                Some(slot) if seq > 0 => {
                    if *slot {
                        seen.duplicated += 1;
                    } else {
                        *slot = true;
                        seen.distinct += 1;
                        if seq < highest {
                            seen.reordered += 1;
                        }
                    }
                    highest = highest.max(seq);
                }
                _ => {}
            }
        } else if text.contains("\"result\"") {
            seen.result = true;
        }
    };
    let end = loop {
        match tokio::time::timeout(STALL_TIMEOUT, body.frame()).await {
            Err(_) => break Some(format!("stalled for {STALL_TIMEOUT:?}")),
            Ok(None) => break None,
            Ok(Some(Err(e))) => break Some(format!("the body broke: {e}")),
            Ok(Some(Ok(frame))) => {
                if let Some(bytes) = frame.data_ref() {
                    scanner.feed(bytes, &mut on_event);
                    if let Some(pause) = pause {
                        let pieces = u32::try_from(bytes.len().div_ceil(2048)).unwrap_or(1);
                        tokio::time::sleep(pause * pieces).await;
                    }
                }
            }
        }
    };
    if !seen.result {
        seen.cut = Some(end.unwrap_or_else(|| "ended before the result".to_owned()));
    }
    seen
}

/// Scenario 4: fast streams read fully by as many readers.
async fn fast_streams(pod: &Pod, plan: &Plan) -> Outcome<Rows> {
    let client = pod.client();
    let sessions = sessions_for(&client, plan.streams as u64).await?;
    let (mut events, mut lost, mut duplicated, mut reordered) = (0, 0, 0, 0);
    let cuts = Failures::default();
    let mut wall = Duration::ZERO;
    for _ in 0..plan.stream_runs {
        let started = Instant::now();
        let mut readers = tokio::task::JoinSet::new();
        for session in sessions.iter() {
            let (client, session, count) = (client.clone(), session.clone(), plan.stream_events);
            readers.spawn(async move { read_stream(&client, &session, count, 0, None).await });
        }
        while let Some(done) = readers.join_next().await {
            let seen = done.map_err(|e| format!("a reader failed: {e}"))?;
            events += seen.events;
            lost += seen.lost(plan.stream_events);
            duplicated += seen.duplicated;
            reordered += seen.reordered;
            if let Some(why) = seen.cut {
                cuts.add(why);
            }
        }
        wall += started.elapsed();
    }
    let stats = pod.stats().await.map_err(|e| e.to_string())?;
    let label = format!(
        "4. {} streams × {} events × {} runs",
        plan.streams,
        count(plan.stream_events),
        plan.stream_runs
    );
    let calls = plan.streams as u64 * plan.stream_runs;
    Ok(vec![
        (format!("{label}: events lost"), count(lost)),
        (format!("{label}: events duplicated"), count(duplicated)),
        (format!("{label}: events reordered"), count(reordered)),
        (format!("{label}: streams cut (of {calls})"), cuts.cell()),
        (
            format!("{label}: events per second"),
            count((events as f64 / wall.as_secs_f64().max(0.001)) as u64),
        ),
        (
            format!("{label}: calls the origin ran twice"),
            executed_twice(&stats).to_string(),
        ),
        (
            format!("{label}: calls the origin saw aborted"),
            stats["aborted"].as_u64().unwrap_or(0).to_string(),
        ),
        (
            format!("{label}: peak RSS"),
            size(pod.sidecar_peak_rss().map_err(|e| e.to_string())? as f64),
        ),
    ])
}

/// Scenario 5: one stream read slowly.
async fn slow_reader(pod: &Pod, plan: &Plan) -> Outcome<Rows> {
    let client = pod.client();
    let sessions = sessions_for(&client, 1).await?;
    let started = Instant::now();
    let seen = read_stream(
        &client,
        &sessions[0],
        plan.slow_events,
        64,
        Some(Duration::from_millis(2)),
    )
    .await;
    let elapsed = started.elapsed();
    let label = format!(
        "5. slow reader (~1 MB/s), {} events of 64 B padding",
        count(plan.slow_events)
    );
    let yes = |b: bool| if b { "yes" } else { "no" }.to_owned();
    Ok(vec![
        (format!("{label}: events received"), count(seen.events)),
        (
            format!("{label}: events lost"),
            count(seen.lost(plan.slow_events)),
        ),
        (format!("{label}: result received"), yes(seen.result)),
        (
            format!("{label}: cut"),
            seen.cut.as_deref().map_or_else(
                || "no".to_owned(),
                |why| format!("yes ({})", cell_text(why, 60)),
            ),
        ),
        (
            format!("{label}: time"),
            format!("{:.1} s", elapsed.as_secs_f64()),
        ),
        (
            format!("{label}: peak RSS"),
            size(pod.sidecar_peak_rss().map_err(|e| e.to_string())? as f64),
        ),
    ])
}

/// The sessions' idle timeout in scenario 7.
const REAP_IDLE_TIMEOUT: &str = "2s";

/// Scenario 7: sessions that made a few calls, abandoned and reaped, in [`REAP_ROUNDS`]
/// rounds on one pod: what a round leaves, and whether the next one adds to it.
async fn reaped(pod: &Pod, plan: &Plan) -> Outcome<Rows> {
    const AFTER: Duration = Duration::from_secs(20);
    let before = settled_rss(pod).await?;
    let failures = Arc::new(Failures::default());
    let label = format!("7. {} sessions reaped", count(plan.reaped_sessions));
    let mib = |rss: u64| format!("{} ({})", size(rss as f64), size(grown(rss, before)));
    let mut rows = vec![(format!("{label}: RSS before"), size(before as f64))];
    for round in 1..=REAP_ROUNDS {
        let client = pod.client();
        let sessions = Arc::new(open_sessions(&client, plan.reaped_sessions, 16, &failures).await);
        echo_loop(&client, &sessions, 16, sessions.len() as u64 * 2, &failures).await;
        let called = rss(pod)?;
        // The clients go away: their sessions and connections are abandoned.
        drop((sessions, client));
        let deadline = Instant::now() + REQUEST_TIMEOUT * 2;
        while metric(pod, "tether_sessions").await? > 0.0 {
            if Instant::now() > deadline {
                return Err("sessions still held 60 s after they were abandoned".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let reaped = rss(pod)?;
        tokio::time::sleep(AFTER).await;
        let after = rss(pod)?;
        rows.extend([
            (
                format!("{label}, round {round}: RSS after the calls (growth)"),
                mib(called),
            ),
            (
                format!("{label}, round {round}: RSS when the last is reaped"),
                mib(reaped),
            ),
            (
                format!("{label}, round {round}: RSS 20 s later"),
                mib(after),
            ),
        ]);
    }
    rows.push((format!("{label}: failures"), failures.cell()));
    Ok(rows)
}

/// Rounds of scenario 7.
const REAP_ROUNDS: u32 = 3;

/// Scenario 6: sessions opened at a steady rate and never deleted.
async fn churn(pod: &Pod, plan: &Plan) -> Outcome<Rows> {
    const MARK: Duration = Duration::from_secs(5);
    const IN_FLIGHT: usize = 512;
    let client = pod.client();
    let before = settled_rss(pod).await?;
    let span = Duration::from_secs(plan.churn_seconds);
    let failures = Arc::new(Failures::default());
    let latencies: Arc<Mutex<Vec<(Duration, Duration)>>> = Arc::default();
    let gate = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tick = tokio::time::interval(Duration::from_secs(1) / plan.churn_rate);
    let mut tasks = tokio::task::JoinSet::new();
    let mut at_mark = None;
    let started = Instant::now();
    while started.elapsed() < span {
        tick.tick().await;
        if at_mark.is_none() && started.elapsed() >= MARK {
            at_mark = Some(rss(pod)?);
        }
        let Ok(permit) = Arc::clone(&gate).try_acquire_owned() else {
            failures.add(format!("{IN_FLIGHT} handshakes already in flight"));
            continue;
        };
        let (client, failures, latencies) = (
            client.clone(),
            Arc::clone(&failures),
            Arc::clone(&latencies),
        );
        tasks.spawn(async move {
            let sent = started.elapsed();
            match handshake(&client).await {
                Ok((_, took)) => latencies.lock().push((sent, took)),
                Err(e) => failures.add(e),
            }
            drop(permit);
        });
        // Reap the finished ones as we go, so the set stays small.
        while tasks.try_join_next().is_some() {}
    }
    let _ = tokio::time::timeout(REQUEST_TIMEOUT * 2, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    let end = rss(pod)?;
    let latencies = latencies.lock();
    let window = |from: Duration, to: Duration| -> Vec<Duration> {
        latencies
            .iter()
            .filter(|(sent, _)| *sent >= from && *sent < to)
            .map(|(_, took)| *took)
            .collect()
    };
    let first = window(Duration::ZERO, MARK);
    let last = window(span.saturating_sub(MARK), span);
    let made = latencies.len();
    let label = format!("6. churn {}/s × {} s", plan.churn_rate, plan.churn_seconds);
    let at_mark = at_mark.unwrap_or(end);
    Ok(vec![
        (
            format!("{label}: RSS at 5 s (growth)"),
            format!(
                "{} ({})",
                size(at_mark as f64),
                size(grown(at_mark, before))
            ),
        ),
        (
            format!("{label}: RSS at the end (growth)"),
            format!("{} ({})", size(end as f64), size(grown(end, before))),
        ),
        (
            format!("{label}: RSS per session"),
            size(grown(end, before) / made.max(1) as f64),
        ),
        (
            format!("{label}: `initialize` p99, first 5 s"),
            ms(quantile(&first, 0.99)),
        ),
        (
            format!("{label}: `initialize` p99, last 5 s"),
            ms(quantile(&last, 0.99)),
        ),
        (format!("{label}: sessions made"), count(made as u64)),
        (format!("{label}: failed handshakes"), failures.cell()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scanner_finds_events_across_pieces() {
        let mut scanner = SseScanner::default();
        let mut events = Vec::new();
        for piece in [
            "id: 1\r\ndata: {\"seq\":",
            "1}\n\n: keep-alive\n\nda",
            "ta: a\ndata: b\n\n",
        ] {
            scanner.feed(piece.as_bytes(), |d| {
                events.push(String::from_utf8_lossy(d).into_owned());
            });
        }
        assert_eq!(events, ["{\"seq\":1}", "a\nb"]);
        assert_eq!(number_after("{\"seq\": 42,\"t\":1}", "\"seq\""), Some(42));
        assert_eq!(number_after("{\"t\":1}", "\"seq\""), None);
    }

    #[test]
    fn counts_read_well() {
        assert_eq!(count(1_000_000), "1,000,000");
        assert_eq!(count(999), "999");
        assert_eq!(size(2048.0), "2048 B");
        assert_eq!(size(-20_480.0), "-20.0 KiB");
        assert_eq!(cell_text("a|b\nc", 3), "a b…");
    }
}

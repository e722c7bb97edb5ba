//! The Floods table: what one attacker's flood costs a pod, and the others on it.
//!
//! One pod whose MCP server requires bearer JWTs (`tether-example-server --auth-key`, the
//! sidecar with its default bounds, or `--sidecar-arg`s). The *victim* — its own principal, its
//! own loopback source address — calls `echo` in its session, one call after another, for the
//! `--flood-seconds` of each row, and a prober of a third address GETs `/readyz` every 200 ms
//! ([`crate::watch::Victim`]). In each row the *attacker* — a principal and source addresses
//! of that row's own — runs one [`Flood`] for the same time; then everything it opened is
//! closed (its sessions deleted, its connections dropped) and the pod is let settle: calls in
//! flight back to 0, connections back to what they were ([`crate::watch::settle`]), then
//! `--settle-seconds` of quiet (longer than jemalloc's 10 s decay, over which the sidecar
//! returns freed pages). The rows, all in one run so that they compare side by side:
//!
//! 0. **quiet**: no flood, the baseline.
//! 1. **unread answers**: `slow` calls (`--unread-count` progress events `--unread-interval-ms`
//!    apart, with a progress token) in `--flood-sessions` sessions, each sent over a connection
//!    closed as soon as the request is written, by `--flood-tasks` tasks as fast as they can:
//!    answers nobody reads, held by the sidecar until `--unread-ttl` (bounded per session,
//!    `--max-session-calls`, and per principal: `--max-principal-calls`,
//!    `--max-principal-retained-bytes`).
//! 2. **silent connections**: `--silent-connections` TCP connections to the MCP port from one
//!    address, sending nothing, each opened again when the pod closes it (per-source cap
//!    `--max-connections-per-source`, the head deadline `--header-timeout` from accept).
//! 3. **half-sent admin heads**: `--admin-connections` connections from each of
//!    `--admin-sources` addresses to the admin port, each sending the start of a head and no
//!    more, opened again when closed (`--admin-max-connections[-per-source]`,
//!    `--header-timeout`).
//! 4. **walked-away calls**: long `slow` calls (`--walk-count` events `--walk-interval-ms`
//!    apart) started in `--flood-sessions` sessions, their answers dropped once their headers
//!    arrived, as fast as they are accepted (`--max-session-calls`, `--max-principal-calls`,
//!    `--max-calls`); they run on at the MCP server until their end, so the row settles slowly.
//! 5. **session flood**: `initialize` in a loop by one principal, from `--flood-tasks` tasks
//!    (`--max-principal-sessions`); the sessions are deleted after the row.
//! 6. **`/drained` waiters**: GET `/drained` held open on the admin port, as many as row 3's
//!    connections, each opened again when answered (a wait ends 503 after `spec.drain.timeout`
//!    + 2 s) or closed.
//! 7. **unpolled tasks**: `job` calls (`--task-ms` long) of a 2026-07-28 client declaring the
//!    tasks extension, each returning a task at once that nobody polls
//!    (`--max-principal-open-tasks`; the tasks stay open at the MCP server for their ttl).
//!
//! The attacker re-opens a connection the pod closed, or sends again after a refusal,
//! `--reopen-ms` later. Its column gives what it did (its own counts, by outcome), then, after
//! `sidecar:`, what the sidecar counted of it (the growth of [`crate::watch::COUNTERS`]) and
//! the peaks of the gauges that rose ([`crate::watch::GAUGES`]).

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use http::StatusCode;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tether_tests::addr;
use tether_tests::auth::Issuer;
use tether_tests::client::{McpClient, Session, body_text, header_str, initialize_body, tool_call};
use tether_tests::pod::{ADMIN_PORT, LISTEN_PORT, Pod, PodSpec};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

use crate::Outcome;
use crate::watch::{self, Counters, RssPeak, Served, Victim};

/// The Floods table's command line.
#[derive(Debug, clap::Args)]
pub(crate) struct Knobs {
    /// Seconds each flood runs (and the victim calls `echo`, in the quiet row too).
    #[arg(long, default_value_t = 8)]
    flood_seconds: u64,
    /// Seconds the pod is left alone after a flood's leftovers are gone, before its RSS is
    /// read: longer than the 10 s over which the sidecar's allocator (jemalloc, its background
    /// thread) returns freed pages.
    #[arg(long, default_value_t = 12)]
    settle_seconds: u64,
    /// The rows of the Floods table to run (0 to 7), e.g. `0,2,5`.
    #[arg(long, value_delimiter = ',', default_values_t = [0, 1, 2, 3, 4, 5, 6, 7])]
    flood_rows: Vec<usize>,
    /// Concurrent attacker tasks of the request floods (rows 1, 4, 5, 7).
    #[arg(long, default_value_t = 8)]
    flood_tasks: usize,
    /// Attacker sessions of the call floods (rows 1, 4).
    #[arg(long, default_value_t = 10)]
    flood_sessions: usize,
    /// Progress events of each `slow` call of the unread-answers flood.
    #[arg(long, default_value_t = 20)]
    unread_count: u32,
    /// Milliseconds between them.
    #[arg(long, default_value_t = 20)]
    unread_interval_ms: u64,
    /// Progress events of each walked-away `slow` call.
    #[arg(long, default_value_t = 30)]
    walk_count: u32,
    /// Milliseconds between them.
    #[arg(long, default_value_t = 1000)]
    walk_interval_ms: u64,
    /// Silent connections the attacker keeps open on the MCP port (the sidecar's per-source
    /// cap is 1,024 by default).
    #[arg(long, default_value_t = 1200)]
    silent_connections: usize,
    /// Attacker source addresses of the admin floods (rows 3, 6).
    #[arg(long, default_value_t = 4)]
    admin_sources: usize,
    /// Admin connections the attacker keeps open from each of them (the sidecar's per-source
    /// cap is 16 by default).
    #[arg(long, default_value_t = 50)]
    admin_connections: usize,
    /// Milliseconds of each unpolled task's `job`.
    #[arg(long, default_value_t = 2000)]
    task_ms: u64,
    /// Milliseconds before the attacker re-opens a connection the pod closed, or sends again
    /// after a refusal.
    #[arg(long, default_value_t = 20)]
    reopen_ms: u64,
    /// An extra flag of the floods' sidecar, e.g. `--sidecar-arg=--max-principal-sessions=500`
    /// (repeatable).
    #[arg(long = "sidecar-arg", allow_hyphen_values = true)]
    sidecar_args: Vec<String>,
}

/// The issuer of every principal's tokens.
const ISS: &str = "https://idp.example";
/// How long tokens are valid: longer than any run.
const HOUR: Duration = Duration::from_secs(3600);
/// The protocol version of the sessions.
const VERSION: &str = "2025-11-25";

/// One row's flood.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flood {
    Quiet,
    UnreadAnswers,
    SilentConnections,
    AdminHeads,
    WalkedAway,
    Sessions,
    DrainedWaiters,
    UnpolledTasks,
}

/// The rows, in order (their numbers are `--flood-rows`').
const FLOODS: [Flood; 8] = [
    Flood::Quiet,
    Flood::UnreadAnswers,
    Flood::SilentConnections,
    Flood::AdminHeads,
    Flood::WalkedAway,
    Flood::Sessions,
    Flood::DrainedWaiters,
    Flood::UnpolledTasks,
];

/// The attacker of one row: its principal's client and token, its source addresses.
struct Attacker<'a> {
    /// The row's number (call and session ids carry it).
    row: usize,
    pod_ip: Ipv4Addr,
    mcp_url: String,
    /// A client from `source` with the attacker's bearer token.
    client: McpClient,
    /// `Bearer <token>`.
    authorization: String,
    /// Its address for the MCP port.
    source: Ipv4Addr,
    /// Its addresses for the admin port.
    admin_sources: Vec<Ipv4Addr>,
    knobs: &'a Knobs,
}

/// What an attacker did: its counts by outcome, in the order first seen, and the sessions it
/// leaves (deleted after the row).
#[derive(Clone, Default)]
struct Tally {
    counts: Arc<Mutex<Vec<(String, u64)>>>,
    sessions: Arc<Mutex<Vec<Session>>>,
}

impl Tally {
    fn add(&self, what: impl AsRef<str>) {
        let mut counts = self.counts.lock();
        let what = what.as_ref();
        match counts.iter_mut().find(|(w, _)| w == what) {
            Some((_, n)) => *n += 1,
            None => counts.push((what.to_owned(), 1)),
        }
    }

    fn summary(&self) -> Vec<String> {
        self.counts
            .lock()
            .iter()
            .map(|(what, n)| format!("{what} {}", watch::count(*n as f64)))
            .collect()
    }
}

impl Flood {
    fn name(self) -> &'static str {
        match self {
            Flood::Quiet => "0 quiet",
            Flood::UnreadAnswers => "1 unread answers",
            Flood::SilentConnections => "2 silent connections (MCP port)",
            Flood::AdminHeads => "3 half-sent heads (admin port)",
            Flood::WalkedAway => "4 walked-away calls",
            Flood::Sessions => "5 session flood (one principal)",
            Flood::DrainedWaiters => "6 `/drained` waiters (admin port)",
            Flood::UnpolledTasks => "7 unpolled tasks",
        }
    }

    /// Runs the flood until `until`, then closes what it opened but its sessions (in the
    /// tally, deleted by the caller).
    async fn run(self, attacker: &Attacker<'_>, until: Instant) -> Outcome<Tally> {
        let tally = Tally::default();
        match self {
            Flood::Quiet => tokio::time::sleep_until(until.into()).await,
            Flood::UnreadAnswers => attacker.unread_answers(&tally, until).await?,
            Flood::SilentConnections => attacker.silent_connections(&tally, until).await,
            Flood::AdminHeads => {
                let head = b"GET /metrics HTTP/1.1\r\nx-slow: ".to_vec();
                attacker
                    .admin_connections(&tally, until, head, "half-sent heads")
                    .await;
            }
            Flood::WalkedAway => attacker.walked_away(&tally, until).await?,
            Flood::Sessions => attacker.sessions(&tally, until).await,
            Flood::DrainedWaiters => {
                let head = format!(
                    "GET /drained HTTP/1.1\r\nhost: {}:{ADMIN_PORT}\r\n\r\n",
                    attacker.pod_ip
                );
                let what = "`/drained` waits";
                attacker
                    .admin_connections(&tally, until, head.into_bytes(), what)
                    .await;
            }
            Flood::UnpolledTasks => attacker.unpolled_tasks(&tally, until).await,
        }
        Ok(tally)
    }
}

/// Runs `n` copies of `task` (given their index) until `until`, when they are dropped (and
/// the connections they hold closed).
async fn swarm<F, Fut>(n: usize, until: Instant, task: F)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let tasks: Vec<_> = (0..n)
        .map(|i| tokio::spawn(tokio::time::timeout_at(until.into(), task(i))))
        .collect();
    for task in tasks {
        let _ = task.await;
    }
}

/// A TCP connection to `to` from `source`.
async fn connect_from(source: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind((source, 0).into())?;
    socket.connect(to).await
}

/// Waits for the pod's first answer on `conn`, or its close: what it was (`answered 429
/// source_connections`, `closed by the pod`).
async fn first_answer(conn: &mut TcpStream) -> String {
    let mut buf = vec![0; 4096];
    match conn.read(&mut buf).await {
        Ok(0) | Err(_) => "closed by the pod".into(),
        Ok(n) => {
            let text = String::from_utf8_lossy(&buf[..n]);
            let status = text.split_whitespace().nth(1).unwrap_or("?");
            let reason = text
                .split_once(r#""reason":""#)
                .and_then(|(_, rest)| rest.split('"').next())
                .map_or(String::new(), |r| format!(" {r}"));
            format!("answered {status}{reason}")
        }
    }
}

/// Tallies an exchange that did not succeed — its refusal ([`refusal`]) or `failed` — and
/// waits `pause` before the attacker tries again.
async fn back_off(
    tally: &Tally,
    answer: tether_tests::Result<http::Response<hyper::body::Incoming>>,
    pause: Duration,
) {
    match answer {
        Ok(resp) => tally.add(refusal(resp).await),
        Err(_) => tally.add("failed"),
    }
    tokio::time::sleep(pause).await;
}

/// An answer's status and JSON-RPC `data.reason` (or `error.message`): `429 session_calls`.
async fn refusal(resp: http::Response<hyper::body::Incoming>) -> String {
    let status = resp.status();
    let text = body_text(resp).await.unwrap_or_default();
    let error = serde_json::from_str::<Value>(&text).ok();
    let reason = error.as_ref().and_then(|e| {
        e.pointer("/error/data/reason")
            .or_else(|| e.pointer("/error/message"))
            .and_then(Value::as_str)
    });
    format!("{} {}", status.as_u16(), reason.unwrap_or(""))
        .trim_end()
        .to_owned()
}

impl Attacker<'_> {
    fn pause(&self) -> Duration {
        Duration::from_millis(self.knobs.reopen_ms)
    }

    /// Opens `n` sessions of the attacker.
    async fn open_sessions(&self, n: usize) -> Outcome<Vec<Session>> {
        let mut sessions = Vec::with_capacity(n);
        for _ in 0..n {
            sessions.push(
                self.client
                    .initialize(VERSION)
                    .await
                    .map_err(|e| format!("the attacker's initialize: {e}"))?,
            );
        }
        Ok(sessions)
    }

    /// Row 1: `slow` calls over connections closed as soon as the request is written.
    async fn unread_answers(&self, tally: &Tally, until: Instant) -> Outcome<()> {
        let sessions = Arc::new(self.open_sessions(self.knobs.flood_sessions).await?);
        tally.sessions.lock().extend(sessions.iter().cloned());
        let next = Arc::new(AtomicU64::new(0));
        let to = SocketAddr::from((self.pod_ip, LISTEN_PORT));
        let arguments = json!({"count": self.knobs.unread_count,
            "interval_ms": self.knobs.unread_interval_ms});
        swarm(self.knobs.flood_tasks, until, |_| {
            let (sessions, next, tally) = (Arc::clone(&sessions), Arc::clone(&next), tally.clone());
            let (source, pause, row) = (self.source, self.pause(), self.row);
            let (mut arguments, authorization) = (arguments.clone(), self.authorization.clone());
            async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let session = &sessions[n as usize % sessions.len()];
                    arguments["call_id"] = json!(format!("unread-{row}-{n}"));
                    let body = tool_call(n, "slow", arguments.clone(), Some("p")).to_string();
                    let request = raw_post(to, session, &authorization, &body);
                    match connect_from(source, to).await {
                        Ok(mut conn) => match conn.write_all(request.as_bytes()).await {
                            Ok(()) => tally.add("calls sent, connection closed at once"),
                            Err(_) => tally.add("write failed"),
                        },
                        Err(_) => {
                            tally.add("connect failed");
                            tokio::time::sleep(pause).await;
                        }
                    }
                }
            }
        })
        .await;
        Ok(())
    }

    /// Row 2: connections to the MCP port that send nothing.
    async fn silent_connections(&self, tally: &Tally, until: Instant) {
        let to = SocketAddr::from((self.pod_ip, LISTEN_PORT));
        swarm(self.knobs.silent_connections, until, |_| {
            let (tally, source, pause) = (tally.clone(), self.source, self.pause());
            async move {
                loop {
                    match connect_from(source, to).await {
                        Ok(mut conn) => {
                            tally.add("silent connections opened");
                            tally.add(first_answer(&mut conn).await);
                        }
                        Err(_) => tally.add("connect failed"),
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        })
        .await;
    }

    /// Rows 3 and 6: connections to the admin port from each admin source, each sending
    /// `head`, opened again when answered or closed.
    async fn admin_connections(&self, tally: &Tally, until: Instant, head: Vec<u8>, what: &str) {
        let to = SocketAddr::from((self.pod_ip, ADMIN_PORT));
        let sources = &self.admin_sources;
        let n = sources.len() * self.knobs.admin_connections;
        let opened = format!("{what} opened");
        swarm(n, until, |i| {
            let (tally, source, pause) = (tally.clone(), sources[i % sources.len()], self.pause());
            let (head, opened) = (head.clone(), opened.clone());
            async move {
                loop {
                    match connect_from(source, to).await {
                        Ok(mut conn) => {
                            tally.add(&opened);
                            // A refused connection may be closed before the write lands.
                            let _ = conn.write_all(&head).await;
                            tally.add(first_answer(&mut conn).await);
                        }
                        Err(_) => tally.add("connect failed"),
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        })
        .await;
    }

    /// Row 4: long `slow` calls whose answers are dropped once their headers arrived.
    async fn walked_away(&self, tally: &Tally, until: Instant) -> Outcome<()> {
        let sessions = Arc::new(self.open_sessions(self.knobs.flood_sessions).await?);
        tally.sessions.lock().extend(sessions.iter().cloned());
        let next = Arc::new(AtomicU64::new(0));
        let arguments =
            json!({"count": self.knobs.walk_count, "interval_ms": self.knobs.walk_interval_ms});
        swarm(self.knobs.flood_tasks, until, |_| {
            let (sessions, next, tally) = (Arc::clone(&sessions), Arc::clone(&next), tally.clone());
            let (client, pause, row) = (self.client.clone(), self.pause(), self.row);
            let mut arguments = arguments.clone();
            async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let session = &sessions[n as usize % sessions.len()];
                    arguments["call_id"] = json!(format!("walk-{row}-{n}"));
                    let call = tool_call(n, "slow", arguments.clone(), Some("w"));
                    match client.post(Some(session), &call, &[]).await {
                        Ok(resp) if resp.status() == StatusCode::OK => {
                            tally.add("calls started, walked away");
                        }
                        other => back_off(&tally, other, pause).await,
                    }
                }
            }
        })
        .await;
        Ok(())
    }

    /// Row 5: `initialize` in a loop.
    async fn sessions(&self, tally: &Tally, until: Instant) {
        swarm(self.knobs.flood_tasks, until, |_| {
            let (client, tally, pause) = (self.client.clone(), tally.clone(), self.pause());
            async move {
                loop {
                    match client.post(None, &initialize_body(1, VERSION), &[]).await {
                        Ok(resp) if resp.status() == StatusCode::OK => {
                            if let Some(id) = header_str(&resp, "mcp-session-id") {
                                tally.sessions.lock().push(Session {
                                    id,
                                    version: VERSION.into(),
                                });
                            }
                            let _ = body_text(resp).await;
                            tally.add("sessions opened");
                        }
                        other => back_off(&tally, other, pause).await,
                    }
                }
            }
        })
        .await;
    }

    /// Row 7: tasks created and never polled.
    async fn unpolled_tasks(&self, tally: &Tally, until: Instant) {
        let next = Arc::new(AtomicU64::new(0));
        swarm(self.knobs.flood_tasks, until, |_| {
            let (client, tally, next) = (self.client.clone(), tally.clone(), Arc::clone(&next));
            let (url, pause, row, ms) = (
                self.mcp_url.clone(),
                self.pause(),
                self.row,
                self.knobs.task_ms,
            );
            async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let params = json!({"name": "job",
                        "arguments": {"ms": ms, "call_id": format!("task-{row}-{n}")}});
                    let sent = tether_tests::modern::request(
                        &client,
                        &url,
                        n,
                        "tools/call",
                        Some("job"),
                        params,
                    )
                    .await;
                    match sent {
                        Ok((StatusCode::OK, answer))
                            if answer["result"]["resultType"] == "task" =>
                        {
                            tally.add("tasks created, never polled");
                        }
                        Ok((status, answer)) => {
                            let reason = answer
                                .pointer("/error/data/reason")
                                .or_else(|| answer.pointer("/error/message"))
                                .and_then(Value::as_str)
                                .unwrap_or("");
                            tally.add(format!("{} {reason}", status.as_u16()).trim_end());
                            tokio::time::sleep(pause).await;
                        }
                        Err(_) => {
                            tally.add("failed");
                            tokio::time::sleep(pause).await;
                        }
                    }
                }
            }
        })
        .await;
    }
}

/// A POST of `body` in `session` to `to`'s MCP path, as bytes on the wire.
fn raw_post(to: SocketAddr, session: &Session, authorization: &str, body: &str) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nhost: {to}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-session-id: {}\r\n\
         mcp-protocol-version: {}\r\nauthorization: {authorization}\r\n\
         content-length: {}\r\n\r\n{body}",
        session.id,
        session.version,
        body.len()
    )
}

/// One row's figures.
struct Row {
    flood: Flood,
    attacker: String,
    echo: Served,
    probe: Served,
    /// The sidecar's, the MCP server's and this process's CPU during the flood, in % of one
    /// core.
    cpu: [f64; 3],
    rss_before: u64,
    rss_peak: u64,
    rss_after: u64,
    settled: Duration,
}

/// Starts the floods' pod and runs the rows: the table.
pub(crate) async fn table(knobs: &Knobs) -> Outcome<String> {
    let issuer = Issuer::new().map_err(|e| e.to_string())?;
    let pod = Pod::start(PodSpec {
        server_args: issuer.server_args(),
        sidecar_args: knobs.sidecar_args.clone(),
        ..PodSpec::default()
    })
    .await
    .map_err(|e| format!("cannot start the pod: {e}"))?;
    match rows(&pod, &issuer, knobs).await {
        Ok(rows) => Ok(render(knobs, &rows)),
        Err(e) => Err(format!("{e}\n{}", pod.logs())),
    }
}

async fn rows(pod: &Pod, issuer: &Issuer, knobs: &Knobs) -> Outcome<Vec<Row>> {
    let victim_source = addr::next_ip();
    let client = principal(pod, issuer, "victim", victim_source);
    let session = client
        .initialize(VERSION)
        .await
        .map_err(|e| format!("the victim's initialize: {e}"))?;
    let victim = Victim {
        client,
        session,
        source: victim_source,
        probe_source: addr::next_ip(),
        readyz_url: format!("{}/readyz", pod.admin_url),
    };
    let mut rows = Vec::new();
    for (n, flood) in FLOODS.into_iter().enumerate() {
        if knobs.flood_rows.contains(&n) {
            eprintln!("tether-bench-hostile: floods: row {}", flood.name());
            rows.push(row(pod, issuer, knobs, &victim, n, flood).await?);
        }
    }
    Ok(rows)
}

/// A client of `pod` from `source` with a bearer token of principal `sub`.
fn principal(pod: &Pod, issuer: &Issuer, sub: &str, source: Ipv4Addr) -> McpClient {
    let client = pod.client();
    client.set_authorization(Some(issuer.bearer(ISS, sub, HOUR)));
    client.from_source(source.into())
}

/// Row `n`: `flood` for `--flood-seconds` while `victim` calls, then the pod settles.
async fn row(
    pod: &Pod,
    issuer: &Issuer,
    knobs: &Knobs,
    victim: &Victim,
    n: usize,
    flood: Flood,
) -> Outcome<Row> {
    let pid = pod.sidecar_pid().ok_or("the sidecar exited")?;
    let sub = format!("attacker-{n}");
    let source = addr::next_ip();
    let attacker = Attacker {
        row: n,
        pod_ip: pod.ip,
        mcp_url: pod.mcp_url.clone(),
        client: principal(pod, issuer, &sub, source),
        authorization: issuer.bearer(ISS, &sub, HOUR),
        source,
        admin_sources: (0..knobs.admin_sources).map(|_| addr::next_ip()).collect(),
        knobs,
    };
    let text = pod.metrics().await.map_err(|e| e.to_string())?;
    let (counters, before) = (Counters::read(&text), watch::gauges(&text));
    let rss_before = watch::rss(pid)?;
    let rss = RssPeak::start(pid);
    let cpu = watch::Cpu::read(pod)?;
    let started = Instant::now();
    let until = started + Duration::from_secs(knobs.flood_seconds);
    let victim_run = victim.spawn(until, (n as u64 + 1) * 10_000_000);
    let (flood_run, peaks) = tokio::join!(
        flood.run(&attacker, until),
        watch::peaks(pod, before, until)
    );
    // Read while the victim's thread runs: a thread that ended is not counted.
    let cpu = watch::Cpu::read(pod)?.share_since(&cpu, started.elapsed());
    let measured = tokio::task::spawn_blocking(move || victim_run.join())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|_| "the victim's thread panicked".to_owned())?;
    let tally = flood_run?;
    let (echo, probe) = measured?;
    // Everything the attacker opened goes: its sessions, then its connections.
    let settling = Instant::now();
    let sessions = std::mem::take(&mut *tally.sessions.lock());
    let (deletes, failed) = delete_all(&attacker.client, sessions).await;
    drop(attacker);
    let mut notes = watch::settle(pod, &before).await?;
    if failed > 0 {
        notes.push(format!("{failed} of {deletes} session DELETEs failed"));
    }
    let settled = settling.elapsed();
    tokio::time::sleep(Duration::from_secs(knobs.settle_seconds)).await;
    let rss_peak = rss.finish();
    let rss_after = watch::rss(pid)?;
    let after = pod.metrics().await.map_err(|e| e.to_string())?;
    let mut did = tally.summary();
    let mut sidecar = Counters::read(&after).grown_since(&counters);
    sidecar.extend(watch::risen(&before, &peaks));
    if !sidecar.is_empty() {
        did.push(format!("sidecar: {}", sidecar.join(", ")));
    }
    did.extend(notes.into_iter().map(|n| format!("not settled: {n}")));
    Ok(Row {
        flood,
        attacker: if did.is_empty() {
            "-".into()
        } else {
            did.join("; ")
        },
        echo,
        probe,
        cpu,
        rss_before,
        rss_peak,
        rss_after,
        settled,
    })
}

/// Deletes `sessions` (16 at a time): how many, and how many failed.
async fn delete_all(client: &McpClient, sessions: Vec<Session>) -> (usize, usize) {
    let n = sessions.len();
    let failed = futures::stream::iter(sessions)
        .map(|s| {
            let client = client.clone();
            async move {
                client
                    .delete(&s)
                    .await
                    .map(|st| st.is_success())
                    .unwrap_or(false)
            }
        })
        .buffer_unordered(16)
        .filter(|ok| std::future::ready(!ok))
        .count()
        .await;
    (n, failed)
}

fn render(knobs: &Knobs, rows: &[Row]) -> String {
    let mut out = format!(
        "floods on loopback: one pod whose MCP server requires bearer JWTs; a victim (a principal \
         and a source address of its own) calls `echo` in its session, one call after another, \
         for the {} s of each flood, a prober (an address of its own) GETs /readyz every 200 ms; \
         each flood comes from a principal and addresses of its own, then is stopped, its \
         sessions deleted and the pod let settle (calls in flight back to 0, connections back \
         to before — \"settled in\" —, then {} s of quiet). RSS: the sidecar's VmRSS \
         before the flood, its peak (every 50 ms, flood and settling) and after settling; CPU of \
         the sidecar, the MCP server and this bench (attacker, victim) during the flood, in % of \
         one core: the machine's cores are shared by all.\n\n\
         | flood | what the attacker did; sidecar: what it counted, gauge peaks during the flood | echo calls | \
         p50 | p99 | max | errors | /readyz p99 (errors) | CPU sidecar / server / bench | RSS before | \
         RSS peak | RSS after | settled in |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        knobs.flood_seconds, knobs.settle_seconds
    );
    let mut failures = Vec::new();
    for row in rows {
        let mib = |b: u64| watch::mib(b as f64);
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} ({}) | {:.0} / {:.0} / {:.0} % | {} | {} | {} | {:.1} s |\n",
            row.flood.name(),
            row.attacker,
            watch::count(row.echo.samples.len() as f64),
            watch::ms(&row.echo.samples, 0.5),
            watch::ms(&row.echo.samples, 0.99),
            watch::ms(&row.echo.samples, 1.0),
            row.echo.errors,
            watch::ms(&row.probe.samples, 0.99),
            row.probe.errors,
            row.cpu[0],
            row.cpu[1],
            row.cpu[2],
            mib(row.rss_before),
            mib(row.rss_peak),
            mib(row.rss_after),
            row.settled.as_secs_f64(),
        ));
        for (who, served) in [("victim", &row.echo), ("/readyz probe", &row.probe)] {
            if let Some(e) = &served.first_error {
                failures.push(format!(
                    "- {}: the {who}'s first error: {e}",
                    row.flood.name()
                ));
            }
        }
    }
    if !failures.is_empty() {
        out.push('\n');
        out.push_str(&failures.join("\n"));
        out.push('\n');
    }
    out
}

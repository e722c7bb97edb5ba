//! `tether-bench-proxy` (`make bench-proxy`): what tether costs per request and per event,
//! side by side with nginx in the same "sidecar shape" (one origin behind one proxy), in one
//! run (`docs/dev/testing.md#proxy-cost`).
//!
//! Six targets, each an origin (`tether-bench-origin`) behind something:
//!
//! | target | in front of its origin |
//! |---|---|
//! | direct | nothing: the client talks to the origin |
//! | nginx | nginx, one worker, `hash $http_mcp_session_id consistent`, keep-alive upstream, `proxy_buffering off` |
//! | tether None, tether Sessions, tether Events | `tether-sidecar`, as a pod of the tests runs it, with `spec.session.replication` of that name; two pods, the clients asking the first (which holds their sessions) and the second keeping their replicas. Both pods' processes count |
//! | tether Sessions, no write-ahead | the same with `Sessions` and `spec.session.writeAhead: false`: a request does not wait for its replica pod to keep its record |
//!
//! Every server process (origin, proxy) is pinned to `--server-core`, the load client (this
//! process, one thread) to `--client-core`. The server side's CPU time is read from
//! `/proc/<pid>/task/*/schedstat` before and after each measure. Measures, each run on every
//! target in turn, in an order rotated every round:
//!
//! - **JSON**: `--users` closed-loop clients (1, then 32), each in its own session, calling
//!   `echo` for `--seconds`; every answer is checked. Requests per second; server CPU per request.
//! - **SSE burst**: `--burst-streams` `stream` calls of `--burst-events` events each, without
//!   pause. Events per second; server CPU per event.
//! - **SSE paced**: `--paced-streams` calls of `--paced-rate` events a second for `--seconds`.
//!   Lag of each event: the client's `CLOCK_MONOTONIC` when it read the event minus the origin's
//!   when it wrote it (the event's `t`), p50 and p99.
//!
//! Every event's `seq` is checked: an event missing, seen twice or out of order is counted (the
//! last row; it must read 0 everywhere). The table gives the median over `--rounds` of each
//! figure, and the median of the per-round ratios tether / nginx and tether / direct (tether
//! with its default replication, `Sessions`), Sessions / None, Events / None and Sessions without
//! write-ahead / None (what a replica costs, and how much of it the write-ahead takes).
//!
//! Without nginx on the `PATH` the nginx column is skipped, with the line that installs it.
//!
//! A second table, tether alone, times what nginx has no counterpart for (`continuity.rs`):
//! `--resumes` concurrent resumes (GET + `Last-Event-ID` → first replayed byte, p50 / p99) and
//! the handoff of each of `--handoff-sessions` sessions, with their buffers, from a draining
//! pod to its peer (the drain's time).

mod continuity;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http::{Method, StatusCode};
use http_body_util::BodyExt as _;
use tether_tests::client::{ACCEPT_BOTH, Http, body_text, header_str, initialize_body};
use tether_tests::cluster::Cluster;
use tether_tests::pod::{PodSpec, Upstream};
use tokio::process::{Child, Command};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "tether-bench-proxy",
    about = "CPU per request and per event of tether beside nginx and a direct origin"
)]
struct Args {
    /// Rounds; each measures every target once.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Length of a JSON measure and of a paced SSE measure, in seconds.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Concurrent closed-loop JSON users of the second JSON measure (the first has 1).
    #[arg(long, default_value_t = 32)]
    users: usize,
    /// Streams of the SSE burst.
    #[arg(long, default_value_t = 16)]
    burst_streams: usize,
    /// Events of each burst stream.
    #[arg(long, default_value_t = 20_000)]
    burst_events: u64,
    /// Streams of the paced SSE measure.
    #[arg(long, default_value_t = 200)]
    paced_streams: usize,
    /// Events per second of each paced stream.
    #[arg(long, default_value_t = 50)]
    paced_rate: u64,
    /// The core of every server process (origins, nginx, the sidecars).
    #[arg(long, default_value_t = 0)]
    server_core: usize,
    /// The core of the load client (this process).
    #[arg(long, default_value_t = 1)]
    client_core: usize,
    /// The nginx binary.
    #[arg(long, default_value = "nginx")]
    nginx: String,
    /// Sessions resumed at once in the resume measure (one GET + `Last-Event-ID` each).
    #[arg(long, default_value_t = 1000)]
    resumes: usize,
    /// Sessions handed off by a draining pod, one handoff measure per number (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    handoff_sessions: Vec<usize>,
    /// A smoke run: one round, short measures, few streams.
    #[arg(long)]
    quick: bool,
}

impl Args {
    fn resolved(mut self) -> Self {
        if self.quick {
            self.rounds = 1;
            self.seconds = 0.5;
            self.users = self.users.min(4);
            self.burst_streams = self.burst_streams.min(2);
            self.burst_events = self.burst_events.min(500);
            self.paced_streams = self.paced_streams.min(10);
            self.resumes = self.resumes.min(20);
            self.handoff_sessions = vec![50];
        }
        self
    }
}

/// The tether targets: each two pods (the clients' sessions held by the first, their replicas
/// kept by the second), named after `spec.session.replication` and `writeAhead`. Both pods'
/// processes count.
const TETHER: [(&str, &str, bool); 4] = [
    ("tether None", "None", true),
    ("tether Sessions", "Sessions", true),
    ("tether Events", "Events", true),
    ("tether Sessions, no write-ahead", "Sessions", false),
];
/// The tether target the comparisons with nginx and the origin use: the default replication.
const TETHER_DEFAULT: &str = "tether Sessions";

/// Port of the proxies (nginx) and of the origins.
const PROXY_PORT: u16 = 8080;
const ORIGIN_PORT: u16 = 3000;
/// How long a server may take to answer its first request.
const START_TIMEOUT: Duration = Duration::from_secs(20);

fn main() -> ExitCode {
    let args = Args::parse().resolved();
    pin(std::process::id(), args.client_core);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("tether-bench-proxy: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(clean) if clean => ExitCode::SUCCESS,
        Ok(_) => {
            println!("result: FAILED: events were lost, duplicated or reordered, or answers wrong");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("tether-bench-proxy: {e}");
            ExitCode::from(2)
        }
    }
}

type Outcome<T> = Result<T, String>;

async fn run(args: &Args) -> Outcome<bool> {
    let mut targets = vec![Target::direct(args).await?];
    match Target::nginx(args).await {
        Ok(t) => targets.push(t),
        Err(e) => println!("nginx: skipped ({e})"),
    }
    for (name, replication, write_ahead) in TETHER {
        targets.push(Target::tether(args, name, replication, write_ahead).await?);
    }
    println!(
        "tether-bench-proxy: {} rounds; servers on core {}, client on core {}; JSON {} s at 1 and \
         {} users; SSE burst {} × {} events; SSE paced {} streams × {} ev/s for {} s",
        args.rounds,
        args.server_core,
        args.client_core,
        args.seconds,
        args.users,
        args.burst_streams,
        args.burst_events,
        args.paced_streams,
        args.paced_rate,
        args.seconds
    );
    let http = Http::new();
    let mut results: HashMap<(&'static str, Measure), Vec<Figures>> = HashMap::new();
    for round in 0..args.rounds {
        for measure in Measure::ALL {
            for i in 0..targets.len() {
                let target = &targets[(i + round) % targets.len()];
                let figures = measure.run(&http, target, args).await?;
                eprintln!(
                    "round {} {:<10} {:<7} {}",
                    round + 1,
                    measure.name(),
                    target.name,
                    figures.describe()
                );
                results
                    .entry((target.name, measure))
                    .or_default()
                    .push(figures);
            }
        }
    }
    let names: Vec<&'static str> = targets.iter().map(|t| t.name).collect();
    println!("\n{}", report(&names, &results, args));
    drop(targets);
    let clean = results.values().flatten().all(|f| f.errors == 0);
    Ok(continuity(args).await? && clean)
}

/// Runs and prints the resume and handoff measures (`continuity.rs`); whether every resume
/// replayed what it should and every session handed off answered.
async fn continuity(args: &Args) -> Outcome<bool> {
    let resumes = continuity::resumes(args.resumes, args.server_core).await?;
    let (p50, p99) = (
        tether_tests::load::quantile(&resumes.latencies, 0.5).unwrap_or_default(),
        tether_tests::load::quantile(&resumes.latencies, 0.99).unwrap_or_default(),
    );
    eprintln!(
        "resume     {} of {} at once, first byte p50 {p50:?} p99 {p99:?}, {} errors",
        resumes.latencies.len(),
        args.resumes,
        resumes.errors
    );
    let mut rows = vec![(
        format!(
            "resume, {} at once: GET + Last-Event-ID → first replayed byte p50 / p99 (ms)",
            args.resumes
        ),
        vec![format!("{:.1} / {:.1}", ms(p50), ms(p99))],
    )];
    rows.push((
        "resume: sidecar CPU per resume (µs)".into(),
        vec![format!("{:.0}", resumes.cpu_per_resume.as_secs_f64() * 1e6)],
    ));
    let mut errors = resumes.errors;
    for &sessions in &args.handoff_sessions {
        let h = continuity::handoff(sessions, (args.server_core, args.client_core)).await?;
        eprintln!(
            "handoff    {} sessions, {} held by the draining pod, {} handed off in {:?}, {} not answering after",
            h.sessions, h.held, h.moved, h.took, h.errors
        );
        // Every session created must be handed off (a pod that is not draining places every new
        // session on itself) and answer through the peer afterwards.
        let created = h.sessions as u64;
        if h.moved != created {
            eprintln!(
                "tether-bench-proxy: the drain handed off {} of {} sessions ({} held)",
                h.moved, h.sessions, h.held
            );
        }
        // A session not handed off cannot answer through the peer either: counted once.
        errors += created.abs_diff(h.moved).max(h.errors);
        rows.push((
            format!(
                "handoff of {sessions} sessions with buffers ({} held, {} handed off): drain time (ms)",
                h.held, h.moved
            ),
            vec![format!("{:.0}", ms(h.took))],
        ));
    }
    rows.push((
        "resumes replaying wrong events, sessions lost in a handoff".into(),
        vec![errors.to_string()],
    ));
    let rows: Vec<(&str, Vec<String>)> =
        rows.iter().map(|(l, c)| (l.as_str(), c.clone())).collect();
    println!(
        "\n{}",
        tether_tests::table::render(&["resume and handoff", "tether"], &rows)
    );
    Ok(errors == 0)
}

/// `d` in milliseconds.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One server side: its MCP URL and the processes whose CPU is counted.
struct Target {
    name: &'static str,
    url: String,
    pids: Vec<u32>,
    /// Keeps the processes (killed on drop) and the pod.
    _children: Vec<Child>,
    _cluster: Option<Cluster>,
    _dir: Option<tempfile::TempDir>,
}

impl Target {
    async fn direct(args: &Args) -> Outcome<Self> {
        let ip = tether_tests::addr::next_ip();
        let origin = origin(ip, args.server_core)?;
        let url = format!("http://{ip}:{ORIGIN_PORT}/mcp");
        let pid = child_pid(&origin)?;
        wait_up(&format!("http://{ip}:{ORIGIN_PORT}/healthz")).await?;
        Ok(Self {
            name: "direct",
            url,
            pids: vec![pid],
            _children: vec![origin],
            _cluster: None,
            _dir: None,
        })
    }

    async fn nginx(args: &Args) -> Outcome<Self> {
        let found = std::process::Command::new(&args.nginx)
            .arg("-v")
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Err(format!(
                "`{}` not found; install it with `apt-get install -y nginx-light` (or run `make \
                 bench-proxy` as root)",
                args.nginx
            ));
        }
        let ip = tether_tests::addr::next_ip();
        let origin = origin(ip, args.server_core)?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let conf = dir.path().join("nginx.conf");
        std::fs::write(&conf, nginx_conf(dir.path(), ip)).map_err(|e| e.to_string())?;
        let nginx = spawn_server(
            Command::new(&args.nginx)
                .arg("-p")
                .arg(dir.path())
                .arg("-e")
                .arg(dir.path().join("error.log"))
                .arg("-c")
                .arg(&conf),
            "nginx",
        )?;
        let pids = vec![child_pid(&origin)?, child_pid(&nginx)?];
        pin(pids[1], args.server_core);
        wait_up(&format!("http://{ip}:{PROXY_PORT}/healthz")).await?;
        Ok(Self {
            name: "nginx",
            url: format!("http://{ip}:{PROXY_PORT}/mcp"),
            pids,
            _children: vec![origin, nginx],
            _cluster: None,
            _dir: Some(dir),
        })
    }

    /// Two tether pods with `spec.session.replication: replication` and `writeAhead:
    /// write_ahead`; the clients ask the first, which holds their sessions (a new session is
    /// held where it was initialized).
    async fn tether(
        args: &Args,
        name: &'static str,
        replication: &str,
        write_ahead: bool,
    ) -> Outcome<Self> {
        let spec = PodSpec {
            server: Upstream::Origin,
            replication: Some(replication.to_owned()),
            write_ahead: Some(write_ahead),
            ..PodSpec::default()
        };
        let ips: Vec<Ipv4Addr> = (0..2).map(|_| tether_tests::addr::next_ip()).collect();
        let cluster = Cluster::start(&ips, spec)
            .await
            .map_err(|e| format!("the tether pods: {e}"))?;
        let pids = cluster
            .pods
            .iter()
            .flat_map(|pod| [pod.sidecar_pid(), pod.server_pid()])
            .map(|p| p.ok_or("a tether pod's processes exited"))
            .collect::<Result<Vec<_>, _>>()?;
        for &pid in &pids {
            pin(pid, args.server_core);
        }
        Ok(Self {
            name,
            url: cluster.pods[0].mcp_url.clone(),
            pids,
            _children: Vec::new(),
            _cluster: Some(cluster),
            _dir: None,
        })
    }

    /// CPU time of every server process so far.
    fn cpu(&self) -> Outcome<Duration> {
        self.pids.iter().try_fold(Duration::ZERO, |sum, &pid| {
            tether_tests::pod::process_cpu(pid)
                .map(|cpu| sum + cpu)
                .map_err(|e| e.to_string())
        })
    }
}

/// The nginx configuration: one process, the sidecar's job done the nginx way.
fn nginx_conf(dir: &std::path::Path, ip: Ipv4Addr) -> String {
    let d = dir.display();
    format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log warn;\nevents {{ worker_connections 8192; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         \x20 fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         \x20 upstream mcp {{ hash $http_mcp_session_id consistent; server {ip}:{ORIGIN_PORT}; keepalive 256; }}\n\
         \x20 server {{\n    listen {ip}:{PROXY_PORT};\n    location / {{\n      proxy_pass http://mcp;\n\
         \x20     proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n\
         \x20     proxy_buffering off;\n      proxy_request_buffering off;\n\
         \x20     proxy_read_timeout 1h;\n    }}\n  }}\n}}\n"
    )
}

/// Starts an origin on `ip`, pinned to `core`.
fn origin(ip: Ipv4Addr, core: usize) -> Outcome<Child> {
    let bin = tether_tests::bins::path("tether-bench-origin").map_err(|e| e.to_string())?;
    let child = spawn_server(
        Command::new(bin)
            .arg("--listen")
            .arg(SocketAddr::from((ip, ORIGIN_PORT)).to_string()),
        "the origin",
    )?;
    pin(child_pid(&child)?, core);
    Ok(child)
}

/// Starts the server `command` (`what`, for errors): no input, its output dropped, its errors on
/// ours, killed when dropped.
fn spawn_server(command: &mut Command, what: &str) -> Outcome<Child> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{what}: {e}"))
}

fn child_pid(child: &Child) -> Outcome<u32> {
    child
        .id()
        .ok_or_else(|| "a server exited at start".to_owned())
}

/// Pins every thread of process `pid` to `core` (threads it starts later inherit it); says so
/// when it cannot (a machine with fewer cores), and the run goes on unpinned.
fn pin(pid: u32, core: usize) {
    if let Err(e) = try_pin(pid, core) {
        eprintln!(
            "tether-bench-proxy: process {pid} not pinned to core {core} ({e}): figures vary more"
        );
    }
}

fn try_pin(pid: u32, core: usize) -> Outcome<()> {
    use nix::sched::{CpuSet, sched_setaffinity};
    let mut set = CpuSet::new();
    set.set(core).map_err(|e| e.to_string())?;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| e.to_string())?;
    for task in tasks {
        let tid = task
            .map_err(|e| e.to_string())?
            .file_name()
            .to_string_lossy()
            .parse::<i32>()
            .map_err(|e| e.to_string())?;
        sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set)
            .map_err(|e| format!("core {core}: {e}"))?;
    }
    Ok(())
}

/// Waits until `url` answers 200.
async fn wait_up(url: &str) -> Outcome<()> {
    let http = Http::new();
    let deadline = Instant::now() + START_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok((StatusCode::OK, _)) = http.get_text(url).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("{url} did not answer within {START_TIMEOUT:?}"))
}

/// What one measure is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Measure {
    /// `echo`, a tool its server does not declare harmless to call again (the write-ahead).
    JsonOne,
    JsonMany,
    /// `lookup`, which its server declares read-only.
    ReadOne,
    ReadMany,
    Burst,
    Paced,
}

impl Measure {
    const ALL: [Self; 6] = [
        Self::JsonOne,
        Self::JsonMany,
        Self::ReadOne,
        Self::ReadMany,
        Self::Burst,
        Self::Paced,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::JsonOne => "json-1",
            Self::JsonMany => "json-many",
            Self::ReadOne => "read-1",
            Self::ReadMany => "read-many",
            Self::Burst => "sse-burst",
            Self::Paced => "sse-paced",
        }
    }

    async fn run(self, http: &Http, target: &Target, args: &Args) -> Outcome<Figures> {
        let seconds = Duration::from_secs_f64(args.seconds);
        match self {
            Self::JsonOne => json(http, target, "echo", 1, seconds).await,
            Self::JsonMany => json(http, target, "echo", args.users, seconds).await,
            Self::ReadOne => json(http, target, "lookup", 1, seconds).await,
            Self::ReadMany => json(http, target, "lookup", args.users, seconds).await,
            Self::Burst => {
                let plan = StreamPlan {
                    streams: args.burst_streams,
                    events: args.burst_events,
                    interval_us: 0,
                };
                sse(http, target, plan).await
            }
            Self::Paced => {
                let plan = StreamPlan {
                    streams: args.paced_streams,
                    events: (args.paced_rate as f64 * args.seconds).ceil() as u64,
                    interval_us: 1_000_000 / args.paced_rate.max(1),
                };
                sse(http, target, plan).await
            }
        }
    }
}

/// What one measure of one target gave.
#[derive(Clone, Debug, Default)]
struct Figures {
    /// Requests answered (JSON) or events received (SSE).
    done: u64,
    elapsed: Duration,
    cpu: Duration,
    /// Event lags, in µs (paced SSE).
    lags_us: Vec<u64>,
    /// Wrong answers, lost, duplicated or reordered events.
    errors: u64,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.done as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn cpu_per_unit_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.done.max(1) as f64
    }

    fn lag_us(&self, q: f64) -> f64 {
        let mut lags = self.lags_us.clone();
        lags.sort_unstable();
        match lags.len() {
            0 => f64::NAN,
            n => lags[((n as f64 - 1.0) * q).round() as usize] as f64,
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} in {:.2} s ({:.0}/s), CPU {:.2} µs each{}{}",
            self.done,
            self.elapsed.as_secs_f64(),
            self.rate(),
            self.cpu_per_unit_us(),
            if self.lags_us.is_empty() {
                String::new()
            } else {
                format!(
                    ", lag p50 {:.0} µs p99 {:.0} µs",
                    self.lag_us(0.5),
                    self.lag_us(0.99)
                )
            },
            if self.errors > 0 {
                format!(", {} ERRORS", self.errors)
            } else {
                String::new()
            }
        )
    }
}

/// A session of a target: its id.
async fn session(http: &Http, url: &str) -> Outcome<String> {
    let body = Bytes::from(initialize_body(1, "2025-11-25").to_string());
    let headers = [
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
    ];
    let resp = http
        .send(Method::POST, url, &headers, Some(body))
        .await
        .map_err(|e| e.to_string())?;
    let id = header_str(&resp, "mcp-session-id").ok_or_else(|| {
        format!(
            "{url}: initialize answered {} without a session",
            resp.status()
        )
    })?;
    body_text(resp).await.map_err(|e| e.to_string())?;
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    in_session(http, url, &id, initialized).await?;
    // As SDK clients do: the tools first (the sidecar learns which are read-only).
    let tools = in_session(
        http,
        url,
        &id,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    )
    .await?;
    if !tools.contains("\"lookup\"") {
        return Err(format!("{url}: tools/list answered {tools}"));
    }
    Ok(id)
}

/// POSTs `message` in session `id`: the answer's body.
async fn in_session(http: &Http, url: &str, id: &str, message: &'static str) -> Outcome<String> {
    let resp = http
        .send(
            Method::POST,
            url,
            &session_headers(id),
            Some(Bytes::from_static(message.as_bytes())),
        )
        .await
        .map_err(|e| e.to_string())?;
    body_text(resp).await.map_err(|e| e.to_string())
}

fn session_headers(id: &str) -> [(&str, &str); 4] {
    [
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
        ("mcp-session-id", id),
        ("mcp-protocol-version", "2025-11-25"),
    ]
}

/// `users` closed-loop clients calling `tool` (`echo` or `lookup`) for `seconds`.
async fn json(
    http: &Http,
    target: &Target,
    tool: &'static str,
    users: usize,
    seconds: Duration,
) -> Outcome<Figures> {
    let mut sessions = Vec::with_capacity(users);
    for _ in 0..users {
        sessions.push(session(http, &target.url).await?);
    }
    let cpu = target.cpu()?;
    let started = Instant::now();
    let deadline = started + seconds;
    let loops = sessions.into_iter().map(|id| {
        let (http, url) = (http.clone(), target.url.clone());
        async move {
            let (mut done, mut errors, mut n) = (0u64, 0u64, 2u64);
            while Instant::now() < deadline {
                n += 1;
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"{tool}","arguments":{{"text":"hello {n}"}}}}}}"#
                );
                let answer = match http
                    .send(Method::POST, &url, &session_headers(&id), Some(Bytes::from(body)))
                    .await
                {
                    Ok(resp) if resp.status() == StatusCode::OK => {
                        body_text(resp).await.unwrap_or_default()
                    }
                    _ => String::new(),
                };
                if answer.contains(&format!("hello {n}\"")) {
                    done += 1;
                } else {
                    errors += 1;
                }
            }
            (done, errors)
        }
    });
    let counts = futures::future::join_all(loops).await;
    let elapsed = started.elapsed();
    let cpu = target.cpu()?.saturating_sub(cpu);
    Ok(Figures {
        done: counts.iter().map(|c| c.0).sum(),
        elapsed,
        cpu,
        lags_us: Vec::new(),
        errors: counts.iter().map(|c| c.1).sum(),
    })
}

/// SSE streams of one measure.
#[derive(Clone, Copy, Debug)]
struct StreamPlan {
    streams: usize,
    events: u64,
    interval_us: u64,
}

/// `plan.streams` concurrent `stream` calls read to their ends, every event checked.
async fn sse(http: &Http, target: &Target, plan: StreamPlan) -> Outcome<Figures> {
    let mut sessions = Vec::with_capacity(plan.streams);
    for _ in 0..plan.streams {
        sessions.push(session(http, &target.url).await?);
    }
    let paced = plan.interval_us > 0;
    let cpu = target.cpu()?;
    let started = Instant::now();
    let calls = sessions.into_iter().enumerate().map(|(i, id)| {
        let (http, url) = (http.clone(), target.url.clone());
        async move { read_stream(&http, &url, &id, i as u64, plan, paced).await }
    });
    let results = futures::future::join_all(calls).await;
    let elapsed = started.elapsed();
    let cpu = target.cpu()?.saturating_sub(cpu);
    let mut figures = Figures {
        elapsed,
        cpu,
        ..Figures::default()
    };
    for r in results {
        let r = r?;
        figures.done += r.events;
        figures.errors += r.errors;
        figures.lags_us.extend(r.lags_us);
    }
    Ok(figures)
}

/// What one stream's reader saw.
#[derive(Debug, Default)]
struct StreamRead {
    events: u64,
    errors: u64,
    lags_us: Vec<u64>,
}

async fn read_stream(
    http: &Http,
    url: &str,
    id: &str,
    n: u64,
    plan: StreamPlan,
    paced: bool,
) -> Outcome<StreamRead> {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"stream","arguments":{{"count":{},"interval_us":{}}}}}}}"#,
        plan.events, plan.interval_us
    );
    let resp = http
        .send(
            Method::POST,
            url,
            &session_headers(id),
            Some(Bytes::from(body)),
        )
        .await
        .map_err(|e| e.to_string())?;
    if resp.status() != StatusCode::OK {
        return Err(format!("{url}: stream answered {}", resp.status()));
    }
    let mut read = StreamRead::default();
    let mut body = resp.into_body();
    let mut pending: Vec<u8> = Vec::new();
    let mut next = 1u64;
    let mut result = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("{url}: stream broke: {e}"))?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        let now = paced.then(tether_tests::clock::monotonic_ns);
        pending.extend_from_slice(data);
        let mut start = 0;
        while let Some(end) = find(&pending[start..], b"\n\n") {
            let event = &pending[start..start + end];
            start += end + 2;
            if let Some(seq) = number_after(event, b"\"seq\":") {
                read.events += 1;
                if seq != next {
                    read.errors += 1;
                }
                next = seq + 1;
                if let (Some(now), Some(t)) = (now, number_after(event, b"\"t\":")) {
                    read.lags_us.push(now.saturating_sub(t) / 1_000);
                }
            } else if find(event, b"\"result\"").is_some() {
                result = true;
            }
        }
        pending.drain(..start);
    }
    if next != plan.events + 1 || !result {
        read.errors += (plan.events + 1).abs_diff(next) + u64::from(!result);
    }
    Ok(read)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The unsigned number right after `key` in `text`.
fn number_after(text: &[u8], key: &[u8]) -> Option<u64> {
    let rest = &text[find(text, key)? + key.len()..];
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

/// The table: medians over the rounds, and the medians of the per-round ratios.
fn report(
    names: &[&'static str],
    results: &HashMap<(&'static str, Measure), Vec<Figures>>,
    args: &Args,
) -> String {
    let figures = |name, measure| results.get(&(name, measure)).cloned().unwrap_or_default();
    let mut header = vec!["measure"];
    header.extend(names.iter().copied());
    // (numerator, denominator, header): tether (its default replication) against nginx and
    // the origin, and each replication against none.
    let ratio_columns: Vec<(&str, &str, &str)> = [
        (TETHER_DEFAULT, "nginx", "tether / nginx"),
        (TETHER_DEFAULT, "direct", "tether / direct"),
        ("tether Sessions", "tether None", "Sessions / None"),
        ("tether Events", "tether None", "Events / None"),
        (
            "tether Sessions, no write-ahead",
            "tether None",
            "Sessions without write-ahead / None",
        ),
    ]
    .into_iter()
    .filter(|(n, d, _)| names.contains(n) && names.contains(d))
    .collect();
    header.extend(ratio_columns.iter().map(|(_, _, h)| *h));
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |label: String, measure: Measure, value: &dyn Fn(&Figures) -> f64, digits| {
        let mut cells: Vec<String> = names
            .iter()
            .map(|n| {
                format!(
                    "{:.*}",
                    digits,
                    median(figures(n, measure).iter().map(value))
                )
            })
            .collect();
        for (numerator, denominator, _) in &ratio_columns {
            let ratios = figures(numerator, measure)
                .iter()
                .zip(figures(denominator, measure).iter())
                .map(|(t, o)| value(t) / value(o))
                .collect::<Vec<_>>();
            cells.push(format!("{:.2}", median(ratios.into_iter())));
        }
        rows.push((label, cells));
    };
    let users = args.users;
    for (tool, one, many) in [
        ("echo", Measure::JsonOne, Measure::JsonMany),
        ("read-only lookup", Measure::ReadOne, Measure::ReadMany),
    ] {
        row(
            format!("JSON {tool}, 1 user: req/s"),
            one,
            &Figures::rate,
            0,
        );
        row(
            format!("JSON {tool}, 1 user: server CPU per request (µs)"),
            one,
            &Figures::cpu_per_unit_us,
            1,
        );
        row(
            format!("JSON {tool}, {users} users: req/s"),
            many,
            &Figures::rate,
            0,
        );
        row(
            format!("JSON {tool}, {users} users: server CPU per request (µs)"),
            many,
            &Figures::cpu_per_unit_us,
            1,
        );
    }
    let (s, e) = (args.burst_streams, args.burst_events);
    row(
        format!("SSE, {s} streams × {e} events no pause: events/s"),
        Measure::Burst,
        &Figures::rate,
        0,
    );
    row(
        format!("SSE, {s} streams no pause: server CPU per event (µs)"),
        Measure::Burst,
        &Figures::cpu_per_unit_us,
        2,
    );
    let (p, r) = (args.paced_streams, args.paced_rate);
    row(
        format!("SSE, {p} streams × {r} ev/s: lag p50 (µs)"),
        Measure::Paced,
        &|f| f.lag_us(0.5),
        0,
    );
    row(
        format!("SSE, {p} streams × {r} ev/s: lag p99 (µs)"),
        Measure::Paced,
        &|f| f.lag_us(0.99),
        0,
    );
    let mut errors: Vec<String> = names
        .iter()
        .map(|n| {
            Measure::ALL
                .iter()
                .flat_map(|m| figures(n, *m))
                .map(|f| f.errors)
                .sum::<u64>()
                .to_string()
        })
        .collect();
    errors.extend(ratio_columns.iter().map(|_| String::new()));
    rows.push((
        "wrong answers, events lost / duplicated / reordered".into(),
        errors,
    ));
    let rows: Vec<(&str, Vec<String>)> =
        rows.iter().map(|(l, c)| (l.as_str(), c.clone())).collect();
    tether_tests::table::render(&header, &rows)
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

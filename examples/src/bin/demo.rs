//! `tether-demo`: the rolling-upgrade demo on real MCP traffic (`make demo`).
//!
//! Starts an endpoint of N pods on loopback (`tether-example-server` behind `tether-sidecar`
//! each, sharing a peers file), runs a load of MCP sessions — `slow` calls whose clients drop
//! the connection and resume with `Last-Event-ID`, standalone GET streams fed by `notify`,
//! `counter` calls — and replaces every pod by a pod of a newer revision, one at a time, the
//! way a Deployment's rolling update does ([`tether_tests::rollout`]). It does so twice: with
//! handoff, then without (`--handoff false`, the baseline; `--baseline false` skips it), and
//! prints both side by side.
//! By default the MCP servers require bearer tokens (`--auth false` turns that off): each client
//! is its own user with short-lived tokens, refreshed before expiry or — for some clients —
//! only after a 401, and now and then another user tries a client's session.
//! With `--old-bin-dir DIR` the old pods run the sidecar in `DIR` (a previous release's build)
//! and the new pods this build's: a rolling upgrade of tether itself.
//! Exits 1 when the handoff column is not clean (a client-visible 404, a lost, duplicated or
//! foreign event, a tool executed twice, a request without credentials at an MCP server, another
//! user served in a session, any other client error), 2 when the demo itself could not run.
//!
//! With `--fault sidecar-crash|pod-loss|all` (`make demo-fault`) it runs the same load without
//! a rollout and loses one pod without warning instead ([`tether_tests::rollout::fault`]):
//! each fault with replication (`--replication`, `spec.session.replication`) and without (the
//! baseline), side by side. It then exits 1 when a column with replication misses the bar: a
//! client-visible 404, a session lost, a tool executed twice or an event lost silently.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tether_tests::rollout::fault::{self, Fault, FaultConfig, FaultReport};
use tether_tests::rollout::{
    self, AuthLoad, OldSidecar, RolloutConfig, RolloutReport, SoakRow, soak_table,
};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "tether-demo",
    version,
    about = "tether's rolling-upgrade demo: every pod replaced under MCP load, with handoff and without"
)]
struct Args {
    /// Pods of the endpoint; each is replaced once.
    #[arg(long, default_value_t = 3)]
    pods: usize,
    /// MCP sessions (clients), all running for the whole rollout.
    #[arg(long, default_value_t = 1000)]
    sessions: usize,
    /// `slow` calls each session makes at least (it keeps calling until the rollout is done).
    #[arg(long, default_value_t = 10)]
    calls: usize,
    /// Progress notifications per `slow` call.
    #[arg(long, default_value_t = 10)]
    count: u32,
    /// Milliseconds between progress notifications.
    #[arg(long, default_value_t = 300)]
    interval_ms: u64,
    /// Probability that a client drops a call's connection (once or twice) and resumes.
    #[arg(long, default_value_t = 0.3)]
    cut_probability: f64,
    /// Fraction of sessions that keep a standalone GET stream open (fed by `notify`).
    #[arg(long, default_value_t = 0.2)]
    standalone_fraction: f64,
    /// Fraction of sessions that call `counter` (tool state the journal does not carry).
    #[arg(long, default_value_t = 0.2)]
    counter_fraction: f64,
    /// `spec.drain.timeout` of the pods, in milliseconds: room for a `slow` call that started
    /// just before its session moved (3 s by default) and the handoff itself.
    #[arg(long, default_value_t = 8000)]
    drain_timeout_ms: u64,
    /// Milliseconds over which the sessions start (clients arrive spread out, as real ones do).
    #[arg(long, default_value_t = 3000)]
    ramp_up_ms: u64,
    /// Also run the baseline (`--handoff false`) and print it beside; `false` halves the run.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    baseline: bool,
    /// `spec.session.migration`: `Replay` or `Pin`.
    #[arg(long, default_value = "Replay")]
    migration: String,
    /// Whether the MCP servers require bearer tokens (`tether-example-server --auth-key`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    auth: bool,
    /// Lifetime of the clients' tokens, in milliseconds (whole seconds in the token).
    #[arg(long, default_value_t = 10_000)]
    token_ttl_ms: u64,
    /// Fraction of clients that refresh their token only after a 401 (the others before it
    /// expires).
    #[arg(long, default_value_t = 0.25)]
    lazy_refresh_fraction: f64,
    /// Probability that, after a `slow` call, another user sends a request in the session.
    #[arg(long, default_value_t = 0.05)]
    probe_probability: f64,
    /// A directory holding the `tether-sidecar` of another build (a previous release): the old
    /// pods run it, the new pods this build's — a rolling upgrade of tether itself.
    #[arg(long, value_name = "DIR")]
    old_bin_dir: Option<std::path::PathBuf>,
    /// 2026-07-28 clients beside the sessions: each loops a stateless `slow` call and a `job`
    /// task polled at random pods.
    #[arg(long, default_value_t = 100)]
    modern_clients: usize,
    /// 2026-07-28 clients that keep a `subscriptions/listen` stream open.
    #[arg(long, default_value_t = 20)]
    listeners: usize,
    /// `spec.peer.tls`: mutual TLS between the sidecars; `false` measures what it costs.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    peer_tls: bool,
    /// Runs the rollout with handoff this many times (a soak, `make soak`; no baseline): one
    /// row per run and the totals; fails when any run had a foreign or lost event, a 404, a
    /// tool run twice or a request answered after 10 s or more.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// The sidecars' log filter (`RUST_LOG`): by default each request of a session and each
    /// move are written, so that every incident is printed with its session's log lines.
    #[arg(long, default_value = SIDECAR_LOG)]
    sidecar_log: String,
    /// Instead of the rolling upgrade, lose a pod without warning under the same load: its
    /// sidecar crashes and restarts (`sidecar-crash`), or the whole pod is gone and replaced
    /// (`pod-loss`), or both (`all`); each with replication and, with `--baseline`, without.
    #[arg(long, value_parser = ["sidecar-crash", "pod-loss", "all"], conflicts_with_all = ["runs", "old_bin_dir"])]
    fault: Option<String>,
    /// `spec.session.replication` of the `--fault` columns with replication: `Sessions` or
    /// `Events` (the baseline columns run `None`).
    #[arg(long, default_value = "Sessions")]
    replication: String,
    /// With `--fault pod-loss`: milliseconds from the kill until the lost pod leaves the
    /// membership (its loss noticed) and its replacement starts.
    #[arg(long, default_value_t = 5000)]
    detection_delay_ms: u64,
    /// With `--fault`: milliseconds from every session initialized until the kill.
    #[arg(long, default_value_t = 5000)]
    fault_after_ms: u64,
}

/// The sidecars' log filter by default: each request of a session and each move at debug.
const SIDECAR_LOG: &str = "info,tether_sidecar::broker=debug,tether_sidecar::handoff=debug";

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let old_sidecar = match args
        .old_bin_dir
        .as_deref()
        .map(OldSidecar::in_dir)
        .transpose()
    {
        Ok(old) => old,
        Err(e) => {
            eprintln!("tether-demo: the old sidecar: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = RolloutConfig {
        pods: args.pods,
        sessions: args.sessions,
        calls: args.calls,
        count: args.count,
        interval_ms: args.interval_ms,
        cut_probability: args.cut_probability,
        standalone_fraction: args.standalone_fraction,
        counter_fraction: args.counter_fraction,
        migration: args.migration.clone(),
        drain_timeout: Duration::from_millis(args.drain_timeout_ms),
        ramp_up: Duration::from_millis(args.ramp_up_ms),
        auth: args.auth.then(|| AuthLoad {
            token_ttl: Duration::from_millis(args.token_ttl_ms),
            lazy_fraction: args.lazy_refresh_fraction,
            probe_probability: args.probe_probability,
        }),
        modern_clients: args.modern_clients,
        listeners: args.listeners,
        old_sidecar,
        peer_tls: args.peer_tls,
        sidecar_log: Some(args.sidecar_log.clone()),
        ..RolloutConfig::default()
    };
    if args.runs > 1 {
        return soak(&cfg, args.runs).await;
    }
    if let Some(which) = &args.fault {
        return faults(cfg, which, &args).await;
    }
    println!(
        "rolling upgrade of {} pods under {} MCP sessions and {} 2026-07-28 clients ({} listening) \
         ({} slow calls or more each, {} progress events per call, {}% of calls cut and \
         resumed{}), with handoff{}...",
        cfg.pods,
        cfg.sessions,
        cfg.modern_clients + cfg.listeners,
        cfg.listeners,
        cfg.calls,
        cfg.count,
        (cfg.cut_probability * 100.0).round(),
        match &cfg.auth {
            Some(a) => format!(
                "; MCP servers requiring bearer tokens of {:.1} s",
                a.token_ttl.as_secs_f64()
            ),
            None => String::new(),
        },
        if args.baseline {
            ", then without (baseline)"
        } else {
            ""
        }
    );
    let Some(handoff) = run(&cfg).await else {
        return ExitCode::from(2);
    };
    let mut reports = vec![handoff];
    if args.baseline {
        let Some(baseline) = run(&cfg.baseline()).await else {
            return ExitCode::from(2);
        };
        reports.push(baseline);
    }
    println!("\n{}", rollout::table(&reports.iter().collect::<Vec<_>>()));
    let handoff = &reports[0];
    for report in &reports {
        explain(report);
    }
    if handoff.is_clean() {
        println!(
            "result: every pod replaced; no client saw a 404, every event arrived exactly once, \
             no foreign event, no tool ran twice, no 2026-07-28 request or listen stream was \
             cut, every task was found{}",
            if cfg.auth.is_some() {
                "; every request reached the MCP servers with its user's credentials, no other \
                 user was served in a session"
            } else {
                ""
            }
        );
        ExitCode::SUCCESS
    } else {
        println!(
            "result: FAILED: the {} column is not clean (see the table and failures above)",
            handoff.label
        );
        ExitCode::FAILURE
    }
}

/// Prints what went wrong in `report`: each failure, each incident with its session's log lines
/// from every sidecar, the sidecars' warnings.
fn explain(report: &RolloutReport) {
    for failure in &report.load.failures {
        println!("{} failure: {failure}", report.label);
    }
    let explained = report.explain(tether_tests::pod::session_key());
    if !explained.is_empty() {
        println!(
            "{} incidents, with their sessions' sidecar log lines:",
            report.label
        );
        print!("{explained}");
    }
    for (message, n) in &report.sidecar.warnings {
        println!("{} sidecar warnings: {n} x {message}", report.label);
    }
}

/// Runs the rollout with handoff `runs` times: a row per run as it ends, each failed run
/// explained, then the table of all runs and their totals.
async fn soak(cfg: &RolloutConfig, runs: u32) -> ExitCode {
    let mut rows = Vec::new();
    for run_no in 1..=runs {
        println!("soak run {run_no} of {runs}...");
        let Some(report) = run(cfg).await else {
            return ExitCode::from(2);
        };
        let row = SoakRow::of(&report);
        if !row.is_clean() {
            explain(&report);
        }
        rows.push(row);
        println!("{}", soak_table(&rows));
    }
    if rows.iter().all(SoakRow::is_clean) {
        println!("result: {runs} of {runs} runs clean");
        ExitCode::SUCCESS
    } else {
        println!("result: FAILED: not every run was clean (see the table and incidents above)");
        ExitCode::FAILURE
    }
}

/// The fault mode: each fault of `which` under `load`, with replication and (with
/// `--baseline`) without, side by side; exits 1 when a column with replication misses the bar.
async fn faults(load: RolloutConfig, which: &str, args: &Args) -> ExitCode {
    let chosen: Vec<Fault> = match which {
        "sidecar-crash" => vec![Fault::SidecarCrash],
        "pod-loss" => vec![Fault::PodLoss],
        _ => Fault::ALL.to_vec(),
    };
    println!(
        "{} under {} MCP sessions on {} pods and {} 2026-07-28 clients, with replication {}{}...",
        chosen
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(", then "),
        load.sessions,
        load.pods,
        load.modern_clients + load.listeners,
        args.replication,
        if args.baseline {
            ", then without (baseline)"
        } else {
            ""
        }
    );
    let mut reports = Vec::new();
    for fault in chosen {
        let cfg = FaultConfig {
            replication: args.replication.clone(),
            detection_delay: Duration::from_millis(args.detection_delay_ms),
            fault_after: Duration::from_millis(args.fault_after_ms),
            settle: Duration::from_secs(5),
            ..FaultConfig::new(fault, load.clone())
        };
        let mut runs = vec![cfg.clone()];
        if args.baseline {
            runs.push(cfg.baseline());
        }
        for cfg in &runs {
            match fault::run(cfg).await {
                Ok(report) => reports.push(report),
                Err(e) => {
                    eprintln!("tether-demo: the {} run failed: {e}", cfg.label());
                    return ExitCode::from(2);
                }
            }
        }
    }
    println!("\n{}", fault::table(&reports.iter().collect::<Vec<_>>()));
    // The baselines lose sessions by design: only the runs with replication are explained.
    let missed: Vec<&FaultReport> = reports
        .iter()
        .filter(|r| r.replicated() && !r.meets_bar())
        .collect();
    for report in &missed {
        explain(&report.run);
    }
    if missed.is_empty() {
        println!(
            "result: with replication {}, no client saw a 404, no session was lost, no tool \
             ran twice, no event was lost without the sidecar saying so",
            args.replication
        );
        ExitCode::SUCCESS
    } else {
        let labels: Vec<&str> = missed.iter().map(|r| r.run.label.as_str()).collect();
        println!(
            "result: FAILED: {} missed the bar (0 client-visible 404s, 0 sessions lost, 0 \
             tools executed twice, 0 events lost silently; see the table and failures above)",
            labels.join(", ")
        );
        ExitCode::FAILURE
    }
}

/// Runs one rollout; `None` (after saying why) when it could not run.
async fn run(cfg: &RolloutConfig) -> Option<RolloutReport> {
    rollout::run(cfg)
        .await
        .inspect_err(|e| eprintln!("tether-demo: the {} rollout failed: {e}", cfg.label()))
        .ok()
}

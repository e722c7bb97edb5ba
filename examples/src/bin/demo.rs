//! `tether-demo`: the local demo on real MCP traffic (`make demo`).
//!
//! Starts one pod on loopback (`tether-example-server` behind `tether-sidecar`), runs concurrent
//! MCP sessions that call `slow` while their clients randomly drop the connection and resume
//! with `Last-Event-ID`, and prints what the clients experienced. Exits non-zero when any event
//! was lost, duplicated or foreign, or a tool ran twice.

use std::process::ExitCode;

use clap::Parser;
use tether_tests::load::{self, LoadConfig};
use tether_tests::pod::{Pod, PodSpec};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "tether-demo",
    version,
    about = "tether's local demo on real MCP traffic"
)]
struct Args {
    /// Concurrent MCP sessions.
    #[arg(long, default_value_t = 200)]
    sessions: usize,
    /// `slow` calls per session.
    #[arg(long, default_value_t = 5)]
    calls: usize,
    /// Progress notifications per call.
    #[arg(long, default_value_t = 10)]
    count: u32,
    /// Milliseconds between progress notifications.
    #[arg(long, default_value_t = 20)]
    interval_ms: u64,
    /// Probability that a call's client disconnects (once or twice) and resumes.
    #[arg(long, default_value_t = 0.5)]
    cut_probability: f64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let pod = match Pod::start(PodSpec::default()).await {
        Ok(pod) => pod,
        Err(e) => {
            eprintln!("tether-demo: cannot start the pod: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "pod up: sidecar {} in front of the example server {}",
        pod.mcp_url, pod.server_url
    );
    let cfg = LoadConfig {
        sessions: args.sessions,
        calls_per_session: args.calls,
        count: args.count,
        interval_ms: args.interval_ms,
        cut_probability: args.cut_probability,
        concurrency: args.sessions,
        ..LoadConfig::default()
    };
    println!(
        "running {} sessions x {} slow calls ({} progress events each, {}% of calls cut and resumed)...",
        cfg.sessions,
        cfg.calls_per_session,
        cfg.count,
        (cfg.cut_probability * 100.0).round()
    );
    let mut report = load::run(&pod.client(), &cfg).await;
    match pod.stats().await {
        Ok(stats) => report.executed_twice = load::executed_twice(&stats),
        Err(e) => report.failures.push(format!("cannot read /stats: {e}")),
    }
    println!("\n{}", report.table());
    for failure in report.failures.iter().take(10) {
        println!("failure: {failure}");
    }
    if report.is_clean() {
        println!("result: every event delivered exactly once, no foreign event, no tool ran twice");
        ExitCode::SUCCESS
    } else {
        println!("result: FAILED (see the table and failures above)");
        ExitCode::FAILURE
    }
}

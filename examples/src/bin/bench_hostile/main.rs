//! `tether-bench-hostile`: what hostile requests and floods cost a sidecar, on loopback
//! (`make bench`).
//!
//! Prints three tables:
//!
//! - **CPU per request** (one pod, this file): the sidecar's CPU time (every thread's, from
//!   `/proc/<pid>/task/*/schedstat`) over a run of each request, divided by the run's length, and
//!   the answer's p50 — a 4 MiB JSON-RPC batch (95,000 members) without a session, with a forged
//!   session id, and on a 2025-11-25 session (which may not batch); a request with a 1 MiB id;
//!   and, for comparison in the same run, an `echo` call that is served.
//! - **A session under fire** (the same pod): `echo` call latency of one session, sequential,
//!   quiet and while the hostile requests above arrive at a steady rate (2 per second by
//!   default).
//! - **Floods** ([`floods`], a second pod whose MCP server requires bearer JWTs): a *victim* —
//!   its own principal, its own loopback source address — calls `echo` in its session, one call
//!   after another, while an *attacker* (another principal, other source addresses) floods the
//!   pod for `--flood-seconds`, one flood per row, all in the same run: nothing (the baseline),
//!   unread answers, silent connections on the MCP port, half-sent heads on the admin port,
//!   walked-away calls, a session flood by one principal, `/drained` waiters, unpolled tasks.
//!   Each row gives what the attacker did and what the sidecar counted of it, the victim's
//!   `echo` p50 / p99 / errors, a `/readyz` probe's p99 (a kubelet of its own address) and the
//!   sidecar's RSS before, at its peak and after the pod settled ([`watch`]).
//!
//! `--floods-only` skips the first two tables; `--flood-rows` picks rows of the third.
//! Release binaries give the meaningful figures (`make bench` builds them).

mod floods;
mod watch;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{Value, json};
use tether_tests::client::{McpClient, Session, body_text};
use tether_tests::load::quantile;
use tether_tests::pod::Pod;

use crate::watch::echo;

/// Command line.
#[derive(Debug, Parser)]
#[command(name = "tether-bench-hostile", version, about)]
struct Args {
    /// Hostile requests of each kind in the CPU table.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// `echo` calls in the CPU table's comparison row.
    #[arg(long, default_value_t = 500)]
    echoes: usize,
    /// Seconds of each half (quiet, under fire) of the latency table.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Hostile requests per second while under fire.
    #[arg(long, default_value_t = 2)]
    rate: u32,
    /// Print the Floods table only.
    #[arg(long)]
    floods_only: bool,
    /// The Floods table's knobs.
    #[command(flatten)]
    floods: floods::Knobs,
}

type Outcome<T> = Result<T, String>;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if !args.floods_only {
        let pod = match Pod::start_default().await {
            Ok(pod) => pod,
            Err(e) => {
                eprintln!("tether-bench-hostile: cannot start the pod: {e}");
                return ExitCode::FAILURE;
            }
        };
        match run(&pod, &args).await {
            Ok(tables) => println!("{tables}\n"),
            Err(e) => {
                eprintln!("tether-bench-hostile: {e}\n{}", pod.logs());
                return ExitCode::FAILURE;
            }
        }
    }
    match floods::table(&args.floods).await {
        Ok(table) => {
            println!("{table}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tether-bench-hostile: floods: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One kind of hostile request: a name, the session it names (if any) and its body.
struct Hostile {
    name: &'static str,
    session: Option<Session>,
    body: Arc<Value>,
}

async fn run(pod: &Pod, args: &Args) -> Outcome<String> {
    let client = pod.client();
    let init = |version: &'static str| {
        let client = client.clone();
        async move { client.initialize(version).await.map_err(|e| e.to_string()) }
    };
    let later = init("2025-11-25").await?;
    let forged = later.forged(10);
    let batch = Arc::new(ping_batch(4 << 20));
    let long_id = Arc::new(json!({"jsonrpc": "2.0", "id": "i".repeat(1 << 20),
        "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "x"}}}));
    let hostile = [
        Hostile {
            name: "4 MiB batch, no session",
            session: None,
            body: Arc::clone(&batch),
        },
        Hostile {
            name: "4 MiB batch, forged session id",
            session: Some(forged),
            body: Arc::clone(&batch),
        },
        Hostile {
            name: "4 MiB batch, 2025-11-25 session",
            session: Some(later.clone()),
            body: Arc::clone(&batch),
        },
        Hostile {
            name: "1 MiB request id",
            session: Some(later.clone()),
            body: Arc::clone(&long_id),
        },
    ];
    let mut cpu_rows = Vec::new();
    for h in &hostile {
        let (cpu, answers) = cpu_of(pod, args.rounds, || refused(&client, h)).await?;
        cpu_rows.push(cpu_row(h.name, "4xx", cpu, &answers));
    }
    let victim = init("2025-11-25").await?;
    let mut id = 1_000_000;
    let (cpu, answers) = cpu_of(pod, args.echoes, || {
        id += 1;
        echo(&client, &victim, id)
    })
    .await?;
    cpu_rows.push(cpu_row("`echo` call (served)", "200", cpu, &answers));

    let span = Duration::from_secs(args.seconds);
    let quiet = echo_for(&client, &victim, span, 2_000_000).await?;
    let firing = Arc::new(AtomicBool::new(true));
    let fire = {
        let (client, firing) = (client.clone(), Arc::clone(&firing));
        let hostile: Vec<(Option<Session>, Arc<Value>)> = hostile
            .iter()
            .map(|h| (h.session.clone(), Arc::clone(&h.body)))
            .collect();
        let every = Duration::from_secs(1) / args.rate.max(1);
        tokio::spawn(async move {
            let mut sent = 0usize;
            let mut tick = tokio::time::interval(every);
            while firing.load(Ordering::Relaxed) {
                tick.tick().await;
                let (session, body) = hostile[sent % hostile.len()].clone();
                let client = client.clone();
                tokio::spawn(async move {
                    if let Ok(resp) = client.post(session.as_ref(), &body, &[]).await {
                        drop(body_text(resp).await);
                    }
                });
                sent += 1;
            }
            sent
        })
    };
    let under_fire = echo_for(&client, &victim, span, 3_000_000).await?;
    firing.store(false, Ordering::Relaxed);
    let sent = fire.await.map_err(|e| e.to_string())?;
    let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0);
    let latency_row = |name: &str, samples: &[Duration]| {
        format!(
            "| {name} | {} | {:.3} ms | {:.3} ms | {:.3} ms |",
            samples.len(),
            ms(quantile(samples, 0.5)),
            ms(quantile(samples, 0.99)),
            ms(samples.iter().max().copied()),
        )
    };
    Ok(format!(
        "hostile input on loopback: the sidecar's CPU per request ({} of each hostile kind, {} \
         echo calls)\n\n\
         | request | answer | sidecar CPU per request | answer p50 |\n|---|---|---:|---:|\n{}\n\n\
         one session's `echo` calls, {} s quiet, then {} s while {} hostile requests per second \
         arrive ({sent} sent, the four kinds in turn)\n\n\
         | phase | calls | p50 | p99 | max |\n|---|---:|---:|---:|---:|\n{}\n{}",
        args.rounds,
        args.echoes,
        cpu_rows.join("\n"),
        args.seconds,
        args.seconds,
        args.rate,
        latency_row("quiet", &quiet),
        latency_row("under fire", &under_fire),
    ))
}

/// A batch of `ping` requests just under `bytes` of JSON text (95,000 members in 4 MiB).
fn ping_batch(bytes: usize) -> Value {
    let mut members = Vec::new();
    let mut size = 2;
    for id in 0.. {
        let member = json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
        let len = member.to_string().len() + 1;
        if size + len > bytes - 64 {
            break;
        }
        size += len;
        members.push(member);
    }
    Value::Array(members)
}

/// The sidecar's CPU time over `n` runs of `request`, divided by `n`, and each answer's time.
async fn cpu_of<F, Fut>(pod: &Pod, n: usize, mut request: F) -> Outcome<(Duration, Vec<Duration>)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Outcome<()>>,
{
    let before = pod.sidecar_cpu().map_err(|e| e.to_string())?;
    let mut answers = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        request().await?;
        answers.push(started.elapsed());
    }
    let used = pod.sidecar_cpu().map_err(|e| e.to_string())? - before;
    Ok((used / u32::try_from(n.max(1)).unwrap_or(u32::MAX), answers))
}

fn cpu_row(name: &str, answer: &str, cpu: Duration, answers: &[Duration]) -> String {
    let p50 = quantile(answers, 0.5).unwrap_or_default();
    format!(
        "| {name} | {answer} | {:.3} ms | {:.3} ms |",
        cpu.as_secs_f64() * 1000.0,
        p50.as_secs_f64() * 1000.0
    )
}

/// Sends a hostile request and checks it is refused with a 4xx.
async fn refused(client: &McpClient, h: &Hostile) -> Outcome<()> {
    let resp = client
        .post(h.session.as_ref(), &h.body, &[])
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let text = body_text(resp).await.map_err(|e| e.to_string())?;
    if status.is_client_error() {
        Ok(())
    } else {
        Err(format!("{} answered {status}: {text:.200}", h.name))
    }
}

/// Sequential `echo` calls for `span`, from request id `first_id`: each call's time.
async fn echo_for(
    client: &McpClient,
    session: &Session,
    span: Duration,
    first_id: u64,
) -> Outcome<Vec<Duration>> {
    let until = Instant::now() + span;
    let mut samples = Vec::new();
    let mut id = first_id;
    while Instant::now() < until {
        let started = Instant::now();
        echo(client, session, id).await?;
        samples.push(started.elapsed());
        id += 1;
    }
    Ok(samples)
}

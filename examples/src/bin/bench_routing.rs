//! `tether-bench-routing`: what a forward hop between sidecars costs, on loopback, and what
//! mutual TLS between them adds (`make bench`).
//!
//! Starts two pods (example server + sidecar each, static membership) and creates a session on
//! pod A, twice: with peer TLS off (`spec.peer.tls: false`: plaintext, still MAC'd) and on (the
//! default). Each measure is taken entering at A (direct: the holder) and at B (one hop: B
//! forwards to A over the peer port), and printed as a table of p50/p99:
//!
//! - **JSON-RPC request**: a `tools/list` POST, from send to the complete answer (rmcp answers
//!   session requests with a one-message SSE stream); sequential, keep-alive.
//! - **notification**: a `notifications/roots/list_changed` POST, from send to its `202`.
//! - **SSE event delivery**: the session's standalone GET stream is opened (at A or through B);
//!   then `notify` (one `notifications/message`) is called directly at A, and the time from
//!   sending that POST to the event's arrival on the GET stream is measured.
//! - **CPU per forwarded request**: both sidecars' CPU time over the forwarded `tools/list`
//!   requests, divided by their number.
//! - **handoff**: `--handoff-sessions` sessions (each with a finished `slow` call, so its image
//!   carries events) are created on A, then A drains and hands them to B: the drain's time and
//!   both sidecars' CPU time per session moved.
//!
//! Release binaries give the meaningful figures (`make bench` builds them).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use http::StatusCode;
use serde_json::json;
use tether_tests::addr;
use tether_tests::client::{Events, McpClient, Session, body_text, tool_call};
use tether_tests::cluster::Cluster;
use tether_tests::load::quantile;
use tether_tests::pod::PodSpec;

/// Command line.
#[derive(Debug, Parser)]
#[command(name = "tether-bench-routing", version, about)]
struct Args {
    /// Samples per measure and entry pod.
    #[arg(long, default_value_t = 2000)]
    samples: usize,
    /// Samples discarded first (connection set-up, warm caches).
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// Sessions handed off in the handoff measure.
    #[arg(long, default_value_t = 500)]
    handoff_sessions: usize,
}

/// What one run (peer TLS off or on) measured.
struct Run {
    /// Per measure: direct and via-hop samples.
    latencies: Vec<(&'static str, Vec<Duration>, Vec<Duration>)>,
    /// Both sidecars' CPU time per forwarded request.
    cpu_per_forward: Duration,
    /// The drain that handed the sessions off, and both sidecars' CPU time per session.
    handoff: (Duration, Duration),
}

type Outcome<T> = Result<T, String>;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(table) => {
            println!("{table}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tether-bench-routing: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Outcome<String> {
    let mut runs = Vec::new();
    for tls in [false, true] {
        let ips = [addr::next_ip(), addr::next_ip()];
        let spec = PodSpec {
            peer_tls: tls,
            ..PodSpec::default()
        };
        let cluster = Cluster::start(&ips, spec)
            .await
            .map_err(|e| format!("cannot start the pods: {e}"))?;
        let run = measure(&cluster, &ips, args)
            .await
            .map_err(|e| format!("{e}\n{}", cluster.logs()))?;
        runs.push(run);
    }
    let (plain, tls) = (&runs[0], &runs[1]);
    let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0);
    let mut rows = Vec::new();
    for ((name, direct, hop), (_, _, tls_hop)) in plain.latencies.iter().zip(&tls.latencies) {
        let (d50, d99) = (ms(quantile(direct, 0.5)), ms(quantile(direct, 0.99)));
        let (p50, p99) = (ms(quantile(hop, 0.5)), ms(quantile(hop, 0.99)));
        let (t50, t99) = (ms(quantile(tls_hop, 0.5)), ms(quantile(tls_hop, 0.99)));
        rows.push(format!(
            "| {name} | {d50:.3} / {d99:.3} ms | {p50:.3} / {p99:.3} ms | {t50:.3} / {t99:.3} ms | {:+.3} / {:+.3} ms |",
            t50 - p50,
            t99 - p99
        ));
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    rows.push(format!(
        "| sidecars' CPU per forwarded request | | {:.1} µs | {:.1} µs | {:+.1} µs |",
        us(plain.cpu_per_forward),
        us(tls.cpu_per_forward),
        us(tls.cpu_per_forward) - us(plain.cpu_per_forward)
    ));
    rows.push(format!(
        "| handoff of {} sessions: drain time | | {:.0} ms | {:.0} ms | {:+.0} ms |",
        args.handoff_sessions,
        ms(Some(plain.handoff.0)),
        ms(Some(tls.handoff.0)),
        ms(Some(tls.handoff.0)) - ms(Some(plain.handoff.0))
    ));
    rows.push(format!(
        "| handoff: sidecars' CPU per session moved | | {:.1} µs | {:.1} µs | {:+.1} µs |",
        us(plain.handoff.1),
        us(tls.handoff.1),
        us(tls.handoff.1) - us(plain.handoff.1)
    ));
    Ok(format!(
        "forward-hop latency and peer TLS on loopback, {} samples each (after {} warm-up); \
         latencies p50 / p99\n\n\
         | measure | direct | via hop, plaintext | via hop, mutual TLS | TLS adds |\n\
         |---|---:|---:|---:|---:|\n{}",
        args.samples,
        args.warmup,
        rows.join("\n")
    ))
}

/// Both sidecars' CPU time so far.
fn cpu(cluster: &Cluster) -> Outcome<Duration> {
    cluster
        .pods
        .iter()
        .map(|p| p.sidecar_cpu().map_err(|e| e.to_string()))
        .sum()
}

async fn measure(cluster: &Cluster, ips: &[std::net::Ipv4Addr], args: &Args) -> Outcome<Run> {
    let a = cluster.client_of(&ips[..1]);
    let b = cluster.client_of(&ips[1..]);
    let session = a
        .initialize("2025-06-18")
        .await
        .map_err(|e| e.to_string())?;
    // Fresh request ids: a repeated id with the same body is a retry (spec S-09) that the
    // sidecar answers from its stored reply without asking the upstream.
    let list = |id: u64| json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});
    let notification =
        |_: u64| json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"});
    let direct = exchange(&a, &session, &list, 10_000_000, StatusCode::OK, args).await?;
    let before = cpu(cluster)?;
    let hop = exchange(&b, &session, &list, 20_000_000, StatusCode::OK, args).await?;
    let forwarded = (args.warmup + args.samples) as u32;
    let cpu_per_forward = (cpu(cluster)? - before) / forwarded;
    let latencies = vec![
        ("JSON-RPC request (tools/list)", direct, hop),
        (
            "notification (202)",
            exchange(&a, &session, &notification, 0, StatusCode::ACCEPTED, args).await?,
            exchange(&b, &session, &notification, 0, StatusCode::ACCEPTED, args).await?,
        ),
        (
            "SSE event delivery (notify)",
            sse_delivery(&a, &a, &session, 1_000_000, args).await?,
            sse_delivery(&a, &b, &session, 2_000_000, args).await?,
        ),
    ];
    let handoff = handoff(cluster, &a, args).await?;
    Ok(Run {
        latencies,
        cpu_per_forward,
        handoff,
    })
}

/// Creates `--handoff-sessions` sessions on A, each with a finished `slow` call, then drains A:
/// the drain's time and both sidecars' CPU time per session moved.
async fn handoff(cluster: &Cluster, a: &McpClient, args: &Args) -> Outcome<(Duration, Duration)> {
    for i in 0..args.handoff_sessions {
        let session = a
            .initialize("2025-11-25")
            .await
            .map_err(|e| e.to_string())?;
        let call = tool_call(
            1,
            "slow",
            json!({"count": 5, "interval_ms": 0, "call_id": format!("h{i}")}),
            Some(&format!("h{i}")),
        );
        let resp = a
            .post(Some(&session), &call, &[])
            .await
            .map_err(|e| e.to_string())?;
        body_text(resp).await.map_err(|e| e.to_string())?;
    }
    let before = cpu(cluster)?;
    let drained = cluster.pods[0].drain().await.map_err(|e| e.to_string())?;
    let moved = drained.body["handedOff"].as_u64().unwrap_or(0);
    if !drained.done || moved == 0 {
        return Err(format!(
            "the drain did not hand the sessions off: {}",
            drained.body
        ));
    }
    let per_session = (cpu(cluster)? - before) / u32::try_from(moved).unwrap_or(u32::MAX);
    let took = Duration::from_millis(drained.body["elapsedMs"].as_u64().unwrap_or(0));
    Ok((took, per_session))
}

/// Times `body(first_id + i)` POSTed `warmup + samples` times, each until its complete answer
/// with `status`.
async fn exchange(
    client: &McpClient,
    session: &Session,
    body: &dyn Fn(u64) -> serde_json::Value,
    first_id: u64,
    status: StatusCode,
    args: &Args,
) -> Outcome<Vec<Duration>> {
    let mut samples = Vec::with_capacity(args.samples);
    for i in 0..args.warmup + args.samples {
        let body = body(first_id + i as u64);
        let started = Instant::now();
        let resp = client
            .post(Some(session), &body, &[])
            .await
            .map_err(|e| e.to_string())?;
        let got = resp.status();
        let text = body_text(resp).await.map_err(|e| e.to_string())?;
        if got != status {
            return Err(format!("{body} answered {got}: {text:.200}"));
        }
        if i >= args.warmup {
            samples.push(started.elapsed());
        }
    }
    Ok(samples)
}

async fn sse_delivery(
    caller: &McpClient,
    reader: &McpClient,
    session: &Session,
    first_id: u64,
    args: &Args,
) -> Outcome<Vec<Duration>> {
    let resp = reader.get(session, None).await.map_err(|e| e.to_string())?;
    if resp.status() != StatusCode::OK {
        return Err(format!("standalone GET answered {}", resp.status()));
    }
    let mut events = Events::new(resp);
    let mut samples = Vec::with_capacity(args.samples);
    for i in 0..args.warmup + args.samples {
        let call = tool_call(
            // Fresh request ids: a repeated id with the same body is a retry (spec S-09).
            first_id + i as u64,
            "notify",
            json!({"text": "bench", "count": 1}),
            None,
        );
        let started = Instant::now();
        let post = {
            let caller = caller.clone();
            let session = session.clone();
            tokio::spawn(async move {
                let resp = caller.post(Some(&session), &call, &[]).await?;
                body_text(resp).await
            })
        };
        let delivered = loop {
            let ev = events
                .next_within(Duration::from_secs(5))
                .await
                .ok_or("the standalone stream stalled")?;
            if ev
                .data
                .as_deref()
                .is_some_and(|d| d.contains("notifications/message"))
            {
                break started.elapsed();
            }
        };
        post.await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if i >= args.warmup {
            samples.push(delivered);
        }
    }
    Ok(samples)
}

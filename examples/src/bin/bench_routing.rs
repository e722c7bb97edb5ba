//! `tether-bench-routing`: what a forward hop between sidecars costs, on loopback (`make bench`).
//!
//! Starts two pods (example server + sidecar each, static membership) and creates a session on
//! pod A. Each measure is taken twice, entering at A (direct: the holder) and at B (one hop:
//! B forwards to A), and printed as a table of p50/p99 and the difference:
//!
//! - **JSON-RPC request**: a `tools/list` POST, from send to the complete answer (rmcp answers
//!   session requests with a one-message SSE stream); sequential, keep-alive.
//! - **notification**: a `notifications/roots/list_changed` POST, from send to its `202`.
//! - **SSE event delivery**: the session's standalone GET stream is opened (at A or through B);
//!   then `notify` (one `notifications/message`) is called directly at A, and the time from
//!   sending that POST to the event's arrival on the GET stream is measured.
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
    let ips = [addr::next_ip(), addr::next_ip()];
    let cluster = Cluster::start(&ips, PodSpec::default())
        .await
        .map_err(|e| format!("cannot start the pods: {e}"))?;
    measure(&cluster, &ips, args)
        .await
        .map_err(|e| format!("{e}\n{}", cluster.logs()))
}

async fn measure(cluster: &Cluster, ips: &[std::net::Ipv4Addr], args: &Args) -> Outcome<String> {
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
    let mut rows = Vec::new();
    for (name, direct, hop) in [
        (
            "JSON-RPC request (tools/list)",
            exchange(&a, &session, &list, 10_000_000, StatusCode::OK, args).await?,
            exchange(&b, &session, &list, 20_000_000, StatusCode::OK, args).await?,
        ),
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
    ] {
        rows.push(row(name, &direct, &hop));
    }
    Ok(format!(
        "forward-hop latency on loopback, {} samples each (after {} warm-up)\n\n\
         | measure | direct p50 | direct p99 | via hop p50 | via hop p99 | added p50 | added p99 |\n\
         |---|---:|---:|---:|---:|---:|---:|\n{}",
        args.samples,
        args.warmup,
        rows.join("\n")
    ))
}

fn row(name: &str, direct: &[Duration], hop: &[Duration]) -> String {
    let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0);
    let (d50, d99) = (ms(quantile(direct, 0.5)), ms(quantile(direct, 0.99)));
    let (h50, h99) = (ms(quantile(hop, 0.5)), ms(quantile(hop, 0.99)));
    format!(
        "| {name} | {d50:.3} ms | {d99:.3} ms | {h50:.3} ms | {h99:.3} ms | {:.3} ms | {:.3} ms |",
        h50 - d50,
        h99 - d99
    )
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

//! The second table of `tether-bench-proxy`: what tether does that nginx does not, resuming and
//! handing off, timed (`docs/dev/testing.md#proxy-cost`).
//!
//! - **Resume**: `--resumes` sessions on one pod, each with a finished `stream` call of
//!   [`EVENTS`] events read to its end; then every client at once resumes its call with `GET` +
//!   `Last-Event-ID` of the first event (spec R-03). Latency of each: from sending the GET to
//!   the first byte of its body (a new connection each, as a reconnecting client makes), p50 and
//!   p99. Every resume must replay exactly the events after the cursor and the result.
//! - **Handoff**: for each of `--handoff-sessions`, a fresh pair of pods; that many sessions
//!   created through the first, each with a finished `stream` call (its buffer holds the
//!   events), then the first pod drains and hands its sessions to the second: the drain's time
//!   as the sidecar reports it. The drain must hand off every session (`handedOff` = the
//!   sessions created), and every session must answer a `ping` through the second pod
//!   afterwards.
//!
//! The resume pod's processes are pinned like the proxy measures' servers; of the handoff pair,
//! the draining pod to the servers' core and its peer to the client's (two pods of a Deployment
//! run on two nodes; the client is idle while the pod drains). Sessions are prepared
//! [`PREPARE_CONCURRENCY`] at a time.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use http::StatusCode;
use http_body_util::BodyExt as _;
use serde_json::{Value, json};
use tether_tests::client::{Events, McpClient, Session, tool_call};
use tether_tests::cluster::Cluster;
use tether_tests::pod::{Pod, PodSpec, Upstream};

use super::{Outcome, pin};

/// Events of each session's `stream` call (then its result).
pub(crate) const EVENTS: u64 = 10;
/// Sessions prepared at once.
const PREPARE_CONCURRENCY: usize = 32;
/// How long one exchange of the preparation or the checks may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// The resume measure: a latency per resume, and the resumes that replayed something else than
/// the events after their cursor.
pub(crate) struct Resumes {
    /// GET sent → first body byte, one per resume.
    pub(crate) latencies: Vec<Duration>,
    /// Resumes that failed or replayed the wrong events.
    pub(crate) errors: u64,
    /// The sidecar's CPU time over the resumes, per resume.
    pub(crate) cpu_per_resume: Duration,
}

/// One handoff measure.
pub(crate) struct Handoff {
    /// Sessions created.
    pub(crate) sessions: usize,
    /// Sessions the draining pod held before it drained (`tether_sessions`): all of them, as a
    /// pod that is not draining places every new session on itself.
    pub(crate) held: u64,
    /// Sessions the drain handed off (`handedOff`).
    pub(crate) moved: u64,
    /// The drain's time (`elapsedMs`).
    pub(crate) took: Duration,
    /// Sessions that did not answer a `ping` after the drain.
    pub(crate) errors: u64,
}

/// A pod spec for these measures: the bench origin as MCP server, room for `sessions`.
fn spec(sessions: usize) -> PodSpec {
    PodSpec {
        server: Upstream::Origin,
        drain_timeout: "120s".into(),
        sidecar_args: vec![
            "--max-sessions".into(),
            (sessions * 2).max(10_000).to_string(),
        ],
        ..PodSpec::default()
    }
}

/// Pins both processes of `pod` to `core`.
fn pin_pod(pod: &Pod, core: usize) {
    for pid in [pod.sidecar_pid(), pod.server_pid()].into_iter().flatten() {
        pin(pid, core);
    }
}

/// Runs the resume measure with `count` concurrent resumes.
pub(crate) async fn resumes(count: usize, core: usize) -> Outcome<Resumes> {
    let pod = Pod::start_at(tether_tests::addr::next_ip(), spec(count))
        .await
        .map_err(|e| format!("the resume pod: {e}"))?;
    pin_pod(&pod, core);
    let client = pod.client();
    let cursors = prepare(&client, count, "r").await?;
    let start = Arc::new(tokio::sync::Barrier::new(cursors.len()));
    let cpu = || pod.sidecar_cpu().map_err(|e| e.to_string());
    let before = cpu()?;
    let resumes: Vec<_> = cursors
        .into_iter()
        .map(|(session, cursor)| {
            let (client, start) = (client.clone(), Arc::clone(&start));
            tokio::spawn(async move {
                start.wait().await;
                resume(&client, &session, &cursor).await
            })
        })
        .collect();
    let mut out = Resumes {
        latencies: Vec::with_capacity(count),
        errors: 0,
        cpu_per_resume: Duration::ZERO,
    };
    for task in resumes {
        match task.await.map_err(|e| e.to_string())? {
            Ok(latency) => out.latencies.push(latency),
            Err(e) => {
                if out.errors == 0 {
                    eprintln!("tether-bench-proxy: a resume failed: {e}");
                }
                out.errors += 1;
            }
        }
    }
    out.cpu_per_resume = (cpu()? - before) / u32::try_from(count.max(1)).unwrap_or(u32::MAX);
    Ok(out)
}

/// Runs the handoff measure with `sessions` sessions: the draining pod on `cores.0`, its peer on
/// `cores.1` (two pods of a Deployment run on two nodes; the load client is idle meanwhile).
pub(crate) async fn handoff(sessions: usize, cores: (usize, usize)) -> Outcome<Handoff> {
    let ips: Vec<Ipv4Addr> = (0..2).map(|_| tether_tests::addr::next_ip()).collect();
    let cluster = Cluster::start(&ips, spec(sessions))
        .await
        .map_err(|e| format!("the handoff pods: {e}"))?;
    pin_pod(&cluster.pods[0], cores.0);
    pin_pod(&cluster.pods[1], cores.1);
    let first = cluster.client_of(&ips[..1]);
    let made = prepare(&first, sessions, "h").await?;
    let held = cluster.pods[0]
        .metric("tether_sessions")
        .await
        .map_err(|e| e.to_string())? as u64;
    let drained = cluster.pods[0].drain().await.map_err(|e| e.to_string())?;
    if !drained.done {
        return Err(format!("the drain did not finish: {}", drained.body));
    }
    let moved = drained.body["handedOff"].as_u64().unwrap_or(0);
    let took = Duration::from_millis(drained.body["elapsedMs"].as_u64().unwrap_or(0));
    let second = cluster.client_of(&ips[1..]);
    let answered = futures::stream::iter(&made)
        .map(|(session, _)| ping(&second, session))
        .buffer_unordered(PREPARE_CONCURRENCY)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    Ok(Handoff {
        sessions,
        held,
        moved,
        took,
        errors: (sessions - answered) as u64,
    })
}

/// Creates `count` sessions through `client`, each with a `stream` call read to its end: each
/// session and the id of its call's first event.
async fn prepare(client: &McpClient, count: usize, tag: &str) -> Outcome<Vec<(Session, String)>> {
    futures::stream::iter(0..count)
        .map(|i| {
            let call_id = format!("{tag}{i}");
            async move {
                let session = client
                    .initialize("2025-11-25")
                    .await
                    .map_err(|e| e.to_string())?;
                let call = tool_call(
                    1,
                    "stream",
                    json!({"count": EVENTS, "call_id": call_id}),
                    None,
                );
                let resp = client
                    .post(Some(&session), &call, &[])
                    .await
                    .map_err(|e| e.to_string())?;
                if resp.status() != StatusCode::OK {
                    return Err(format!("a stream call answered {}", resp.status()));
                }
                let events = Events::new(resp)
                    .rest(EXCHANGE_TIMEOUT)
                    .await
                    .map_err(|e| e.to_string())?;
                let first = events
                    .iter()
                    .find(|e| e.data.as_deref().is_some_and(|d| !d.is_empty()))
                    .and_then(|e| e.id.clone())
                    .ok_or("a stream call's first event has no id")?;
                Ok((session, first))
            }
        })
        .buffer_unordered(PREPARE_CONCURRENCY)
        .collect::<Vec<Outcome<_>>>()
        .await
        .into_iter()
        .collect()
}

/// Resumes `session`'s call after `cursor`: the time to the first body byte, once the whole
/// replay was checked (progress events 2 to [`EVENTS`], then the result).
async fn resume(client: &McpClient, session: &Session, cursor: &str) -> Outcome<Duration> {
    let sent = Instant::now();
    let resp = client
        .get(session, Some(cursor))
        .await
        .map_err(|e| e.to_string())?;
    if resp.status() != StatusCode::OK {
        return Err(format!("the resume answered {}", resp.status()));
    }
    let mut body = resp.into_body();
    let mut text = Vec::new();
    let mut first_byte = None;
    loop {
        let frame = tokio::time::timeout(EXCHANGE_TIMEOUT, body.frame())
            .await
            .map_err(|_| "the replay stalled".to_owned())?;
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| e.to_string())?;
        if let Some(data) = frame.data_ref().filter(|d| !d.is_empty()) {
            first_byte.get_or_insert_with(|| sent.elapsed());
            text.extend_from_slice(data);
        }
    }
    let latency = first_byte.ok_or("the replay was empty")?;
    let replayed = replayed_messages(&text)?;
    let seqs: Vec<u64> = replayed
        .iter()
        .filter_map(|m| m.pointer("/params/seq").and_then(Value::as_u64))
        .collect();
    let result = replayed
        .last()
        .and_then(|m| m.pointer("/result/content/0/text"))
        .and_then(Value::as_str);
    if seqs != (2..=EVENTS).collect::<Vec<_>>() || result != Some(&format!("done {EVENTS}")) {
        return Err(format!(
            "the replay after {cursor} carried events {seqs:?} and result {result:?}"
        ));
    }
    Ok(latency)
}

/// The JSON messages of an SSE body's `data:` lines.
fn replayed_messages(text: &[u8]) -> Outcome<Vec<Value>> {
    String::from_utf8_lossy(text)
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| serde_json::from_str(data.trim()).map_err(|e| format!("a replayed event: {e}")))
        .collect()
}

/// Whether `session` answers a `ping` through `client` (request id 2: the session's second
/// request; a reused id would be a retry).
async fn ping(client: &McpClient, session: &Session) -> bool {
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
    match client.post_text(Some(session), &body).await {
        Ok((status, text)) => status == StatusCode::OK && text.contains("\"result\""),
        Err(_) => false,
    }
}

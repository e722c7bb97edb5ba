//! Streams and the replay buffer through a real pod (spec R-03, R-05, L-01, T-09, T-11;
//! `docs/design/architecture.md`), and the limits on them: an oversized upstream event, a client
//! that stops reading.

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};
use tether_tests::call::{self, CallPlan, slow_body};
use tether_tests::client::{
    ACCEPT_BOTH, Events, McpClient, Session, body_text, header_str, messages, result_text,
};
use tether_tests::pod::{LISTEN_PORT, Pod, PodSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// `count` progress notifications `interval_ms` apart, cut after each of `cuts` messages and
/// resumed 50 ms later.
fn plan(count: u32, interval_ms: u64, cuts: Vec<u32>) -> CallPlan {
    CallPlan {
        cuts,
        pause: Duration::from_millis(50),
        ..CallPlan::steady(count, interval_ms)
    }
}

/// Reads message events (id, parsed data) until `n` arrived; priming events are returned with
/// `Value::Null` data.
async fn take(events: &mut Events, n: usize) -> Vec<(Option<String>, Value)> {
    let mut out = Vec::new();
    let mut messages = 0;
    while messages < n {
        let ev = events
            .next_within(Duration::from_secs(10))
            .await
            .expect("event");
        let data = ev.data.unwrap_or_default();
        if data.is_empty() {
            out.push((ev.id, Value::Null));
        } else {
            messages += 1;
            out.push((ev.id, serde_json::from_str(&data).unwrap()));
        }
    }
    out
}

async fn stats_executions(pod: &Pod, call_id: &str) -> (u64, bool) {
    let stats = pod.stats().await.unwrap();
    (
        stats["executions"].as_u64().unwrap(),
        stats["duplicates"].get(call_id).is_some(),
    )
}

#[tokio::test]
async fn r03_l01_resume_is_strictly_after_the_cursor_and_a_disconnect_is_not_a_cancel() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    for version in ["2025-03-26", "2025-06-18", "2025-11-25"] {
        let session = client.initialize(version).await.unwrap();
        let out = call::slow(
            &client,
            &session,
            2,
            &format!("r03-{version}"),
            &plan(10, 50, vec![2]),
        )
        .await
        .unwrap();
        assert!(out.failures.is_empty(), "{:?}", out.failures);
        assert_eq!(
            out.progress,
            (1..=10).collect::<Vec<_>>(),
            "{version}: every progress once, in order"
        );
        assert_eq!(out.result.as_deref(), Some("done 10"));
        assert_eq!((out.duplicated, out.foreign), (0, 0));
        assert_eq!(out.resumes.len(), 1);
    }
    let stats = pod.stats().await.unwrap();
    assert_eq!(
        stats["aborted"], 0,
        "the tool was never cancelled by a disconnect"
    );
    assert_eq!(stats["completed"], 3);
}

#[tokio::test]
async fn r03_events_produced_while_disconnected_are_replayed() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let resp = client
        .post(Some(&session), &slow_body(2, "gap", 6, 40), &[])
        .await
        .unwrap();
    let mut events = Events::new(resp);
    let first = take(&mut events, 2).await;
    let cursor = first.last().unwrap().0.clone().unwrap();
    drop(events);
    // The whole call finishes while nobody listens.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let resp = client.get(&session, Some(&cursor)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let rest = messages(resp, Duration::from_secs(5)).await.unwrap();
    let progress: Vec<f64> = rest
        .iter()
        .filter_map(|m| m.pointer("/params/progress").and_then(Value::as_f64))
        .collect();
    assert_eq!(progress, vec![3.0, 4.0, 5.0, 6.0]);
    assert!(
        rest.last().unwrap()["result"].is_object(),
        "the response is replayed too"
    );
    // Resuming from the last event: nothing after it, and the stream ends at once.
    let resp = client.get(&session, Some(&cursor)).await.unwrap();
    assert_eq!(
        messages(resp, Duration::from_secs(5)).await.unwrap().len(),
        5
    );
}

#[tokio::test]
async fn fr11_event_ids_are_distinct_and_increase_per_stream() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let resp = client
        .post(Some(&session), &slow_body(2, "ids", 5, 10), &[])
        .await
        .unwrap();
    let mut events = Events::new(resp);
    let all = take(&mut events, 6).await;
    let ids: Vec<(String, u64)> = all
        .iter()
        .map(|(id, _)| {
            let (key, seq) = id.as_deref().unwrap().rsplit_once('-').unwrap();
            (key.to_owned(), seq.parse().unwrap())
        })
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0].0 == w[1].0 && w[0].1 < w[1].1),
        "{ids:?}"
    );
}

#[tokio::test]
async fn r05_fr20_priming_only_for_2025_11_25() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    for (version, primed) in [
        ("2025-06-18", false),
        ("2025-03-26", false),
        ("2025-11-25", true),
    ] {
        let session = client.initialize(version).await.unwrap();
        let resp = client
            .post(Some(&session), &slow_body(2, version, 2, 10), &[])
            .await
            .unwrap();
        let mut events = Events::new(resp);
        let first = events.next_within(Duration::from_secs(5)).await.unwrap();
        let empty = first.data.as_deref().unwrap_or("").is_empty();
        assert_eq!(empty, primed, "{version}: first frame {first:?}");
        if primed {
            assert!(first.id.is_some(), "the priming event carries an id");
        }
    }
}

#[tokio::test]
async fn fr9_t11_a_resume_never_yields_another_sessions_or_streams_events() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let s1 = client.initialize("2025-11-25").await.unwrap();
    let s2 = client.initialize("2025-11-25").await.unwrap();
    // Both sessions use JSON-RPC id 2 and the same progress token on purpose.
    let r1 = client
        .post(Some(&s1), &slow_body(2, "same", 4, 50), &[])
        .await
        .unwrap();
    let r2 = client
        .post(Some(&s2), &slow_body(2, "same", 4, 50), &[])
        .await
        .unwrap();
    let mut e1 = Events::new(r1);
    let s1_first = take(&mut e1, 1).await;
    let s1_cursor = s1_first.last().unwrap().0.clone().unwrap();
    drop(e1);
    let s2_all = messages(r2, Duration::from_secs(5)).await.unwrap();
    assert_eq!(s2_all.len(), 5);
    // S1's cursor is refused in S2 (another session's stream).
    let resp = client.get(&s2, Some(&s1_cursor)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(body_text(resp).await.unwrap().contains("unknown_cursor"));
    // S1 resumes its own stream: only its own events, each once.
    let resp = client.get(&s1, Some(&s1_cursor)).await.unwrap();
    let rest = messages(resp, Duration::from_secs(5)).await.unwrap();
    assert_eq!(rest.len(), 4, "3 progress + result: {rest:?}");
    let stats = pod.stats().await.unwrap();
    assert_eq!(
        stats["duplicates"]["same"], 2,
        "two sessions, one call each (same call id on purpose)"
    );
}

#[tokio::test]
async fn cursor_errors_are_400_never_an_empty_200() {
    let pod = Pod::start(PodSpec {
        max_events: 3,
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    // The client reads the whole call: its replay window keeps the last 3 of the 9 events.
    let resp = client
        .post(Some(&session), &slow_body(2, "evict", 8, 10), &[])
        .await
        .unwrap();
    let mut events = Events::new(resp);
    let first = take(&mut events, 9).await;
    drop(events);
    let key_of = |id: &str| id.rsplit_once('-').unwrap().0.to_owned();
    let key = key_of(first[0].0.as_deref().unwrap());
    let cases = [
        ("not-a-cursor".to_owned(), "malformed_cursor"),
        (format!("{key}-1"), "cursor_evicted"),
        (format!("{key}-99"), "unknown_cursor"),
        ("abcdefghijkl-1".to_owned(), "unknown_cursor"),
    ];
    for (cursor, reason) in cases {
        let resp = client.get(&session, Some(&cursor)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{cursor}");
        let body = body_text(resp).await.unwrap();
        assert!(body.contains(reason), "{cursor}: {body}");
    }
    // The last retained events are still served.
    let resp = client
        .get(&session, Some(&format!("{key}-7")))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        messages(resp, Duration::from_secs(5)).await.unwrap().len(),
        2
    );
    // The window is trimmed as events arrive: the last one sent may still be beside three
    // older ones.
    let evicted = pod
        .metric("tether_buffer_evictions_total{reason=\"count\"}")
        .await
        .unwrap();
    assert!((5.0..=6.0).contains(&evicted), "{evicted} evictions");
}

#[tokio::test]
async fn fr14_sse_headers_and_each_event_flushed_at_once() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let resp = client
        .post(Some(&session), &slow_body(2, "flush", 4, 300), &[])
        .await
        .unwrap();
    assert_eq!(
        header_str(&resp, "x-accel-buffering").as_deref(),
        Some("no")
    );
    assert!(
        header_str(&resp, "cache-control")
            .unwrap()
            .contains("no-cache")
    );
    let mut events = Events::new(resp);
    let mut arrivals = Vec::new();
    for _ in 0..4 {
        events.next_within(Duration::from_secs(5)).await.unwrap();
        arrivals.push(Instant::now());
    }
    // 300 ms apart at the source: a sidecar that buffers would deliver them in one burst.
    let spread = arrivals[3] - arrivals[0];
    assert!(
        spread > Duration::from_millis(600),
        "progress must arrive as produced, not in a burst: {spread:?}"
    );
}

#[tokio::test]
async fn t09_standalone_stream_buffers_and_a_new_get_takes_over() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let mut first = client.standalone(&session).await.unwrap();
    let msgs = client
        .call(&session, 2, "notify", json!({"text": "hi", "count": 3}))
        .await
        .unwrap();
    assert!(msgs.iter().any(|m| m["result"].is_object()));
    let got = take(&mut first, 3).await;
    let seqs: Vec<i64> = got
        .iter()
        .map(|(_, v)| v["params"]["data"]["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    // A second GET takes the stream over; the first connection ends cleanly (never 409).
    let second = client.get(&session, None).await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    assert!(
        first.next_within(Duration::from_secs(5)).await.is_none(),
        "the old connection ends"
    );
    let mut second = Events::new(second);
    client
        .call(&session, 3, "notify", json!({"text": "again", "count": 2}))
        .await
        .unwrap();
    let got = take(&mut second, 2).await;
    assert!(
        got.iter()
            .all(|(_, v)| v["params"]["data"]["text"] == "again"),
        "{got:?}"
    );
    // Messages sent while no GET is connected are kept: the client resumes the GET stream.
    let cursor = got.last().unwrap().0.clone().unwrap();
    drop(second);
    client
        .call(
            &session,
            4,
            "notify",
            json!({"text": "offline", "count": 2}),
        )
        .await
        .unwrap();
    let mut third = Events::new(client.get(&session, Some(&cursor)).await.unwrap());
    let got = take(&mut third, 2).await;
    assert!(
        got.iter()
            .all(|(_, v)| v["params"]["data"]["text"] == "offline"),
        "{got:?}"
    );
}

#[tokio::test]
async fn t09_fr17_405_is_passed_through_when_the_upstream_has_no_get_stream() {
    let pod = Pod::start(PodSpec {
        server_args: vec!["--no-standalone-stream".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    for _ in 0..2 {
        let resp = client.get(&session, None).await.unwrap();
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert!(header_str(&resp, "allow").is_some());
    }
    // POST streams and their resumes still work.
    let out = call::slow(&client, &session, 2, "no-get", &plan(4, 30, vec![1]))
        .await
        .unwrap();
    assert_eq!(out.lost(4), 0, "{:?}", out.failures);
}

#[tokio::test]
async fn sep1699_an_upstream_that_closes_early_is_resumed_invisibly() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let mut p = plan(6, 50, vec![]);
    p.close_after = Some(2);
    let out = call::slow(&client, &session, 2, "polling", &p)
        .await
        .unwrap();
    assert_eq!(out.progress, (1..=6).collect::<Vec<_>>());
    assert_eq!(out.result.as_deref(), Some("done 6"));
    assert_eq!(out.resumes.len(), 0, "the client saw one unbroken stream");
    assert_eq!(
        pod.metric("tether_upstream_resumes_total").await.unwrap(),
        1.0
    );
    assert_eq!(stats_executions(&pod, "polling").await, (1, false));
}

#[tokio::test]
async fn retries_attach_to_the_stream_and_the_tool_runs_once() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let body = slow_body(2, "retried", 5, 40);
    let first = client.post(Some(&session), &body, &[]).await.unwrap();
    let mut events = Events::new(first);
    take(&mut events, 1).await;
    drop(events);
    // The client did not see the rest and retries the same request.
    let again = client.post(Some(&session), &body, &[]).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    let msgs = messages(again, Duration::from_secs(5)).await.unwrap();
    let progress: Vec<f64> = msgs
        .iter()
        .filter_map(|m| m.pointer("/params/progress").and_then(Value::as_f64))
        .collect();
    assert_eq!(
        progress,
        vec![1.0, 2.0, 3.0, 4.0, 5.0],
        "the retry replays the stream"
    );
    assert!(msgs.last().unwrap()["result"].is_object());
    assert_eq!(
        stats_executions(&pod, "retried").await,
        (1, false),
        "executed once"
    );
    assert_eq!(
        pod.metric(r#"tether_request_id_reuse_total{outcome="joined"}"#)
            .await
            .unwrap(),
        1.0
    );
}

#[tokio::test]
async fn concurrent_duplicate_posts_run_the_tool_once() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let body = slow_body(2, "racing", 3, 20);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (client, session, body) = (client.clone(), session.clone(), body.clone());
        tasks.spawn(async move {
            let resp = client.post(Some(&session), &body, &[]).await.unwrap();
            (
                resp.status(),
                messages(resp, Duration::from_secs(5)).await.unwrap(),
            )
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (status, msgs) = done.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert!(
            msgs.iter().any(|m| m["id"] == 2 && m["result"].is_object()),
            "{msgs:?}"
        );
    }
    assert_eq!(stats_executions(&pod, "racing").await, (1, false));
}

#[tokio::test]
async fn fr19_cancellation_is_forwarded_and_ends_the_stream() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let resp = client
        .post(Some(&session), &slow_body(2, "cancelled", 50, 50), &[])
        .await
        .unwrap();
    let mut events = Events::new(resp);
    take(&mut events, 1).await;
    let cancel =
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}});
    let resp = client.post(Some(&session), &cancel, &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    // The stream ends without the result, well before the 50 progress events.
    let started = Instant::now();
    while events.next_within(Duration::from_secs(5)).await.is_some() {}
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let stats = pod
        .wait_for_stats(Duration::from_secs(5), |stats| stats["aborted"] == 1)
        .await
        .unwrap();
    assert_eq!(
        stats["aborted"], 1,
        "the upstream stopped the tool: {stats}"
    );
}

#[tokio::test]
async fn a_client_that_cuts_often_still_gets_everything_once() {
    let pod = Pod::start_default().await.unwrap();
    let client: McpClient = pod.client();
    let session: Session = client.initialize("2025-11-25").await.unwrap();
    let out = call::slow(
        &client,
        &session,
        2,
        "choppy",
        &plan(20, 10, vec![1, 3, 5, 8, 13, 19]),
    )
    .await
    .unwrap();
    assert_eq!(out.lost(20), 0, "{:?}", out.failures);
    assert_eq!((out.duplicated, out.foreign), (0, 0));
    assert_eq!(out.resumes.len(), 6);
}

#[tokio::test]
async fn integral_float_request_ids_complete_their_stream() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let body: Value = serde_json::from_str(
        r#"{"jsonrpc":"2.0","id":1e2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}"#,
    )
    .unwrap();
    let started = Instant::now();
    let resp = client.post(Some(&session), &body, &[]).await.unwrap();
    let msgs = messages(resp, Duration::from_secs(10)).await.unwrap();
    assert_eq!(msgs.len(), 1, "one answer, no synthesized error: {msgs:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_pod_buffer_cap_holds() {
    let pod = Pod::start(PodSpec {
        sidecar_args: vec!["--pod-buffer-bytes".into(), "20000".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    for id in 0..20 {
        let msgs = client
            .call(&session, 10 + id, "echo", json!({"text": "x".repeat(5000)}))
            .await
            .unwrap();
        assert_eq!(msgs.len(), 1);
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let bytes = pod.metric("tether_buffer_bytes").await.unwrap();
    assert!(
        bytes <= 20000.0,
        "buffered {bytes} bytes over a 20000-byte cap"
    );
    assert!(
        pod.metric("tether_buffer_evictions_total{reason=\"pod_cap\"}")
            .await
            .unwrap()
            > 0.0
    );
}

#[tokio::test]
async fn r01_ids_stay_unique_across_resumes_and_priming() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let resp = client
        .post(Some(&session), &slow_body(2, "uniq", 3, 10), &[])
        .await
        .unwrap();
    let mut events = Events::new(resp);
    let mut seen = Vec::new();
    while let Some(ev) = events.next_within(Duration::from_secs(5)).await {
        seen.push(ev.id.unwrap());
    }
    assert_eq!(seen.len(), 5, "priming, 3 progress, result: {seen:?}");
    // Resuming at the end: a fresh priming event whose id was never used before.
    let last = seen.last().unwrap().clone();
    let mut events = Events::new(client.get(&session, Some(&last)).await.unwrap());
    let priming = events.next_within(Duration::from_secs(5)).await.unwrap();
    assert_eq!(priming.data.as_deref(), Some(""));
    let id = priming.id.unwrap();
    assert!(!seen.contains(&id), "{id} reused");
    // Resuming from the middle: no priming ahead of the events still to come.
    let mut events = Events::new(client.get(&session, Some(&seen[1])).await.unwrap());
    let next = events.next_within(Duration::from_secs(5)).await.unwrap();
    assert_eq!(next.id.as_deref(), Some(seen[2].as_str()));
    assert!(!next.data.unwrap().is_empty());
}

#[tokio::test]
async fn an_upstream_event_over_the_limit_ends_its_call_and_spares_other_sessions() {
    let mut pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let big = client.initialize("2025-11-25").await.unwrap();
    let other = client.initialize("2025-11-25").await.unwrap();
    // A 5 MiB answer while another session's call streams; the limit is 4 MiB.
    let oversized = client.call(&big, 3, "echo", json!({"text": "x", "repeat": 5 << 20}));
    let cut_once = plan(20, 20, vec![5]);
    let steady = call::slow(&client, &other, 2, "spared", &cut_once);
    let (oversized, steady) = tokio::join!(oversized, steady);
    let messages = oversized.unwrap();
    let answer = messages
        .iter()
        .find(|m| m["id"] == 3)
        .unwrap_or_else(|| panic!("no answer for id 3 in {messages:.300?}\n{}", pod.logs()));
    assert_eq!(
        answer["error"]["data"]["reason"], "event_too_large",
        "{answer:.300}"
    );
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("event_too_large") && message.contains("4194304"),
        "{message}"
    );
    let steady = steady.unwrap();
    assert_eq!(steady.lost(20), 0, "{:?}", steady.failures);
    assert_eq!(
        pod.metric("tether_upstream_events_too_large_total")
            .await
            .unwrap(),
        1.0
    );
    // The session that got the error goes on.
    let after = client
        .call(&big, 4, "echo", json!({"text": "after"}))
        .await
        .unwrap();
    assert!(
        after.iter().any(|m| result_text(m) == Some("after")),
        "{after:?}"
    );
    assert!(pod.sidecar_running().unwrap(), "{}", pod.logs());
}

/// Reads `conn` until `marker` arrived; returns everything read.
async fn read_until(conn: &mut TcpStream, marker: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0; 1024];
    while !got.windows(marker.len()).any(|w| w == marker) {
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("the sidecar answers")
            .expect("the connection stays open");
        assert!(n > 0, "closed before {marker:?}: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    got
}

#[tokio::test]
async fn r03_a_client_that_stops_reading_is_cut_and_resumes_from_the_buffer() {
    const EVENTS: u32 = 50_000;
    let mut pod = Pod::start(PodSpec {
        max_events: 2 * EVENTS,
        max_bytes: 64 << 20,
        sidecar_args: vec!["--client-write-timeout".into(), "1s".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    // A client with a small receive window reads the response head and the priming event of a
    // 50,000-event call, then nothing more.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket.connect((pod.ip, LISTEN_PORT).into()).await.unwrap();
    let body = slow_body(2, "unread", EVENTS, 0).to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: x\r\naccept: {ACCEPT_BOTH}\r\ncontent-type: application/json\r\n\
         mcp-session-id: {}\r\nmcp-protocol-version: {}\r\ncontent-length: {}\r\n\r\n{body}",
        session.id,
        session.version,
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let head = String::from_utf8_lossy(&read_until(&mut conn, b"data:\n\n").await).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let priming = head
        .lines()
        .find_map(|l| l.strip_prefix("id: "))
        .unwrap_or_else(|| panic!("no priming event in {head}"))
        .to_owned();
    assert!(priming.ends_with("-0"), "{priming}");
    // The sidecar's writes wait for it, time out, and the connection is closed.
    let cut = pod
        .wait_for_metric(
            "tether_client_write_timeouts_total",
            Duration::from_secs(120),
            |v| v >= 1.0,
        )
        .await
        .unwrap();
    assert_eq!(cut, 1.0, "{}", pod.logs());
    let mut rest = [0; 65536];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), conn.read(&mut rest)).await {
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(_)) => {}
            Err(_) => panic!("the connection of a client that stopped reading stays open"),
        }
    }
    // A resume after the priming event replays the whole call from the buffer, in order.
    let resp = client.get(&session, Some(&priming)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut events = Events::new(resp);
    let mut last_seq = 0;
    let mut progress = 0;
    let mut result = None;
    while let Some(ev) = events.next_within(Duration::from_secs(30)).await {
        let Some(text) = ev.data.filter(|d| !d.is_empty()) else {
            continue; // the priming event
        };
        let data: Value = serde_json::from_str(&text).unwrap();
        let seq: u64 = ev
            .id
            .as_deref()
            .and_then(|id| id.rsplit_once('-'))
            .and_then(|(_, seq)| seq.parse().ok())
            .unwrap();
        assert_eq!(seq, last_seq + 1, "events in order, none missing");
        last_seq = seq;
        if data["method"] == "notifications/progress" {
            progress += 1;
        } else if data["id"] == 2 {
            result = result_text(&data).map(str::to_owned);
        }
    }
    assert_eq!(progress, EVENTS, "{}", pod.logs());
    assert_eq!(result.as_deref(), Some(format!("done {EVENTS}").as_str()));
    assert!(pod.sidecar_running().unwrap(), "{}", pod.logs());
}

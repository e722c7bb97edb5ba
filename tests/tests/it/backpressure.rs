//! Backpressure instead of loss (`docs/design/buffering.md#backpressure`): an MCP server that
//! writes faster than its client reads, a stream nobody reads for a while, and a pod whose
//! buffers are full of events nobody was sent. The MCP server is `tether-bench-origin`, which
//! writes a `stream` call's events as fast as the connection takes them; every event carries
//! its number (`params.seq`), so a loss, a duplicate or a reordering shows.

use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};
use tether_tests::client::{Events, McpClient, Session, header_str, json_error, tool_call};
use tether_tests::pod::{Pod, PodSpec, Upstream};

/// A pod in front of `tether-bench-origin` whose streams keep at most `max_events` events.
async fn pod(max_events: u32, sidecar_args: &[&str]) -> Pod {
    Pod::start(PodSpec {
        server: Upstream::Origin,
        max_events,
        sidecar_args: sidecar_args.iter().map(|a| (*a).to_owned()).collect(),
        ..PodSpec::default()
    })
    .await
    .unwrap()
}

/// What a client read of a `stream` call.
#[derive(Debug, Default)]
struct Read {
    /// `params.seq` of every progress event, in arrival order.
    seqs: Vec<u64>,
    /// The result's text, when it arrived.
    result: Option<String>,
    /// The id of the last event that had one (where a resume starts).
    last_id: Option<String>,
    /// The response ended (cleanly or not) before the result.
    cut: bool,
}

impl Read {
    /// Whether the events were exactly 1..=count, once each, in order.
    fn is_complete(&self, count: u64) -> bool {
        self.seqs.len() as u64 == count && self.seqs.iter().copied().eq(1..=count)
    }
}

/// Reads `events` until the result, at most `limit` progress events (then stops reading, with
/// the connection still open), sleeping `pause` after every `every` events: a reader slower than
/// the MCP server.
async fn read(events: &mut Events, into: &mut Read, limit: usize, every: usize, pause: Duration) {
    let mut taken = 0;
    while taken < limit {
        let Some(ev) = events.next_within(Duration::from_secs(30)).await else {
            into.cut = true;
            return;
        };
        if ev.id.is_some() {
            into.last_id.clone_from(&ev.id);
        }
        let Some(data) = ev.data.filter(|d| !d.is_empty()) else {
            continue;
        };
        let message: Value = serde_json::from_str(&data).unwrap();
        if let Some(seq) = message.pointer("/params/seq").and_then(Value::as_u64) {
            into.seqs.push(seq);
            taken += 1;
            if every > 0 && taken % every == 0 {
                tokio::time::sleep(pause).await;
            }
        } else {
            let text = message
                .pointer("/result/content/0/text")
                .and_then(Value::as_str);
            into.result = Some(text.unwrap_or("<no text>").to_owned());
            return;
        }
    }
}

/// POSTs a `stream` call of `count` events of `size` padding bytes, `interval_us` apart (0: as
/// fast as the connection takes them); its events.
async fn start(
    client: &McpClient,
    session: &Session,
    id: u64,
    (count, size, interval_us): (u64, u64, u64),
) -> Events {
    let body = tool_call(
        id,
        "stream",
        json!({"count": count, "size": size, "interval_us": interval_us, "call_id": format!("bp-{id}")}),
        None,
    );
    let resp = client.post(Some(session), &body, &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    Events::new(resp)
}

#[tokio::test]
async fn a_fast_producer_and_a_slow_reader_lose_nothing_and_the_producer_waits() {
    let pod = pod(256, &[]).await;
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let count = 100_000;
    let mut events = start(&client, &session, 2, (count, 0, 0)).await;
    let mut got = Read::default();
    read(
        &mut events,
        &mut got,
        usize::MAX,
        250,
        Duration::from_millis(2),
    )
    .await;
    assert!(!got.cut, "the sidecar closed the connection: {got:?}");
    assert!(
        got.is_complete(count),
        "{} events, first gaps near {:?}",
        got.seqs.len(),
        got.seqs.windows(2).find(|w| w[1] != w[0] + 1)
    );
    assert_eq!(got.result.as_deref(), Some("done 100000"));
    assert!(events.next_within(Duration::from_secs(5)).await.is_none());
    let paused = pod.metric("tether_upstream_paused_total").await.unwrap();
    assert!(paused > 0.0, "the upstream was never held back");
    let stats = pod.stats().await.unwrap();
    assert_eq!(stats["completed"], 1, "{stats}");
}

#[tokio::test]
async fn events_nobody_reads_wait_for_the_resume_and_arrive_once() {
    // A replay window of 1,024 events covers what was on its way when the client left: the
    // server writes one event every 50 µs, so the events sent between the client's 100th read and
    // its leaving stay well within it even on a busy machine (at full speed, thousands can be in
    // the connection's buffers by then, and the resume would rightly be refused as evicted).
    let pod = pod(1024, &[]).await;
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let count = 20_000;
    let mut events = start(&client, &session, 2, (count, 100, 50)).await;
    let mut got = Read::default();
    read(&mut events, &mut got, 100, 0, Duration::ZERO).await;
    drop(events);
    assert_eq!(got.seqs.len(), 100);
    // Nobody reads now: the stream fills with 1,024 unsent events and the upstream waits.
    let paused = pod
        .wait_for_metric(
            "tether_upstream_paused_streams",
            Duration::from_secs(10),
            |v| v >= 1.0,
        )
        .await
        .unwrap();
    assert_eq!(paused, 1.0);
    let buffered = pod
        .wait_for_metric("tether_buffer_events", Duration::from_secs(5), |v| {
            v >= 1024.0
        })
        .await
        .unwrap();
    assert!(
        buffered <= 2049.0,
        "{buffered} events: more than a replay window and a stream's unsent bound"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let resp = client.get(&session, got.last_id.as_deref()).await.unwrap();
    if resp.status() != StatusCode::OK {
        let refused = json_error(resp).await.unwrap();
        panic!("the resume from {:?} was refused: {refused:?}", got.last_id);
    }
    let mut events = Events::new(resp);
    read(&mut events, &mut got, usize::MAX, 0, Duration::ZERO).await;
    assert!(
        got.is_complete(count),
        "{} events, first gap near {:?}",
        got.seqs.len(),
        got.seqs.windows(2).find(|w| w[1] != w[0] + 1)
    );
    assert_eq!(got.result.as_deref(), Some("done 20000"));
    let evicted_unsent = pod
        .metric(r#"tether_buffer_evictions_total{reason="ttl"}"#)
        .await
        .unwrap();
    assert_eq!(evicted_unsent, 0.0);
}

#[tokio::test]
async fn a_pod_full_of_unsent_events_pauses_its_streams_and_refuses_new_requests() {
    // 256 KiB for the pod; each stream could take 4 MiB.
    let pod = pod(100_000, &["--pod-retained-bytes", "262144"]).await;
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    // 20,000 events of 200 bytes each: 4 MB per stream, more than the sockets hold. They come
    // 50 µs apart, so the first stream alone needs most of a second to fill the sockets and
    // then the pod: time for all four to start (a request that finds the pod full is refused,
    // below).
    let (streams, count) = (4u64, 20_000u64);
    // Four readers that read one event each, then stop reading (their connections stay).
    let mut readers = Vec::new();
    for i in 0..streams {
        let mut events = start(&client, &session, 10 + i, (count, 200, 50)).await;
        let mut got = Read::default();
        read(&mut events, &mut got, 1, 0, Duration::ZERO).await;
        readers.push((events, got));
    }
    let paused = pod
        .wait_for_metric(
            "tether_upstream_paused_streams",
            Duration::from_secs(20),
            |v| v >= streams as f64,
        )
        .await
        .unwrap();
    assert_eq!(paused, streams as f64, "every stream waits for room");
    // What was sent to the readers' sockets is evicted for the budget; then the events nobody
    // was sent take all of it but the session's journal and retry records (the same budget).
    let unsent = pod
        .wait_for_metric("tether_buffer_unsent_bytes", Duration::from_secs(10), |v| {
            v >= 262_144.0 - 2_048.0
        })
        .await
        .unwrap();
    assert!(unsent >= 262_144.0 - 2_048.0, "{unsent} unsent bytes");
    let used = pod
        .metric(r#"tether_retained_bytes{kind="buffers"}"#)
        .await
        .unwrap();
    assert!(
        used <= 262_144.0 + streams as f64 * 1_024.0,
        "{used} bytes buffered beyond the pod's cap and the events the streams held"
    );
    // A new request would need buffer room too: refused, with a time to come back.
    let echo = tool_call(99, "echo", json!({"text": "hi"}), None);
    let resp = client.post(Some(&session), &echo, &[]).await.unwrap();
    let retry_after = header_str(&resp, "retry-after");
    let (status, body) = json_error(resp).await.unwrap();
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body.pointer("/data/reason"), Some(&json!("pod_full")));
    assert_eq!(retry_after.as_deref(), Some("1"));
    // The readers read on and get every event: nothing unsent was evicted for the cap.
    for (events, got) in &mut readers {
        read(events, got, usize::MAX, 0, Duration::ZERO).await;
        assert!(!got.cut);
        assert!(got.is_complete(count), "{} events", got.seqs.len());
        assert_eq!(got.result.as_deref(), Some("done 20000"));
    }
    let resp = client.post(Some(&session), &echo, &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "room again");
}

/// The first event id of the stream whose last event id is `last` (`<key>-<seq>`).
fn first_id(last: &str) -> String {
    let (key, _) = last.rsplit_once('-').unwrap();
    format!("{key}-1")
}

#[tokio::test]
async fn a_session_keeps_its_share_and_its_oldest_completed_streams_go_first() {
    // Each session may buffer 64 KiB; each call's 100 events of ~300 bytes take ~30 KiB.
    let pod = pod(1_000, &["--max-session-buffer-bytes", "65536"]).await;
    let client = pod.client();
    let (a, b) = (
        client.initialize("2025-11-25").await.unwrap(),
        client.initialize("2025-11-25").await.unwrap(),
    );
    let mut last_ids = Vec::new();
    for id in 1..=4 {
        let mut events = start(&client, &a, id, (100, 200, 0)).await;
        let mut got = Read::default();
        read(&mut events, &mut got, usize::MAX, 0, Duration::ZERO).await;
        assert!(got.is_complete(100) && got.result.is_some(), "{got:?}");
        last_ids.push(got.last_id.unwrap());
    }
    let mut events = start(&client, &b, 9, (100, 200, 0)).await;
    let mut in_b = Read::default();
    read(&mut events, &mut in_b, usize::MAX, 0, Duration::ZERO).await;
    let evicted = pod
        .wait_for_metric(
            r#"tether_buffer_evictions_total{reason="session_cap"}"#,
            Duration::from_secs(5),
            |v| v > 0.0,
        )
        .await
        .unwrap();
    assert!(evicted >= 100.0, "{evicted} events evicted for the share");
    let buffered = pod.metric("tether_buffer_bytes").await.unwrap();
    assert!(
        buffered <= 2.0 * 65_536.0 + 2_048.0,
        "{buffered} bytes buffered for two sessions of 64 KiB"
    );
    // The oldest completed call of A lost its events; its newest keeps them all; B, within
    // its share, lost nothing.
    let resume = |session: Session, last: String| {
        let client = client.clone();
        async move {
            let resp = client.get(&session, Some(&first_id(&last))).await.unwrap();
            let status = resp.status();
            let body = tether_tests::client::body_text(resp).await.unwrap();
            (status, body)
        }
    };
    let (status, body) = resume(a.clone(), last_ids[0].clone()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("cursor_evicted"), "{body}");
    for (session, last) in [
        (a.clone(), last_ids[3].clone()),
        (b.clone(), in_b.last_id.unwrap()),
    ] {
        let (status, body) = resume(session, last).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(
            body.contains(r#""seq":100"#) && body.contains(r#""seq":2,"#),
            "{body}"
        );
    }
}

//! What a session keeps as it serves many requests (`docs/design/buffering.md#retries`): a
//! bounded window of answered requests replayable to retries, tombstones for the ones it
//! forgot (never a second execution), buffers that stay bounded over thousands of calls, and
//! nothing left after `DELETE`. The MCP server is `tether-bench-origin`, which counts the
//! executions of every `call_id`.

use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};
use tether_tests::client::{Events, McpClient, Session, result_text, tool_call};
use tether_tests::pod::{Pod, PodSpec, Upstream};

async fn origin_pod() -> Pod {
    Pod::start(PodSpec {
        server: Upstream::Origin,
        ..PodSpec::default()
    })
    .await
    .unwrap()
}

fn echo(id: u64) -> Value {
    tool_call(
        id,
        "echo",
        json!({"text": format!("echo {id}"), "call_id": format!("w-{id}")}),
        None,
    )
}

/// POSTs `body` in `session`; the status and the JSON answer.
async fn post_json(client: &McpClient, session: &Session, body: &Value) -> (StatusCode, Value) {
    let (status, text) = client.post_text(Some(session), body).await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The sum of the pod's `tether_retained_bytes` of `kinds`, once the sweep refreshed them.
async fn retained(pod: &Pod, kinds: &[&str]) -> f64 {
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let mut sum = 0.0;
    for kind in kinds {
        let sample = format!(r#"tether_retained_bytes{{kind="{kind}"}}"#);
        sum += pod.metric(&sample).await.unwrap();
    }
    sum
}

#[tokio::test]
async fn a_hundred_thousand_requests_keep_a_bounded_window_and_none_runs_twice() {
    let pod = origin_pod().await;
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let total: u64 = 100_000;
    let workers = 16;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (client, session) = (client.clone(), session.clone());
        tasks.spawn(async move {
            let mut id = 1 + w;
            while id <= total {
                let (status, answer) = post_json(&client, &session, &echo(id)).await;
                assert_eq!(status, StatusCode::OK, "{answer}");
                assert_eq!(result_text(&answer), Some(format!("echo {id}").as_str()));
                id += workers;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    // What stays replayable is the window (--retry-window-bytes, 1 MiB by default), whatever
    // the traffic; the forgotten ids, numbered 1, 2, 3…, are tombstones of a few ranges.
    let window = retained(&pod, &["records", "replies"]).await;
    assert!(window <= 1_048_576.0 + 4_096.0, "{window} bytes");
    let tombstones = retained(&pod, &["tombstones"]).await;
    assert!(
        tombstones > 0.0 && tombstones <= 16_384.0,
        "{tombstones} bytes of tombstones"
    );
    let streams = pod.metric("tether_streams").await.unwrap();
    assert!(streams <= 257.0, "{streams} streams kept");
    // A retry of an early request: no longer available, and not run again.
    let (status, answer) = post_json(&client, &session, &echo(1)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(
        answer.pointer("/error/data/reason"),
        Some(&json!("result_expired"))
    );
    // A retry of a recent one: its stored answer. (Workers finish at their own pace, so the
    // highest id is not always among the newest answered: the last is one made after them.)
    let last = total + 1;
    let (status, answer) = post_json(&client, &session, &echo(last)).await;
    assert_eq!(
        (status, result_text(&answer)),
        (StatusCode::OK, Some(format!("echo {last}").as_str()))
    );
    let (status, answer) = post_json(&client, &session, &echo(last)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        result_text(&answer),
        Some(format!("echo {last}").as_str()),
        "{answer}"
    );
    let stats = pod.stats().await.unwrap();
    assert_eq!(stats["executions"], last, "{}", stats["duplicates"]);
    assert_eq!(stats["calls"]["w-1"], 1);
    assert_eq!(stats["calls"][format!("w-{last}")], 1);
    assert_eq!(
        pod.metric(r#"tether_request_id_reuse_total{outcome="expired"}"#)
            .await
            .unwrap(),
        1.0
    );
}

/// Reads a `stream` call's events until its result, at most `limit` progress events: their
/// count, the last event id and the result's text.
async fn read_call(events: &mut Events, limit: usize) -> (usize, Option<String>, Option<String>) {
    let (mut progress, mut last_id) = (0, None);
    while progress < limit {
        let Some(ev) = events.next_within(Duration::from_secs(10)).await else {
            break;
        };
        if ev.id.is_some() {
            last_id.clone_from(&ev.id);
        }
        let Some(data) = ev.data.filter(|d| !d.is_empty()) else {
            continue;
        };
        let message: Value = serde_json::from_str(&data).unwrap();
        if message.get("method").is_some() {
            progress += 1;
        } else {
            return (progress, last_id, result_text(&message).map(str::to_owned));
        }
    }
    (progress, last_id, None)
}

#[tokio::test]
async fn thousands_of_short_sse_calls_keep_bounded_buffers_and_a_cut_call_resumes_once() {
    let pod = origin_pod().await;
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let stream_call = |id: u64| {
        tool_call(
            id,
            "stream",
            json!({"count": 3, "call_id": format!("s-{id}")}),
            None,
        )
    };
    let calls: u64 = 5_000;
    for id in 1..=calls {
        let resp = client
            .post(Some(&session), &stream_call(id), &[])
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let (progress, _, result) = read_call(&mut Events::new(resp), usize::MAX).await;
        assert_eq!(
            (progress, result.as_deref()),
            (3, Some("done 3")),
            "call {id}"
        );
    }
    // The session keeps the window's calls, not all 5,000.
    let bytes = retained(&pod, &["buffers"]).await;
    assert!(bytes <= 257.0 * 1_024.0, "{bytes} bytes buffered");
    // The last call is cut before its result, and resumed.
    let last = calls + 1;
    let resp = client
        .post(Some(&session), &stream_call(last), &[])
        .await
        .unwrap();
    let (progress, cursor, result) = read_call(&mut Events::new(resp), 1).await;
    assert_eq!((progress, result), (1, None));
    let resp = client.get(&session, cursor.as_deref()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let (rest, _, result) = read_call(&mut Events::new(resp), usize::MAX).await;
    assert_eq!((rest, result.as_deref()), (2, Some("done 3")));
    let stats = pod.stats().await.unwrap();
    assert_eq!(stats["calls"][format!("s-{last}")], 1, "run once");
    // After DELETE nothing of the session is left.
    assert_eq!(client.delete(&session).await.unwrap(), StatusCode::OK);
    let left = retained(
        &pod,
        &["buffers", "records", "replies", "tombstones", "journal"],
    )
    .await;
    assert_eq!(left, 0.0);
    assert_eq!(pod.metric("tether_streams").await.unwrap(), 0.0);
    assert_eq!(pod.metric("tether_buffer_unsent_bytes").await.unwrap(), 0.0);
}

/// Sessions abandoned by their clients (400, each with a call) are reaped at their idle
/// timeout and ended upstream: their `DELETE`s go at most `--max-upstream-deletes` at a time,
/// and afterwards the sidecar keeps at most `--upstream-max-idle-connections` connections to
/// the MCP server (a tap in front of it counts them), so what the reap cost is given back.
#[tokio::test]
async fn reaped_sessions_are_ended_upstream_a_few_at_a_time_and_leave_few_connections() {
    use std::sync::Arc;

    use futures::StreamExt as _;
    use tether_tests::pod::UPSTREAM_PORT;
    use tether_tests::tap::Tap;

    const SESSIONS: usize = 400;
    let (ip, front) = (tether_tests::addr::next_ip(), tether_tests::addr::next_ip());
    let tap = Tap::start(
        (front, UPSTREAM_PORT).into(),
        (ip, UPSTREAM_PORT).into(),
        Arc::new(|_: &str| false),
    )
    .await
    .unwrap();
    let spec = PodSpec {
        upstream_via: Some(tap.addr),
        idle_timeout: "2s".into(),
        sidecar_args: [
            "--max-upstream-deletes",
            "4",
            "--upstream-max-idle-connections",
            "8",
        ]
        .map(String::from)
        .to_vec(),
        ..PodSpec::default()
    };
    let pod = Pod::start_at(ip, spec).await.unwrap();
    let client = pod.client();
    futures::stream::iter(0..SESSIONS)
        .for_each_concurrent(32, |i| {
            let client = client.clone();
            async move {
                let session = client.initialize("2025-11-25").await.unwrap();
                let answer = client
                    .call(&session, 2, "echo", json!({"text": format!("s-{i}")}))
                    .await
                    .unwrap();
                assert_eq!(
                    result_text(answer.last().unwrap()),
                    Some(format!("s-{i}").as_str())
                );
            }
        })
        .await;
    // The burst's connections beyond the idle ones kept close (the tap sees each end).
    for _ in 0..100 {
        if tap.open_connections() <= 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        tap.open_connections() <= 8,
        "{} connections stay open after the calls",
        tap.open_connections()
    );
    tap.reset_peak();
    let deletes = || {
        tap.recorded()
            .iter()
            .filter(|r| r.bytes.starts_with(b"DELETE "))
            .count()
    };
    for _ in 0..300 {
        if deletes() == SESSIONS && pod.metric("tether_sessions").await.unwrap() == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(deletes(), SESSIONS, "every reaped session ended upstream");
    assert_eq!(
        pod.metric("tether_upstream_deletes_pending").await.unwrap(),
        0.0
    );
    assert!(
        tap.peak_connections() <= 8 + 4,
        "at most the idle connections kept and 4 DELETEs at once: {} connections were open",
        tap.peak_connections()
    );
    assert!(
        tap.open_connections() <= 8,
        "{} connections to the MCP server stay open",
        tap.open_connections()
    );
}

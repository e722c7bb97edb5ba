//! Request ids as the field's clients send them (`docs/reference/status-codes.md`, "When a
//! repeated id is a retry"): a widely used hosted client sends `id: 1` for every request of a
//! session and pools one session across conversations. A repeated id with the same body is a
//! retry (joined while its request runs, its answer replayed after); with another body it is a
//! new request once the first was answered, and refused while the first still runs. The MCP
//! server is `tether-bench-origin`, which counts the executions of every `call_id`.

use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};
use tether_tests::client::{McpClient, Session, body_text, messages, result_text, tool_call};
use tether_tests::pod::{Pod, PodSpec, Upstream};

/// `echo` of `text` as request `id`, counted under call id `text`.
fn echo(id: u64, text: &str) -> Value {
    tool_call(id, "echo", json!({"text": text, "call_id": text}), None)
}

/// POSTs `body` in `session`: the status and the result text (or the whole answer).
async fn post(client: &McpClient, session: &Session, body: &Value) -> (StatusCode, String) {
    let (status, text) = client.post_text(Some(session), body).await.unwrap();
    let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let shown = result_text(&answer).map_or(text, str::to_owned);
    (status, shown)
}

/// How often the MCP server ran `call_id`.
async fn runs(pod: &Pod, call_id: &str) -> u64 {
    let stats = pod.stats().await.unwrap();
    stats["calls"][call_id].as_u64().unwrap_or(0)
}

async fn reuse(pod: &Pod, outcome: &str) -> f64 {
    let sample = format!(r#"tether_request_id_reuse_total{{outcome="{outcome}"}}"#);
    pod.metric(&sample).await.unwrap_or(0.0)
}

#[tokio::test]
async fn s09_a_client_sending_id_1_every_time_gets_every_request_run_once_and_its_own_answer() {
    let pod = Pod::start(PodSpec {
        server: Upstream::Origin,
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    // Three conversations' requests, all `id: 1`, one after the other: each runs, each gets
    // its own answer.
    for text in ["weather in Paris", "weather in Oslo", "convert 3 EUR"] {
        assert_eq!(
            post(&client, &session, &echo(1, text)).await,
            (StatusCode::OK, text.to_owned())
        );
    }
    // The same body again right after its answer: a retry, answered from the record (a retry
    // whose answer was lost cannot be told from a repeat), not run again.
    assert_eq!(
        post(&client, &session, &echo(1, "convert 3 EUR")).await,
        (StatusCode::OK, "convert 3 EUR".to_owned())
    );
    // An earlier body under the reused id: the id's request is now another one, so it runs.
    assert_eq!(
        post(&client, &session, &echo(1, "weather in Paris")).await,
        (StatusCode::OK, "weather in Paris".to_owned())
    );
    assert_eq!(runs(&pod, "weather in Paris").await, 2);
    assert_eq!(runs(&pod, "weather in Oslo").await, 1);
    assert_eq!(runs(&pod, "convert 3 EUR").await, 1);
    assert_eq!(reuse(&pod, "run").await, 3.0);
    assert_eq!(reuse(&pod, "replayed").await, 1.0);

    // While a request of id 7 runs: the same body joins it (the retry of a dropped
    // connection), another body under id 7 is refused and never runs beside it.
    let slow = tool_call(
        7,
        "stream",
        json!({"count": 4, "interval_us": 150_000, "call_id": "long call"}),
        None,
    );
    let first = client.post(Some(&session), &slow, &[]).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let refused = client
        .post(Some(&session), &echo(7, "meanwhile"), &[])
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    assert!(
        body_text(refused)
            .await
            .unwrap()
            .contains("request_id_reused")
    );
    let joined = client.post(Some(&session), &slow, &[]).await.unwrap();
    let (a, b) = tokio::join!(
        messages(first, Duration::from_secs(10)),
        messages(joined, Duration::from_secs(10))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b, "both connections read the one request's stream");
    assert_eq!(result_text(a.last().unwrap()), Some("done 4"));
    assert_eq!(runs(&pod, "long call").await, 1);
    assert_eq!(runs(&pod, "meanwhile").await, 0);
    // Answered now: the other body runs.
    assert_eq!(
        post(&client, &session, &echo(7, "meanwhile")).await,
        (StatusCode::OK, "meanwhile".to_owned())
    );
    assert_eq!(runs(&pod, "meanwhile").await, 1);
    assert_eq!(reuse(&pod, "refused").await, 1.0);
    assert_eq!(reuse(&pod, "joined").await, 1.0);
    assert_eq!(reuse(&pod, "run").await, 4.0);
}

#[tokio::test]
async fn s09_in_a_session_that_reuses_ids_a_forgotten_id_runs_again() {
    // A window of 2 answered requests: ids beyond it are forgotten (tombstones).
    let pod = Pod::start(PodSpec {
        server: Upstream::Origin,
        sidecar_args: vec!["--retry-window".into(), "2".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    // A client numbering each conversation from 1 in one pooled session.
    let session = client.initialize("2025-06-18").await.unwrap();
    // Conversation b reuses id 4 while the session still keeps its answer (a reuse, seen as
    // such), then id 1, which the session forgot: a new request too, not `result_expired`.
    for (id, text) in [
        (1, "a1"),
        (2, "a2"),
        (3, "a3"),
        (4, "a4"),
        (4, "b4"),
        (1, "b1"),
    ] {
        assert_eq!(
            post(&client, &session, &echo(id, text)).await,
            (StatusCode::OK, text.to_owned()),
            "id {id}"
        );
    }
    for text in ["a1", "a4", "b4", "b1"] {
        assert_eq!(runs(&pod, text).await, 1, "{text}");
    }
    // A client with unique ids: a forgotten id is a retry whose answer is gone, never run twice.
    let strict = client.initialize("2025-06-18").await.unwrap();
    for (id, text) in [(1, "c1"), (2, "c2"), (3, "c3"), (4, "c4")] {
        post(&client, &strict, &echo(id, text)).await;
    }
    let (status, answer) = post(&client, &strict, &echo(1, "c1")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(answer.contains("result_expired"), "{answer}");
    assert_eq!(runs(&pod, "c1").await, 1);
}

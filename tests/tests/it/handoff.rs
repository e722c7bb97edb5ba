//! Session handoff between sidecars (`docs/design/handoff.md`): a draining pod pushes its
//! sessions, replay buffers and cursors to peers, forwards the tail of calls still running, and
//! clients carry on from any entry pod — before and after the drained pod stops.

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};
use tether_tests::addr;
use tether_tests::client::{Events, McpClient, Session, messages, result_text, tool_call};
use tether_tests::cluster::Cluster;
use tether_tests::load::{self, LoadConfig};
use tether_tests::pod::{Drained, PodSpec};
use tether_tests::scenario::Scenario;

/// Calls `echo` with `text` in every session through `client`; each answers with the text.
async fn echo_everywhere(client: &McpClient, sessions: &[Session], id: u64, text: &str) {
    for (i, s) in sessions.iter().enumerate() {
        let answer = client
            .call(s, id, "echo", json!({"text": text}))
            .await
            .unwrap();
        assert_eq!(
            result_text(answer.last().unwrap()),
            Some(text),
            "session {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_pod_hands_off_live_sessions_and_clients_lose_nothing() {
    let _heavy = load::heavy().await;
    let [a, b, c] = addr::ips();
    let mut cluster = Cluster::start(&[a, b, c], PodSpec::default())
        .await
        .unwrap();
    let client = cluster.client();
    let cfg = LoadConfig {
        sessions: 90,
        calls_per_session: 4,
        count: 15,
        interval_ms: 30,
        cut_probability: 0.5,
        ..LoadConfig::default()
    };
    let load = tokio::spawn(async move { load::run(&client, &cfg).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    cluster.set_state(a, Some("draining")).await.unwrap();
    let started = Instant::now();
    let Drained { done, body, .. } = cluster.pods[0].drain().await.unwrap();
    println!("drain of {a}: {body} in {:?}", started.elapsed());
    assert!(done, "{body}");
    assert!(body["handedOff"].as_u64().unwrap() > 0, "{body}");
    assert_eq!(body["notMoved"], 0, "{body}");
    let report = load.await.unwrap();
    println!("{}", report.table());
    let executed_twice = cluster.executed_twice().await.unwrap();
    assert!(
        report.failures.is_empty(),
        "{:?}\n{}",
        &report.failures[..report.failures.len().min(5)],
        cluster.logs()
    );
    assert_eq!(
        (
            report.lost,
            report.duplicated,
            report.foreign,
            executed_twice
        ),
        (0, 0, 0, 0)
    );
    let sent = cluster.pods[0]
        .metric("tether_handoffs_sent_total")
        .await
        .unwrap();
    let received = cluster
        .metric_sum("tether_handoffs_received_total")
        .await
        .unwrap();
    assert_eq!(sent, received);
    assert_eq!(
        cluster.metric_sum("tether_not_found_total").await.unwrap(),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_survive_their_home_stopping_and_are_rebuilt_from_the_journal() {
    let [a, b, c] = addr::ips();
    let mut cluster = Cluster::start(&[a, b, c], PodSpec::default())
        .await
        .unwrap();
    let via_a = cluster.client_of(&[a]);
    let mut sessions = Vec::new();
    for i in 0..20 {
        let version = ["2025-03-26", "2025-06-18", "2025-11-25"][i % 3];
        let s = via_a.initialize(version).await.unwrap();
        let answer = via_a
            .call(&s, 2, "echo", json!({"text": "before"}))
            .await
            .unwrap();
        assert_eq!(result_text(answer.last().unwrap()), Some("before"));
        sessions.push(s);
    }
    cluster.set_state(a, Some("draining")).await.unwrap();
    let Drained { done, body, .. } = cluster.pods[0].drain().await.unwrap();
    assert!(done, "{body}");
    assert_eq!(body["handedOff"], 20, "{body}");
    // While A still runs, requests entering anywhere reach the new holders (A forwards).
    echo_everywhere(&cluster.client_of(&[a, b, c]), &sessions, 3, "moved").await;
    let exit = cluster.pods[0]
        .terminate_sidecar(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(exit.is_some_and(|e| e.success()), "{exit:?}");
    let stopped = cluster.pods.remove(0);
    cluster.set_state(a, None).await.unwrap();
    echo_everywhere(&cluster.client_of(&[b, c]), &sessions, 4, "after").await;
    let mut rebuilt = 0.0;
    drop(stopped);
    for pod in &cluster.pods {
        rebuilt += pod.metric("tether_sessions_rebuilt_total").await.unwrap();
    }
    assert_eq!(rebuilt, 20.0, "every adopted session was rebuilt once");
}

/// Spec L-02: a call still running on the old pod after its session moved is
/// cancelled there when the client cancels it at the new holder; the drain then ends at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn l02_a_cancellation_reaches_the_pod_still_running_the_call() {
    let [a, b, c] = addr::ips();
    let mut cluster = Cluster::start(&[a, b, c], PodSpec::default())
        .await
        .unwrap();
    let via_a = cluster.client_of(&[a]);
    let session = via_a.initialize("2025-06-18").await.unwrap();
    let args = json!({"count": 200, "interval_ms": 50, "call_id": "cancel-me"});
    let call = via_a
        .post(
            Some(&session),
            &tool_call(2, "slow", args, Some("cancel-me")),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(call.status(), StatusCode::OK);
    cluster.set_state(a, Some("draining")).await.unwrap();
    let drained = cluster.pods[0].start_drain();
    // The session moves (to B or C: A receives none while it drains); the call keeps running
    // on A.
    let received = cluster
        .wait_for_metric_sum(
            "tether_handoffs_received_total",
            Duration::from_secs(3),
            |n| n >= 1.0,
        )
        .await
        .unwrap();
    assert!(received >= 1.0, "the session was handed off");
    let cancel =
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}});
    let resp = cluster
        .client_of(&[b, c])
        .post(Some(&session), &cancel, &[])
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let drained = drained.await.unwrap().unwrap();
    assert!(drained.done, "{}", drained.body);
    let took = drained.elapsed;
    assert!(
        took < Duration::from_secs(5),
        "the drain waited for a cancelled call: {took:?}"
    );
    let stats = cluster.pods[0]
        .wait_for_stats(Duration::from_secs(1), |stats| stats["aborted"] == 1)
        .await
        .unwrap();
    assert_eq!(
        stats["aborted"],
        1,
        "A's MCP server stopped the call: {stats}\n{}",
        cluster.logs()
    );
    drop(call);
}

/// The answer to request `id` among `messages`.
fn answer_to(messages: &[Value], id: u64) -> Option<&Value> {
    messages.iter().find(|m| m["id"] == id)
}

/// Spec L-01, and the drain deadline (`docs/design/handoff.md`): a call still running at the
/// deadline ends with a JSON-RPC error for its id (`drain_deadline`) — under Replay on the new
/// holder's copy of its stream, under `Pin` on the pod that kept the session, which served it
/// until the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_cut_by_the_drain_deadline_ends_with_a_json_rpc_error() {
    for migration in ["Replay", "Pin"] {
        let [a, b] = addr::ips();
        let spec = PodSpec {
            migration: migration.into(),
            ..PodSpec::default()
        };
        let mut cluster = Cluster::start(&[a, b], spec).await.unwrap();
        let via_a = cluster.client_of(&[a]);
        let session = via_a.initialize("2025-06-18").await.unwrap();
        let args = json!({"count": 400, "interval_ms": 50, "call_id": format!("cut-{migration}")});
        let call = via_a
            .post(Some(&session), &tool_call(2, "slow", args, None), &[])
            .await
            .unwrap();
        cluster.set_state(a, Some("draining")).await.unwrap();
        let drained = cluster.pods[0].start_drain();
        // While A drains, the session is served (by A under Pin, by the new holder under Replay).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let echo = cluster
            .client_of(&[b])
            .call(&session, 3, "echo", json!({"text": "still here"}))
            .await
            .unwrap();
        assert_eq!(
            result_text(echo.last().unwrap()),
            Some("still here"),
            "{migration}"
        );
        let messages = messages(call, Duration::from_secs(15)).await.unwrap();
        let answer = answer_to(&messages, 2).expect("the cut call got an answer");
        assert_eq!(
            answer["error"]["data"]["reason"], "drain_deadline",
            "{migration}: {answer}"
        );
        let drained = drained.await.unwrap().unwrap();
        let (done, body) = (drained.done, drained.body);
        assert!(!done, "{migration}: {body}");
        assert_eq!(body["cut"], 1, "{migration}: {body}");
        let expected_moves = u64::from(migration == "Replay");
        assert_eq!(body["handedOff"], expected_moves, "{migration}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_messages_still_on_their_way_when_the_calls_end_reach_the_client() {
    // The MCP servers' GET streams reach their sidecars late (each frame held back 800 ms, longer
    // than a guess at how long such messages take would wait): a `notify` call on A is over
    // when A drains, and its two messages are still on their way on the standalone stream. A
    // ends the upstream session, reads the stream to its end and forwards them: the client
    // resuming the standalone stream at the new holder gets both.
    let spec = PodSpec {
        server_args: vec!["--standalone-delay-ms".into(), "800".into()],
        ..PodSpec::default()
    };
    let mut scenario = Scenario::start(2, spec).await;
    let via_a = scenario.via_a();
    let session = via_a.initialize("2025-11-25").await.unwrap();
    let mut standalone = via_a.standalone(&session).await.unwrap();
    let cursor = loop {
        let ev = standalone
            .next_within(Duration::from_secs(10))
            .await
            .expect("the standalone stream's priming event");
        if let Some(id) = ev.id {
            break id;
        }
    };
    drop(standalone);
    let answer = via_a
        .call(&session, 2, "notify", json!({"text": "late", "count": 2}))
        .await
        .unwrap();
    assert!(answer.iter().any(|m| m["result"].is_object()), "{answer:?}");
    let drain = scenario.drain_a().await;
    scenario.wait_moved(1.0).await;
    drop(scenario.stop_a(drain).await);
    let via_rest = scenario.via_rest();
    let resumed = via_rest.get(&session, Some(&cursor)).await.unwrap();
    assert_eq!(resumed.status(), StatusCode::OK);
    let mut events = Events::new(resumed);
    let mut seqs = Vec::new();
    while seqs.len() < 2 {
        let Some(ev) = events.next_within(Duration::from_secs(10)).await else {
            break;
        };
        let data: Value =
            serde_json::from_str(ev.data.as_deref().unwrap_or("null")).unwrap_or_default();
        if data["params"]["data"]["text"] == "late" {
            seqs.push(data["params"]["data"]["seq"].as_u64().unwrap_or_default());
        }
    }
    assert_eq!(
        seqs,
        vec![1, 2],
        "both messages reach the client, once, in order"
    );
}

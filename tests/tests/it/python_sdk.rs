//! The official Python SDK behind tether: the fixture `tests/fixtures/python-sdk-server/` (`mcp`,
//! pinned, in the virtualenv `make python-sdk` creates) serves the tool contract of
//! `tether-example-server` on its pod's loopback address, with the SDK's DNS-rebinding protection
//! on: a `Host` that is not local gets 421, an `Origin` that is not local 403.
//!
//! Every request of these clients carries a public `Host` and the browser `Origin` the endpoint
//! allows, as a browser client behind a load balancer sends them. tether dials the MCP server
//! with its own `Host` and without the `Origin` (`spec.upstream.forwardOrigin` is off), so the
//! SDK serves initialize, tools, a cut stream and its resume, a stream it closes early (SEP-1699),
//! the standalone stream, DELETE and a rolling upgrade, and its `/stats` show that its protection
//! refused nothing. With `forwardOrigin` on, it refuses the same browser's initialize.

use std::collections::BTreeSet;
use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};
use tether_tests::HarnessError;
use tether_tests::call::{self, CallPlan};
use tether_tests::client::{
    Events, McpClient, PUBLIC_HEADERS, expect_lost_session, initialize_body, messages, result_text,
    tool_call, tools_list,
};
use tether_tests::load;
use tether_tests::pod::{Pod, PodSpec, Upstream};
use tether_tests::rollout::{self, RolloutConfig};

/// The test endpoint with the Python SDK fixture as its MCP server.
fn python_sdk() -> PodSpec {
    PodSpec {
        server: Upstream::PythonSdk,
        ..PodSpec::default()
    }
}

/// A pod of `spec`, and a client of it sending [`PUBLIC_HEADERS`]. Panics with the error's message
/// (a missing virtualenv says to run `make python-sdk`).
async fn public_pod(spec: PodSpec) -> (Pod, McpClient) {
    let pod = Pod::start(spec).await.unwrap_or_else(|e| panic!("{e}"));
    let client = pod.client();
    client.set_headers(&PUBLIC_HEADERS);
    (pod, client)
}

/// The fixture's refusals of its DNS-rebinding protection, from its `/stats`: (hosts, origins).
fn refusals(stats: &Value) -> (u64, u64) {
    let count = |key: &str| stats[key].as_u64().expect("a count");
    (count("rejected_hosts"), count("rejected_origins"))
}

/// Reads `n` log notifications (`notifications/message`) from `events`: their `data`, and the
/// id of the last event read.
async fn logs(events: &mut Events, n: usize) -> (Vec<Value>, String) {
    let (mut data, mut last) = (Vec::new(), None);
    while data.len() < n {
        let ev = events
            .next_within(Duration::from_secs(10))
            .await
            .expect("the stream ended or stalled");
        last = ev.id.or(last);
        let Some(text) = ev.data.filter(|d| !d.is_empty()) else {
            continue;
        };
        let message: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(message["method"], "notifications/message", "{message}");
        data.push(message["params"]["data"].clone());
    }
    (data, last.expect("an event id"))
}

#[tokio::test]
async fn o01_o02_a_loopback_python_sdk_server_serves_a_public_host_and_an_allowed_browser_origin() {
    let (pod, client) = public_pod(python_sdk()).await;
    let session = client.initialize("2025-11-25").await.unwrap();
    let listed = client
        .post(Some(&session), &tools_list(2), &[])
        .await
        .unwrap();
    assert_eq!(listed.status(), StatusCode::OK);
    let listed = messages(listed, Duration::from_secs(10)).await.unwrap();
    let tools: BTreeSet<&str> = listed
        .iter()
        .filter_map(|m| m["result"]["tools"].as_array())
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        tools,
        BTreeSet::from(["counter", "echo", "notify", "slow"]),
        "{listed:?}"
    );
    let echo = client
        .call(&session, 3, "echo", json!({"text": "ab", "repeat": 3}))
        .await
        .unwrap();
    assert_eq!(result_text(echo.last().unwrap()), Some("ababab"));
    for (id, expected) in [(4, "1"), (5, "2")] {
        let answer = client
            .call(&session, id, "counter", json!({}))
            .await
            .unwrap();
        assert_eq!(result_text(answer.last().unwrap()), Some(expected));
    }
    // An Origin the endpoint does not allow is tether's to refuse: it never reaches the server.
    let foreign = client
        .post(
            Some(&session),
            &tool_call(6, "echo", json!({"text": "x"}), None),
            &[("origin", "https://evil.example")],
        )
        .await
        .unwrap();
    assert_eq!(foreign.status(), StatusCode::FORBIDDEN);
    let stats = pod.stats().await.unwrap();
    assert_eq!(refusals(&stats), (0, 0), "{stats}\n{}", pod.logs());
    assert_eq!(stats["sessions"], 1, "{stats}");
    assert!(
        stats["forwarded"].as_u64().unwrap() >= 4,
        "the proxy hop names itself: {stats}"
    );
    // The SDK's protection is on: the same Host and Origin reaching it unchanged are refused,
    // and counted.
    let direct = McpClient::new(format!("{}/mcp", pod.server_url));
    let initialize = initialize_body(1, "2025-11-25");
    let host = direct
        .post(None, &initialize, &PUBLIC_HEADERS[..1])
        .await
        .unwrap();
    assert_eq!(host.status(), StatusCode::MISDIRECTED_REQUEST);
    let origin = direct
        .post(None, &initialize, &PUBLIC_HEADERS[1..])
        .await
        .unwrap();
    assert_eq!(origin.status(), StatusCode::FORBIDDEN);
    let stats = pod.stats().await.unwrap();
    assert_eq!(refusals(&stats), (1, 1), "{stats}");
}

/// What the defaults avoid, as first measured: with `spec.upstream.forwardOrigin`, tether passes
/// the browser's `Origin` on, and the SDK refuses the initialize tether admitted.
#[tokio::test]
async fn with_forward_origin_the_python_sdk_refuses_a_browser_origin_tether_allows() {
    let (pod, client) = public_pod(PodSpec {
        forward_origin: true,
        ..python_sdk()
    })
    .await;
    let err = client.initialize("2025-11-25").await.unwrap_err();
    assert!(
        matches!(&err, HarnessError::Status { status, .. } if *status == StatusCode::FORBIDDEN),
        "{err}"
    );
    let stats = pod.stats().await.unwrap();
    assert_eq!(
        refusals(&stats),
        (0, 1),
        "the Host was tether's own: {stats}"
    );
    assert_eq!(stats["sessions"], 0, "{stats}");
}

#[tokio::test]
async fn r03_l01_a_cut_python_sdk_call_resumes_with_every_event_once_and_runs_once() {
    let (pod, client) = public_pod(python_sdk()).await;
    let versions = ["2025-03-26", "2025-06-18", "2025-11-25"];
    for version in versions {
        let session = client.initialize(version).await.unwrap();
        let plan = CallPlan {
            cuts: vec![3, 6],
            pause: Duration::from_millis(100),
            ..CallPlan::steady(10, 50)
        };
        let call_id = format!("cut-{version}");
        let out = call::slow(&client, &session, 2, &call_id, &plan)
            .await
            .unwrap();
        assert!(out.failures.is_empty(), "{version}: {:?}", out.failures);
        assert_eq!(
            out.progress,
            (1..=10).collect::<Vec<_>>(),
            "{version}: every progress once, in order"
        );
        assert_eq!(out.result.as_deref(), Some("done 10"), "{version}");
        assert_eq!((out.duplicated, out.foreign), (0, 0), "{version}");
        assert_eq!(out.resumes.len(), 2, "{version}: both cuts resumed");
    }
    let hits = pod
        .metric(r#"tether_resumes_total{result="hit",reason="none"}"#)
        .await
        .unwrap();
    assert_eq!(hits, 6.0, "every resume served after its cursor");
    let stats = pod.stats().await.unwrap();
    for version in versions {
        assert_eq!(stats["calls"][format!("cut-{version}")], 1, "{stats}");
    }
    assert_eq!(stats["duplicates"], json!({}), "{stats}");
    assert_eq!(
        (&stats["completed"], &stats["aborted"]),
        (&json!(3), &json!(0)),
        "a cut is no cancellation: {stats}"
    );
    assert_eq!(refusals(&stats), (0, 0), "{stats}\n{}", pod.logs());
}

#[tokio::test]
async fn t09_the_python_sdk_standalone_stream_carries_notify_logs_and_resumes() {
    let (pod, client) = public_pod(python_sdk()).await;
    let session = client.initialize("2025-06-18").await.unwrap();
    let mut standalone = client.standalone(&session).await.unwrap();
    let sent = client
        .call(&session, 2, "notify", json!({"text": "hi", "count": 3}))
        .await
        .unwrap();
    assert_eq!(result_text(sent.last().unwrap()), Some("sent 3"));
    let (got, cursor) = logs(&mut standalone, 3).await;
    assert_eq!(
        got,
        (1..=3)
            .map(|seq| json!({"text": "hi", "seq": seq}))
            .collect::<Vec<_>>()
    );
    // The client loses its GET; what the server sends meanwhile is kept for its resume.
    drop(standalone);
    let sent = client
        .call(
            &session,
            3,
            "notify",
            json!({"text": "offline", "count": 2}),
        )
        .await
        .unwrap();
    assert_eq!(result_text(sent.last().unwrap()), Some("sent 2"));
    let resumed = client.get(&session, Some(&cursor)).await.unwrap();
    assert_eq!(resumed.status(), StatusCode::OK);
    let (got, _) = logs(&mut Events::new(resumed), 2).await;
    assert_eq!(
        got,
        (1..=2)
            .map(|seq| json!({"text": "offline", "seq": seq}))
            .collect::<Vec<_>>()
    );
    let stats = pod.stats().await.unwrap();
    assert_eq!(refusals(&stats), (0, 0), "{stats}\n{}", pod.logs());
}

#[tokio::test]
async fn s05_a_python_sdk_session_deleted_through_tether_is_404_afterwards() {
    let (pod, client) = public_pod(python_sdk()).await;
    let session = client.initialize("2025-11-25").await.unwrap();
    let echo = json!({"text": "before"});
    assert!(client.call(&session, 2, "echo", echo.clone()).await.is_ok());
    let status = client.delete(&session).await.unwrap();
    assert!(status.is_success(), "{status}\n{}", pod.logs());
    let stats = pod.stats().await.unwrap();
    assert_eq!(stats["deleted"], 1, "the SDK ended its session: {stats}");
    let posted = client
        .post(Some(&session), &tool_call(3, "echo", echo, None), &[])
        .await
        .unwrap();
    expect_lost_session(posted).await.unwrap();
    expect_lost_session(client.get(&session, None).await.unwrap())
        .await
        .unwrap();
    assert_eq!(
        client.delete(&session).await.unwrap(),
        StatusCode::NOT_FOUND
    );
    let stats = pod.stats().await.unwrap();
    assert_eq!(stats["deleted"], 1, "{stats}");
    assert_eq!(refusals(&stats), (0, 0), "{stats}\n{}", pod.logs());
}

#[tokio::test]
async fn r06_a_python_sdk_stream_closed_for_polling_is_resumed_by_tether_unseen() {
    let (pod, client) = public_pod(python_sdk()).await;
    let session = client.initialize("2025-11-25").await.unwrap();
    // The SDK closes the call's SSE connection after the second progress (SEP-1699); tether
    // resumes it from the SDK's event store, the client reads one stream.
    let plan = CallPlan {
        close_after: Some(2),
        ..CallPlan::steady(6, 50)
    };
    let out = call::slow(&client, &session, 2, "polled", &plan)
        .await
        .unwrap();
    assert!(
        out.failures.is_empty(),
        "{:?}\n{}",
        out.failures,
        pod.logs()
    );
    assert_eq!(out.progress, (1..=6).collect::<Vec<_>>());
    assert_eq!(out.result.as_deref(), Some("done 6"));
    assert_eq!((out.duplicated, out.foreign), (0, 0));
    assert_eq!(out.resumes.len(), 0, "the client saw one unbroken stream");
    assert_eq!(
        pod.metric("tether_upstream_resumes_total").await.unwrap(),
        1.0,
        "{}",
        pod.logs()
    );
    let stats = pod.stats().await.unwrap();
    assert_eq!(stats["calls"]["polled"], 1, "{stats}");
    assert_eq!(refusals(&stats), (0, 0), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_of_python_sdk_pods_under_load_is_invisible_to_clients() {
    let _heavy = load::heavy().await;
    let report = rollout::run(&RolloutConfig {
        pods: 2,
        sessions: 24,
        count: 8,
        interval_ms: 40,
        upstream: Upstream::PythonSdk,
        auth: None,
        // The fixture has no `job` tool for tasks.
        modern_clients: 0,
        listeners: 0,
        ..RolloutConfig::default()
    })
    .await
    .unwrap();
    println!("{}", report.table());
    let r = &report.load;
    assert!(
        r.failures.is_empty(),
        "{:?}",
        &r.failures[..r.failures.len().min(5)]
    );
    assert_eq!(report.drains.len(), 2, "every pod replaced");
    assert_eq!(r.sessions, 24);
    assert_eq!(r.not_found, 0, "client-visible 404s");
    assert_eq!(
        (r.lost, r.duplicated, r.foreign),
        (0, 0, 0),
        "lost, duplicated, foreign"
    );
    assert!(r.resumes > 0, "clients cut and resumed calls");
    assert_eq!(r.executed_twice, 0, "tools executed twice");
    assert_eq!(
        report.slow_executions, report.slow_calls,
        "every call ran once"
    );
    assert_eq!(
        report.upstream_not_local, 0,
        "requests the SDK refused as not local"
    );
    assert!(
        report.sidecar.sessions_rebuilt > 0,
        "the new pods rebuilt handed-off sessions"
    );
    assert!(report.is_clean());
}

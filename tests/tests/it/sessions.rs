//! Session lifecycle through a real pod: initialize, 202 for notifications, DELETE, 404 for
//! unknown, forged, deleted and expired ids, upstream restarts (spec S-05, T-05).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::json;
use tether_tests::addr;
use tether_tests::client::{
    ACCEPT_BOTH, Session, body_text, expect_lost_session, header_str, initialize_body, result_text,
    tool_call, tools_list,
};
use tether_tests::pod::{Pod, PodSpec};

/// A POST and a GET for `session` both get the 404 of a lost session.
async fn assert_lost(client: &tether_tests::client::McpClient, session: &Session) {
    assert_404(
        client
            .post(Some(session), &tools_list(2), &[])
            .await
            .unwrap(),
    )
    .await;
    assert_404(client.get(session, None).await.unwrap()).await;
}

/// A pod under `Pin`: sessions are not rebuilt, so a restarted MCP server loses them all.
async fn pinned_pod() -> Pod {
    let spec = PodSpec {
        migration: "Pin".into(),
        ..PodSpec::default()
    };
    Pod::start(spec).await.unwrap()
}

async fn assert_404(resp: http::Response<hyper::body::Incoming>) {
    expect_lost_session(resp).await.unwrap();
}

#[tokio::test]
async fn fr15_initialize_carries_the_session_id_in_json_and_sse_variants() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    for version in ["2025-03-26", "2025-06-18", "2025-11-25"] {
        let resp = client
            .post(None, &initialize_body(1, version), &[])
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(header_str(&resp, "mcp-session-id").is_some(), "{version}");
    }
    // A stale session id on initialize is not forwarded: a fresh session comes back.
    let first = client.initialize("2025-11-25").await.unwrap();
    let resp = client
        .post(
            None,
            &initialize_body(1, "2025-11-25"),
            &[("mcp-session-id", first.id.as_str())],
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let fresh = header_str(&resp, "mcp-session-id").unwrap();
    assert_ne!(fresh, first.id);
}

#[tokio::test]
async fn t05_fr22_notifications_get_202_with_an_empty_body() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let resp = client
        .post(
            Some(&session),
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert_eq!(header_str(&resp, "content-length").as_deref(), Some("0"));
    assert!(
        resp.headers().get("content-type").is_none(),
        "no injected Content-Type"
    );
    assert!(body_text(resp).await.unwrap().is_empty());
}

#[tokio::test]
async fn s05_deleted_sessions_get_404_without_a_session_header() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let status = client.delete(&session).await.unwrap();
    assert!(status.is_success(), "{status}");
    assert_lost(&client, &session).await;
    assert_eq!(
        pod.metric("tether_not_found_total{reason=\"deleted\"}")
            .await
            .unwrap(),
        2.0
    );
    assert_eq!(pod.metric("tether_sessions").await.unwrap(), 0.0);
}

#[tokio::test]
async fn fr5_unknown_and_forged_sessions_get_404_never_sse() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let real = client.initialize("2025-11-25").await.unwrap();
    let forged = real.forged(10);
    assert_lost(&client, &forged).await;
    let uuid = Session {
        id: "7f3c9e2a-4b1d-4c8a-9f0e-1a2b3c4d5e6f".into(),
        version: "2025-11-25".into(),
    };
    assert_404(client.post(Some(&uuid), &tools_list(2), &[]).await.unwrap()).await;
    assert_eq!(
        pod.metric("tether_not_found_total{reason=\"forged\"}")
            .await
            .unwrap(),
        3.0
    );
    // The real session is untouched.
    let resp = client.post(Some(&real), &tools_list(3), &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn fr6_header_less_requests_fail_fast_with_400() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let started = std::time::Instant::now();
    for _ in 0..200 {
        let resp = client.post(None, &tools_list(2), &[]).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert!(resp.headers().get("mcp-session-id").is_none());
        let _ = body_text(resp).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "400s must be cheap: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn fr4_a_404_storm_reinitializes_cleanly() {
    let mut pod = pinned_pod().await;
    let client = pod.client();
    let mut sessions = Vec::new();
    for _ in 0..100 {
        sessions.push(client.initialize("2025-11-25").await.unwrap());
    }
    // The MCP server restarts: every upstream session is gone.
    pod.restart_server().await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for s in sessions {
        let client = client.clone();
        tasks.spawn(async move {
            let resp = client.post(Some(&s), &tools_list(2), &[]).await.unwrap();
            let status = resp.status();
            let had_header = resp.headers().contains_key("mcp-session-id");
            let _ = body_text(resp).await;
            // S-06: the client starts over.
            let fresh = client.initialize("2025-11-25").await.unwrap();
            let msgs = client
                .call(&fresh, 3, "echo", json!({"text": "again"}))
                .await
                .unwrap();
            (
                status,
                had_header,
                msgs.iter().any(|m| result_text(m) == Some("again")),
            )
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (status, had_header, served) = done.unwrap();
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "a lost session is 404, never 5xx"
        );
        assert!(!had_header);
        assert!(served, "the re-initialized session works");
    }
    assert_eq!(
        pod.metric("tether_not_found_total{reason=\"upstream_gone\"}")
            .await
            .unwrap(),
        100.0
    );
}

#[tokio::test]
async fn idle_sessions_expire_with_404() {
    let pod = Pod::start(PodSpec {
        idle_timeout: "2s".into(),
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    let idle = client.initialize("2025-11-25").await.unwrap();
    let busy = client.initialize("2025-11-25").await.unwrap();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let resp = client.post(Some(&busy), &tools_list(2), &[]).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "an active session stays");
        let _ = body_text(resp).await;
    }
    assert_404(client.post(Some(&idle), &tools_list(2), &[]).await.unwrap()).await;
    assert_eq!(
        pod.metric("tether_sessions_ended_total{reason=\"expired\"}")
            .await
            .unwrap(),
        1.0
    );
}

#[tokio::test]
async fn a_sweep_looks_at_the_sessions_due_not_at_every_session_held() {
    let pod = Pod::start(PodSpec {
        idle_timeout: "10s".into(),
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    let started = std::time::Instant::now();
    let mut sessions = Vec::new();
    for _ in 0..200 {
        sessions.push(client.initialize("2025-11-25").await.unwrap());
    }
    // Three sweeps later (and before the first of them could turn idle) each new session was
    // looked at once, not once a sweep.
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    let swept = pod.metric("tether_sweep_sessions_total").await.unwrap();
    if started.elapsed() < Duration::from_secs(9) {
        assert!(
            (200.0..=210.0).contains(&swept),
            "{swept} sessions looked at"
        );
    }
    // They are looked at again when they turn idle, and end then.
    let ended = pod
        .wait_for_metric(
            "tether_sessions_ended_total{reason=\"expired\"}",
            Duration::from_secs(20),
            |v| v >= 200.0,
        )
        .await
        .unwrap();
    assert_eq!(ended, 200.0);
    let swept = pod.metric("tether_sweep_sessions_total").await.unwrap();
    assert!(
        (400.0..=420.0).contains(&swept),
        "{swept} sessions looked at"
    );
    assert_404(
        client
            .post(Some(&sessions[0]), &tools_list(2), &[])
            .await
            .unwrap(),
    )
    .await;
}

#[tokio::test]
async fn too_many_sessions_get_503_with_retry_after() {
    let pod = Pod::start(PodSpec {
        sidecar_args: vec!["--max-sessions".into(), "2".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    let first = client.initialize("2025-11-25").await.unwrap();
    client.initialize("2025-11-25").await.unwrap();
    let resp = client
        .post(None, &initialize_body(1, "2025-11-25"), &[])
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header_str(&resp, "retry-after").as_deref(), Some("1"));
    client.delete(&first).await.unwrap();
    client.initialize("2025-11-25").await.unwrap();
}

#[tokio::test]
async fn fr15_end_to_end_headers_pass_through() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    // rmcp answers a tools/call for an unknown tool with a JSON-RPC error inside a 200; an
    // unknown extra header must not disturb anything.
    let resp = client
        .http()
        .send(
            Method::POST,
            &pod.mcp_url,
            &[
                ("accept", ACCEPT_BOTH),
                ("content-type", "application/json"),
                ("mcp-session-id", session.id.as_str()),
                ("mcp-protocol-version", session.version.as_str()),
                ("mcp-param-region", "eu"),
            ],
            Some(Bytes::from(tools_list(5).to_string())),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        header_str(&resp, "mcp-session-id").as_deref(),
        Some(session.id.as_str())
    );
}

#[tokio::test]
async fn i02_an_unserved_requested_version_is_answered_with_a_served_one() {
    let pod = Pod::start(PodSpec {
        versions: vec!["2025-06-18".into(), "2025-11-25".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let session = pod.client().initialize("2025-03-26").await.unwrap();
    assert_eq!(
        session.version, "2025-11-25",
        "the newest version the endpoint serves"
    );
}

#[tokio::test]
async fn an_unreachable_upstream_is_503_with_retry_after_and_readiness_fails() {
    let mut pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    pod.kill_server().await.unwrap();
    let resp = client
        .post(Some(&session), &tools_list(2), &[])
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header_str(&resp, "retry-after").as_deref(), Some("1"));
    let (status, _) = client
        .http()
        .get_text(&format!("{}/readyz", pod.admin_url))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _) = client
        .http()
        .get_text(&format!("{}/healthz", pod.admin_url))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
}

/// Runs `tether-sidecar` with `manifest` on `ip` until it exits; returns its exit code and
/// stderr.
async fn sidecar_exit(manifest: &str, ip: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("endpoint.yaml"), manifest).unwrap();
    tether_tests::pod::write_key_ring(&dir.path().join("keys")).unwrap();
    let out = tokio::process::Command::new(tether_tests::bins::path("tether-sidecar").unwrap())
        .arg("--endpoint")
        .arg(dir.path().join("endpoint.yaml"))
        .args(["--pod-ip", ip, "--pod-uid", "twin"])
        .arg("--secret-dir")
        .arg(dir.path().join("keys"))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), out)
        .await
        .expect("the sidecar exits by itself")
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_second_sidecar_on_the_same_address_exits_with_a_clear_error() {
    let pod = Pod::start_default().await.unwrap();
    let (code, stderr) = sidecar_exit(&PodSpec::default().manifest(), &pod.ip.to_string()).await;
    assert_eq!(code, Some(2));
    assert!(stderr.contains("cannot listen on"), "{stderr}");
}

#[tokio::test]
async fn invalid_manifests_fail_at_start_naming_the_field() {
    let manifest = PodSpec::default()
        .manifest()
        .replace("maxEvents: 1024", "maxEvent: 1024");
    let (code, stderr) = sidecar_exit(&manifest, &addr::next_ip().to_string()).await;
    assert_eq!(code, Some(2));
    assert!(stderr.contains("spec.buffer.maxEvent"), "{stderr}");
}

#[tokio::test]
async fn fr3_replay_rebuilds_sessions_after_the_mcp_server_restarts() {
    let mut pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let counter = |id: u64| {
        let (client, session) = (client.clone(), session.clone());
        async move {
            let msgs = client
                .call(&session, id, "counter", json!({}))
                .await
                .unwrap();
            msgs.iter()
                .find_map(|m| result_text(m).map(str::to_owned))
                .unwrap()
        }
    };
    assert_eq!(counter(2).await, "1");
    assert_eq!(counter(3).await, "2");
    // A call in flight when the server dies ends with an error; it never hangs.
    let inflight = {
        let (client, session) = (client.clone(), session.clone());
        tokio::spawn(async move {
            let args = json!({"count": 100, "interval_ms": 50, "call_id": "doomed"});
            client.call(&session, 4, "slow", args).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    pod.restart_server().await.unwrap();
    // The client keeps its session id; the journal rebuilt the upstream session.
    let msgs = client
        .call(&session, 5, "echo", json!({"text": "still here"}))
        .await
        .unwrap();
    assert!(
        msgs.iter().any(|m| result_text(m) == Some("still here")),
        "{msgs:?}"
    );
    // Tool state the journal does not carry starts over (the documented limit of Replay).
    assert_eq!(counter(6).await, "1");
    let doomed = tokio::time::timeout(Duration::from_secs(30), inflight)
        .await
        .expect("the in-flight call ends")
        .unwrap()
        .unwrap();
    let last = doomed.last().expect("an answer for the in-flight call");
    assert_eq!(last["id"], 4);
    assert!(last["error"].is_object(), "{last}");
    assert_eq!(
        pod.metric("tether_sessions_rebuilt_total").await.unwrap(),
        1.0
    );
    assert_eq!(
        pod.metric("tether_not_found_total{reason=\"upstream_gone\"}")
            .await
            .unwrap(),
        0.0
    );
}

#[tokio::test]
async fn sigterm_finishes_calls_in_flight_and_an_idle_sidecar_stops_at_once() {
    let mut pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let call = {
        let (client, session) = (client.clone(), session.clone());
        tokio::spawn(async move {
            let args = json!({"count": 10, "interval_ms": 100, "call_id": "term"});
            client.call(&session, 2, "slow", args).await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let readyz = format!("{}/readyz", pod.admin_url);
    let stop = tokio::spawn(async move {
        let status = pod
            .terminate_sidecar(Duration::from_secs(30))
            .await
            .unwrap();
        (status, pod)
    });
    // While the call runs, the pod drains: no longer ready, still serving.
    let mut drained_status = StatusCode::OK;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if let Ok((status, _)) = client.http().get_text(&readyz).await {
            drained_status = status;
            if status == StatusCode::SERVICE_UNAVAILABLE {
                break;
            }
        }
    }
    assert_eq!(drained_status, StatusCode::SERVICE_UNAVAILABLE);
    let msgs = call.await.unwrap().unwrap();
    assert!(
        msgs.iter().any(|m| result_text(m) == Some("done 10")),
        "the call in flight finished: {msgs:?}"
    );
    let (status, pod) = stop.await.unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        pod.logs()
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    let mut idle = Pod::start_default().await.unwrap();
    let started = std::time::Instant::now();
    let status = idle
        .terminate_sidecar(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(status.is_some_and(|s| s.success()));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "an idle sidecar stops without waiting for drain.timeout: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn r03_after_a_rebuild_an_old_stream_never_gets_another_calls_events() {
    let mut pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let a = client
        .post(
            Some(&session),
            &tether_tests::client::tool_call(
                2,
                "slow",
                json!({"count": 40, "interval_ms": 100, "call_id": "a"}),
                Some("a"),
            ),
            &[],
        )
        .await
        .unwrap();
    let mut a = tether_tests::client::Events::new(a);
    for _ in 0..3 {
        a.next_within(Duration::from_secs(5)).await.unwrap();
    }
    pod.restart_server().await.unwrap();
    // B starts on the rebuilt upstream session, where rmcp numbers its streams from 0 again.
    // B runs longer than A's resume delay (rmcp's retry hint, 3 s), so a resume of A with its
    // old upstream event ids would land in B's stream.
    let plan = tether_tests::call::CallPlan::steady(50, 100);
    let b = tether_tests::call::slow(&client, &session, 3, "b", &plan)
        .await
        .unwrap();
    assert_eq!(b.lost(50), 0, "{:?}", b.failures);
    assert_eq!((b.foreign, b.duplicated), (0, 0));
    // A's stream ends with an error for A, and carries nothing of B.
    let mut rest = Vec::new();
    while let Some(ev) = a.next_within(Duration::from_secs(20)).await {
        rest.push(ev.data.unwrap_or_default());
    }
    assert!(
        rest.iter()
            .all(|d| !d.contains("\"progressToken\":\"b\"") && !d.contains("\"id\":3")),
        "{rest:?}"
    );
    let last: serde_json::Value =
        serde_json::from_str(rest.last().expect("an answer for A")).unwrap();
    assert_eq!(last["id"], 2);
    assert!(last["error"].is_object(), "{last}");
}

#[tokio::test]
async fn t09_the_get_stream_carries_on_after_a_rebuild() {
    let mut pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let mut get = tether_tests::client::Events::new(client.get(&session, None).await.unwrap());
    client
        .call(&session, 2, "notify", json!({"text": "before", "count": 3}))
        .await
        .unwrap();
    for _ in 0..3 {
        let ev = get.next_within(Duration::from_secs(5)).await.unwrap();
        assert!(ev.data.unwrap().contains("before"));
    }
    pod.restart_server().await.unwrap();
    client
        .call(&session, 3, "notify", json!({"text": "after", "count": 6}))
        .await
        .unwrap();
    let mut after = 0;
    while after < 6 {
        let ev = get
            .next_within(Duration::from_secs(15))
            .await
            .expect("notifications sent after the rebuild reach the open GET stream");
        if ev.data.is_some_and(|d| d.contains("after")) {
            after += 1;
        }
    }
}

#[tokio::test]
async fn s05_pin_every_request_of_a_lost_session_gets_404() {
    let mut pod = pinned_pod().await;
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    pod.restart_server().await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for id in 0..20 {
        let (client, session) = (client.clone(), session.clone());
        tasks.spawn(async move {
            let resp = client
                .post(Some(&session), &json!({"jsonrpc": "2.0", "id": 10 + id, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "x"}}}), &[])
                .await
                .unwrap();
            resp.status()
        });
    }
    while let Some(status) = tasks.join_next().await {
        assert_eq!(
            status.unwrap(),
            StatusCode::NOT_FOUND,
            "never a 200 without an answer"
        );
    }
}

#[tokio::test]
async fn a_rebuild_waits_for_a_server_that_is_not_ready_across_twenty_restarts() {
    // Each start of the MCP server refuses its first `initialize` with 503 (warming up): the
    // rebuild after each restart meets it, and the session waits instead of ending.
    let mut pod = Pod::start(PodSpec {
        server_args: vec!["--unready-initializes".into(), "1".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client().honouring_retry_after();
    let session = client.initialize("2025-11-25").await.unwrap();
    for round in 0..20u64 {
        pod.restart_server().await.unwrap();
        let call = tool_call(
            100 + round,
            "echo",
            json!({"text": format!("round {round}")}),
            None,
        );
        let resp = client.post(Some(&session), &call, &[]).await.unwrap();
        let status = resp.status();
        let text = body_text(resp).await.unwrap();
        assert_eq!(status, StatusCode::OK, "round {round}: {text}");
        assert!(
            text.contains(&format!("round {round}")),
            "round {round}: {text}"
        );
        assert!(!text.contains("ession not found"), "round {round}: {text}");
    }
    let not_ready = pod
        .metric(r#"tether_rejections_total{status="503",reason="upstream_not_ready"}"#)
        .await
        .unwrap();
    assert!(not_ready >= 20.0, "each round waited once: {not_ready}");
    assert_eq!(pod.metric("tether_not_found_total").await.unwrap(), 0.0);
    assert!(client.delete(&session).await.unwrap().is_success());
}

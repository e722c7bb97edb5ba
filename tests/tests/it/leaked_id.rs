//! What the holder of a leaked session id can do with a forged token naming the session's
//! caller — its `iss` and `sub`, signed by another key — which passes the session's binding
//! (claims are read, not verified: the MCP server verifies) but which the MCP server refuses:
//! nothing. Its cancellation of the caller's running call cancels nothing (here, nor at the pod
//! still running the call after a handoff), its journal entries are not kept, it never becomes
//! the credentials the sidecar's own requests carry, and while the MCP server is down nothing
//! is served from memory or ended on it.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use serde_json::json;
use tether_tests::addr;
use tether_tests::auth::Issuer;
use tether_tests::call::{self, CallPlan};
use tether_tests::client::{
    McpClient, Session, body_text, header_str, json_error, messages, tool_call,
};
use tether_tests::pod::{Pod, PodSpec, UPSTREAM_PORT};
use tether_tests::scenario::Scenario;
use tether_tests::tap::Tap;

const HOUR: Duration = Duration::from_secs(3600);

/// `Bearer <token>` of alice signed by `issuer`.
fn alice(issuer: &Issuer) -> String {
    issuer.bearer("https://idp.example", "alice", HOUR)
}

/// A client presenting a token naming alice that the MCP server refuses (another key).
fn mallory(client: McpClient) -> McpClient {
    client.set_authorization(Some(alice(&Issuer::new().unwrap())));
    client
}

/// `notifications/cancelled` for request `id`.
fn cancel(id: u64) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
           "params": {"requestId": id, "reason": "forged"}})
}

/// Posts `body` as `client`: the MCP server's 401 comes back.
async fn refused(client: &McpClient, session: &Session, body: &serde_json::Value) {
    let resp = client.post(Some(session), body, &[]).await.unwrap();
    let status = resp.status();
    let text = body_text(resp).await.unwrap_or_default();
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
}

/// The journal messages a rebuild replayed (request ids `tether-replay-<n>`) among the requests
/// `tap` saw.
fn replayed(tap: &Tap) -> Vec<serde_json::Value> {
    tap.recorded()
        .iter()
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(r.body()).ok())
        .filter(|m| {
            m["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("tether-replay-"))
        })
        .collect()
}

/// `logging/setLevel` to `level`, request `id`.
fn set_level(id: u64, level: &str) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "logging/setLevel", "params": {"level": level}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_token_cancels_nothing_journals_nothing_and_never_becomes_the_sessions() {
    let issuer = Issuer::new().unwrap();
    let (ip, front) = (addr::next_ip(), addr::next_ip());
    // Between the sidecar and the MCP server, a tap that records what the sidecar sends.
    let tap = Tap::start(
        (front, UPSTREAM_PORT).into(),
        (ip, UPSTREAM_PORT).into(),
        Arc::new(|_: &str| false),
    )
    .await
    .unwrap();
    let spec = PodSpec {
        server_args: issuer.server_args(),
        upstream_via: Some(tap.addr),
        ..PodSpec::default()
    };
    let mut pod = Pod::start_at(ip, spec).await.unwrap();
    let victim = pod.client();
    let token = alice(&issuer);
    victim.set_authorization(Some(token.clone()));
    let session = victim.initialize("2025-11-25").await.unwrap();
    let set = victim
        .post(Some(&session), &set_level(3, "warning"), &[])
        .await
        .unwrap();
    assert_eq!(set.status(), StatusCode::OK);
    drop(body_text(set).await);
    // Progress every 400 ms; the MCP server closes the SSE connection after the 2nd and the
    // sidecar resumes the upstream stream with the session's credentials (SEP-1699).
    let mut plan = CallPlan::steady(6, 400);
    plan.close_after = Some(2);
    let running = {
        let (victim, session) = (victim.clone(), session.clone());
        tokio::spawn(async move { call::slow(&victim, &session, 7, "victim", &plan).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mallory = mallory(pod.client());
    refused(&mallory, &session, &cancel(7)).await;
    refused(&mallory, &session, &set_level(8, "debug")).await;
    let subscribe = json!({"jsonrpc": "2.0", "id": 9, "method": "resources/subscribe",
                           "params": {"uri": "file:///forged"}});
    refused(&mallory, &session, &subscribe).await;
    let out = running.await.unwrap().unwrap();
    assert_eq!(
        out.progress,
        (1..=6).collect::<Vec<_>>(),
        "{:?}",
        out.failures
    );
    assert_eq!(out.result.as_deref(), Some("done 6"), "not cancelled");
    assert_eq!(
        pod.metric("tether_upstream_resumes_total").await.unwrap(),
        1.0
    );
    let resumes: Vec<_> = tap
        .recorded()
        .into_iter()
        .filter(|r| r.head().starts_with("GET ") && r.header("last-event-id").is_some())
        .collect();
    assert!(!resumes.is_empty(), "the sidecar resumed the call's stream");
    for resume in &resumes {
        assert_eq!(
            resume.header("authorization").as_deref(),
            Some(token.as_str()),
            "the session's credentials are alice's"
        );
    }
    // The MCP server restarts: alice's next request rebuilds the session from its journal.
    pod.restart_server().await.unwrap();
    // The tap closes the sidecar's idle connections after the server's: let the sidecar see it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = victim
        .call(&session, 10, "echo", json!({"text": "after the restart"}))
        .await
        .unwrap();
    assert!(answer.iter().any(|m| m["result"].is_object()), "{answer:?}");
    let replayed = replayed(&tap);
    let levels: Vec<_> = replayed
        .iter()
        .filter(|m| m["method"] == "logging/setLevel")
        .map(|m| m["params"]["level"].clone())
        .collect();
    assert_eq!(levels, [json!("warning")], "{replayed:?}");
    assert!(
        !replayed
            .iter()
            .any(|m| m["method"] == "resources/subscribe"),
        "{replayed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_cancel_after_a_handoff_cancels_nothing_at_the_pod_running_the_call() {
    let issuer = Issuer::new().unwrap();
    let mut scenario = Scenario::start(
        2,
        PodSpec {
            server_args: issuer.server_args(),
            ..PodSpec::default()
        },
    )
    .await;
    let via_a = scenario.via_a();
    via_a.set_authorization(Some(alice(&issuer)));
    let session = via_a.initialize("2025-11-25").await.unwrap();
    let plan = CallPlan::steady(8, 300);
    let running = {
        let (via_a, session) = (via_a.clone(), session.clone());
        tokio::spawn(async move { call::slow(&via_a, &session, 7, "victim", &plan).await })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    // A drains: the session moves to B while the call keeps running at A.
    let drain = scenario.drain_a().await;
    scenario.wait_moved(1.0).await;
    let mallory = mallory(scenario.via_rest());
    refused(&mallory, &session, &cancel(7)).await;
    let out = running.await.unwrap().unwrap();
    assert_eq!(out.result.as_deref(), Some("done 8"), "{:?}", out.failures);
    drop(scenario.stop_a(drain).await);
}

#[tokio::test]
async fn answers_from_memory_and_delete_fail_closed_while_the_mcp_server_is_down() {
    let issuer = Issuer::new().unwrap();
    let mut pod = Pod::start(PodSpec {
        server_args: issuer.server_args(),
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let victim = pod.client();
    victim.set_authorization(Some(alice(&issuer)));
    let session = victim.initialize("2025-11-25").await.unwrap();
    let call = tool_call(
        2,
        "slow",
        json!({"count": 3, "interval_ms": 10, "call_id": "c"}),
        Some("p"),
    );
    let resp = victim.post(Some(&session), &call, &[]).await.unwrap();
    let answer = messages(resp, Duration::from_secs(10)).await.unwrap();
    assert!(answer.iter().any(|m| m["result"].is_object()), "{answer:?}");
    pod.kill_server().await.unwrap();
    let mallory = mallory(pod.client());
    // A retry of the answered call, answered from memory: not on an unconfirmed credential.
    let resp = mallory.post(Some(&session), &call, &[]).await.unwrap();
    assert_eq!(header_str(&resp, "retry-after"), Some("1".into()));
    let (status, error) = json_error(resp).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{error}");
    assert_eq!(error["data"]["reason"], "credential_unconfirmed");
    // Nor ended.
    let status = mallory.delete(&session).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    pod.restart_server().await.unwrap();
    let resp = mallory.post(Some(&session), &call, &[]).await.unwrap();
    assert_eq!(
        resp.status(),
        StatusCode::UNAUTHORIZED,
        "judged once it can be"
    );
    // The session is alice's still: her retry is answered from memory.
    let resp = victim.post(Some(&session), &call, &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let again = messages(resp, Duration::from_secs(10)).await.unwrap();
    assert!(again.iter().any(|m| m["result"].is_object()), "{again:?}");
}

//! No client or principal takes a pod from the others: calls in flight are bounded and counted
//! (a client that starts long calls and walks away cannot make the pod, or the MCP server behind
//! it, carry any number of them), and one principal holds at most its share of the sessions.

use std::time::Duration;

use http::StatusCode;
use serde_json::json;
use tether_tests::auth::Issuer;
use tether_tests::client::{
    McpClient, Session, body_text, expect_error, header_str, initialize_body, json_error,
};
use tether_tests::pod::{Pod, PodSpec};

/// Starts a `slow` call of about two seconds in `session` and walks away once its answer has
/// begun; the reason of a refusal (with its status) otherwise.
async fn call_and_walk_away(
    client: &McpClient,
    session: &Session,
    id: &str,
) -> Result<(), (StatusCode, String)> {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "slow", "arguments": {"count": 2, "interval_ms": 1_000, "call_id": id}}});
    let resp = client.post(Some(session), &body, &[]).await.unwrap();
    let status = resp.status();
    if status == StatusCode::OK {
        return Ok(());
    }
    assert_eq!(header_str(&resp, "retry-after"), Some("1".into()));
    let (_, error) = json_error(resp).await.unwrap();
    Err((
        status,
        error["data"]["reason"].as_str().unwrap_or("").to_owned(),
    ))
}

#[tokio::test]
async fn calls_a_client_walked_away_from_are_bounded_per_session_and_per_pod() {
    let pod = Pod::start(PodSpec {
        sidecar_args: ["--max-session-calls", "3", "--max-calls", "5"]
            .map(String::from)
            .to_vec(),
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    let [greedy, other, third] = [(); 3].map(|()| client.initialize("2025-11-25"));
    let (greedy, other, third) = (
        greedy.await.unwrap(),
        other.await.unwrap(),
        third.await.unwrap(),
    );
    for n in 0..3 {
        call_and_walk_away(&client, &greedy, &format!("greedy-{n}"))
            .await
            .unwrap();
    }
    let running = pod
        .wait_for_metric("tether_calls_in_flight", Duration::from_secs(5), |v| {
            v == 3.0
        })
        .await
        .unwrap();
    assert_eq!(running, 3.0, "counted while nobody reads them");
    assert_eq!(
        call_and_walk_away(&client, &greedy, "greedy-3").await,
        Err((StatusCode::TOO_MANY_REQUESTS, "session_calls".into()))
    );
    // A retry of a running call joins it: it takes no slot and is never refused for one.
    call_and_walk_away(&client, &greedy, "greedy-0")
        .await
        .unwrap();
    // The other sessions share what is left of the pod's bound.
    for n in 0..2 {
        call_and_walk_away(&client, &other, &format!("other-{n}"))
            .await
            .unwrap();
    }
    assert_eq!(
        call_and_walk_away(&client, &third, "third-0").await,
        Err((StatusCode::TOO_MANY_REQUESTS, "pod_calls".into()))
    );
    // The calls end at the MCP server whether read or not, and give their slots back.
    pod.wait_for_metric("tether_calls_in_flight", Duration::from_secs(10), |v| {
        v == 0.0
    })
    .await
    .unwrap();
    // The refused request was never sent, so its retry is.
    call_and_walk_away(&client, &greedy, "greedy-3")
        .await
        .unwrap();
    let body = json!({"jsonrpc": "2.0", "id": "after", "method": "tools/call", "params": {
        "name": "slow", "arguments": {"count": 1, "interval_ms": 10, "call_id": "after"}}});
    let resp = client.post(Some(&greedy), &body, &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let text = body_text(resp).await.unwrap();
    assert!(text.contains(r#""result""#), "{text}");
    let refused = pod
        .metric(r#"tether_rejections_total{status="429",reason="session_calls"}"#)
        .await
        .unwrap();
    assert_eq!(refused, 1.0);
}

#[tokio::test]
async fn one_principal_holds_its_share_of_the_sessions_and_the_others_the_rest() {
    let issuer = Issuer::new().unwrap();
    let pod = Pod::start(PodSpec {
        server_args: issuer.server_args(),
        sidecar_args: ["--max-principal-sessions", "3"].map(String::from).to_vec(),
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let as_user = |sub: &str| {
        let client = pod.client();
        client.set_authorization(Some(issuer.bearer("https://idp.example", sub, HOUR)));
        client
    };
    let (mallory, alice) = (as_user("mallory"), as_user("alice"));
    for _ in 0..3 {
        mallory.initialize("2025-11-25").await.unwrap();
    }
    let refused = mallory
        .post(None, &initialize_body(1, "2025-11-25"), &[])
        .await
        .unwrap();
    assert_eq!(header_str(&refused, "retry-after"), Some("1".into()));
    expect_error(refused, StatusCode::TOO_MANY_REQUESTS, "principal_sessions")
        .await
        .unwrap();
    for _ in 0..3 {
        alice.initialize("2025-11-25").await.unwrap();
    }
    assert_eq!(pod.metric("tether_sessions").await.unwrap(), 6.0);
}

const HOUR: Duration = Duration::from_secs(3600);

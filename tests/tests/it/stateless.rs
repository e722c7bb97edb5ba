//! 2026-07-28 (stateless) traffic through a real pod: passed through without sessions, and a
//! client disconnect cancels the upstream request (spec L-05, S-10, R-08).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use tether_tests::client::{ACCEPT_BOTH, Events, body_text, header_str};
use tether_tests::pod::Pod;

const V4: &str = "2026-07-28";

fn call(id: u64, name: &str, arguments: Value, token: Option<&str>) -> Bytes {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": V4,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "tether-tests", "version": "0"}
    });
    if let Some(t) = token {
        meta["progressToken"] = json!(t);
    }
    let body = json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": meta}
    });
    Bytes::from(body.to_string())
}

async fn post(
    pod: &Pod,
    name: &'static str,
    body: Bytes,
    stale_sid: Option<&str>,
) -> http::Response<hyper::body::Incoming> {
    let mut h = vec![
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
        ("mcp-protocol-version", V4),
        ("mcp-method", "tools/call"),
        ("mcp-name", name),
    ];
    if let Some(sid) = stale_sid {
        h.push(("mcp-session-id", sid));
        h.push(("last-event-id", "abcdefghijkl-1"));
    }
    pod.client()
        .http()
        .send(Method::POST, &pod.mcp_url, &h, Some(body))
        .await
        .unwrap()
}

#[tokio::test]
async fn s10_stateless_requests_pass_through_without_session_headers() {
    let pod = Pod::start_default().await.unwrap();
    let resp = post(
        &pod,
        "echo",
        call(2, "echo", json!({"text": "v4"}), None),
        Some("stale-session"),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers().get("mcp-session-id").is_none(),
        "never minted or echoed"
    );
    assert!(header_str(&resp, "access-control-expose-headers").is_some());
    assert!(body_text(resp).await.unwrap().contains("\"text\":\"v4\""));
    assert_eq!(
        pod.metric("tether_sessions_created_total").await.unwrap(),
        0.0
    );
    assert_eq!(
        pod.metric("tether_requests_total{method=\"POST\",era=\"stateless\"}")
            .await
            .unwrap(),
        1.0
    );
}

#[tokio::test]
async fn l05_fr19_a_disconnect_cancels_the_upstream_request() {
    let pod = Pod::start_default().await.unwrap();
    let args = json!({"count": 40, "interval_ms": 50, "call_id": "v4-cut"});
    let resp = post(&pod, "slow", call(2, "slow", args, Some("v4-cut")), None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut events = Events::new(resp);
    let first = events.next_within(Duration::from_secs(5)).await.unwrap();
    assert!(first.data.unwrap().contains("notifications/progress"));
    drop(events);
    let stats = pod
        .wait_for_stats(Duration::from_secs(5), |stats| stats["aborted"] == 1)
        .await
        .unwrap();
    assert_eq!(stats["aborted"], 1, "upstream request aborted: {stats}");
    assert_eq!(stats["completed"], 0);
}

#[tokio::test]
async fn stateless_get_and_delete_reach_the_upstream_unchanged() {
    let pod = Pod::start_default().await.unwrap();
    let http = pod.client().http().clone();
    for method in [Method::GET, Method::DELETE] {
        let resp = http
            .send(
                method.clone(),
                &pod.mcp_url,
                &[
                    ("accept", "text/event-stream"),
                    ("mcp-protocol-version", V4),
                ],
                None,
            )
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} (S-10)"
        );
    }
}

#[tokio::test]
async fn p04_initialize_does_not_exist_in_2026_07_28() {
    let pod = Pod::start_default().await.unwrap();
    let body = Bytes::from(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": V4, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
        .to_string(),
    );
    let h = [
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
        ("mcp-protocol-version", V4),
        ("mcp-method", "initialize"),
    ];
    let resp = pod
        .client()
        .http()
        .send(Method::POST, &pod.mcp_url, &h, Some(body.clone()))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(body_text(resp).await.unwrap().contains("-32601"));
    // Without `Mcp-Method` (required in 2026-07-28, P-05) it is refused before the upstream.
    let resp = pod
        .client()
        .http()
        .send(Method::POST, &pod.mcp_url, &h[..3], Some(body))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(resp.headers().get("mcp-session-id").is_none());
    assert!(
        body_text(resp)
            .await
            .unwrap()
            .contains("missing_mcp_method")
    );
}

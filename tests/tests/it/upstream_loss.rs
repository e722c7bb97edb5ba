//! An MCP server that refuses connections or breaks an exchange mid-call: the client learns
//! whether its request provably never reached the server (503 with `Retry-After`,
//! `data.notProcessed: true`: sending it again is safe) or may have run (502,
//! `data.notProcessed: false`), with its request's id, in both eras — and never a 400, 404 or
//! 405, which a dual-era client reads as a server of the legacy era
//! (`docs/reference/status-codes.md`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};
use tether_tests::client::{body_text, header_str, tool_call};
use tether_tests::modern;
use tether_tests::pod::{Pod, PodSpec, UPSTREAM_PORT};
use tether_tests::tap::Tap;

/// The JSON-RPC error of an answer, as text.
fn error_of(text: &str) -> Value {
    modern::last_message(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn quick_slow(call_id: &str) -> Value {
    json!({"name": "slow", "arguments": {"count": 0, "interval_ms": 1, "call_id": call_id}})
}

#[tokio::test]
async fn a_request_that_never_reached_the_server_is_503_not_processed_and_one_that_may_have_run_is_502()
 {
    let (ip, front) = (tether_tests::addr::next_ip(), tether_tests::addr::next_ip());
    // Between the sidecar and the MCP server, a tap that, while `cut` holds, lets each request
    // reach the server and run, then cuts the connection at the first byte of its answer.
    let cut = Arc::new(AtomicBool::new(false));
    let cutting = Arc::clone(&cut);
    let tap = Tap::start(
        (front, UPSTREAM_PORT).into(),
        (ip, UPSTREAM_PORT).into(),
        Arc::new(move |_: &str| cutting.load(Ordering::SeqCst)),
    )
    .await
    .unwrap();
    let spec = PodSpec {
        upstream_via: Some(tap.addr),
        ..PodSpec::default()
    };
    let mut pod = Pod::start_at(ip, spec).await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();

    // Reached, its answer lost: it ran, and the client is told it may have.
    cut.store(true, Ordering::SeqCst);
    let (status, answer) = modern::request(
        &client,
        &pod.mcp_url,
        5,
        "tools/call",
        Some("slow"),
        quick_slow("lost-2026"),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{answer}");
    assert_eq!(answer["id"], 5, "{answer}");
    assert_eq!(answer["error"]["data"]["reason"], "upstream_answer_lost");
    assert_eq!(answer["error"]["data"]["notProcessed"], false, "{answer}");
    let call = tool_call(
        6,
        "slow",
        quick_slow("lost-session")["arguments"].clone(),
        None,
    );
    let resp = client.post(Some(&session), &call, &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(
        header_str(&resp, "retry-after"),
        None,
        "a retry could run it twice"
    );
    let answer = error_of(&body_text(resp).await.unwrap());
    assert_eq!(answer["id"], 6, "{answer}");
    assert_eq!(answer["error"]["data"]["notProcessed"], false, "{answer}");
    let stats = pod.stats().await.unwrap();
    assert_eq!(stats["calls"]["lost-2026"], 1, "it ran: {stats}");
    assert_eq!(stats["calls"]["lost-session"], 1, "it ran: {stats}");

    // Never reached: nothing accepts connections where the sidecar dials.
    cut.store(false, Ordering::SeqCst);
    drop(tap);
    pod.kill_server().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, answer) = modern::request(
        &client,
        &pod.mcp_url,
        7,
        "tools/call",
        Some("slow"),
        quick_slow("refused-2026"),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(answer["id"], 7, "{answer}");
    assert_eq!(answer["error"]["data"]["reason"], "upstream_unavailable");
    assert_eq!(answer["error"]["data"]["notProcessed"], true, "{answer}");
    let call = tool_call(
        8,
        "slow",
        quick_slow("refused-session")["arguments"].clone(),
        None,
    );
    let resp = client.post(Some(&session), &call, &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header_str(&resp, "retry-after").as_deref(), Some("1"));
    let answer = error_of(&body_text(resp).await.unwrap());
    assert_eq!(answer["id"], 8, "{answer}");
    assert_eq!(answer["error"]["data"]["notProcessed"], true, "{answer}");

    let errors = |reason: &str| format!(r#"tether_upstream_errors_total{{reason="{reason}"}}"#);
    assert_eq!(pod.metric(&errors("lost")).await.unwrap(), 2.0);
    assert!(pod.metric(&errors("refused")).await.unwrap() >= 2.0);
}

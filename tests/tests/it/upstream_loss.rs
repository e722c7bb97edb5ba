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
use tether_tests::client::{McpClient, Session, body_text, header_str, tool_call};
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

/// What a client is told when the MCP server cannot answer.
struct Told {
    status: StatusCode,
    /// `data.reason` (checked on the 2026-07-28 answer).
    reason: &'static str,
    /// `data.notProcessed`.
    not_processed: bool,
    /// `Retry-After` (checked on the session's answer).
    retry_after: Option<&'static str>,
}

/// Calls `slow` as a 2026-07-28 request `id` (call id `<tag>-2026`) at `url`, then in
/// `session` as request `id + 1` (`<tag>-session`): both are answered as `told` says, naming
/// their request's id.
async fn both_eras(
    client: &McpClient,
    url: &str,
    session: &Session,
    id: u64,
    tag: &str,
    told: &Told,
) {
    let (status, answer) = modern::request(
        client,
        url,
        id,
        "tools/call",
        Some("slow"),
        quick_slow(&format!("{tag}-2026")),
    )
    .await
    .unwrap();
    assert_eq!(status, told.status, "{answer}");
    assert_eq!(answer["id"], id, "{answer}");
    assert_eq!(answer["error"]["data"]["reason"], told.reason);
    assert_eq!(
        answer["error"]["data"]["notProcessed"], told.not_processed,
        "{answer}"
    );
    let arguments = quick_slow(&format!("{tag}-session"))["arguments"].clone();
    let call = tool_call(id + 1, "slow", arguments, None);
    let resp = client.post(Some(session), &call, &[]).await.unwrap();
    assert_eq!(resp.status(), told.status);
    assert_eq!(
        header_str(&resp, "retry-after").as_deref(),
        told.retry_after,
        "a retry could run it twice unless it never reached the server"
    );
    let answer = error_of(&body_text(resp).await.unwrap());
    assert_eq!(answer["id"], id + 1, "{answer}");
    assert_eq!(
        answer["error"]["data"]["notProcessed"], told.not_processed,
        "{answer}"
    );
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
    let told = Told {
        status: StatusCode::BAD_GATEWAY,
        reason: "upstream_answer_lost",
        not_processed: false,
        retry_after: None,
    };
    both_eras(&client, &pod.mcp_url, &session, 5, "lost", &told).await;
    let stats = pod.stats().await.unwrap();
    assert_eq!(stats["calls"]["lost-2026"], 1, "it ran: {stats}");
    assert_eq!(stats["calls"]["lost-session"], 1, "it ran: {stats}");

    // Never reached: nothing accepts connections where the sidecar dials.
    cut.store(false, Ordering::SeqCst);
    drop(tap);
    pod.kill_server().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let told = Told {
        status: StatusCode::SERVICE_UNAVAILABLE,
        reason: "upstream_unavailable",
        not_processed: true,
        retry_after: Some("1"),
    };
    both_eras(&client, &pod.mcp_url, &session, 7, "refused", &told).await;

    let errors = |reason: &str| format!(r#"tether_upstream_errors_total{{reason="{reason}"}}"#);
    assert_eq!(pod.metric(&errors("lost")).await.unwrap(), 2.0);
    assert!(pod.metric(&errors("refused")).await.unwrap() >= 2.0);
}

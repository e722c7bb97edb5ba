//! No client or principal takes a pod from the others: calls in flight are bounded and counted
//! (a client that starts long calls and walks away cannot make the pod, or the MCP server behind
//! it, carry any number of them), one principal holds at most its share of the sessions, and
//! at most its share of the bytes the pod cannot free (answers nobody read yet).

use std::time::Duration;

use http::StatusCode;
use serde_json::json;
use tether_tests::auth::Issuer;
use tether_tests::client::{
    Events, McpClient, Session, body_text, expect_error, header_str, initialize_body, json_error,
    messages, result_text, tool_call,
};
use tether_tests::pod::{LISTEN_PORT, Pod, PodSpec};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

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
    let bytes = pod
        .wait_for_metric(
            r#"tether_retained_bytes{kind="calls"}"#,
            Duration::from_secs(5),
            |v| v > 0.0,
        )
        .await
        .unwrap();
    assert_eq!(bytes, 3.0 * 100.0 * 1024.0, "and their cost shown");
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
    let (mallory, alice) = (
        as_user(&pod, &issuer, "mallory"),
        as_user(&pod, &issuer, "alice"),
    );
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

/// Sends a `slow` call of 20 progress events 10 ms apart (about 2 KiB of events) in `session`
/// as `authorization` over a connection closed as soon as the request is written: the call
/// runs on, its events are buffered, and no client is ever sent one. Waits until the call
/// ended at the MCP server; whether it was refused with `principal_retained` instead.
async fn call_unread(pod: &Pod, session: &Session, authorization: &str, id: u64) -> bool {
    let refused =
        || pod.metric(r#"tether_rejections_total{status="429",reason="principal_retained"}"#);
    let before = refused().await.unwrap();
    let body = tool_call(
        id,
        "slow",
        json!({"count": 20, "interval_ms": 10, "call_id": id.to_string()}),
        Some("p"),
    )
    .to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-session-id: {}\r\n\
         mcp-protocol-version: {}\r\nauthorization: {authorization}\r\n\
         content-length: {}\r\n\r\n{body}",
        pod.ip,
        session.id,
        session.version,
        body.len()
    );
    let mut conn = TcpStream::connect((pod.ip, LISTEN_PORT)).await.unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    drop(conn);
    tokio::time::sleep(Duration::from_millis(100)).await;
    pod.wait_for_metric("tether_calls_in_flight", Duration::from_secs(10), |v| {
        v == 0.0
    })
    .await
    .unwrap();
    refused().await.unwrap() > before
}

#[tokio::test]
async fn one_caller_cannot_fill_the_pod_with_answers_it_never_reads() {
    let issuer = Issuer::new().unwrap();
    // 64 KiB for the pod: a caller may pin a quarter of it (the default share).
    let pod = Pod::start(PodSpec {
        server_args: issuer.server_args(),
        sidecar_args: ["--pod-retained-bytes", "65536", "--unread-ttl", "6s"]
            .map(String::from)
            .to_vec(),
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let (mallory, alice) = (
        as_user(&pod, &issuer, "mallory"),
        as_user(&pod, &issuer, "alice"),
    );
    let mallorys = issuer.bearer("https://idp.example", "mallory", HOUR);
    mallory.set_authorization(Some(mallorys.clone()));
    let sessions = [
        mallory.initialize("2025-11-25").await.unwrap(),
        mallory.initialize("2025-11-25").await.unwrap(),
    ];
    let mut calls = 0;
    while !call_unread(&pod, &sessions[calls % 2], &mallorys, calls as u64).await {
        calls += 1;
        assert!(
            calls < 40,
            "a caller that never reads is stopped at its share"
        );
    }
    // Stopped at its share (16 KiB of 64), not at the pod's budget.
    let unsent = pod
        .wait_for_metric("tether_buffer_unsent_bytes", Duration::from_secs(5), |v| {
            v >= 12_000.0
        })
        .await
        .unwrap();
    assert!(
        (12_000.0..32_768.0).contains(&unsent),
        "{unsent} unsent bytes after {calls} calls: the caller's share and at most one call more"
    );
    let echo = tool_call(99, "echo", json!({"text": "x"}), None);
    let refused = mallory.post(Some(&sessions[0]), &echo, &[]).await.unwrap();
    assert_eq!(header_str(&refused, "retry-after"), Some("1".into()));
    expect_error(refused, StatusCode::TOO_MANY_REQUESTS, "principal_retained")
        .await
        .unwrap();
    // Everyone else is served as before: a new session, a call read to its end.
    let alice_session = alice.initialize("2025-11-25").await.unwrap();
    let answer = alice
        .call(&alice_session, 1, "echo", json!({"text": "still here"}))
        .await
        .unwrap();
    assert_eq!(answer.last().and_then(result_text), Some("still here"));
    // A stream its reader left mid-way keeps `buffer.ttl`: alice reads two events of a call,
    // drops the connection, and resumes after mallory's unread streams are gone.
    let body = tool_call(
        2,
        "slow",
        json!({"count": 20, "interval_ms": 20, "call_id": "alice"}),
        Some("a"),
    );
    let resp = alice.post(Some(&alice_session), &body, &[]).await.unwrap();
    let mut events = Events::new(resp);
    let mut last_id = None;
    for _ in 0..2 {
        let ev = events.next_within(Duration::from_secs(5)).await.unwrap();
        last_id = ev.id.or(last_id);
    }
    drop(events);
    // Never read: gone after `--unread-ttl`, and the caller may call again.
    // What stays: alice's stream (about 2 KiB), and at most one of mallory's whose first event
    // raced the connection's close.
    let left = pod
        .wait_for_metric("tether_buffer_unsent_bytes", Duration::from_secs(20), |v| {
            v < 8_192.0
        })
        .await
        .unwrap();
    assert!(left < 8_192.0, "{left} unsent bytes after --unread-ttl");
    let evicted = pod
        .metric(r#"tether_buffer_evictions_total{reason="unread_ttl"}"#)
        .await
        .unwrap();
    assert!(evicted >= 20.0 * 4.0, "{evicted} unread events evicted");
    assert!(
        !call_unread(&pod, &sessions[0], &mallorys, 100).await,
        "room again"
    );
    let resp = alice
        .get(&alice_session, Some(last_id.as_deref().unwrap()))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let rest = messages(resp, Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        rest.last().and_then(result_text),
        Some("done 20"),
        "{rest:?}"
    );
}

#[tokio::test]
async fn a_full_pod_sheds_the_callers_over_their_fair_share_and_admits_the_others() {
    let issuer = Issuer::new().unwrap();
    // 64 KiB for the pod, each caller may pin 40,000 bytes: two callers can fill it.
    let pod = Pod::start(PodSpec {
        server_args: issuer.server_args(),
        sidecar_args: [
            "--pod-retained-bytes",
            "65536",
            "--max-principal-retained-bytes",
            "40000",
        ]
        .map(String::from)
        .to_vec(),
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let bearer = |sub: &str| issuer.bearer("https://idp.example", sub, HOUR);
    let session_of = async |sub: &str| {
        let client = pod.client();
        client.set_authorization(Some(bearer(sub)));
        client.initialize("2025-11-25").await.unwrap()
    };
    let (first, second) = (session_of("first").await, session_of("second").await);
    let fill = async |session: &Session, sub: &str| {
        for id in 0..40 {
            if call_unread(&pod, session, &bearer(sub), id).await {
                return id;
            }
        }
        panic!("{sub} was never stopped");
    };
    fill(&first, "first").await;
    let shed = r#"tether_buffer_evictions_total{reason="principal_share"}"#;
    assert_eq!(pod.metric(shed).await.unwrap(), 0.0, "the pod had room");
    // The second caller fills the pod; under its fair share (half of it) it is admitted and
    // the first caller's unread answers make room; at its fair share it is refused.
    fill(&second, "second").await;
    let evicted = pod.metric(shed).await.unwrap();
    assert!(
        evicted > 0.0,
        "the caller over its fair share gave up unread events"
    );
    // A third caller, pinning nothing, is served whatever the others did.
    let third = pod.client();
    third.set_authorization(Some(bearer("third")));
    let session = third.initialize("2025-11-25").await.unwrap();
    let answer = third
        .call(
            &session,
            1,
            "slow",
            json!({"count": 3, "interval_ms": 10, "call_id": "t"}),
        )
        .await
        .unwrap();
    assert_eq!(answer.last().and_then(result_text), Some("done 3"));
}

/// A client of `pod` presenting `sub`'s token from `issuer`.
fn as_user(pod: &Pod, issuer: &Issuer, sub: &str) -> McpClient {
    let client = pod.client();
    client.set_authorization(Some(issuer.bearer("https://idp.example", sub, HOUR)));
    client
}

const HOUR: Duration = Duration::from_secs(3600);

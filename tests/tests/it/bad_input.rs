//! Bad input through a real pod: each gets a clear 4xx (or a timeout), never a panic, and the
//! pod keeps serving other sessions; with it, the connection limits (head deadline and size,
//! connection cap, take-overs) that bound what a misbehaving client costs.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::json;
use tether_tests::addr;
use tether_tests::call::{self, CallPlan};
use tether_tests::client::Http;
use tether_tests::client::{
    ACCEPT_BOTH, McpClient, Session, body_text, expect_error, header_str, initialize_body,
    json_error, tool_call,
};
use tether_tests::pod::{ADMIN_PORT, LISTEN_PORT, Pod, PodSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Checks the pod still serves a complete session with a streamed tool call.
async fn still_serving(pod: &Pod) {
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let plan = CallPlan {
        cuts: vec![1],
        pause: Duration::from_millis(10),
        ..CallPlan::steady(3, 10)
    };
    let out = call::slow(&client, &session, 2, &format!("alive-{}", rand_id()), &plan)
        .await
        .unwrap();
    assert_eq!(out.lost(3), 0, "{:?}", out.failures);
    assert!(!pod.sidecar_log().contains("panicked"), "{}", pod.logs());
}

fn rand_id() -> u128 {
    Instant::now().elapsed().as_nanos() ^ u128::from(std::process::id())
}

/// Sends raw bytes and returns the status line of the answer (empty when the connection closed).
async fn raw(pod: &Pod, request: &[u8]) -> String {
    let mut conn = TcpStream::connect((pod.ip, LISTEN_PORT)).await.unwrap();
    conn.write_all(request).await.unwrap();
    status_line(&answer(&mut conn).await)
}

/// The first read of an answer on `conn`, as text (empty when the connection closed).
async fn answer(conn: &mut TcpStream) -> String {
    let mut buf = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
        .await
        .map_or(0, |r| r.unwrap_or(0));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// A connection to `port` of `pod` from the loopback address `source` (a client of its own, as
/// the pod's per-source bounds see it).
async fn connect_from(source: std::net::Ipv4Addr, pod: &Pod, port: u16) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind((source, 0).into()).unwrap();
    socket.connect((pod.ip, port).into()).await.unwrap()
}

fn status_line(answer: &str) -> String {
    answer.lines().next().unwrap_or("").to_owned()
}

/// Whether `conn` is closed by the other side: the next read ends (EOF or reset) within 10 s.
async fn closed(conn: &mut TcpStream) -> bool {
    let mut buf = [0; 1024];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// A request every connection gets an answer of its own for: a GET without a session (400
/// `session_required`), which keeps the connection alive.
const SESSIONLESS_GET: &[u8] = b"GET /mcp HTTP/1.1\r\nhost: x\r\naccept: text/event-stream\r\n\r\n";

#[tokio::test]
async fn oversized_and_malformed_bodies_get_4xx() {
    let pod = Pod::start(PodSpec {
        sidecar_args: vec!["--max-request-bytes".into(), "65536".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let http = client.http();
    let post = |body: Bytes| {
        let url = pod.mcp_url.clone();
        let sid = session.id.clone();
        async move {
            let h = [
                ("accept", ACCEPT_BOTH),
                ("content-type", "application/json"),
                ("mcp-session-id", sid.as_str()),
            ];
            let resp = http.send(Method::POST, &url, &h, Some(body)).await.unwrap();
            let status = resp.status();
            (status, body_text(resp).await.unwrap())
        }
    };
    let big = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "x".repeat(100_000)}}});
    let (status, body) = post(Bytes::from(big.to_string())).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    let (status, body) = post(Bytes::from_static(b"{not json")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("-32700"), "{body}");
    let (status, body) = post(Bytes::from_static(
        br#"{"jsonrpc":"1.0","id":2,"method":"x"}"#,
    ))
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("-32600"), "{body}");
    let (status, _) = post(Bytes::from_static(b"\xff\xfe\x00")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // Chunked bodies are bounded too (no Content-Length to check up front).
    let mut chunked = format!(
        "POST /mcp HTTP/1.1\r\nhost: x\r\naccept: {ACCEPT_BOTH}\r\ncontent-type: application/json\r\n\
         mcp-session-id: {}\r\ntransfer-encoding: chunked\r\n\r\n",
        session.id
    )
    .into_bytes();
    for _ in 0..20 {
        chunked.extend_from_slice(format!("{:x}\r\n{}\r\n", 8192, "y".repeat(8192)).as_bytes());
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    assert!(raw(&pod, &chunked).await.contains("413"));
    still_serving(&pod).await;
}

#[tokio::test]
async fn invalid_header_bytes_and_huge_cursors_get_400() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-11-25").await.unwrap();
    let bad_sid = format!(
        "POST /mcp HTTP/1.1\r\nhost: x\r\naccept: {ACCEPT_BOTH}\r\ncontent-type: application/json\r\n\
         mcp-session-id: café\r\ncontent-length: 2\r\n\r\n{{}}"
    );
    assert!(raw(&pod, bad_sid.as_bytes()).await.contains("400"));
    let bad_version = b"POST /mcp HTTP/1.1\r\nhost: x\r\naccept: application/json, text/event-stream\r\n\
        content-type: application/json\r\nmcp-protocol-version: \xff\xfe\r\ncontent-length: 2\r\n\r\n{}";
    assert!(raw(&pod, bad_version).await.contains("400"));
    let huge = format!(
        "GET /mcp HTTP/1.1\r\nhost: x\r\naccept: text/event-stream\r\nmcp-session-id: {}\r\n\
         last-event-id: {}\r\n\r\n",
        session.id,
        "9".repeat(1_000_000)
    );
    let status = raw(&pod, huge.as_bytes()).await;
    assert!(
        status.contains(" 4"),
        "a million-character Last-Event-ID gets a 4xx: {status:?}"
    );
    still_serving(&pod).await;
}

#[tokio::test]
async fn slow_loris_clients_time_out_and_others_are_served() {
    let pod = Pod::start(PodSpec {
        sidecar_args: vec!["--request-timeout".into(), "1s".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let session = pod.client().initialize("2025-11-25").await.unwrap();
    // Headers trickled byte by byte, forever.
    let mut trickles = Vec::new();
    for _ in 0..20 {
        let mut conn = TcpStream::connect((pod.ip, LISTEN_PORT)).await.unwrap();
        trickles.push(tokio::spawn(async move {
            for b in b"POST /mcp HTTP/1.1\r\nhost: x\r\n"
                .iter()
                .cycle()
                .take(200)
            {
                if conn.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    // A body trickled after complete headers: 408 after --request-timeout.
    let mut conn = TcpStream::connect((pod.ip, LISTEN_PORT)).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: x\r\naccept: {ACCEPT_BOTH}\r\ncontent-type: application/json\r\n\
         mcp-session-id: {}\r\ncontent-length: 1000\r\n\r\n{{",
        session.id
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    still_serving(&pod).await;
    let mut buf = vec![0; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(5));
    for t in trickles {
        t.abort();
    }
}

#[tokio::test]
async fn pipelined_requests_are_all_answered_in_order() {
    let pod = Pod::start_default().await.unwrap();
    let session = pod.client().initialize("2025-11-25").await.unwrap();
    let mut pipelined = Vec::new();
    for id in [2, 3, 4] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"p{id}"}}}}}}"#
        );
        pipelined.extend_from_slice(
            format!(
                "POST /mcp HTTP/1.1\r\nhost: x\r\naccept: {ACCEPT_BOTH}\r\ncontent-type: application/json\r\n\
                 mcp-session-id: {}\r\ncontent-length: {}\r\n\r\n{body}",
                session.id,
                body.len()
            )
            .as_bytes(),
        );
    }
    let mut conn = TcpStream::connect((pod.ip, LISTEN_PORT)).await.unwrap();
    conn.write_all(&pipelined).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = vec![0; 8192];
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let text = String::from_utf8_lossy(&answer).into_owned();
        if ["p2", "p3", "p4"]
            .iter()
            .all(|p| text.contains(&format!("\"text\":\"{p}\"")))
        {
            break;
        }
        match tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&answer);
    let positions: Vec<usize> = ["p2", "p3", "p4"]
        .iter()
        .map(|p| {
            text.find(&format!("\"text\":\"{p}\""))
                .unwrap_or(usize::MAX)
        })
        .collect();
    assert!(
        positions.iter().all(|p| *p != usize::MAX),
        "not every request answered:\n{text}"
    );
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "answers out of order:\n{text}"
    );
}

/// A batch of `n` `echo` calls with ids from `first`.
fn echo_batch(n: usize, first: usize) -> serde_json::Value {
    let calls: Vec<serde_json::Value> = (first..first + n)
        .map(|id| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                         "params": {"name": "echo", "arguments": {"text": "x"}}})
        })
        .collect();
    json!(calls)
}

#[tokio::test]
async fn b01_batches_and_ids_are_bounded_before_they_cost_the_pod() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-03-26").await.unwrap();
    let refused = |resp: http::Response<hyper::body::Incoming>| async move {
        let status = resp.status();
        (status, body_text(resp).await.unwrap())
    };
    // --max-batch (64) members are served; one more is a 400 naming the limit.
    let resp = client
        .post(Some(&session), &echo_batch(64, 10), &[])
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    drop(body_text(resp).await);
    let resp = client
        .post(Some(&session), &echo_batch(65, 100), &[])
        .await
        .unwrap();
    let (status, body) = refused(resp).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("-32600") && body.contains("at most 64 messages (--max-batch)"),
        "{body}"
    );
    // A request id of 1 MiB: refused, not kept.
    let long_id = json!({"jsonrpc": "2.0", "id": "i".repeat(1 << 20), "method": "tools/call",
                         "params": {"name": "echo", "arguments": {"text": "x"}}});
    let (status, body) = refused(client.post(Some(&session), &long_id, &[]).await.unwrap()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("at most 256 bytes"), "{body}");
    // Meanwhile another session's calls go on (their latency is measured by
    // `tether-bench-hostile`; here they must all be answered).
    let background = {
        let client = pod.client();
        let victim = client.initialize("2025-11-25").await.unwrap();
        tokio::spawn(async move {
            for id in 0..50 {
                let answer = client
                    .call(&victim, 5_000 + id, "echo", json!({"text": "bystander"}))
                    .await
                    .unwrap();
                assert!(answer.iter().any(|m| m["result"].is_object()), "{answer:?}");
            }
        })
    };
    // A batch just under the 4 MiB body limit (40,000 members) without a session, and with a
    // forged session id: refused at its 65th member.
    let huge = echo_batch(40_000, 0);
    let size = huge.to_string().len();
    assert!(size > 3 << 20 && size < 4 << 20, "{size}");
    let (status, body) = refused(client.post(None, &huge, &[]).await.unwrap()).await;
    assert!(status.is_client_error(), "{status} {body}");
    let forged = [("mcp-session-id", "forged-session-id")];
    let (status, body) = refused(client.post(None, &huge, &forged).await.unwrap()).await;
    assert!(status.is_client_error(), "{status} {body}");
    // A later session may not batch: refused on its version, before the body is parsed.
    let later = client.initialize("2025-11-25").await.unwrap();
    let (status, body) = refused(client.post(Some(&later), &huge, &[]).await.unwrap()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("batch"), "{body}");
    background.await.expect("every bystander call is answered");
    still_serving(&pod).await;
}

/// What a session keeps to rebuild its upstream session is bounded and counted: an oversized
/// `initialize` is refused before a session exists, subscriptions stop at the session's journal
/// budget (the session goes on), `tether_retained_bytes{kind="journal"}` rises with them and
/// falls back once the session is deleted.
#[tokio::test]
async fn a_sessions_journal_is_bounded_and_counted_in_retained_bytes() {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let with_params = |pad: usize| {
        let mut body = initialize_body(1, "2025-11-25");
        body["params"]["capabilities"]["experimental"] = json!({"pad": "p".repeat(pad)});
        body
    };
    // Params of (almost) 4 MiB, within the body limit, and of 100 KiB exceed
    // --max-initialize-bytes (64 KiB): refused before anything reaches the MCP server.
    for pad in [(4 << 20) - 1024, 100 << 10] {
        let resp = client.post(None, &with_params(pad), &[]).await.unwrap();
        let error = expect_error(resp, StatusCode::PAYLOAD_TOO_LARGE, "initialize_too_large")
            .await
            .unwrap();
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("--max-initialize-bytes"),
            "{error}"
        );
    }
    let journal = r#"tether_retained_bytes{kind="journal"}"#;
    let session = client.initialize("2025-11-25").await.unwrap();
    let one_session = pod
        .wait_for_metric(journal, Duration::from_secs(5), |v| v > 0.0)
        .await
        .unwrap();
    // Subscriptions with 4 KiB params each: the 1 MiB journal takes about 250 of 2,000.
    let mut kept = 0;
    let mut refusal = None;
    for i in 0..2_000 {
        let subscribe = json!({"jsonrpc": "2.0", "id": 100 + i, "method": "resources/subscribe",
            "params": {"uri": format!("file:///r{i}"), "_meta": {"pad": "s".repeat(4 << 10)}}});
        let resp = client.post(Some(&session), &subscribe, &[]).await.unwrap();
        if resp.status() == StatusCode::PAYLOAD_TOO_LARGE {
            refusal = Some(expect_error(resp, StatusCode::PAYLOAD_TOO_LARGE, "journal_full").await);
            break;
        }
        drop(body_text(resp).await);
        kept += 1;
    }
    let refusal = refusal.expect("the journal budget is spent before 2,000 subscriptions");
    assert!(
        refusal.unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("--max-journal-bytes")
    );
    assert!((200..=256).contains(&kept), "{kept} subscriptions kept");
    let full = pod
        .wait_for_metric(journal, Duration::from_secs(5), |v| v > one_session + 1e6)
        .await
        .unwrap();
    assert!(full <= one_session + f64::from(1 << 20), "{full}");
    // The session goes on: a call is served.
    let answer = client
        .call(&session, 9_999, "echo", json!({"text": "after"}))
        .await
        .unwrap();
    assert!(answer.iter().any(|m| m["result"].is_object()), "{answer:?}");
    assert!(client.delete(&session).await.unwrap().is_success());
    pod.wait_for_metric(journal, Duration::from_secs(5), |v| v == 0.0)
        .await
        .unwrap();
    still_serving(&pod).await;
}

/// A `slow` call of 4 s whose JSON-RPC id is a 250-character string: its retry record takes
/// 96 + 2 × 252 = 600 bytes while it runs. Returns the answer's status and error reason.
async fn long_id_call(client: McpClient, session: Session, n: usize) -> (StatusCode, String) {
    let id = format!("{n:0>250}");
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "slow", "arguments": {"count": 0, "interval_ms": 4_000, "call_id": id}}});
    let resp = client.post(Some(&session), &body, &[]).await.unwrap();
    let status = resp.status();
    if status == StatusCode::OK {
        drop(body_text(resp).await);
        return (status, String::new());
    }
    assert_eq!(
        header_str(&resp, "retry-after").is_some(),
        status == StatusCode::TOO_MANY_REQUESTS
    );
    let (_, error) = json_error(resp).await.unwrap();
    (
        status,
        error["data"]["reason"].as_str().unwrap_or("").to_owned(),
    )
}

#[tokio::test]
async fn stored_replies_and_retry_records_are_bounded_per_session_and_per_pod() {
    let pod = Pod::start(PodSpec {
        sidecar_args: [
            "--max-session-retry-bytes",
            "20000",
            "--pod-retained-bytes",
            "30000",
        ]
        .map(String::from)
        .to_vec(),
        server_args: vec!["--json-replies".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    let a = client.initialize("2025-11-25").await.unwrap();
    // 100 answers of 2 KB through a session budget of 20,000 bytes: every call is served (the
    // oldest answers already handed out are forgotten), and what is kept stays in the budget.
    let text = "r".repeat(2_000);
    for i in 0..100 {
        let call = tool_call(i, "echo", json!({"text": text}), None);
        let resp = client.post(Some(&a), &call, &[]).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            header_str(&resp, "content-type").as_deref(),
            Some("application/json")
        );
        assert!(body_text(resp).await.unwrap().contains(&text));
    }
    let replies = r#"tether_retained_bytes{kind="replies"}"#;
    let held = pod
        .wait_for_metric(replies, Duration::from_secs(5), |v| v > 0.0)
        .await
        .unwrap();
    assert!(held <= 20_000.0, "{held} bytes of stored replies");
    // The newest answers are still replayed to a retry, without running the tool again.
    let count = |id| tool_call(id, "counter", json!({}), None);
    let first = client.post(Some(&a), &count(500), &[]).await.unwrap();
    let first = body_text(first).await.unwrap();
    let retried = client.post(Some(&a), &count(500), &[]).await.unwrap();
    assert_eq!(
        body_text(retried).await.unwrap(),
        first,
        "the stored reply is replayed"
    );
    let next = client.post(Some(&a), &count(501), &[]).await.unwrap();
    assert_ne!(
        body_text(next).await.unwrap(),
        first,
        "a new id runs the tool"
    );

    // Requests in flight cannot be forgotten: 70 calls with 348-byte records (96 + a 252-byte
    // id) leave no room in session A's 20,000 bytes for some (413); then session B's 40 calls
    // take the pod over its budget of 30,000 bytes with nothing to give up (429 +
    // Retry-After). Everyone else's calls are served.
    let b = client.initialize("2025-11-25").await.unwrap();
    let spawn = |session: &Session, range: std::ops::Range<usize>| {
        range
            .map(|n| tokio::spawn(long_id_call(client.clone(), session.clone(), n)))
            .collect::<Vec<_>>()
    };
    let in_a = spawn(&a, 0..70);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let in_b = spawn(&b, 100..140);
    let outcomes = |calls: Vec<tokio::task::JoinHandle<(StatusCode, String)>>| async {
        let mut all = Vec::new();
        for call in calls {
            all.push(call.await.unwrap());
        }
        all
    };
    let (in_a, in_b) = (outcomes(in_a).await, outcomes(in_b).await);
    let count_of = |all: &[(StatusCode, String)], status, reason: &str| {
        all.iter()
            .filter(|(s, r)| *s == status && r == reason)
            .count()
    };
    let (a_ok, a_full) = (
        count_of(&in_a, StatusCode::OK, ""),
        count_of(&in_a, StatusCode::PAYLOAD_TOO_LARGE, "retry_state_full"),
    );
    assert_eq!(a_ok + a_full, 70, "{in_a:?}");
    assert!(
        (35..=57).contains(&a_ok) && a_full >= 13,
        "{a_ok} served, {a_full} refused"
    );
    let (b_ok, b_full) = (
        count_of(&in_b, StatusCode::OK, ""),
        count_of(&in_b, StatusCode::TOO_MANY_REQUESTS, "pod_full"),
    );
    assert_eq!(b_ok + b_full, 40, "{in_b:?}");
    assert!(b_ok >= 1 && b_full >= 1, "{b_ok} served, {b_full} refused");
    // Answered and handed out, those calls' state makes room again.
    for session in [&a, &b] {
        let answer = client
            .call(session, 9_000, "echo", json!({"text": "after"}))
            .await
            .unwrap();
        assert!(answer.iter().any(|m| m["result"].is_object()), "{answer:?}");
    }
    for session in [&a, &b] {
        assert!(client.delete(session).await.unwrap().is_success());
    }
    for kind in ["records", "replies"] {
        let sample = format!("tether_retained_bytes{{kind=\"{kind}\"}}");
        pod.wait_for_metric(&sample, Duration::from_secs(5), |v| v == 0.0)
            .await
            .unwrap();
    }
    still_serving(&pod).await;
}

#[tokio::test]
async fn slow_loris_heads_are_cut_at_the_header_deadline_and_idle_connections_are_not() {
    let mut pod = Pod::start(PodSpec {
        sidecar_args: vec!["--header-timeout".into(), "1s".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    // An idle keep-alive connection (after its first request) is reading no head: the
    // deadline does not apply to it.
    let mut idle = TcpStream::connect((pod.ip, LISTEN_PORT)).await.unwrap();
    idle.write_all(SESSIONLESS_GET).await.unwrap();
    assert!(answer(&mut idle).await.contains("session_required"));
    // A head trickled one byte every 100 ms that would take 30 s and never ends.
    let (mut reader, mut writer) = TcpStream::connect((pod.ip, LISTEN_PORT))
        .await
        .unwrap()
        .into_split();
    let trickle = tokio::spawn(async move {
        let head = b"POST /mcp HTTP/1.1\r\nhost: x\r\nx-slow: ";
        for b in head.iter().chain(std::iter::repeat(&b'y')).take(300) {
            if writer.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut buf = [0; 1024];
    let cut = tokio::time::timeout(Duration::from_secs(20), reader.read(&mut buf)).await;
    assert!(
        matches!(cut, Ok(Ok(0) | Err(_))),
        "a head still arriving after --header-timeout closes its connection: {cut:?}\n{}",
        pod.logs()
    );
    trickle.abort();
    assert_eq!(
        pod.metric("tether_header_timeouts_total").await.unwrap(),
        1.0
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    idle.write_all(SESSIONLESS_GET).await.unwrap();
    let answered = answer(&mut idle).await;
    assert!(
        answered.starts_with("HTTP/1.1 400") && answered.contains("session_required"),
        "{answered}"
    );
    assert_eq!(
        pod.metric("tether_header_timeouts_total").await.unwrap(),
        1.0
    );
    still_serving(&pod).await;
    assert!(pod.sidecar_running().unwrap(), "{}", pod.logs());
}

#[tokio::test]
async fn silent_connections_are_closed_at_the_head_deadline_and_one_source_cannot_hold_every_slot()
{
    let pod = Pod::start(PodSpec {
        sidecar_args: [
            "--header-timeout",
            "1s",
            "--max-connections",
            "8",
            "--max-connections-per-source",
            "4",
        ]
        .map(String::from)
        .to_vec(),
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let [hog, other] = addr::ips();
    // The hog opens connections and sends nothing.
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(connect_from(hog, &pod, LISTEN_PORT).await);
    }
    pod.wait_for_metric("tether_client_connections", Duration::from_secs(5), |v| {
        v == 4.0
    })
    .await
    .unwrap();
    // Its fifth is over its share: answered 429 and closed, while another client is served.
    let mut fifth = connect_from(hog, &pod, LISTEN_PORT).await;
    fifth.write_all(SESSIONLESS_GET).await.unwrap();
    let refused = answer(&mut fifth).await;
    assert!(
        refused.starts_with("HTTP/1.1 429")
            && refused.to_ascii_lowercase().contains("retry-after: 1")
            && refused.contains(r#""reason":"source_connections""#),
        "{refused}"
    );
    assert!(closed(&mut fifth).await, "the refused connection is closed");
    let mut served = connect_from(other, &pod, LISTEN_PORT).await;
    served.write_all(SESSIONLESS_GET).await.unwrap();
    let answered = answer(&mut served).await;
    assert!(answered.contains("session_required"), "{answered}");
    // A connection that sends nothing holds its slot until the head deadline from its accept.
    for conn in &mut silent {
        assert!(
            closed(conn).await,
            "a silent connection is closed at the deadline"
        );
    }
    assert!(
        pod.metric("tether_header_timeouts_total").await.unwrap() >= 4.0,
        "{}",
        pod.metrics().await.unwrap()
    );
    assert_eq!(
        pod.metric(r#"tether_connections_refused_total{listener="mcp",reason="source_full"}"#)
            .await
            .unwrap(),
        1.0
    );
    let mut again = connect_from(hog, &pod, LISTEN_PORT).await;
    again.write_all(SESSIONLESS_GET).await.unwrap();
    let answered = answer(&mut again).await;
    assert!(
        answered.contains("session_required"),
        "the source's slots came back: {answered}"
    );
    still_serving(&pod).await;
}

#[tokio::test]
async fn the_admin_port_bounds_its_connections_per_source_and_their_heads() {
    let mut pod = Pod::start(PodSpec {
        sidecar_args: [
            "--header-timeout",
            "1s",
            "--admin-max-connections",
            "64",
            "--admin-max-connections-per-source",
            "8",
        ]
        .map(String::from)
        .to_vec(),
        ..PodSpec::default()
    })
    .await
    .unwrap();
    // Four strangers each open 50 connections with a half-sent head.
    let strangers: [_; 4] = addr::ips();
    let mut half_sent = Vec::new();
    for stranger in strangers {
        for _ in 0..50 {
            let mut conn = connect_from(stranger, &pod, ADMIN_PORT).await;
            // Refused ones may be closed before the write lands.
            let _ = conn.write_all(b"GET /metrics HTTP/1.1\r\nx-slow: ").await;
            half_sent.push(conn);
        }
    }
    // Each holds at most its share; the rest were refused (answered or closed at once).
    let refused = pod
        .wait_for_metric(
            r#"tether_connections_refused_total{listener="admin",reason="source_full"}"#,
            Duration::from_secs(5),
            |v| v >= 4.0 * 42.0,
        )
        .await
        .unwrap();
    assert_eq!(refused, 4.0 * 42.0);
    // Their shares, the refused ones held for an answer (a sixteenth of the cap), this scrape.
    assert!(pod.metric("tether_admin_connections").await.unwrap() <= 4.0 * 8.0 + 4.0 + 1.0);
    // The kubelet, from its own address, still probes the pod.
    let kubelet = Http::from_source(addr::next_ip().into());
    let (status, body) = kubelet
        .get_text(&format!("{}/readyz", pod.admin_url))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    // Every half-sent head is cut at the deadline, counted from the connection's accept.
    for conn in &mut half_sent {
        assert!(closed(conn).await, "a half-sent admin head is closed");
    }
    drop(kubelet);
    // What is left: the scrapes' own connections.
    let open = pod
        .wait_for_metric("tether_admin_connections", Duration::from_secs(5), |v| {
            v <= 2.0
        })
        .await
        .unwrap();
    assert!(open <= 2.0, "{open}");
    assert!(pod.sidecar_running().unwrap(), "{}", pod.logs());
}

#[tokio::test]
async fn heads_over_pingoras_field_count_and_size_get_400() {
    let mut pod = Pod::start_default().await.unwrap();
    let fields = |n: usize| -> String { (0..n).map(|i| format!("x-f{i}: v\r\n")).collect() };
    let get = |fields: &str| format!("GET /mcp HTTP/1.1\r\nhost: x\r\naccept: */*\r\n{fields}\r\n");
    // 250 header fields reach the sidecar (its own 400); 300 are over pingora's 256.
    let mut conn = TcpStream::connect((pod.ip, LISTEN_PORT)).await.unwrap();
    conn.write_all(get(&fields(250)).as_bytes()).await.unwrap();
    let within = answer(&mut conn).await;
    assert!(within.contains("session_required"), "{within}");
    let over = raw(&pod, get(&fields(300)).as_bytes()).await;
    assert!(over.starts_with("HTTP/1.1 400"), "{over:?}");
    // A head of 2 MiB (pingora reads at most 1 MiB of it), written while the answer is read.
    let (mut reader, mut writer) = TcpStream::connect((pod.ip, LISTEN_PORT))
        .await
        .unwrap()
        .into_split();
    let huge = get(&format!("x-big: {}\r\n", "z".repeat(2 << 20)));
    let sending = tokio::spawn(async move {
        for piece in huge.as_bytes().chunks(16 << 10) {
            if writer.write_all(piece).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), reader.read(&mut buf))
        .await
        .map_or(0, |r| r.unwrap_or(0));
    let too_large = status_line(&String::from_utf8_lossy(&buf[..n]));
    assert!(too_large.starts_with("HTTP/1.1 400"), "{too_large:?}");
    sending.abort();
    // Counted once pingora has closed the connection.
    let refused = pod
        .wait_for_metric(
            "tether_request_heads_refused_total",
            Duration::from_secs(10),
            |v| v >= 2.0,
        )
        .await
        .unwrap();
    assert_eq!(refused, 2.0);
    still_serving(&pod).await;
    assert!(pod.sidecar_running().unwrap(), "{}", pod.logs());
}

#[tokio::test]
async fn connections_beyond_the_cap_get_503_and_a_closed_one_frees_its_slot() {
    let mut pod = Pod::start(PodSpec {
        sidecar_args: vec!["--max-connections".into(), "3".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut conn = TcpStream::connect((pod.ip, LISTEN_PORT)).await.unwrap();
        conn.write_all(SESSIONLESS_GET).await.unwrap();
        let answered = answer(&mut conn).await;
        assert!(answered.contains("session_required"), "{answered}");
        held.push(conn);
    }
    assert_eq!(pod.metric("tether_client_connections").await.unwrap(), 3.0);
    // The fourth: 503 with Retry-After and a JSON-RPC error body, then the connection closes.
    let mut extra = TcpStream::connect((pod.ip, LISTEN_PORT)).await.unwrap();
    extra.write_all(SESSIONLESS_GET).await.unwrap();
    let refused = answer(&mut extra).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.to_ascii_lowercase().contains("retry-after: 1"),
        "{refused}"
    );
    assert!(
        refused.contains(r#""jsonrpc":"2.0""#)
            && refused.contains(r#""reason":"too_many_connections""#),
        "{refused}"
    );
    assert!(closed(&mut extra).await, "the refused connection is closed");
    // Closing a held connection frees its slot for the next one.
    drop(held.pop());
    let mut served = None;
    for _ in 0..50 {
        let mut conn = TcpStream::connect((pod.ip, LISTEN_PORT)).await.unwrap();
        conn.write_all(SESSIONLESS_GET).await.unwrap();
        let answered = answer(&mut conn).await;
        if !answered.starts_with("HTTP/1.1 503") {
            served = Some(answered);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let served = served.expect("a freed slot takes a new connection");
    assert!(served.contains("session_required"), "{served}");
    assert!(
        pod.metric(r#"tether_rejections_total{status="503",reason="too_many_connections"}"#)
            .await
            .unwrap()
            >= 1.0
    );
    drop(held);
    assert!(pod.sidecar_running().unwrap(), "{}", pod.logs());
}

#[tokio::test]
async fn a_client_reopening_gets_in_a_loop_is_refused_past_the_takeover_budget() {
    let pod = Pod::start(PodSpec {
        sidecar_args: vec!["--max-takeovers".into(), "2".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let first = client.get(&session, None).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // Each GET takes the standalone stream over from the one before, which stays open.
    let mut open = vec![first];
    let mut refused = None;
    for _ in 0..20 {
        let resp = client.get(&session, None).await.unwrap();
        if resp.status() == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(resp);
            break;
        }
        assert_eq!(resp.status(), StatusCode::OK);
        open.push(resp);
    }
    let refused = refused.expect("GETs reopened in a loop are refused");
    assert!(open.len() >= 3, "two take-overs a second pass");
    assert_eq!(header_str(&refused, "retry-after").as_deref(), Some("1"));
    let (status, body) = json_error(refused).await.unwrap();
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["data"]["reason"], "takeover_budget", "{body}");
    assert!(pod.metric("tether_stream_takeovers_total").await.unwrap() >= 2.0);
    // The next second has a budget again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = client.get(&session, None).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
}

//! Fault injection around a session handoff (`docs/design/handoff.md`).
//!
//! Every scenario ([`Scenario`]) runs on 2 or 3 pods: the sessions under test start on the first
//! pod, A; A drains (`draining` in the membership, then `tether-sidecar drain`) and hands them to
//! its peers; the fault happens around the move. Test names carry the spec ids of what they check
//! (`docs/dev/testing.md`).
//!
//! | fault | test |
//! |---|---|
//! | priming event lost | [`r05_a_lost_priming_event_resumes_from_key_0_at_the_new_holder`] |
//! | two streams' ids interleaved | [`r01_r03_fr9_interleaved_streams_resume_each_on_its_own_after_the_move`] |
//! | replay after acknowledgement | [`r03_a_resume_replays_only_what_follows_the_acknowledged_event`] |
//! | wrong or foreign `Last-Event-ID` | [`r03_foreign_garbage_ahead_and_evicted_cursors_are_400_after_the_move`] |
//! | expiry racing a response | [`s05_a_running_call_keeps_its_session_across_the_move_then_it_expires`] |
//! | `DELETE` response lost | [`s05_s07_a_delete_whose_answer_was_lost_is_404_when_retried_anywhere`] |
//! | no `MCP-Protocol-Version` | [`p02_requests_without_the_version_header_use_the_negotiated_one_after_the_move`] |
//! | Origin altered by a proxy | [`o01_o02_altered_origins_are_403_at_every_entry_and_reach_no_upstream`] |
//! | reconnect storm | [`r03_a_resume_storm_stays_within_the_budget_and_loses_nothing`] |
//! | pod SIGKILLed mid-handoff | [`s06_r01_a_pod_killed_mid_handoff_loses_only_unacknowledged_sessions`] |
//! | standalone stream's writer SIGKILLed mid-follow | [`r03_a_standalone_stream_whose_writer_was_killed_resumes_on_the_new_holders`] |

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{Value, json};
use tether_tests::call::{CallPlan, Stop, Tracked, slow_body};
use tether_tests::client::{
    ACCEPT_BOTH, Events, McpClient, Session, expect_error, expect_lost_session, header_str,
    json_error, messages, result_text, tool_call, tools_list,
};
use tether_tests::follow::{Follow, nothing_after};
use tether_tests::load;
use tether_tests::pod::{LISTEN_PORT, PodSpec};
use tether_tests::scenario::Scenario;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

/// What a stream still carries until it ends, or why it stalled (5 s).
async fn rest_of(resp: Response<Incoming>) -> Result<Vec<sse_stream::Sse>, String> {
    Events::new(resp)
        .rest(Duration::from_secs(5))
        .await
        .map_err(|e| e.to_string())
}

/// The sequence number of event id `<key>-<seq>`.
fn seq(id: &str) -> u64 {
    id.rsplit_once('-').unwrap().1.parse().unwrap()
}

/// Sends `method` for `session` without `MCP-Protocol-Version` (real clients resume without
/// it), with `Last-Event-ID` and `body` when given.
async fn without_version(
    client: &McpClient,
    method: Method,
    session: &Session,
    cursor: Option<&str>,
    body: Option<&Value>,
) -> Response<Incoming> {
    let accept = if body.is_some() {
        ACCEPT_BOTH
    } else {
        "text/event-stream"
    };
    let mut headers = vec![
        ("accept", accept),
        ("content-type", "application/json"),
        ("mcp-session-id", session.id.as_str()),
    ];
    headers.extend(cursor.map(|c| ("last-event-id", c)));
    client
        .http()
        .send(
            method,
            &client.url,
            &headers,
            body.map(|b| Bytes::from(b.to_string())),
        )
        .await
        .unwrap()
}

/// Requests counted under protocol version `v` by the pods other than A.
async fn version_requests(s: &Scenario, v: &str) -> f64 {
    let sample = format!("tether_protocol_version_requests_total{{version=\"{v}\"}}");
    s.metric_of_rest(&sample).await
}

/// Through each of `clients`, a `slow` call (request ids from `first_id` on) and a resume after
/// its last event, both without `MCP-Protocol-Version`: 200, the whole answer, a clean end.
async fn headerless_calls(
    clients: &[McpClient],
    session: &Session,
    first_id: u64,
) -> Result<(), String> {
    for (id, client) in (first_id..).zip(clients) {
        let call_id = format!("nover-{id}");
        let body = slow_body(id, &call_id, 2, 10);
        let resp = without_version(client, Method::POST, session, None, Some(&body)).await;
        if resp.status() != StatusCode::OK {
            return Err(format!("POST at {}: {}", client.url, resp.status()));
        }
        let mut call = Tracked::new(id, &call_id, 2);
        call.finish(Events::new(resp)).await;
        call.whole()?;
        let cursor = call.cursor();
        let resp = without_version(client, Method::GET, session, Some(&cursor), None).await;
        match resp.status() {
            StatusCode::OK => drop(rest_of(resp).await?),
            other => return Err(format!("resume at {}: {other}", client.url)),
        }
    }
    Ok(())
}

/// R-05 (priming lost): the client's connection drops right after the priming event `<key>-0`,
/// before any message; it resumes with that id at the new holder, once while the call still
/// runs on A (the events reach the holder as A's tail) and once after A stopped, and gets every
/// event exactly once and the result. The tool ran once, on A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r05_a_lost_priming_event_resumes_from_key_0_at_the_new_holder() {
    let mut s = Scenario::start(2, PodSpec::default()).await;
    let (via_a, via_b) = (s.via_a(), s.via_rest());
    let live = s.on_a("2025-11-25").await;
    let late = s.on_a("2025-11-25").await;
    let mut calls = Vec::new();
    for (session, call_id) in [(&live, "prime-live"), (&late, "prime-late")] {
        let plan = CallPlan::steady(8, 150);
        let (mut call, mut events) = Tracked::post(&via_a, session, 2, call_id, &plan)
            .await
            .unwrap();
        let first = events.next_within(Duration::from_secs(10)).await.unwrap();
        assert!(!call.take(first), "R-05: the first event primes");
        let priming = call.cursor();
        assert!(priming.ends_with("-0"), "{priming}");
        drop(events);
        calls.push(call);
    }
    let drain = s.drain_a().await;
    s.wait_moved(2.0).await;
    let (mut on_the_move, mut after_stop) = (calls.remove(0), calls.remove(0));
    let resumed = on_the_move.resume(&via_b, &live).await;
    s.check(resumed.and_then(|()| on_the_move.whole()));
    let old = s.stop_a(drain).await;
    let resumed = after_stop.resume(&via_b, &late).await;
    s.check(resumed.and_then(|()| after_stop.whole()));
    let stats = old.stats().await.unwrap();
    assert_eq!(stats["executions"], 2, "{stats}");
    assert_eq!(stats["duplicates"], json!({}), "{stats}");
    assert_eq!(s.executions().await, 0, "the new holder ran nothing again");
}

/// R-03 (two streams' ids interleaved): two sessions, each with two
/// concurrent `slow` calls under the same JSON-RPC ids 2 and 3. Every client reads a few events,
/// drops, and after the move resumes with its own last id: it gets only its own stream's
/// events (ids of its stream, its progress token, its answer), none twice, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r01_r03_fr9_interleaved_streams_resume_each_on_its_own_after_the_move() {
    let mut s = Scenario::start(3, PodSpec::default()).await;
    let via_a = s.via_a();
    let mut calls = Vec::new();
    for (n, version) in [(1u32, "2025-06-18"), (2, "2025-11-25")] {
        let session = s.on_a(version).await;
        // Distinct counts make each answer (`done <count>`) tell its stream.
        for (id, count) in [(2, 4 + 2 * n), (3, 5 + 2 * n)] {
            let call_id = format!("s{n}-id{id}");
            let plan = CallPlan::steady(count, 150);
            let (call, events) = Tracked::post(&via_a, &session, id, &call_id, &plan)
                .await
                .unwrap();
            calls.push((session.clone(), call, events));
        }
    }
    for (_, call, events) in &mut calls {
        call.take_messages(events, 2).await;
    }
    let calls: Vec<(Session, Tracked)> = calls.into_iter().map(|(s, c, _)| (s, c)).collect();
    let keys: Vec<String> = calls
        .iter()
        .map(|(_, c)| c.stream().unwrap().to_owned())
        .collect();
    let mut distinct = keys.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "R-01/R-02: one key per stream: {keys:?}");
    let drain = s.drain_a().await;
    s.wait_moved(2.0).await;
    let via_rest = s.via_rest();
    let resumed = calls.into_iter().map(|(session, mut call)| {
        let client = via_rest.clone();
        tokio::spawn(async move {
            let resumed = call.resume(&client, &session).await;
            resumed.and_then(|()| call.whole())
        })
    });
    for task in resumed.collect::<Vec<_>>() {
        s.check(task.await.unwrap());
    }
    let old = s.stop_a(drain).await;
    assert_eq!(old.stats().await.unwrap()["executions"], 4);
}

/// R-03 (replay after the client already acknowledged): a client that read up to progress 3
/// resumes with that id after the move, through the old pod and after it stopped through
/// every other pod: each time exactly progress 4… and the answer. A client that read a whole
/// response, or the rest, resumes with the last id: a clean end, no event again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r03_a_resume_replays_only_what_follows_the_acknowledged_event() {
    let mut s = Scenario::start(3, PodSpec::default()).await;
    let via_a = s.via_a();
    let session = s.on_a("2025-11-25").await;
    let whole = s.completed_on_a(&session, 2, "ack-whole", 3).await;
    let whole_last = whole.cursor();
    let part = s.cut_on_a(&session, (3, "ack-part"), (8, 150), 3).await;
    let acknowledged = part.cursor();
    let drain = s.drain_a().await;
    s.wait_moved(1.0).await;
    let mut replay = part.clone();
    let resumed = replay.resume(&via_a, &session).await;
    s.check(resumed.and_then(|()| replay.whole()));
    assert_eq!(replay.progress_after(3), [4, 5, 6, 7, 8]);
    let part_last = replay.cursor();
    assert!(seq(&part_last) > seq(&acknowledged));
    s.check(nothing_after(&via_a, &session, &whole_last).await);
    s.check(nothing_after(&via_a, &session, &part_last).await);
    drop(s.stop_a(drain).await);
    for client in s.each_of_rest() {
        let mut again = part.clone();
        let resumed = again.resume(&client, &session).await;
        s.check(resumed.and_then(|()| again.whole()));
        assert_eq!(again.progress_after(3), [4, 5, 6, 7, 8]);
        s.check(nothing_after(&client, &session, &whole_last).await);
        s.check(nothing_after(&client, &session, &part_last).await);
    }
}

/// R-03 (wrong or foreign `Last-Event-ID`), with `buffer.maxEvents` 3: after the move, through
/// the old pod and then every other pod, a cursor of another session, garbage, a cursor ahead
/// of its (complete) stream and an evicted cursor are each 400 with their reason — never a 200
/// with foreign events, never a 5xx — and the retained events are still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r03_foreign_garbage_ahead_and_evicted_cursors_are_400_after_the_move() {
    let mut s = Scenario::start(
        3,
        PodSpec {
            max_events: 3,
            ..PodSpec::default()
        },
    )
    .await;
    let via_a = s.via_a();
    let mine = s.on_a("2025-06-18").await;
    let other = s.on_a("2025-11-25").await;
    // 9 events, all read: the replay window of 3 sent events keeps the last three only.
    let evicting = s.cut_on_a(&mine, (2, "evict"), (8, 10), 9).await;
    let key = evicting.stream().unwrap().to_owned();
    let first = format!("{key}-1");
    let foreign = s.completed_on_a(&other, 2, "foreign", 2).await;
    let theirs = foreign.cursor();
    let drain = s.drain_a().await;
    s.wait_moved(2.0).await;
    let wrong = [
        (mine.clone(), theirs.clone(), "unknown_cursor"),
        (other.clone(), first.clone(), "unknown_cursor"),
        (mine.clone(), "not-a-cursor".to_owned(), "malformed_cursor"),
        (mine.clone(), format!("{key}-x1"), "malformed_cursor"),
        (mine.clone(), "abcdefghijkl-1".to_owned(), "unknown_cursor"),
        (mine.clone(), format!("{key}-99"), "unknown_cursor"),
        (mine.clone(), first.clone(), "cursor_evicted"),
    ];
    let check = |client: McpClient| {
        let wrong = wrong.clone();
        let (mine, key) = (mine.clone(), key.clone());
        async move {
            for (session, cursor, reason) in wrong {
                let resp = client.get(&session, Some(&cursor)).await.unwrap();
                expect_error(resp, StatusCode::BAD_REQUEST, reason)
                    .await
                    .map_err(|e| format!("{cursor}: {e}"))?;
            }
            // The 3 retained events of `mine`: progress 7 and 8 follow 7… and the answer.
            let resp = client.get(&mine, Some(&format!("{key}-7"))).await.unwrap();
            let rest = rest_of(resp).await?;
            let data: Vec<_> = rest.iter().filter_map(|e| e.data.clone()).collect();
            match data.len() {
                2 => Ok(()),
                _ => Err(format!("after {key}-7: {data:?}")),
            }
        }
    };
    // Wait for the drain, so the session moved.
    s.pod_a()
        .wait_for_metric("tether_drain_seconds_count", Duration::from_secs(3), |n| {
            n >= 1.0
        })
        .await
        .unwrap();
    s.check(check(via_a.clone()).await);
    drop(s.stop_a(drain).await);
    for client in s.each_of_rest() {
        s.check(check(client).await);
    }
}

/// S-05 (session expiry racing a response), `session.idleTimeout` 2 s: a `slow` call of 4.4 s
/// moves with its session mid-call; its client stays silent for longer than the idle timeout,
/// then resumes at the new holder and gets everything and the result — the session did not
/// expire while the call ran. Once nothing happened for the idle time, the session and an idle
/// one moved with it are 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s05_a_running_call_keeps_its_session_across_the_move_then_it_expires() {
    let mut s = Scenario::start(
        2,
        PodSpec {
            idle_timeout: "2s".into(),
            ..PodSpec::default()
        },
    )
    .await;
    let via_b = s.via_rest();
    let busy = s.on_a("2025-11-25").await;
    let idle = s.on_a("2025-06-18").await;
    let mut call = s.cut_on_a(&busy, (2, "expiry"), (10, 400), 2).await;
    let drain = s.drain_a().await;
    s.wait_moved(2.0).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let resumed = call.resume(&via_b, &busy).await;
    s.check(resumed.and_then(|()| call.whole()));
    let answered = Instant::now();
    drop(s.stop_a(drain).await);
    // idle timeout + a sweep interval + margin, without any request of either session.
    tokio::time::sleep(Duration::from_millis(3500).saturating_sub(answered.elapsed())).await;
    for session in [&busy, &idle] {
        let list = tools_list(9);
        let resp = via_b.post(Some(session), &list, &[]).await.unwrap();
        s.check(expect_lost_session(resp).await.map_err(|e| e.to_string()));
        let resp = via_b.get(session, None).await.unwrap();
        s.check(expect_lost_session(resp).await.map_err(|e| e.to_string()));
    }
    let expired = s
        .cluster
        .metric_sum("tether_sessions_ended_total{reason=\"expired\"}")
        .await
        .unwrap();
    assert_eq!(expired, 2.0);
}

/// S-05, S-07 (`DELETE` response lost): after the move the client sends `DELETE` through the
/// old pod and its connection drops before any answer. The session ends at its holder; the
/// retried `DELETE` is 404 at every entry, and so is every later request, before and after the
/// old pod stopped — never a 5xx.
///
/// Whether the *upstream* session was ended is not checked: the example server's `/stats` does
/// not list sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s05_s07_a_delete_whose_answer_was_lost_is_404_when_retried_anywhere() {
    let mut s = Scenario::start(3, PodSpec::default()).await;
    let via_a = s.via_a();
    let session = s.on_a("2025-11-25").await;
    let answer = via_a
        .call(&session, 2, "echo", json!({"text": "before"}))
        .await
        .unwrap();
    assert_eq!(result_text(answer.last().unwrap()), Some("before"));
    let drain = s.drain_a().await;
    s.wait_moved(1.0).await;
    let mut tcp = tokio::net::TcpStream::connect((s.a, LISTEN_PORT))
        .await
        .unwrap();
    let request = format!(
        "DELETE /mcp HTTP/1.1\r\nHost: {}:{LISTEN_PORT}\r\nMcp-Session-Id: {}\r\n\
         MCP-Protocol-Version: {}\r\nContent-Length: 0\r\n\r\n",
        s.a, session.id, session.version
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    drop(tcp);
    let deleted = "tether_sessions_ended_total{reason=\"deleted\"}";
    let ended = s
        .cluster
        .wait_for_metric_sum(deleted, Duration::from_secs(5), |n| n >= 1.0)
        .await
        .unwrap();
    assert_eq!(
        ended,
        1.0,
        "the DELETE whose client left still ended the session\n{}",
        s.cluster.logs()
    );
    let gone_everywhere = |clients: Vec<McpClient>| {
        let session = session.clone();
        async move {
            for client in clients {
                let status = client.delete(&session).await.map_err(|e| e.to_string())?;
                if status != StatusCode::NOT_FOUND {
                    return Err(format!("DELETE retried at {}: {status}", client.url));
                }
                let list = tools_list(3);
                let resp = client.post(Some(&session), &list, &[]).await.unwrap();
                expect_lost_session(resp)
                    .await
                    .map_err(|e| format!("POST at {}: {e}", client.url))?;
                let resp = client.get(&session, None).await.unwrap();
                expect_lost_session(resp)
                    .await
                    .map_err(|e| format!("GET at {}: {e}", client.url))?;
            }
            Ok(())
        }
    };
    let mut clients = vec![via_a.clone()];
    clients.extend(s.each_of_rest());
    s.check(gone_everywhere(clients).await);
    drop(s.stop_a(drain).await);
    s.check(gone_everywhere(s.each_of_rest()).await);
}

/// P-02 (no `MCP-Protocol-Version`: the session's negotiated version applies): after the
/// move, requests of a 2025-11-25 session without the header — a resume and `tools/call` —
/// succeed at every entry (the old pod forwards, the new holder serves) and are counted under
/// the negotiated version, never as 2025-03-26; after the old pod stopped too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p02_requests_without_the_version_header_use_the_negotiated_one_after_the_move() {
    let mut s = Scenario::start(3, PodSpec::default()).await;
    let via_a = s.via_a();
    let session = s.on_a("2025-11-25").await;
    let mut call = s.cut_on_a(&session, (2, "nover"), (6, 150), 2).await;
    let drain = s.drain_a().await;
    s.wait_moved(1.0).await;
    let before = version_requests(&s, "2025-11-25").await;
    let resp = without_version(&via_a, Method::GET, &session, Some(&call.cursor()), None).await;
    assert_eq!(resp.status(), StatusCode::OK, "resume through the old pod");
    call.finish(Events::new(resp)).await;
    s.check(call.whole());
    let mut clients = vec![via_a.clone()];
    clients.extend(s.each_of_rest());
    s.check(headerless_calls(&clients, &session, 10).await);
    drop(s.stop_a(drain).await);
    s.check(headerless_calls(&s.each_of_rest(), &session, 20).await);
    // The holder counted the 11 header-less requests (1 + 3 × 2 + 2 × 2) under the negotiated
    // version; nobody took one for 2025-03-26.
    assert_eq!(version_requests(&s, "2025-03-26").await, 0.0);
    assert_eq!(version_requests(&s, "2025-11-25").await - before, 11.0);
    // A wrong header is still refused (P-03): the missing one was not ignored by accident.
    let wrong = Session {
        version: "1999-01-01".into(),
        ..session
    };
    let list = tools_list(99);
    let resp = s.via_rest().post(Some(&wrong), &list, &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

/// O-01, O-02 (an Origin altered by a proxy): after the move, requests of the
/// session with a disallowed Origin — POST, resume GET, DELETE — are 403 at every entry, the
/// old pod included (whose requests would be forwarded), rejected there, and reach no upstream;
/// the session lives on. The allowed Origin, also spelled differently, gets 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o01_o02_altered_origins_are_403_at_every_entry_and_reach_no_upstream() {
    let mut s = Scenario::start(3, PodSpec::default()).await;
    let session = s.on_a("2025-11-25").await;
    let call = s.completed_on_a(&session, 2, "origin", 2).await;
    let cursor = call.cursor();
    let drain = s.drain_a().await;
    s.wait_moved(1.0).await;
    let mut entries = vec![(s.via_a(), s.a)];
    entries.extend(s.each_of_rest().into_iter().zip(s.rest.clone()));
    origin_round(&s, &entries, &session, &cursor, 100).await;
    drop(s.stop_a(drain).await);
    origin_round(&s, &entries[1..], &session, &cursor, 200).await;
}

/// Origins a proxy may have altered: another site, the scheme or port changed, a suffix, `null`.
const BAD_ORIGINS: [&str; 5] = [
    "http://evil.example",
    "http://app.example.com",
    "https://app.example.com:8443",
    "https://app.example.com.evil.example",
    "null",
];

/// Through each entry (client, pod), requests of `session` with each of [`BAD_ORIGINS`] — a
/// `slow` POST, a resume after `cursor`, a DELETE — are 403 `origin_forbidden`, counted by the
/// entry itself, and run nothing; then the allowed Origin, spelled three ways, gets 200.
async fn origin_round(
    s: &Scenario,
    entries: &[(McpClient, Ipv4Addr)],
    session: &Session,
    cursor: &str,
    first_id: u64,
) {
    let executions = s.executions().await;
    let mut ids = first_id..;
    for (client, ip) in entries {
        let pod = s.cluster.pod(*ip).unwrap();
        let rejected = pod.metric("tether_origin_rejections_total").await.unwrap();
        for origin in BAD_ORIGINS {
            let body = slow_body(ids.next().unwrap(), "evil", 1, 10);
            let session_headers = [
                ("origin", origin),
                ("mcp-session-id", session.id.as_str()),
                ("mcp-protocol-version", session.version.as_str()),
            ];
            let post = [
                ("accept", ACCEPT_BOTH),
                ("content-type", "application/json"),
            ];
            let get = [("accept", "text/event-stream"), ("last-event-id", cursor)];
            let mut answers = Vec::new();
            for (method, extra, body) in [
                (Method::POST, &post[..], Some(Bytes::from(body.to_string()))),
                (Method::GET, &get[..], None),
                (Method::DELETE, &[][..], None),
            ] {
                let headers = [&session_headers[..], extra].concat();
                let resp = client
                    .http()
                    .send(method.clone(), &client.url, &headers, body)
                    .await
                    .unwrap();
                let (status, error) = json_error(resp).await.unwrap();
                answers.push((method, status, error["data"]["reason"].clone()));
            }
            assert!(
                answers
                    .iter()
                    .all(|(_, status, reason)| *status == StatusCode::FORBIDDEN
                        && reason == "origin_forbidden"),
                "{origin} at {ip}: {answers:?}"
            );
        }
        let now = pod.metric("tether_origin_rejections_total").await.unwrap();
        let sent = 3 * BAD_ORIGINS.len();
        assert_eq!(
            now - rejected,
            sent as f64,
            "rejected by the entry {ip} itself"
        );
    }
    assert_eq!(
        s.executions().await,
        executions,
        "no bad request ran a tool"
    );
    for (client, ip) in entries {
        for origin in [
            "https://app.example.com",
            "https://app.example.com:443",
            "HTTPS://App.Example.COM",
        ] {
            let body = tool_call(ids.next().unwrap(), "echo", json!({"text": origin}), None);
            let resp = client
                .post(Some(session), &body, &[("origin", origin)])
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "{origin} at {ip}");
            assert_eq!(
                header_str(&resp, "access-control-allow-origin").as_deref(),
                Some(origin)
            );
            let answer = messages(resp, Duration::from_secs(10)).await.unwrap();
            assert_eq!(result_text(answer.last().unwrap()), Some(origin));
        }
    }
}

/// The resume budget of the storm test: resumes per second per pod, and the burst.
const BUDGET: usize = 60;
/// Sessions resuming at once in the storm test.
const STORM: usize = 300;

/// R-03, R-07 (a 429 reconnect storm): 300 sessions move from A to B and A stops; every client
/// resumes at B at once. B's resume budget (`--resume-budget 60`, `docs/design/handoff.md`)
/// admits at most 60 at once and 60 a second: the others get 429 with `Retry-After` and a
/// JSON-RPC error `resume_budget`. Clients that honour `Retry-After` all resume and lose
/// nothing; no 404, no 5xx; the rate served stays within the budget plus the burst; the metrics
/// agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn r03_a_resume_storm_stays_within_the_budget_and_loses_nothing() {
    let _heavy = load::heavy().await;
    let mut s = Scenario::start(
        2,
        PodSpec {
            sidecar_args: vec!["--resume-budget".into(), BUDGET.to_string()],
            ..PodSpec::default()
        },
    )
    .await;
    let via_a = s.via_a();
    let gate = Arc::new(Semaphore::new(50));
    let setup = (0..STORM).map(|i| {
        let (client, gate) = (via_a.clone(), Arc::clone(&gate));
        tokio::spawn(async move {
            let _slot = gate.acquire().await.unwrap();
            let version = ["2025-06-18", "2025-11-25"][i % 2];
            let session = client.initialize(version).await.unwrap();
            let plan = CallPlan::steady(3, 5);
            let (mut call, mut events) =
                Tracked::post(&client, &session, 2, &format!("storm-{i}"), &plan)
                    .await
                    .unwrap();
            call.take_messages(&mut events, 1).await;
            (session, call)
        })
    });
    let mut calls = Vec::new();
    for task in setup.collect::<Vec<_>>() {
        calls.push(task.await.unwrap());
    }
    let drain = s.drain_a().await;
    drop(s.stop_a(drain).await);
    let via_b = s.via_rest();
    let started = Instant::now();
    let storm = calls.into_iter().map(|(session, mut call)| {
        let client = via_b.clone();
        tokio::spawn(async move {
            let reconnected = call
                .reconnect(&client, &session, &[StatusCode::TOO_MANY_REQUESTS])
                .await;
            let admitted = started.elapsed();
            let result = match reconnected {
                Ok(Some(events)) => {
                    call.finish(events).await;
                    call.whole().map(|()| admitted)
                }
                Ok(None) => Err("resume answered 404".to_owned()),
                Err(e) => Err(e),
            };
            (result, call.refused)
        })
    });
    let mut admitted = Vec::new();
    let mut refusals = 0;
    let mut max_wait = Duration::ZERO;
    for task in storm.collect::<Vec<_>>() {
        let (result, refused) = task.await.unwrap();
        refusals += refused.len();
        for refusal in refused {
            assert_eq!(
                (refusal.status, refusal.reason.as_str()),
                (StatusCode::TOO_MANY_REQUESTS, "resume_budget")
            );
            assert!(
                refusal.retry_after >= 1,
                "Retry-After {}",
                refusal.retry_after
            );
        }
        let at = result.unwrap_or_else(|e| panic!("{e}\n{}", s.cluster.logs()));
        max_wait = max_wait.max(at);
        admitted.push(at);
    }
    admitted.sort();
    // Admissions in any window of one second, by the client's clock.
    let peak = (0..admitted.len())
        .map(|i| {
            admitted[i..]
                .iter()
                .take_while(|&&t| t < admitted[i] + Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or(0);
    let span = admitted.last().copied().unwrap_or_default();
    println!(
        "storm: {STORM} resumes, budget {BUDGET}/s + burst {BUDGET}: peak {peak} in 1 s, \
         {refusals} × 429, all admitted after {span:?} (longest wait {max_wait:?}), \
         {:.0} resumes/s overall",
        STORM as f64 / span.as_secs_f64().max(0.001)
    );
    assert!(refusals > 0, "the budget refused some");
    assert!(
        peak <= 2 * BUDGET + BUDGET / 10,
        "peak {peak} in one second"
    );
    assert!(
        span >= Duration::from_secs(((STORM - BUDGET) / BUDGET - 1) as u64),
        "{STORM} resumes at {BUDGET}/s cannot all be admitted within {span:?}"
    );
    let b = &s.cluster.pods[0];
    let rejected = b
        .metric("tether_rejections_total{status=\"429\",reason=\"resume_budget\"}")
        .await
        .unwrap();
    assert_eq!(rejected, refusals as f64);
    let hits = b
        .metric("tether_resumes_total{result=\"hit\",reason=\"none\"}")
        .await
        .unwrap();
    assert_eq!(hits, STORM as f64);
}

/// How a call of a session on the killed pod ended.
#[derive(Debug, PartialEq, Eq, Hash, Clone, Copy)]
enum Ending {
    /// The answer arrived.
    Completed,
    /// A JSON-RPC error `handoff_interrupted` arrived instead.
    Interrupted,
    /// The session was lost: 404.
    NotFound,
    /// Anything else (see the test's problems).
    Failed,
}

/// A `slow` call of 30 progress notifications via `client`, followed like an EventSource
/// follows a stream ([`Tracked::follow`]): when it ends before the answer, the client waits the
/// `retry` hint (100 ms without one, spec R-07) and resumes, retrying a 503 after its
/// `Retry-After`. Every event is checked (duplicates, foreign events); the call ends
/// [`Ending::Completed`], [`Ending::Interrupted`] or [`Ending::NotFound`], or with what went wrong.
async fn follow_call(
    client: McpClient,
    session: Session,
    call_id: String,
) -> (Tracked, Result<Ending, String>) {
    let plan = CallPlan::steady(30, 100);
    let (mut call, events) = Tracked::post(&client, &session, 2, &call_id, &plan)
        .await
        .unwrap();
    let how = Follow {
        stall: Duration::from_secs(5),
        retry: Duration::from_millis(100),
        retry_on: vec![StatusCode::SERVICE_UNAVAILABLE],
        // The 20th reconnect of the stream is where the call gives up.
        reconnects: 19,
    };
    let ending = match call.follow(&client, &session, events, &how, None).await {
        Stop::Answered => {
            let o = &call.out;
            let interrupted = o.failures.len() == 1
                && o.failures[0].contains("error result")
                && o.failures[0].contains("handoff_interrupted");
            match o.result.as_deref() {
                _ if o.duplicated + o.foreign > 0 => Err(format!("{o:?}")),
                Some("done 30") if o.failures.is_empty() && o.lost(30) == 0 => {
                    Ok(Ending::Completed)
                }
                Some("") if interrupted => Ok(Ending::Interrupted),
                _ => Err(format!("{o:?}")),
            }
        }
        Stop::Gone => Ok(Ending::NotFound),
        Stop::Reached(_) | Stop::Failed => {
            // What the holder has under the id of the last message the client read (messages
            // are numbered from 1 on the writer, A).
            let before = format!(
                "{}-{}",
                call.stream().unwrap_or_default(),
                call.out.events.saturating_sub(1)
            );
            let holder = match client.get(&session, Some(&before)).await {
                Ok(resp) => rest_of(resp).await,
                Err(e) => Err(e.to_string()),
            };
            Err(format!(
                "no answer: {:?}; the holder's events after {before}: {holder:?}",
                call.out
            ))
        }
    };
    (call, ending)
}

/// S-06, R-01 (a pod SIGKILLed mid-handoff, `docs/design/handoff.md`): A holds 100 sessions,
/// each with a `slow` call whose client reads through B or C (forwarded to A). A starts
/// draining and its sidecar is killed once B and C acknowledged 20 sessions, while the others
/// are moving. Sessions a peer acknowledged continue; only the others end in 404; every call
/// completes or ends with a JSON-RPC error `handoff_interrupted` within bounded time; no client
/// ever gets a foreign event or one twice. Without replication (with it, the unacknowledged
/// sessions live on too: `replication.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s06_r01_a_pod_killed_mid_handoff_loses_only_unacknowledged_sessions() {
    let _heavy = load::heavy().await;
    const SESSIONS: usize = 100;
    let mut s = Scenario::start(3, PodSpec::default().unreplicated()).await;
    let via_rest = s.via_rest();
    let mut sessions = Vec::new();
    for i in 0..SESSIONS {
        let version = ["2025-06-18", "2025-11-25"][i % 2];
        sessions.push(s.on_a(version).await);
    }
    let calls: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(i, session)| {
            let run = follow_call(via_rest.clone(), session.clone(), format!("kill-{i}"));
            tokio::spawn(tokio::time::timeout(Duration::from_secs(20), run))
        })
        .collect();
    let started = Instant::now();
    while s.pod_a().stats().await.unwrap()["executions"] != SESSIONS {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "calls did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drain = s.drain_a().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.received().await < (SESSIONS / 5) as f64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let index = s.cluster.pods.iter().position(|p| p.ip == s.a).unwrap();
    s.cluster.pods[index].kill_sidecar().await.unwrap();
    let killed = s.cluster.pods.remove(index);
    drop(drain);
    s.cluster.set_state(s.a, None).await.unwrap();
    let acknowledged = s.received().await;
    let mut endings = HashMap::new();
    let mut by_session = Vec::new();
    let mut problems = Vec::new();
    let mut refused = 0;
    for (i, task) in calls.into_iter().enumerate() {
        let ending = match task.await.unwrap() {
            Ok((call, ending)) => {
                refused += call.refused.len();
                ending.map_err(|e| format!("call {i}: {e}"))
            }
            Err(_) => Err(format!("call {i} hung")),
        };
        let ending = ending.unwrap_or_else(|problem| {
            problems.push(problem);
            Ending::Failed
        });
        *endings.entry(ending).or_insert(0) += 1;
        by_session.push(ending);
    }
    drop(killed);
    // Which sessions live on: a request of each through B or C.
    let mut alive = 0.0;
    for (i, session) in sessions.iter().enumerate() {
        let answer = via_rest
            .post(
                Some(session),
                &tool_call(3, "echo", json!({"text": "after"}), None),
                &[],
            )
            .await
            .unwrap();
        if answer.status() == StatusCode::OK {
            alive += 1.0;
            if by_session[i] == Ending::NotFound {
                problems.push(format!(
                    "session {i} was 404 for its resume, then came back"
                ));
            }
        } else {
            s.check(
                expect_lost_session(answer)
                    .await
                    .map_err(|e| format!("session {i}: {e}")),
            );
            if !matches!(by_session[i], Ending::NotFound | Ending::Failed) {
                problems.push(format!(
                    "session {i} ended after its call {:?}",
                    by_session[i]
                ));
            }
        }
    }
    let moved_on = s
        .cluster
        .metric_sum("tether_handoffs_sent_total")
        .await
        .unwrap();
    let received = s.received().await;
    println!(
        "killed mid-handoff: {acknowledged} acknowledged when killed, {received} in all; \
         {alive} sessions alive, endings {endings:?}, {refused} resumes refused with 503"
    );
    assert_eq!(
        alive,
        received - moved_on,
        "exactly the acknowledged sessions live on\n{}",
        s.cluster.logs()
    );
    assert!(received >= 1.0);
    assert!(
        problems.is_empty(),
        "{} calls went wrong, e.g. {:#?}\n{}",
        problems.len(),
        &problems[..problems.len().min(3)],
        s.cluster.logs()
    );
}

/// The `notify` log notifications of `events` until it ends or is silent for 3 s: `(text, seq)`
/// of each, and the id of the last event (the cursor to resume from).
async fn notifications(mut events: Events, cursor: &mut String) -> Vec<(String, u64)> {
    let mut got = Vec::new();
    while let Some(ev) = events.next_within(Duration::from_secs(3)).await {
        if let Some(id) = ev.id {
            *cursor = id;
        }
        let Ok(msg) = serde_json::from_str::<Value>(&ev.data.unwrap_or_default()) else {
            continue;
        };
        let data = &msg["params"]["data"];
        if let (Some(text), Some(seq)) = (data["text"].as_str(), data["seq"].as_u64()) {
            got.push((text.to_owned(), seq));
        }
    }
    got
}

/// A standalone stream whose session moved while a call kept it followed goes on at the new
/// holder after the pod writing it is SIGKILLed: the client's resume after the last event it
/// read gets the new holder's standalone stream, with what the MCP server sent there. The copy
/// of a stream whose writer died is numbered past its last event (the writer may have sent
/// clients events that never arrived); before, that numbering hid its end, and every resume was
/// served the empty copy, which ended at once: the client reconnected in a loop and every later
/// notification was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r03_a_standalone_stream_whose_writer_was_killed_resumes_on_the_new_holders() {
    let mut s = Scenario::start(2, PodSpec::default()).await;
    let session = s.on_a("2025-11-25").await;
    let via_a = s.via_a();
    let resp = via_a.get(&session, None).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let notify = |client: McpClient, id: u64, text: &'static str| {
        let session = session.clone();
        async move {
            let args = json!({"text": text, "count": 3});
            tether_tests::follow::call_to_answer(
                &client,
                &session,
                id,
                "notify",
                args,
                &Follow::default(),
            )
            .await
            .unwrap();
        }
    };
    notify(via_a.clone(), 2, "before").await;
    let mut cursor = String::new();
    let before = notifications(Events::new(resp), &mut cursor).await;
    assert_eq!(before.len(), 3, "{before:?}");
    // A call still running at A keeps A writing the session's streams after the move.
    let call = via_a
        .post(Some(&session), &slow_body(3, "held", 30, 500), &[])
        .await
        .unwrap();
    let drain = s.drain_a().await;
    s.wait_moved(1.0).await;
    let index = s.cluster.pods.iter().position(|p| p.ip == s.a).unwrap();
    s.cluster.pods[index].kill_sidecar().await.unwrap();
    let killed = s.cluster.pods.remove(index);
    drop((drain, call));
    s.cluster.set_state(s.a, None).await.unwrap();
    let via_b = s.via_rest();
    notify(via_b.clone(), 4, "after").await;
    // The client resumes as EventSource does, after the last event it read.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut after = Vec::new();
    let mut resumes = 0;
    while after.len() < 3 && Instant::now() < deadline {
        resumes += 1;
        let resp = via_b.get(&session, Some(&cursor)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "resume {resumes}");
        after.extend(notifications(Events::new(resp), &mut cursor).await);
    }
    drop(killed);
    assert_eq!(
        after,
        [1, 2, 3].map(|seq| ("after".to_owned(), seq)),
        "the notifications sent at the new holder, each once ({resumes} resumes)"
    );
}

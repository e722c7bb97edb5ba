//! An MCP server that requires authorization behind tether (`tether-example-server --auth-key`,
//! bearer JWTs): sessions bound to their principal (`spec.auth.binding`), refusals passed to
//! the client and not kept as a request's outcome, a DELETE the server refuses leaving the
//! session, and a session handed to another pod rebuilt there with its clients' credentials.

use std::time::Duration;

use http::StatusCode;
use serde_json::json;
use tether_tests::auth::Issuer;
use tether_tests::call::{self, CallPlan};
use tether_tests::client::{
    Events, McpClient, Session, body_text, expect_lost_session, header_str, messages, tool_call,
};
use tether_tests::pod::{Pod, PodSpec};
use tether_tests::scenario::Scenario;

const HOUR: Duration = Duration::from_secs(3600);

/// The test endpoint with MCP servers accepting `issuer`'s tokens.
fn authenticated(issuer: &Issuer) -> PodSpec {
    PodSpec {
        server_args: issuer.server_args(),
        ..PodSpec::default()
    }
}

async fn authenticated_pod(issuer: &Issuer) -> Pod {
    Pod::start(authenticated(issuer)).await.unwrap()
}

/// Two authenticated pods, and alice's session on A (the pod that drains), initialized with
/// `token`.
async fn alices_session_on_a(issuer: &Issuer, token: String) -> (Scenario, McpClient, Session) {
    alices_session_on_a_of(authenticated(issuer), token).await
}

/// [`alices_session_on_a`] with pods of `spec`.
async fn alices_session_on_a_of(spec: PodSpec, token: String) -> (Scenario, McpClient, Session) {
    let scenario = Scenario::start(2, spec).await;
    let via_a = scenario.via_a();
    via_a.set_authorization(Some(token));
    let session = via_a.initialize("2025-11-25").await.unwrap();
    (scenario, via_a, session)
}

/// [`authenticated`] pods whose MCP servers check tokens slowly ([`SLOW_CHECK_MS`]).
fn slowly_authenticated(issuer: &Issuer) -> PodSpec {
    let mut spec = authenticated(issuer);
    spec.server_args
        .extend(["--auth-latency-ms".into(), SLOW_CHECK_MS.to_string()]);
    spec
}

/// `Bearer <token>` of alice from the usual issuer, valid for `ttl` (expired for a zero
/// `ttl`).
fn alices_token(issuer: &Issuer, ttl: Duration) -> String {
    issuer.bearer("https://idp.example", "alice", ttl)
}

/// A `slow` call `call_id` with no progress event: answered at once with `done 0`.
fn quick_call(call_id: &str) -> serde_json::Value {
    let args = json!({"count": 0, "interval_ms": 10, "call_id": call_id});
    tool_call(2, "slow", args, None)
}

/// Posts [`quick_call`] `call`: answered 200 with `done 0`.
async fn answered_at_once(client: &McpClient, session: &Session, call: &serde_json::Value) {
    let resp = client.post(Some(session), call, &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let answer = messages(resp, Duration::from_secs(10)).await.unwrap();
    assert!(
        answer
            .iter()
            .any(|m| m["result"]["content"][0]["text"] == "done 0"),
        "{answer:?}"
    );
}

/// Posts `call` with the client's expired token: the MCP server's 401 and its challenge reach
/// the client unchanged.
async fn refused_as_expired(client: &McpClient, session: &Session, call: &serde_json::Value) {
    let refused = client.post(Some(session), call, &[]).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let challenge = header_str(&refused, "www-authenticate").unwrap_or_default();
    assert!(challenge.contains("invalid_token"), "{challenge}");
    drop(body_text(refused).await);
}

/// An authenticated pod, a client holding alice's token, and her session.
async fn alices_session(issuer: &Issuer) -> (Pod, McpClient, Session) {
    let pod = authenticated_pod(issuer).await;
    let client = pod.client();
    client.set_authorization(Some(alices_token(issuer, HOUR)));
    let session = client.initialize("2025-11-25").await.unwrap();
    (pod, client, session)
}

/// Posts a `slow` call `call_id` (5 progress events 50 ms apart) and cuts it after its first
/// event: the call's body, and that event's id, a cursor the call's other events can be resumed
/// after.
async fn first_cursor(
    client: &McpClient,
    session: &Session,
    call_id: &str,
) -> (serde_json::Value, String) {
    let args = json!({"count": 5, "interval_ms": 50, "call_id": call_id});
    let call = tool_call(2, "slow", args, Some("p"));
    let resp = client.post(Some(session), &call, &[]).await.unwrap();
    let mut events = Events::new(resp);
    loop {
        let ev = events
            .next_within(Duration::from_secs(10))
            .await
            .expect("an event");
        if let Some(id) = ev.id {
            return (call, id);
        }
    }
}

#[tokio::test]
async fn the_authenticated_example_server_refuses_missing_tokens_and_other_subjects() {
    let issuer = Issuer::new().unwrap();
    let pod = authenticated_pod(&issuer).await;
    // Straight to the MCP server, without tether: the fixture behaves as an SDK server does.
    let server = McpClient::new(format!("{}/mcp", pod.server_url));
    let err = server
        .initialize("2025-11-25")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("401"), "{err}");
    server.set_authorization(Some(alices_token(&issuer, HOUR)));
    let alice = server.initialize("2025-11-25").await.unwrap();
    let echo = json!({"text": "hi"});
    assert!(server.call(&alice, 2, "echo", echo.clone()).await.is_ok());
    server.set_authorization(Some(issuer.bearer("https://idp.example", "bob", HOUR)));
    let err = server
        .call(&alice, 3, "echo", echo.clone())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("404"), "another sub: {err}");
    server.set_authorization(Some(alices_token(&issuer, Duration::ZERO)));
    let resp = server
        .post(Some(&alice), &tool_call(4, "echo", echo, None), &[])
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "an expired token");
    let challenge = header_str(&resp, "www-authenticate").unwrap_or_default();
    assert!(
        challenge.starts_with("Bearer ") && challenge.contains("invalid_token"),
        "{challenge}"
    );
    let stats = pod.stats().await.unwrap();
    assert_eq!(stats["unauthenticated"], 2, "{stats}");
    assert_eq!(stats["missing_credentials"], 1, "{stats}");
    assert_eq!(stats["principal_mismatches"], 1, "{stats}");
}

#[tokio::test]
async fn a_refused_request_sent_again_with_a_fresh_token_is_dispatched_and_runs_once() {
    let issuer = Issuer::new().unwrap();
    let (pod, client, session) = alices_session(&issuer).await;
    let call = quick_call("after-refresh");
    // The token expired: the MCP server's 401 and its challenge reach the client unchanged.
    client.set_authorization(Some(alices_token(&issuer, Duration::ZERO)));
    refused_as_expired(&client, &session, &call).await;
    // The client refreshes its token and sends the same message: dispatched, not the stored 401.
    client.set_authorization(Some(alices_token(&issuer, HOUR)));
    sent_again_runs_once(&pod, &client, &session, &call).await;
}

/// Sends `call` (a `slow` call of count 0, refused before) again: it is dispatched and answered,
/// its tool runs once, and once answered the same message is a retry, replayed, not run again.
async fn sent_again_runs_once(
    pod: &Pod,
    client: &McpClient,
    session: &Session,
    call: &serde_json::Value,
) {
    let call_id = call["params"]["arguments"]["call_id"].as_str().unwrap();
    answered_at_once(client, session, call).await;
    let stats = pod.stats().await.unwrap();
    assert_eq!(stats["calls"][call_id], 1, "the tool ran once: {stats}");
    let again = client.post(Some(session), call, &[]).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    drop(body_text(again).await);
    let stats = pod.stats().await.unwrap();
    assert_eq!(stats["calls"][call_id], 1, "{stats}");
}

#[tokio::test]
async fn a_request_refused_429_sent_again_after_retry_after_is_dispatched_and_runs_once() {
    let issuer = Issuer::new().unwrap();
    // Two requests per caller and 5 s window: `initialize` and `notifications/initialized`.
    let limit = ["--rate-limit", "2", "--rate-window-ms", "5000"].map(String::from);
    let pod = Pod::start(PodSpec {
        server_args: [issuer.server_args(), limit.to_vec()].concat(),
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    client.set_authorization(Some(alices_token(&issuer, HOUR)));
    let session = client.initialize("2025-11-25").await.unwrap();
    let call = quick_call("after-429");
    let refused = client.post(Some(&session), &call, &[]).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = header_str(&refused, "retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in seconds");
    assert!((1..=5).contains(&wait), "Retry-After: {wait}");
    drop(body_text(refused).await);
    tokio::time::sleep(Duration::from_secs(wait)).await;
    sent_again_runs_once(&pod, &client, &session, &call).await;
    assert_eq!(pod.stats().await.unwrap()["rate_limited"], 1);
}

#[tokio::test]
async fn a_delete_the_server_refuses_passes_through_and_the_session_stays() {
    let issuer = Issuer::new().unwrap();
    let (_pod, client, session) = alices_session(&issuer).await;
    client.set_authorization(Some(alices_token(&issuer, Duration::ZERO)));
    assert_eq!(
        client.delete(&session).await.unwrap(),
        StatusCode::UNAUTHORIZED
    );
    client.set_authorization(Some(alices_token(&issuer, HOUR)));
    let echo = json!({"text": "still here"});
    assert!(
        client.call(&session, 2, "echo", echo.clone()).await.is_ok(),
        "the session stays"
    );
    assert!(client.delete(&session).await.unwrap().is_success());
    let err = client.call(&session, 3, "echo", echo).await.unwrap_err();
    assert!(err.to_string().contains("404"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_off_session_is_rebuilt_with_its_clients_credentials() {
    let issuer = Issuer::new().unwrap();
    let (mut scenario, via_a, session) =
        alices_session_on_a(&issuer, alices_token(&issuer, HOUR)).await;
    let echo = |text: &str| json!({"text": text});
    assert!(
        via_a
            .call(&session, 2, "echo", echo("before"))
            .await
            .is_ok()
    );
    let drain = scenario.drain_a().await;
    scenario.wait_moved(1.0).await;
    // The client refreshed its token meanwhile; the new holder rebuilds the upstream session
    // with the credentials of this request, and never sends one without.
    let via_rest = scenario.via_rest();
    via_rest.set_authorization(Some(issuer.bearer(
        "https://idp.example",
        "alice",
        HOUR * 2,
    )));
    let answer = via_rest
        .call(&session, 3, "echo", echo("after the move"))
        .await
        .unwrap();
    assert!(answer.iter().any(|m| m["result"].is_object()), "{answer:?}");
    // The binding moved with the session.
    let bob = scenario.via_rest();
    bob.set_authorization(Some(issuer.bearer("https://idp.example", "bob", HOUR)));
    let err = bob
        .call(&session, 4, "echo", echo("not mine"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("404"), "{err}");
    drop(scenario.stop_a(drain).await);
    for pod in &scenario.cluster.pods {
        let stats = pod.stats().await.unwrap();
        assert_eq!(stats["unauthenticated"], 0, "{stats}");
        assert_eq!(stats["principal_mismatches"], 0, "{stats}");
        assert_eq!(pod.metric("tether_not_found_total").await.unwrap(), 0.0);
    }
    assert!(
        scenario
            .metric_of_rest("tether_sessions_rebuilt_total")
            .await
            >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_refused_for_an_expired_token_waits_for_the_refreshed_one() {
    let issuer = Issuer::new().unwrap();
    let (mut scenario, _, session) =
        alices_session_on_a(&issuer, alices_token(&issuer, HOUR)).await;
    let drain = scenario.drain_a().await;
    scenario.wait_moved(1.0).await;
    // The first request on the new holder carries a token that expired meanwhile: the rebuild
    // it triggers is refused, and the client gets the MCP server's 401 and challenge.
    let via_rest = scenario.via_rest();
    via_rest.set_authorization(Some(alices_token(&issuer, Duration::ZERO)));
    let call = quick_call("after-expiry");
    refused_as_expired(&via_rest, &session, &call).await;
    // The same message with a refreshed token rebuilds the session and runs the tool, once.
    via_rest.set_authorization(Some(alices_token(&issuer, HOUR)));
    answered_at_once(&via_rest, &session, &call).await;
    drop(scenario.stop_a(drain).await);
    assert_eq!(scenario.executions().await, 1);
    for pod in &scenario.cluster.pods {
        assert_eq!(pod.metric("tether_not_found_total").await.unwrap(), 0.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_is_judged_on_the_credentials_of_the_request_that_waits_for_it() {
    // Requests of one session with an expired and a fresh token interleave on the new holder
    // (a client's requests sent before and after its refresh): each gets the MCP server's
    // judgement of its own token, never a 401 earned by another request's.
    let issuer = Issuer::new().unwrap();
    let (mut scenario, _, session) =
        alices_session_on_a_of(slowly_authenticated(&issuer), alices_token(&issuer, HOUR)).await;
    let drain = scenario.drain_a().await;
    scenario.wait_moved(1.0).await;
    let expired = scenario.via_rest();
    expired.set_authorization(Some(alices_token(&issuer, Duration::ZERO)));
    let fresh = scenario.via_rest();
    fresh.set_authorization(Some(alices_token(&issuer, HOUR)));
    let call = |id: u64, call_id: &str| {
        tool_call(
            id,
            "slow",
            json!({"count": 0, "interval_ms": 10, "call_id": call_id}),
            None,
        )
    };
    let later = |ms: u64| tokio::time::sleep(Duration::from_millis(ms));
    // The first, expired, triggers the rebuild (refused after SLOW_CHECK_MS); the fresh one
    // waits for it, and a second expired one comes after the fresh one.
    let (first, refreshed, after) = (
        call(11, "expired-first"),
        call(12, "fresh"),
        call(13, "expired-after"),
    );
    tokio::join!(
        refused_as_expired(&expired, &session, &first),
        async {
            later(SLOW_CHECK_MS / 5).await;
            answered_at_once(&fresh, &session, &refreshed).await;
        },
        async {
            later(SLOW_CHECK_MS * 2 / 5).await;
            refused_as_expired(&expired, &session, &after).await;
        },
    );
    drop(scenario.stop_a(drain).await);
    assert_eq!(scenario.executions().await, 1, "only the fresh call ran");
}

/// How long the MCP servers of [`refused_while_moving`] take to check a token, in ms: long
/// enough for A to hand the session off while a request waits for its refusal.
const SLOW_CHECK_MS: u64 = 1500;

/// When the other pod acknowledges the session, and whether the client sends the call again
/// before A's MCP server refuses it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Moment {
    /// The session moves before the refusal; the client sends the call again after it.
    MovedFirst,
    /// The session is imaged before the refusal but acknowledged after it (the other pod's
    /// sidecar is frozen meanwhile): the refusal happens between the image and the follower.
    AcknowledgedAfter,
    /// The session moves before the refusal, and the call, refreshed token, reaches the other
    /// pod before the refusal too: that retry joins the request still at A's MCP server.
    JoinedBefore,
}

/// Two pods whose MCP servers check tokens slowly ([`SLOW_CHECK_MS`]), alice's session on A,
/// and A draining while its MCP server is still refusing `call`, sent with an expired token;
/// the client gets the 401 from A. Then (or, [`Moment::JoinedBefore`], before the refusal) the
/// same message with a refreshed token, sent to the other pod, runs there: answered once.
async fn refused_while_moving(moment: Moment, call_id: &str) {
    let issuer = Issuer::new().unwrap();
    let call = quick_call(call_id);
    let (mut scenario, via_a, session) =
        alices_session_on_a_of(slowly_authenticated(&issuer), alices_token(&issuer, HOUR)).await;
    via_a.set_authorization(Some(alices_token(&issuer, Duration::ZERO)));
    let via_rest = scenario.via_rest();
    via_rest.set_authorization(Some(alices_token(&issuer, HOUR)));
    let mut drain = None;
    tokio::join!(refused_as_expired(&via_a, &session, &call), async {
        tokio::time::sleep(Duration::from_millis(SLOW_CHECK_MS / 5)).await;
        if moment == Moment::AcknowledgedAfter {
            // Every pod knows A drains first (the other one then stops answering anything).
            let a = scenario.a;
            let draining = scenario.cluster.set_state(a, Some("draining")).await;
            scenario.check(draining);
            scenario.cluster.pods[1]
                .signal_sidecar("STOP")
                .await
                .unwrap();
            drain = Some(scenario.pod_a().start_drain());
        } else {
            drain = Some(scenario.drain_a().await);
        }
        if moment == Moment::JoinedBefore {
            scenario.wait_moved(1.0).await;
            answered_at_once(&via_rest, &session, &call).await;
        }
    });
    if moment == Moment::AcknowledgedAfter {
        scenario.cluster.pods[1]
            .signal_sidecar("CONT")
            .await
            .unwrap();
    }
    scenario.wait_moved(1.0).await;
    if moment != Moment::JoinedBefore {
        // The new holder learnt that the call was not carried out, so it runs (it used to wait
        // for an answer A would never send).
        answered_at_once(&via_rest, &session, &call).await;
    }
    drop(scenario.stop_a(drain.expect("A drains")).await);
    assert_eq!(scenario.executions().await, 1);
    if moment == Moment::JoinedBefore {
        let joined = scenario
            .metric_of_rest(r#"tether_request_id_reuse_total{outcome="joined"}"#)
            .await;
        assert!(joined >= 1.0, "the retry joined the request in flight");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_after_its_session_moved_is_dispatched_again_on_the_new_holder() {
    refused_while_moving(Moment::MovedFirst, "refused-after-move").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_while_its_session_was_being_pushed_is_dispatched_on_the_new_holder() {
    refused_while_moving(Moment::AcknowledgedAfter, "refused-mid-push").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_that_joined_a_request_refused_at_the_old_holder_is_dispatched_itself() {
    // When A's refusal arrives, the retry is dispatched itself, with its own token, instead of
    // getting a 401 it did not earn.
    refused_while_moving(Moment::JoinedBefore, "joined-mid-move").await;
}

#[tokio::test]
async fn a_session_is_bound_to_its_principal_and_others_get_the_404_of_an_unknown_one() {
    let issuer = Issuer::new().unwrap();
    let (pod, alice, session) = alices_session(&issuer).await;
    // A streamed call of alice's, cut after its first event: a cursor to resume from.
    let (call, cursor) = first_cursor(&alice, &session, "alices").await;
    let others = [
        Some(issuer.bearer("https://idp.example", "bob", HOUR)),
        Some(issuer.bearer("https://other-idp.example", "alice", HOUR)),
        // Alice's own token, issued to another client application (`spec.auth.binding`
        // `SubjectAndClient`, the default).
        Some(issuer.bearer_of_client("https://idp.example", "alice", "another-app", HOUR)),
        None,
    ];
    for (n, authorization) in others.into_iter().enumerate() {
        let other = pod.client();
        other.set_authorization(authorization);
        let posted = other
            .post(
                Some(&session),
                &tool_call(10, "echo", json!({"text": "x"}), None),
                &[],
            )
            .await
            .unwrap();
        let got = other.get(&session, None).await.unwrap();
        let resumed = other.get(&session, Some(&cursor)).await.unwrap();
        let retried = other.post(Some(&session), &call, &[]).await.unwrap();
        let deleted = other.delete(&session).await.unwrap();
        for resp in [posted, got, resumed, retried] {
            expect_lost_session(resp)
                .await
                .unwrap_or_else(|e| panic!("caller {n}: {e}"));
        }
        assert_eq!(deleted, StatusCode::NOT_FOUND, "caller {n}");
    }
    assert_eq!(
        pod.metric(r#"tether_not_found_total{reason="principal_mismatch"}"#)
            .await
            .unwrap(),
        20.0
    );
    // Nothing reached the MCP server; alice's session goes on, with a refreshed token too.
    let stats = pod.stats().await.unwrap();
    assert_eq!(stats["unauthenticated"], 0, "{stats}");
    assert_eq!(
        stats["calls"]["alices"], 1,
        "the retries were not dispatched: {stats}"
    );
    alice.set_authorization(Some(issuer.bearer(
        "https://idp.example",
        "alice",
        HOUR * 2,
    )));
    let resumed = alice.get(&session, Some(&cursor)).await.unwrap();
    let rest = messages(resumed, Duration::from_secs(10)).await.unwrap();
    assert!(rest.iter().any(|m| m["result"].is_object()), "{rest:?}");
    assert!(alice.delete(&session).await.unwrap().is_success());
}

#[tokio::test]
async fn a_loopback_server_defending_against_dns_rebinding_serves_a_public_host_and_browser() {
    let pod = Pod::start(PodSpec {
        server_args: vec!["--local-only".into()],
        ..PodSpec::default()
    })
    .await
    .unwrap();
    let client = pod.client();
    // A browser client of a public name, with an Origin the endpoint allows.
    let public = [
        ("host", "mcp.example.com"),
        ("origin", "https://app.example.com"),
    ];
    let resp = client
        .post(
            None,
            &tether_tests::client::initialize_body(1, "2025-11-25"),
            &public,
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{:?}", body_text(resp).await);
    let session = tether_tests::client::Session {
        id: header_str(&resp, "mcp-session-id").unwrap(),
        version: "2025-11-25".into(),
    };
    drop(body_text(resp).await);
    let resp = client
        .post(
            Some(&session),
            &tool_call(2, "echo", json!({"text": "hi"}), None),
            &public,
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    drop(body_text(resp).await);
    let stats = pod.stats().await.unwrap();
    assert!(
        stats["forwarded"].as_u64().unwrap() >= 2,
        "X-Forwarded-Host sent: {stats}"
    );
    // The same server refuses that Host and Origin when they reach it unchanged.
    let direct = McpClient::new(format!("{}/mcp", pod.server_url));
    let resp = direct
        .post(
            None,
            &tether_tests::client::initialize_body(1, "2025-11-25"),
            &public,
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::MISDIRECTED_REQUEST);
}

/// A resume whose JWT expired is refused by tether itself (a stream ends when its token
/// expires, so none opens on an expired one), and one whose token the MCP server refuses
/// (signed by another key, not expired) gets the server's 401; neither gets an event, and the
/// same resume with a fresh token is served from the buffer.
#[tokio::test]
async fn a_resume_with_a_credential_the_server_now_refuses_gets_its_401_and_no_event() {
    let issuer = Issuer::new().unwrap();
    let pod = Pod::start(PodSpec {
        revalidate: "1s".into(),
        ..authenticated(&issuer)
    })
    .await
    .unwrap();
    let alice = pod.client();
    // A token that expires within 3 s (the MCP server then refuses it).
    let short = alices_token(&issuer, Duration::from_secs(3));
    alice.set_authorization(Some(short));
    let session = alice.initialize("2025-11-25").await.unwrap();
    let (_, cursor) = first_cursor(&alice, &session, "buffered").await;
    // The call finishes into the buffer; the token expires; the window passes.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let refused = alice.get(&session, Some(&cursor)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let challenge = header_str(&refused, "www-authenticate").unwrap_or_default();
    assert!(challenge.contains("invalid_token"), "{challenge}");
    let body = body_text(refused).await.unwrap();
    assert!(!body.contains("progress"), "no buffered event: {body}");
    assert_eq!(
        pod.metric(r#"tether_rejections_total{status="401",reason="credential_expired"}"#)
            .await
            .unwrap(),
        1.0
    );
    // A token that has not expired but that the MCP server refuses: it is asked.
    alice.set_authorization(Some(alices_token(&Issuer::new().unwrap(), HOUR)));
    let refused = alice.get(&session, Some(&cursor)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let body = body_text(refused).await.unwrap();
    assert!(!body.contains("progress"), "no buffered event: {body}");
    assert_eq!(
        pod.metric(r#"tether_revalidations_total{result="refused"}"#)
            .await
            .unwrap(),
        1.0
    );
    // With a fresh token the same resume is served from the buffer.
    alice.set_authorization(Some(alices_token(&issuer, HOUR)));
    let resumed = alice.get(&session, Some(&cursor)).await.unwrap();
    assert_eq!(resumed.status(), StatusCode::OK);
    let rest = messages(resumed, Duration::from_secs(10)).await.unwrap();
    assert!(rest.iter().any(|m| m["result"].is_object()), "{rest:?}");
    assert_eq!(
        pod.metric(r#"tether_revalidations_total{result="accepted"}"#)
            .await
            .unwrap(),
        1.0
    );
}

/// Revalidations of one session at once — resumes and the standalone stream's reconnect, all
/// with a credential the MCP server has not accepted within the window, as after a token
/// refresh — are each answered at once, and nothing but the server's own messages reaches the
/// standalone stream: every `ping` a revalidation sends has a request id of its own (the spec
/// forbids reusing one in a session). With one id for every ping, the MCP server (rmcp) answered
/// one ping on the other's stream and the other on the standalone stream: a resume that waited
/// for the server's upstream timeout, and a foreign message on the standalone stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_revalidations_in_one_session_are_each_answered() {
    const RESUMES: usize = 20;
    let issuer = Issuer::new().unwrap();
    let pod = Pod::start(PodSpec {
        revalidate: "1s".into(),
        sidecar_args: vec!["--max-takeovers".into(), "1000".into()],
        ..authenticated(&issuer)
    })
    .await
    .unwrap();
    let alice = pod.client();
    alice.set_authorization(Some(alices_token(&issuer, HOUR)));
    let session = alice.initialize("2025-11-25").await.unwrap();
    let standalone = alice.get(&session, None).await.unwrap();
    assert_eq!(standalone.status(), StatusCode::OK);
    let mut standalone = Events::new(standalone);
    let (_, cursor) = first_cursor(&alice, &session, "revalidated").await;
    // The call finishes into the buffer and the window passes: each resume asks the server.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let resumes = (0..RESUMES).map(|_| async {
        tokio::time::timeout(Duration::from_secs(10), alice.get(&session, Some(&cursor)))
            .await
            .map(|answered| answered.map(|resp| resp.status()))
    });
    let answered = futures::future::join_all(resumes).await;
    let hung = answered.iter().filter(|a| a.is_err()).count();
    assert_eq!(
        hung, 0,
        "resumes without response headers within 10 s: {answered:?}"
    );
    assert!(
        pod.metric(r#"tether_revalidations_total{result="accepted"}"#)
            .await
            .unwrap()
            >= 2.0,
        "the resumes revalidated at once"
    );
    // The standalone stream carries no answer to a ping it never sent.
    while let Some(ev) = standalone.next_within(Duration::from_millis(500)).await {
        let data = ev.data.unwrap_or_default();
        assert!(
            data.is_empty(),
            "a foreign message on the standalone stream: {data}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_on_the_new_holder_is_authorized_by_the_rebuild_it_triggers() {
    let issuer = Issuer::new().unwrap();
    let token = alices_token(&issuer, HOUR);
    let (mut scenario, via_a, session) = alices_session_on_a(&issuer, token.clone()).await;
    let (_, cursor) = first_cursor(&via_a, &session, "moved").await;
    // The call finishes into A's buffer, which moves to B with the session.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let drain = scenario.drain_a().await;
    scenario.wait_moved(1.0).await;
    let via_rest = scenario.via_rest();
    let resume = |authorization: String| {
        via_rest.set_authorization(Some(authorization));
        via_rest.get(&session, Some(&cursor))
    };
    // The credential the MCP server accepted on A moved with the session (as a digest): B
    // serves the resume from the moved buffer without asking, as A would have.
    let served = resume(token).await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    let rest = messages(served, Duration::from_secs(10)).await.unwrap();
    assert!(rest.iter().any(|m| m["result"].is_object()), "{rest:?}");
    assert_eq!(
        scenario
            .metric_of_rest("tether_sessions_rebuilt_total")
            .await,
        0.0,
        "nothing asked the MCP server"
    );
    // Another credential, which the server refuses: B has no upstream session yet to ping,
    // so the rebuild it needs is the server's judgement, and nothing is served.
    let expired = alices_token(&issuer, Duration::ZERO);
    let refused = resume(expired).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let body = body_text(refused).await.unwrap();
    assert!(!body.contains("progress"), "no buffered event: {body}");
    // A refreshed token: the rebuild accepts it and the resume is served.
    let resumed = resume(issuer.bearer("https://idp.example", "alice", HOUR * 2))
        .await
        .unwrap();
    assert_eq!(resumed.status(), StatusCode::OK);
    let rest = messages(resumed, Duration::from_secs(10)).await.unwrap();
    assert!(rest.iter().any(|m| m["result"].is_object()), "{rest:?}");
    drop(scenario.stop_a(drain).await);
    assert_eq!(
        scenario
            .metric_of_rest("tether_sessions_rebuilt_total")
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sep1699_a_long_polling_stream_goes_on_across_a_token_refresh() {
    let issuer = Issuer::new().unwrap();
    let pod = authenticated_pod(&issuer).await;
    let client = pod.client();
    // `exp` is 1 s ahead, rounded down to a second, and a token is refused once the clock is
    // past that second: valid for 1 to 2 s, expired when the server closes the stream.
    client.set_authorization(Some(alices_token(&issuer, Duration::from_secs(1))));
    let session = client.initialize("2025-11-25").await.unwrap();
    // Progress every 700 ms; the MCP server closes the SSE connection after the 4th (2.8 s in,
    // the first token expired) and the sidecar resumes the upstream stream (SEP-1699).
    let mut plan = CallPlan::steady(6, 700);
    plan.close_after = Some(4);
    let running = {
        let (client, session) = (client.clone(), session.clone());
        tokio::spawn(async move { call::slow(&client, &session, 2, "long-poll", &plan).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The client refreshes its token and uses it: the session's latest credentials.
    client.set_authorization(Some(alices_token(&issuer, HOUR)));
    assert!(
        client
            .call(&session, 3, "echo", json!({"text": "refreshed"}))
            .await
            .is_ok()
    );
    let out = running.await.unwrap().unwrap();
    assert_eq!(
        out.progress,
        (1..=6).collect::<Vec<_>>(),
        "{:?}",
        out.failures
    );
    assert_eq!(out.result.as_deref(), Some("done 6"));
    assert_eq!(out.resumes.len(), 0, "the client saw one unbroken stream");
    assert_eq!(
        pod.metric("tether_upstream_resumes_total").await.unwrap(),
        1.0
    );
    let stats = pod.stats().await.unwrap();
    assert_eq!(
        stats["unauthenticated"], 0,
        "the resume carried the fresh token: {stats}"
    );
    assert_eq!(stats["calls"]["long-poll"], 1, "{stats}");
}

/// The authorization lifetime a token-validating intermediary keeps to: a 2026-07-28
/// `subscriptions/listen` stream ends when the JWT that opened it expires, with its completion
/// result; and a resume presenting an expired token is judged by the MCP server again (its
/// 401), however recently it accepted that token, while a fresh token resumes the events.
#[tokio::test]
async fn a_listen_stream_ends_when_its_token_expires_and_an_expired_token_resumes_nothing() {
    let issuer = Issuer::new().unwrap();
    let pod = authenticated_pod(&issuer).await;
    let client = pod.client();
    client.set_authorization(Some(alices_token(&issuer, Duration::from_secs(3))));
    let started = std::time::Instant::now();
    let session = client.initialize("2025-11-25").await.unwrap();
    let (_, cursor) = first_cursor(&client, &session, "before-expiry").await;
    let listen = tether_tests::modern::request(
        &client,
        &pod.mcp_url,
        9,
        "subscriptions/listen",
        None,
        json!({"notifications": {"toolsListChanged": true}}),
    );
    let (status, completed) = tokio::time::timeout(Duration::from_secs(8), listen)
        .await
        .expect("the listen stream ended within 8 s")
        .unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(1), "{waited:?}");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(completed["id"], 9, "{completed}");
    assert_eq!(completed["result"]["resultType"], "complete", "{completed}");
    assert_eq!(
        pod.metric("tether_streams_credential_expired_total")
            .await
            .unwrap(),
        1.0
    );
    // The expired token resumes nothing: the MCP server's 401 with its challenge (once a
    // second has passed: the server counts `exp` in whole seconds).
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let resumed = client.get(&session, Some(&cursor)).await.unwrap();
    assert_eq!(resumed.status(), StatusCode::UNAUTHORIZED);
    assert!(header_str(&resumed, "www-authenticate").is_some());
    // A fresh token resumes the call's events.
    client.set_authorization(Some(alices_token(&issuer, HOUR)));
    let resumed = client.get(&session, Some(&cursor)).await.unwrap();
    assert_eq!(resumed.status(), StatusCode::OK);
    let rest = messages(resumed, Duration::from_secs(10)).await.unwrap();
    assert!(
        rest.last().is_some_and(|m| m["result"].is_object()),
        "{rest:?}"
    );
}

//! A pod lost without warning under load, with `spec.session.replication: Sessions`
//! (`docs/design/replication.md`; `make demo-fault` runs the same at 1,000 sessions with the
//! baseline beside): 3 pods, 100 sessions calling `slow`, auth on, 2026-07-28 clients beside.
//!
//! - *Sidecar crash*: one pod's sidecar killed (SIGKILL) and started again at once with the
//!   same UID and address; its sessions are claimed back from their replica pods.
//! - *Pod loss*: one pod's sidecar and MCP server killed, the pod out of membership 5 s later,
//!   a replacement started; its sessions are promoted at their replica pods.
//!
//! Either way no client sees a 404 and no session is lost; the requests that were running on
//! the lost sidecar end with `holder_lost` (announced, never silent), and none runs twice.
//!
//! - *Write-ahead*: a call dispatched a few milliseconds before its holder is lost — well inside
//!   the replication interval — is not run again by its client's retry at the pod that promotes
//!   the session (`docs/design/replication.md#write-ahead`).
//! - *Replica pod lost*: the holder places the session at its next runner-up, so a later loss
//!   of the holder loses nothing either.
//! - *Crash during a drain*: a pod killed while it hands its sessions off loses none of them;
//!   the calls it was still relaying end with an explicit error or their answer.
//! - *A retry of a request the holder forgot* (beyond its retry window) gets `result_expired`
//!   from the tombstone the replica carries, never a second run.
//! - *Two losses at once*: a session whose holder and replica pod are both lost ends in 404,
//!   as documented (`docs/design/replication.md#what-can-still-be-lost`).

use std::net::Ipv4Addr;
use std::time::Duration;

use http::StatusCode;
use tether_tests::call::{CallPlan, Tracked, slow_body};
use tether_tests::client::{McpClient, Session, messages};
use tether_tests::load;
use tether_tests::pod::PodSpec;
use tether_tests::rollout::fault::{self, Fault, FaultConfig, FaultReport};
use tether_tests::scenario::Scenario;

/// Runs `fault` at 100 sessions and prints its table and first failures.
async fn run(fault: Fault) -> FaultReport {
    let report = fault::run(&FaultConfig::scaled(fault, 100)).await.unwrap();
    println!("{}", fault::table(&[&report]));
    for failure in report.run.load.failures.iter().take(10) {
        println!("{} failure: {failure}", report.run.label);
    }
    report
}

/// What replication promises whatever the fault: the lost pod held sessions, and none of them
/// ended in a 404 or a new session.
fn assert_no_session_lost(report: &FaultReport) {
    let l = &report.run.load;
    assert!(report.lost_pod_sessions > 0, "the lost pod held sessions");
    assert_eq!(l.not_found, 0, "client-visible 404s");
    assert_eq!(report.run.sessions_lost, 0, "sessions lost");
    assert_eq!(l.executed_twice, 0, "tools executed twice");
    assert!(
        report.failover.is_some(),
        "a session of the lost pod was served again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_sidecar_takes_its_sessions_back_from_their_replicas() {
    let _heavy = load::heavy().await;
    let report = run(Fault::SidecarCrash).await;
    assert_no_session_lost(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_pod_s_sessions_are_promoted_at_their_replica_pods() {
    let _heavy = load::heavy().await;
    let report = run(Fault::PodLoss).await;
    assert_no_session_lost(&report);
    assert!(
        report.unavailable > 0,
        "503 + Retry-After while membership still listed the lost pod"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dispatched_just_before_its_holder_is_lost_never_runs_twice() {
    let mut s = Scenario::start(3, PodSpec::default()).await;
    let session = s.on_a("2025-11-25").await;
    // The session's replica is placed (so only the call's record can be missing).
    let placed = s
        .cluster
        .wait_for_metric_sum("tether_replicas", Duration::from_secs(5), |n| n >= 1.0)
        .await;
    s.check(placed);
    let call = slow_body(2, "just-before", 50, 100);
    // Its answer's head: the MCP server has the request (it answers as it starts the tool).
    let running = s.via_a().post(Some(&session), &call, &[]).await.unwrap();
    assert_eq!(running.status(), http::StatusCode::OK);
    // Pod A is lost at once, without warning, then leaves the membership.
    let a = s.cluster.take(s.a);
    let mut a = s.check(a.ok_or("pod A"));
    s.check(a.kill_sidecar().await);
    s.check(a.kill_server().await);
    let left = s.cluster.set_state(s.a, None).await;
    s.check(left);

    // The client's retry of the same request reaches the pod that promotes the session: the
    // record answers it with `holder_lost`, the tool does not run again.
    let resp = s.via_rest().post(Some(&session), &call, &[]).await.unwrap();
    assert_eq!(resp.status(), http::StatusCode::OK, "the retry is served");
    let answer = s.check(messages(resp, Duration::from_secs(5)).await);
    let reasons: Vec<&str> = answer
        .iter()
        .filter_map(|m| m["error"]["data"]["reason"].as_str())
        .collect();
    assert_eq!(
        reasons,
        ["holder_lost"],
        "its last message: {:?}",
        answer.last()
    );
    assert_eq!(s.executions().await, 0, "the retry ran nowhere");
}

/// Waits until the session's replica is kept somewhere, and returns the pod that keeps it.
async fn replica_pod(s: &Scenario) -> Ipv4Addr {
    let placed = s
        .cluster
        .wait_for_metric_sum("tether_replicas", Duration::from_secs(5), |n| n >= 1.0)
        .await;
    assert!(s.check(placed) >= 1.0, "the session's replica is placed");
    for &ip in &s.rest {
        let pod = s.cluster.pod(ip).expect("the pod runs");
        if s.check(pod.metric("tether_replicas").await) >= 1.0 {
            return ip;
        }
    }
    panic!("no pod but A keeps the replica\n{}", s.cluster.logs());
}

/// Kills the sidecar and the MCP server of the pod on `ip`, without warning, and takes it out
/// of the membership.
async fn lose(s: &mut Scenario, ip: Ipv4Addr) {
    let pod = s.cluster.take(ip);
    let mut pod = s.check(pod.ok_or("the pod runs"));
    s.check(pod.kill_sidecar().await);
    s.check(pod.kill_server().await);
    let left = s.cluster.set_state(ip, None).await;
    s.check(left);
}

/// A `slow` call in `session` via `client` (which honours `Retry-After`: a session in the middle
/// of a move is answered 503), read to its end: its messages.
async fn call(
    s: &Scenario,
    client: &McpClient,
    session: &Session,
    id: u64,
) -> Vec<serde_json::Value> {
    let body = slow_body(id, &format!("after-{id}"), 2, 10);
    let resp = s.check(client.post(Some(session), &body, &[]).await);
    assert_eq!(resp.status(), StatusCode::OK, "request {id} is served");
    s.check(messages(resp, Duration::from_secs(5)).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_replica_pod_s_sessions_are_replicated_again_at_the_next_runner_up() {
    let mut s = Scenario::start(3, PodSpec::default()).await;
    let session = s.on_a("2025-11-25").await;
    s.completed_on_a(&session, 1, "before", 2).await;
    let b = replica_pod(&s).await;
    let c = *s.rest.iter().find(|&&ip| ip != b).expect("a third pod");

    lose(&mut s, b).await;
    // A places the session at C, its runner-up now.
    let placed = s
        .cluster
        .wait_for_metric_sum("tether_replicas", Duration::from_secs(5), |n| n >= 1.0)
        .await;
    assert!(s.check(placed) >= 1.0, "the replica is placed again");
    let at_c = s.check(
        s.cluster
            .pod(c)
            .expect("C runs")
            .metric("tether_replicas")
            .await,
    );
    assert_eq!(at_c, 1.0, "C keeps it");

    // A is lost too: the session goes on at C.
    let a = s.a;
    lose(&mut s, a).await;
    let client = s.cluster.client_of(&[c]).honouring_retry_after();
    let answer = call(&s, &client, &session, 2).await;
    let last = answer.last().expect("an answer");
    assert_eq!(last["id"], 2, "{last}");
    assert!(last.get("result").is_some(), "the call ran at C: {last}");
    assert_eq!(s.executions().await, 1, "once, at C");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_request_its_holder_forgot_is_not_run_again_where_the_session_is_promoted() {
    let spec = PodSpec {
        sidecar_args: vec!["--retry-window".into(), "2".into()],
        ..PodSpec::default()
    };
    let mut s = Scenario::start(3, spec).await;
    let session = s.on_a("2025-11-25").await;
    for id in 1..=6 {
        s.completed_on_a(&session, id, &format!("early-{id}"), 1)
            .await;
    }
    // The replica pod keeps the session as A last had it: request 1 beyond its window.
    replica_pod(&s).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let a = s.a;
    lose(&mut s, a).await;

    let retry = slow_body(1, "early-1", 1, 10);
    let client = s.via_rest().honouring_retry_after();
    let resp = s.check(client.post(Some(&session), &retry, &[]).await);
    assert_eq!(resp.status(), StatusCode::OK, "the session is served");
    let answer = s.check(messages(resp, Duration::from_secs(5)).await);
    let reasons: Vec<&str> = answer
        .iter()
        .filter_map(|m| m["error"]["data"]["reason"].as_str())
        .collect();
    assert_eq!(reasons, ["result_expired"], "{answer:?}");
    assert_eq!(s.executions().await, 0, "the retry ran nowhere");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_holder_and_replica_pod_are_both_lost_ends_in_404() {
    let mut s = Scenario::start(3, PodSpec::default()).await;
    let session = s.on_a("2025-11-25").await;
    let b = replica_pod(&s).await;
    let c = *s.rest.iter().find(|&&ip| ip != b).expect("a third pod");

    let a = s.a;
    lose(&mut s, a).await;
    lose(&mut s, b).await;
    let body = slow_body(2, "after", 2, 10);
    let (status, text) = s.check(
        s.cluster
            .client_of(&[c])
            .post_text(Some(&session), &body)
            .await,
    );
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert!(text.contains("session_not_found"), "{text}");
    let c_pod = s.cluster.pod(c).expect("C runs");
    let no_holder = s.check(
        c_pod
            .metric("tether_not_found_total{reason=\"no_holder\"}")
            .await,
    );
    assert_eq!(no_holder, 1.0, "C had no pod left to ask");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_crashes_as_its_drain_begins_loses_no_session() {
    crash_during_drain(Stage::Begun).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_crashes_while_it_relays_the_calls_it_handed_off_loses_no_session() {
    crash_during_drain(Stage::Relaying).await;
}

/// Where in its drain A is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// At once: its sessions are still mostly its own (promoted at their replica pods).
    Begun,
    /// Once every session was handed off: A still relays the calls that were running.
    Relaying,
}

impl Stage {
    /// The explicit errors the calls running on A may end with: promoted sessions' calls end
    /// `holder_lost`, handed-off ones' `handoff_interrupted` (as A is lost at once, its drain
    /// may still have handed some off).
    fn announced(self) -> &'static [&'static str] {
        match self {
            Self::Begun => &["holder_lost", "handoff_interrupted"],
            Self::Relaying => &["handoff_interrupted"],
        }
    }
}

/// 100 sessions on A, 4 of them with a call running; A drains and is lost at `stage`. Every
/// session goes on elsewhere; every running call ends with its answer or an explicit error.
async fn crash_during_drain(stage: Stage) {
    const SESSIONS: usize = 100;
    const RUNNING: usize = 4;
    let mut s = Scenario::start(3, PodSpec::default()).await;
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(s.on_a("2025-11-25").await);
    }
    let placed = s
        .cluster
        .wait_for_metric_sum("tether_replicas", Duration::from_secs(5), |n| {
            n >= SESSIONS as f64
        })
        .await;
    assert!(
        s.check(placed) >= SESSIONS as f64,
        "every replica is placed"
    );
    // Calls that run for 8 s: well past the drain and the loss.
    let mut running = Vec::new();
    for (i, session) in sessions.iter().take(RUNNING).enumerate() {
        let plan = CallPlan::steady(40, 200);
        let id = 10 + i as u64;
        let posted = Tracked::post(&s.via_a(), session, id, &format!("running-{i}"), &plan).await;
        let (mut call, mut events) = s.check(posted);
        call.take_messages(&mut events, 2).await;
        running.push(call);
    }

    let drain = s.drain_a().await;
    if stage == Stage::Relaying {
        s.wait_moved(SESSIONS as f64).await;
    }
    drain.abort();
    let moved = s.received().await;
    println!("{stage:?}: {moved} of {SESSIONS} sessions handed off when A was lost");
    let a = s.a;
    lose(&mut s, a).await;

    let client = s.via_rest().honouring_retry_after();
    for (i, session) in sessions.iter().enumerate() {
        let answer = call(&s, &client, session, 100 + i as u64).await;
        let last = answer.last().expect("an answer");
        assert!(last.get("result").is_some(), "session {i} goes on: {last}");
    }
    for (i, call) in running.iter_mut().enumerate() {
        let resumed = call
            .reconnect(&client, &sessions[i], &[StatusCode::SERVICE_UNAVAILABLE])
            .await;
        let events = s.check(resumed);
        let events = events.unwrap_or_else(|| panic!("call {i}: its resume answered 404"));
        call.finish(events).await;
        let out = &call.out;
        println!(
            "call {i}: error {:?} after {} progress events",
            out.announced,
            out.progress.len()
        );
        let reason = out.announced.as_deref();
        assert!(
            reason.is_some_and(|r| stage.announced().contains(&r)),
            "call {i} ended with {reason:?}, not one of {:?}: {:?}",
            stage.announced(),
            out.failures
        );
    }
    // The running calls ran on A alone: no pod runs them again. (A's own count went with it.)
    for pod in &s.cluster.pods {
        let stats = s.check(pod.stats().await);
        let again: Vec<&String> = stats["calls"]
            .as_object()
            .into_iter()
            .flat_map(|calls| calls.keys())
            .filter(|id| id.starts_with("running-"))
            .collect();
        assert!(again.is_empty(), "{} ran {again:?} again", pod.ip);
    }
    assert_eq!(
        s.check(s.cluster.executed_twice().await),
        0,
        "tools executed twice"
    );
}

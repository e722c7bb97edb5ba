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

use std::time::Duration;

use tether_tests::call::slow_body;
use tether_tests::client::messages;
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

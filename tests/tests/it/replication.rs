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
//! the lost sidecar end with `holder_lost` (announced, never silent).

use tether_tests::load;
use tether_tests::rollout::fault::{self, Fault, FaultConfig, FaultReport};

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

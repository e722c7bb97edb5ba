//! The rolling upgrade in CI (`docs/guide/rolling-upgrade.md`; `make demo` runs a larger one):
//! 3 pods, ≥ 200 sessions, ≥ 10,000 events, every pod replaced one at a time.
//!
//! - With handoff (migration `Replay`): no client-visible 404, no lost, duplicated or foreign
//!   event, no tool executed twice. The MCP servers require bearer tokens, which the clients
//!   refresh during the rollout (before expiry, or after a 401): no request reaches an MCP
//!   server without credentials (every rebuild carried its clients'), and every other user's
//!   request in a session is refused with 404. The baseline (`--handoff false`) runs the same rollout and
//!   prints beside it; it must complete and show the 404s of the sessions its stopped pods
//!   took with them, none before the first pod stopped.
//! - With migration `Pin`: no session sees its `counter` restart (its sessions never move).
//!
//! Each run holds [`load::heavy`]: no other load runs beside it (they share the machine's cores).

use tether_tests::load;
use tether_tests::rollout::{self, RolloutConfig, RolloutReport};

/// The figures every run must reach, whatever it shows about 404s.
fn assert_complete(report: &RolloutReport, sessions: u64, events: u64) {
    let r = &report.load;
    assert_eq!(report.drains.len(), 3, "every pod replaced");
    assert!(
        r.sessions >= sessions,
        "{}: {} sessions",
        report.label,
        r.sessions
    );
    assert!(r.events >= events, "{}: {} events", report.label, r.events);
    assert!(r.resumes > 0, "{}: clients resumed", report.label);
    assert!(report.peak_rss_bytes > 0, "{}: RSS read", report.label);
    let harness: Vec<&String> = r
        .failures
        .iter()
        .filter(|f| f.starts_with("harness:"))
        .collect();
    assert!(harness.is_empty(), "{}: {harness:?}", report.label);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_with_handoff_is_invisible_to_clients_unlike_the_baseline() {
    let _heavy = load::heavy().await;
    let cfg = RolloutConfig::default();
    let handoff = rollout::run(&cfg).await.unwrap();
    let baseline = rollout::run(&cfg.baseline()).await.unwrap();
    println!("{}", rollout::table(&[&handoff, &baseline]));
    for report in [&handoff, &baseline] {
        for failure in report.load.failures.iter().take(10) {
            println!("{} failure: {failure}", report.label);
        }
    }

    assert_complete(&baseline, 200, 10_000);
    assert!(
        baseline.load.not_found > 0,
        "without handoff, the sessions of a stopped pod end in 404"
    );
    let (first_404, first_stop) = (baseline.first_not_found, baseline.first_stop);
    assert!(
        first_404.is_some_and(|t| Some(t) >= first_stop),
        "no 404 before the first old pod stopped: first 404 at {first_404:?}, first stop at {first_stop:?}"
    );

    assert_complete(&handoff, 200, 10_000);
    let r = &handoff.load;
    assert_eq!(r.not_found, 0, "client-visible 404s");
    assert_eq!(r.lost, 0, "lost events");
    assert_eq!(r.duplicated, 0, "duplicated events");
    assert_eq!(r.foreign, 0, "foreign-stream events");
    assert_eq!(r.executed_twice, 0, "tools executed twice");
    assert!(
        r.failures.is_empty(),
        "{:?}",
        &r.failures[..5.min(r.failures.len())]
    );
    let auth = &handoff.auth;
    assert!(auth.on, "the MCP servers required auth");
    assert_eq!(
        auth.upstream_missing_credentials, 0,
        "every request on a session's behalf carried its clients' credentials"
    );
    assert!(
        auth.refreshes.0 > 0 && auth.refreshes.1 > 0,
        "tokens refreshed before expiry and after a 401: {:?}",
        auth.refreshes
    );
    assert!(
        auth.upstream_unauthenticated > 0,
        "late refreshers met 401s"
    );
    assert!(auth.probes > 0, "other users tried sessions");
    assert_eq!(auth.probes_refused, auth.probes, "and got 404");
    assert!(
        handoff.sidecar.not_found.get("principal_mismatch") >= Some(&auth.probes),
        "{:?}",
        handoff.sidecar.not_found
    );
    assert!(handoff.is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_pin_no_session_sees_its_counter_restart() {
    let _heavy = load::heavy().await;
    let report = rollout::run(&RolloutConfig {
        sessions: 200,
        counter_fraction: 1.0,
        migration: "Pin".into(),
        ..RolloutConfig::default()
    })
    .await
    .unwrap();
    println!("{}", report.table());
    for failure in report.load.failures.iter().take(10) {
        println!("{} failure: {failure}", report.label);
    }
    assert_complete(&report, 200, 10_000);
    assert_eq!(report.counter_restarts, 0, "Pin never moves a session");
}

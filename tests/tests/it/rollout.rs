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
//! - A rotation of the endpoint's key during the rollout (`docs/design/peer-trust.md#rotation`):
//!   stage, promote and retire interleaved with the replacements, each written to every pod's
//!   Secret volume at a moment of its own; every step reported by every pod, new pods started
//!   with the ring of their moment, a session minted before the rotation still served after
//!   the promotion, the retire held back while sessions of the old key live; the same zeros.
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

/// Prints the first failures of `report`'s load, for reading a failed run.
fn print_failures(report: &RolloutReport) {
    for failure in report.load.failures.iter().take(10) {
        println!("{} failure: {failure}", report.label);
    }
}

/// Runs the rollout `cfg` and prints its table and first failures.
async fn run_printed(cfg: &RolloutConfig) -> RolloutReport {
    let report = rollout::run(cfg).await.unwrap();
    println!("{}", report.table());
    print_failures(&report);
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_with_handoff_is_invisible_to_clients_unlike_the_baseline() {
    let _heavy = load::heavy().await;
    let cfg = RolloutConfig::default();
    let handoff = rollout::run(&cfg).await.unwrap();
    let baseline = rollout::run(&cfg.baseline()).await.unwrap();
    println!("{}", rollout::table(&[&handoff, &baseline]));
    print_failures(&handoff);
    print_failures(&baseline);

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
    assert_invisible(&handoff);
    let auth = &handoff.auth;
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
}

/// What a rollout with handoff must show: nothing a client could notice, and no request on a
/// session's behalf without its clients' credentials.
fn assert_invisible(report: &RolloutReport) {
    let r = &report.load;
    assert_eq!(r.not_found, 0, "{}: client-visible 404s", report.label);
    assert_eq!(r.lost, 0, "{}: lost events", report.label);
    assert_eq!(r.duplicated, 0, "{}: duplicated events", report.label);
    assert_eq!(r.foreign, 0, "{}: foreign-stream events", report.label);
    assert_eq!(
        r.executed_twice, 0,
        "{}: tools executed twice",
        report.label
    );
    assert!(
        r.failures.is_empty(),
        "{}: {:?}",
        report.label,
        &r.failures[..5.min(r.failures.len())]
    );
    let auth = &report.auth;
    assert!(auth.on, "the MCP servers required auth");
    assert_eq!(
        auth.upstream_missing_credentials, 0,
        "every request on a session's behalf carried its clients' credentials"
    );
    let m = &report.modern;
    assert!(
        m.slow_calls == 0 || m.mrtr_across_pods > 0,
        "{}: multi round-trip retries entered another pod than their first round: {m:?}",
        report.label
    );
    assert!(
        m.listens_completed >= m.listens_reestablished,
        "{}: every listen stream a drain ended got its completion result: {m:?}",
        report.label
    );
    assert!(report.is_clean(), "{}: not clean", report.label);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_pin_no_session_sees_its_counter_restart() {
    let _heavy = load::heavy().await;
    let report = run_printed(&RolloutConfig {
        sessions: 200,
        counter_fraction: 1.0,
        migration: "Pin".into(),
        ..RolloutConfig::default()
    })
    .await;
    assert_complete(&report, 200, 10_000);
    assert_eq!(report.counter_restarts, 0, "Pin never moves a session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotation_during_a_rolling_upgrade_loses_nothing() {
    let _heavy = load::heavy().await;
    let cfg = RolloutConfig {
        rotate_key: true,
        ..RolloutConfig::default()
    };
    let report = run_printed(&cfg).await;
    let rotation = report.rotation.as_ref().expect("the key rotated");
    println!("{}", rotation.lines().join("\n"));
    assert_complete(&report, 200, 10_000);
    assert_invisible(&report);

    assert_ne!(rotation.old_key, rotation.new_key);
    // Stage and promote, each reported by every running pod.
    let steps: Vec<&str> = rotation.steps.iter().map(|s| s.name).collect();
    assert!(steps.starts_with(&["stage", "promote"]), "{steps:?}");
    for step in &rotation.steps {
        assert!(step.complete, "{}: {:?}", step.name, step.reports);
        assert_eq!(
            step.reports.len(),
            cfg.pods,
            "{}: every running pod reported",
            step.name
        );
    }
    // The replacement pods mounted the Secret of their moment: before the stage, staged, promoted.
    let joined: Vec<&str> = rotation.joined.iter().map(|(_, when, _)| *when).collect();
    assert_eq!(joined, ["none", "stage", "promote"]);
    assert_eq!(
        rotation.witness_key.as_ref(),
        Some(&rotation.old_key),
        "the witness session's id names the old key"
    );
    assert!(
        rotation
            .witness_checks
            .iter()
            .any(|(when, _, r)| *when == "promote" && r.is_ok()),
        "{:?}",
        rotation.witness_checks
    );
    assert!(
        rotation.witness_checks.iter().all(|(_, _, r)| r.is_ok()),
        "the session minted before the rotation is served from every pod: {:?}",
        rotation.witness_checks
    );
    assert_eq!(
        rotation.minted_after_promote.as_ref(),
        Some(&rotation.new_key),
        "sessions minted after the promotion name the new key"
    );
    // The load's sessions, minted with the old key, lived until the load ended: the retire
    // waited for them, the old key still in every pod's ring.
    let deferred = rotation
        .retire_deferred
        .as_ref()
        .expect("the retire waited for the sessions of the old key");
    let in_use = rollout::RotationReport::sessions_of(deferred, &rotation.old_key);
    assert!(
        in_use >= 200,
        "every pod counts the live sessions of the old key: {in_use} ({deferred:?})"
    );
    assert!(
        deferred
            .iter()
            .all(|(_, r)| r.previous.as_ref() == Some(&rotation.old_key)),
        "{deferred:?}"
    );
    // Once the load's sessions were deleted, the retire: every pod dropped the old key, and a
    // new session is served from every pod.
    assert!(rotation.failures.is_empty(), "{:#?}", rotation.failures);
    assert_eq!(steps, ["stage", "promote", "retire"]);
    assert_eq!(rotation.after_retire.len(), cfg.pods);
    assert!(
        rotation.after_retire.iter().all(|(_, r)| r.is_ok()),
        "{:?}",
        rotation.after_retire
    );
}

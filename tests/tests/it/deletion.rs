//! A client's `DELETE` racing a handoff (`docs/design/handoff.md`): a session the client ended
//! at its new holder while its old holder still forwards the tail of a running call stays
//! ended — the old holder does not take it for lost and push it to another pod, where it would
//! live on (served to its id, counted in `GET /keys`, so that the key that minted it could
//! never be retired, `docs/design/peer-trust.md#rotation`).

use std::time::{Duration, Instant};

use http::StatusCode;
use tether_tests::call::{CallPlan, Tracked};
use tether_tests::client::{McpClient, tools_list};
use tether_tests::pod::PodSpec;
use tether_tests::scenario::Scenario;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_deleted_at_its_new_holder_while_its_tail_is_forwarded_stays_deleted() {
    let mut sc = Scenario::start(3, PodSpec::default()).await;
    let session = sc.on_a("2025-06-18").await;
    // A call that runs for 4 s on A, read a little.
    let plan = CallPlan::steady(40, 100);
    let posted = Tracked::post(&sc.via_a(), &session, 2, "deleted-tail", &plan).await;
    let (mut call, mut events) = sc.check(posted);
    call.take_messages(&mut events, 2).await;

    // A drains: the session moves, A forwards the call's tail to the new holder. As soon as
    // the new holder acknowledged it, the client ends the session.
    let drain = sc.drain_a().await;
    sc.wait_moved(1.0).await;
    let deleted = sc.check(sc.via_rest().delete(&session).await);
    assert!(deleted.is_success(), "DELETE answered {deleted}");
    drop(events);

    // The drain ends; afterwards no pod serves the session or counts it.
    let _ = sc.check(drain.await);
    let settle = Instant::now() + Duration::from_secs(3);
    loop {
        let mut served = Vec::new();
        let mut counted = Vec::new();
        for pod in sc.cluster.pods.iter().filter(|p| p.ip != sc.a) {
            let status = McpClient::new(pod.mcp_url.clone())
                .post(Some(&session), &tools_list(9), &[])
                .await
                .map(|r| r.status());
            if !matches!(status, Ok(StatusCode::NOT_FOUND)) {
                served.push((pod.ip, status.map_err(|e| e.to_string())));
            }
            let keys = sc.check(pod.key_report().await);
            let sessions: u64 = keys.sessions.values().sum();
            if sessions > 0 {
                counted.push((pod.ip, sessions));
            }
        }
        if served.is_empty() && counted.is_empty() {
            break;
        }
        assert!(
            Instant::now() < settle,
            "the session the client deleted lives on: answered {served:?}, counted in GET /keys \
             {counted:?}\n{}",
            sc.cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

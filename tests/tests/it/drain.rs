//! The admin `/drain` endpoint (`docs/design/handoff.md`, "When a pod drains"): the pod stops
//! taking new sessions, requests in flight finish, the call returns when done or at
//! `spec.drain.timeout` (5 s in the test manifest).

use std::time::Duration;

use http::{Method, StatusCode};
use tether_tests::addr;
use tether_tests::call::{self, CallOutcome, CallPlan};
use tether_tests::client::Http;
use tether_tests::cluster::Cluster;
use tether_tests::pod::{Drained, Pod, PodSpec};
use tokio::task::JoinHandle;

/// A pod whose one session runs a `slow` call on `plan` (`call_id`), and `POST /drain` sent
/// 300 ms into the call: the pod, the call, the drain's answer.
async fn drain_during_a_call(
    call_id: &'static str,
    plan: CallPlan,
) -> (Pod, JoinHandle<tether_tests::Result<CallOutcome>>, Drained) {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let call = tokio::spawn(async move { call::slow(&client, &session, 2, call_id, &plan).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let drained = pod.drain(Method::POST).await.unwrap();
    (pod, call, drained)
}

#[tokio::test]
async fn drain_waits_for_the_call_in_flight_and_is_idempotent() {
    let (pod, call, drained) = drain_during_a_call("drain-1", CallPlan::steady(5, 200)).await;
    let Drained {
        status,
        body,
        elapsed: took,
    } = drained;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["drained"], true);
    assert_eq!(body["inFlight"], 0);
    assert!(
        took >= Duration::from_millis(600),
        "returned before the call ended: {took:?}"
    );
    let outcome = call.await.unwrap().unwrap();
    assert_eq!(outcome.lost(5), 0, "{:?}", outcome.failures);
    // Not ready any more; a second drain (GET, as a preStop httpGet) answers at once.
    let (ready, _) = Http::new()
        .get_text(&format!("{}/readyz", pod.admin_url))
        .await
        .unwrap();
    assert_eq!(ready, StatusCode::SERVICE_UNAVAILABLE);
    let Drained {
        status,
        elapsed: took,
        ..
    } = pod.drain(Method::GET).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(took < Duration::from_millis(500));
    assert!(
        pod.metric("tether_drain_seconds_count").await.unwrap() == 1.0,
        "one drain, observed once"
    );
}

#[tokio::test]
async fn drain_ends_at_the_deadline_and_says_what_is_still_running() {
    let (_pod, _call, drained) = drain_during_a_call("drain-2", CallPlan::steady(8, 1000)).await;
    let Drained {
        status,
        body,
        elapsed: took,
    } = drained;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["drained"], false);
    assert_eq!(body["inFlight"], 1);
    assert!(
        (Duration::from_secs(5)..Duration::from_secs(7)).contains(&took),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_drained_pod_places_new_sessions_on_its_peers_and_keeps_serving_its_own() {
    let ips: [_; 2] = addr::ips();
    let cluster = Cluster::start(&ips, PodSpec::default()).await.unwrap();
    let via_a = cluster.client_of(&ips[..1]);
    let mine = via_a.initialize("2025-06-18").await.unwrap();
    let status = cluster.pods[0].drain(Method::GET).await.unwrap().status;
    assert_eq!(status, StatusCode::OK);
    for _ in 0..10 {
        via_a.initialize("2025-06-18").await.unwrap();
    }
    let created = cluster
        .metric_each("tether_sessions_created_total")
        .await
        .unwrap();
    assert_eq!(created[0], 1.0, "no new session on the drained pod");
    assert_eq!(created[1], 10.0);
    let everywhere = cluster.client();
    let msgs = everywhere
        .call(&mine, 5, "echo", serde_json::json!({"text": "still here"}))
        .await
        .unwrap();
    assert!(msgs.iter().any(|m| m["result"].is_object()));
}

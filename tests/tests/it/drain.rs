//! The drain of one pod (`docs/design/handoff.md`, "When a pod drains"), started from inside the
//! pod by `tether-sidecar drain` on the drain socket: the pod stops taking new sessions, requests
//! in flight finish, the command returns when done or at `spec.drain.timeout` (5 s in the test
//! manifest). Nothing on the network can start one: the admin port answers `/drain` with 403 and
//! `/drained` only waits (`docs/design/architecture.md#lifecycle`).

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use futures::StreamExt;
use http::{Method, StatusCode};
use tether_tests::addr;
use tether_tests::call::{self, CallOutcome, CallPlan};
use tether_tests::client::{Http, body_text, messages};
use tether_tests::cluster::Cluster;
use tether_tests::pod::{Drained, Pod, PodSpec};
use tokio::task::JoinHandle;

/// A pod whose one session runs a `slow` call on `plan` (`call_id`), and `tether-sidecar drain`
/// run 300 ms into the call: the pod, the call, what the drain reported.
async fn drain_during_a_call(
    call_id: &'static str,
    plan: CallPlan,
) -> (Pod, JoinHandle<tether_tests::Result<CallOutcome>>, Drained) {
    let pod = Pod::start_default().await.unwrap();
    let client = pod.client();
    let session = client.initialize("2025-06-18").await.unwrap();
    let call = tokio::spawn(async move { call::slow(&client, &session, 2, call_id, &plan).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let drained = pod.drain().await.unwrap();
    (pod, call, drained)
}

#[tokio::test]
async fn drain_waits_for_the_call_in_flight_and_is_idempotent() {
    let (pod, call, drained) = drain_during_a_call("drain-1", CallPlan::steady(5, 200)).await;
    let Drained {
        done,
        body,
        elapsed: took,
    } = drained;
    assert!(done, "{body}");
    assert_eq!(body["drained"], true);
    assert_eq!(body["inFlight"], 0);
    assert!(
        took >= Duration::from_millis(600),
        "returned before the call ended: {took:?}"
    );
    let outcome = call.await.unwrap().unwrap();
    assert_eq!(outcome.lost(5), 0, "{:?}", outcome.failures);
    // Not ready any more; a second drain, and the MCP server's `/drained` wait, answer at once
    // with the same outcome.
    let (ready, _) = Http::new()
        .get_text(&format!("{}/readyz", pod.admin_url))
        .await
        .unwrap();
    assert_eq!(ready, StatusCode::SERVICE_UNAVAILABLE);
    let again = pod.drain().await.unwrap();
    assert!(again.done);
    assert_eq!(again.body, body, "every trigger reports the one drain");
    assert!(again.elapsed < Duration::from_millis(500));
    let (status, waited) = pod.wait_drained().await.unwrap();
    assert_eq!((status, &waited), (StatusCode::OK, &body));
    assert!(
        pod.metric("tether_drain_seconds_count").await.unwrap() == 1.0,
        "one drain, observed once"
    );
}

#[tokio::test]
async fn drain_ends_at_the_deadline_and_says_what_is_still_running() {
    let (_pod, _call, drained) = drain_during_a_call("drain-2", CallPlan::steady(8, 1000)).await;
    let Drained {
        done,
        body,
        elapsed: took,
    } = drained;
    assert!(!done, "exit code 1: {body}");
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
    assert!(cluster.pods[0].drain().await.unwrap().done);
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

/// A deleted pod's endpoint leaves the Service's routing (kube-proxy) a little after its drain
/// began, and until then new connections still reach it: its listeners stay open for
/// `spec.drain.shutdownDelay` after the drain began, serving such connections from the peers
/// its sessions moved to, and the sidecar stops once the delay has passed.
#[tokio::test]
async fn after_sigterm_the_listeners_serve_until_the_shutdown_delay_has_passed() {
    const DELAY: Duration = Duration::from_secs(3);
    let ips: [_; 2] = addr::ips();
    let spec = PodSpec {
        shutdown_delay: "3s".into(),
        ..PodSpec::default()
    };
    let mut cluster = Cluster::start(&ips, spec).await.unwrap();
    let via_a = cluster.client_of(&ips[..1]);
    let session = via_a.initialize("2025-06-18").await.unwrap();
    // The sidecar's preStop: the session moves to the peer; then the kubelet's SIGTERM.
    let began = std::time::Instant::now();
    let drained = cluster.pods[0].drain().await.unwrap();
    assert!(
        drained.done && drained.body["handedOff"] == 1,
        "{}",
        drained.body
    );
    let mut pod = cluster.pods.remove(0);
    let stop = tokio::spawn(async move {
        let status = pod
            .terminate_sidecar(Duration::from_secs(20))
            .await
            .unwrap();
        (status, began.elapsed(), pod)
    });
    // A connection kube-proxy still sent to the terminating pod: served, from the new holder,
    // with `Connection: close` so that the client's next request opens a connection to a live
    // pod rather than reusing one the sidecar drops when it stops.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let resp = via_a
        .post_call(
            &session,
            2,
            "echo",
            serde_json::json!({"text": "via a stale endpoint"}),
        )
        .await
        .unwrap();
    let connection = resp.headers().get(http::header::CONNECTION).cloned();
    assert_eq!(
        connection.as_ref().and_then(|v| v.to_str().ok()),
        Some("close"),
        "a draining pod's answer keeps the connection: {connection:?}"
    );
    let msgs = messages(resp, Duration::from_secs(10)).await.unwrap();
    assert!(msgs.iter().any(|m| m["result"].is_object()), "{msgs:?}");
    let (status, stopped_after, pod) = stop.await.unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        pod.logs()
    );
    assert!(
        stopped_after >= DELAY && stopped_after < DELAY + Duration::from_secs(4),
        "stopped {stopped_after:?} after the drain began; the delay is {DELAY:?}"
    );
}

#[tokio::test]
async fn the_network_cannot_drain_a_pod_and_drained_only_waits() {
    let pod = Pod::start_default().await.unwrap();
    let http = Http::new();
    let admin = |path: &str| format!("{}{path}", pod.admin_url);
    for method in [Method::GET, Method::POST] {
        let resp = http
            .send(method, &admin("/drain"), &[], None)
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    }
    // Waiters wait for a drain nobody starts and give up after `spec.drain.timeout` + 2 s,
    // still not draining.
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let http = http.clone();
            let url = admin("/drained");
            tokio::spawn(async move {
                let resp = http.send(Method::GET, &url, &[], None).await.unwrap();
                (resp.status(), body_text(resp).await.unwrap())
            })
        })
        .collect();
    for waiter in waiters {
        let (status, body) = waiter.await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"drained": false, "draining": false})
        );
    }
    let (ready, _) = http.get_text(&admin("/readyz")).await.unwrap();
    assert_eq!(ready, StatusCode::OK, "still in its Service");
    assert_eq!(
        pod.metric(r#"tether_admin_refused_total{reason="drain_not_local"}"#)
            .await
            .unwrap(),
        2.0
    );
    assert_eq!(pod.metric("tether_drain_seconds_count").await.unwrap(), 0.0);
    // Only the sidecar's own user may use the drain socket.
    let mode = std::fs::metadata(pod.drain_socket())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    // A waiter that arrives before the drain answers when it ends.
    let waiting = {
        let http = http.clone();
        let url = admin("/drained");
        tokio::spawn(async move {
            http.send(Method::GET, &url, &[], None)
                .await
                .unwrap()
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(pod.drain().await.unwrap().done);
    assert_eq!(waiting.await.unwrap(), StatusCode::OK);
}

#[tokio::test]
async fn strangers_waiting_on_drained_cannot_crowd_out_the_prestop_hook() {
    let pod = Pod::start_default().await.unwrap();
    let url = format!("{}/drained", pod.admin_url);
    let wait_from = |source: std::net::Ipv4Addr| {
        let http = Http::from_source(source.into());
        let url = url.clone();
        tokio::spawn(async move {
            let resp = http.send(Method::GET, &url, &[], None).await.unwrap();
            (resp.status(), body_text(resp).await.unwrap())
        })
    };
    // Three strangers in the namespace hold 6 idle waits each.
    let strangers: [_; 3] = addr::ips();
    let idle: Vec<_> = strangers
        .iter()
        .flat_map(|&stranger| (0..6).map(move |_| stranger))
        .map(wait_from)
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The MCP server container's preStop hook (the kubelet, from the node's address) waits too,
    // and learns the drain's outcome when it ends.
    let hook = wait_from(addr::next_ip());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(pod.drain().await.unwrap().done);
    let (status, body) = hook.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["drained"], true, "{body}");
    for waiter in idle {
        assert_eq!(waiter.await.unwrap().0, StatusCode::OK);
    }
}

#[tokio::test]
async fn a_drain_starts_no_push_after_its_deadline() {
    let ips: [_; 2] = addr::ips();
    let spec = PodSpec {
        drain_timeout: "200ms".into(),
        ..PodSpec::default()
    };
    let cluster = Cluster::start(&ips, spec).await.unwrap();
    let via_a = cluster.client_of(&ips[..1]);
    // Pushing this many, 32 at a time, takes well over a second: far past the deadline.
    let sessions = 1500;
    let started: Vec<_> = futures::stream::iter(0..sessions)
        .map(|_| via_a.initialize("2025-06-18"))
        .buffer_unordered(32)
        .collect()
        .await;
    assert!(started.iter().all(Result::is_ok));
    let Drained { body, .. } = cluster.pods[0].drain().await.unwrap();
    let count = |field: &str| body[field].as_u64().unwrap_or_else(|| panic!("{body}"));
    let (moved, stayed) = (count("handedOff"), count("notMoved"));
    assert_eq!(moved + stayed, sessions, "{body}");
    assert!(
        moved > 0 && stayed > 0,
        "the deadline fell amid the handoff: {body}"
    );
    let late = cluster.pods[0]
        .metric("tether_handoffs_failed_total{reason=\"deadline\"}")
        .await
        .unwrap();
    assert_eq!(late, stayed as f64, "every session left behind is counted");
    // The pushes under way at the deadline finish; no other starts.
    assert!(count("elapsedMs") < 1500, "{body}");
}

/// Adopted sessions follow their owner (`docs/design/handoff.md#adopted-sessions-follow-the-owner`)
/// only while no peer drains: a drain's pushes go first to the pods they would follow.
#[tokio::test]
async fn adopted_sessions_wait_to_follow_their_owner_while_a_peer_drains() {
    let ips: [_; 3] = addr::ips();
    let [a, b, e] = ips;
    let spec = PodSpec {
        sidecar_args: vec!["--rebalance-dwell".into(), "200ms".into()],
        ..PodSpec::default()
    };
    let mut cluster = Cluster::start(&ips, spec).await.unwrap();
    let via_a = cluster.client_of(&[a]);
    let sessions = 40;
    for _ in 0..sessions {
        via_a.initialize("2025-06-18").await.unwrap();
    }
    // E drains (in everyone's membership); A drains into B and leaves: B holds every session,
    // adopted, with its home gone.
    cluster.set_state(e, Some("draining")).await.unwrap();
    let Drained { body, .. } = cluster.pods[0].drain().await.unwrap();
    assert_eq!(body["handedOff"].as_u64(), Some(sessions), "{body}");
    cluster.set_state(a, None).await.unwrap();
    // C joins: about half the sessions now have C as their owner, but E still drains.
    cluster.add(addr::next_ip()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        sent_by(&cluster, b).await,
        0.0,
        "no session follows its owner while a peer drains"
    );
    // E leaves: the sessions whose owner is C follow it.
    cluster.set_state(e, None).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while sent_by(&cluster, b).await == 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "sessions follow their owner once no peer drains\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `tether_handoffs_sent_total` of the pod on `ip`.
async fn sent_by(cluster: &Cluster, ip: std::net::Ipv4Addr) -> f64 {
    let pod = cluster.pod(ip).unwrap();
    pod.metric("tether_handoffs_sent_total").await.unwrap()
}

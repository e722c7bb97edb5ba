//! Multi-pod routing (`docs/design/routing.md`): pods with static membership (`--peers-file`),
//! requests entering at random pods, forwarding between sidecars, joins, draining and removed
//! pods, membership disagreement, sessions followed to the pod that created them, one client IP
//! spreading its sessions.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};
use tether_tests::addr;
use tether_tests::client::{
    Events, Http, McpClient, Session, body_text, header_str, initialize_body, is_sse, tool_call,
    tools_list,
};
use tether_tests::cluster::{Cluster, Member};
use tether_tests::load::{self, LoadConfig};
use tether_tests::pod::PodSpec;

/// Sessions created per pod (`tether_sessions_created_total`).
async fn created(cluster: &Cluster) -> Vec<f64> {
    cluster
        .metric_each("tether_sessions_created_total")
        .await
        .unwrap()
}

/// Every 404 any pod answered for a session, by any reason.
async fn not_found(cluster: &Cluster) -> f64 {
    let mut sum = 0.0;
    for reason in [
        "forged",
        "unknown",
        "deleted",
        "expired",
        "upstream_gone",
        "no_holder",
        "hop_limit",
    ] {
        sum += cluster
            .metric_sum(&format!("tether_not_found_total{{reason=\"{reason}\"}}"))
            .await
            .unwrap();
    }
    sum
}

/// `tools/list` for `session` entering at `client`'s pod(s): the status.
async fn list_status(client: &McpClient, session: &Session) -> StatusCode {
    client
        .post(Some(session), &tools_list(7), &[])
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn a_1000_sessions_through_random_entry_pods_reach_their_holder_while_a_4th_pod_joins() {
    let _heavy = load::heavy().await;
    let ips: [Ipv4Addr; 3] = addr::ips();
    let mut cluster = Cluster::start(&ips, PodSpec::default()).await.unwrap();
    let client = cluster.client();
    let cfg = LoadConfig {
        sessions: 1000,
        calls_per_session: 1,
        count: 5,
        interval_ms: 5,
        cut_probability: 0.5,
        max_pause_ms: 20,
        concurrency: 100,
        ..LoadConfig::default()
    };
    let load = tokio::spawn({
        let cfg = cfg.clone();
        async move { load::run(&client, &cfg).await }
    });
    // The 4th pod joins while the load runs.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let joined_while_running = !load.is_finished();
    cluster.add(addr::next_ip()).await.unwrap();
    let report = load.await.unwrap();
    println!("{}", report.table());
    assert!(
        joined_while_running,
        "the load ended before the join; make it longer"
    );
    assert!(
        report.failures.is_empty(),
        "{} failures, first: {:?}\n{}",
        report.failures.len(),
        report.failures.first(),
        cluster.logs()
    );
    assert_eq!(report.sessions, 1000);
    assert_eq!((report.lost, report.duplicated, report.foreign), (0, 0, 0));
    assert!(
        report.resumes > 100,
        "resumes entered at random pods: {}",
        report.resumes
    );
    assert_eq!(not_found(&cluster).await, 0.0, "no unexpected 404 anywhere");
    assert_eq!(cluster.executed_twice().await.unwrap(), 0);
    // Placement: each original pod created about a third of the sessions (entry = home).
    let per_pod = created(&cluster).await;
    assert_eq!(per_pod.iter().sum::<f64>(), 1000.0, "{per_pod:?}");
    assert!(per_pod[..3].iter().all(|&n| n > 250.0), "{per_pod:?}");
    assert_eq!(
        per_pod[3], 0.0,
        "the new pod is not an entry of this client"
    );
    // About two thirds of the follow-ups entered at a pod that does not hold the session.
    let ok = cluster
        .metric_sum_settled("tether_forwards_total{kind=\"home\",outcome=\"ok\"}")
        .await
        .unwrap();
    println!("sessions created per pod {per_pod:?}; follow-ups forwarded to their home: {ok}");
    assert!(ok > 2000.0, "forwards to the home: {ok}");
    // Forwards go out on pooled HTTP/2 connections (`--peer-pool-size`, `--peer-max-streams`):
    // a new connection, with its TLS handshake, only for concurrency beyond a connection's
    // streams, never for a cut (over HTTP/1.1 every cut hop closed its connection: about one
    // forward in ten made a new one).
    let mut connects = [0.0; 2];
    for (n, reused) in connects.iter_mut().zip(["true", "false"]) {
        let sample = format!("tether_peer_connects_total{{reused=\"{reused}\"}}");
        *n = cluster.metric_sum(&sample).await.unwrap();
    }
    let [reused, new] = connects;
    println!("forwards on pooled connections: {reused}, on new ones: {new}");
    assert!(
        reused + new >= ok,
        "every forward is counted: {reused} + {new} < {ok}"
    );
    assert!(
        new * 20.0 < reused,
        "forwards share connections, cut ones too: {new} new vs {reused} reused"
    );
    for outcome in ["connect_error", "error"] {
        let bad = cluster
            .metric_sum(&format!(
                "tether_forwards_total{{kind=\"home\",outcome=\"{outcome}\"}}"
            ))
            .await
            .unwrap();
        assert_eq!(bad, 0.0, "{outcome}");
    }
    assert_eq!(
        cluster
            .metric_sum("tether_forward_hops_total{hop=\"2\"}")
            .await
            .unwrap(),
        0.0,
        "a live home is always one hop away"
    );
    // New sessions entering at the 4th pod are homed there; old and new sessions still route.
    let all = cluster.client();
    let mut sessions = Vec::new();
    for _ in 0..40 {
        sessions.push(all.initialize("2025-06-18").await.unwrap());
    }
    assert!(created(&cluster).await[3] > 0.0);
    for s in &sessions {
        assert_eq!(list_status(&all, s).await, StatusCode::OK);
    }
}

#[tokio::test]
async fn sse_through_a_hop_is_flushed_event_by_event() {
    let ips: [Ipv4Addr; 2] = addr::ips();
    let cluster = Cluster::start(&ips, PodSpec::default()).await.unwrap();
    let home = cluster.client_of(&ips[..1]);
    let other = cluster.client_of(&ips[1..]);
    let session = home.initialize("2025-11-25").await.unwrap();
    let started = Instant::now();
    let body = tool_call(
        2,
        "slow",
        json!({"count": 3, "interval_ms": 400, "call_id": "flush-1"}),
        Some("flush-1"),
    );
    let resp = other.post(Some(&session), &body, &[]).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(is_sse(&resp));
    let mut events = Events::new(resp);
    let mut arrivals = Vec::new();
    while let Some(ev) = events.next_within(Duration::from_secs(5)).await {
        if ev.data.as_deref().is_some_and(|d| !d.is_empty()) {
            arrivals.push(started.elapsed());
        }
        if arrivals.len() == 4 {
            break;
        }
    }
    assert_eq!(arrivals.len(), 4, "3 progress events and the result");
    assert!(
        arrivals[0] < Duration::from_millis(900),
        "the first event is not held back until the end: {arrivals:?}"
    );
    assert!(arrivals[3] >= Duration::from_millis(1100), "{arrivals:?}");
    // Counted when the exchange is logged, just after the last byte.
    let pod = &cluster.pods[1];
    let sample = "tether_forwards_total{kind=\"home\",outcome=\"ok\"}";
    let forwarded = pod
        .wait_for_metric(sample, Duration::from_secs(2), |n| n >= 1.0)
        .await
        .unwrap();
    assert_eq!(forwarded, 1.0);
}

#[tokio::test]
async fn s05_a_forged_id_is_404_at_the_entry_and_forged_hop_headers_are_403() {
    let ips: [Ipv4Addr; 2] = addr::ips();
    let cluster = Cluster::start(&ips, PodSpec::default()).await.unwrap();
    let a = cluster.client_of(&ips[..1]);
    let real = cluster
        .client_of(&ips[1..])
        .initialize("2025-06-18")
        .await
        .unwrap();
    let forged = real.forged(30);
    assert_eq!(list_status(&a, &forged).await, StatusCode::NOT_FOUND);
    let pod_a = &cluster.pods[0];
    assert_eq!(
        pod_a
            .metric("tether_not_found_total{reason=\"forged\"}")
            .await
            .unwrap(),
        1.0
    );
    assert_eq!(
        pod_a
            .metric("tether_forward_hops_total{hop=\"1\"}")
            .await
            .unwrap(),
        0.0
    );
    // A client cannot pose as a peer.
    let resp = a
        .post(
            Some(&real),
            &tools_list(3),
            &[
                ("tether-hop", "2"),
                ("tether-visited", "x"),
                ("tether-hop-mac", "AAAAAAAAAAAAAAAAAAAAAA"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let body: Value = serde_json::from_str(&body_text(resp).await.unwrap()).unwrap();
    assert_eq!(body["error"]["data"]["reason"], "forged_hop");
}

#[tokio::test]
async fn a_draining_pod_places_no_session_and_a_removed_pod_gets_no_traffic_within_1s() {
    let ips: [Ipv4Addr; 3] = addr::ips();
    // Without handoff: a running pod that is no longer in its own membership hands its sessions
    // to their owners at its next rebalance (within a second), and then A or B would hold them.
    // This test is about routing to a removed pod, whose sessions nobody else holds (no
    // replica either).
    let spec = PodSpec {
        replication: Some("None".into()),
        sidecar_args: vec!["--handoff".into(), "false".into()],
        ..PodSpec::default()
    };
    let mut cluster = Cluster::start(&ips, spec).await.unwrap();
    let c = cluster.client_of(&ips[2..]);
    let on_c: Vec<Session> = {
        let mut v = Vec::new();
        for _ in 0..10 {
            v.push(c.initialize("2025-06-18").await.unwrap());
        }
        v
    };
    assert_eq!(created(&cluster).await, vec![0.0, 0.0, 10.0]);
    cluster.set_state(ips[2], Some("draining")).await.unwrap();
    // Draining: new sessions entering at C are placed on A or B; C's own sessions still work.
    let mut placed = Vec::new();
    for _ in 0..30 {
        placed.push(c.initialize("2025-06-18").await.unwrap());
    }
    let per_pod = created(&cluster).await;
    assert_eq!(
        per_pod[2], 10.0,
        "no new session on the draining pod: {per_pod:?}"
    );
    assert_eq!(per_pod[0] + per_pod[1], 30.0, "{per_pod:?}");
    let everywhere = cluster.client();
    for s in on_c.iter().chain(&placed) {
        assert_eq!(list_status(&everywhere, s).await, StatusCode::OK);
    }
    // Removed: within one second no request reaches C any more.
    let written = Instant::now();
    cluster.set_state(ips[2], None).await.unwrap();
    let propagation = written.elapsed();
    assert!(propagation < Duration::from_secs(1), "took {propagation:?}");
    let requests_on_c = || async {
        let pod = &cluster.pods[2];
        pod.metric("tether_requests_total{method=\"POST\",era=\"sessionful\"}")
            .await
            .unwrap()
    };
    let before = requests_on_c().await;
    let a_and_b = cluster.client_of(&ips[..2]);
    for s in &on_c {
        // Home gone for A and B, and no other pod holds the session: 404, never 502.
        assert_eq!(
            list_status(&a_and_b, s).await,
            StatusCode::NOT_FOUND,
            "handed off: {}\n{}",
            cluster
                .metric_sum("tether_handoffs_sent_total")
                .await
                .unwrap(),
            cluster.logs()
        );
    }
    for s in &placed {
        assert_eq!(list_status(&a_and_b, s).await, StatusCode::OK);
    }
    for _ in 0..20 {
        a_and_b.initialize("2025-06-18").await.unwrap();
    }
    assert_eq!(
        requests_on_c().await,
        before,
        "C received traffic after its removal"
    );
    assert_eq!(
        cluster
            .metric_sum("tether_not_found_total{reason=\"no_holder\"}")
            .await
            .unwrap(),
        10.0
    );
}

#[tokio::test]
async fn fr01_the_session_created_on_a_pod_is_followed_there_also_after_a_join() {
    let ips: [Ipv4Addr; 2] = addr::ips();
    let mut cluster = Cluster::start(&ips, PodSpec::default()).await.unwrap();
    let client = cluster.client();
    // INIT (no session id) then INITD with the minted id, each entering at a random pod.
    let mut sessions = Vec::new();
    for _ in 0..200 {
        sessions.push(client.initialize("2025-06-18").await.unwrap());
    }
    cluster.add(addr::next_ip()).await.unwrap();
    let everywhere = cluster.client();
    for s in &sessions {
        assert_eq!(list_status(&everywhere, s).await, StatusCode::OK);
    }
    assert_eq!(not_found(&cluster).await, 0.0);
}

#[tokio::test]
async fn fr02_one_client_ip_spreads_sessions_and_health_checks_pin_nothing() {
    let ips: [Ipv4Addr; 2] = addr::ips();
    let cluster = Cluster::start(&ips, PodSpec::default()).await.unwrap();
    let client = cluster.client();
    let http = Http::new();
    let mut sessions = Vec::new();
    for _ in 0..100 {
        // Health checks hitting one pod between sessions.
        let (status, _) = http
            .get_text(&format!("{}/readyz", cluster.pods[0].admin_url))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        sessions.push(client.initialize("2025-06-18").await.unwrap());
    }
    let per_pod = created(&cluster).await;
    assert!(
        per_pod.iter().all(|&n| (25.0..=75.0).contains(&n)),
        "owner split {per_pod:?}"
    );
    for s in &sessions {
        assert_eq!(list_status(&client, s).await, StatusCode::OK);
    }
}

#[tokio::test]
async fn disagreeing_membership_reaches_the_holder_or_ends_in_404_never_loops() {
    let ips: [Ipv4Addr; 3] = addr::ips();
    // Routing alone: a pod whose view lost C would promote the replica of C's session it
    // keeps (the partition `replication.md` describes).
    let cluster = Cluster::start(&ips, PodSpec::default().unreplicated())
        .await
        .unwrap();
    let (a, b, c) = (ips[0], ips[1], ips[2]);
    let on_c = cluster.client_of(&[c]);
    let mut sessions = Vec::new();
    for _ in 0..20 {
        sessions.push(on_c.initialize("2025-06-18").await.unwrap());
    }
    let routable = |ip| Member::new(ip, "routable");
    // B has not heard of C yet; A has.
    cluster
        .write_peers_of(b, &[routable(a), routable(b)])
        .await
        .unwrap();
    let via_b = cluster.client_of(&[b]);
    for s in &sessions {
        // B → (walk) A → (home) C: two hops.
        assert_eq!(list_status(&via_b, s).await, StatusCode::OK);
    }
    let two_hops = cluster
        .metric_sum_settled("tether_forward_hops_total{hop=\"2\"}")
        .await
        .unwrap();
    assert_eq!(two_hops, 20.0);
    // Now A does not know C either: B → A → (nothing left) 404, never back to B.
    cluster
        .write_peers_of(a, &[routable(a), routable(b)])
        .await
        .unwrap();
    for s in &sessions {
        assert_eq!(list_status(&via_b, s).await, StatusCode::NOT_FOUND);
    }
    let forwards = cluster
        .metric_sum_settled("tether_forward_hops_total{hop=\"1\"}")
        .await
        .unwrap()
        + cluster
            .metric_sum_settled("tether_forward_hops_total{hop=\"2\"}")
            .await
            .unwrap();
    assert_eq!(
        forwards, 60.0,
        "40 first hops and 20 second hops, nothing more"
    );
    assert_eq!(
        cluster
            .metric_sum("tether_forward_hops_total{hop=\"3\"}")
            .await
            .unwrap(),
        0.0
    );
}

#[tokio::test]
async fn an_unreachable_home_ends_in_404_at_once_and_others_are_unaffected() {
    let ips: [Ipv4Addr; 3] = addr::ips();
    let mut cluster = Cluster::start(&ips, PodSpec::default()).await.unwrap();
    let on_c = cluster.client_of(&ips[2..]);
    let on_a = cluster.client_of(&ips[..1]);
    let lost = on_c.initialize("2025-06-18").await.unwrap();
    let kept = on_a.initialize("2025-06-18").await.unwrap();
    // C crashes but is still listed routable everywhere.
    cluster.pods[2].kill_sidecar().await.unwrap();
    let a_and_b = cluster.client_of(&ips[..2]);
    for _ in 0..10 {
        let started = Instant::now();
        assert_eq!(list_status(&a_and_b, &lost).await, StatusCode::NOT_FOUND);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(list_status(&a_and_b, &kept).await, StatusCode::OK);
    }
    // The refused connection marked C down: later requests skip it without trying.
    let refused = cluster.pods[0]
        .metric("tether_forwards_total{kind=\"home\",outcome=\"connect_error\"}")
        .await
        .unwrap()
        + cluster.pods[1]
            .metric("tether_forwards_total{kind=\"home\",outcome=\"connect_error\"}")
            .await
            .unwrap();
    assert!((1.0..=2.0).contains(&refused), "{refused}");
    // A request without a session still finds a routable pod.
    assert!(a_and_b.initialize("2025-06-18").await.is_ok());
}

#[tokio::test]
async fn a_frozen_home_answers_503_after_its_health_probes_fail_and_recovers() {
    let ips: [Ipv4Addr; 2] = addr::ips();
    let mut cluster = Cluster::start(&ips, PodSpec::default()).await.unwrap();
    let session = cluster
        .client_of(&ips[1..])
        .initialize("2025-06-18")
        .await
        .unwrap();
    let via_a = cluster.client_of(&ips[..1]);
    assert_eq!(list_status(&via_a, &session).await, StatusCode::OK);
    // B's sidecar stops (SIGSTOP): it still accepts connections but never answers.
    cluster.pods[1].signal_sidecar("STOP").await.unwrap();
    let down = "tether_peers_down{reason=\"unresponsive\"}";
    let found = cluster.pods[0]
        .wait_for_metric(down, Duration::from_secs(15), |n| n >= 1.0)
        .await
        .unwrap();
    assert!(found >= 1.0, "A never found B unresponsive");
    let started = Instant::now();
    let resp = tokio::time::timeout(
        Duration::from_secs(5),
        via_a.post(Some(&session), &tools_list(8), &[]),
    )
    .await
    .expect("a request for a frozen home's session must not hang")
    .unwrap();
    // The session may survive the stall: retry later, not 404 (which would drop it).
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header_str(&resp, "retry-after").as_deref(), Some("1"));
    assert!(started.elapsed() < Duration::from_secs(1));
    // New sessions are unaffected; B's sessions answer again once it resumes.
    assert!(via_a.initialize("2025-06-18").await.is_ok());
    cluster.pods[1].signal_sidecar("CONT").await.unwrap();
    let still = cluster.pods[0]
        .wait_for_metric(down, Duration::from_secs(15), |n| n == 0.0)
        .await
        .unwrap();
    assert_eq!(still, 0.0, "A never found B back");
    assert_eq!(list_status(&via_a, &session).await, StatusCode::OK);
}

#[tokio::test]
async fn fr15_an_initialize_with_a_stale_session_id_starts_a_new_session() {
    let ips: [Ipv4Addr; 2] = addr::ips();
    let mut cluster = Cluster::start(&ips, PodSpec::default()).await.unwrap();
    let stale = cluster
        .client_of(&ips[1..])
        .initialize("2025-06-18")
        .await
        .unwrap();
    cluster.pods[1].kill_sidecar().await.unwrap();
    let via_a = cluster.client_of(&ips[..1]);
    let init = initialize_body(1, "2025-06-18");
    for id in [stale.id.as_str(), "garbage!"] {
        let resp = via_a
            .post(None, &init, &[("mcp-session-id", id)])
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{id}");
        let fresh = header_str(&resp, "mcp-session-id").unwrap();
        assert_ne!(fresh, stale.id);
    }
    // Any other request for the stale id is still the 404 of a lost session.
    assert_eq!(list_status(&via_a, &stale).await, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn dead_peers_never_turn_a_lost_or_new_session_into_a_5xx() {
    let ips: [Ipv4Addr; 2] = addr::ips();
    let mut cluster = Cluster::start(&ips, PodSpec::default()).await.unwrap();
    let lost = cluster
        .client_of(&ips[1..])
        .initialize("2025-06-18")
        .await
        .unwrap();
    cluster.pods[1].kill_sidecar().await.unwrap();
    // A drains; its file lists B (dead) and twenty routable peers where nothing listens.
    let mut members = vec![Member::new(ips[0], "draining")];
    members.push(Member::new(ips[1], "routable"));
    members.extend((0..20).map(|_| Member::new(addr::next_ip(), "routable")));
    cluster.write_peers_of(ips[0], &members).await.unwrap();
    let via_a = cluster.client_of(&ips[..1]);
    for _ in 0..3 {
        let started = Instant::now();
        assert_eq!(list_status(&via_a, &lost).await, StatusCode::NOT_FOUND);
        assert!(started.elapsed() < Duration::from_secs(2));
        // Every routable peer is dead: the draining pod serves the new session itself.
        let before = cluster.pods[0]
            .metric("tether_sessions_created_total")
            .await
            .unwrap();
        let fresh = via_a.initialize("2025-06-18").await.unwrap();
        assert_eq!(list_status(&via_a, &fresh).await, StatusCode::OK);
        let after = cluster.pods[0]
            .metric("tether_sessions_created_total")
            .await
            .unwrap();
        assert_eq!(after, before + 1.0);
    }
}

//! Membership from the Kubernetes EndpointSlice watch
//! (`docs/design/routing.md#kubernetes-endpointslice-watch`): sidecars whose `--peer-service`
//! watch runs against a fake API server (`tether_tests::kube_api`) whose answers the test
//! controls, beside real pods, and who ask each other what they report of themselves.
//!
//! - A pod whose first LIST has not arrived does not know its peers: `/readyz` stays 503 and a
//!   request for a session homed on another pod gets 503 + `Retry-After`, never the 404 that
//!   would make the client drop its session; once the list arrives it is ready and forwards the
//!   request to the session's home (`docs/design/routing.md#when-membership-is-not-known-to-be-current`).
//! - Only pods of the endpoint are peers: a Ready pod that shares the Deployment's labels but
//!   not the injection's is no endpoint of the peer Service and is never contacted, even one
//!   whose sidecar holds the key ring; a pod the Service lists whose sidecar cannot prove it
//!   holds the key ring is asked, never trusted: it never becomes routable nor gets a handoff.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::json;
use tether_crds::ENDPOINT_ANNOTATION;
use tether_tests::addr;
use tether_tests::client::{
    McpClient, Session, expect_error, header_str, messages, result_text, tool_call,
};
use tether_tests::kube_api::{FakeKube, PodObject};
use tether_tests::pod::{
    ADMIN_PORT, LISTEN_PORT, PEER_PORT, Pod, PodSpec, UPSTREAM_PORT, family_samples,
};

/// The namespace of the test endpoints.
const NAMESPACE: &str = "tether-it";
/// The labels every pod of the tests carries (the Deployment's `matchLabels`).
const LABELS: &[(&str, &str)] = &[("app", "mcp")];
/// The endpoint and its target Deployment, as `PodSpec::manifest` names them.
const ENDPOINT: &str = "test";
const DEPLOYMENT: &str = "test";
/// The endpoint's peer Service and its selector: the Deployment's labels and the injection's.
const SERVICE: &str = "test-peers";
const SERVICE_SELECTOR: &[(&str, &str)] = &[("app", "mcp"), (ENDPOINT_ANNOTATION, ENDPOINT)];
/// The protocol version of the tests' sessions.
const VERSION: &str = "2025-06-18";
/// How long a membership change may take to reach a sidecar through its watch.
const WATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Every 404 the pod answered for a session, by any reason.
async fn not_found(pod: &Pod) -> f64 {
    family_samples(&pod.metrics().await.unwrap(), "tether_not_found_total")
        .map(|(_, v)| v)
        .sum()
}

/// The answer to `echo` with `text` in `session`, entering at `client`.
async fn echo(
    client: &McpClient,
    session: &Session,
    id: u64,
    text: &str,
) -> hyper::Response<hyper::body::Incoming> {
    client
        .post(
            Some(session),
            &tool_call(id, "echo", json!({ "text": text }), None),
            &[],
        )
        .await
        .unwrap()
}

/// Checks that `echo` with `text` in `session` entering at `client` is answered with the text.
async fn echo_answered(
    client: &McpClient,
    session: &Session,
    id: u64,
    text: &str,
) -> Result<(), String> {
    let resp = echo(client, session, id, text).await;
    if resp.status() != StatusCode::OK {
        let status = resp.status();
        let body = tether_tests::client::body_text(resp)
            .await
            .unwrap_or_default();
        return Err(format!("echo answered {status}: {body:.300}"));
    }
    let answer = messages(resp, Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?;
    match answer.last().and_then(result_text) {
        Some(t) if t == text => Ok(()),
        other => Err(format!("echo answered {other:?}: {answer:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_membership_answers_late_is_not_ready_and_sends_no_404() {
    let api = FakeKube::start(NAMESPACE, SERVICE, SERVICE_SELECTOR)
        .await
        .unwrap();
    let [a, b] = addr::ips();
    // A starts: not Ready yet (its readiness probe fails until it is). B runs, Ready.
    let mut object_a = PodObject::of_endpoint(a, ENDPOINT, DEPLOYMENT, "r1", LABELS);
    object_a.ready = false;
    api.apply(&object_a);
    api.apply(&PodObject::of_endpoint(
        b, ENDPOINT, DEPLOYMENT, "r1", LABELS,
    ));
    let spec = api.slice_watch(PodSpec::default());
    let pod_b = Pod::start_at(b, spec.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}\nAPI requests:\n{}", api.requests()));
    let session = pod_b.client().initialize(VERSION).await.unwrap();
    let lists_before = api.lists();

    // The API server does not answer A's LIST.
    api.hold_lists(true);
    let mut pod_a = Pod::launch_at(a, spec).unwrap();
    assert!(
        api.wait_for_lists(lists_before + 1, WATCH_TIMEOUT).await,
        "A's sidecar never sent its LIST; API requests:\n{}\n{}",
        api.requests(),
        pod_a.logs()
    );
    let client_a = pod_a.client();
    // Its listeners come up; it stays unready, and the session homed on B gets 503 +
    // Retry-After, never a 404.
    let listening = Instant::now();
    while pod_a.readyz().await.is_err() {
        assert!(
            listening.elapsed() < WATCH_TIMEOUT,
            "A's admin port never answered\n{}",
            pod_a.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = Instant::now();
    let mut refused = 0;
    while held.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            pod_a.readyz().await.unwrap(),
            StatusCode::SERVICE_UNAVAILABLE,
            "A is ready before its first list arrived\n{}",
            pod_a.logs()
        );
        let resp = echo(&client_a, &session, 10 + refused, "early").await;
        let retry_after = header_str(&resp, "retry-after");
        let status = resp.status();
        let refusal = expect_error(resp, StatusCode::SERVICE_UNAVAILABLE, "peer_unavailable").await;
        assert!(
            refusal.is_ok() && retry_after.is_some(),
            "a session homed on a pod A cannot see yet: {status}, Retry-After {retry_after:?}, {refusal:?}\n{}",
            pod_a.logs()
        );
        refused += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(not_found(&pod_a).await, 0.0, "A answered a 404");
    assert_eq!(
        api.lists(),
        lists_before + 1,
        "the LIST was held, not retried"
    );

    // The LIST arrives (A and B): A becomes ready and forwards the session to its home.
    api.hold_lists(false);
    pod_a.wait_ready().await.unwrap();
    assert_eq!(pod_a.readyz().await.unwrap(), StatusCode::OK);
    object_a.ready = true;
    api.apply(&object_a);
    let forwarded = "tether_forwards_total{kind=\"home\",outcome=\"ok\"}";
    let before = pod_a.metric(forwarded).await.unwrap();
    echo_answered(&client_a, &session, 100, "late")
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", pod_a.logs(), pod_b.logs()));
    // Counted once the forward has ended, which may be just after the client read the answer.
    let after = pod_a
        .wait_for_metric(forwarded, Duration::from_secs(2), |v| v > before)
        .await
        .unwrap();
    assert_eq!(
        after,
        before + 1.0,
        "A forwarded the request to B, the session's home"
    );
    assert_eq!(not_found(&pod_a).await, 0.0, "A answered a 404");
    assert_eq!(not_found(&pod_b).await, 0.0, "B answered a 404");
    println!(
        "A: {refused} requests refused with 503 + Retry-After while its LIST was held for {:.1} s; \
         served through B once it arrived",
        held.elapsed().as_secs_f64()
    );
}

/// Connections accepted on some ports of an address where a pod that is no peer runs.
struct Listeners {
    accepted: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Listeners {
    /// Accepts (and drops) every connection to `ip` on the sidecar's and the MCP server's ports.
    async fn on(ip: Ipv4Addr) -> Self {
        let accepted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for port in [LISTEN_PORT, ADMIN_PORT, PEER_PORT, UPSTREAM_PORT] {
            let listener = tokio::net::TcpListener::bind(SocketAddr::from((ip, port)))
                .await
                .unwrap();
            let accepted = Arc::clone(&accepted);
            tasks.push(tokio::spawn(async move {
                while listener.accept().await.is_ok() {
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        Self { accepted, tasks }
    }

    fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_pod_of_another_workload_never_becomes_a_handoff_target() {
    const SESSIONS: usize = 20;
    let api = FakeKube::start(NAMESPACE, SERVICE, SERVICE_SELECTOR)
        .await
        .unwrap();
    let [a, b, s, t] = addr::ips();
    // Two strangers, Ready. `s` shares the Deployment's labels but not the injection's, so the
    // peer Service does not list it; it runs a real sidecar (sharing the endpoint's key ring: it
    // would adopt whatever it is pushed). `t` carries the injection's label too (a copy of the
    // injected template), so the Service lists it, but no sidecar of the endpoint runs there:
    // it accepts connections and drops them, and never reports.
    let stranger = Pod::start_at(s, PodSpec::default()).await.unwrap();
    let listeners = Listeners::on(t).await;
    api.apply(&PodObject::of_endpoint(
        a, ENDPOINT, DEPLOYMENT, "r1", LABELS,
    ));
    api.apply(&PodObject::of_endpoint(
        b, ENDPOINT, DEPLOYMENT, "r1", LABELS,
    ));
    api.apply(&PodObject::stranger(s, "r2", LABELS));
    api.apply(&PodObject::of_endpoint(
        t,
        ENDPOINT,
        "test-canary",
        "r3",
        LABELS,
    ));

    let spec = api.slice_watch(PodSpec::default());
    let pod_a = Pod::start_at(a, spec.clone()).await.unwrap();
    let pod_b = Pod::start_at(b, spec).await.unwrap();
    let routable = "tether_ring_pods{state=\"routable\"}";
    let draining = "tether_ring_pods{state=\"draining\"}";
    for pod in [&pod_a, &pod_b] {
        let seen = pod
            .wait_for_metric(routable, WATCH_TIMEOUT, |n| n == 2.0)
            .await
            .unwrap();
        assert_eq!(
            seen,
            2.0,
            "{} sees {seen} routable pods: only A and B are the endpoint's\n{}",
            pod.ip,
            pod.logs()
        );
        assert_eq!(
            pod.metric(draining).await.unwrap(),
            1.0,
            "{}: t is listed, but unproven: draining\n{}",
            pod.ip,
            pod.logs()
        );
    }

    // Sessions on A, each with a completed call.
    let client_a = pod_a.client();
    let mut sessions = Vec::new();
    for i in 0..SESSIONS {
        let session = client_a.initialize(VERSION).await.unwrap();
        echo_answered(&client_a, &session, 2, &format!("before {i}"))
            .await
            .unwrap();
        sessions.push(session);
    }

    // A is deleted, as Kubernetes does: its endpoint terminating and not serving, then its
    // preStop hook drains it.
    let mut deleted = PodObject::of_endpoint(a, ENDPOINT, DEPLOYMENT, "r1", LABELS);
    deleted.terminating = true;
    deleted.ready = false;
    api.apply(&deleted);
    let drained = pod_a.drain().await.unwrap();
    println!("drain of A: {}", drained.body);
    assert!(drained.done, "{}\n{}", drained.body, pod_a.logs());
    assert_eq!(
        drained.body["handedOff"],
        json!(SESSIONS),
        "{}\n{}",
        drained.body,
        pod_a.logs()
    );
    assert_eq!(drained.body["notMoved"], 0, "{}", drained.body);

    let received = pod_b
        .wait_for_metric("tether_handoffs_received_total", WATCH_TIMEOUT, |n| {
            n >= SESSIONS as f64
        })
        .await
        .unwrap();
    assert_eq!(
        received,
        SESSIONS as f64,
        "every session handed to B\n{}",
        pod_b.logs()
    );
    assert_eq!(
        pod_a.metric("tether_handoffs_sent_total").await.unwrap(),
        SESSIONS as f64
    );
    let failed: f64 = family_samples(
        &pod_a.metrics().await.unwrap(),
        "tether_handoffs_failed_total",
    )
    .map(|(_, v)| v)
    .sum();
    assert_eq!(failed, 0.0, "no failed handoff\n{}", pod_a.logs());

    // Every session carries on at B.
    let client_b = pod_b.client();
    for (i, session) in sessions.iter().enumerate() {
        echo_answered(&client_b, session, 3, &format!("after {i}"))
            .await
            .unwrap_or_else(|e| panic!("session {i}: {e}\n{}", pod_b.logs()));
    }

    // The strangers got nothing: no session, no handoff, no peer message.
    let text = stranger.metrics().await.unwrap();
    let stranger_figures = [
        "tether_handoffs_received_total",
        "tether_sessions_created_total",
        "tether_sessions",
    ]
    .map(|name| (name, tether_tests::pod::sample_value(&text, name)));
    let auth_failures: f64 = family_samples(&text, "tether_peer_auth_failures_total")
        .map(|(_, v)| v)
        .sum();
    assert!(
        stranger_figures.iter().all(|(_, v)| *v == 0.0) && auth_failures == 0.0,
        "the stranger with a sidecar was sent something: {stranger_figures:?}, peer auth failures \
         {auth_failures}\n{}",
        stranger.logs()
    );
    assert!(
        listeners.accepted() > 0,
        "the sidecars asked t, which the peer Service lists, what it is"
    );
    assert_eq!(not_found(&pod_b).await, 0.0);
}

//! Peer trust (`docs/design/peer-trust.md`) around a handoff (`docs/design/handoff.md`): what
//! reaches a peer port without the endpoint's key ring costs no handoff anything; a captured
//! message sent again is refused wherever it goes; a stand-in that answers 200 to everything is
//! never handed a session; and a session keeps exactly one holder when an acknowledgement is
//! lost, when its new holder dies right after acknowledging it, or while the new holder's peer
//! port fails for a while.
//!
//! A fault between two sidecars is made by putting something of the harness at the address the
//! membership gives for the receiving pod ([`Cluster::reach_via`]): a [`Relay`] (that can refuse
//! connections for a while), a [`Tap`] (peer TLS off: it records each request, and can withhold
//! answers), or a [`StandIn`]: listed as a pod, but no sidecar.
//!
//! | fault | test |
//! |---|---|
//! | slow unauthenticated connections on the peer ports | [`unauthenticated_slow_connections_to_the_peer_port_delay_no_handoff`] |
//! | a stand-in answering 200 to everything | [`a_stand_in_answering_200_to_everything_never_receives_a_session`], [`a_stand_in_that_cannot_complete_tls_gets_nothing_but_probes`] |
//! | a captured push sent again | [`s05_replayed_and_misaddressed_pushes_are_refused`] |
//! | the answer to a push lost | [`a_lost_acknowledgement_leaves_one_holder`] |
//! | the new holder killed after its acknowledgement | [`a_new_holder_killed_right_after_its_ack_leaves_the_session_to_the_next`] |
//! | the new holder's peer port failing for 2 s | [`tail_forwarding_survives_two_seconds_of_peer_errors`] |

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};
use tether_tests::addr;
use tether_tests::call::{CallPlan, Tracked};
use tether_tests::client::{McpClient, Session, expect_lost_session, result_text, tool_call};
use tether_tests::cluster::{Cluster, Member};
use tether_tests::follow::Follow;
use tether_tests::load::Executions;
use tether_tests::pod::{Drained, LISTEN_PORT, PEER_PORT, Pod, PodSpec, family_samples};
use tether_tests::relay::Relay;
use tether_tests::scenario::Scenario;
use tether_tests::stand_in::StandIn;
use tether_tests::tap::Tap;
use tether_tests::trickle::Trickle;
use tokio::task::JoinHandle;

/// Path of session pushes.
const SESSIONS: &str = "/v2/sessions";
/// Path of the question whether a push was taken.
const HELD: &str = "/v2/held";
/// Path of tail messages.
const TAIL: &str = "/v2/tail";
/// Path of the sidecars' liveness probe of each other, on the MCP port.
const PROBE: &str = "/.tether/ping";
/// How long a test waits for something it expects of the pods.
const WAIT: Duration = Duration::from_secs(10);

/// The test endpoint with peer TLS off (plaintext peer ports, messages still MAC'd), so that
/// something of the harness can read or speak HTTP between the sidecars.
fn plaintext() -> PodSpec {
    PodSpec {
        peer_tls: false,
        ..PodSpec::default()
    }
}

/// The test endpoint with a drain timeout of `timeout` (a Kubernetes-style duration), which
/// also bounds how long a draining pod sends a tail again.
fn draining_for(spec: PodSpec, timeout: &str) -> PodSpec {
    PodSpec {
        drain_timeout: timeout.into(),
        ..spec
    }
}

/// `n` sessions initialized through `client`, negotiating 2025-06-18 and 2025-11-25 in turn
/// (older readers keep streaming from the old holder; newer ones are closed and resume).
async fn sessions_via(client: &McpClient, n: usize) -> Vec<Session> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let version = ["2025-06-18", "2025-11-25"][i % 2];
        out.push(client.initialize(version).await.unwrap());
    }
    out
}

/// How the tests' clients follow a stream: like EventSource, resuming after the last event read
/// once it ends or stalls 5 s (after the `retry` hint, 100 ms without one) and sending a
/// reconnect refused with 503 again after its `Retry-After`.
fn like_event_source() -> Follow {
    Follow {
        stall: Duration::from_secs(5),
        retry: Duration::from_millis(100),
        retry_on: vec![StatusCode::SERVICE_UNAVAILABLE],
        reconnects: 19,
    }
}

/// A `slow` call of `plan` posted through `post` (so it runs on the pod holding `session`),
/// then followed in a task through `follow` ([`like_event_source`]) to its answer; the task ends
/// with what the client saw.
async fn running_call(
    post: &McpClient,
    follow: McpClient,
    session: &Session,
    call_id: &str,
    plan: &CallPlan,
) -> JoinHandle<Tracked> {
    let (mut call, events) = Tracked::post(post, session, 2, call_id, plan)
        .await
        .unwrap();
    let session = session.clone();
    tokio::spawn(async move {
        call.follow(&follow, &session, events, &like_event_source(), None)
            .await;
        call
    })
}

/// Waits (at most 30 s) for every call of `calls`; each must have received every event and its
/// answer exactly once, nothing foreign, no 404. Panics with the problems and
/// [`diagnosis`] of `cluster`.
async fn every_call_whole(calls: Vec<JoinHandle<Tracked>>, cluster: &Cluster) {
    let mut problems = Vec::new();
    for (i, task) in calls.into_iter().enumerate() {
        match tokio::time::timeout(Duration::from_secs(30), task).await {
            Ok(Ok(call)) => {
                if let Err(e) = call.whole() {
                    problems.push(format!("call {i}: {e}"));
                }
            }
            Ok(Err(e)) => problems.push(format!("call {i}: {e}")),
            Err(_) => problems.push(format!("call {i} hung")),
        }
    }
    if !problems.is_empty() {
        panic!(
            "{} calls went wrong: {:#?}\n{}",
            problems.len(),
            &problems[..problems.len().min(4)],
            diagnosis(cluster).await
        );
    }
}

/// What every running pod of `cluster` counted of 404s, forwards and failed handoffs, then
/// their logs: the story of a failed assertion.
async fn diagnosis(cluster: &Cluster) -> String {
    let mut out = String::new();
    for pod in &cluster.pods {
        let metrics = pod.metrics().await.unwrap_or_default();
        for family in [
            "tether_not_found_total",
            "tether_forwards_total",
            "tether_handoffs_failed_total",
        ] {
            for (labels, n) in family_samples(&metrics, family) {
                let _ = writeln!(out, "{}: {family}{{{labels}}} {n}", pod.ip);
            }
        }
    }
    out + &cluster.logs()
}

/// Waits until the example servers of `pods` run `n` `slow` calls in all (they started).
async fn calls_started(pods: &[&Pod], n: u64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut started = 0;
        for pod in pods {
            started += pod.stats().await.unwrap()["executions"]
                .as_u64()
                .unwrap_or(0);
        }
        if started >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{started} of {n} calls started within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `slow` call ids executed more than once over the example servers of `pods` together: a call
/// run once on each of two pods ran twice.
async fn executed_twice(pods: &[&Pod]) -> u64 {
    let mut executions = Executions::default();
    for pod in pods {
        executions.add(&pod.stats().await.unwrap());
    }
    executions.executed_twice()
}

/// `echo` in every session of `sessions` through `client`: each answers `text`.
async fn echo_in_each(client: &McpClient, sessions: &[Session], id: u64, text: &str) {
    let failures = echo_failures(client, sessions, id, text).await;
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `echo` in every session of `sessions` through `client`, one after the other: what went wrong
/// in the sessions that did not answer `text`.
async fn echo_failures(
    client: &McpClient,
    sessions: &[Session],
    id: u64,
    text: &str,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (i, session) in sessions.iter().enumerate() {
        match client
            .call(session, id, "echo", json!({"text": text}))
            .await
        {
            Ok(answer) if answer.last().and_then(result_text) == Some(text) => {}
            Ok(answer) => failures.push(format!("session {i} at {}: {answer:?}", client.url)),
            Err(e) => failures.push(format!("session {i} at {}: {e}", client.url)),
        }
    }
    failures
}

/// Stops pod `a` (the first of `cluster`) with SIGTERM, which must exit cleanly after its drain,
/// takes it out of membership, and checks that `b` alone serves every one of `sessions`.
async fn stop_and_serve_from(
    cluster: &mut Cluster,
    a: Ipv4Addr,
    b: Ipv4Addr,
    sessions: &[Session],
) {
    let exit = cluster.pods[0]
        .terminate_sidecar(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(exit.is_some_and(|e| e.success()), "{exit:?}");
    let old = cluster.take(a).unwrap();
    cluster.set_state(a, None).await.unwrap();
    drop(old);
    echo_in_each(&cluster.client_of(&[b]), sessions, 4, "after").await;
}

/// Puts `front`, a fresh address, in front of the pod on `ip` in everyone's membership: a relay
/// on its MCP port passes the peers' probes to the pod's; its peer port is whatever the caller
/// started there (a [`Relay`], a [`Tap`]). Returns the MCP port's relay.
async fn reach_through(cluster: &mut Cluster, ip: Ipv4Addr, front: Ipv4Addr) -> Relay {
    let relay = Relay::start((front, LISTEN_PORT).into(), (ip, LISTEN_PORT).into())
        .await
        .unwrap();
    cluster.reach_via(ip, front).await.unwrap();
    relay
}

/// The drain answer of a drain that moved `sessions` sessions and cut nothing; panics with
/// `logs` otherwise.
fn moved_every_session(drained: &Drained, sessions: usize, logs: impl Fn() -> String) {
    let body = &drained.body;
    assert!(
        drained.done && body["notMoved"] == 0 && body["cut"] == 0,
        "{body}\n{}",
        logs()
    );
    assert_eq!(body["handedOff"], sessions, "{body}\n{}", logs());
}

/// The head of a `POST /v2/sessions` that announces a 16 MiB body and carries no
/// authentication, as a connection would send it to hold a message slot while its body trickles.
const UNAUTHENTICATED_PUSH: &[u8] = b"POST /v2/sessions HTTP/1.1\r\nhost: peer\r\n\
content-type: application/json\r\ncontent-length: 16777216\r\n\r\n";

/// A TLS 1.2 ClientHello record (one cipher suite, a padding extension of 256 bytes): at a
/// byte every 200 ms it never completes within the sidecar's `--header-timeout` (10 s).
fn client_hello() -> Vec<u8> {
    const PADDING: usize = 256;
    let mut hello = vec![0x03, 0x03];
    hello.extend([0x5a; 32]);
    hello.push(0);
    hello.extend([0x00, 0x02, 0x13, 0x01, 0x01, 0x00]);
    let padding = u16::try_from(PADDING).unwrap();
    hello.extend((padding + 4).to_be_bytes());
    hello.extend([0x00, 0x15]);
    hello.extend(padding.to_be_bytes());
    hello.extend([0u8; PADDING]);
    let mut handshake = vec![0x01];
    handshake.extend(&u32::try_from(hello.len()).unwrap().to_be_bytes()[1..]);
    handshake.extend(hello);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend(u16::try_from(handshake.len()).unwrap().to_be_bytes());
    record.extend(handshake);
    record
}

/// Of the `tether_handoff_seconds` histogram in `metrics`: handoffs acknowledged within the
/// smallest bucket of at least `secs`, and all of them.
fn acknowledged_within(metrics: &str, secs: f64) -> (f64, f64) {
    let within = family_samples(metrics, "tether_handoff_seconds_bucket")
        .filter_map(|(labels, n)| {
            let le = labels.strip_prefix("le=\"")?.strip_suffix('"')?;
            Some((le.parse::<f64>().ok()?, n))
        })
        .filter(|(le, _)| *le >= secs)
        .min_by(|x, y| x.0.total_cmp(&y.0))
        .map_or(0.0, |(_, n)| n);
    let all = family_samples(metrics, "tether_handoff_seconds_count")
        .map(|(_, n)| n)
        .sum();
    (within, all)
}

/// A draining pod's handoffs are not delayed by what holds its peers' peer ports without the
/// key ring (`docs/design/peer-trust.md#what-a-peer-may-be`). Peer TLS is on; 64 connections on
/// each of B's and C's peer ports send a byte every 200 ms, opened again whenever closed: 22 a
/// plaintext `POST /v2/sessions` head announcing 16 MiB without authentication, 21 such a head
/// at once and then its body, 21 a TLS ClientHello. Every plaintext connection is closed at its
/// first byte, before a head is read (`tether_peer_auth_failures_total{reason="plaintext"}`);
/// the ClientHellos stay open. Meanwhile A, with 16 sessions each running a `slow` call, drains:
/// every session is handed off, each acknowledged within 2 s (a message slot held by a slow
/// connection would make it wait 5 s for one), no client sees a 404, every event arrives once.
/// The peers then close the ClientHellos at `--header-timeout` (10 s): TLS handshakes refused in
/// `tether_peer_auth_failures_total{reason="tls"}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unauthenticated_slow_connections_to_the_peer_port_delay_no_handoff() {
    const CALLS: usize = 16;
    const HEADS: usize = 22;
    const BODIES: usize = 21;
    const HELLOS: usize = 21;
    let mut s = Scenario::start(3, draining_for(PodSpec::default(), "15s")).await;
    let sessions = sessions_via(&s.via_a(), CALLS).await;
    let plan = CallPlan::steady(40, 100);
    let mut calls = Vec::new();
    for (i, session) in sessions.iter().enumerate() {
        let follow = s.cluster.client();
        calls.push(running_call(&s.via_a(), follow, session, &format!("slow-{i}"), &plan).await);
    }
    calls_started(&[s.pod_a()], CALLS as u64).await;
    let (hello, body) = (client_hello(), [b' '; 1024]);
    let every = Duration::from_millis(200);
    let slow: Vec<(Ipv4Addr, [Trickle; 3])> = s
        .rest
        .iter()
        .map(|&ip| {
            let port = (ip, PEER_PORT).into();
            let heads = Trickle::start(port, b"", UNAUTHENTICATED_PUSH, HEADS, every);
            let bodies = Trickle::start(port, UNAUTHENTICATED_PUSH, &body, BODIES, every);
            let hellos = Trickle::start(port, b"", &hello, HELLOS, every);
            (ip, [heads, bodies, hellos])
        })
        .collect();
    let plaintext = "tether_peer_auth_failures_total{reason=\"plaintext\"}";
    for (ip, [heads, bodies, _]) in &slow {
        let pod = s.cluster.pod(*ip).unwrap();
        let held = HELLOS as f64;
        let open = pod.wait_for_metric("tether_peer_connections", WAIT, |n| n >= held);
        // Each connection is opened again once closed: two refusals per connection means each
        // was closed at least once.
        let twice = (2 * (HEADS + BODIES)) as f64;
        let refused = pod.wait_for_metric(plaintext, WAIT, |n| n >= twice);
        let (open, refused) = (s.check(open.await), s.check(refused.await));
        let ended = heads.ended() + bodies.ended();
        assert!(
            open >= held && refused >= twice && ended >= HEADS + BODIES,
            "{ip}: {open} peer connections, {refused} plaintext connections refused, {ended} closed"
        );
    }
    let drain = s.drain_a().await;
    let drained = s.check(drain.await.unwrap());
    moved_every_session(&drained, CALLS, || s.cluster.logs());
    every_call_whole(calls, &s.cluster).await;
    let (within, all) = acknowledged_within(&s.pod_a().metrics().await.unwrap(), 2.0);
    assert_eq!(
        (within, all),
        (CALLS as f64, CALLS as f64),
        "handoffs acknowledged within 2 s, of all\n{}",
        s.cluster.logs()
    );
    let not_found = s.cluster.metric_sum("tether_not_found_total").await;
    assert_eq!(s.check(not_found), 0.0, "{}", s.cluster.logs());
    for (ip, [heads, bodies, hellos]) in &slow {
        let pod = s.cluster.pod(*ip).unwrap();
        let sample = "tether_peer_auth_failures_total{reason=\"tls\"}";
        let tls = s.check(
            pod.wait_for_metric(sample, WAIT, |n| n >= HELLOS as f64)
                .await,
        );
        let plaintext = s.check(pod.metric(plaintext).await);
        println!(
            "{ip}: {} slow heads, {} heads with slow bodies, {} ClientHellos opened; \
             {plaintext} plaintext connections closed, {tls} TLS handshakes refused",
            heads.opened(),
            bodies.opened(),
            hellos.opened()
        );
        assert!(
            tls >= HELLOS as f64,
            "{ip}: {tls} TLS refusals\n{}",
            pod.logs()
        );
    }
}

/// With `spec`, a stand-in in the membership (a routable pod of the endpoint's revision at its
/// own address) answers `200 {"ok":true}` to everything, claiming peer protocol 2.
/// A holds 30 sessions and drains: each is handed to B (A and B are the only sidecars), however
/// many were first pushed to the stand-in; A keeps forwarding every one to B, and once A stopped,
/// B serves them all. Returns A's failed handoffs by reason and the stand-in, for the caller's
/// checks.
async fn drain_past_a_stand_in(spec: PodSpec) -> (Value, StandIn) {
    const N: usize = 30;
    let [a, b, fake] = addr::ips();
    let stand_in = StandIn::start(fake).await.unwrap();
    let mut cluster = Cluster::start(&[a, b], spec).await.unwrap();
    let mut members = cluster.members.clone();
    members.push(Member::new(fake, "routable"));
    cluster.publish(members).await.unwrap();
    let via_a = cluster.client_of(&[a]);
    let sessions = sessions_via(&via_a, N).await;
    echo_in_each(&via_a, &sessions, 2, "before").await;
    cluster.set_state(a, Some("draining")).await.unwrap();
    let drained = cluster.pods[0].drain().await.unwrap();
    moved_every_session(&drained, N, || cluster.logs());
    let received = cluster.pods[1]
        .metric("tether_handoffs_received_total")
        .await
        .unwrap();
    assert_eq!(
        received,
        N as f64,
        "B adopted every session; the stand-in got {} pushes",
        stand_in.requests(PEER_PORT, SESSIONS),
    );
    // A forwards each session to where it moved.
    echo_in_each(&via_a, &sessions, 3, "moved").await;
    let metrics = cluster.pods[0].metrics().await.unwrap();
    let failed: serde_json::Map<String, Value> =
        family_samples(&metrics, "tether_handoffs_failed_total")
            .map(|(labels, n)| (labels.to_owned(), json!(n)))
            .collect();
    stop_and_serve_from(&mut cluster, a, b, &sessions).await;
    let not_found = cluster.metric_sum("tether_not_found_total").await.unwrap();
    assert_eq!(not_found, 0.0, "{}", cluster.logs());
    (Value::Object(failed), stand_in)
}

/// A stand-in that answers `200 {"ok":true}` to everything is never handed a session
/// (`docs/design/peer-trust.md#what-a-peer-may-be`): with peer TLS off it claims protocol 2, gets
/// pushes, and answers them 200 without an acknowledgement; A counts each as `unacknowledged`,
/// asks the stand-in `POST /v2/held` before trying B (answered 200 without an acknowledgement
/// too: not held), and hands the session to B. No session is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stand_in_answering_200_to_everything_never_receives_a_session() {
    let (failed, stand_in) = drain_past_a_stand_in(plaintext()).await;
    let pushed = stand_in.requests(PEER_PORT, SESSIONS);
    let asked = stand_in.requests(PEER_PORT, HELD);
    println!("stand-in: {pushed} pushes, {asked} questions; A's failed handoffs: {failed}");
    assert!(pushed >= 1, "the stand-in was tried: {failed}");
    assert_eq!(
        failed["reason=\"unacknowledged\""], pushed as f64,
        "each push to the stand-in counted unacknowledged: {failed}"
    );
    assert_eq!(asked, pushed, "each push was asked about once");
}

/// The same stand-in with the defaults (peer TLS on): it cannot complete a TLS handshake with
/// the endpoint's CA, so it gets nothing but liveness probes — no push, no forwarded client
/// request (which would carry the client's bearer token), on either port. A counts its attempts
/// `unreachable` and hands every session to B.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stand_in_that_cannot_complete_tls_gets_nothing_but_probes() {
    let (failed, stand_in) = drain_past_a_stand_in(PodSpec::default()).await;
    let seen = stand_in.seen();
    let probes = seen
        .iter()
        .filter(|(port, path)| *port == LISTEN_PORT && path == PROBE)
        .count();
    println!("A's failed handoffs: {failed}; the stand-in got {probes} probes");
    assert!(probes >= 1, "the stand-in was probed as a pod");
    let other: Vec<_> = seen
        .iter()
        .filter(|(port, path)| !(*port == LISTEN_PORT && path == PROBE))
        .collect();
    assert!(other.is_empty(), "the stand-in got {other:?}");
    assert!(
        failed["reason=\"unacknowledged\""].is_null(),
        "nothing answered as HTTP: {failed}"
    );
    assert!(
        failed["reason=\"unreachable\""].as_f64() >= Some(1.0),
        "the stand-in was tried: {failed}"
    );
}

/// S-05 (a session ended stays ended), and what stops a captured message
/// (`docs/design/peer-protocol.md#authentication`), with peer TLS off: a tap in
/// front of B's peer port records A's signed pushes as A drains. Sent again byte for byte, the
/// push of one session is refused by B, which took it (409 `replayed`), and by C, a pod of the
/// same endpoint it was not addressed to (421 `misaddressed`); readdressed to C, its MAC fails
/// (401). After the session's DELETE, the same bytes are still 409 at B and the session stays
/// ended: 404. B adopted each session once, C none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s05_replayed_and_misaddressed_pushes_are_refused() {
    let [a, b, front] = addr::ips();
    let mut cluster = Cluster::start(&[a, b], plaintext()).await.unwrap();
    let tap = Tap::start(
        (front, PEER_PORT).into(),
        (b, PEER_PORT).into(),
        Arc::new(|_: &str| false),
    )
    .await
    .unwrap();
    let _probes = reach_through(&mut cluster, b, front).await;
    let c = Pod::start(plaintext()).await.unwrap();
    let via_a = cluster.client_of(&[a]);
    let sessions = sessions_via(&via_a, 3).await;
    echo_in_each(&via_a, &sessions, 2, "before").await;
    cluster.set_state(a, Some("draining")).await.unwrap();
    let drained = cluster.pods[0].drain().await.unwrap();
    moved_every_session(&drained, 3, || cluster.logs());
    let pushes = tap.recorded_to(SESSIONS);
    assert_eq!(pushes.len(), 3, "one push per session through the tap");
    let push = &pushes[0];
    let image: Value = serde_json::from_slice(push.body()).unwrap();
    let session = sessions
        .iter()
        .find(|s| image["session"]["id"] == s.id.as_str())
        .expect("the push carries one of the sessions")
        .clone();
    let b_pod = &cluster.pods[1];
    let b_peer: SocketAddr = (b, PEER_PORT).into();
    let c_peer: SocketAddr = (c.ip, PEER_PORT).into();
    let replayed = "tether_peer_auth_failures_total{reason=\"replayed\"}";
    let again = push.send_to(b_peer).await.unwrap();
    assert_eq!(
        (again.status, again.reason().as_deref()),
        (409, Some("replayed")),
        "the same push again at B: {again:?}"
    );
    assert!(
        again.header("tether-peer-ack").is_some(),
        "B acknowledges its refusal: {again:?}"
    );
    let elsewhere = push.send_to(c_peer).await.unwrap();
    assert_eq!(
        (elsewhere.status, elsewhere.reason().as_deref()),
        (421, Some("misaddressed")),
        "B's push at C: {elsewhere:?}"
    );
    let readdressed = push.with_header("tether-peer-to", &c.uid);
    let forged = readdressed.send_to(c_peer).await.unwrap();
    assert_eq!(
        (forged.status, forged.reason().as_deref()),
        (401, Some("mac")),
        "B's push readdressed to C: {forged:?}"
    );
    let via_b = cluster.client_of(&[b]);
    echo_in_each(&via_b, std::slice::from_ref(&session), 3, "still one").await;
    let deleted = via_b.delete(&session).await.unwrap();
    assert!(deleted.is_success(), "DELETE: {deleted}");
    let after_delete = push.send_to(b_peer).await.unwrap();
    assert_eq!(
        (after_delete.status, after_delete.reason().as_deref()),
        (409, Some("replayed")),
        "the push again after the DELETE: {after_delete:?}"
    );
    for client in [&via_b, &via_a] {
        let resp = client
            .post(
                Some(&session),
                &tool_call(4, "echo", json!({"text": "gone"}), None),
                &[],
            )
            .await
            .unwrap();
        expect_lost_session(resp).await.unwrap();
    }
    assert_eq!(b_pod.metric(replayed).await.unwrap(), 2.0);
    assert_eq!(
        b_pod
            .metric("tether_handoffs_received_total")
            .await
            .unwrap(),
        3.0,
        "B adopted each session once"
    );
    let misaddressed = "tether_peer_auth_failures_total{reason=\"misaddressed\"}";
    assert_eq!(c.metric(misaddressed).await.unwrap(), 1.0);
    let mac = "tether_peer_auth_failures_total{reason=\"mac\"}";
    assert_eq!(c.metric(mac).await.unwrap(), 1.0);
    assert_eq!(
        c.metric("tether_handoffs_received_total").await.unwrap(),
        0.0
    );
    let others = sessions.iter().filter(|s| s.id != session.id);
    echo_in_each(&via_b, &others.cloned().collect::<Vec<_>>(), 5, "alive").await;
}

/// One holder per session when acknowledgements are lost
/// (`docs/design/handoff.md#one-holder-per-session`), peer TLS off: a tap in front of B's peer
/// port lets every push through and cuts the connection at the first byte of its answer. A,
/// draining with 4 sessions whose `slow` calls run, tries each push three times, then asks B
/// (`POST /v2/held`), which says it took it: the session counts as moved, to B alone. Every
/// event arrives once, the calls ran once (on A), B adopted each session once, and once A
/// stopped B serves them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_acknowledgement_leaves_one_holder() {
    const N: usize = 4;
    let [a, b, front] = addr::ips();
    let spec = draining_for(plaintext(), "10s");
    let mut cluster = Cluster::start(&[a, b], spec).await.unwrap();
    let withhold = Arc::new(|path: &str| path == SESSIONS);
    let tap = Tap::start((front, PEER_PORT).into(), (b, PEER_PORT).into(), withhold)
        .await
        .unwrap();
    let _probes = reach_through(&mut cluster, b, front).await;
    let via_a = cluster.client_of(&[a]);
    let sessions = sessions_via(&via_a, N).await;
    let plan = CallPlan::steady(30, 100);
    let mut calls = Vec::new();
    for (i, session) in sessions.iter().enumerate() {
        let follow = cluster.client();
        calls.push(running_call(&via_a, follow, session, &format!("lost-ack-{i}"), &plan).await);
    }
    calls_started(&[&cluster.pods[0]], N as u64).await;
    cluster.set_state(a, Some("draining")).await.unwrap();
    let drained = cluster.pods[0].drain().await.unwrap();
    moved_every_session(&drained, N, || cluster.logs());
    every_call_whole(calls, &cluster).await;
    let (pushes, asked) = (tap.recorded_to(SESSIONS).len(), tap.recorded_to(HELD).len());
    println!(
        "{pushes} pushes, {} answers withheld, {asked} questions, {} tails",
        tap.withheld(),
        tap.recorded_to(TAIL).len()
    );
    assert_eq!(tap.withheld(), pushes, "no push got its answer");
    assert_eq!(pushes, 3 * N, "each push was tried three times");
    assert_eq!(asked, N, "A asked B once per session");
    let (pod_a, pod_b) = (&cluster.pods[0], &cluster.pods[1]);
    let sent = pod_a.metric("tether_handoffs_sent_total").await.unwrap();
    let received = pod_b
        .metric("tether_handoffs_received_total")
        .await
        .unwrap();
    assert_eq!((sent, received), (N as f64, N as f64), "{}", cluster.logs());
    let metrics = pod_a.metrics().await.unwrap();
    let failed: Vec<_> = family_samples(&metrics, "tether_handoffs_failed_total").collect();
    assert!(failed.iter().all(|(_, n)| *n == 0.0), "{failed:?}");
    let executions = [
        pod_a.stats().await.unwrap()["executions"].clone(),
        pod_b.stats().await.unwrap()["executions"].clone(),
    ];
    assert_eq!(executions, [json!(N), json!(0)], "the calls ran once, on A");
    assert_eq!(executed_twice(&[pod_a, pod_b]).await, 0);
    echo_in_each(&via_a, &sessions, 3, "moved").await;
    stop_and_serve_from(&mut cluster, a, b, &sessions).await;
}

/// A new holder lost after its acknowledgement leaves the session to the next
/// (`docs/design/handoff.md#a-pod-killed-mid-handoff`): A drains 12 sessions whose `slow` calls
/// run on A, their clients reading through A and C; B's sidecar is killed (SIGKILL) as soon as
/// B adopted one, and stays in the membership, refusing connections. Right then a request of
/// each session enters at A. A takes back what it handed to B and pushes it again, to C
/// (`tether_handoffs_failed_total{reason="holder_lost"}`); the calls go on forwarding their
/// events: every request is answered (no 404), every client gets every event once and its
/// answer, no call runs twice; once A stopped, C serves every session.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_holder_killed_right_after_its_ack_leaves_the_session_to_the_next() {
    const N: usize = 12;
    // The handoff's own recovery, without a replica of B's to promote.
    let mut s = Scenario::start(3, draining_for(PodSpec::default().unreplicated(), "15s")).await;
    let (b, c) = (s.rest[0], s.rest[1]);
    let sessions = sessions_via(&s.via_a(), N).await;
    let plan = CallPlan::steady(40, 100);
    let mut calls = Vec::new();
    for (i, session) in sessions.iter().enumerate() {
        let follow = s.cluster.client_of(&[s.a, c]);
        calls.push(running_call(&s.via_a(), follow, session, &format!("killed-{i}"), &plan).await);
    }
    calls_started(&[s.pod_a()], N as u64).await;
    let drain = s.drain_a().await;
    let adopted = s
        .cluster
        .pod(b)
        .unwrap()
        .wait_for_metric("tether_handoffs_received_total", WAIT, |n| n >= 1.0)
        .await;
    assert!(s.check(adopted) >= 1.0, "B adopted a session");
    let index = s.cluster.pods.iter().position(|p| p.ip == b).unwrap();
    let killed = s.cluster.pods[index].kill_sidecar().await;
    s.check(killed);
    let dead = s.cluster.take(b).unwrap();
    // Requests reaching the old holder first: each finds its session, wherever it is now.
    let right_after = echo_failures(&s.via_a(), &sessions, 3, "right after").await;
    every_call_whole(calls, &s.cluster).await;
    assert!(
        right_after.is_empty(),
        "{right_after:#?}\n{}",
        diagnosis(&s.cluster).await
    );
    let holder_lost = s
        .pod_a()
        .metric("tether_handoffs_failed_total{reason=\"holder_lost\"}")
        .await;
    assert!(
        s.check(holder_lost) >= 1.0,
        "A pushed again what B held\n{}",
        s.cluster.logs()
    );
    let not_found = s.cluster.metric_sum("tether_not_found_total").await;
    assert_eq!(s.check(not_found), 0.0, "{}", s.cluster.logs());
    let old = s.stop_a(drain).await;
    let pods = [&old, &dead, s.cluster.pod(c).unwrap()];
    assert_eq!(executed_twice(&pods).await, 0, "no call ran twice");
    echo_in_each(&s.cluster.client_of(&[c]), &sessions, 4, "after").await;
}

/// Tails are sent again while the new holder's peer port fails
/// (`docs/design/handoff.md#a-pod-killed-mid-handoff`): peer TLS on, a relay in front of B's peer
/// port. A drains 8 sessions whose `slow` calls run on A (their clients read from A, or resume
/// at B); once B adopted all of them the relay cuts its connections and refuses every new one
/// for 2 s, while the calls go on producing events on A. A keeps sending each tail until B takes
/// it: every client gets every event exactly once and its answer, the drain cuts no request,
/// and A counts no `tail` or `holder_lost` failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tail_forwarding_survives_two_seconds_of_peer_errors() {
    const N: usize = 8;
    let [a, b, front] = addr::ips();
    let mut cluster = Cluster::start(&[a, b], draining_for(PodSpec::default(), "10s"))
        .await
        .unwrap();
    let peer_port = Relay::start((front, PEER_PORT).into(), (b, PEER_PORT).into())
        .await
        .unwrap();
    let _probes = reach_through(&mut cluster, b, front).await;
    let via_a = cluster.client_of(&[a]);
    let sessions = sessions_via(&via_a, N).await;
    let plan = CallPlan::steady(40, 100);
    let mut calls = Vec::new();
    for (i, session) in sessions.iter().enumerate() {
        let follow = cluster.client_of(&[b]);
        calls.push(running_call(&via_a, follow, session, &format!("outage-{i}"), &plan).await);
    }
    calls_started(&[&cluster.pods[0]], N as u64).await;
    cluster.set_state(a, Some("draining")).await.unwrap();
    let drain = cluster.pods[0].start_drain();
    let adopted = cluster.pods[1]
        .wait_for_metric("tether_handoffs_received_total", WAIT, |n| n >= N as f64)
        .await
        .unwrap();
    assert_eq!(
        adopted,
        N as f64,
        "B adopted every session\n{}",
        cluster.logs()
    );
    let outage = Instant::now();
    peer_port.refuse_for(Duration::from_secs(2));
    let drained = drain.await.unwrap().unwrap();
    println!(
        "drain: {} ({:?} after the outage began); {} connections refused",
        drained.body,
        outage.elapsed(),
        peer_port.refused()
    );
    moved_every_session(&drained, N, || cluster.logs());
    every_call_whole(calls, &cluster).await;
    assert!(
        peer_port.refused() >= 1,
        "A sent tails during the outage\n{}",
        cluster.logs()
    );
    let pod_a = &cluster.pods[0];
    for reason in ["tail", "holder_lost"] {
        let sample = format!("tether_handoffs_failed_total{{reason=\"{reason}\"}}");
        assert_eq!(pod_a.metric(&sample).await.unwrap(), 0.0, "{sample}");
    }
    assert_eq!(
        pod_a.metric("tether_requests_cut_total").await.unwrap(),
        0.0
    );
    assert!(
        pod_a
            .metric("tether_tail_events_forwarded_total")
            .await
            .unwrap()
            > 0.0
    );
    assert_eq!(
        executed_twice(&[&cluster.pods[0], &cluster.pods[1]]).await,
        0
    );
}

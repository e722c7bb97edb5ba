//! Component tests of the drain, in process: a real broker, router, [`Handoff`] and [`Drain`]
//! of pod `pod-a` among three routable pods, a scripted [`PeerLink`] in place of the peers, on
//! paused tokio time. Each test drains the pod with sessions held here (some with a request in
//! flight, answered by the test in place of the MCP server) and checks the [`DrainOutcome`],
//! where the sessions end up, how long the drain took, and what the metrics say
//! (`docs/design/handoff.md#when-a-pod-drains`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use parking_lot::Mutex;
use serde_json::Value;

use super::{CUT_FLUSH, Drain, DrainOutcome};
use crate::broker::Here;
use crate::handoff::fixtures::{ENDPOINT, Pod};
use crate::ops::metrics::OpsMetrics;
use crate::peer::client::{Destination, PeerLink, SendError};
use crate::peer::{SESSIONS_PATH, TAIL_PATH};
use crate::session::fixtures::{ANY_ROOM, key, stream};
use crate::session::{Dedupe, Entry, Session};
use crate::stream::Stream;

/// `spec.drain.timeout` of [`ENDPOINT`].
const DEADLINE: Duration = Duration::from_secs(60);
/// What a drain that waits for nothing but its pushes may take: a millisecond per push (well
/// below its deadline, and below its one-second re-check).
const AT_ONCE: Duration = Duration::from_millis(100);
/// The peer protocol's round trip here (each message takes a millisecond), with the paused
/// clock's millisecond of timer resolution on top.
const MESSAGE: Duration = Duration::from_millis(5);

/// How a peer that takes nothing says so.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    /// It accepts no connection.
    Unreachable,
    /// It answers 403 (a signature it does not accept).
    Forbidden,
}

/// Peers as a script: every peer acknowledges every message, but those told to refuse; every
/// message is recorded.
#[derive(Debug, Default)]
struct Peers {
    refusing: Mutex<HashMap<String, Refusal>>,
    /// Every message: the peer, the path, the body.
    sent: Mutex<Vec<(String, String, Value)>>,
}

impl Peers {
    fn refuse(&self, uid: &str, refusal: Refusal) {
        self.refusing.lock().insert(uid.to_owned(), refusal);
    }

    /// The bodies of the messages sent on `path`, with their peer.
    fn sent(&self, path: &str) -> Vec<(String, Value)> {
        self.sent
            .lock()
            .iter()
            .filter(|(_, p, _)| p == path)
            .map(|(uid, _, body)| (uid.clone(), body.clone()))
            .collect()
    }

    /// Every session pushed: the peer and the session id.
    fn pushes(&self) -> Vec<(String, String)> {
        self.sent(SESSIONS_PATH)
            .into_iter()
            .map(|(uid, push)| (uid, push["session"]["id"].as_str().unwrap().to_owned()))
            .collect()
    }
}

#[async_trait::async_trait]
impl PeerLink for Peers {
    async fn ask(&self, to: Destination<'_>, path: &str, body: Bytes) -> Result<Bytes, SendError> {
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        self.sent
            .lock()
            .push((to.uid.to_owned(), path.to_owned(), body));
        // A message takes a moment, as on a network.
        tokio::time::sleep(Duration::from_millis(1)).await;
        match self.refusing.lock().get(to.uid) {
            None => Ok(Bytes::new()),
            Some(Refusal::Unreachable) => Err(SendError::Unreachable("connection refused".into())),
            Some(Refusal::Forbidden) => Err(SendError::Refused {
                status: StatusCode::FORBIDDEN,
                reason: r#"{"error":"refused","reason":"forged"}"#.into(),
            }),
        }
    }
}

/// Pod `pod-a` (flags `args`), its scripted peers and its drain.
fn start(args: &[&str]) -> (Pod, Arc<Peers>, Arc<Drain>) {
    let peers = Arc::new(Peers::default());
    let mut pod = Pod::start(ENDPOINT, args, Arc::clone(&peers) as Arc<dyn PeerLink>);
    let metrics = Arc::new(OpsMetrics::new(&mut pod.registry));
    assert_eq!(pod.cfg.drain_timeout, DEADLINE);
    let drain = Drain::new(
        Arc::clone(&pod.broker),
        Arc::clone(&pod.handoff),
        Arc::clone(&pod.lifecycle),
        metrics,
        pod.cfg.drain_timeout,
    );
    (pod, peers, drain)
}

/// The peer `session` was handed to.
fn holder(pod: &Pod, session: &Session) -> String {
    match pod.broker.locate(session.id()) {
        Ok((_, Here::Moved(uid))) => uid,
        _ => panic!("not handed off: {}", pod.place(session.id())),
    }
}

/// The lines of metric family `family` as exposed, sorted (a family's labels come in no set
/// order).
fn metric(pod: &Pod, family: &str) -> Vec<String> {
    let mut lines: Vec<String> = pod
        .encode()
        .lines()
        .filter(|l| l.starts_with(family))
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

/// A `tools/call` (request id 1) sent upstream in `session`, its answer not in yet.
fn call(session: &Arc<Session>) -> Arc<Stream> {
    let ids = [key(1)];
    let call = stream(session, &ids);
    assert!(matches!(
        session.claim(&ids, [1; 32], &call, ANY_ROOM),
        Dedupe::New
    ));
    assert!(session.in_flight());
    call
}

/// The MCP server answers the call of `stream`.
fn answer(stream: &Stream) {
    let _ = stream.append(
        None,
        Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#),
        std::time::Instant::now(),
    );
    assert!(stream.is_complete());
}

#[tokio::test(start_paused = true)]
async fn held_sessions_go_to_peers_that_take_them_and_the_drain_ends_at_once() {
    let (pod, peers, drain) = start(&[]);
    let sessions = [pod.hold("pod-a"), pod.hold("pod-a")];
    assert!(!pod.lifecycle.is_draining());
    let outcome = drain.run().await;
    assert!(pod.lifecycle.is_draining(), "/readyz answers 503");
    assert_eq!(
        (
            outcome.drained,
            outcome.in_flight,
            outcome.handed_off,
            outcome.not_moved,
            outcome.cut
        ),
        (true, 0, 2, 0, 0),
        "{outcome:?}"
    );
    assert!(outcome.elapsed < AT_ONCE, "{outcome:?}");
    let mut pushed = peers.pushes();
    pushed.sort();
    let mut expected: Vec<_> = sessions
        .iter()
        .map(|s| (holder(&pod, s), s.id().to_owned()))
        .collect();
    expected.sort();
    assert_eq!(
        pushed, expected,
        "each session pushed once, to its new holder"
    );
    assert!(pod.broker.sessions().is_empty());
    assert_eq!(pod.handoff.following(), 0);
    assert_eq!(
        metric(&pod, "tether_handoffs_sent_total"),
        ["tether_handoffs_sent_total 2"]
    );
    assert_eq!(
        metric(&pod, "tether_drain_seconds_count"),
        ["tether_drain_seconds_count 1"]
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_and_later_triggers_get_the_outcome_of_the_one_drain() {
    let (pod, peers, drain) = start(&[]);
    pod.hold("pod-a");
    pod.hold("pod-a");
    // The drain socket's preStop and SIGTERM at once, then a pod deletion seen later.
    let (one, two) = tokio::join!(drain.run(), drain.run());
    assert_eq!(one, two);
    assert_eq!((one.handed_off, one.not_moved), (2, 0), "{one:?}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later = tokio::time::Instant::now();
    assert_eq!(drain.run().await, one);
    assert_eq!(
        later.elapsed(),
        Duration::ZERO,
        "a later trigger waits for nothing"
    );
    assert_eq!(peers.pushes().len(), 2, "no session pushed twice");
    assert_eq!(
        metric(&pod, "tether_drain_seconds_count"),
        ["tether_drain_seconds_count 1"]
    );
    assert_eq!(drain.ended(Duration::ZERO).await, Some(one));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gets_the_outcome_of_a_drain_it_did_not_start_or_none_within_its_limit() {
    let (pod, _, drain) = start(&["--handoff=false"]);
    pod.hold("pod-a");
    // `/drained` before any drain: it waits out its limit and starts none.
    let asked = tokio::time::Instant::now();
    assert_eq!(drain.ended(Duration::from_secs(5)).await, None);
    assert_eq!(asked.elapsed(), Duration::from_secs(5));
    assert!(!pod.lifecycle.is_draining());
    assert!(drain.began().is_none());
    // Without handoff the drain serves its session until the deadline.
    let run = tokio::spawn({
        let drain = Arc::clone(&drain);
        async move { drain.run().await }
    });
    let waiter = tokio::spawn({
        let drain = Arc::clone(&drain);
        async move { drain.ended(DEADLINE + Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(pod.lifecycle.is_draining());
    assert!(drain.began().is_some());
    assert_eq!(
        drain.ended(Duration::from_secs(10)).await,
        None,
        "the drain has not ended 11 s in"
    );
    let outcome = run.await.unwrap();
    assert_eq!(waiter.await.unwrap(), Some(outcome));
    assert_eq!(outcome.elapsed, DEADLINE, "{outcome:?}");
    assert_eq!(asked.elapsed(), Duration::from_secs(5) + DEADLINE);
}

#[tokio::test(start_paused = true)]
async fn sessions_no_peer_takes_stay_and_are_served_until_the_deadline() {
    let (pod, peers, drain) = start(&[]);
    peers.refuse("pod-b", Refusal::Unreachable);
    peers.refuse("pod-c", Refusal::Forbidden);
    let sessions = [pod.hold("pod-a"), pod.hold("pod-a")];
    let outcome = drain.run().await;
    assert_eq!(
        (
            outcome.drained,
            outcome.in_flight,
            outcome.handed_off,
            outcome.not_moved,
            outcome.cut
        ),
        (true, 0, 0, 2, 0),
        "{outcome:?}"
    );
    // No request ran: nothing is cut, so no flush follows the deadline.
    assert_eq!(outcome.elapsed, DEADLINE, "{outcome:?}");
    for session in &sessions {
        assert_eq!(pod.place(session.id()), "held");
    }
    // Each session tried both peers: the unreachable one three times, the other once.
    assert_eq!(peers.pushes().len(), 2 * (3 + 1), "{:?}", peers.pushes());
    assert_eq!(
        metric(&pod, "tether_handoffs_failed_total"),
        [
            "tether_handoffs_failed_total{reason=\"refused\"} 2",
            "tether_handoffs_failed_total{reason=\"unreachable\"} 2"
        ]
    );
    assert_eq!(
        metric(&pod, "tether_handoffs_sent_total"),
        ["tether_handoffs_sent_total 0"]
    );
}

#[tokio::test(start_paused = true)]
async fn the_drain_waits_for_a_call_in_flight_and_ends_once_its_answer_is_forwarded() {
    let (pod, peers, drain) = start(&[]);
    let session = pod.hold("pod-a");
    let call = call(&session);
    let run = tokio::spawn({
        let drain = Arc::clone(&drain);
        async move { drain.run().await }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    let holder = holder(&pod, &session);
    assert_eq!(pod.handoff.following(), 1, "its call still runs here");
    assert!(!run.is_finished());
    answer(&call);
    let outcome = run.await.unwrap();
    assert_eq!(
        (
            outcome.drained,
            outcome.in_flight,
            outcome.handed_off,
            outcome.cut
        ),
        (true, 0, 1, 0),
        "{outcome:?}"
    );
    let answered = Duration::from_secs(5);
    assert!(
        outcome.elapsed >= answered && outcome.elapsed < answered + MESSAGE,
        "ended when the answer reached the new holder: {outcome:?}"
    );
    let tails = peers.sent(TAIL_PATH);
    assert_eq!(tails.len(), 1, "{tails:?}");
    assert_eq!(tails[0].0, holder);
    assert!(tails[0].1.to_string().contains("content"), "{tails:?}");
    assert_eq!(pod.handoff.following(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_call_still_running_at_the_deadline_is_cut_and_its_error_forwarded() {
    let (pod, peers, drain) = start(&[]);
    let session = pod.hold("pod-a");
    let call = call(&session);
    let outcome = drain.run().await;
    assert_eq!(
        (
            outcome.drained,
            outcome.in_flight,
            outcome.handed_off,
            outcome.cut
        ),
        (false, 1, 1, 1),
        "{outcome:?}"
    );
    // The deadline, then the error's way to the new holder (one tail message, within the
    // flush).
    assert!(
        outcome.elapsed >= DEADLINE && outcome.elapsed < DEADLINE + MESSAGE,
        "{outcome:?}"
    );
    assert!(MESSAGE < CUT_FLUSH);
    assert!(call.is_complete());
    let holder = holder(&pod, &session);
    let tails = peers.sent(TAIL_PATH);
    assert_eq!(tails.len(), 1, "{tails:?}");
    assert_eq!(tails[0].0, holder);
    assert!(
        tails[0].1.to_string().contains("drain_deadline"),
        "{tails:?}"
    );
    assert_eq!(pod.handoff.following(), 0);
    assert_eq!(
        metric(&pod, "tether_requests_cut_total"),
        ["tether_requests_cut_total 1"]
    );
}

#[tokio::test(start_paused = true)]
async fn without_handoff_sessions_stay_and_are_served_until_the_deadline() {
    let (pod, peers, drain) = start(&["--handoff=false"]);
    let sessions = [pod.hold("pod-a"), pod.hold("pod-a")];
    let run = tokio::spawn({
        let drain = Arc::clone(&drain);
        async move { drain.run().await }
    });
    tokio::time::sleep(DEADLINE / 2).await;
    assert!(pod.lifecycle.is_draining());
    for session in &sessions {
        assert_eq!(pod.place(session.id()), "held");
        assert!(
            matches!(session.enter(), Entry::Entered(_)),
            "a request of the session is served here"
        );
    }
    assert!(!run.is_finished());
    let outcome = run.await.unwrap();
    assert_eq!(
        (
            outcome.drained,
            outcome.in_flight,
            outcome.handed_off,
            outcome.not_moved,
            outcome.cut
        ),
        (true, 0, 0, 0, 0),
        "{outcome:?}"
    );
    assert_eq!(outcome.elapsed, DEADLINE, "{outcome:?}");
    assert!(peers.sent.lock().is_empty(), "no peer is asked anything");
    for session in &sessions {
        assert_eq!(pod.place(session.id()), "held");
    }
}

#[tokio::test(start_paused = true)]
async fn without_handoff_a_call_still_running_at_the_deadline_is_cut_here() {
    let (pod, peers, drain) = start(&["--handoff=false"]);
    let session = pod.hold("pod-a");
    let call = call(&session);
    let outcome: DrainOutcome = drain.run().await;
    assert_eq!(
        (
            outcome.drained,
            outcome.in_flight,
            outcome.handed_off,
            outcome.not_moved,
            outcome.cut
        ),
        (false, 1, 0, 0, 1),
        "{outcome:?}"
    );
    // Nothing to forward: the flush waits for nothing.
    assert_eq!(outcome.elapsed, DEADLINE, "{outcome:?}");
    assert!(call.is_complete() && call.pending().is_empty());
    assert_eq!(pod.place(session.id()), "held");
    assert!(peers.sent.lock().is_empty());
    assert_eq!(
        metric(&pod, "tether_requests_cut_total"),
        ["tether_requests_cut_total 1"]
    );
}

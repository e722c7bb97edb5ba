//! Component tests of the holder's side, in process: pod `pod-a` ([`fixtures::Pod`]) replicates
//! its sessions through a link that delivers every `POST /v2/replicas` to pod `pod-b`, a sibling
//! with the same key ring; once `pod-a` leaves `pod-b`'s membership, `pod-b` promotes what it
//! kept (`docs/design/replication.md#keeping-a-replica-current`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::json;

use super::Recovered;
use super::send::SCAN_EVERY;
use crate::cluster::membership::fixtures::peer;
use crate::cluster::membership::{PeerState, Snapshot, Source};
use crate::handoff::Handoff;
use crate::handoff::fixtures::{self, Pod};
use crate::mcp::home::HomeToken;
use crate::peer::REPLICAS_PATH;
use crate::peer::client::{Destination, PeerLink, SendError};
use crate::peer::hop::Hop;
use crate::peer::wire::ReplicasPush;
use crate::retained::Kind;
use crate::session::fixtures::{ANY_ROOM, key, stream};
use crate::session::{Dedupe, Session};
use crate::stream::StoredReply;

/// Delivers replicas to pod-b's handoff, whatever pod they are addressed to; records each
/// message with its addressee.
#[derive(Default)]
struct ToPodB {
    b: Mutex<Option<Arc<Handoff>>>,
    sent: Mutex<Vec<(String, ReplicasPush)>>,
    /// The next message is lost (recorded, never delivered).
    lose_next: AtomicBool,
    /// Every message with a drop is lost.
    lose_drops: AtomicBool,
    /// Messages to pod-c are never answered.
    pod_c_hangs: AtomicBool,
}

#[async_trait::async_trait]
impl PeerLink for ToPodB {
    async fn ask(&self, to: Destination<'_>, path: &str, body: Bytes) -> Result<Bytes, SendError> {
        assert_eq!(path, REPLICAS_PATH, "the holder sends only replicas");
        if to.uid == "pod-c" && self.pod_c_hangs.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
        let push: ReplicasPush = serde_json::from_slice(&body).unwrap();
        let lost = self.lose_next.swap(false, Ordering::Relaxed)
            || (self.lose_drops.load(Ordering::Relaxed) && !push.drops.is_empty());
        let b = self.b.lock().clone().unwrap();
        let answer = (!lost).then(|| b.keep_replicas(push.clone()));
        self.sent.lock().push((to.uid.to_owned(), push));
        match answer {
            Some(answer) => Ok(Bytes::from(serde_json::to_vec(&answer).unwrap())),
            None => Err(SendError::Unreachable("lost".into())),
        }
    }
}

/// A pod whose messages reach nobody.
struct Nowhere;

#[async_trait::async_trait]
impl PeerLink for Nowhere {
    async fn ask(&self, _: Destination<'_>, _: &str, _: Bytes) -> Result<Bytes, SendError> {
        Err(SendError::Unreachable("nowhere".into()))
    }
}

fn start() -> (Pod, Pod, Arc<ToPodB>) {
    let link = Arc::new(ToPodB::default());
    let a = Pod::start(
        fixtures::REPLICATED,
        &[],
        Arc::clone(&link) as Arc<dyn PeerLink>,
    );
    let b = a.sibling("pod-b", Arc::new(Nowhere));
    *link.b.lock() = Some(Arc::clone(&b.handoff));
    (a, b, link)
}

/// The messages sent since the last call: (addressee, sessions sent, sessions dropped).
fn sent(link: &ToPodB) -> Vec<(String, Vec<String>, Vec<String>)> {
    messages(link)
        .into_iter()
        .map(|(to, push)| {
            let sent = push.replicas.iter().map(|u| u.image.id.clone()).collect();
            let drops = push.drops.iter().map(|d| d.session.clone()).collect();
            (to, sent, drops)
        })
        .collect()
}

/// The messages sent since the last call, with their addressees.
fn messages(link: &ToPodB) -> Vec<(String, ReplicasPush)> {
    link.sent.lock().drain(..).collect()
}

/// Pod-a leaves pod-b's membership, and a request for session `id` (homed on pod-a) arrives at
/// pod-b: pod-b promotes the replica it kept; the session it now holds.
async fn promoted_at(b: &Pod, id: &str) -> Arc<Session> {
    let snapshot = Snapshot {
        peers: ["pod-b", "pod-c"]
            .iter()
            .map(|uid| peer(uid, PeerState::Routable))
            .collect(),
    };
    assert!(b.sink.publish(Source::Kubernetes, snapshot));
    let home = HomeToken::for_pod("pod-a");
    assert!(matches!(
        b.handoff.recover(id, home, &Hop::default()).await,
        Recovered::Held
    ));
    b.broker.held(id).unwrap()
}

/// A request `id` of `session` that ran, sent two progress events and, when `answered`, its
/// answer.
fn request(session: &Session, id: i64, answered: bool) {
    let s = stream(session, &[key(id)]);
    assert!(matches!(
        session.claim(&[key(id)], [id as u8; 32], &s, ANY_ROOM),
        Dedupe::New
    ));
    let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": id, "progress": 1}});
    for _ in 0..2 {
        s.append(None, Bytes::from(progress.to_string()), Instant::now());
    }
    if answered {
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"n": id}});
        s.append(None, Bytes::from(answer.to_string()), Instant::now());
    }
}

#[tokio::test]
async fn a_session_is_replicated_when_it_changes_and_promoted_at_its_replica_pod() {
    let (a, b, link) = start();
    let session = a.hold("pod-a");
    let id = session.id().to_owned();
    request(&session, 1, true);
    request(&session, 2, false);

    a.handoff.replicate().await;
    let first = messages(&link);
    assert_eq!(first.len(), 1, "one message to the replica pod: {first:?}");
    let (to, push) = &first[0];
    assert!(to == "pod-b" || to == "pod-c", "never the holder: {to}");
    let [whole] = &push.replicas[..] else {
        panic!("one replica: {push:?}")
    };
    assert_eq!((whole.image.id.as_str(), whole.base), (id.as_str(), None));
    assert_eq!(
        (whole.image.streams.len(), whole.image.requests.len()),
        (2, 2),
        "sent whole"
    );

    // Nothing changed that the replica carries: nothing is sent, not for progress either.
    let running = session.stream_of_request(&key(2)).unwrap();
    let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": 2, "progress": 2}});
    running.append(None, Bytes::from(progress.to_string()), Instant::now());
    a.handoff.replicate().await;
    assert!(sent(&link).is_empty(), "a progress event sends nothing");

    // A new request changes it: the change carries that request's stream and record alone.
    request(&session, 3, true);
    a.handoff.replicate().await;
    let second = messages(&link);
    let [change] = &second[0].1.replicas[..] else {
        panic!("one replica: {second:?}")
    };
    assert_eq!(change.base, Some(whole.mark), "a change of the copy kept");
    let new = session.stream_of_request(&key(3)).unwrap();
    assert_eq!(
        change
            .image
            .streams
            .iter()
            .map(|s| &s.key)
            .collect::<Vec<_>>(),
        [new.key()]
    );
    assert_eq!(change.image.requests.len(), 1);
    assert!(change.forgotten_streams.is_empty() && change.forgotten_requests.is_empty());
    assert!(a.encode().contains("tether_sessions_unreplicated 0"));
    assert!(
        a.encode()
            .contains("tether_replicas_sent_total{outcome=\"kept\"} 2")
    );

    // Pod-a is lost: pod-b promotes what it kept — the answers of finished requests replay,
    // the running request ends with `holder_lost`, a retry of an answered one is no new
    // dispatch.
    let promoted = promoted_at(&b, &id).await;
    assert_eq!(promoted.epoch(), session.epoch() + 1);
    assert!(
        !promoted.is_new(&[key(1)], [1; 32]),
        "a retry of an answered request is not dispatched again"
    );
    assert!(!promoted.is_new(&[key(3)], [3; 32]));
    let answered = promoted.stream_of_request(&key(1)).unwrap();
    assert!(answered.is_complete());
    let lost = promoted.stream_of_request(&key(2)).unwrap();
    assert!(lost.is_complete(), "the running request ended: {lost:?}");
}

#[tokio::test]
async fn a_session_moved_away_has_its_replica_dropped_once() {
    let (a, _b, link) = start();
    let session = a.hold("pod-a");
    let id = session.id().to_owned();
    a.handoff.replicate().await;
    let (to, _, _) = sent(&link).remove(0);
    a.broker.mark_moved(&session, "pod-c");
    a.handoff.replicate().await;
    assert_eq!(sent(&link), [(to, vec![], vec![id])]);
    a.handoff.replicate().await;
    assert!(sent(&link).is_empty(), "dropped once");
}

#[tokio::test]
async fn a_change_forgets_what_the_holder_forgot_and_after_a_lost_one_the_session_goes_whole() {
    let (a, b, link) = start();
    let session = a.hold("pod-a");
    let id = session.id().to_owned();
    request(&session, 1, false);
    a.handoff.replicate().await;
    assert_eq!(messages(&link)[0].1.replicas[0].base, None);

    // The request is withdrawn (the MCP server never carried it out): its record goes, its
    // stream says so.
    let withdrawn = session.stream_of_request(&key(1)).unwrap();
    let refused = StoredReply {
        status: http::StatusCode::UNAUTHORIZED,
        headers: http::HeaderMap::new(),
        body: Bytes::new(),
    };
    session.withdraw_post(&withdrawn, refused, u64::MAX);
    a.handoff.replicate().await;
    let change = messages(&link).remove(0).1.replicas.remove(0);
    assert!(change.base.is_some());
    assert_eq!(change.forgotten_requests, [key(1)]);
    assert_eq!(
        change.image.streams.len(),
        1,
        "the withdrawn stream, changed"
    );
    assert!(change.image.requests.is_empty());

    // A change that is lost: the next send is the session whole, once the pause is over.
    request(&session, 2, true);
    link.lose_next.store(true, Ordering::Relaxed);
    a.handoff.replicate().await;
    assert!(messages(&link)[0].1.replicas[0].base.is_some());
    tokio::time::sleep(Duration::from_millis(60)).await;
    a.handoff.replicate().await;
    let whole = messages(&link).remove(0).1.replicas.remove(0);
    assert_eq!(whole.base, None);
    assert_eq!(
        (whole.image.streams.len(), whole.image.requests.len()),
        (2, 1)
    );

    // Pod-b's copy is the holder's: request 2 is answered from it, request 1 may run again.
    let promoted = promoted_at(&b, &id).await;
    assert!(!promoted.is_new(&[key(2)], [2; 32]));
    assert!(
        promoted.is_new(&[key(1)], [1; 32]),
        "withdrawn: never carried out"
    );
}

#[tokio::test]
async fn a_replica_pod_that_restarted_gets_every_replica_again_whole() {
    let (a, _b, link) = start();
    let session = a.hold("pod-a");
    let id = session.id().to_owned();
    request(&session, 1, true);
    a.handoff.replicate().await;
    assert_eq!(messages(&link).len(), 1);

    // Pod-b's sidecar restarts: its replica store is empty, of another incarnation.
    let restarted = a.sibling("pod-b", Arc::new(Nowhere));
    *link.b.lock() = Some(Arc::clone(&restarted.handoff));
    for _ in 1..SCAN_EVERY {
        a.handoff.replicate().await;
    }
    assert!(messages(&link).is_empty(), "nothing changed, no scan yet");
    // The scan's message, empty, gets an answer from the new store; the next round places the
    // session there again, whole.
    a.handoff.replicate().await;
    let scan = messages(&link);
    assert_eq!(scan.len(), 1);
    assert!(scan[0].1.replicas.is_empty() && scan[0].1.drops.is_empty());
    a.handoff.replicate().await;
    let again = messages(&link);
    let [whole] = &again[0].1.replicas[..] else {
        panic!("the session again: {again:?}")
    };
    assert_eq!((whole.image.id.as_str(), whole.base), (id.as_str(), None));
    assert_eq!(
        restarted.handoff.replica_holder(&id).as_deref(),
        Some("pod-a")
    );
}

#[tokio::test]
async fn a_session_that_ended_here_is_dropped_at_its_replica_pod_until_it_answers() {
    let (a, b, link) = start();
    let session = a.hold("pod-a");
    let id = session.id().to_owned();
    a.handoff.replicate().await;
    let (to, _, _) = sent(&link).remove(0);
    assert_eq!(b.handoff.replica_holder(&id).as_deref(), Some("pod-a"));

    // The session ends here (idle); the message with its drop is lost.
    a.broker
        .sweep(Instant::now() + a.broker.cfg().idle_timeout * 2);
    assert_eq!(
        a.place(&id),
        "ended: expired",
        "answered 404 here, never walked on"
    );
    link.lose_next.store(true, Ordering::Relaxed);
    a.handoff.replicate().await;
    assert_eq!(sent(&link)[0].2, [id.as_str()]);
    assert_eq!(b.handoff.replica_holder(&id).as_deref(), Some("pod-a"));
    let counted = |pod: &Pod| pod.broker.retained().bytes(Kind::Replicas);
    assert!(counted(&a) > 0, "the drop still to send is counted");

    // The next round sends it again; once answered it is not sent any more.
    a.handoff.replicate().await;
    assert_eq!(sent(&link), [(to, vec![], vec![id.clone()])]);
    assert_eq!(b.handoff.replica_holder(&id), None);
    assert_eq!(counted(&a), 0);
    a.handoff.replicate().await;
    assert!(sent(&link).is_empty(), "dropped once acknowledged");
}

/// Waits, in a task, for the records of `requests` of `session` to be kept at pod-a's replica
/// pod, and runs the round the wait asks for (`ticked`: the interval's round comes first);
/// how the wait ended.
async fn write_ahead(a: &Pod, session: &Arc<Session>, requests: &[i64], ticked: bool) -> String {
    let wait = tokio::spawn({
        let handoff = Arc::clone(&a.handoff);
        let session = Arc::clone(session);
        let requests: Vec<_> = requests.iter().map(|&r| key(r)).collect();
        async move { handoff.written(&session, &requests).await }
    });
    tokio::time::timeout(Duration::from_secs(1), a.handoff.round_wanted())
        .await
        .expect("the wait asks for a round at once");
    a.handoff.replicate_round(ticked).await;
    wait.await.unwrap();
    let text = a.encode();
    let line = text
        .lines()
        .find(|l| l.starts_with("tether_write_ahead_total{"))
        .expect("one wait counted");
    line.split('"').nth(1).unwrap().to_owned()
}

#[tokio::test]
async fn a_request_waits_until_its_record_is_kept_and_is_then_never_dispatched_again() {
    let (a, b, link) = start();
    let session = a.hold("pod-a");
    let id = session.id().to_owned();
    a.handoff.replicate().await;
    messages(&link);

    // Request 1 is about to be dispatched: its record goes first, in a round of its own.
    request(&session, 1, false);
    assert_eq!(write_ahead(&a, &session, &[1], false).await, "written");
    let [change] = &messages(&link)[0].1.replicas[..] else {
        panic!("one change")
    };
    assert_eq!(
        (change.image.streams.len(), change.image.requests.len()),
        (1, 1),
        "its stream and record alone"
    );
    assert_eq!(
        change.base,
        Some(change.mark),
        "added to the copy, whose mark stays"
    );

    // The interval's round then finds nothing new to send of it.
    request(&session, 2, false);
    a.handoff.replicate().await;
    let [next] = &messages(&link)[0].1.replicas[..] else {
        panic!("one change")
    };
    assert_eq!(next.image.requests.len(), 1, "request 2's record alone");

    // Pod-a is lost while request 1 runs: its retry is no new request at pod-b.
    let promoted = promoted_at(&b, &id).await;
    assert!(
        !promoted.is_new(&[key(1)], [1; 32]),
        "never dispatched again"
    );
}

#[tokio::test]
async fn a_request_whose_record_is_not_kept_is_dispatched_after_the_round() {
    let (a, _b, link) = start();
    let session = a.hold("pod-a");
    request(&session, 1, false);
    link.lose_next.store(true, Ordering::Relaxed);
    assert_eq!(write_ahead(&a, &session, &[1], false).await, "unwritten");
}

/// Pod-a's membership: pod-a and pod-c routable, pod-b as `b` (as it may be already).
fn pod_b_is(a: &Pod, b: PeerState) {
    let snapshot = Snapshot {
        peers: vec![
            peer("pod-a", PeerState::Routable),
            peer("pod-b", b),
            peer("pod-c", PeerState::Routable),
        ],
    };
    a.sink.publish(Source::Kubernetes, snapshot);
}

/// A session held by pod-a whose replica pod is `pod`.
fn replicated_at(a: &Pod, pod: &str) -> Arc<Session> {
    (0..)
        .map(|_| a.hold("pod-a"))
        .find(|s| {
            let view = a.handoff.router.view();
            super::decide::replica_pod(&view, s.id(), "pod-a").is_some_and(|p| p.uid == pod)
        })
        .unwrap()
}

#[tokio::test]
async fn a_copy_sent_again_to_a_pod_is_not_dropped_by_an_earlier_drop_it_did_not_answer() {
    let (a, _b, link) = start();
    pod_b_is(&a, PeerState::Routable);
    let session = replicated_at(&a, "pod-b");
    let id = session.id().to_owned();
    a.handoff.replicate().await;
    messages(&link);

    // Pod-b drains: the replica goes to pod-c, and pod-b's drop is lost.
    pod_b_is(&a, PeerState::Draining);
    link.lose_drops.store(true, Ordering::Relaxed);
    a.handoff.replicate().await;
    let moved = sent(&link);
    assert!(
        moved.contains(&("pod-b".to_owned(), vec![], vec![id.clone()])),
        "{moved:?}"
    );

    // Pod-b is routable again: it gets the session whole, and the drop it did not answer no
    // longer goes with it.
    link.lose_drops.store(false, Ordering::Relaxed);
    pod_b_is(&a, PeerState::Routable);
    a.handoff.replicate().await;
    let back = sent(&link);
    assert!(
        back.contains(&("pod-b".to_owned(), vec![id.clone()], vec![])),
        "{back:?}"
    );
}

#[tokio::test]
async fn a_reused_request_id_has_its_new_record_replicated_before_its_wait_ends() {
    let (a, b, link) = start();
    let session = a.hold("pod-a");
    let id = session.id().to_owned();
    request(&session, 1, true);
    a.handoff.replicate().await;
    messages(&link);

    // The client sends id 1 again with another body, once the first was answered: a new
    // request under the same id, whose record replaces the first one's.
    let again = stream(&session, &[key(1)]);
    assert!(matches!(
        session.claim(&[key(1)], [9; 32], &again, ANY_ROOM),
        Dedupe::Reused
    ));
    // The interval's round comes first: it sends the new record, and only then is it written.
    assert_eq!(write_ahead(&a, &session, &[1], true).await, "written");
    let promoted = promoted_at(&b, &id).await;
    assert!(
        !promoted.is_new(&[key(1)], [9; 32]),
        "a retry of the new request is not dispatched again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_pod_that_does_not_answer_holds_up_no_request_waiting_for_another() {
    let (a, _b, link) = start();
    pod_b_is(&a, PeerState::Routable);
    let at_b = replicated_at(&a, "pod-b");
    let at_c = replicated_at(&a, "pod-c");
    a.handoff.replicate().await;
    request(&at_b, 1, false);
    request(&at_c, 1, false);
    link.pod_c_hangs.store(true, Ordering::Relaxed);
    let wait = |session: &Arc<Session>| {
        let handoff = Arc::clone(&a.handoff);
        let session = Arc::clone(session);
        tokio::spawn(async move { handoff.written(&session, &[key(1)]).await })
    };
    let (for_b, for_c) = (wait(&at_b), wait(&at_c));
    while a.handoff.replicating.lock().waiting.wanted().len() < 2 {
        tokio::task::yield_now().await;
    }
    a.handoff.round_wanted().await;
    let round = tokio::spawn({
        let handoff = Arc::clone(&a.handoff);
        async move { handoff.replicate_round(false).await }
    });
    for_b.await.unwrap();
    assert!(
        !round.is_finished() && !for_c.is_finished(),
        "pod-b's answer released its waiter while pod-c's is still awaited"
    );
    assert!(
        a.encode()
            .contains("tether_write_ahead_total{outcome=\"written\"} 1")
    );
    round.abort();
    for_c.abort();
}

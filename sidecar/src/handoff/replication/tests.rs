//! Component tests of the replica pod's side, in process: pod `pod-a` ([`fixtures::Pod`]: a real
//! broker, router and [`Handoff`]) keeps replicas `pod-b` sends, promotes one once `pod-b`
//! leaves membership, hands one back, and claims its own back from a scripted replica pod
//! (`docs/design/replication.md#promotion`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::json;

use super::Recovered;
use crate::cluster::membership::fixtures::peer;
use crate::cluster::membership::{PeerState, Snapshot, Source};
use crate::handoff::fixtures::{self, Pod};
use crate::mcp::cursor::StreamKey;
use crate::mcp::home::HomeToken;
use crate::mcp::jsonrpc::RequestKey;
use crate::peer::CLAIM_PATH;
use crate::peer::client::{Destination, PeerLink, SendError};
use crate::peer::hop::Hop;
use crate::peer::wire::{
    ClaimAnswer, ClaimQuery, JournalImage, KindImage, ReplicaOutcome, ReplicaUpdate, ReplicasPush,
    RequestImage, SessionImage, StreamImage,
};
use crate::stream::{FeedItem, Start};

/// A replica pod as a script: the answers to claims, in order; every claim is recorded.
#[derive(Debug, Default)]
struct ReplicaPod {
    answers: Mutex<VecDeque<Result<ClaimAnswer, SendError>>>,
    claims: Mutex<Vec<(String, String)>>,
}

#[async_trait::async_trait]
impl PeerLink for ReplicaPod {
    async fn ask(&self, to: Destination<'_>, path: &str, body: Bytes) -> Result<Bytes, SendError> {
        assert_eq!(path, CLAIM_PATH, "only claims are sent");
        let query: ClaimQuery = serde_json::from_slice(&body).unwrap();
        self.claims
            .lock()
            .push((to.uid.to_owned(), query.session.clone()));
        let answer = self.answers.lock().pop_front().unwrap_or(Ok(ClaimAnswer {
            session: None,
            held: false,
        }))?;
        Ok(Bytes::from(serde_json::to_vec(&answer).unwrap()))
    }
}

fn start() -> (Pod, Arc<ReplicaPod>) {
    let replica_pod = Arc::new(ReplicaPod::default());
    let pod = Pod::start(
        fixtures::REPLICATED,
        &[],
        Arc::clone(&replica_pod) as Arc<dyn PeerLink>,
    );
    (pod, replica_pod)
}

/// The image of session `id` at `epoch` with one answered request (id 1) and one running
/// (id 7, three events numbered so far).
fn image(id: &str, epoch: u64) -> SessionImage {
    let (answered, running) = (StreamKey::random(), StreamKey::random());
    let stream = |key: &StreamKey, pending: Vec<RequestKey>, complete| StreamImage {
        key: key.clone(),
        kind: KindImage::Post,
        pending,
        complete,
        stored: None,
        sse: Some(vec![("content-type".into(), "text/event-stream".into())]),
        last_seq: 3,
        evicted_through: 3,
        events: vec![],
        withdrawn: false,
    };
    let record = |n: i64, key: &StreamKey| RequestImage {
        id: RequestKey::of(&json!(n)),
        digest: "00".repeat(32),
        stream: key.clone(),
    };
    SessionImage {
        id: id.into(),
        version: "2025-11-25".into(),
        journal: JournalImage {
            initialize: json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}),
            initialized: true,
            log_level: None,
            subscriptions: BTreeMap::new(),
        },
        requests: vec![record(1, &answered), record(7, &running)],
        streams: vec![
            stream(&answered, vec![], true),
            stream(&running, vec![RequestKey::of(&json!(7))], false),
        ],
        standalone_unsupported: None,
        credentialed: true,
        binding: None,
        accepted: vec![],
        epoch,
        tombstones: None,
    }
}

fn keep(pod: &Pod, from: &str, image: SessionImage) -> Vec<ReplicaOutcome> {
    let push = ReplicasPush {
        from: from.into(),
        replicas: vec![ReplicaUpdate {
            mark: 0,
            base: None,
            image,
            forgotten_streams: vec![],
            forgotten_requests: vec![],
        }],
        drops: vec![],
    };
    pod.handoff.keep_replicas(push).results
}

fn through(uid: &str) -> Hop {
    Hop {
        count: 1,
        visited: vec![uid.into()],
    }
}

fn publish(pod: &Pod, uids: &[&str]) {
    let snapshot = Snapshot {
        peers: uids.iter().map(|u| peer(u, PeerState::Routable)).collect(),
    };
    assert!(pod.sink.publish(Source::Kubernetes, snapshot));
}

fn taken_over(pod: &Pod) -> Vec<String> {
    pod.encode()
        .lines()
        .filter(|l| l.starts_with("tether_replicas_taken_over_total{"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_replica_is_promoted_only_once_its_holder_left_membership() {
    let (pod, replica_pod) = start();
    let (id, _) = pod.mint("pod-b");
    let home = HomeToken::for_pod("pod-b");
    assert_eq!(keep(&pod, "pod-b", image(&id, 2)), [ReplicaOutcome::Kept]);
    assert!(pod.broker.retained().bytes(crate::retained::Kind::Replicas) > 0);
    // The holder is alive: its requests go to it; one that passed it finds it lost, maybe.
    assert!(matches!(
        pod.handoff.recover(&id, home, &Hop::default()).await,
        Recovered::Route
    ));
    assert!(matches!(
        pod.handoff.recover(&id, home, &through("pod-b")).await,
        Recovered::Unavailable
    ));
    assert_eq!(pod.place(&id), "absent");
    // Membership lets it go: the next request promotes the replica.
    publish(&pod, &["pod-a", "pod-c"]);
    assert!(matches!(
        pod.handoff.recover(&id, home, &Hop::default()).await,
        Recovered::Held
    ));
    assert_eq!(pod.place(&id), "held");
    let session = pod.broker.held(&id).unwrap();
    assert_eq!(session.epoch(), 3, "the replica's epoch plus one");
    assert_eq!(
        taken_over(&pod),
        ["tether_replicas_taken_over_total{how=\"promoted\"} 1"]
    );
    assert!(replica_pod.claims.lock().is_empty(), "nothing to claim");
    // The request that ran on the lost holder ends with `holder_lost`, numbered past anything
    // the holder may have sent, so a client resuming from its last event gets it.
    let running = session
        .streams()
        .into_iter()
        .find(|s| s.last_seq() > 3)
        .expect("the running stream, numbered past the holder's events");
    assert!(running.is_complete());
    let mut feed = running.attach(Start::After(3), true, false, Duration::from_secs(10));
    let FeedItem::Data(event) = feed.next().await else {
        panic!("no event")
    };
    let event = String::from_utf8(event.to_vec()).unwrap();
    assert!(
        event.contains("holder_lost") && event.contains("\"id\":7"),
        "{event}"
    );
    // The holder's late replica of the same epoch is stale here now.
    assert_eq!(
        keep(&pod, "pod-b", image(&id, 2)),
        [ReplicaOutcome::StaleEpoch]
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarted_holder_claims_its_session_back_or_forwards_to_where_it_was_promoted() {
    let (pod, replica_pod) = start();
    let home = HomeToken::for_pod("pod-a");
    // Claimed back: held here at the replica's epoch plus one.
    let (id, _) = pod.mint("pod-a");
    replica_pod.answers.lock().push_back(Ok(ClaimAnswer {
        session: Some(image(&id, 4)),
        held: false,
    }));
    assert!(matches!(
        pod.handoff.recover(&id, home, &Hop::default()).await,
        Recovered::Held
    ));
    assert_eq!(pod.broker.held(&id).unwrap().epoch(), 5);
    assert_eq!(
        taken_over(&pod),
        ["tether_replicas_taken_over_total{how=\"claimed\"} 1"]
    );
    // Promoted at the replica pod meanwhile: forwarded there.
    let (promoted, _) = pod.mint("pod-a");
    replica_pod.answers.lock().push_back(Ok(ClaimAnswer {
        session: None,
        held: true,
    }));
    let Recovered::At(at) = pod.handoff.recover(&promoted, home, &Hop::default()).await else {
        panic!("not forwarded")
    };
    // No replica, or no answer: routed as before (a session nobody holds is 404).
    let (unknown, _) = pod.mint("pod-a");
    assert!(matches!(
        pod.handoff.recover(&unknown, home, &Hop::default()).await,
        Recovered::Route
    ));
    replica_pod
        .answers
        .lock()
        .push_back(Err(SendError::Unreachable("connection refused".into())));
    assert!(matches!(
        pod.handoff.recover(&unknown, home, &Hop::default()).await,
        Recovered::Route
    ));
    // Each claim without an answer asks the other pod of the walk too (the replica may have
    // been placed in a view without this pod).
    let claims = replica_pod.claims.lock().clone();
    assert_eq!(claims.len(), 6, "{claims:?}");
    assert!(
        claims.iter().all(|(to, _)| to != "pod-a"),
        "never itself: {claims:?}"
    );
    assert_eq!(claims[1], (at.uid.clone(), promoted));
    assert_eq!(pod.place(&unknown), "absent");
}

#[tokio::test(start_paused = true)]
async fn a_replica_is_handed_back_once_and_only_to_its_holder() {
    let (pod, _) = start();
    let (id, _) = pod.mint("pod-b");
    keep(&pod, "pod-b", image(&id, 1));
    let claim = |from: &str| {
        pod.handoff.hand_back(&ClaimQuery {
            from: from.into(),
            session: id.clone(),
        })
    };
    let nothing = ClaimAnswer {
        session: None,
        held: false,
    };
    assert_eq!(
        claim("pod-c"),
        nothing,
        "not pod-c's while its holder lives"
    );
    assert_eq!(claim("pod-b").session.map(|s| s.epoch), Some(1));
    assert_eq!(claim("pod-b"), nothing, "handed back once");
    // Its holder gone, another pod's claim (the session's new owner) promotes it here.
    let (lost, _) = pod.mint("pod-b");
    keep(&pod, "pod-b", image(&lost, 4));
    publish(&pod, &["pod-a", "pod-c"]);
    let answer = pod.handoff.hand_back(&ClaimQuery {
        from: "pod-c".into(),
        session: lost.clone(),
    });
    assert!(answer.held && answer.session.is_none(), "{answer:?}");
    assert_eq!(pod.broker.held(&lost).unwrap().epoch(), 5);
    // A session held here is said to be.
    let held = pod.hold("pod-b");
    let answer = pod.handoff.hand_back(&ClaimQuery {
        from: "pod-b".into(),
        session: held.id().to_owned(),
    });
    assert!(answer.held && answer.session.is_none());
}

#[tokio::test(start_paused = true)]
async fn replicas_are_refused_while_draining_for_forged_ids_from_strangers_and_when_held_here() {
    let (pod, _) = start();
    let mut forged = image("not-a-session-id", 0);
    assert_eq!(
        keep(&pod, "pod-b", forged.clone()),
        [ReplicaOutcome::Invalid]
    );
    let (id, _) = pod.mint("pod-b");
    forged.id = id;
    assert_eq!(
        keep(&pod, "pod-x", forged.clone()),
        [ReplicaOutcome::NotMember],
        "a holder this pod does not know"
    );
    pod.lifecycle.start_draining();
    assert_eq!(keep(&pod, "pod-b", forged), [ReplicaOutcome::Draining]);
    // A session held here: the sender's copy is stale — unless this pod is moving it to the
    // sender, which adopted it and replicates it before the move is acknowledged here.
    let held = pod.hold("pod-a");
    let mut copy = image(held.id(), held.epoch());
    assert_eq!(
        keep(&pod, "pod-b", copy.clone()),
        [ReplicaOutcome::StaleEpoch]
    );
    let transfer = held.begin_move().unwrap();
    copy.epoch = held.advance_epoch();
    assert_eq!(keep(&pod, "pod-b", copy), [ReplicaOutcome::Draining]);
    drop(transfer);
    assert_eq!(
        pod.broker.retained().bytes(crate::retained::Kind::Replicas),
        0
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_requests_of_a_restarted_holder_claim_their_session_once() {
    let (pod, replica_pod) = start();
    let home = HomeToken::for_pod("pod-a");
    let (id, _) = pod.mint("pod-a");
    // The replica pod hands the session back once; a second claim would find nothing.
    replica_pod.answers.lock().push_back(Ok(ClaimAnswer {
        session: Some(image(&id, 2)),
        held: false,
    }));
    let hop = Hop::default();
    let (first, second) = tokio::join!(
        pod.handoff.recover(&id, home, &hop),
        pod.handoff.recover(&id, home, &hop)
    );
    assert!(matches!(first, Recovered::Held), "{first:?}");
    assert!(matches!(second, Recovered::Held), "{second:?}, never 404");
    assert_eq!(replica_pod.claims.lock().len(), 1, "claimed once");
    assert_eq!(pod.broker.held(&id).unwrap().epoch(), 3);
}

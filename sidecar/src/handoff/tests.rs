//! Component tests of the mover, in process: a real broker, router and [`Handoff`], and a
//! scripted [`PeerLink`] in place of the peers, on paused tokio time. Each test follows one
//! session through `move_session` as a draining pod would, and checks where it ends up, at
//! which epoch each candidate was asked, and what the metrics say
//! (`docs/design/handoff.md#one-holder-per-session`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use parking_lot::Mutex;

use super::{MoveError, fixtures};
use crate::cluster::membership::fixtures::peer;
use crate::cluster::membership::{PeerState, Snapshot, Source};
use crate::peer::client::{Destination, PeerLink, SendError};
use crate::peer::wire::{HeldAnswer, HeldQuery, SessionPush};
use crate::peer::{HELD_PATH, SESSIONS_PATH};
use crate::session::Session;

/// What the fake answers one message with.
#[derive(Debug)]
enum Answer {
    /// An acknowledged 2xx, with this body.
    Ack(Bytes),
    /// A failure.
    Fail(SendError),
}

/// Peers as a script: per peer UID and path, the answers to give in order (an acknowledged
/// empty 2xx once a script runs out, and for every other path); every message is recorded.
#[derive(Debug, Default)]
struct Peers {
    script: Mutex<HashMap<(String, &'static str), VecDeque<Answer>>>,
    /// Every push: the peer and the epoch it carried.
    pushes: Mutex<Vec<(String, u64)>>,
    /// Every question whether a push was taken: the peer and the epoch asked about.
    questions: Mutex<Vec<(String, u64)>>,
}

impl Peers {
    fn answer(&self, uid: &str, path: &'static str, answers: impl IntoIterator<Item = Answer>) {
        self.script
            .lock()
            .entry((uid.to_owned(), path))
            .or_default()
            .extend(answers);
    }

    fn pushes(&self) -> Vec<(String, u64)> {
        self.pushes.lock().clone()
    }

    fn questions(&self) -> Vec<(String, u64)> {
        self.questions.lock().clone()
    }
}

#[async_trait::async_trait]
impl PeerLink for Peers {
    async fn ask(&self, to: Destination<'_>, path: &str, body: Bytes) -> Result<Bytes, SendError> {
        let path: &'static str = match path {
            SESSIONS_PATH => {
                let push: SessionPush = serde_json::from_slice(&body).unwrap();
                self.pushes
                    .lock()
                    .push((to.uid.to_owned(), push.session.epoch));
                SESSIONS_PATH
            }
            HELD_PATH => {
                let query: HeldQuery = serde_json::from_slice(&body).unwrap();
                self.questions.lock().push((to.uid.to_owned(), query.epoch));
                HELD_PATH
            }
            _ => return Ok(Bytes::new()),
        };
        // A message takes a moment, as on a network.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let next = self
            .script
            .lock()
            .get_mut(&(to.uid.to_owned(), path))
            .and_then(VecDeque::pop_front);
        match next {
            Some(Answer::Ack(body)) => Ok(body),
            Some(Answer::Fail(e)) => Err(e),
            None => Ok(Bytes::new()),
        }
    }
}

fn lost() -> Answer {
    Answer::Fail(SendError::Lost("no answer".into()))
}

fn unreachable() -> Answer {
    Answer::Fail(SendError::Unreachable("connection refused".into()))
}

fn refused(status: StatusCode, reason: &str) -> Answer {
    Answer::Fail(SendError::Refused {
        status,
        reason: format!(r#"{{"error":"refused","reason":"{reason}"}}"#),
    })
}

fn held(held: bool) -> Answer {
    Answer::Ack(Bytes::from(
        serde_json::to_vec(&HeldAnswer { held }).unwrap(),
    ))
}

/// Pod `pod-a` (this one) with routable peers `pod-b` and `pod-c` ([`fixtures::Pod`]), a
/// session held here, and the scripted peers.
struct Pod {
    pod: fixtures::Pod,
    peers: Arc<Peers>,
    session: Arc<Session>,
}

impl std::ops::Deref for Pod {
    type Target = fixtures::Pod;

    fn deref(&self) -> &fixtures::Pod {
        &self.pod
    }
}

impl Pod {
    fn start() -> Self {
        let peers = Arc::new(Peers::default());
        let pod = fixtures::Pod::start(
            fixtures::ENDPOINT,
            &[],
            Arc::clone(&peers) as Arc<dyn PeerLink>,
        );
        // A session that came from a pod that is gone, with credentials (its rebuild waits for
        // its next request: nothing here talks to an MCP server).
        let session = pod.hold("pod-z");
        let mut credentials = HeaderMap::new();
        credentials.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        session.remember_credentials(&credentials, &[header::AUTHORIZATION]);
        Self {
            pod,
            peers,
            session,
        }
    }

    /// The candidates of the session, best first (the ring decides which of b and c).
    fn candidates(&self) -> (String, String) {
        let c = self.handoff.candidates(self.session.id());
        assert_eq!(c.len(), 2, "{c:?}");
        (c[0].uid.clone(), c[1].uid.clone())
    }

    async fn move_session(&self) -> Result<String, MoveError> {
        self.handoff
            .move_session(Arc::clone(&self.session), None)
            .await
    }

    /// Where the session is, as a request for it would find it.
    fn here(&self) -> String {
        self.place(self.session.id())
    }

    /// `tether_handoffs_failed_total` by reason.
    fn failed(&self) -> Vec<String> {
        self.encode()
            .lines()
            .filter(|l| l.starts_with("tether_handoffs_failed_total{"))
            .map(str::to_owned)
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn an_acknowledged_push_moves_the_session() {
    let pod = Pod::start();
    let (first, _) = pod.candidates();
    assert_eq!(pod.move_session().await.unwrap(), first);
    assert_eq!(pod.peers.pushes(), [(first.clone(), 1)]);
    assert_eq!(pod.here(), format!("moved to {first}"));
    assert!(pod.failed().is_empty(), "{:?}", pod.failed());
}

#[tokio::test(start_paused = true)]
async fn a_refused_push_goes_to_the_next_candidate_at_a_later_epoch() {
    let pod = Pod::start();
    let (first, second) = pod.candidates();
    pod.peers.answer(
        &first,
        SESSIONS_PATH,
        [refused(StatusCode::FORBIDDEN, "forged")],
    );
    assert_eq!(pod.move_session().await.unwrap(), second);
    assert_eq!(pod.peers.pushes(), [(first, 1), (second.clone(), 2)]);
    assert!(
        pod.peers.questions().is_empty(),
        "a refusal is not in doubt"
    );
    assert_eq!(pod.here(), format!("moved to {second}"));
    assert_eq!(
        pod.failed(),
        ["tether_handoffs_failed_total{reason=\"refused\"} 1"]
    );
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_candidate_is_tried_three_times_then_the_next() {
    let pod = Pod::start();
    let (first, second) = pod.candidates();
    pod.peers.answer(
        &first,
        SESSIONS_PATH,
        [unreachable(), unreachable(), unreachable()],
    );
    let started = tokio::time::Instant::now();
    assert_eq!(pod.move_session().await.unwrap(), second);
    // 50 ms and 250 ms between the attempts (and a millisecond per message).
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        pod.peers.pushes(),
        [
            (first.clone(), 1),
            (first.clone(), 1),
            (first.clone(), 1),
            (second, 2)
        ]
    );
    assert!(
        pod.handoff
            .router
            .health()
            .down(&first, Instant::now())
            .is_some(),
        "the unreachable candidate is marked down"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_then_confirmed_counts_as_taken() {
    let pod = Pod::start();
    let (first, _) = pod.candidates();
    pod.peers
        .answer(&first, SESSIONS_PATH, [lost(), lost(), lost()]);
    pod.peers.answer(&first, HELD_PATH, [lost(), held(true)]);
    assert_eq!(pod.move_session().await.unwrap(), first);
    assert_eq!(pod.peers.pushes().len(), 3, "retried at the same epoch");
    assert_eq!(
        pod.peers.questions(),
        [(first.clone(), 1), (first.clone(), 1)]
    );
    assert_eq!(pod.here(), format!("moved to {first}"));
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_then_not_held_goes_to_the_next_candidate() {
    let pod = Pod::start();
    let (first, second) = pod.candidates();
    pod.peers.answer(
        &first,
        SESSIONS_PATH,
        [Answer::Fail(SendError::Unacknowledged(StatusCode::OK))],
    );
    pod.peers.answer(&first, HELD_PATH, [held(false)]);
    assert_eq!(pod.move_session().await.unwrap(), second);
    assert_eq!(pod.peers.pushes(), [(first.clone(), 1), (second, 2)]);
    assert_eq!(pod.peers.questions(), [(first, 1)]);
    assert_eq!(
        pod.failed(),
        ["tether_handoffs_failed_total{reason=\"unacknowledged\"} 1"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_nobody_can_settle_leaves_the_session_here_in_doubt() {
    let pod = Pod::start();
    let (first, _) = pod.candidates();
    pod.peers
        .answer(&first, SESSIONS_PATH, [lost(), lost(), lost()]);
    pod.peers
        .answer(&first, HELD_PATH, [lost(), lost(), lost(), lost()]);
    assert!(matches!(pod.move_session().await, Err(MoveError::InDoubt)));
    assert_eq!(pod.peers.questions().len(), 4, "asked four times");
    assert!(
        pod.peers.pushes().iter().all(|(uid, _)| *uid == first),
        "no other pod is tried: {:?}",
        pod.peers.pushes()
    );
    assert_eq!(pod.here(), "held");
    assert_eq!(
        pod.session.epoch(),
        1,
        "later pushes supersede the copy in doubt"
    );
    assert_eq!(
        pod.failed(),
        ["tether_handoffs_failed_total{reason=\"in_doubt\"} 1"]
    );
    // The next move starts at a later epoch than the one in doubt.
    assert_eq!(pod.move_session().await.unwrap(), first);
    assert_eq!(pod.peers.pushes().last(), Some(&(first, 2)));
}

#[tokio::test(start_paused = true)]
async fn a_stale_epoch_drops_the_copy_here_and_tries_no_other_pod() {
    let pod = Pod::start();
    let (first, _) = pod.candidates();
    pod.peers.answer(
        &first,
        SESSIONS_PATH,
        [refused(StatusCode::CONFLICT, "stale_epoch")],
    );
    assert!(matches!(
        pod.move_session().await,
        Err(MoveError::Superseded)
    ));
    assert_eq!(pod.peers.pushes(), [(first.clone(), 1)]);
    assert_eq!(pod.here(), format!("moved to {first}"));
    assert_eq!(
        pod.failed(),
        ["tether_handoffs_failed_total{reason=\"superseded\"} 1"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_move_past_the_drains_deadline_does_not_start() {
    let pod = Pod::start();
    let deadline = Instant::now();
    let moved = pod
        .handoff
        .move_session(Arc::clone(&pod.session), Some(deadline))
        .await;
    assert!(matches!(moved, Err(MoveError::Deadline)));
    assert!(pod.peers.pushes().is_empty());
    assert_eq!(pod.here(), "held");
    assert_eq!(
        pod.failed(),
        ["tether_handoffs_failed_total{reason=\"deadline\"} 1"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_second_move_of_a_session_being_moved_is_busy() {
    let pod = Pod::start();
    let (first, _) = pod.candidates();
    pod.peers.answer(
        &first,
        SESSIONS_PATH,
        [unreachable(), Answer::Ack(Bytes::new())],
    );
    let (one, two) = tokio::join!(pod.move_session(), pod.move_session());
    let outcomes = [one.is_ok(), two.is_ok()];
    assert!(
        outcomes.contains(&true) && outcomes.contains(&false),
        "{one:?} {two:?}"
    );
    let busy = if one.is_ok() { two } else { one };
    assert!(matches!(busy, Err(MoveError::Busy)), "{busy:?}");
    assert_eq!(pod.peers.pushes().len(), 2, "one move, retried once");
}

#[tokio::test(start_paused = true)]
async fn a_session_whose_new_holder_left_is_pushed_again_from_the_copy_kept_here() {
    let pod = Pod::start();
    let (first, second) = pod.candidates();
    assert!(pod.lifecycle.start_draining());
    assert_eq!(pod.move_session().await.unwrap(), first);
    // The session has no stream to follow: the copy is kept, as a draining pod keeps it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(pod.here(), format!("moved to {first}"));
    // The new holder leaves membership before the drain ends.
    let without = Snapshot {
        peers: ["pod-a", second.as_str()]
            .iter()
            .map(|uid| peer(uid, PeerState::Routable))
            .collect(),
    };
    assert!(pod.sink.publish(Source::Kubernetes, without));
    pod.handoff.rebalance().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(pod.peers.pushes(), [(first, 1), (second.clone(), 2)]);
    assert_eq!(pod.here(), format!("moved to {second}"));
    assert_eq!(
        pod.failed(),
        ["tether_handoffs_failed_total{reason=\"holder_lost\"} 1"]
    );
}

//! A replica computed from the ledger's listed changes ([`super::changes`]) says what one
//! computed by a scan of the whole ledger says, whatever the ledger went through in between.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::session::fixtures::{key, limits};

/// One thing that happens to a session's ledger between two replicas.
#[derive(Clone, Debug)]
enum Op {
    /// A new request (id `n`, or an answered id sent again with another body).
    Request { reuse: bool },
    /// The upstream answers the `i`th running request.
    Answer(usize),
    /// The client of the `i`th answered request is handed its reply; its stream is settled.
    Serve(usize),
    /// The `i`th running request is withdrawn (not carried out).
    Withdraw(usize),
    /// Spent streams are shed down to `bytes` of retry state.
    Shed(u64),
    /// Everything older than the TTL is forgotten.
    Expire,
    /// A replica is computed and kept.
    Replicate,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Request { reuse: false }),
        1 => Just(Op::Request { reuse: true }),
        3 => (0..8usize).prop_map(Op::Answer),
        3 => (0..8usize).prop_map(Op::Serve),
        1 => (0..8usize).prop_map(Op::Withdraw),
        1 => (0..600u64).prop_map(Op::Shed),
        1 => Just(Op::Expire),
        2 => Just(Op::Replicate),
    ]
}

/// A ledger, its requests, and what its replica pod holds.
struct Replicated {
    pod: Retained,
    ledger: RetryLedger,
    room: RetryRoom,
    reply: StoredReply,
    next: i64,
    running: Vec<(RequestKey, Arc<Stream>)>,
    answered: Vec<(RequestKey, Arc<Stream>)>,
    /// What the replica pod holds, and the mark it was computed at.
    shipped: Option<(Shipped, u64)>,
    /// Replicas computed from the listed changes.
    from_changes: usize,
}

impl Replicated {
    fn new() -> Self {
        let pod = Retained::new(u64::MAX);
        let ledger = RetryLedger::new(&pod);
        let room = RetryRoom {
            session_bytes: u64::MAX,
            window: RetryWindow {
                requests: 6,
                bytes: 4096,
                ttl: Duration::from_secs(60),
            },
        };
        let reply = StoredReply {
            status: http::StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}"),
        };
        Self {
            pod,
            ledger,
            room,
            reply,
            next: 0,
            running: Vec::new(),
            answered: Vec::new(),
            shipped: None,
            from_changes: 0,
        }
    }

    fn mark(&self) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        self.ledger.mark(&mut h, false);
        std::hash::Hasher::finish(&h)
    }

    async fn apply(&mut self, op: Op) {
        match op {
            Op::Request { reuse } => {
                let (id, digest) = match self.answered.first() {
                    Some((id, _)) if reuse => (id.clone(), [2; 32]),
                    _ => {
                        self.next += 1;
                        (key(self.next), [1; 32])
                    }
                };
                let stream = Stream::new(
                    StreamKind::Post,
                    vec![id.clone()],
                    limits(),
                    self.pod.account(),
                    CancellationToken::new(),
                );
                if matches!(
                    self.ledger
                        .claim(std::slice::from_ref(&id), digest, &stream, self.room),
                    Dedupe::New | Dedupe::Reused
                ) {
                    self.running.push((id, stream));
                }
            }
            Op::Answer(i) if i < self.running.len() => {
                let (id, stream) = self.running.remove(i);
                stream.store_reply(self.reply.clone());
                self.answered.push((id, stream));
            }
            Op::Serve(i) if i < self.answered.len() => {
                let (_, stream) = self.answered.remove(i);
                let _ = stream.wait_head().await;
                self.ledger.settle(&stream, &self.reply);
            }
            Op::Withdraw(i) if i < self.running.len() => {
                let (_, stream) = self.running.remove(i);
                self.ledger.forget_records_of(stream.key());
                self.ledger.forget_stream(stream.key());
            }
            Op::Shed(bytes) => {
                self.ledger.shed_retry_state(bytes, Instant::now());
            }
            Op::Expire => self
                .ledger
                .expire(Instant::now() + Duration::from_secs(120)),
            Op::Replicate => self.replicate(),
            Op::Answer(_) | Op::Serve(_) | Op::Withdraw(_) => {}
        }
    }

    /// Computes a replica as the replicator does and checks it against a scan.
    fn replicate(&mut self) {
        let mark = self.mark();
        let since = self.shipped.as_ref().map(|(s, _)| s);
        let scanned =
            self.ledger
                .scanned_parts(false, usize::MAX, since.unwrap_or(&Shipped::default()));
        if let Some((_, before)) = &self.shipped
            && *before == mark
        {
            assert!(
                scanned.streams.is_empty()
                    && scanned.records.is_empty()
                    && scanned.forgotten_streams.is_empty()
                    && scanned.forgotten_requests.is_empty(),
                "the mark stayed while the ledger changed: {scanned:?}"
            );
        }
        let parts = self.ledger.replica_parts(false, usize::MAX, since);
        let keys = |p: &ReplicaParts| -> HashSet<StreamKey> {
            p.streams.iter().map(|s| s.key.clone()).collect()
        };
        let ids = |p: &ReplicaParts| -> HashSet<RequestKey> {
            p.records.iter().map(|r| r.id.clone()).collect()
        };
        let set = |v: &[StreamKey]| v.iter().cloned().collect::<HashSet<_>>();
        let id_set = |v: &[RequestKey]| v.iter().cloned().collect::<HashSet<_>>();
        assert_eq!(keys(&parts), keys(&scanned), "streams sent");
        assert_eq!(ids(&parts), ids(&scanned), "records sent");
        assert_eq!(
            set(&parts.forgotten_streams),
            set(&scanned.forgotten_streams),
            "streams forgotten"
        );
        assert_eq!(
            id_set(&parts.forgotten_requests),
            id_set(&scanned.forgotten_requests),
            "records forgotten"
        );
        let holds = match (parts.change, self.shipped.take()) {
            (true, Some((mut holds, _))) => {
                self.from_changes += 1;
                holds.apply(crate::session::ShippedChange {
                    adds: parts.shipped,
                    forgotten_streams: parts.forgotten_streams,
                    forgotten_requests: parts.forgotten_requests,
                });
                holds
            }
            (false, _) => parts.shipped,
            (true, None) => panic!("a change of nothing"),
        };
        assert_eq!(holds, scanned.shipped, "what the replica pod holds");
        self.shipped = Some((holds, mark));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_replica_from_the_listed_changes_is_the_one_a_scan_computes(
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let mut r = Replicated::new();
            for op in ops {
                r.apply(op).await;
            }
            r.apply(Op::Replicate).await;
        });
    }
}

#[tokio::test]
async fn a_busy_session_s_replicas_are_computed_from_its_changes_until_they_overflow() {
    let mut r = Replicated::new();
    r.replicate();
    for _ in 0..50 {
        for _ in 0..4 {
            r.apply(Op::Request { reuse: false }).await;
            r.apply(Op::Answer(0)).await;
            r.apply(Op::Serve(0)).await;
        }
        r.replicate();
    }
    assert_eq!(
        r.from_changes, 50,
        "each replica but the first from the changes"
    );
    // More than the list holds: the next replica is a scan, and listing starts again.
    for _ in 0..changes::MAX_CHANGES {
        r.apply(Op::Request { reuse: false }).await;
        r.apply(Op::Answer(0)).await;
        r.apply(Op::Serve(0)).await;
    }
    r.replicate();
    assert_eq!(r.from_changes, 50, "a scan after the list overflowed");
    r.apply(Op::Request { reuse: false }).await;
    r.replicate();
    assert_eq!(r.from_changes, 51);
    // Nobody follows the replica any more: nothing is listed, and the next one is a scan.
    r.ledger.unfollow_replica();
    r.apply(Op::Request { reuse: false }).await;
    r.replicate();
    assert_eq!(r.from_changes, 51, "a scan once unfollowed");
}

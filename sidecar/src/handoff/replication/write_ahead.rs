//! Write-ahead, the holder's side (`docs/design/replication.md#write-ahead`): a request about
//! to be dispatched waits until its session's replica pod acknowledged a copy that holds the
//! request's retry record.
//!
//! The waiter asks the replicator for a round at once ([`Handoff::round_wanted`] resolves);
//! requests that arrive while a round is under way wait for the next one together (a group
//! commit), so a busy pod sends one message per replica pod and round trip, not one per
//! request. Such a round sends only the waiting requests' streams and records, added to the
//! copy the replica pod acknowledged. As each replica pod answers, the waiters whose records
//! it kept go (one that does not answer holds up no other); after the round every waiter is
//! looked at ([`release`], a pure step):
//!
//! ```text
//!   waiting ──┬── the copy acknowledged holds the record ─────────────▶ written: dispatch
//!             ├── the session is no longer held here ─────────────────▶ moot: dispatch
//!             ├── a round that began after the wait did not get it
//!             │   kept (refused, unanswered, no replica pod) ──────────▶ unwritten: dispatch
//!             └── 1 s passed ──────────────────────────────────────────▶ timeout: dispatch
//! ```
//!
//! A session without a replica pod (the pod is alone, or every peer drains) does not wait.
//! Only `written` closes the dispatch window; the others are counted
//! (`tether_write_ahead_total{outcome}`) and the request runs as it would without replication.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tether_crds::Replication;
use tokio::sync::oneshot;

use super::decide;
use crate::broker::WriteAhead;
use crate::handoff::Handoff;
use crate::handoff::metrics::WriteAheadOutcome;
use crate::mcp::jsonrpc::RequestKey;
use crate::session::Session;

/// Longest a request waits for its record to be kept before it is dispatched anyway.
const MAX_WAIT: Duration = Duration::from_secs(1);

/// What the last round left of one session's copy at its replica pod, for a waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Standing {
    /// The copy acknowledged holds the waiter's records.
    Written,
    /// It does not (not sent yet, refused, unanswered, no replica pod).
    Unwritten,
    /// The replicator does not follow the session (not held here, or not yet looked at).
    Untracked,
}

/// Whether a waiter is released after a round, and how: `standing` is its session's copy,
/// `judged` whether the round began after the wait did (so it looked at the record), `held`
/// whether the session is still held here.
pub(super) fn release(standing: Standing, judged: bool, held: bool) -> Option<WriteAheadOutcome> {
    match standing {
        Standing::Written => Some(WriteAheadOutcome::Written),
        Standing::Untracked if !held => Some(WriteAheadOutcome::Moot),
        _ if judged => Some(WriteAheadOutcome::Unwritten),
        _ => None,
    }
}

/// A request waiting for its record to be kept.
struct Waiter {
    session: String,
    requests: Vec<RequestKey>,
    /// The replicator's round count when the wait began.
    since: u64,
    done: oneshot::Sender<WriteAheadOutcome>,
}

/// The requests waiting for their records to be kept.
#[derive(Default)]
pub(crate) struct Waiting {
    waiters: Vec<Waiter>,
}

impl Waiting {
    /// Releases the waiters [`release`] lets go after round `round`; with `written_only`
    /// (answers of the round still to come), only those whose records are kept.
    pub(super) fn after_round(
        &mut self,
        round: u64,
        written_only: bool,
        standing: impl Fn(&str, &[RequestKey]) -> Standing,
        held: impl Fn(&str) -> bool,
    ) {
        for w in std::mem::take(&mut self.waiters) {
            if w.done.is_closed() {
                continue;
            }
            let stands = standing(&w.session, &w.requests);
            let judged = round > w.since && !written_only;
            match release(stands, judged, held(&w.session) || written_only) {
                Some(outcome) => {
                    let _ = w.done.send(outcome);
                }
                None => self.waiters.push(w),
            }
        }
    }

    /// Releases every waiter as `unwritten`: no round will keep their records (the pod's
    /// drain ended, or replication was turned off).
    pub(super) fn release_all(&mut self) {
        for w in self.waiters.drain(..) {
            let _ = w.done.send(WriteAheadOutcome::Unwritten);
        }
    }

    /// Whether a request waits.
    pub(super) fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// The sessions with requests waiting, and those requests.
    pub(super) fn wanted(&self) -> HashMap<String, Vec<RequestKey>> {
        let mut wanted: HashMap<String, Vec<RequestKey>> = HashMap::new();
        for w in self.waiters.iter().filter(|w| !w.done.is_closed()) {
            wanted
                .entry(w.session.clone())
                .or_default()
                .extend(w.requests.iter().cloned());
        }
        wanted
    }
}

/// The broker's write-ahead wait, served by the handoff.
#[derive(Debug)]
pub(crate) struct Ahead(pub(crate) Weak<Handoff>);

#[async_trait]
impl WriteAhead for Ahead {
    async fn written(&self, session: &Arc<Session>, requests: &[RequestKey]) {
        if let Some(handoff) = self.0.upgrade() {
            handoff.written(session, requests).await;
        }
    }

    fn spared(&self, _requests: &[RequestKey]) {
        if let Some(handoff) = self.0.upgrade() {
            let cfg = handoff.broker.cfg();
            if cfg.replication != Replication::None && cfg.write_ahead {
                handoff.metrics.write_ahead(WriteAheadOutcome::Harmless);
            }
        }
    }
}

impl Handoff {
    /// Waits until the replica pod of `session` keeps the records of `requests` (module docs).
    pub(super) async fn written(&self, session: &Arc<Session>, requests: &[RequestKey]) {
        let cfg = self.broker.cfg();
        if cfg.replication == Replication::None || !cfg.write_ahead || requests.is_empty() {
            return;
        }
        let view = self.router.view();
        if decide::replica_pod(&view, session.id(), self.router.uid()).is_none() {
            // Alone, or every peer draining: no round would place it.
            self.metrics.write_ahead(WriteAheadOutcome::Unwritten);
            return;
        }
        let (done, outcome) = oneshot::channel();
        {
            let mut st = self.replicating.lock();
            if st.withdrawn() {
                return;
            }
            let since = st.rounds();
            st.waiting.waiters.push(Waiter {
                session: session.id().to_owned(),
                requests: requests.to_vec(),
                since,
                done,
            });
        }
        self.replicate_now.notify_one();
        let outcome = tokio::time::timeout(MAX_WAIT, outcome)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(WriteAheadOutcome::Timeout);
        self.metrics.write_ahead(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_is_released_once_its_record_is_kept_or_cannot_be() {
        use Standing::{Untracked, Unwritten, Written};
        use WriteAheadOutcome as O;
        // (copy, the round began after the wait, still held) → released as
        let table = [
            (Written, false, true, Some(O::Written)),
            (Written, true, true, Some(O::Written)),
            (Unwritten, false, true, None),
            (Unwritten, true, true, Some(O::Unwritten)),
            (Untracked, false, true, None),
            (Untracked, true, true, Some(O::Unwritten)),
            (Untracked, false, false, Some(O::Moot)),
            (Unwritten, false, false, None),
        ];
        for (standing, judged, held, want) in table {
            assert_eq!(
                release(standing, judged, held),
                want,
                "{standing:?} judged={judged} held={held}"
            );
        }
    }
}

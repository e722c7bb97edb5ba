//! Periodic upkeep: buffer TTL, idle session expiry (`session.idleTimeout`), the pod's byte
//! budget (`--pod-retained-bytes`) and the gauges (streams, buffers, `tether_retained_bytes`,
//! `tether_tasks_open`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Broker;
use crate::mcp::principal::Principal;
use crate::mcp::rejection::{NotFound, Rejection};
use crate::retained::Kind;
use crate::retained::shares::{Admission, PodPinned, admit, fair_share};
use crate::session::RetryRoom;
use crate::stream::buffer::Evictions;

impl Broker {
    /// Looks at the sessions due ([`Registry::due`](crate::session::registry::Registry::due)):
    /// evicts their expired events, ends the idle ones (later requests get 404, reason
    /// `expired`; the upstream is told with DELETE) and schedules the others for when they may
    /// turn idle or something of theirs expires; then keeps the pod within its budget and
    /// refreshes the gauges, which are kept as things change. So a sweep costs what is due,
    /// not what the pod holds (`docs/design/buffering.md#what-expires`).
    pub(crate) fn sweep(self: &Arc<Self>, now: Instant) {
        let cfg = self.cfg();
        // A reload that shortened the timeout gives every session the new timeout from the
        // reload on, so sessions do not all expire in the next sweep.
        let idle_from = cfg.reloaded_at.map(|at| at + cfg.idle_timeout);
        let expire = idle_from.is_none_or(|at| at <= now);
        let due = self.registry.due(now);
        self.metrics.swept(due.len());
        for session in due {
            if !self.registry.holds(&session) {
                continue;
            }
            let evicted = session.evict_expired(now);
            self.metrics.evictions(&evicted);
            if expire && session.is_idle(now, cfg.idle_timeout) {
                self.end_session(&session, NotFound::Expired);
                continue;
            }
            let next = session.next_sweep(now, cfg.idle_timeout, cfg.buffer.ttl);
            let next = idle_from.map_or(next, |at| next.max(at.min(now + cfg.buffer.ttl)));
            self.registry.schedule(&session, next);
        }
        self.enforce_budget();
        let retained = self.retained();
        let (events, streams) = retained.events_and_streams();
        self.metrics.buffered(
            streams,
            events,
            retained.bytes(Kind::Buffers),
            retained.unsent(),
        );
        for kind in Kind::ALL {
            self.metrics.retained(kind, self.retained().bytes(kind));
        }
        self.open_tasks();
    }

    /// [`Broker::enforce_budget`] from the data path when the pod is over its budget, at most
    /// every 50 ms.
    pub(super) fn enforce_budget_soon(&self) {
        if self.retained().over() && due(&self.last_enforcement) {
            self.enforce_budget();
        }
    }

    /// Whether a new request must wait for room (429 `pod_full`): what nothing can free
    /// (journals, tombstones, events no client was sent) takes the pod's whole
    /// `--pod-retained-bytes`, or the pod is over it and the last enforcement found nothing
    /// left to give up (the rest belongs to requests in flight). While the pod is only over
    /// its budget, what can be given up goes (soon) instead.
    fn pod_full(&self) -> bool {
        self.enforce_budget_soon();
        let retained = self.retained();
        retained.is_full() || (retained.over() && self.budget_stuck.load(Ordering::Relaxed))
    }

    /// Whether a request of `principal` (`None`: of a session bound to none) may add to what
    /// the pod pins ([`admit`]): not when the principal's sessions pin
    /// `--max-principal-retained-bytes` already; on a full pod ([`Broker::pod_full`]) only
    /// when it pins less than its fair share — then the unread buffers of the principals over
    /// theirs are shed to make room.
    ///
    /// # Errors
    /// [`Rejection::PrincipalRetained`] or [`Rejection::PodFull`] (429).
    pub(super) fn admit_pinning(&self, principal: Option<Principal>) -> Result<(), Rejection> {
        let retained = self.retained();
        let pinned = principal.map(|p| retained.pinned_by(&p));
        let pod = PodPinned {
            full: self.pod_full(),
            cap: retained.cap(),
            holding: retained.principals_pinning(),
        };
        match admit(pinned, retained.principal_cap(), pod) {
            Admission::Admit => Ok(()),
            Admission::AdmitAndShed => {
                self.shed_over_shares(pod);
                Ok(())
            }
            Admission::PrincipalFull => Err(Rejection::PrincipalRetained),
            Admission::PodFull => Err(Rejection::PodFull),
        }
    }

    /// Sheds the buffers nobody reads now of the sessions whose principal pins more than its
    /// fair share of the full `pod`, the greediest principal's first and each one's oldest
    /// streams first, until the pod pins at most ⅞ of its budget. At most one walk every
    /// 50 ms: a request arriving meanwhile goes on, the last walk made room for it too.
    fn shed_over_shares(&self, pod: PodPinned) {
        if !due(&self.last_shedding) {
            return;
        }
        let retained = self.retained();
        let fair = fair_share(pod);
        let over = || retained.pinned() > retained.cap() / 8 * 7;
        let mut candidates: Vec<_> = self
            .registry
            .all()
            .iter()
            .filter_map(|s| {
                let principal = s.binding()?.principal?;
                let pinned = retained.pinned_by(&principal);
                (pinned > fair).then(|| (pinned, s.streams()))
            })
            .flat_map(|(pinned, streams)| streams.into_iter().map(move |s| (pinned, s)))
            .filter(|(_, s)| !s.is_read())
            .collect();
        candidates.sort_by_key(|(pinned, s)| (std::cmp::Reverse(*pinned), s.created()));
        let mut shed = Evictions::default();
        for (_, stream) in candidates {
            if !over() {
                break;
            }
            shed += stream.shed_unread();
        }
        if shed.principal_share > 0 {
            tracing::info!(
                events = shed.principal_share,
                fair_share = fair,
                "a full pod shed the unread buffers of callers over their fair share"
            );
            self.metrics.evictions(&shed);
        }
    }

    /// What a new request's retry records must fit in: the session's budget and window.
    pub(super) fn retry_room(&self) -> RetryRoom {
        let cfg = self.cfg();
        RetryRoom {
            session_bytes: cfg.max_session_retry_bytes,
            window: cfg.retry_window,
        }
    }

    /// Keeps the pod within `--pod-retained-bytes` (`docs/design/buffering.md#the-pod-budget`):
    /// when over, it gives up, in this order, the sent events of streams nobody reads (oldest
    /// first), the answers of spent requests (down to ⅞ of the budget: room for the requests
    /// of the next 50 ms, when the data path may not enforce it again), then the sent events
    /// of streams being read. What is pinned stays.
    pub(crate) fn enforce_budget(&self) {
        if !self.retained().over() {
            self.budget_stuck.store(false, Ordering::Relaxed);
            return;
        }
        let mut evicted = self.evict_sent(false);
        self.shed_spent();
        evicted += self.evict_sent(true);
        self.budget_stuck
            .store(self.retained().over(), Ordering::Relaxed);
        self.metrics.evictions(&crate::stream::buffer::Evictions {
            pod_cap: evicted,
            ..Default::default()
        });
    }

    /// Evicts the events clients were sent of streams read now (`active`) or not, oldest
    /// first, until the pod is within its budget; returns how many (a later resume before
    /// them gets `cursor_evicted`).
    fn evict_sent(&self, active: bool) -> u64 {
        let mut candidates: Vec<_> = self
            .registry
            .all()
            .iter()
            .flat_map(|s| s.streams())
            .filter(|s| s.is_active() == active)
            .filter_map(|s| s.oldest().map(|at| (at, s)))
            .collect();
        candidates.sort_by_key(|(at, _)| *at);
        let mut evicted = 0;
        for (_, stream) in candidates {
            if !self.retained().over() {
                break;
            }
            evicted += stream.evict_sent();
        }
        evicted
    }

    /// Forgets the pod's spent streams, oldest first, then the records of streams no longer
    /// held, until the pod is at ⅞ of its budget.
    fn shed_spent(&self) {
        let retained = self.retained();
        let over = || retained.above(7, 8);
        if !over() {
            return;
        }
        let now = Instant::now();
        let sessions = self.registry.all();
        let mut spent: Vec<_> = sessions
            .iter()
            .flat_map(|s| {
                s.spent_streams(now)
                    .into_iter()
                    .map(move |(created, key)| (created, s, key))
            })
            .collect();
        spent.sort_by_key(|(created, ..)| *created);
        for (_, session, key) in spent {
            if !over() {
                return;
            }
            session.forget_spent(&key, now);
        }
        for session in &sessions {
            if !over() {
                return;
            }
            session.shed_retry_state(0);
        }
    }
}

/// Whether a walk from the data path (a cap enforcement, a shedding) is due: none ran in the
/// last 50 ms (and no other is starting now); if so, it counts as running now.
fn due(last: &parking_lot::Mutex<Option<Instant>>) -> bool {
    let now = Instant::now();
    let Some(mut last) = last.try_lock() else {
        return false;
    };
    if last.is_some_and(|t| now.duration_since(t) < Duration::from_millis(50)) {
        return false;
    }
    *last = Some(now);
    true
}

//! Task ids on their way through the pod (`docs/design/tasks.md`): a client's ids are opened
//! before its request goes to the MCP server, the server's are sealed before its answer goes to
//! the client (`crate::mcp::tasks`), in both eras: 2026-07-28 requests (`broker::stateless`) and
//! 2025-11-25 sessions (`broker::post`, `broker::pump`) share this one mechanism.
//!
//! The pod also keeps the tasks created here that a client may still poll ([`Tasks`]): from the
//! first sight of a task until a client is sent a terminal status for it, or its `ttlMs` passes
//! (24 h without one). A drain serves the polls of the tasks a client polled within
//! `--task-poll-window` until none is left or its deadline (`crate::ops::drain`): a task nobody
//! polls keeps no drain waiting. At most `--max-open-tasks` are kept (`tether_tasks_open`), and
//! at most `--max-principal-open-tasks` of one owner (the principal its ids are sealed for; all
//! anonymous callers are one), so that one caller's tasks never polled to their end cannot
//! crowd out the others'; past either a task is still served but not waited for
//! (`tether_tasks_untracked_total`). An entry is the server's id (at most 256 bytes), its owner
//! and two instants.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::Broker;
use crate::counts::Counts;
use crate::mcp::home::HomeToken;
use crate::mcp::jsonrpc::Envelope;
use crate::mcp::principal::Owner;
use crate::mcp::rejection::Rejection;
use crate::mcp::sealed::Sealer;
use crate::mcp::tasks::{self, Revision, Seen, TaskMiss};
use crate::reply::Reply;

/// How long a task without `ttlMs` counts as open.
const UNLIMITED_TTL: Duration = Duration::from_secs(24 * 3600);

/// The bounds of the tasks a pod keeps (from flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TaskLimits {
    /// Most tasks kept (`--max-open-tasks`).
    pub(crate) max_open: usize,
    /// Most tasks of one owner kept (`--max-principal-open-tasks`).
    pub(crate) per_owner: usize,
    /// How recently a task must have been polled for a drain to wait for it
    /// (`--task-poll-window`).
    pub(crate) poll_window: Duration,
}

/// One kept task.
#[derive(Debug)]
struct Kept {
    /// When it stops counting as open.
    until: Instant,
    /// When a client was last sent its status.
    polled: Instant,
    owner: Owner,
}

/// This pod's task ids and the tasks a client may still poll here.
#[derive(Debug)]
pub(super) struct Tasks {
    pub(super) ids: Sealer,
    limits: TaskLimits,
    open: parking_lot::Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    /// The server's id → the task.
    by_id: HashMap<String, Kept>,
    /// Kept tasks per owner.
    by_owner: Counts<Owner>,
}

impl Open {
    fn remove(&mut self, id: &str) {
        if let Some(kept) = self.by_id.remove(id) {
            self.by_owner.sub(&kept.owner, 1);
        }
    }

    /// Forgets the tasks past their `ttlMs` at `now`.
    fn expire(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .by_id
            .iter()
            .filter(|(_, kept)| kept.until <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.remove(&id);
        }
    }

    /// Whether one more task of `owner` fits within `limits`.
    fn has_room(&self, owner: &Owner, limits: TaskLimits) -> bool {
        self.by_id.len() < limits.max_open && self.by_owner.get(owner) < limits.per_owner
    }
}

impl Tasks {
    /// No open task; ids sealed with `ids`; kept within `limits`.
    pub(super) fn new(ids: Sealer, limits: TaskLimits) -> Self {
        Self {
            ids,
            limits,
            open: parking_lot::Mutex::default(),
        }
    }

    /// Notes a task object of `owner` sent to a client; `false` when it is open but not kept
    /// (the pod's or the owner's tasks are full).
    pub(super) fn note(&self, seen: Seen, owner: &Owner, now: Instant) -> bool {
        let mut open = self.open.lock();
        if seen.terminal {
            open.remove(&seen.upstream);
            return true;
        }
        let until = now + seen.ttl_ms.map_or(UNLIMITED_TTL, Duration::from_millis);
        if let Some(kept) = open.by_id.get_mut(&seen.upstream) {
            kept.until = until;
            kept.polled = now;
            return true;
        }
        if !open.has_room(owner, self.limits) {
            open.expire(now);
            if !open.has_room(owner, self.limits) {
                return false;
            }
        }
        open.by_owner.add(owner.clone(), 1);
        open.by_id.insert(
            seen.upstream,
            Kept {
                until,
                polled: now,
                owner: owner.clone(),
            },
        );
        true
    }

    /// Tasks kept now, expired ones included until the next [`Tasks::polled`] (the data path
    /// does not walk the table).
    pub(super) fn kept(&self) -> usize {
        self.open.lock().by_id.len()
    }

    /// Tasks open at `now` (expired ones forgotten) that a client polled within the poll
    /// window: those a drain waits for.
    fn polled(&self, now: Instant) -> usize {
        let mut open = self.open.lock();
        open.expire(now);
        let window = self.limits.poll_window;
        open.by_id
            .values()
            .filter(|kept| now.saturating_duration_since(kept.polled) < window)
            .count()
    }
}

impl Broker {
    /// The answer to a request whose task ids did not open (`rejection`, counted): a
    /// `tasks/get` of a task lost with its pod gets the task `failed`
    /// ([`tasks::lost_task_answer`]); anything else the rejection, naming the request's id.
    pub(crate) fn task_miss_reply(
        &self,
        rejection: &Rejection,
        envelope: &Envelope,
        revision: Revision,
    ) -> Reply {
        self.metrics.rejection(rejection);
        let lost = match (rejection, envelope.messages.as_slice()) {
            (Rejection::TaskNotFound(TaskMiss::Gone), [(_, request)]) => {
                let now = jiff::Timestamp::now().to_string();
                tasks::lost_task_answer(request, revision, &now)
            }
            _ => None,
        };
        match lost {
            Some(answer) => Reply::json(Bytes::from(answer.to_string())),
            None => Reply::rejection(rejection, envelope.first_request_id().as_ref()),
        }
    }

    /// The pod holding the task a client's id names, when the id is genuine and the request
    /// with `headers` presents its owner (routing).
    pub(crate) fn task_holder(&self, id: &str, headers: &http::HeaderMap) -> Option<HomeToken> {
        tasks::holder(&self.tasks.ids, id, &self.request_owner(headers))
    }

    /// The owner of the tasks a 2026-07-28 request with `headers` creates or names
    /// (`spec.auth.binding` read from its credentials).
    pub(crate) fn request_owner(&self, headers: &http::HeaderMap) -> Owner {
        let cfg = self.cfg();
        Owner::of_request(headers, &cfg.forward_headers, cfg.binding)
    }

    /// Tasks created here that a client may still poll and polled within `--task-poll-window`
    /// (a drain serves them); forgets the expired ones (each sweep too).
    pub(crate) fn open_tasks(&self) -> usize {
        let now = Instant::now();
        let polled = self.tasks.polled(now);
        self.metrics.tasks_open(self.tasks.kept());
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyRing;

    const LIMITS: TaskLimits = TaskLimits {
        max_open: 10,
        per_owner: 10,
        poll_window: Duration::from_secs(60),
    };

    fn tasks(limits: TaskLimits) -> Tasks {
        Tasks::new(
            Sealer::new(
                KeyRing::from_bytes(b"0123456789abcdef".to_vec()),
                HomeToken::for_pod("a"),
                &crate::mcp::sealed::TASK_ID,
            ),
            limits,
        )
    }

    fn seen(id: &str, terminal: bool, ttl_ms: Option<u64>) -> Seen {
        Seen {
            upstream: id.into(),
            terminal,
            ttl_ms,
        }
    }

    fn anyone() -> Owner {
        Owner::ANONYMOUS
    }

    #[test]
    fn a_task_is_open_from_its_creation_until_a_client_sees_it_end() {
        let t = tasks(LIMITS);
        let now = Instant::now();
        assert!(t.note(seen("t-1", false, Some(60_000)), &anyone(), now));
        assert!(
            t.note(seen("t-1", false, Some(60_000)), &anyone(), now),
            "a poll keeps it"
        );
        assert_eq!(t.polled(now), 1);
        assert!(t.note(seen("t-1", true, None), &anyone(), now));
        assert_eq!(t.polled(now), 0);
    }

    #[test]
    fn a_task_past_its_ttl_is_no_longer_open() {
        let t = tasks(TaskLimits {
            poll_window: UNLIMITED_TTL * 2,
            ..LIMITS
        });
        let now = Instant::now();
        t.note(seen("t-1", false, Some(1_000)), &anyone(), now);
        t.note(seen("t-2", false, None), &anyone(), now);
        assert_eq!(t.polled(now + Duration::from_secs(2)), 1);
        assert_eq!(t.polled(now + UNLIMITED_TTL + Duration::from_secs(1)), 0);
        assert_eq!(t.kept(), 0, "expired ones are forgotten");
    }

    #[test]
    fn a_drain_waits_only_for_tasks_polled_within_the_window() {
        let t = tasks(LIMITS);
        let now = Instant::now();
        t.note(seen("abandoned", false, None), &anyone(), now);
        t.note(seen("polled", false, None), &anyone(), now);
        let later = now + Duration::from_secs(90);
        t.note(
            seen("polled", false, None),
            &anyone(),
            later - Duration::from_secs(5),
        );
        assert_eq!(
            t.polled(later),
            1,
            "nobody polled the abandoned one for 90 s"
        );
        assert_eq!(t.kept(), 2, "it is still served");
    }

    #[test]
    fn past_max_open_tasks_new_ones_are_not_kept_until_room_is_made() {
        let t = tasks(TaskLimits {
            max_open: 2,
            ..LIMITS
        });
        let now = Instant::now();
        assert!(t.note(seen("t-1", false, Some(1_000)), &anyone(), now));
        assert!(t.note(seen("t-2", false, None), &anyone(), now));
        assert!(!t.note(seen("t-3", false, None), &anyone(), now), "full");
        assert!(
            t.note(seen("t-2", false, None), &anyone(), now),
            "a kept one is updated"
        );
        assert!(
            t.note(
                seen("t-3", false, None),
                &anyone(),
                now + Duration::from_secs(2)
            ),
            "t-1 expired: room"
        );
        assert_eq!(t.polled(now + Duration::from_secs(2)), 2);
    }

    #[test]
    fn one_owner_keeps_its_share_and_the_others_the_rest() {
        let t = tasks(TaskLimits {
            max_open: 4,
            per_owner: 2,
            ..LIMITS
        });
        let now = Instant::now();
        let (mallory, alice) = (Owner::from_bytes(b"mallory"), anyone());
        assert!(t.note(seen("m-1", false, None), &mallory, now));
        assert!(t.note(seen("m-2", false, None), &mallory, now));
        assert!(
            !t.note(seen("m-3", false, None), &mallory, now),
            "over its share"
        );
        assert!(t.note(seen("a-1", false, None), &alice, now));
        assert!(t.note(seen("m-1", true, None), &mallory, now));
        assert!(
            t.note(seen("m-3", false, None), &mallory, now),
            "an ended one made room"
        );
    }
}

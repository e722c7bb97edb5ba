//! Task ids on their way through the pod (`docs/design/tasks.md`): a client's ids are opened
//! before its request goes to the MCP server, the server's are sealed before its answer goes to
//! the client (`crate::mcp::tasks`), in both eras: 2026-07-28 requests (`broker::stateless`) and
//! 2025-11-25 sessions (`broker::post`, `broker::pump`) share this one mechanism.
//!
//! The pod also keeps the tasks created here that a client may still poll ([`Tasks`]): from the
//! first sight of a task until a client is sent a terminal status for it, or its `ttlMs` passes
//! (24 h without one). A drain serves their polls until none is left or its deadline
//! (`crate::ops::drain`). At most `--max-open-tasks` are kept (`tether_tasks_open`); past it a
//! task is still served but not waited for (`tether_tasks_untracked_total`). An entry is the
//! server's id (at most 256 bytes) and a deadline.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::Broker;
use crate::mcp::jsonrpc::Envelope;
use crate::mcp::principal::Owner;
use crate::mcp::rejection::Rejection;
use crate::mcp::sealed::Sealer;
use crate::mcp::session_id::HomeToken;
use crate::mcp::tasks::{self, Revision, Seen, TaskMiss};
use crate::reply::Reply;

/// How long a task without `ttlMs` counts as open.
const UNLIMITED_TTL: Duration = Duration::from_secs(24 * 3600);
/// This pod's task ids and the tasks a client may still poll here.
#[derive(Debug)]
pub(super) struct Tasks {
    pub(super) ids: Sealer,
    max_open: usize,
    /// The server's id → when it stops counting as open.
    open: parking_lot::Mutex<HashMap<String, Instant>>,
}

impl Tasks {
    /// No open task; ids sealed with `ids`; at most `max_open` kept.
    pub(super) fn new(ids: Sealer, max_open: usize) -> Self {
        Self {
            ids,
            max_open,
            open: parking_lot::Mutex::default(),
        }
    }

    /// Notes a task object sent to a client; `false` when it is open but not kept (full).
    pub(super) fn note(&self, seen: Seen, now: Instant) -> bool {
        let mut open = self.open.lock();
        if seen.terminal {
            open.remove(&seen.upstream);
            return true;
        }
        let until = now + seen.ttl_ms.map_or(UNLIMITED_TTL, Duration::from_millis);
        if open.len() >= self.max_open && !open.contains_key(&seen.upstream) {
            open.retain(|_, until| *until > now);
            if open.len() >= self.max_open {
                return false;
            }
        }
        open.insert(seen.upstream, until);
        true
    }

    /// Tasks kept now, expired ones included until the next [`Tasks::count`] (the data path
    /// does not walk the table).
    pub(super) fn kept(&self) -> usize {
        self.open.lock().len()
    }

    /// Tasks open at `now` (expired ones forgotten).
    fn count(&self, now: Instant) -> usize {
        let mut open = self.open.lock();
        open.retain(|_, until| *until > now);
        open.len()
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

    /// Tasks created here that a client may still poll (a drain serves them); forgets the
    /// expired ones (each sweep too).
    pub(crate) fn open_tasks(&self) -> usize {
        let open = self.tasks.count(Instant::now());
        self.metrics.tasks_open(open);
        open
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyRing;

    fn tasks(max_open: usize) -> Tasks {
        Tasks::new(
            Sealer::new(
                KeyRing::from_bytes(b"0123456789abcdef".to_vec()),
                HomeToken::for_pod("a"),
                &crate::mcp::sealed::TASK_ID,
            ),
            max_open,
        )
    }

    fn seen(id: &str, terminal: bool, ttl_ms: Option<u64>) -> Seen {
        Seen {
            upstream: id.into(),
            terminal,
            ttl_ms,
        }
    }

    #[test]
    fn a_task_is_open_from_its_creation_until_a_client_sees_it_end() {
        let t = tasks(10);
        let now = Instant::now();
        assert!(t.note(seen("t-1", false, Some(60_000)), now));
        assert!(
            t.note(seen("t-1", false, Some(60_000)), now),
            "a poll keeps it"
        );
        assert_eq!(t.count(now), 1);
        assert!(t.note(seen("t-1", true, None), now));
        assert_eq!(t.count(now), 0);
    }

    #[test]
    fn a_task_past_its_ttl_is_no_longer_open() {
        let t = tasks(10);
        let now = Instant::now();
        t.note(seen("t-1", false, Some(1_000)), now);
        t.note(seen("t-2", false, None), now);
        assert_eq!(t.count(now + Duration::from_secs(2)), 1);
        assert_eq!(t.count(now + UNLIMITED_TTL + Duration::from_secs(1)), 0);
    }

    #[test]
    fn past_max_open_tasks_new_ones_are_not_kept_until_room_is_made() {
        let t = tasks(2);
        let now = Instant::now();
        assert!(t.note(seen("t-1", false, Some(1_000)), now));
        assert!(t.note(seen("t-2", false, None), now));
        assert!(!t.note(seen("t-3", false, None), now), "full");
        assert!(
            t.note(seen("t-2", false, None), now),
            "a kept one is updated"
        );
        assert!(
            t.note(seen("t-3", false, None), now + Duration::from_secs(2)),
            "t-1 expired: room"
        );
        assert_eq!(t.count(now + Duration::from_secs(2)), 2);
    }
}

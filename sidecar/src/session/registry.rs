//! The sessions this pod holds, by client session id, and what it remembers of sessions it no
//! longer holds: why they ended (the reason of a later 404) and where handed-off ones went; the
//! tally of what its sessions retain ([`Retained`]); and when the sweeper looks at each session
//! next, so a sweep costs what is due, not what is held.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use super::Session;
use super::bounded::Bounded;
use super::held::Held;
use crate::mcp::rejection::NotFound;
use crate::retained::Retained;

/// Most ended sessions remembered for 404 reasons, and most handed-off sessions remembered for
/// forwarding.
const ENDED_LOG: usize = 16384;

/// Why a session could not be registered: the pod holds its maximum of sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this pod holds its maximum of {0} sessions")]
pub(crate) struct TooManySessions(pub usize);

/// Why a new session could not be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NoRoom {
    /// The pod holds `--max-sessions`.
    #[error(transparent)]
    Pod(#[from] TooManySessions),
    /// The pod holds `--max-principal-sessions` of the session's principal.
    #[error("this pod holds its maximum of {0} sessions of one principal")]
    Principal(usize),
}

/// Why a session pushed by a peer was not taken (`docs/design/handoff.md#one-holder-per-session`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// This pod holds its maximum of sessions.
    #[error(transparent)]
    Full(#[from] TooManySessions),
    /// This pod holds the session at a later epoch, or handed it on at the pushed epoch or a
    /// later one: the push is stale (a replay, or an earlier attempt).
    #[error("the session is held or was handed on at epoch {0}, after the pushed one")]
    Stale(u64),
    /// The session ended here: it is never taken again.
    #[error("the session ended on this pod")]
    Ended,
}

/// What adopting a pushed session did.
#[derive(Debug)]
pub(crate) enum Adopted {
    /// It is held here now.
    New,
    /// It was held here at that epoch already (a repeated push): nothing changed.
    Repeated,
    /// It replaced a copy of an earlier epoch (left by a push whose answer was lost), which is
    /// returned so its upstream session can be ended.
    Replaced(Arc<Session>),
}

/// The sessions this pod holds, by client session id.
#[derive(Debug)]
pub(crate) struct Registry {
    sessions: RwLock<Held>,
    /// Why sessions ended, by id digest.
    ended: Mutex<Bounded<String, NotFound>>,
    /// Where handed-off sessions went: client session id → UID of the new holder and the
    /// epoch it was pushed at.
    moved: Mutex<Bounded<String, (String, u64)>>,
    /// Handed-off sessions whose streams are still forwarded to the new holder, by id.
    departed: Mutex<HashMap<String, Arc<Session>>>,
    /// Handed-off sessions whose streams were all forwarded, kept while this pod drains with the
    /// UID of their new holder: if that pod leaves, the session is pushed again
    /// (`docs/design/handoff.md#a-pod-killed-mid-handoff`).
    kept: Mutex<HashMap<String, (Arc<Session>, String)>>,
    max_sessions: usize,
    /// Most sessions of one principal that a new one may join (`--max-principal-sessions`).
    max_principal_sessions: usize,
    /// Woken (all waiters) whenever what the pod has in flight may have shrunk: a request
    /// ended, a stream completed, a session left or a departed one was forgotten. A drain waits
    /// on it instead of polling.
    activity: Arc<Notify>,
    /// What the sessions retain.
    retained: Retained,
    /// The held sessions by when the sweeper looks at them next, with a tie-breaking number.
    schedule: Mutex<Schedule>,
}

#[derive(Debug, Default)]
struct Schedule {
    due: BTreeMap<(Instant, u64), Arc<Session>>,
    next: u64,
}

impl Schedule {
    fn put(&mut self, session: &Arc<Session>, at: Instant) {
        let mut place = session.sweep_at.lock();
        if let Some(old) = place.take() {
            self.due.remove(&old);
        }
        let key = (at, self.next);
        self.next += 1;
        self.due.insert(key, Arc::clone(session));
        *place = Some(key);
    }

    fn take(&mut self, session: &Session) {
        if let Some(old) = session.sweep_at.lock().take() {
            self.due.remove(&old);
        }
    }
}

impl Registry {
    /// An empty registry holding at most `max_sessions`, whose sessions count what they
    /// retain in `retained` (and are held to its caps).
    pub(crate) fn new(max_sessions: usize, retained: Retained) -> Self {
        Self {
            retained,
            sessions: RwLock::new(Held::default()),
            ended: Mutex::new(Bounded::new(ENDED_LOG)),
            moved: Mutex::new(Bounded::new(ENDED_LOG)),
            departed: Mutex::new(HashMap::new()),
            kept: Mutex::new(HashMap::new()),
            max_sessions,
            max_principal_sessions: max_sessions,
            activity: Arc::new(Notify::new()),
            schedule: Mutex::default(),
        }
    }

    /// Has the sweeper look at `session` at `at` (instead of when it was to).
    pub(crate) fn schedule(&self, session: &Arc<Session>, at: Instant) {
        self.schedule.lock().put(session, at);
    }

    /// The sessions due for a sweep at `now`, taken off the schedule ([`Registry::schedule`]
    /// puts them back).
    pub(crate) fn due(&self, now: Instant) -> Vec<Arc<Session>> {
        let mut schedule = self.schedule.lock();
        let mut due = Vec::new();
        while let Some(entry) = schedule.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let session = entry.remove();
            *session.sweep_at.lock() = None;
            due.push(session);
        }
        due
    }

    /// Puts every held session on the schedule at `at` (a reload changed the timeouts).
    pub(crate) fn schedule_all(&self, at: Instant) {
        let all = self.all();
        let mut schedule = self.schedule.lock();
        for session in &all {
            schedule.put(session, at);
        }
    }

    /// The pod's activity: woken whenever a request ends, a stream completes, a session leaves
    /// or a departed session is forgotten.
    pub(crate) fn activity(&self) -> &Notify {
        &self.activity
    }

    /// The tally of what the sessions retain besides event buffers.
    pub(crate) fn retained(&self) -> &Retained {
        &self.retained
    }

    /// Whether another session fits.
    pub(crate) fn has_room(&self) -> bool {
        self.sessions.read().len() < self.max_sessions
    }

    /// This registry, a new session joining at most `n` others of its principal
    /// (`--max-principal-sessions`; sessions handed over by peers are not refused for it).
    pub(crate) fn with_max_principal_sessions(mut self, n: usize) -> Self {
        self.max_principal_sessions = n;
        self
    }

    /// Registers a new session.
    ///
    /// # Errors
    /// [`NoRoom`] when the pod is full, or holds its share of the session's principal.
    pub(crate) fn insert(&self, session: Arc<Session>) -> Result<(), NoRoom> {
        session.report_to(&self.activity);
        let mut map = self.sessions.write();
        if map.len() >= self.max_sessions {
            return Err(TooManySessions(self.max_sessions).into());
        }
        if let Some(principal) = session.binding().and_then(|b| b.principal)
            && map.of_principal(&principal) >= self.max_principal_sessions
        {
            return Err(NoRoom::Principal(self.max_principal_sessions));
        }
        map.insert(Arc::clone(&session));
        drop(map);
        self.schedule(&session, Instant::now());
        Ok(())
    }

    /// The session with client id `id`.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.read().get(id).cloned()
    }

    /// Removes a session, remembering why (for the 404 reason of later requests).
    ///
    /// The reason is recorded while the session map is still locked, so a lookup never finds
    /// the session neither held nor ended.
    pub(crate) fn remove(&self, session: &Session, reason: NotFound) -> bool {
        let mut map = self.sessions.write();
        let removed = map.remove(&session.id).is_some();
        if removed {
            self.ended.lock().insert(session.digest.clone(), reason);
        }
        drop(map);
        self.schedule.lock().take(session);
        if removed {
            self.activity.notify_waiters();
        }
        removed
    }

    /// Forgets a session a peer (`to`) acknowledged; requests for it are sent there. It stays
    /// *departed* (its streams still forwarded) until [`Registry::forget_departed`].
    ///
    /// Where it went is recorded before it leaves the session map, under the map's lock: a
    /// request looking it up finds it held (and its handoff state says moved) or moved, never
    /// absent — its home would answer that 404 `unknown`.
    pub(crate) fn mark_moved(&self, session: &Arc<Session>, to: &str) {
        let mut map = self.sessions.write();
        self.moved
            .lock()
            .insert(session.id.clone(), (to.to_owned(), session.epoch()));
        map.remove(&session.id);
        drop(map);
        self.schedule.lock().take(session);
        self.departed
            .lock()
            .insert(session.id.clone(), Arc::clone(session));
        self.activity.notify_waiters();
    }

    /// A departed session (handed off, streams still forwarded) with client id `id`.
    pub(crate) fn departed(&self, id: &str) -> Option<Arc<Session>> {
        self.departed.lock().get(id).cloned()
    }

    /// Departed sessions.
    pub(crate) fn departed_count(&self) -> usize {
        self.departed.lock().len()
    }

    /// Every departed session.
    pub(crate) fn all_departed(&self) -> Vec<Arc<Session>> {
        self.departed.lock().values().cloned().collect()
    }

    /// The streams of a departed session are all forwarded: forget it, or (`keep`) keep it as
    /// the copy pushed again if its new holder `to` leaves.
    pub(crate) fn forget_departed(&self, id: &str, keep: Option<&str>) {
        let session = self.departed.lock().remove(id);
        if let (Some(session), Some(to)) = (session, keep) {
            self.kept
                .lock()
                .insert(id.to_owned(), (session, to.to_owned()));
        }
        self.activity.notify_waiters();
    }

    /// Kept sessions whose new holder `lost` says is gone, with that holder's UID.
    pub(crate) fn kept_lost(&self, lost: &dyn Fn(&str) -> bool) -> Vec<(Arc<Session>, String)> {
        self.kept
            .lock()
            .values()
            .filter(|(_, to)| lost(to))
            .map(|(session, to)| (Arc::clone(session), to.clone()))
            .collect()
    }

    /// Takes back a session handed off from here (departed or kept) to the pod `lost`: it is
    /// held here again, and `held_again` runs under the session map's lock, before any request
    /// can find it (it puts the session's handoff state back to held). `false` when this pod
    /// has no copy of it, holds it already, or handed it to another pod since (an earlier
    /// take-back moved it on: that holder is not lost).
    pub(crate) fn reclaim(
        &self,
        id: &str,
        lost: &str,
        held_again: impl FnOnce(&Arc<Session>),
    ) -> bool {
        let mut map = self.sessions.write();
        if map.contains_key(id) || self.moved_to(id).is_some_and(|to| to != lost) {
            return false;
        }
        let departed = self.departed.lock().remove(id);
        let Some(session) = departed.or_else(|| self.kept.lock().remove(id).map(|(s, _)| s)) else {
            return false;
        };
        held_again(&session);
        self.moved.lock().forget_where(|k, _| k == id);
        map.insert(Arc::clone(&session));
        drop(map);
        self.schedule(&session, Instant::now());
        self.activity.notify_waiters();
        true
    }

    /// The UID of the peer a session was handed to, if it was handed off from here.
    pub(crate) fn moved_to(&self, id: &str) -> Option<String> {
        self.moved.lock().get(id).map(|(to, _)| to.clone())
    }

    /// Registers a session handed over by a peer, by its epoch: a session held here at the same
    /// epoch is kept (a repeated push is acknowledged again), a copy of an earlier epoch is
    /// replaced; one held at a later epoch, handed on from here at the pushed epoch or later, or
    /// ended here is refused.
    ///
    /// # Errors
    /// [`Refused`].
    pub(crate) fn adopt(&self, session: Arc<Session>) -> Result<Adopted, Refused> {
        let epoch = session.epoch();
        let mut map = self.sessions.write();
        if self.ended.lock().get(&session.digest).is_some() {
            return Err(Refused::Ended);
        }
        if let Some(&(_, passed)) = self.moved.lock().get(&session.id)
            && passed >= epoch
        {
            return Err(Refused::Stale(passed));
        }
        let replaced = match map.get(&session.id) {
            Some(held) if held.epoch() > epoch => return Err(Refused::Stale(held.epoch())),
            Some(held) if held.epoch() == epoch => return Ok(Adopted::Repeated),
            Some(held) => Some(Arc::clone(held)),
            None if map.len() >= self.max_sessions => {
                return Err(TooManySessions(self.max_sessions).into());
            }
            None => None,
        };
        session.report_to(&self.activity);
        map.insert(Arc::clone(&session));
        drop(map);
        if let Some(stale) = &replaced {
            self.schedule.lock().take(stale);
        }
        self.schedule(&session, Instant::now());
        Ok(replaced.map_or(Adopted::New, Adopted::Replaced))
    }

    /// Whether this pod took session `id` at `epoch` or a later one: it holds it, still
    /// forwards its tail, or handed it on since (the answer to a sender whose push went
    /// unacknowledged).
    pub(crate) fn took(&self, id: &str, epoch: u64) -> bool {
        let held = self.sessions.read().get(id).map(|s| s.epoch());
        let departed = self.departed.lock().get(id).map(|s| s.epoch());
        let passed = self.moved.lock().get(id).map(|(_, e)| *e);
        [held, departed, passed]
            .into_iter()
            .flatten()
            .any(|e| e >= epoch)
    }

    /// Why a genuine id with this digest is not held: how it ended, or [`NotFound::Unknown`].
    pub(crate) fn why_missing(&self, digest: &str) -> NotFound {
        self.ended
            .lock()
            .get(digest)
            .copied()
            .unwrap_or(NotFound::Unknown)
    }

    /// Whether `session` is the one held under its id.
    pub(crate) fn holds(&self, session: &Arc<Session>) -> bool {
        self.sessions
            .read()
            .get(&session.id)
            .is_some_and(|held| Arc::ptr_eq(held, session))
    }

    /// A snapshot of every session.
    pub(crate) fn all(&self) -> Vec<Arc<Session>> {
        self.sessions.read().values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;
    use crate::session::fixtures::session;

    /// New sessions with `ids`, registered in `r`.
    fn held(r: &Registry, ids: impl Iterator<Item = String>) -> Vec<Arc<Session>> {
        let retained = Retained::new(u64::MAX);
        ids.map(|id| {
            let s = Session::new(
                id,
                crate::keys::test_key(),
                None,
                tether_crds::ProtocolVersion::V2025_06_18,
                crate::session::journal::Journal::new(serde_json::Value::Null),
                &retained,
            );
            r.insert(Arc::clone(&s)).unwrap();
            s
        })
        .collect()
    }

    #[test]
    fn a_session_being_moved_is_always_held_or_moved_never_absent() {
        const SESSIONS: usize = 20_000;
        let r = Arc::new(Registry::new(SESSIONS, Retained::new(u64::MAX)));
        let ids: Arc<Vec<String>> = Arc::new((0..SESSIONS).map(|k| format!("id{k}")).collect());
        let sessions = held(&r, ids.iter().cloned());
        let current = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let checker = {
            let (r, ids, current, done) = (
                Arc::clone(&r),
                Arc::clone(&ids),
                Arc::clone(&current),
                Arc::clone(&done),
            );
            std::thread::spawn(move || {
                let mut absent = 0;
                while !done.load(Ordering::Acquire) {
                    let id = &ids[current.load(Ordering::Acquire)];
                    if r.get(id).is_none() && r.moved_to(id).is_none() {
                        absent += 1;
                    }
                }
                absent
            })
        };
        for (k, s) in sessions.iter().enumerate() {
            current.store(k, Ordering::Release);
            r.mark_moved(s, "pod-b");
        }
        done.store(true, Ordering::Release);
        assert_eq!(
            checker.join().unwrap(),
            0,
            "lookups found a moving session absent"
        );
    }

    /// A session with client id `id`, bound to principal `p` (none: bound to no caller).
    fn bound(id: &str, p: Option<u8>) -> Arc<Session> {
        let s = Session::new(
            id.into(),
            crate::keys::test_key(),
            None,
            tether_crds::ProtocolVersion::V2025_06_18,
            crate::session::journal::Journal::new(serde_json::Value::Null),
            &Retained::new(u64::MAX),
        );
        s.bind(p.map(|p| crate::mcp::principal::Binding {
            kind: tether_crds::AuthBinding::Subject,
            principal: Some(crate::mcp::principal::Principal([p; 16])),
        }));
        s
    }

    #[test]
    fn a_principal_holds_its_share_of_the_sessions_and_gets_it_back() {
        let r = Registry::new(4, Retained::new(u64::MAX)).with_max_principal_sessions(2);
        let a1 = bound("a1", Some(1));
        r.insert(Arc::clone(&a1)).unwrap();
        r.insert(bound("a2", Some(1))).unwrap();
        assert_eq!(r.insert(bound("a3", Some(1))), Err(NoRoom::Principal(2)));
        r.insert(bound("b1", Some(2))).unwrap();
        r.insert(bound("n1", None)).unwrap();
        assert_eq!(
            r.insert(bound("b2", Some(2))),
            Err(TooManySessions(4).into()),
            "the pod's bound still holds"
        );
        assert!(r.remove(&a1, NotFound::Deleted));
        r.insert(bound("a3", Some(1))).unwrap();
        // A session handed away leaves its principal's count too.
        let a3 = r.get("a3").unwrap();
        r.mark_moved(&a3, "pod-b");
        assert_eq!(
            r.sessions
                .read()
                .of_principal(&crate::mcp::principal::Principal([1; 16])),
            1
        );
        assert!(r.reclaim("a3", "pod-b", |_| {}));
        assert_eq!(
            r.sessions
                .read()
                .of_principal(&crate::mcp::principal::Principal([1; 16])),
            2
        );
        assert_eq!(r.sessions.read().principals(), 2);
    }

    #[test]
    fn the_registry_remembers_why_sessions_ended() {
        let r = Registry::new(1, Retained::new(u64::MAX));
        let s = session();
        r.insert(Arc::clone(&s)).unwrap();
        assert_eq!(r.insert(session()), Err(TooManySessions(1).into()));
        assert!(r.remove(&s, NotFound::Deleted));
        assert!(r.get("id").is_none());
        assert_eq!(r.why_missing(s.digest()), NotFound::Deleted);
        assert_eq!(r.why_missing("other"), NotFound::Unknown);
    }

    #[test]
    fn a_sweep_takes_what_is_due_and_nothing_else() {
        let r = Registry::new(10_000, Retained::new(u64::MAX));
        let sessions = held(&r, (0..10_000).map(|k| format!("id{k}")));
        let now = Instant::now() + std::time::Duration::from_millis(1);
        let due = r.due(now);
        assert_eq!(due.len(), 10_000, "a new session is looked at once");
        // Every tenth is due again in a minute, the others in an hour.
        for (k, s) in due.iter().enumerate() {
            let minutes = if k % 10 == 0 { 1 } else { 60 };
            r.schedule(s, now + std::time::Duration::from_secs(60 * minutes));
        }
        assert!(r.due(now + std::time::Duration::from_secs(1)).is_empty());
        r.remove(&sessions[0], NotFound::Deleted);
        let in_a_minute = r.due(now + std::time::Duration::from_secs(61));
        assert_eq!(
            in_a_minute.len(),
            999,
            "a removed session is off the schedule"
        );
        assert!(r.due(now + std::time::Duration::from_secs(61)).is_empty());
        r.schedule(&sessions[1], now);
        r.schedule(&sessions[1], now + std::time::Duration::from_secs(7_200));
        assert_eq!(
            r.due(now + std::time::Duration::from_secs(3_601)).len(),
            8_999,
            "a session is on the schedule once, at its latest time"
        );
        r.schedule_all(now);
        assert_eq!(r.due(now).len(), 9_999);
    }
}

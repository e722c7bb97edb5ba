//! A session's link to its upstream session: the MCP server's session id and whether the
//! upstream session must be rebuilt from the journal before next use
//! (`docs/design/handoff.md`, `docs/design/architecture.md#sessions`).
//!
//! ```text
//!        adopted from a peer · its upstream session ended here
//!   ┌──────┐ ────────────────────────────────────────▶ ┌──────────────┐
//!   │ Live │                                           │ NeedsRebuild │ ◀──┐
//!   └──────┘                                           └──────────────┘    │ the server not ready
//!     │  ▲                                   a request's    │               │ (the row goes on) ·
//!     │  │ rebuilt (a new upstream id)       rebuild        ▼               │ it refused the
//!     │  │                                        ┌────────────┐            │ credentials (a new row)
//!     │  └─────────────────────────────────────── │ Rebuilding │ ───────────┘
//!     └── the upstream lost it ─────────────────▶ └────────────┘
//! ```
//!
//! - `Rebuilding` is the one [`UpstreamLink::rebuild_once`] under way: a second request waits
//!   for it, then finds the link `Live` (nothing to do) or still `NeedsRebuild` (tries again).
//!   While it runs the link keeps the state it had; the rebuild ends it in `Live`
//!   ([`UpstreamLink::rebuilt`]) or `NeedsRebuild` ([`UpstreamLink::defer`],
//!   [`UpstreamLink::rebuild_on_next_use`]). A rebuild that fails otherwise ends the session.
//! - A row of rebuilds the MCP server was not ready for counts from its first: the caller
//!   bounds it (`--rebuild-retry-for`). Any other answer ends the row.
//! - A session adopted with a standalone stream open at the sender opens one here once rebuilt,
//!   once ([`UpstreamLink::take_reopen_standalone`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Whether the upstream session can be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rebuild {
    /// It can.
    Live,
    /// It must be rebuilt from the journal first; `failing_since`: when the current row of
    /// rebuilds the MCP server was not ready for began.
    Needed { failing_since: Option<Instant> },
}

#[derive(Debug)]
struct Link {
    /// The MCP server's session id (none: the server keeps no sessions, or it was ended).
    id: Option<String>,
    rebuild: Rebuild,
}

/// The upstream session of one client session.
#[derive(Debug)]
pub(super) struct UpstreamLink {
    link: Mutex<Link>,
    /// Serialises rebuilds (`Rebuilding`).
    rebuilding: tokio::sync::Mutex<()>,
    /// Adopted with a standalone stream open at the sender: the rebuild opens one here too.
    reopen_standalone: AtomicBool,
}

impl UpstreamLink {
    /// A live link to upstream session `id`.
    pub(super) fn live(id: Option<String>) -> Self {
        Self {
            link: Mutex::new(Link {
                id,
                rebuild: Rebuild::Live,
            }),
            rebuilding: tokio::sync::Mutex::new(()),
            reopen_standalone: AtomicBool::new(false),
        }
    }

    /// `→ NeedsRebuild`: the session was adopted from a peer (no upstream session here yet),
    /// with a standalone stream to open once rebuilt when `reopen_standalone` (one was open
    /// there).
    pub(super) fn adopt(&self, reopen_standalone: bool) {
        self.rebuild_on_next_use();
        self.reopen_standalone
            .store(reopen_standalone, Ordering::Relaxed);
    }

    /// The upstream's session id.
    pub(super) fn id(&self) -> Option<String> {
        self.link.lock().id.clone()
    }

    /// Switches to another upstream session (rebuilt, or none while it is being ended).
    pub(super) fn set_id(&self, id: Option<String>) {
        self.link.lock().id = id;
    }

    /// Whether the upstream session must be rebuilt before next use.
    pub(super) fn needs_rebuild(&self) -> bool {
        matches!(self.link.lock().rebuild, Rebuild::Needed { .. })
    }

    /// `→ Live`: the upstream session was rebuilt.
    pub(super) fn rebuilt(&self) {
        self.link.lock().rebuild = Rebuild::Live;
    }

    /// `→ NeedsRebuild`, the MCP server not ready: returns how long rebuilds have been failing
    /// so (since the first of the row).
    pub(super) fn defer(&self) -> Duration {
        let now = Instant::now();
        let mut link = self.link.lock();
        let since = match link.rebuild {
            Rebuild::Needed {
                failing_since: Some(since),
            } => since,
            _ => now,
        };
        link.rebuild = Rebuild::Needed {
            failing_since: Some(since),
        };
        now.saturating_duration_since(since)
    }

    /// `→ NeedsRebuild`, a new row: the next request rebuilds the upstream session (it was
    /// ended here, or the MCP server answered but refused the caller's credentials).
    pub(super) fn rebuild_on_next_use(&self) {
        self.link.lock().rebuild = Rebuild::Needed {
            failing_since: None,
        };
    }

    /// Whether the rebuilt upstream session needs a standalone stream at once; `true` only once.
    pub(super) fn take_reopen_standalone(&self) -> bool {
        self.reopen_standalone.swap(false, Ordering::Relaxed)
    }

    /// Runs `work` (a rebuild) while no other rebuild runs (`Rebuilding`); callers check again
    /// inside whether one is still needed.
    pub(super) async fn rebuild_once<F: Future>(&self, work: F) -> F::Output {
        let _one_at_a_time = self.rebuilding.lock().await;
        work.await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn an_adopted_link_is_rebuilt_then_live() {
        let link = UpstreamLink::live(None);
        link.adopt(true);
        assert_eq!(link.id(), None);
        assert!(link.needs_rebuild());
        link.set_id(Some("u-2".into()));
        link.rebuilt();
        assert!(!link.needs_rebuild());
        assert_eq!(link.id().as_deref(), Some("u-2"));
        assert!(link.take_reopen_standalone());
        assert!(!link.take_reopen_standalone(), "reopened once");
        assert!(!UpstreamLink::live(None).take_reopen_standalone());
    }

    #[test]
    fn a_row_of_servers_not_ready_counts_from_its_first() {
        let link = UpstreamLink::live(Some("u-1".into()));
        assert!(!link.needs_rebuild());
        assert!(
            link.defer() < Duration::from_millis(1),
            "the first of a row"
        );
        std::thread::sleep(Duration::from_millis(20));
        assert!(link.defer() >= Duration::from_millis(20), "the row goes on");
        assert!(link.needs_rebuild());
        link.rebuild_on_next_use();
        assert!(
            link.defer() < Duration::from_millis(20),
            "an answer of the server ended the row"
        );
        link.rebuilt();
        assert!(
            link.defer() < Duration::from_millis(20),
            "a rebuild ended the row"
        );
    }

    #[tokio::test]
    async fn one_rebuild_at_a_time() {
        let link = Arc::new(UpstreamLink::live(None));
        link.adopt(false);
        let (entered, wait) = tokio::sync::oneshot::channel::<()>();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let first = tokio::spawn({
            let link = Arc::clone(&link);
            async move {
                link.rebuild_once(async {
                    entered.send(()).unwrap();
                    released.await.unwrap();
                    link.rebuilt();
                })
                .await;
            }
        });
        wait.await.unwrap();
        let second = link.rebuild_once(async { link.needs_rebuild() });
        tokio::pin!(second);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut second)
                .await
                .is_err(),
            "waits for the rebuild under way"
        );
        release.send(()).unwrap();
        assert!(!second.await, "then finds the link live");
        first.await.unwrap();
    }
}

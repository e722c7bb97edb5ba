//! Each principal's share of the pod's pinned bytes (`--max-principal-retained-bytes`,
//! `docs/design/buffering.md#principal-shares`): what the sessions bound to one principal
//! (`spec.auth.binding`) pin — their journals, tombstones and events no client was sent —
//! counted together, so that one caller cannot take the pod's budget from every other.
//!
//! A [`Share`] is one principal's tally, held by each of its sessions' charges and event
//! accounts; it leaves [`Shares`] when the last of them is dropped. [`admit`] decides, purely,
//! whether a request of a principal may add to what the pod pins.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::mcp::principal::Principal;

/// The principals with sessions on the pod and what each pins.
#[derive(Debug, Default)]
pub(crate) struct Shares {
    map: Mutex<HashMap<Principal, Weak<Share>>>,
    /// Principals pinning some bytes now (the fair share divides the budget among them).
    holding: AtomicU64,
}

/// What one principal's sessions pin; given back as their charges shrink or drop.
#[derive(Debug)]
pub(crate) struct Share {
    principal: Principal,
    pinned: AtomicU64,
    shares: Arc<Shares>,
}

impl Shares {
    /// The tally of `principal` (made when it has none).
    pub(crate) fn of(self: &Arc<Self>, principal: Principal) -> Arc<Share> {
        let mut map = self.map.lock();
        if let Some(share) = map.get(&principal).and_then(Weak::upgrade) {
            return share;
        }
        let share = Arc::new(Share {
            principal,
            pinned: AtomicU64::new(0),
            shares: Arc::clone(self),
        });
        map.insert(principal, Arc::downgrade(&share));
        share
    }

    /// Bytes `principal`'s sessions pin now (0 for a principal with none).
    pub(crate) fn pinned_by(&self, principal: &Principal) -> u64 {
        self.map
            .lock()
            .get(principal)
            .and_then(Weak::upgrade)
            .map_or(0, |s| s.pinned())
    }

    /// Principals pinning some bytes now.
    pub(crate) fn holding(&self) -> u64 {
        self.holding.load(Ordering::Relaxed)
    }

    /// Principals with a tally (for tests).
    #[cfg(test)]
    fn principals(&self) -> usize {
        self.map.lock().len()
    }
}

impl Share {
    /// Bytes the principal's sessions pin now.
    pub(crate) fn pinned(&self) -> u64 {
        self.pinned.load(Ordering::Relaxed)
    }

    /// Moves what one part of a session pins from `from` bytes to `to`.
    pub(crate) fn adjust(&self, from: u64, to: u64) {
        let holding = &self.shares.holding;
        if to > from {
            let grow = to - from;
            if self.pinned.fetch_add(grow, Ordering::Relaxed) == 0 {
                holding.fetch_add(1, Ordering::Relaxed);
            }
        } else if from > to {
            let shrink = from - to;
            if self.pinned.fetch_sub(shrink, Ordering::Relaxed) == shrink {
                holding.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut map = self.shares.map.lock();
        // A new tally may already stand for the principal: only a dead entry goes.
        if map
            .get(&self.principal)
            .is_some_and(|w| w.strong_count() == 0)
        {
            map.remove(&self.principal);
        }
    }
}

/// What the pod's pinned bytes look like to a request that would add to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PodPinned {
    /// Nothing more may be pinned: 429 `pod_full`, unless the request's principal holds less
    /// than the fair share (the budget divided among the principals pinning bytes), in which
    /// case the unread buffers of principals over it are shed instead.
    pub(crate) full: bool,
    /// `--pod-retained-bytes`.
    pub(crate) cap: u64,
    /// Principals pinning some bytes now.
    pub(crate) holding: u64,
}

/// The verdict on a request that would add to what the pod pins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Go on; the pod had room.
    Admit,
    /// Go on; the pod is full, so the principals over their fair share give up their unread
    /// buffers to make room.
    AdmitAndShed,
    /// The principal pins its whole `--max-principal-retained-bytes`, or its fair share of a
    /// full pod: 429 `principal_retained`.
    PrincipalFull,
    /// The pod is full and the request has no principal to weigh (a session bound to none):
    /// 429 `pod_full`.
    PodFull,
}

/// Decides a request of a principal pinning `pinned` bytes (`None`: a session bound to none),
/// each principal pinning at most `principal_cap`.
pub(crate) fn admit(pinned: Option<u64>, principal_cap: u64, pod: PodPinned) -> Admission {
    if pinned.is_some_and(|p| p >= principal_cap) {
        return Admission::PrincipalFull;
    }
    if !pod.full {
        return Admission::Admit;
    }
    match pinned {
        Some(p) if p < fair_share(pod) => Admission::AdmitAndShed,
        Some(_) => Admission::PrincipalFull,
        None => Admission::PodFull,
    }
}

/// The pod's budget divided among the principals pinning bytes now.
pub(crate) fn fair_share(pod: PodPinned) -> u64 {
    pod.cap / pod.holding.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(n: u8) -> Principal {
        Principal([n; 16])
    }

    #[test]
    fn admission_table() {
        let room = PodPinned {
            full: false,
            cap: 1_000,
            holding: 4,
        };
        let full = PodPinned { full: true, ..room };
        use Admission::*;
        for (pinned, cap, pod, want, why) in [
            (
                Some(0),
                250,
                room,
                Admit,
                "a principal with room, a pod with room",
            ),
            (
                None,
                250,
                room,
                Admit,
                "a session bound to none, a pod with room",
            ),
            (Some(249), 250, room, Admit, "just under its cap"),
            (
                Some(250),
                250,
                room,
                PrincipalFull,
                "at its cap, whatever the pod",
            ),
            (
                Some(900),
                250,
                full,
                PrincipalFull,
                "over its cap, the pod full",
            ),
            (Some(0), 250, full, AdmitAndShed, "a victim of a full pod"),
            (
                Some(249),
                1_000,
                full,
                AdmitAndShed,
                "under the fair share of 1,000 / 4",
            ),
            (Some(250), 1_000, full, PrincipalFull, "at the fair share"),
            (
                Some(600),
                1_000,
                full,
                PrincipalFull,
                "the one that filled the pod",
            ),
            (
                None,
                1_000,
                full,
                PodFull,
                "bound to none: no share to go by",
            ),
            (
                Some(999),
                1_000,
                PodPinned { holding: 1, ..full },
                AdmitAndShed,
                "the only principal: its fair share is the budget",
            ),
            (
                Some(0),
                1_000,
                PodPinned { holding: 0, ..full },
                AdmitAndShed,
                "nobody pins: the fair share is the budget",
            ),
        ] {
            assert_eq!(admit(pinned, cap, pod), want, "{why}");
        }
    }

    #[test]
    fn a_share_counts_its_parts_and_the_principals_holding_bytes() {
        let shares = Arc::new(Shares::default());
        let a = shares.of(principal(1));
        let a2 = shares.of(principal(1));
        let b = shares.of(principal(2));
        assert!(Arc::ptr_eq(&a, &a2), "one tally per principal");
        a.adjust(0, 100);
        a2.adjust(0, 50);
        assert_eq!(
            (shares.pinned_by(&principal(1)), shares.holding()),
            (150, 1)
        );
        b.adjust(0, 10);
        assert_eq!(shares.holding(), 2);
        a.adjust(100, 0);
        a2.adjust(50, 0);
        assert_eq!((shares.pinned_by(&principal(1)), shares.holding()), (0, 1));
        b.adjust(10, 5);
        assert_eq!(shares.holding(), 1, "still pinning 5 bytes");
        drop((a, a2));
        assert_eq!(shares.principals(), 1, "a tally nobody holds is gone");
        let again = shares.of(principal(1));
        assert_eq!(again.pinned(), 0);
        drop((b, again));
        assert_eq!(shares.principals(), 0);
    }
}

//! The connections one listener keeps open (`docs/design/architecture.md#connection-limits`):
//! at most `max` in all and at most `per_source` from one source address, so that neither a
//! flood of connections nor one client (or one pod) holds every connection of the pod.
//!
//! [`admit`] decides, [`Slots`] counts. A connection that is refused may still be answered (the
//! MCP port answers 503 and closes it): up to a sixteenth of `max` refused connections are held
//! for their answer at once, further ones are closed as soon as they are accepted, so that
//! refusing costs no more than a bounded share of the pod either.

use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::counts::Counts;

/// The bounds of one listener's connections (from flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotLimits {
    /// Most open connections.
    pub(crate) max: usize,
    /// Most open connections from one source address; 0: no such bound.
    pub(crate) per_source: usize,
}

impl SlotLimits {
    /// Most refused connections held for their answer at once: a sixteenth of `max`, at least 1.
    fn max_refusing(self) -> usize {
        (self.max / 16).max(1)
    }
}

/// Why a connection gets no slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::VariantArray)]
pub(crate) enum Full {
    /// Its source address holds `per_source` connections already.
    Source,
    /// The listener holds `max` connections already.
    Listener,
}

impl Full {
    /// The value of the `reason` label of `tether_connections_refused_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Full::Source => "source_full",
            Full::Listener => "listener_full",
        }
    }
}

/// Whether one more connection from a source that holds `from_source` of the `open` ones fits
/// within `limits`. The source's own bound is named first: it is what the client can change.
pub(crate) fn admit(open: usize, from_source: usize, limits: SlotLimits) -> Result<(), Full> {
    if limits.per_source > 0 && from_source >= limits.per_source {
        Err(Full::Source)
    } else if open >= limits.max {
        Err(Full::Listener)
    } else {
        Ok(())
    }
}

/// What a new connection gets.
#[derive(Debug)]
pub(crate) enum Taken {
    /// A slot: the connection is served.
    Open(Slot),
    /// No slot, but room to be answered why (`refusing` is held until the answer is written).
    Answer { full: Full, refusing: Slot },
    /// No slot and no room to answer: the connection is closed at once.
    Close(Full),
}

/// The open (and the refused but answered) connections of one listener.
#[derive(Debug)]
pub(crate) struct Slots {
    limits: SlotLimits,
    counts: Mutex<Taking>,
}

#[derive(Debug, Default)]
struct Taking {
    open: usize,
    refusing: usize,
    /// Open connections per source address (never more entries than open connections).
    by_source: Counts<IpAddr>,
}

/// One connection's place among the [`Slots`] (open, or refused and being answered), given
/// back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    slots: Arc<Slots>,
    held: Held,
}

/// What a [`Slot`] counts as.
#[derive(Clone, Copy, Debug)]
enum Held {
    /// An open connection, from this source address (if an IP connection).
    Open(Option<IpAddr>),
    /// A refused connection being answered.
    Refusing,
}

impl Slots {
    /// Room for the connections `limits` allows.
    pub(crate) fn new(limits: SlotLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            counts: Mutex::new(Taking::default()),
        })
    }

    /// A place for one more connection from `source` (`None`: not an IP connection, counted
    /// against the listener's bound only).
    pub(crate) fn take(self: &Arc<Self>, source: Option<IpAddr>) -> Taken {
        let mut counts = self.counts.lock();
        let from_source = source.map_or(0, |ip| counts.by_source.get(&ip));
        match admit(counts.open, from_source, self.limits) {
            Ok(()) => {
                counts.open += 1;
                if let Some(ip) = source {
                    counts.by_source.add(ip, 1);
                }
                Taken::Open(self.slot(Held::Open(source)))
            }
            Err(full) if counts.refusing < self.limits.max_refusing() => {
                counts.refusing += 1;
                Taken::Answer {
                    full,
                    refusing: self.slot(Held::Refusing),
                }
            }
            Err(full) => Taken::Close(full),
        }
    }

    fn slot(self: &Arc<Self>, held: Held) -> Slot {
        Slot {
            slots: Arc::clone(self),
            held,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.slots.counts.lock();
        match self.held {
            Held::Refusing => counts.refusing -= 1,
            Held::Open(source) => {
                counts.open -= 1;
                if let Some(ip) = source {
                    counts.by_source.sub(&ip, 1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    const LIMITS: SlotLimits = SlotLimits {
        max: 4,
        per_source: 2,
    };

    #[test]
    fn admit_names_the_source_first_then_the_listener() {
        let unbounded_source = SlotLimits {
            per_source: 0,
            ..LIMITS
        };
        // (open, from the source, limits, decision)
        let table = [
            (0, 0, LIMITS, Ok(())),
            (3, 1, LIMITS, Ok(())),
            (3, 2, LIMITS, Err(Full::Source)),
            (4, 1, LIMITS, Err(Full::Listener)),
            (4, 2, LIMITS, Err(Full::Source)),
            (3, 3, unbounded_source, Ok(())),
            (4, 4, unbounded_source, Err(Full::Listener)),
        ];
        for (open, from_source, limits, decision) in table {
            assert_eq!(
                admit(open, from_source, limits),
                decision,
                "{open} open, {from_source} from the source, {limits:?}"
            );
        }
    }

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)))
    }

    #[test]
    fn one_source_takes_its_share_and_the_others_the_rest() {
        let slots = Slots::new(LIMITS);
        let a1 = slots.take(ip(1));
        let a2 = slots.take(ip(1));
        assert!(matches!(a1, Taken::Open(_)) && matches!(a2, Taken::Open(_)));
        assert!(matches!(
            slots.take(ip(1)),
            Taken::Answer {
                full: Full::Source,
                ..
            }
        ));
        let b1 = slots.take(ip(2));
        let c1 = slots.take(None);
        assert!(matches!(b1, Taken::Open(_)) && matches!(c1, Taken::Open(_)));
        assert!(matches!(
            slots.take(ip(3)),
            Taken::Answer {
                full: Full::Listener,
                ..
            }
        ));
        drop(a1);
        assert!(
            matches!(slots.take(ip(1)), Taken::Open(_)),
            "a closed connection gives its source and the listener a slot back"
        );
        assert!(slots.counts.lock().by_source.len() <= 2);
    }

    #[test]
    fn refused_connections_are_answered_up_to_a_bound_then_closed() {
        let slots = Slots::new(SlotLimits {
            max: 16,
            per_source: 0,
        });
        let held: Vec<_> = (0..16).map(|_| slots.take(None)).collect();
        assert!(held.iter().all(|t| matches!(t, Taken::Open(_))));
        let answered = slots.take(None);
        assert!(matches!(answered, Taken::Answer { .. }), "{answered:?}");
        assert!(matches!(slots.take(None), Taken::Close(Full::Listener)));
        drop(answered);
        assert!(matches!(slots.take(None), Taken::Answer { .. }));
    }

    #[test]
    fn a_source_with_no_connection_left_has_no_entry() {
        let slots = Slots::new(LIMITS);
        let a = slots.take(ip(7));
        assert_eq!(slots.counts.lock().by_source.len(), 1);
        drop(a);
        let counts = slots.counts.lock();
        assert!(counts.by_source.is_empty() && counts.open == 0);
    }
}

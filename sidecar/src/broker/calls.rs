//! Calls in flight (`docs/design/architecture.md#bounds`): a request the broker dispatches to
//! the MCP server holds a [`CallSlot`] until its upstream exchange has ended — its answer read
//! whole, its stream over, or the call cancelled — whether or not a client still reads it. A
//! client that starts calls and walks away would otherwise make the pod (and the MCP server
//! behind it) carry any number of them. At most `--max-session-calls` run for one session,
//! `--max-principal-calls` for one principal (the sessions bound to one caller, `spec.auth`) and
//! `--max-calls` on the pod; beyond, the request gets 429 with `Retry-After` and is never sent.
//! A retry that joins its running request takes no slot. [`admit`] decides, [`Calls`] counts
//! (`tether_calls_in_flight`), and each call counts [`CALL_BYTES`] against the pod's budget
//! (`tether_retained_bytes{kind="calls"}`), so what calls cost is part of what the budget
//! keeps within bounds.

use std::sync::Arc;

use parking_lot::Mutex;

use super::metrics::BrokerMetrics;
use crate::counts::Counts;
use crate::mcp::principal::Principal;
use crate::mcp::rejection::CallScope;
use crate::retained::{Charge, Kind, Retained};

/// What a call in flight costs the sidecar while its upstream exchange runs, read or not: the
/// upstream connection's buffers and the tasks that drive it. Measured (`make bench`, the
/// Floods table's walked-away calls: 512 calls, +53 MiB of RSS in a release build; 1,024 calls,
/// +96 MiB in a debug one): about 100 KiB each.
pub(crate) const CALL_BYTES: u64 = 100 * 1024;

/// The bounds of calls in flight (from flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallLimits {
    /// Most calls of one session (`--max-session-calls`).
    pub(crate) session: usize,
    /// Most calls of one principal's sessions (`--max-principal-calls`).
    pub(crate) principal: usize,
    /// Most calls on the pod (`--max-calls`).
    pub(crate) pod: usize,
}

/// Calls running now: of the session, of its principal (`None`: the session is bound to no
/// principal), on the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Running {
    pub(crate) session: usize,
    pub(crate) principal: Option<usize>,
    pub(crate) pod: usize,
}

/// Whether `n` more calls fit beside `running` within `limits`; the narrowest bound that does
/// not is named (what the caller itself can change first).
pub(crate) fn admit(running: Running, n: usize, limits: CallLimits) -> Result<(), CallScope> {
    if running.session + n > limits.session {
        Err(CallScope::Session)
    } else if running.principal.is_some_and(|p| p + n > limits.principal) {
        Err(CallScope::Principal)
    } else if running.pod + n > limits.pod {
        Err(CallScope::Pod)
    } else {
        Ok(())
    }
}

/// The calls in flight on the pod, by session and by principal.
#[derive(Debug)]
pub(crate) struct Calls {
    limits: CallLimits,
    counts: Mutex<InFlight>,
    metrics: Arc<BrokerMetrics>,
    retained: Retained,
}

#[derive(Debug, Default)]
struct InFlight {
    pod: usize,
    /// By session digest.
    by_session: Counts<String>,
    /// By principal.
    by_principal: Counts<Principal>,
}

/// What `n` calls of one session hold, given back when dropped.
#[derive(Debug)]
pub(crate) struct CallSlot {
    calls: Arc<Calls>,
    session: String,
    principal: Option<Principal>,
    n: usize,
    /// The calls' [`CALL_BYTES`] in the pod's budget.
    _bytes: Charge,
}

impl Calls {
    /// No calls yet, bounded by `limits`, counted in `metrics` and in the pod's `retained`
    /// bytes.
    pub(crate) fn new(
        limits: CallLimits,
        metrics: Arc<BrokerMetrics>,
        retained: Retained,
    ) -> Arc<Self> {
        Arc::new(Self {
            limits,
            counts: Mutex::new(InFlight::default()),
            metrics,
            retained,
        })
    }

    /// Slots for `n` calls of the session with digest `session`, bound to `principal`.
    ///
    /// # Errors
    /// The bound `n` more calls would pass.
    pub(crate) fn take(
        self: &Arc<Self>,
        session: &str,
        principal: Option<Principal>,
        n: usize,
    ) -> Result<CallSlot, CallScope> {
        let mut counts = self.counts.lock();
        let running = Running {
            session: counts.by_session.get(session),
            principal: principal.map(|p| counts.by_principal.get(&p)),
            pod: counts.pod,
        };
        admit(running, n, self.limits)?;
        counts.pod += n;
        counts.by_session.add(session.to_owned(), n);
        if let Some(p) = principal {
            counts.by_principal.add(p, n);
        }
        self.metrics.set_calls_in_flight(counts.pod);
        let mut bytes = self.retained.charge(Kind::Calls);
        bytes.resize(CALL_BYTES * n as u64);
        Ok(CallSlot {
            calls: Arc::clone(self),
            session: session.to_owned(),
            principal,
            n,
            _bytes: bytes,
        })
    }
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        let mut counts = self.calls.counts.lock();
        counts.pod = counts.pod.saturating_sub(self.n);
        counts.by_session.sub(&self.session, self.n);
        if let Some(p) = &self.principal {
            counts.by_principal.sub(p, self.n);
        }
        self.calls.metrics.set_calls_in_flight(counts.pod);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: CallLimits = CallLimits {
        session: 2,
        principal: 3,
        pod: 4,
    };

    #[test]
    fn admit_names_the_narrowest_bound_passed() {
        let running = |session, principal, pod| Running {
            session,
            principal,
            pod,
        };
        // (running, more calls, decision)
        let table = [
            (running(0, Some(0), 0), 1, Ok(())),
            (running(1, Some(2), 3), 1, Ok(())),
            (running(2, Some(2), 2), 1, Err(CallScope::Session)),
            (running(0, Some(0), 0), 3, Err(CallScope::Session)),
            (running(1, Some(3), 3), 1, Err(CallScope::Principal)),
            (running(1, None, 3), 1, Ok(())),
            (running(1, None, 4), 1, Err(CallScope::Pod)),
            (running(0, Some(1), 3), 2, Err(CallScope::Pod)),
        ];
        for (running, n, decision) in table {
            assert_eq!(
                admit(running, n, LIMITS),
                decision,
                "{running:?} and {n} more"
            );
        }
    }

    #[test]
    fn slots_are_counted_per_session_principal_and_pod_and_given_back() {
        let retained = Retained::new(u64::MAX);
        let calls = Calls::new(
            LIMITS,
            Arc::new(BrokerMetrics::new(&mut Default::default())),
            retained.clone(),
        );
        let alice = Some(Principal([1; 16]));
        let a1 = calls.take("s1", alice, 2).unwrap();
        assert_eq!(calls.take("s1", alice, 1).unwrap_err(), CallScope::Session);
        let a2 = calls.take("s2", alice, 1).unwrap();
        assert_eq!(
            calls.take("s3", alice, 1).unwrap_err(),
            CallScope::Principal,
            "alice's third session is over her share"
        );
        let b = calls.take("s4", None, 1).unwrap();
        assert_eq!(calls.take("s5", None, 1).unwrap_err(), CallScope::Pod);
        assert_eq!(
            retained.bytes(Kind::Calls),
            4 * CALL_BYTES,
            "each call's cost in the pod's budget, refused ones none"
        );
        drop((a1, a2, b));
        assert_eq!(retained.bytes(Kind::Calls), 0);
        let counts = calls.counts.lock();
        assert_eq!(counts.pod, 0);
        assert!(counts.by_session.is_empty() && counts.by_principal.is_empty());
    }
}

//! The machine's `CLOCK_MONOTONIC`, the one clock every process of the machine shares: the
//! benchmark origin stamps its events with it, a client subtracts, and the difference is the
//! event's lag across processes.

/// `CLOCK_MONOTONIC` now, in nanoseconds (0 if the clock cannot be read, which Linux never
/// refuses).
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

//! Unique loopback addresses, so tests running in parallel (threads of one test binary, test
//! binaries of several checkouts on one machine) never share a listener.
//!
//! Linux routes all of 127.0.0.0/8 to the loopback interface, so every pod gets its own IP and
//! can use fixed ports. The second octet is derived from the running binary's name and its
//! process id; the last two count up within the process. Nothing hands out 127.0.0.0/16, which
//! stays free for servers a developer runs on 127.0.0.1.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A fresh loopback address, `127.x.y.z` with `x` in 10..=249 (one per process) and `y.z`
/// counting up from `0.1` (250 addresses per `y`).
pub fn next_ip() -> Ipv4Addr {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
        .unwrap_or_default();
    // FNV-1a over the binary name and the process id: spread across binaries, and across runs
    // of one binary at the same time (two checkouts testing on one machine).
    let input = format!("{binary}/{}", std::process::id());
    let hash = input.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let x = 10 + (hash % 240) as u8;
    Ipv4Addr::new(127, x, (n / 250) as u8, (n % 250 + 1) as u8)
}

/// `N` fresh addresses of [`next_ip`], e.g. `let [a, b, c] = addr::ips();` for a 3-pod cluster.
pub fn ips<const N: usize>() -> [Ipv4Addr; N] {
    std::array::from_fn(|_| next_ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_loopback_and_distinct() {
        let a = next_ip();
        let [b, c] = ips();
        assert!(
            [a, b, c]
                .iter()
                .all(|ip| ip.is_loopback() && ip.octets()[1] >= 10)
        );
        assert!(a != b && b != c && a != c);
    }
}

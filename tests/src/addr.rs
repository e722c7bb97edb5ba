//! Unique loopback addresses, so tests running in parallel (threads of one test binary) and one
//! after another (test binaries) never share a listener.
//!
//! Linux routes all of 127.0.0.0/8 to the loopback interface, so every pod gets its own IP and
//! can use fixed ports. The second octet is derived from the running binary's name; the last two
//! count up within the process.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A fresh loopback address, `127.x.y.z` with `x` in 10..=249.
pub fn next_ip() -> Ipv4Addr {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
        .unwrap_or_default();
    // FNV-1a over the binary name: stable across runs, spread across binaries.
    let hash = binary.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let x = 10 + (hash % 240) as u8;
    Ipv4Addr::new(127, x, (n / 250) as u8, (n % 250 + 1) as u8)
}

/// `127.0.0.n`: the fixed addresses the routing scenarios name (127.0.0.2–4 …). No other
/// helper hands these out ([`next_ip`] starts at 127.10.0.0).
pub fn fixed(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_loopback_and_distinct() {
        let a = next_ip();
        let b = next_ip();
        assert!(a.is_loopback() && b.is_loopback());
        assert_ne!(a, b);
    }
}

//! The static peers file (`sidecar/src/cluster/membership/peers_file.rs`) and the routing view
//! built from it (`sidecar/src/cluster/membership/mod.rs`).
//!
//! Invariants: an accepted file lists at least one pod, every UID valid and unique; the file
//! written back from what was read (every field spelled out) reads as the same membership, and
//! writing that again gives the same text; a refusal is one of the documented kinds. In the view:
//! every pod is found by its home token, `owner(S)` is a routable pod of the newest revision (or
//! none without a routable pod), and `ranked(S)` and the lookup walk list every live pod once.

#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;
use tether_sidecar::PeerState;
use tether_sidecar::fuzzing::{Routing, parse_peers, print_peers, valid_uid};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let peers = match parse_peers(text) {
        Ok(peers) => peers,
        Err(e) => {
            assert!(
                ["syntax", "empty", "invalid_uid", "duplicate_uid"].contains(&e.kind),
                "{e:?}"
            );
            assert!(e.message.starts_with("invalid peers file: "), "{e:?}");
            return;
        }
    };
    assert!(!peers.is_empty());
    let uids: BTreeSet<&str> = peers.iter().map(|p| p.uid.as_str()).collect();
    assert_eq!(uids.len(), peers.len(), "a uid repeats");
    for p in &peers {
        assert!(valid_uid(&p.uid), "{:?}", p.uid);
        assert_eq!(p.peer_port, None);
    }

    let written = print_peers(&peers);
    let reread = parse_peers(&written).unwrap_or_else(|e| panic!("{e:?} reading\n{written}"));
    assert_eq!(reread, peers, "written back:\n{written}");
    assert_eq!(print_peers(&reread), written);

    let routing = Routing::new(peers.clone());
    for p in &peers {
        assert_eq!(routing.home_of(&p.uid).as_deref(), Some(p.uid.as_str()));
    }
    let alive: BTreeSet<&str> = peers
        .iter()
        .filter(|p| p.state != PeerState::Gone)
        .map(|p| p.uid.as_str())
        .collect();
    let newest = routing.newest_revision();
    for key in [text, "session", ""] {
        match routing.owner(key) {
            Some(owner) => {
                assert_eq!(owner.state, PeerState::Routable);
                assert_eq!(Some(owner.revision), newest);
            }
            None => assert!(peers.iter().all(|p| p.state != PeerState::Routable)),
        }
        for order in [routing.ranked(key), routing.walk(key)] {
            let listed: BTreeSet<&str> = order.iter().map(String::as_str).collect();
            assert_eq!(listed.len(), order.len(), "a pod listed twice: {order:?}");
            assert_eq!(listed, alive);
        }
    }
});

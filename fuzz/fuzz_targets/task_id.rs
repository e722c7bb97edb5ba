//! Task ids (`sidecar/src/mcp/sealed.rs`) and their exchange in messages
//! (`sidecar/src/mcp/tasks.rs`).
//!
//! The input gives an endpoint secret, a pod UID, a server task id, a presented client id and a
//! JSON message. Invariants: a server id of at most 256 bytes seals to visible ASCII and opens,
//! on any pod of the endpoint, to the minting pod and that id, and under no other secret; a
//! presented id that opens is exactly the id its pod mints for what it opens to (ids are
//! canonical: no second spelling of a task); sealing a message never panics, changes it only when
//! it reports a change (and then leaves serializable JSON), and reports only task objects whose
//! ids it could seal; opening a client message never panics and names only ids of at most 256
//! bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tether_sidecar::fuzzing::{TaskCodec, home_token};

fuzz_target!(|data: &[u8]| {
    // [secret length] [secret] [uid length] [uid] [server id length] [server id]
    // [presented id] 0x00 [message]
    let Some((&secret_len, rest)) = data.split_first() else {
        return;
    };
    let secret_len = 1 + usize::from(secret_len % 64);
    if rest.len() < secret_len + 2 {
        return;
    }
    let (secret, rest) = rest.split_at(secret_len);
    let uid_len = usize::from(rest[0] % 32).min(rest.len() - 2);
    let uid = String::from_utf8_lossy(&rest[1..1 + uid_len]).into_owned();
    let rest = &rest[1 + uid_len..];
    let upstream_len = usize::from(rest[0]).min(rest.len() - 1);
    let upstream = String::from_utf8_lossy(&rest[1..1 + upstream_len]).into_owned();
    let rest = &rest[1 + upstream_len..];
    let (presented, message) = match rest.iter().position(|&b| b == 0) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &[][..]),
    };

    let home = home_token(&uid);
    let codec = TaskCodec::new(secret, home);
    let elsewhere = TaskCodec::new(secret, home_token("another pod"));
    let mut other_secret = secret.to_vec();
    other_secret[0] ^= 0x80;
    let foreign = TaskCodec::new(&other_secret, home);

    match codec.mint(&upstream) {
        Some(id) => {
            assert!(upstream.len() <= 256);
            assert!(id.bytes().all(|b| b.is_ascii_graphic()), "{id}");
            assert_eq!(elsewhere.open(&id), Some((home, upstream.clone())));
            assert_eq!(foreign.open(&id), None);
            assert_eq!(codec.mint(&upstream).as_deref(), Some(id.as_str()));
        }
        None => assert!(upstream.len() > 256),
    }

    if let Ok(presented) = std::str::from_utf8(presented)
        && let Some((owner, server_id)) = codec.open(presented)
    {
        let minted = TaskCodec::new(secret, owner).mint(&server_id);
        assert_eq!(minted.as_deref(), Some(presented), "a second spelling");
    }

    let Ok(mut value) = serde_json::from_slice::<Value>(message) else {
        return;
    };
    let original = value.clone();
    let (sealed, seen) = codec.seal(&mut value);
    match sealed {
        Ok(false) => assert_eq!(value, original),
        Ok(true) => {
            assert_ne!(value, original);
            assert!(serde_json::to_vec(&value).is_ok());
        }
        Err(()) => {}
    }
    for server_id in &seen {
        assert!(
            codec.mint(server_id).is_some() || sealed.is_err(),
            "{server_id}"
        );
    }
    for session in [false, true] {
        let mut client = original.clone();
        if let Ok(Some(server_id)) = codec.open_message(&mut client, session) {
            assert!(server_id.len() <= 256);
        }
    }
});

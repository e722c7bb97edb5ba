//! Client session ids (`sidecar/src/mcp/session_id.rs`).
//!
//! The input gives an endpoint secret, a pod UID and a presented id.
//! Invariants: a minted id is 60 characters of base64url and verifies,
//! with the minting pod's home token, under the same secret and under no other; the verdict on
//! any presented id is the one the format defines, recomputed here from the MAC itself
//! (malformed, unknown version, bad MAC — a key id that is not the secret's included — or
//! genuine), and a genuine id is the canonical encoding of its bytes, carries the home token it
//! is verified with, and its MAC is the secret's; a minted id with one character changed never
//! verifies.

#![no_main]

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use libfuzzer_sys::fuzz_target;
use tether_sidecar::fuzzing::{
    IdRejection, Minter, SESSION_ID_LEN, SESSION_ID_VERSION, home_token, key_id, session_id_mac,
};

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fuzz_target!(|data: &[u8]| {
    // [secret length] [secret] [uid length] [uid] [position] [character] [presented id]
    let Some((&secret_len, rest)) = data.split_first() else {
        return;
    };
    let secret_len = 1 + usize::from(secret_len % 64);
    if rest.len() < secret_len + 3 {
        return;
    }
    let (secret, rest) = rest.split_at(secret_len);
    let uid_len = usize::from(rest[0] % 32).min(rest.len() - 3);
    let uid = String::from_utf8_lossy(&rest[1..1 + uid_len]).into_owned();
    let (pos, ch) = (rest[1 + uid_len], rest[2 + uid_len]);
    let presented = &rest[3 + uid_len..];

    let minter = Minter::new(secret, &uid);
    let mut other_secret = secret.to_vec();
    other_secret[0] ^= 0x80;
    let other = Minter::new(&other_secret, &uid);

    let id = minter.mint();
    assert_eq!(id.len(), SESSION_ID_LEN);
    assert!(id.bytes().all(|b| BASE64URL.contains(&b)), "{id}");
    assert_eq!(minter.verify(&id), Ok(home_token(&uid)));
    assert_eq!(
        Minter::new(secret, "another pod").verify(&id),
        Ok(home_token(&uid))
    );
    assert_eq!(other.verify(&id), Err(IdRejection::BadMac));

    let mut tampered = id.clone().into_bytes();
    let pos = usize::from(pos) % SESSION_ID_LEN;
    tampered[pos] = BASE64URL[usize::from(ch % 64)];
    if tampered != id.as_bytes() {
        let tampered = String::from_utf8(tampered).unwrap();
        assert!(minter.verify(&tampered).is_err(), "{tampered} verifies");
    }

    if let Ok(presented) = std::str::from_utf8(presented) {
        let verdict = minter.verify(presented);
        assert_eq!(verdict, expected(secret, presented), "{presented:?}");
        if let Ok(home) = verdict {
            let raw = URL_SAFE_NO_PAD.decode(presented).unwrap();
            assert_eq!(URL_SAFE_NO_PAD.encode(&raw), presented, "not canonical");
            let at = raw.len() - 24;
            assert_eq!(raw[at..at + 8], home);
            assert_eq!(other.verify(presented), Err(IdRejection::BadMac));
        }
    }
});

/// The verdict the format defines for `id` under `secret`: version, the id of the key, random,
/// home token and the MAC over everything before it.
fn expected(secret: &[u8], id: &str) -> Result<[u8; 8], IdRejection> {
    if id.len() != SESSION_ID_LEN {
        return Err(IdRejection::Malformed);
    }
    let raw = URL_SAFE_NO_PAD
        .decode(id)
        .map_err(|_| IdRejection::Malformed)?;
    if raw.len() != 1 + 4 + 40 {
        return Err(IdRejection::Malformed);
    }
    if raw[0] != SESSION_ID_VERSION {
        return Err(IdRejection::UnknownVersion);
    }
    if raw[1..5] != key_id(secret) {
        return Err(IdRejection::BadMac);
    }
    let signed = raw.len() - 16;
    if session_id_mac(secret, &raw[..signed])[..16] != raw[signed..] {
        return Err(IdRejection::BadMac);
    }
    Ok(raw[signed - 8..signed].try_into().unwrap())
}

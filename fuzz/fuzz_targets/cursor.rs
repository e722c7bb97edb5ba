//! `Last-Event-ID` cursors and event ids (`sidecar/src/mcp/cursor.rs`).
//!
//! Invariants: a value the sidecar accepts is at most `MAX_CURSOR_LEN` bytes, names a 12-character
//! stream key, and formats back to exactly itself (one position, one spelling); every id the
//! sidecar writes (`<key>-<seq>`, any key, any sequence) parses back to the same position, so a
//! value shaped like one is never refused.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tether_sidecar::fuzzing::{MAX_CURSOR_LEN, format_cursor, parse_cursor};

/// The characters of a stream key.
const KEY_ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = std::str::from_utf8(data) {
        check_value(value);
    }
    // An id the sidecar writes, from the input's bytes: 12 key characters and a sequence.
    if data.len() >= 20 {
        let key: String = data[..12]
            .iter()
            .map(|b| KEY_ALPHABET[usize::from(b & 31)] as char)
            .collect();
        let seq = u64::from_le_bytes(data[12..20].try_into().unwrap());
        let id = format_cursor(&key, seq).expect("a key of the alphabet is a stream key");
        assert_eq!(id, format!("{key}-{seq}"));
        let parsed = parse_cursor(&id).expect("every id the sidecar writes parses");
        assert_eq!((parsed.stream.as_str(), parsed.seq), (key.as_str(), seq));
    }
});

fn check_value(value: &str) {
    match parse_cursor(value) {
        Some(cursor) => {
            assert!(
                value.len() <= MAX_CURSOR_LEN,
                "{value:?} is too long to accept"
            );
            assert_eq!(cursor.stream.len(), 12, "{value:?}");
            assert!(cursor.stream.bytes().all(|b| KEY_ALPHABET.contains(&b)));
            assert_eq!(
                format_cursor(&cursor.stream, cursor.seq).as_deref(),
                Some(value),
                "an accepted cursor formats back to itself"
            );
        }
        None => {
            // Refused: then it is not how the sidecar writes any id.
            if let Some((key, seq)) = value.split_once('-')
                && let Ok(n) = seq.parse::<u64>()
                && let Some(id) = format_cursor(key, n)
            {
                assert_ne!(id, value, "the sidecar refuses an id it writes");
            }
        }
    }
}

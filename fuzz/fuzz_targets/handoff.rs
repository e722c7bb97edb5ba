//! The peer protocol's messages and the adoption of a pushed session
//! (`sidecar/src/peer/wire.rs`, `sidecar/src/handoff/image.rs`).
//!
//! The input is a peer message body: a `POST /v2/sessions` push, optionally followed by a NUL
//! byte and a `POST /v2/tail` body. Invariants:
//!
//! - every kind of message the listener decodes re-encodes to bytes that decode to the same
//!   message, and encoding that gives the same bytes again (JSON text is not kept byte for byte:
//!   spacing and escapes are the encoder's);
//! - an adopted session's image (what this pod would push on) adopted again gives the same image:
//!   what the receiver leaves out or normalises is gone after one hop;
//! - every stream the pod holds keeps its numbering: events in strictly increasing order, each
//!   within `(evicted_through, last_seq]`, with event names an SSE frame can carry;
//! - a client reading a stream from its start is sent the priming event (when the session primes)
//!   and then exactly the buffered events with their own ids (or only the priming event when
//!   events were evicted); one at the end is sent a priming event with a fresh number; once a
//!   followed stream is abandoned its ids still increase.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sse_stream::Sse;
use tether_sidecar::fuzzing::{
    PeerMessage, RestoredStream, adopt, decode_upstream, parse_cursor, wire_round_trip,
};

fuzz_target!(|data: &[u8]| {
    let push = data.split(|&b| b == 0).next().unwrap_or_default();
    for kind in [PeerMessage::Session, PeerMessage::Tail, PeerMessage::Cancel] {
        if let Some(trip) = wire_round_trip(kind, push) {
            assert!(trip.same_value, "{kind:?}: {}", text(&trip.encoded));
            assert_eq!(text(&trip.reencoded), text(&trip.encoded), "{kind:?}");
        }
    }
    let Ok(adopted) = adopt(data) else {
        return;
    };
    for stream in &adopted.streams {
        check_stream(stream, adopted.primes);
    }
    let again = adopt(&adopted.reimaged).expect("an adopted session's image is adopted");
    assert_eq!(text(&again.reimaged), text(&adopted.reimaged));
});

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn check_stream(s: &RestoredStream, primes: bool) {
    assert!(
        !(s.complete && s.following),
        "{}: complete and followed",
        s.key
    );
    assert!(
        s.evicted_through <= s.last_seq,
        "{}: evicted beyond its end",
        s.key
    );
    let mut last = s.evicted_through;
    for (seq, event, _) in &s.events {
        assert!(
            *seq > last && *seq <= s.last_seq,
            "{}: event {seq} out of order",
            s.key
        );
        last = *seq;
        if let Some(event) = event {
            assert!(
                !event.contains(['\r', '\n']),
                "{}: event name {event:?}",
                s.key
            );
        }
    }
    // From the start.
    let got = decoded(&s.replay);
    let mut want = Vec::new();
    if primes {
        want.push(priming(&s.key, 0));
    }
    if s.evicted_through == 0 {
        for (seq, event, data) in &s.events {
            let data = String::from_utf8(data.clone()).expect("event data is text");
            want.push(Sse {
                id: Some(format!("{}-{seq}", s.key)),
                event: event.clone(),
                data: Some(data.replace("\r\n", "\n").replace('\r', "\n")),
                retry: None,
            });
        }
    }
    assert_eq!(got, want, "{}: replay from the start", s.key);
    // At the end.
    let got = decoded(&s.at_end);
    let want = match s.last_seq {
        _ if !primes => vec![],
        0 => vec![priming(&s.key, 0)],
        _ if s.following => vec![],
        last => vec![priming(&s.key, last + 1)],
    };
    assert_eq!(got, want, "{}: a reader at the end", s.key);
    // After the writer died.
    if let Some(bytes) = &s.after_abandon {
        let mut previous = None;
        for ev in decoded(bytes) {
            let id = ev.id.expect("every event has an id");
            let cursor = parse_cursor(&id).expect("ids are cursors");
            assert_eq!(cursor.stream, s.key);
            assert!(
                previous < Some(cursor.seq) || cursor.seq == 0,
                "{id} after {previous:?}"
            );
            previous = Some(cursor.seq);
        }
    }
}

fn priming(key: &str, seq: u64) -> Sse {
    Sse {
        id: Some(format!("{key}-{seq}")),
        data: Some(String::new()),
        event: None,
        retry: None,
    }
}

fn decoded(bytes: &[u8]) -> Vec<Sse> {
    decode_upstream(&[bytes])
        .into_iter()
        .map(|r| r.expect("the sidecar's frames decode"))
        .collect()
}

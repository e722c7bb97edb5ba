//! Upstream SSE as the sidecar consumes it, and the frames it writes to clients
//! (`sidecar/src/upstream.rs`, `sidecar/src/broker/pump.rs`, `sidecar/src/mcp/sse.rs`).
//!
//! The upstream body is decoded by the `sse-stream` crate; what is tether's is what it does with
//! the events and the bytes it writes. The first byte sets a chunk size, the rest is an upstream
//! body. Invariants:
//!
//! - the events do not depend on how the body is cut into chunks;
//! - the event size bound (`--max-event-bytes`) only ends the stream early: the events that pass
//!   are the first ones of the unbounded decoder, none with more data than the bound;
//! - the pump appends exactly the events that carry data, once per upstream id among the recent
//!   ones, with `message` as no event name, and remembers the last id and `retry` for a resume;
//! - what the sidecar then writes — a priming event, each appended event with its own id,
//!   `retry` frames, keep-alives — a client decodes into exactly those events, ids and hints;
//! - any text the sidecar frames as an event's data (an upstream's non-SSE answer is framed as
//!   it came) reaches the client as the same lines: line ends (LF, CRLF, CR) become LF.

#![no_main]

use std::collections::VecDeque;

use libfuzzer_sys::fuzz_target;
use sse_stream::Sse;
use tether_sidecar::fuzzing::{
    KEEP_ALIVE, UpstreamRelay, decode_upstream, decode_upstream_within, frame_event, frame_priming,
    frame_retry,
};

/// The stream key of the client-side frames.
const KEY: &str = "fuzzstream27";
/// Upstream ids the pump remembers to drop events sent again on resume.
const RECENT_IDS: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, body)) = data.split_first() else {
        return;
    };
    let whole = decode_upstream(&[body]);
    let size = 1 + usize::from(cut % 32);
    let chunks: Vec<&[u8]> = body.chunks(size).collect();
    let chunked = decode_upstream(&chunks);
    assert_eq!(ok_events(&whole), ok_events(&chunked), "chunks of {size}");
    assert_eq!(
        whole.last().is_some_and(Result::is_err),
        chunked.last().is_some_and(Result::is_err)
    );
    let events = ok_events(&whole);

    // The event size bound only ends the stream early: what passes is what the unbounded
    // decoder gives, in order, and no data over the bound gets through.
    let limit = 1 + usize::from(cut) * 8;
    let bounded = ok_events(&decode_upstream_within(&chunks, limit));
    assert!(bounded.len() <= events.len(), "bound {limit}");
    assert_eq!(bounded[..], events[..bounded.len()], "bound {limit}");
    assert!(
        bounded
            .iter()
            .all(|e| e.data.as_ref().map_or(0, String::len) <= limit),
        "bound {limit}"
    );

    // The pump.
    let mut relay = UpstreamRelay::new();
    let mut recent: VecDeque<String> = VecDeque::new();
    let mut appended = Vec::new();
    let (mut last_id, mut retry) = (None, None);
    for ev in &events {
        let took = relay.take(ev.clone());
        if let Some(id) = &ev.id {
            last_id = Some(id.clone());
        }
        if let Some(r) = ev.retry {
            retry = Some(u128::from(r));
        }
        let expected = match &ev.data {
            Some(d) if !d.is_empty() => {
                let fresh = match &ev.id {
                    Some(id) if recent.contains(id) => false,
                    Some(id) => {
                        if recent.len() == RECENT_IDS {
                            recent.pop_front();
                        }
                        recent.push_back(id.clone());
                        true
                    }
                    None => true,
                };
                fresh.then(|| {
                    let event = ev.event.clone().filter(|e| e != "message");
                    (event, d.as_bytes().to_vec())
                })
            }
            _ => None,
        };
        assert_eq!(took, expected, "{ev:?}");
        assert_eq!(relay.last_id(), last_id.as_deref());
        assert_eq!(relay.retry_ms(), retry);
        if let Some(message) = took {
            appended.push(message);
        }
    }

    // What a client is sent for them, and what it decodes.
    let hint = events.iter().find_map(|e| e.retry);
    let mut out = frame_priming(KEY, 0, hint).unwrap();
    let mut want = vec![Sse {
        id: Some(format!("{KEY}-0")),
        data: Some(String::new()),
        retry: hint,
        event: None,
    }];
    for (i, (event, data)) in appended.iter().enumerate() {
        let seq = i as u64 + 1;
        assert!(frame_event(&mut out, KEY, seq, event.as_deref(), data));
        want.push(Sse {
            id: Some(format!("{KEY}-{seq}")),
            event: event.clone(),
            data: Some(String::from_utf8(data.clone()).unwrap()),
            retry: None,
        });
        if i % 2 == 1 {
            out.extend_from_slice(KEEP_ALIVE);
        }
    }
    if let Some(r) = events.iter().rev().find_map(|e| e.retry) {
        out.extend_from_slice(&frame_retry(r));
        want.push(Sse {
            retry: Some(r),
            ..Sse::default()
        });
    }
    assert_eq!(ok_events(&decode_upstream(&[&out])), want);

    // Any text framed as one event's data, with an event name the upstream could have sent.
    let text = String::from_utf8_lossy(body);
    let event = text
        .split(['\r', '\n'])
        .next()
        .filter(|_| cut % 2 == 0)
        .map(str::to_owned);
    let mut out = Vec::new();
    assert!(frame_event(
        &mut out,
        KEY,
        7,
        event.as_deref(),
        text.as_bytes()
    ));
    let got = decode_upstream(&[&out]);
    let want = Sse {
        id: Some(format!("{KEY}-7")),
        event,
        data: Some(text.replace("\r\n", "\n").replace('\r', "\n")),
        retry: None,
    };
    assert_eq!(ok_events(&got), vec![want], "{text:?}");
    assert!(got.iter().all(Result::is_ok));
});

fn ok_events(decoded: &[Result<Sse, String>]) -> Vec<Sse> {
    decoded
        .iter()
        .filter_map(|r| r.as_ref().ok().cloned())
        .collect()
}

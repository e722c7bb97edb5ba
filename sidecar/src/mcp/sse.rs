//! Server-Sent Events framing for the client side of the sidecar (WHATWG HTML §9.2).
//!
//! Upstream SSE is decoded by the `sse-stream` crate (see [`crate::upstream`]); this module only
//! writes frames: events with the sidecar's ids, the priming event (spec R-05), the `retry`
//! hint (R-07) and `: keep-alive` comments.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use crate::mcp::cursor::EventId;

/// The comment sent on idle streams so proxies and clients see the connection is alive.
pub(crate) const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";
/// A keep-alive comment line without the blank line that ends an event: safe between any two
/// lines of a relayed stream (it neither ends nor splits the event it falls in).
pub(crate) const KEEP_ALIVE_LINE: &[u8] = b": keep-alive\n";

/// Appends one event frame: `id`, optional `event`, then one `data:` line per line of `data`.
///
/// Lines of `data` end at LF, CRLF or CR, as a client's SSE parser ends them: data decoded from
/// upstream SSE is LF-joined, but an upstream's non-SSE answer carried as an event (a batch
/// member's JSON, pretty-printed or not) may hold any of them, and a CR left inside a `data:`
/// line would end that line there, leaving the rest of it to be read as a field. The client
/// receives the same lines, LF-joined. `event` holds no CR or LF (it comes from the SSE parser).
pub(crate) fn put_event(out: &mut BytesMut, id: &EventId, event: Option<&str>, data: &[u8]) {
    debug_assert!(
        event.is_none_or(|e| !e.contains(['\r', '\n'])),
        "an event name with a line end: {event:?}"
    );
    out.reserve(data.len() + 64);
    out.put_slice(b"id: ");
    // Written in place: a `String` per event was a tenth of the cost of relaying one.
    let _ = std::fmt::Write::write_fmt(out, format_args!("{id}"));
    out.put_u8(b'\n');
    if let Some(event) = event {
        put_field(out, b"event: ", event.as_bytes());
    }
    for line in lines(data) {
        put_field(out, b"data: ", line);
    }
    out.put_u8(b'\n');
}

/// Appends an upstream event as it came, with its own `id`, `event`, `data` and `retry` (a
/// relayed 2026-07-28 stream, whose ids are the MCP server's), `data` replaced by `data` when
/// given. The fields come from the SSE parser: none holds CR or LF except `data`, split as in
/// [`put_event`].
pub(crate) fn put_relayed(out: &mut BytesMut, event: &sse_stream::Sse, data: Option<&[u8]>) {
    if let Some(id) = &event.id {
        put_field(out, b"id: ", id.as_bytes());
    }
    if let Some(name) = &event.event {
        put_field(out, b"event: ", name.as_bytes());
    }
    if let Some(data) = data.or(event.data.as_deref().map(str::as_bytes)) {
        for line in lines(data) {
            put_field(out, b"data: ", line);
        }
    }
    if let Some(retry) = event.retry {
        put_field(out, b"retry: ", retry.to_string().as_bytes());
    }
    out.put_u8(b'\n');
}

fn put_field(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(value);
    out.put_u8(b'\n');
}

/// The lines of `data`, ended by LF, CRLF or CR; a line end at the very end leaves an empty
/// last line (as splitting at LF does), so `a\n` is `a` and an empty line.
fn lines(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(data);
    std::iter::from_fn(move || {
        let text = rest?;
        let Some(end) = memchr::memchr2(b'\n', b'\r', text) else {
            rest = None;
            return Some(text);
        };
        let next = if text[end..].starts_with(b"\r\n") {
            end + 2
        } else {
            end + 1
        };
        rest = Some(&text[next..]);
        Some(&text[..end])
    })
}

/// The priming event: the stream's current position as id and an empty `data` field, with an
/// optional `retry` hint in milliseconds (spec R-05, R-07). Only for clients that negotiated
/// 2025-11-25 or later: older clients JSON-parse the empty data and fail
/// (`r05_fr20_priming_only_for_2025_11_25`).
pub(crate) fn priming(id: &EventId, retry: Option<Duration>) -> Bytes {
    let mut out = BytesMut::with_capacity(64);
    out.put_slice(b"id: ");
    out.put_slice(id.to_string().as_bytes());
    out.put_u8(b'\n');
    if let Some(retry) = retry {
        out.put_slice(format!("retry: {}\n", retry.as_millis()).as_bytes());
    }
    out.put_slice(b"data:\n\n");
    out.freeze()
}

/// A frame with only a `retry` hint, in milliseconds (spec R-07): it sets the client's reconnect
/// delay and dispatches no event.
pub(crate) fn retry(hint: Duration) -> Bytes {
    Bytes::from(format!("retry: {}\n\n", hint.as_millis()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::cursor::StreamKey;

    #[test]
    fn multi_line_data_becomes_several_data_lines() {
        let id = EventId {
            stream: StreamKey::random(),
            seq: 3,
        };
        let mut out = BytesMut::new();
        put_event(&mut out, &id, Some("message"), b"{\"a\":\n1}");
        let text = String::from_utf8(out.to_vec()).unwrap();
        assert_eq!(
            text,
            format!("id: {id}\nevent: message\ndata: {{\"a\":\ndata: 1}}\n\n")
        );
    }

    #[test]
    fn data_lines_end_at_cr_and_crlf_as_well_as_lf() {
        let id = EventId {
            stream: StreamKey::random(),
            seq: 1,
        };
        let mut out = BytesMut::new();
        // A batch member's JSON answer with CR and CRLF between its tokens.
        put_event(&mut out, &id, None, b"{\"a\":1,\r\"b\":\r\n2}\r");
        let text = String::from_utf8(out.to_vec()).unwrap();
        assert_eq!(
            text,
            format!("id: {id}\ndata: {{\"a\":1,\ndata: \"b\":\ndata: 2}}\ndata: \n\n")
        );
        let mut out = BytesMut::new();
        put_event(&mut out, &id, None, b"");
        assert_eq!(out.as_ref(), format!("id: {id}\ndata: \n\n").as_bytes());
    }

    #[test]
    fn r05_priming_has_an_id_and_empty_data() {
        let id = EventId {
            stream: StreamKey::random(),
            seq: 0,
        };
        let text =
            String::from_utf8(priming(&id, Some(Duration::from_millis(1500))).to_vec()).unwrap();
        assert_eq!(text, format!("id: {id}\nretry: 1500\ndata:\n\n"));
    }
}

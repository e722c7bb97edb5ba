//! The bound on one SSE event read from the upstream (`--max-event-bytes`), checked byte by
//! byte as the body arrives, so an oversized event is refused before it is ever held whole.
//!
//! An event is a block of lines ended by a blank line (WHATWG HTML §9.2.6: lines end with LF,
//! CR or CRLF). [`EventBound`] counts the bytes of the current block other than line ends —
//! field names, values, comments — across chunk boundaries; a block, and so any one line, of
//! more than the limit is refused. Comments count too: an endless `:` line is as costly as an
//! endless `data:` line.

/// The current block passed the limit, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("an SSE event larger than {limit} bytes")]
pub(crate) struct EventTooLarge {
    /// The limit it passed.
    pub(crate) limit: usize,
}

/// Where a byte stream stands against the limit.
#[derive(Clone, Debug)]
pub(crate) struct EventBound {
    limit: usize,
    /// Bytes of the current block, line ends not counted.
    block: usize,
    /// The last byte was a line end (or nothing came yet): the next line end is a blank line.
    at_line_start: bool,
    /// The last byte was CR: an LF right after it belongs to the same line end.
    after_cr: bool,
}

impl EventBound {
    /// A bound of `limit` bytes per event, before the first byte.
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            block: 0,
            at_line_start: true,
            after_cr: false,
        }
    }

    /// Takes the next `chunk` of the stream.
    ///
    /// # Errors
    /// [`EventTooLarge`] once the current block has more than the limit; the caller stops
    /// reading (the state is not meant to be used after that).
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Result<(), EventTooLarge> {
        // Runs of other bytes are counted whole: every upstream byte passes here.
        let mut rest = chunk;
        while !rest.is_empty() {
            let end = memchr::memchr2(b'\n', b'\r', rest);
            let run = end.unwrap_or(rest.len());
            if run > 0 {
                self.after_cr = false;
                self.at_line_start = false;
                self.block += run;
                if self.block > self.limit {
                    return Err(EventTooLarge { limit: self.limit });
                }
            }
            let Some(at) = end else { break };
            match rest[at] {
                b'\n' if self.after_cr => self.after_cr = false,
                b => {
                    self.after_cr = b == b'\r';
                    if self.at_line_start {
                        self.block = 0;
                    }
                    self.at_line_start = true;
                }
            }
            rest = &rest[at + 1..];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in chunks of `size` bytes; the index of the chunk refused, if any.
    fn refused_at(limit: usize, text: &[u8], size: usize) -> Option<usize> {
        let mut bound = EventBound::new(limit);
        text.chunks(size).position(|c| bound.feed(c).is_err())
    }

    #[test]
    fn events_up_to_the_limit_pass_with_any_line_end_and_chunking() {
        // "data: 0123" is 10 bytes; each event is one such line.
        for eol in ["\n", "\r", "\r\n"] {
            let text = format!("data: 0123{eol}{eol}").repeat(50);
            for size in [1, 2, 3, 7, 1000] {
                assert_eq!(
                    refused_at(10, text.as_bytes(), size),
                    None,
                    "{eol:?} {size}"
                );
            }
        }
    }

    #[test]
    fn the_lines_of_one_event_add_up() {
        let event = b"id: 1\ndata: abc\ndata: def\n\n";
        // 5 + 9 + 9 = 23 bytes without line ends.
        assert_eq!(refused_at(23, event, 4), None);
        assert!(refused_at(22, event, 4).is_some());
    }

    #[test]
    fn an_endless_line_is_refused_as_soon_as_it_passes_the_limit() {
        let mut bound = EventBound::new(1024);
        bound.feed(b"data: ").unwrap();
        let chunk = [b'x'; 100];
        let fed = (0..).take_while(|_| bound.feed(&chunk).is_ok()).count();
        assert_eq!(fed, 10, "refused within the chunk that passes 1024 bytes");
    }

    #[test]
    fn a_crlf_split_across_chunks_is_one_line_end() {
        // CR | LF then "data" must not count as a blank line that resets the block: the LF
        // completes the CRLF of the first line.
        let mut bound = EventBound::new(12);
        bound.feed(b"data: 12345\r").unwrap();
        bound.feed(b"\n").unwrap();
        assert_eq!(
            bound.feed(b"data: 6"),
            Err(EventTooLarge { limit: 12 }),
            "both lines belong to one event"
        );
    }

    #[test]
    fn comments_count_too() {
        let text = format!(": {}\n\n", "k".repeat(100));
        assert!(refused_at(64, text.as_bytes(), 16).is_some());
    }
}

//! SSE event ids (`<stream-key>-<seq>`) and `Last-Event-ID` cursors
//! (`docs/design/architecture.md#streams-and-the-replay-buffer`).
//!
//! The sidecar assigns every event it sends an id made of the stream's random key and the
//! event's sequence number on that stream (from 1, strictly increasing). Ids are therefore unique
//! within a session and name their stream (spec ), so a resume can be served strictly
//! after the cursor on the cursor's own stream. Sequence 0 is the position before the first
//! event: the priming event of a stream carries it.

use std::fmt;

/// Characters of a stream key.
const KEY_ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
/// Length of generated stream keys (60 random bits).
pub(crate) const STREAM_KEY_LEN: usize = 12;
/// Longest `Last-Event-ID` value accepted, in bytes; longer values are malformed.
pub(crate) const MAX_CURSOR_LEN: usize = 64;

/// A stream's random key: 12 characters of lowercase base32, held inline (no allocation: a
/// session keeps one per stream and per retry record).
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub(crate) struct StreamKey([u8; STREAM_KEY_LEN]);

impl TryFrom<String> for StreamKey {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        Self::parse(&s).ok_or_else(|| format!("{s:?} is not a stream key"))
    }
}

impl From<StreamKey> for String {
    fn from(k: StreamKey) -> String {
        k.as_str().to_owned()
    }
}

impl StreamKey {
    /// A fresh random key.
    pub(crate) fn random() -> Self {
        let mut raw = [0u8; STREAM_KEY_LEN];
        rand::fill(&mut raw);
        Self(raw.map(|b| KEY_ALPHABET[usize::from(b & 31)]))
    }

    fn parse(s: &str) -> Option<Self> {
        let raw: [u8; STREAM_KEY_LEN] = s.as_bytes().try_into().ok()?;
        raw.iter()
            .all(|b| KEY_ALPHABET.contains(b))
            .then_some(Self(raw))
    }

    /// The key as text.
    pub(crate) fn as_str(&self) -> &str {
        // Only alphabet bytes (ASCII) are ever stored.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for StreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A position in a stream: the id of an event, or sequence 0 for "before the first event".
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct EventId {
    /// The stream the event belongs to.
    pub(crate) stream: StreamKey,
    /// Sequence number of the event on its stream.
    pub(crate) seq: u64,
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.stream, self.seq)
    }
}

/// Why a `Last-Event-ID` value is not a cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed Last-Event-ID: expected <stream-key>-<seq> as issued by this endpoint")]
pub(crate) struct MalformedCursor;

impl EventId {
    /// Parses a `Last-Event-ID` header value.
    ///
    /// # Errors
    /// [`MalformedCursor`] for anything but `<12 base32 chars>-<decimal u64>` as the sidecar
    /// writes it (no leading zeros, so each position has one spelling), including values longer
    /// than [`MAX_CURSOR_LEN`].
    pub(crate) fn parse(value: &str) -> Result<Self, MalformedCursor> {
        if value.len() > MAX_CURSOR_LEN {
            return Err(MalformedCursor);
        }
        let (key, seq) = value.split_once('-').ok_or(MalformedCursor)?;
        let stream = StreamKey::parse(key).ok_or(MalformedCursor)?;
        if seq.is_empty()
            || !seq.bytes().all(|b| b.is_ascii_digit())
            || seq.len() > 20
            || (seq.len() > 1 && seq.starts_with('0'))
        {
            return Err(MalformedCursor);
        }
        let seq = seq.parse().map_err(|_| MalformedCursor)?;
        Ok(Self { stream, seq })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn r02_ids_round_trip_and_name_their_stream() {
        let key = StreamKey::random();
        let id = EventId {
            stream: key.clone(),
            seq: 42,
        };
        let parsed = EventId::parse(&id.to_string()).unwrap();
        assert_eq!(parsed.stream, key);
        assert_eq!(parsed.seq, 42);
    }

    #[test]
    fn malformed_cursors_are_rejected() {
        let key = StreamKey::random();
        for bad in [
            String::new(),
            "abc".into(),
            format!("{key}"),
            format!("{key}-"),
            format!("{key}--1"),
            format!("{key}-1a"),
            format!("{key}-99999999999999999999999"),
            format!("{}-1", key.to_string().to_uppercase()),
            "0123456789ab-1".into(),
            format!("{key}-{}", "1".repeat(1_000_000)),
        ] {
            assert_eq!(EventId::parse(&bad), Err(MalformedCursor), "{bad:.40}");
        }
    }

    #[test]
    fn a_cursor_with_leading_zeros_is_malformed() {
        let key = StreamKey::random();
        for bad in ["00", "01", "007", "00000000000000000001"] {
            assert_eq!(
                EventId::parse(&format!("{key}-{bad}")),
                Err(MalformedCursor),
                "{bad}"
            );
        }
        let zero = EventId::parse(&format!("{key}-0")).unwrap();
        assert_eq!(zero.seq, 0);
        assert_eq!(zero.to_string(), format!("{key}-0"));
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,80}") {
            let _ = EventId::parse(&s);
        }

        #[test]
        fn any_seq_round_trips(seq in any::<u64>()) {
            let id = EventId { stream: StreamKey::random(), seq };
            prop_assert_eq!(EventId::parse(&id.to_string()), Ok(id));
        }
    }
}

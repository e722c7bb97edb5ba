//! What a replica carries of a stream (`docs/design/replication.md`, the table of
//! `spec.session.replication`): with `Events` everything buffered; with `Sessions` the answers
//! of a complete stream and the numbering of every stream, never the progress events of a
//! running one, which would make the replica change with each event.

use crate::mcp::jsonrpc::is_response;
use crate::stream::StreamSnapshot;

/// Leaves out of `stream` what a `Sessions` replica does not carry: of a complete stream the
/// events before its first response (what a resume from before them finds evicted, and says
/// so), of a running one every event (numbered as evicted: a resume after the replica's last
/// event reads what comes after a promotion, one from before it is told its events are gone).
pub(super) fn sessions_only(stream: &mut StreamSnapshot) {
    let first_answer = if stream.complete {
        stream.events.iter().position(|e| is_response(&e.data))
    } else {
        None
    };
    match first_answer {
        Some(at) => {
            let before = stream.events[at].seq.saturating_sub(1);
            stream.evicted_through = stream.evicted_through.max(before);
            stream.events.drain(..at);
        }
        None => {
            stream.events.clear();
            stream.evicted_through = stream.evicted_through.max(stream.last_seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::mcp::cursor::StreamKey;
    use crate::stream::{SnapshotEvent, StreamKind};

    const PROGRESS: &str =
        r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}"#;
    const ANSWER: &str = r#"{"jsonrpc":"2.0","id":7,"result":{}}"#;

    /// A stream whose events are `data` numbered from `first`, complete or not.
    fn stream(first: u64, data: &[&str], complete: bool) -> StreamSnapshot {
        let events: Vec<SnapshotEvent> = data
            .iter()
            .zip(first..)
            .map(|(d, seq)| SnapshotEvent {
                seq,
                event: None,
                data: Bytes::from(d.to_string()),
            })
            .collect();
        StreamSnapshot {
            key: StreamKey::random(),
            kind: StreamKind::Post,
            pending: vec![],
            complete,
            stored: None,
            sse: None,
            last_seq: first + data.len() as u64 - 1,
            evicted_through: first - 1,
            events,
            withdrawn: false,
        }
    }

    #[test]
    fn a_sessions_replica_carries_answers_and_numbering_never_progress() {
        // (events numbered from, data, complete) → (seqs kept, evicted through, last seq)
        type Row<'a> = (u64, &'a [&'a str], bool, &'a [u64], u64, u64);
        let table: [Row<'_>; 6] = [
            // A running request's progress: none carried, all numbered as evicted.
            (1, &[PROGRESS, PROGRESS], false, &[], 2, 2),
            // A running request whose answer came but the stream is not complete yet.
            (1, &[PROGRESS, ANSWER], false, &[], 2, 2),
            // Complete: the answer, the progress before it evicted.
            (1, &[PROGRESS, PROGRESS, ANSWER], true, &[3], 2, 3),
            // Complete batch: everything from its first answer on.
            (
                4,
                &[PROGRESS, ANSWER, PROGRESS, ANSWER],
                true,
                &[5, 6, 7],
                4,
                7,
            ),
            // Complete with nothing but the answer, some evicted before.
            (9, &[ANSWER], true, &[9], 8, 9),
            // Complete without an answer among the events kept: nothing but the numbering.
            (1, &[PROGRESS], true, &[], 1, 1),
        ];
        for (first, data, complete, kept, evicted, last) in table {
            let mut s = stream(first, data, complete);
            sessions_only(&mut s);
            let seqs: Vec<u64> = s.events.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, kept, "{data:?} complete={complete}");
            assert_eq!(s.evicted_through, evicted, "{data:?} complete={complete}");
            assert_eq!(s.last_seq, last, "numbering is kept");
        }
    }
}

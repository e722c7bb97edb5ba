//! The mover's branching as pure decisions (`docs/design/handoff.md#moving-one-session`,
//! `docs/design/handoff.md#one-holder-per-session`): what a failed push means for the session
//! ([`after_push`]), and what an answer to "did you take it?" means ([`after_question`],
//! [`never_answered`]). [`super::Handoff`] only carries them out; the tables below are tested
//! row by row.
//!
//! A push to one candidate:
//!
//! ```text
//! push ──acknowledged 2xx─────────────────────────────────▶ taken
//!  │ ──unreachable, lost, 503/429 (a retry left)──────────▶ Again(pause) ──▶ push
//!  │ ──lost (no retry left), unacknowledged───────────────▶ Ask ──▶ POST /v2/held
//!  │ ──409 stale_epoch────────────────────────────────────▶ Superseded
//!  └ ──refused, or unreachable with no retry left─────────▶ NextCandidate
//! ```

use std::time::Duration;

use crate::peer::client::SendError;

/// What the mover does after one attempt to push a session to one candidate failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AfterPush {
    /// Push to the same candidate again after this pause (it was unreachable or busy).
    Again(Duration),
    /// The push may have arrived but got no valid answer: ask the candidate whether it took the
    /// session before any other pod is tried (two holders otherwise).
    Ask,
    /// A candidate holds the session at a later epoch: the copy here is stale; no other pod is
    /// tried.
    Superseded,
    /// The candidate did not take it: the next one is tried, at a later epoch. `down`: the
    /// candidate could not be reached at all (it is marked down for routing).
    NextCandidate {
        /// No connection could be made.
        down: bool,
    },
}

/// What the failure `e` of attempt `attempt` (0 first) means, with `backoff` the pauses between
/// attempts at one candidate (its length bounds the retries).
pub(crate) fn after_push(e: &SendError, attempt: usize, backoff: &[Duration]) -> AfterPush {
    if e.is_transient()
        && let Some(pause) = backoff.get(attempt)
    {
        return AfterPush::Again(*pause);
    }
    match e {
        SendError::Lost(_) | SendError::Unacknowledged(_) => AfterPush::Ask,
        SendError::Refused { .. } if e.refused_for("stale_epoch") => AfterPush::Superseded,
        SendError::Refused { .. } => AfterPush::NextCandidate { down: false },
        SendError::Unreachable(_) => AfterPush::NextCandidate { down: true },
    }
}

/// What one answer to `POST /v2/held` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// The candidate says whether it took the session at that epoch or a later one.
    Known(bool),
    /// An acknowledged answer that cannot be read: nobody can say; asked no more.
    InDoubt,
    /// It cannot be told: the question got through but no answer came (`reached`), or no
    /// connection was made; asked again after the next pause.
    Unknown {
        /// The question reached the candidate.
        reached: bool,
    },
}

/// What the answer `outcome` to `POST /v2/held` says (`Ok(None)`: acknowledged but unreadable):
/// an acknowledged answer is the candidate's word; an unacknowledged answer or a refusal comes
/// from no peer that holds the session.
pub(crate) fn after_question(outcome: &Result<Option<bool>, SendError>) -> Held {
    match outcome {
        Ok(Some(held)) => Held::Known(*held),
        Ok(None) => Held::InDoubt,
        Err(SendError::Lost(_)) => Held::Unknown { reached: true },
        Err(SendError::Unacknowledged(_) | SendError::Refused { .. }) => Held::Known(false),
        Err(SendError::Unreachable(_)) => Held::Unknown { reached: false },
    }
}

/// What every question went unanswered means: a candidate that was never reached holds nothing
/// (a pod that accepts no connection is gone); one that was reached but never answered may hold
/// the session (`None`: in doubt).
pub(crate) fn never_answered(reached: bool) -> Option<bool> {
    (!reached).then_some(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    const BACKOFF: [Duration; 2] = [Duration::from_millis(50), Duration::from_millis(250)];

    fn refused(status: StatusCode, reason: &str) -> SendError {
        SendError::Refused {
            status,
            reason: format!(r#"{{"error":"x","reason":"{reason}"}}"#),
        }
    }

    #[test]
    fn after_push_follows_the_table() {
        let lost = || SendError::Lost("timeout".into());
        let unreachable = || SendError::Unreachable("refused".into());
        let busy = || refused(StatusCode::SERVICE_UNAVAILABLE, "busy");
        let rows: Vec<(&str, SendError, usize, AfterPush)> = vec![
            (
                "unreachable, first",
                unreachable(),
                0,
                AfterPush::Again(BACKOFF[0]),
            ),
            (
                "unreachable, second",
                unreachable(),
                1,
                AfterPush::Again(BACKOFF[1]),
            ),
            (
                "unreachable, no retry left",
                unreachable(),
                2,
                AfterPush::NextCandidate { down: true },
            ),
            ("lost, first", lost(), 0, AfterPush::Again(BACKOFF[0])),
            ("lost, no retry left", lost(), 2, AfterPush::Ask),
            ("busy 503", busy(), 0, AfterPush::Again(BACKOFF[0])),
            (
                "busy 429, no retry left",
                refused(StatusCode::TOO_MANY_REQUESTS, "busy"),
                2,
                AfterPush::NextCandidate { down: false },
            ),
            (
                "unacknowledged 200, never retried",
                SendError::Unacknowledged(StatusCode::OK),
                0,
                AfterPush::Ask,
            ),
            (
                "stale epoch",
                refused(StatusCode::CONFLICT, "stale_epoch"),
                0,
                AfterPush::Superseded,
            ),
            (
                "ended there",
                refused(StatusCode::CONFLICT, "ended"),
                0,
                AfterPush::NextCandidate { down: false },
            ),
            (
                "forged id",
                refused(StatusCode::FORBIDDEN, "forged"),
                0,
                AfterPush::NextCandidate { down: false },
            ),
        ];
        for (row, error, attempt, expected) in rows {
            assert_eq!(after_push(&error, attempt, &BACKOFF), expected, "{row}");
        }
    }

    #[test]
    fn after_question_follows_the_table() {
        type Row = (&'static str, Result<Option<bool>, SendError>, Held);
        let rows: Vec<Row> = vec![
            ("held", Ok(Some(true)), Held::Known(true)),
            ("not held", Ok(Some(false)), Held::Known(false)),
            ("unreadable answer", Ok(None), Held::InDoubt),
            (
                "no answer",
                Err(SendError::Lost("timeout".into())),
                Held::Unknown { reached: true },
            ),
            (
                "no connection",
                Err(SendError::Unreachable("refused".into())),
                Held::Unknown { reached: false },
            ),
            (
                "unacknowledged: no peer",
                Err(SendError::Unacknowledged(StatusCode::OK)),
                Held::Known(false),
            ),
            (
                "refused",
                Err(refused(StatusCode::NOT_FOUND, "unknown_path")),
                Held::Known(false),
            ),
        ];
        for (row, outcome, expected) in rows {
            assert_eq!(after_question(&outcome), expected, "{row}");
        }
        assert_eq!(
            never_answered(false),
            Some(false),
            "never reached: holds nothing"
        );
        assert_eq!(never_answered(true), None, "reached, silent: in doubt");
    }
}

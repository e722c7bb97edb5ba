//! What a client saw go wrong, with what it takes to trace it in the sidecars' logs.
//!
//! Every lost, foreign or duplicated event and every failed or hung request of a session is an
//! [`Incident`]: its kind, the session it happened in, and what the client knows of it — the
//! call or notification, the stream key and the sequence numbers it expected and received, the
//! pod it asked. A sidecar writes a session's log lines with a keyed digest of its id
//! (`session="<12 hex>"`), never the id itself; whoever holds the endpoint's key finds them
//! ([`Incident::explain`]), so a failure in a long run explains itself from the run's output.

use std::fmt::Write as _;

/// Log lines of one session printed per pod at most; the rest are counted.
const MAX_LINES_PER_POD: usize = 120;

/// What kind of thing went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum IncidentKind {
    /// An event the client expected never arrived.
    Lost,
    /// An event of another request or stream arrived.
    Foreign,
    /// An event arrived twice.
    Duplicated,
    /// A request got no response headers in time.
    Hung,
    /// Any other failed exchange.
    Failed,
}

impl IncidentKind {
    /// Its name in reports.
    pub fn label(self) -> &'static str {
        match self {
            Self::Lost => "lost",
            Self::Foreign => "foreign",
            Self::Duplicated => "duplicated",
            Self::Hung => "hung",
            Self::Failed => "failed",
        }
    }

    /// The kind of a failure described by `failure` (a harness error or a call's description
    /// of a foreign message).
    pub fn of_failure(failure: &str) -> Self {
        if failure.contains("no response headers within") {
            Self::Hung
        } else if failure.contains("foreign message") || failure.contains("of another stream") {
            Self::Foreign
        } else {
            Self::Failed
        }
    }
}

/// One thing a client saw go wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incident {
    /// What went wrong.
    pub kind: IncidentKind,
    /// The `Mcp-Session-Id` of the session it happened in (`None`: a stateless request, or not
    /// known yet where it was recorded).
    pub session: Option<String>,
    /// What the client knows: the call or notification, stream key and sequence numbers, the
    /// pod asked.
    pub detail: String,
}

impl Incident {
    /// An incident of no session yet ([`Incident::in_session`] names it).
    pub fn new(kind: IncidentKind, detail: String) -> Self {
        Self {
            kind,
            session: None,
            detail,
        }
    }

    /// This incident in session `id`, unless it already names one.
    pub fn in_session(mut self, id: &str) -> Self {
        self.session.get_or_insert_with(|| id.to_owned());
        self
    }

    /// The incident, the digest its session's log lines carry (under `key`, the key that
    /// minted its id: `tether_crds::keyring::key_material` of the endpoint's key file) and
    /// those lines from each pod's log in `logs` (`(pod, log text)`).
    pub fn explain(&self, key: &[u8], logs: &[(String, String)]) -> String {
        let mut out = String::new();
        let Some(session) = &self.session else {
            let _ = writeln!(out, "{}: {}", self.kind.label(), self.detail);
            return out;
        };
        let digest = tether_crds::keyring::log_digest(key, session);
        let _ = writeln!(
            out,
            "{} in session {digest}: {}",
            self.kind.label(),
            self.detail
        );
        let needle = format!("session=\"{digest}\"");
        for (pod, log) in logs {
            let lines: Vec<&str> = log.lines().filter(|l| l.contains(&needle)).collect();
            if lines.is_empty() {
                continue;
            }
            let skipped = lines.len().saturating_sub(MAX_LINES_PER_POD);
            let _ = writeln!(out, "  sidecar log of {pod} ({} lines):", lines.len());
            if skipped > 0 {
                let _ = writeln!(out, "    … {skipped} earlier lines");
            }
            for line in &lines[skipped..] {
                let _ = writeln!(out, "    {line}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_told_apart() {
        let hung =
            "resume after k-1 failed: http: GET http://x/mcp: no response headers within 60s";
        assert_eq!(IncidentKind::of_failure(hung), IncidentKind::Hung);
        let foreign = "c1 (request 3): foreign message {\"id\":9}";
        assert_eq!(IncidentKind::of_failure(foreign), IncidentKind::Foreign);
        let other = "c1: error result {}";
        assert_eq!(IncidentKind::of_failure(other), IncidentKind::Failed);
    }

    #[test]
    fn an_incident_is_explained_by_its_sessions_log_lines_only() {
        let key = b"0123456789abcdef0123456789abcdef";
        let digest = tether_crds::keyring::log_digest(key, "sid-1");
        let other = tether_crds::keyring::log_digest(key, "sid-2");
        let log = format!(
            "t1 INFO adopted session=\"{digest}\"\nt2 INFO adopted session=\"{other}\"\n\
             t3 WARN writer gone session=\"{digest}\"\n"
        );
        let logs = vec![
            ("pod-a".to_owned(), log),
            ("pod-b".to_owned(), String::new()),
        ];
        let incident = Incident::new(IncidentKind::Lost, "n3 [1, 2, 3]".into()).in_session("sid-1");
        let text = incident.explain(key, &logs);
        assert!(
            text.starts_with(&format!("lost in session {digest}: n3")),
            "{text}"
        );
        assert!(
            text.contains("pod-a (2 lines)") && text.contains("writer gone"),
            "{text}"
        );
        assert!(!text.contains(&other) && !text.contains("pod-b"), "{text}");
        assert!(!text.contains("sid-1"), "never the raw session id: {text}");
    }
}

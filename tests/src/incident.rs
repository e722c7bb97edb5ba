//! What a client saw go wrong, with what it takes to trace it in the sidecars' logs.
//!
//! Every lost, foreign or duplicated event and every failed or hung request of a session is an
//! [`Incident`]: its kind, the session it happened in, and what the client knows of it — the
//! call or notification, the stream key and the sequence numbers it expected and received, the
//! pod it asked. A sidecar writes a session's log lines with a keyed digest of its id
//! (`session="<12 hex>"`), never the id itself; whoever holds the endpoint's key finds them
//! ([`explain`]), so a failure in a long run explains itself from the run's output.

use std::collections::HashMap;
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
}

/// The lines of a run's sidecar logs that name a session, by the session's log digest
/// (`session="<digest>"`), each with its pod, in each pod's order: built once, so explaining
/// thousands of incidents reads each log once.
struct SessionLines<'a> {
    by_digest: HashMap<&'a str, Vec<(&'a str, &'a str)>>,
}

impl<'a> SessionLines<'a> {
    /// The lines of `logs` (`(pod, log text)`) that name a session.
    fn index(logs: &'a [(String, String)]) -> Self {
        let mut by_digest: HashMap<&str, Vec<(&str, &str)>> = HashMap::new();
        for (pod, log) in logs {
            for line in log.lines() {
                if let Some(digest) = digest_in(line) {
                    by_digest.entry(digest).or_default().push((pod, line));
                }
            }
        }
        Self { by_digest }
    }

    /// Writes the lines of the session with `digest` to `out`, pod by pod, the last
    /// [`MAX_LINES_PER_POD`] of each.
    fn write(&self, digest: &str, out: &mut String) {
        let Some(lines) = self.by_digest.get(digest) else {
            let _ = writeln!(out, "  no sidecar log line names it");
            return;
        };
        for run in lines.chunk_by(|a, b| a.0 == b.0) {
            let pod = run[0].0;
            let skipped = run.len().saturating_sub(MAX_LINES_PER_POD);
            let _ = writeln!(out, "  sidecar log of {pod} ({} lines):", run.len());
            if skipped > 0 {
                let _ = writeln!(out, "    … {skipped} earlier lines");
            }
            for (_, line) in &run[skipped..] {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
}

/// The session digest a sidecar log line names (its `session` field), if any.
fn digest_in(line: &str) -> Option<&str> {
    const FIELD: &str = " session=\"";
    let rest = &line[line.find(FIELD)? + FIELD.len()..];
    Some(&rest[..rest.find('"')?])
}

/// Each of `incidents`, grouped by session (in the order their sessions first went wrong):
/// every incident of a session under the digest its log lines carry, then those lines from each
/// pod's log in `logs` (`(pod, log text)`), once. `key` is the key that minted the sessions'
/// ids (`tether_crds::keyring::key_material` of the endpoint's key file).
pub fn explain(incidents: &[Incident], key: &[u8], logs: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut sessions: Vec<(&str, Vec<&Incident>)> = Vec::new();
    let mut place: HashMap<&str, usize> = HashMap::new();
    for incident in incidents {
        let Some(session) = incident.session.as_deref() else {
            let _ = writeln!(out, "{}: {}", incident.kind.label(), incident.detail);
            continue;
        };
        let at = *place.entry(session).or_insert_with(|| {
            sessions.push((session, Vec::new()));
            sessions.len() - 1
        });
        sessions[at].1.push(incident);
    }
    if sessions.is_empty() {
        return out;
    }
    let lines = SessionLines::index(logs);
    for (session, of_session) in sessions {
        let digest = tether_crds::keyring::log_digest(key, session);
        for incident in of_session {
            let _ = writeln!(
                out,
                "{} in session {digest}: {}",
                incident.kind.label(),
                incident.detail
            );
        }
        lines.write(&digest, &mut out);
    }
    out
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
    fn incidents_are_explained_by_their_sessions_log_lines_once_per_session() {
        let key = b"0123456789abcdef0123456789abcdef";
        let digest = tether_crds::keyring::log_digest(key, "sid-1");
        let other = tether_crds::keyring::log_digest(key, "sid-2");
        let log = format!(
            "t1 INFO adopted session=\"{digest}\"\nt2 INFO adopted session=\"{other}\"\n\
             t3 WARN writer gone session=\"{digest}\"\nt4 INFO no session here\n"
        );
        let logs = vec![
            ("pod-a".to_owned(), log),
            (
                "pod-b".to_owned(),
                format!("t5 DEBUG request session=\"{digest}\"\n"),
            ),
            ("pod-c".to_owned(), String::new()),
        ];
        let incidents = [
            Incident::new(IncidentKind::Lost, "n3 [1, 2, 3]".into()).in_session("sid-1"),
            Incident::new(IncidentKind::Failed, "no session".into()),
            Incident::new(IncidentKind::Hung, "GET after k-2".into()).in_session("sid-1"),
            Incident::new(IncidentKind::Lost, "n1 [1]".into()).in_session("sid-3"),
        ];
        let text = explain(&incidents, key, &logs);
        let expected = format!(
            "failed: no session\n\
             lost in session {digest}: n3 [1, 2, 3]\n\
             hung in session {digest}: GET after k-2\n  \
             sidecar log of pod-a (2 lines):\n    \
             t1 INFO adopted session=\"{digest}\"\n    \
             t3 WARN writer gone session=\"{digest}\"\n  \
             sidecar log of pod-b (1 lines):\n    \
             t5 DEBUG request session=\"{digest}\"\n"
        );
        assert!(text.starts_with(&expected), "{text}");
        let third = tether_crds::keyring::log_digest(key, "sid-3");
        assert!(
            text.ends_with(&format!(
                "lost in session {third}: n1 [1]\n  no sidecar log line names it\n"
            )),
            "{text}"
        );
        assert!(!text.contains(&other) && !text.contains("pod-c"), "{text}");
        assert!(!text.contains("sid-1"), "never the raw session id: {text}");
    }

    #[test]
    fn only_the_session_field_names_a_digest() {
        assert_eq!(
            digest_in(r#"t INFO moved session="ab12" to="x""#),
            Some("ab12")
        );
        assert_eq!(digest_in("t INFO no field"), None);
        assert_eq!(digest_in(r#"t INFO cut session="ab1"#), None);
        assert_eq!(digest_in(r#"t INFO replaced stale_session="ab12""#), None);
    }
}

//! The API server's audit log (`TETHER_E2E_AUDIT_LOG`: JSON lines of `audit.k8s.io/v1` Events,
//! as the local cluster writes them, `docs/dev/cluster.md`: level `Metadata`, `Request` for the
//! writes to McpEndpoints): who sent which request, for what, with which `User-Agent`, and the
//! bodies of those writes. The operator's writes are counted from it.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use serde::Deserialize;

use crate::cluster::Outcome;

/// The audit log file.
pub(crate) struct AuditLog {
    path: PathBuf,
}

/// A position in the log: [`AuditLog::since`] reads what was written after it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark(u64);

/// The `ResponseComplete` audit event of one request.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AuditEvent {
    stage: String,
    pub verb: String,
    pub user: User,
    #[serde(default)]
    pub user_agent: String,
    #[serde(default)]
    pub object_ref: ObjectRef,
    #[serde(default)]
    pub response_status: ResponseStatus,
    /// The body, where the policy logs it (level `Request`: the writes to McpEndpoints).
    #[serde(default)]
    pub request_object: Option<serde_json::Value>,
}

/// Who sent a request.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct User {
    pub username: String,
}

/// What a request was about.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub subresource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
}

/// The answer's status code.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct ResponseStatus {
    #[serde(default)]
    pub code: u16,
}

impl AuditEvent {
    /// Whether it may have changed something (not a `get`, `list` or `watch`).
    pub fn is_write(&self) -> bool {
        !matches!(self.verb.as_str(), "get" | "list" | "watch")
    }

    /// `<verb> <resource>[/<subresource>]/<name>`, e.g. `patch mcpendpoints/status/weather`.
    pub fn describe(&self) -> String {
        let r = &self.object_ref;
        let sub = if r.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", r.subresource)
        };
        format!("{} {}{sub}/{}", self.verb, r.resource, r.name)
    }
}

impl AuditLog {
    /// The log at `path`.
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    /// Where the log ends now.
    pub fn mark(&self) -> Outcome<Mark> {
        Ok(Mark(std::fs::metadata(&self.path)?.len()))
    }

    /// The requests whose answers were logged after `mark`, in order (a line still being
    /// written is left for the next read).
    pub fn since(&self, mark: Mark) -> Outcome<Vec<AuditEvent>> {
        self.between(mark, None)
    }

    /// The requests whose answers were logged after `from` and, with `to`, before it.
    pub fn between(&self, from: Mark, to: Option<Mark>) -> Outcome<Vec<AuditEvent>> {
        let mut file = std::fs::File::open(&self.path)?;
        file.seek(SeekFrom::Start(from.0))?;
        let mut text = String::new();
        match to {
            Some(to) => file
                .take(to.0.saturating_sub(from.0))
                .read_to_string(&mut text)?,
            None => file.read_to_string(&mut text)?,
        };
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        let mut out = Vec::new();
        for line in whole.lines().filter(|l| !l.is_empty()) {
            let request: AuditEvent = serde_json::from_str(line).map_err(|e| {
                format!(
                    "{}: a line that is no audit event ({e}): {line}",
                    self.path.display()
                )
            })?;
            if request.stage == "ResponseComplete" {
                out.push(request);
            }
        }
        Ok(out)
    }
}

/// The writes of `user` to objects of `ns` among `requests`, counted by
/// [`AuditEvent::describe`].
pub(crate) fn writes_by(requests: &[AuditEvent], user: &str, ns: &str) -> BTreeMap<String, usize> {
    let mut counted = BTreeMap::new();
    for r in requests
        .iter()
        .filter(|r| r.is_write() && r.user.username == user && r.object_ref.namespace == ns)
    {
        *counted.entry(r.describe()).or_default() += 1;
    }
    counted
}

#[test]
fn the_log_is_read_from_a_mark_to_its_last_whole_line() {
    let line = |verb: &str, name: &str| {
        format!(
            r#"{{"kind":"Event","stage":"ResponseComplete","verb":"{verb}","user":{{"username":"system:serviceaccount:op:tether"}},"userAgent":"tether-operator/v0.1.0","objectRef":{{"resource":"mcpendpoints","subresource":"status","namespace":"tools","name":"{name}"}},"responseStatus":{{"code":200}}}}"#
        )
    };
    let file = tempfile::NamedTempFile::new().unwrap();
    let log = AuditLog::new(file.path().to_owned());
    std::fs::write(file.path(), format!("{}\n", line("patch", "before"))).unwrap();
    let mark = log.mark().unwrap();
    let started = r#"{"stage":"ResponseStarted","verb":"watch","user":{"username":"u"}}"#;
    let text = format!(
        "{}\n{}\n{started}\n{}\n{}",
        line("patch", "before"),
        line("patch", "weather"),
        line("get", "weather"),
        &line("patch", "half")[..40]
    );
    std::fs::write(file.path(), text).unwrap();
    let requests = log.since(mark).unwrap();
    // Up to the end of the `ResponseStarted` line: one request answered.
    let first_two = Mark(mark.0 + (line("patch", "weather").len() + started.len() + 2) as u64);
    assert_eq!(log.between(mark, Some(first_two)).unwrap().len(), 1);
    let described: Vec<String> = requests.iter().map(AuditEvent::describe).collect();
    assert_eq!(
        described,
        [
            "patch mcpendpoints/status/weather",
            "get mcpendpoints/status/weather"
        ]
    );
    assert_eq!(requests[0].user_agent, "tether-operator/v0.1.0");
    assert_eq!(requests[0].response_status.code, 200);
    let writes = writes_by(&requests, "system:serviceaccount:op:tether", "tools");
    assert_eq!(
        writes,
        BTreeMap::from([("patch mcpendpoints/status/weather".to_owned(), 1)])
    );
    assert!(writes_by(&requests, "someone-else", "tools").is_empty());
}

//! The static membership source: a YAML peers file (`--peers-file`), polled every
//! [`POLL_INTERVAL`] and applied once two reads in a row agree; a file that cannot be read or
//! parsed, or lists no pod, keeps the last good membership (the error logged once per distinct
//! error). The format and the rules: `docs/design/routing.md#static-peers-file`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use serde::Deserialize;

use super::{Membership, MembershipSink, Peer, PeerState, Snapshot, Source};

/// How often the file is re-read.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// This source, as logs and `tether_membership_changes_total{source}` name it.
pub(crate) const SOURCE: Source = Source::PeersFile;

/// Why a peers file was not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum PeersFileError {
    /// The file could not be read.
    #[error("cannot read peers file {path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        message: String,
    },
    /// Not a YAML list of pods (the message names the field and line).
    #[error("invalid peers file: {0}")]
    Syntax(String),
    /// The file lists no pod (an empty or comment-only file is taken for a half-written one).
    #[error("invalid peers file: it lists no pod")]
    Empty,
    /// An entry's `uid` is empty or not visible ASCII without `,` (UIDs travel in the
    /// `Tether-Visited` header).
    #[error(
        "invalid peers file: entry {0} has an empty uid or one with characters outside visible ASCII (or a comma)"
    )]
    InvalidUid(usize),
    /// Two entries share a `uid`.
    #[error("invalid peers file: uid {uid:?} appears twice (entries {first} and {second})")]
    DuplicateUid {
        /// The uid.
        uid: String,
        /// Index of its first entry.
        first: usize,
        /// Index of the repeated entry.
        second: usize,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    uid: String,
    #[serde(default)]
    name: Option<String>,
    address: SocketAddr,
    #[serde(default = "routable")]
    state: PeerState,
    #[serde(default)]
    revision: String,
}

fn routable() -> PeerState {
    PeerState::Routable
}

/// Parses the text of a peers file.
///
/// # Errors
/// [`PeersFileError`] naming the entry or field at fault.
pub(crate) fn parse(text: &str) -> Result<Snapshot, PeersFileError> {
    let entries: Option<Vec<Entry>> =
        yaml_serde::from_str(text).map_err(|e| PeersFileError::Syntax(e.to_string()))?;
    let entries = entries.unwrap_or_default();
    if entries.is_empty() {
        return Err(PeersFileError::Empty);
    }
    let mut seen: Vec<&str> = Vec::new();
    let mut unique = HashSet::new();
    for (i, e) in entries.iter().enumerate() {
        if !valid_uid(&e.uid) {
            return Err(PeersFileError::InvalidUid(i));
        }
        if !unique.insert(e.uid.as_str()) {
            let first = seen.iter().position(|u| *u == e.uid).unwrap_or(0);
            return Err(PeersFileError::DuplicateUid {
                uid: e.uid.clone(),
                first,
                second: i,
            });
        }
        seen.push(&e.uid);
    }
    Ok(Snapshot {
        peers: entries
            .into_iter()
            .map(|e| Peer {
                name: e.name.unwrap_or_else(|| e.uid.clone()),
                uid: e.uid,
                address: e.address,
                peer_port: None,
                state: e.state,
                revision: e.revision,
            })
            .collect(),
    })
}

/// Whether `uid` can identify a pod: non-empty visible ASCII without `,`.
pub(crate) fn valid_uid(uid: &str) -> bool {
    !uid.is_empty() && uid.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

/// Reads and parses the peers file at `path`.
///
/// # Errors
/// [`PeersFileError`].
pub(crate) fn load(path: &Path) -> Result<Snapshot, PeersFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| PeersFileError::Read {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    parse(&text)
}

/// The peers-file membership source.
#[derive(Debug)]
pub(crate) struct PeersFile {
    path: PathBuf,
}

impl PeersFile {
    /// A source reading `path`.
    pub(crate) fn new(path: PathBuf) -> Self {
        Self { path }
    }
}

#[async_trait]
impl Membership for PeersFile {
    fn name(&self) -> &'static str {
        SOURCE.label()
    }

    async fn run(&self, sink: MembershipSink, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_text: Option<String> = None;
        let mut pending: Option<String> = None;
        let mut last_error: Option<PeersFileError> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let text = match tokio::fs::read_to_string(&self.path).await {
                Ok(text) => text,
                Err(e) => {
                    sink.failing();
                    report(
                        &mut last_error,
                        PeersFileError::Read {
                            path: self.path.display().to_string(),
                            message: e.to_string(),
                        },
                    );
                    continue;
                }
            };
            if last_text.as_deref() == Some(text.as_str()) {
                pending = None;
                if last_error.is_none() {
                    sink.confirm();
                }
                continue;
            }
            if pending.as_deref() != Some(text.as_str()) {
                // Seen once: apply it if the next read agrees.
                pending = Some(text);
                continue;
            }
            pending = None;
            match parse(&text) {
                Ok(snapshot) => {
                    last_error = None;
                    sink.publish(SOURCE, snapshot);
                    sink.confirm();
                }
                Err(e) => {
                    sink.failing();
                    report(&mut last_error, e);
                }
            }
            last_text = Some(text);
        }
    }
}

/// Logs `error` unless it is the one logged last.
fn report(last: &mut Option<PeersFileError>, error: PeersFileError) {
    if last.as_ref() != Some(&error) {
        tracing::warn!(%error, "keeping the last good membership");
        *last = Some(error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_list_with_defaults() {
        let snap = parse(
            "- {uid: a, address: '127.0.0.2:8080'}\n\
             - {uid: b, name: pod-b, address: '127.0.0.3:8080', state: draining, revision: v2}\n",
        )
        .unwrap();
        assert_eq!(snap.peers.len(), 2);
        assert_eq!(snap.peers[0].name, "a");
        assert_eq!(snap.peers[0].state, PeerState::Routable);
        assert_eq!(snap.peers[1].state, PeerState::Draining);
        assert_eq!(snap.peers[1].revision, "v2");
        assert_eq!(parse(""), Err(PeersFileError::Empty));
        assert_eq!(parse("# nobody\n"), Err(PeersFileError::Empty));
        assert_eq!(parse("[]"), Err(PeersFileError::Empty));
    }

    #[test]
    fn malformed_files_name_the_fault() {
        let err = |t: &str| parse(t).unwrap_err().to_string();
        assert!(err("- {uid: a, address: nowhere}").contains("address"));
        assert!(err("- {uid: a, address: '1.2.3.4:1', state: sleepy}").contains("state"));
        assert!(err("- {uid: a, adress: '1.2.3.4:1'}").contains("adress"));
        assert!(err("- {uid: '', address: '1.2.3.4:1'}").contains("entry 0"));
        assert!(err("- {uid: 'a,b', address: '1.2.3.4:1'}").contains("entry 0"));
        assert_eq!(
            parse("- {uid: a, address: '1.2.3.4:1'}\n- {uid: a, address: '1.2.3.5:1'}"),
            Err(PeersFileError::DuplicateUid {
                uid: "a".into(),
                first: 0,
                second: 1
            })
        );
        assert!(err("uid: a").contains("invalid peers file"));
    }

    #[tokio::test(start_paused = true)]
    async fn rereads_on_change_and_keeps_the_last_good_membership() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peers.yaml");
        std::fs::write(&path, "- {uid: a, address: '127.0.0.2:8080'}\n").unwrap();
        let metrics = std::sync::Arc::default();
        let sink = MembershipSink::new(Snapshot::default(), metrics);
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let source = PeersFile::new(path.clone());
        let task = {
            let sink = sink.clone();
            tokio::spawn(async move { source.run(sink, shutdown).await })
        };
        let wait_for = |n: usize| {
            let sink = sink.clone();
            async move {
                for _ in 0..100 {
                    if sink.view().snapshot().peers.len() == n {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                false
            }
        };
        assert!(wait_for(1).await);
        std::fs::write(&path, "- {uid: a, address: garbage}\n").unwrap();
        tokio::time::sleep(POLL_INTERVAL * 3).await;
        assert_eq!(sink.view().snapshot().peers.len(), 1, "last good kept");
        std::fs::write(
            &path,
            "- {uid: a, address: '127.0.0.2:8080'}\n- {uid: b, address: '127.0.0.3:8080'}\n",
        )
        .unwrap();
        assert!(wait_for(2).await);
        stop.send(true).unwrap();
        task.await.unwrap();
    }
}

//! What each sidecar says of itself to its peers: its pod's revision, when it started and its
//! ports (`docs/design/routing.md#what-a-peer-reports`).
//!
//! An EndpointSlice names a pod and says whether it serves, but not which revision it runs nor
//! how old it is: the Kubernetes membership source learns both from the pod's sidecar. Two
//! sidecars exchange their [`Report`]s in one peer-protocol message (`POST /v2/about`, sent by
//! [`PeerClient`]'s [`Exchange`] and answered by `handoff/`, authenticated as every peer message): the asker sends its own and gets
//! the other's, so a pod that can reach another teaches it about itself too. [`Reports`] keeps
//! the reports by pod UID, this pod's own among them.
//!
//! A report is the word of a holder of the endpoint's key ring, which peer trust already trusts
//! with whole sessions; still, it can only describe its sender (an answer is recorded for the
//! pod whose slice address was asked, an asker's message only when its connection comes from the
//! slice address of the UID it claims; the address stays the one the EndpointSlice gives), and
//! [`Report::valid`] bounds what it may say. A pod's start never moves later:
//! [`Reports::record`] keeps the earliest one heard for a UID, so a sidecar that restarts
//! mid-rollout does not pass for the youngest pod; and it is never later than the receiver's
//! clock: a start in the future (clock skew, or a peer claiming `u64::MAX`) is recorded as the
//! receiver's now, so it cannot stay the youngest pod for good.

use std::collections::HashMap;
use std::net::SocketAddr;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;

use crate::peer::ABOUT_PATH;
use crate::peer::client::{Destination, PeerClient, PeerLink};
use crate::peer::wire::About;

/// Most peers whose reports are kept (a bound on what peers can make this pod remember).
pub(crate) const MAX_REPORTS: usize = 4096;
/// Longest revision, in bytes (a label value's limit).
pub(crate) const MAX_REVISION: usize = 63;

/// What a sidecar says of itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Report {
    /// Its pod's revision (the `pod-template-hash` label, `--revision`); empty when unknown.
    pub(crate) revision: String,
    /// When its sidecar started, in Unix milliseconds: pods are ordered oldest first by it.
    pub(crate) started_ms: u64,
    /// The port of its MCP listener (its pod's `spec.listen.port`).
    pub(crate) listen_port: u16,
    /// Its peer port (its pod's `spec.peer.port`).
    pub(crate) peer_port: u16,
}

impl Report {
    /// Whether the report can describe a pod: both ports set, the revision
    /// [`valid_revision`].
    pub(crate) fn valid(&self) -> bool {
        self.listen_port != 0 && self.peer_port != 0 && valid_revision(&self.revision)
    }
}

/// Whether `revision` can be a pod's revision: at most [`MAX_REVISION`] bytes of a label value
/// (`A-Z a-z 0-9 - _ .`), or empty (unknown). This sidecar's own `--revision` is held to it too.
pub(crate) fn valid_revision(revision: &str) -> bool {
    revision.len() <= MAX_REVISION
        && revision
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Unix time now, in milliseconds (0 before the epoch).
fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Sends this pod's report to a peer and returns the peer's (the peer protocol's `about`
/// message, implemented by `handoff/`).
#[async_trait]
pub(crate) trait Exchange: Send + Sync {
    /// Exchanges reports with pod `uid` on its peer listener at `peer`; `None` when the peer
    /// cannot be reached or gives no valid, authenticated report.
    async fn exchange(&self, uid: &str, peer: SocketAddr, own: &Report) -> Option<Report>;
}

/// The reports known, by pod UID, with this pod's own.
#[derive(Debug)]
pub(crate) struct Reports {
    own_uid: String,
    own: Report,
    known: Mutex<HashMap<String, Report>>,
    /// Counts the changes of `known` (the Kubernetes source publishes a new view on each).
    changes: tokio::sync::watch::Sender<u64>,
}

impl Reports {
    /// The reports of pod `own_uid`, whose own report is `own`; no peer's known yet.
    pub(crate) fn new(own_uid: String, own: Report) -> Self {
        Self {
            own_uid,
            own,
            known: Mutex::default(),
            changes: tokio::sync::watch::channel(0).0,
        }
    }

    /// This pod's UID.
    pub(crate) fn own_uid(&self) -> &str {
        &self.own_uid
    }

    /// This pod's report.
    pub(crate) fn own(&self) -> &Report {
        &self.own
    }

    /// The report of pod `uid` (this pod's own included), if known.
    pub(crate) fn get(&self, uid: &str) -> Option<Report> {
        if uid == self.own_uid {
            return Some(self.own.clone());
        }
        self.known.lock().get(uid).cloned()
    }

    /// Records what pod `uid` reported; an invalid report, this pod's UID, or a new UID beyond
    /// [`MAX_REPORTS`] is ignored. The start kept is the earliest heard, and at most this
    /// pod's clock now (Unix ms): a start in the future counts as now. Returns whether what is
    /// known changed.
    pub(crate) fn record(&self, uid: &str, mut report: Report) -> bool {
        if uid == self.own_uid || !report.valid() {
            return false;
        }
        report.started_ms = report.started_ms.min(unix_now_ms());
        let mut known = self.known.lock();
        let full = known.len() >= MAX_REPORTS;
        let changed = match known.get_mut(uid) {
            Some(old) => {
                report.started_ms = report.started_ms.min(old.started_ms);
                *old != report && {
                    *old = report;
                    true
                }
            }
            None if full => false,
            None => {
                known.insert(uid.to_owned(), report);
                true
            }
        };
        drop(known);
        if changed {
            self.changes.send_modify(|n| *n += 1);
        }
        changed
    }

    /// Forgets the reports of pods for which `keep` is false (they left membership).
    pub(crate) fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.known.lock().retain(|uid, _| keep(uid));
    }

    /// Changes with every report recorded that changed what is known.
    pub(crate) fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

/// The `about` message of pod `from`, carrying `report`.
pub(crate) fn about(from: &str, report: &Report) -> About {
    About {
        from: from.to_owned(),
        revision: report.revision.clone(),
        started_ms: report.started_ms,
        listen_port: report.listen_port,
        peer_port: report.peer_port,
    }
}

impl From<About> for Report {
    /// The report an `about` message carries.
    fn from(about: About) -> Self {
        Self {
            revision: about.revision,
            started_ms: about.started_ms,
            listen_port: about.listen_port,
            peer_port: about.peer_port,
        }
    }
}

#[async_trait]
impl Exchange for PeerClient {
    async fn exchange(&self, uid: &str, peer: SocketAddr, own: &Report) -> Option<Report> {
        let to = Destination { uid, addr: peer };
        let body = Bytes::from(serde_json::to_vec(&about(self.uid(), own)).ok()?);
        let answer = match self.ask(to, ABOUT_PATH, body).await {
            Ok(answer) => answer,
            Err(error) => {
                tracing::debug!(peer = uid, %error, "no report from the peer yet");
                return None;
            }
        };
        let about: About = serde_json::from_slice(&answer).ok()?;
        (about.from == uid).then(|| about.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(revision: &str, started_ms: u64) -> Report {
        Report {
            revision: revision.into(),
            started_ms,
            listen_port: 8080,
            peer_port: 9090,
        }
    }

    #[test]
    fn a_pods_start_never_moves_later_and_its_other_words_follow_it() {
        let reports = Reports::new("me".into(), report("r1", 5));
        let mut changes = reports.changes();
        assert_eq!(reports.get("me"), Some(report("r1", 5)), "its own");
        assert!(reports.get("a").is_none());
        assert!(reports.record("a", report("r1", 100)));
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        // Its sidecar restarted: a later start is not taken, the rest is.
        assert!(!reports.record("a", report("r1", 900)));
        assert!(!changes.has_changed().unwrap(), "nothing changed");
        let moved = Report {
            listen_port: 8181,
            ..report("r1", 900)
        };
        assert!(reports.record("a", moved));
        assert_eq!(
            reports.get("a"),
            Some(Report {
                listen_port: 8181,
                ..report("r1", 100)
            })
        );
        assert!(
            !reports.record("me", report("r9", 1)),
            "nobody speaks for it"
        );
        assert_eq!(reports.get("me"), Some(report("r1", 5)));
        reports.retain(|uid| uid != "a");
        assert!(reports.get("a").is_none());
    }

    #[test]
    fn reports_that_cannot_describe_a_pod_are_ignored() {
        let reports = Reports::new("me".into(), report("r1", 5));
        for (what, bad) in [
            (
                "no MCP port",
                Report {
                    listen_port: 0,
                    ..report("r1", 1)
                },
            ),
            (
                "no peer port",
                Report {
                    peer_port: 0,
                    ..report("r1", 1)
                },
            ),
            ("a revision no label carries", report("r1\nforged", 1)),
            (
                "a revision too long",
                report(&"a".repeat(MAX_REVISION + 1), 1),
            ),
        ] {
            assert!(!reports.record("a", bad), "{what}");
        }
        assert!(
            reports.record("a", report("", 1)),
            "an unknown revision is fine"
        );
    }

    #[test]
    fn a_start_in_the_future_counts_as_now() {
        let reports = Reports::new("me".into(), report("r1", 5));
        let before = unix_now_ms();
        assert!(reports.record("liar", report("r1", u64::MAX)));
        let started = reports.get("liar").unwrap().started_ms;
        assert!(
            (before..=unix_now_ms()).contains(&started),
            "clamped to the receiver's now: {started}"
        );
        assert!(reports.record("skewed", report("r1", before + 3_600_000)));
        assert!(reports.get("skewed").unwrap().started_ms <= unix_now_ms());
        assert!(reports.record("past", report("r1", 7)));
        assert_eq!(
            reports.get("past").unwrap().started_ms,
            7,
            "a past start stays"
        );
    }

    #[test]
    fn new_peers_beyond_the_bound_are_not_remembered() {
        let reports = Reports::new("me".into(), report("r1", 5));
        for i in 0..MAX_REPORTS {
            assert!(reports.record(&format!("p{i}"), report("r1", 1)));
        }
        assert!(!reports.record("one-more", report("r1", 1)));
        assert!(
            reports.record("p0", report("r2", 1)),
            "a known peer still updates"
        );
    }

    #[test]
    fn a_report_travels_in_camel_case_and_round_trips() {
        use serde_json::json;
        let report = Report {
            revision: "5d8f7c9b6".into(),
            started_ms: 1_767_225_600_000,
            listen_port: 8080,
            peer_port: 9901,
        };
        let about = about("pod-a", &report);
        let text = serde_json::to_value(&about).unwrap();
        assert_eq!(
            text,
            json!({"from": "pod-a", "revision": "5d8f7c9b6", "startedMs": 1_767_225_600_000u64,
                   "listenPort": 8080, "peerPort": 9901})
        );
        let back: About = serde_json::from_value(text).unwrap();
        assert_eq!(Report::from(back), report);
    }
}

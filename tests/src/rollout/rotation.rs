//! A rotation of the endpoint's key during the rollout ([`super::RolloutConfig::rotate_key`]):
//! the harness does what the operator does (`docs/design/peer-trust.md#rotation`), interleaved
//! with the pod replacements, while the load runs.
//!
//! The pods start with a key ring of their own ([`RingState::fresh`], not the process-wide test
//! ring), each mounted in the pod's own Secret volume. Each step writes the endpoint's new Secret
//! into every running pod's volume, one pod after the other at random moments (as the kubelets
//! of a cluster refresh a Secret volume each at its own time), atomically as the kubelet does
//! ([`crate::keyring::mount`]), and waits until every running pod reports on `GET /keys` that it
//! loaded it; a pod started later mounts the Secret as it is then ([`Cluster::set_key_ring`]):
//!
//! 1. **stage**, after the first replacement: the new key as `next`, its CA in the bundle;
//!    done when every pod reports `next` = the new key (and still signs with the old one);
//! 2. **promote**, after the second (the first, with one pod): the new key, certificate and
//!    private key current, the old key `previous`, both CAs; done when every pod reports
//!    `current` = the new key and `previous` = the old one;
//! 3. **retire**, once the rollout is done — but only when no pod reports a session minted with
//!    the old key. The load's sessions were all minted before the rotation and live until the
//!    load finishes, so the retire then waits (recorded, with every pod's report, while the old
//!    key stays `previous` everywhere); once the load is done and its sessions are deleted, the
//!    old key and its CA leave the ring, and the rotation is done when every pod reports no
//!    `previous`.
//!
//! Around the steps: a *witness* session is minted before the rotation (its id names the old
//! key); after the promotion, and again when the retire is first due, a request of it entering
//! at each running pod is answered (the pods sign with the new key and verify the old one); a
//! session minted after the promotion names the new key; after the retire, a fresh session
//! works from every pod (forwards over mutual TLS with only the new CA). Everything that did not
//! happen as it should is a [`RotationReport::failures`] line.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde_json::json;
use tether_crds::keyring::{Generation, KeyReport};

use super::Rollout;
use crate::auth::Issuer;
use crate::client::{
    McpClient, PUBLIC_HEADERS, Session, body_text, messages, result_text, tool_call,
};
use crate::cluster::Cluster;
use crate::keyring::{KeyFiles, RingState, generation, session_key_id};
use crate::{HarnessError, Result};

/// The label of the rotating endpoint's certificates.
const LABEL: &str = "test/rotating-endpoint";
/// How long every running pod may take to report a step (the sidecar reads its Secret volume
/// every second).
const STEP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the sessions of the old key may take to end once the load is done.
const RETIRE_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest pause before the next pod's volume is written.
const MAX_STAGGER_MS: u64 = 600;
/// The protocol version of the harness's own sessions.
const VERSION: &str = "2025-06-18";

/// One step of the rotation, as every running pod reported it.
#[derive(Clone, Debug)]
pub struct RotationStep {
    /// `stage`, `promote` or `retire`.
    pub name: &'static str,
    /// When it began (its first volume written), from the start of the load.
    pub at: Duration,
    /// From the first volume written until every running pod reported the step (or the
    /// time was up).
    pub took: Duration,
    /// The last report of every pod running then.
    pub reports: Vec<(Ipv4Addr, KeyReport)>,
    /// Every pod reported the step within the time.
    pub complete: bool,
}

/// What the rotation did and saw.
#[derive(Clone, Debug, Default)]
pub struct RotationReport {
    /// The id of the key before the rotation.
    pub old_key: String,
    /// The id of the key after it.
    pub new_key: String,
    /// The steps, in order.
    pub steps: Vec<RotationStep>,
    /// The key ring every replacement pod reported once ready: its IP, the step the rotation
    /// was at when it started (`none`, `stage`, `promote`) and its report.
    pub joined: Vec<(Ipv4Addr, &'static str, KeyReport)>,
    /// When the retire was first due (the rollout done): every pod's report, if some pod still
    /// held sessions of the old key (the retire then waited for them).
    pub retire_deferred: Option<Vec<(Ipv4Addr, KeyReport)>>,
    /// How long the retire waited, once the load was done, for the last sessions of the old key
    /// to end.
    pub retire_waited: Option<Duration>,
    /// The key id the witness session's id names.
    pub witness_key: Option<String>,
    /// Requests of the witness session after the promotion and when the retire was first due:
    /// when, the entry pod, and what happened.
    pub witness_checks: Vec<(&'static str, Ipv4Addr, Result<(), String>)>,
    /// The key id a session minted after the promotion names.
    pub minted_after_promote: Option<String>,
    /// Requests of a session minted after the retire, entering at each pod.
    pub after_retire: Vec<(Ipv4Addr, Result<(), String>)>,
    /// Key-ring reloads each pod counted (`tether_key_ring_reloads_total`), as last read after
    /// a step: applied, and invalid (files read that did not fit together; the last good ring
    /// stayed). Each step written to a pod is one applied reload.
    pub reloads: Vec<(Ipv4Addr, f64, f64)>,
    /// Everything that did not happen as the rotation expects.
    pub failures: Vec<String>,
}

impl RotationReport {
    /// The steps and checks as text, one line each, for the test's output.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!("key rotation {} -> {}", self.old_key, self.new_key)];
        for step in &self.steps {
            out.push(format!(
                "  {} at {:.2} s, reported by {} pods in {:.2} s{}",
                step.name,
                step.at.as_secs_f64(),
                step.reports.len(),
                step.took.as_secs_f64(),
                if step.complete { "" } else { " (INCOMPLETE)" },
            ));
            for (ip, report) in &step.reports {
                out.push(format!("    {ip}: {}", summary(report)));
            }
        }
        for (ip, when, report) in &self.joined {
            out.push(format!(
                "  {ip} started after step {when}: {}",
                summary(report)
            ));
        }
        if let Some(reports) = &self.retire_deferred {
            out.push(format!(
                "  retire deferred; after the load, the sessions of the old key were gone in {}:",
                self.retire_waited.map_or("(never)".to_owned(), |d| format!(
                    "{:.2} s",
                    d.as_secs_f64()
                ))
            ));
            for (ip, report) in reports {
                out.push(format!("    {ip}: {}", summary(report)));
            }
        }
        out.push(format!(
            "  witness key {:?}; checks {}; minted after promote {:?}; after retire {}",
            self.witness_key,
            self.witness_checks
                .iter()
                .filter(|(_, _, r)| r.is_ok())
                .count(),
            self.minted_after_promote,
            self.after_retire.iter().filter(|(_, r)| r.is_ok()).count()
        ));
        for (ip, applied, invalid) in &self.reloads {
            out.push(format!(
                "  {ip}: key ring reloads applied {applied}, invalid {invalid}"
            ));
        }
        out.extend(self.failures.iter().map(|f| format!("  FAILURE: {f}")));
        out
    }

    /// Sessions of key `key` over `reports`.
    pub fn sessions_of(reports: &[(Ipv4Addr, KeyReport)], key: &str) -> u64 {
        reports
            .iter()
            .filter_map(|(_, r)| r.sessions.get(key))
            .sum()
    }
}

/// A report in one line.
fn summary(r: &KeyReport) -> String {
    format!(
        "current {} previous {} next {} sessions {:?}",
        r.current,
        r.previous.as_deref().unwrap_or("-"),
        r.next.as_deref().unwrap_or("-"),
        r.sessions
    )
}

/// The rotation under way.
pub(super) struct Rotation {
    /// The Secret now.
    state: RingState,
    /// The generation the rotation promotes.
    new: Generation,
    /// The last step written (`none` before the first).
    phase: &'static str,
    /// The public headers and the credentials of the harness's own sessions.
    authorization: Option<String>,
    witness: Option<Session>,
    pub(super) report: RotationReport,
}

impl Rotation {
    /// A rotation of a fresh key ring to another fresh generation.
    ///
    /// # Errors
    /// [`HarnessError`] when a generation cannot be made.
    pub(super) fn new(issuer: Option<&Issuer>) -> Result<Self> {
        let state = RingState::fresh(LABEL)?;
        let new = generation(LABEL)?;
        Ok(Self {
            report: RotationReport {
                old_key: state.current.id(),
                new_key: new.id(),
                ..RotationReport::default()
            },
            state,
            new,
            phase: "none",
            authorization: issuer
                .map(|i| i.bearer(super::clients::ISSUER, "witness", Duration::from_secs(3600))),
            witness: None,
        })
    }

    /// The Secret's files now.
    pub(super) fn files(&self) -> KeyFiles {
        self.state.files()
    }

    /// A client of the harness's own sessions entering at `urls`.
    fn client(&self, urls: Vec<String>) -> McpClient {
        let client = McpClient::spread(urls);
        client.set_headers(&PUBLIC_HEADERS);
        client.set_authorization(self.authorization.clone());
        client
    }

    /// Mints the witness session, before the rotation.
    pub(super) async fn mint_witness(&mut self, cluster: &Cluster) {
        match self
            .client(cluster.routable_urls())
            .initialize(VERSION)
            .await
        {
            Ok(session) => {
                self.report.witness_key = session_key_id(&session.id);
                if self.report.witness_key.as_deref() != Some(self.report.old_key.as_str()) {
                    self.report.failures.push(format!(
                        "the witness session, minted before the rotation, names key {:?}, not {}",
                        self.report.witness_key, self.report.old_key
                    ));
                }
                self.witness = Some(session);
            }
            Err(e) => self
                .report
                .failures
                .push(format!("the witness session: {e}")),
        }
    }

    /// Records the key ring of the replacement pod on `ip`, which started at this phase, and
    /// checks it is the Secret of that moment.
    pub(super) async fn joined(&mut self, cluster: &Cluster, ip: Ipv4Addr) {
        let Some(pod) = cluster.pod(ip) else {
            return;
        };
        let report = match pod.key_report().await {
            Ok(report) => report,
            Err(e) => {
                self.report.failures.push(format!("GET /keys of {ip}: {e}"));
                return;
            }
        };
        if !self.loaded(&report) {
            self.report.failures.push(format!(
                "{ip}, started after step {}, did not load the Secret of that moment: {}",
                self.phase,
                summary(&report)
            ));
        }
        self.report.joined.push((ip, self.phase, report));
    }

    /// Whether `r` is what a pod that loaded the current Secret reports.
    fn loaded(&self, r: &KeyReport) -> bool {
        let id = |g: &Option<Generation>| g.as_ref().map(Generation::id);
        r.current == self.state.current.id()
            && r.previous == id(&self.state.previous)
            && r.next == id(&self.state.next)
    }

    /// Step 1: stages the new key.
    pub(super) async fn stage(&mut self, cluster: &mut Cluster, rollout: &mut Rollout<'_>) {
        let staged = self.state.staged(self.new.clone());
        self.step(cluster, rollout, "stage", staged).await;
    }

    /// Step 2: promotes it; then the witness works from every pod and new sessions name the
    /// new key.
    pub(super) async fn promote(&mut self, cluster: &mut Cluster, rollout: &mut Rollout<'_>) {
        let Some(promoted) = self.state.promoted() else {
            self.report
                .failures
                .push("promote before stage: nothing staged".into());
            return;
        };
        self.step(cluster, rollout, "promote", promoted).await;
        self.check_witness(cluster, "promote").await;
        let client = self.client(cluster.routable_urls());
        match client.initialize(VERSION).await {
            Ok(session) => {
                self.report.minted_after_promote = session_key_id(&session.id);
                if self.report.minted_after_promote.as_deref() != Some(self.report.new_key.as_str())
                {
                    self.report.failures.push(format!(
                        "a session minted after the promotion names key {:?}, not {}",
                        self.report.minted_after_promote, self.report.new_key
                    ));
                }
                let _ = client.delete(&session).await;
            }
            Err(e) => self
                .report
                .failures
                .push(format!("a session after the promotion: {e}")),
        }
    }

    /// The rollout is done: retires the old key if no pod holds a session minted with it;
    /// otherwise records that the retire waits (see [`Rotation::retire`]). Whether it retired.
    pub(super) async fn retire_if_unused(
        &mut self,
        cluster: &mut Cluster,
        rollout: &mut Rollout<'_>,
    ) -> bool {
        self.check_witness(cluster, "retire due").await;
        let reports = self.reports(cluster).await;
        let old = self.report.old_key.clone();
        let in_use = RotationReport::sessions_of(&reports, &old);
        if in_use == 0 {
            self.retire_now(cluster, rollout).await;
            return true;
        }
        rollout.step(format!(
            "key rotation: retire waits: {in_use} sessions of key {old} on the pods"
        ));
        let kept = reports
            .iter()
            .all(|(_, r)| r.previous.as_deref() == Some(old.as_str()));
        if !kept {
            self.report.failures.push(format!(
                "while sessions of the old key live, a pod dropped it: {reports:?}"
            ));
        }
        self.report.retire_deferred = Some(reports);
        false
    }

    /// Once the load is done: deletes the witness, waits until no pod reports a session of the
    /// old key (the old key stays `previous` everywhere meanwhile), then retires it.
    pub(super) async fn retire(&mut self, cluster: &mut Cluster, rollout: &mut Rollout<'_>) {
        if let Some(witness) = self.witness.take() {
            let _ = self.client(cluster.routable_urls()).delete(&witness).await;
        }
        let old = self.report.old_key.clone();
        let waiting = Instant::now();
        let deadline = waiting + RETIRE_TIMEOUT;
        loop {
            let reports = self.reports(cluster).await;
            let in_use = RotationReport::sessions_of(&reports, &old);
            if reports
                .iter()
                .any(|(_, r)| r.previous.as_deref() != Some(old.as_str()))
            {
                self.report.failures.push(format!(
                    "before the retire, a pod dropped the old key: {reports:?}"
                ));
                break;
            }
            if in_use == 0 {
                self.report.retire_waited = Some(waiting.elapsed());
                break;
            }
            if Instant::now() > deadline {
                let mut held = Vec::new();
                for pod in &cluster.pods {
                    let sessions = pod.metric("tether_sessions").await.unwrap_or(f64::NAN);
                    let streams = pod.metric("tether_streams").await.unwrap_or(f64::NAN);
                    held.push((pod.ip, sessions, streams));
                }
                self.report.failures.push(format!(
                    "the sessions of the old key did not end within {RETIRE_TIMEOUT:?} of the \
                     load's end, although every client deleted its session (a deleted session \
                     lives on somewhere, and the old key can never be retired): {reports:?}; \
                     tether_sessions and tether_streams per pod: {held:?}"
                ));
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.retire_now(cluster, rollout).await;
    }

    async fn retire_now(&mut self, cluster: &mut Cluster, rollout: &mut Rollout<'_>) {
        let retired = self.state.retired();
        self.step(cluster, rollout, "retire", retired).await;
        let client = self.client(cluster.routable_urls());
        let session = match client.initialize(VERSION).await {
            Ok(session) => session,
            Err(e) => {
                self.report
                    .failures
                    .push(format!("a session after the retire: {e}"));
                return;
            }
        };
        for (i, pod) in cluster.pods.iter().enumerate() {
            let at = self.client(vec![pod.mcp_url.clone()]);
            let result = echo(&at, &session, 10 + i as u64).await;
            if let Err(e) = &result {
                self.report
                    .failures
                    .push(format!("after the retire, entering at {}: {e}", pod.ip));
            }
            self.report.after_retire.push((pod.ip, result));
        }
        let _ = client.delete(&session).await;
    }

    /// A request of the witness session entering at each running pod.
    async fn check_witness(&mut self, cluster: &Cluster, when: &'static str) {
        let Some(witness) = self.witness.clone() else {
            return;
        };
        for (i, pod) in cluster.pods.iter().enumerate() {
            let at = self.client(vec![pod.mcp_url.clone()]);
            let id = 100 * (self.report.witness_checks.len() as u64 + 1) + i as u64;
            let result = echo(&at, &witness, id).await;
            if let Err(e) = &result {
                self.report.failures.push(format!(
                    "the witness session after step {}, entering at {}: {e}",
                    self.phase, pod.ip
                ));
            }
            self.report.witness_checks.push((when, pod.ip, result));
        }
    }

    /// Every running pod's `GET /keys` (a pod that does not answer is left out, and noted).
    async fn reports(&mut self, cluster: &Cluster) -> Vec<(Ipv4Addr, KeyReport)> {
        let mut out = Vec::with_capacity(cluster.pods.len());
        for pod in &cluster.pods {
            match pod.key_report().await {
                Ok(report) => out.push((pod.ip, report)),
                Err(e) => self
                    .report
                    .failures
                    .push(format!("GET /keys of {}: {e}", pod.ip)),
            }
        }
        out
    }

    /// Writes `state` into every running pod's Secret volume, one after the other at random
    /// moments, makes it the Secret of pods started from now on, and waits until every running
    /// pod reports it.
    async fn step(
        &mut self,
        cluster: &mut Cluster,
        rollout: &mut Rollout<'_>,
        name: &'static str,
        state: RingState,
    ) {
        self.state = state;
        self.phase = name;
        let files = self.state.files();
        cluster.set_key_ring(Some(files.clone()));
        let at = rollout.started.elapsed();
        let began = Instant::now();
        let mut order: Vec<usize> = (0..cluster.pods.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rand::random_range(0..=i));
        }
        for (n, i) in order.into_iter().enumerate() {
            if n > 0 {
                let pause = rand::random_range(50..=MAX_STAGGER_MS);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            let pod = &cluster.pods[i];
            if let Err(e) = pod.mount_keys(&files) {
                self.report.failures.push(format!(
                    "{name}: writing the Secret volume of {}: {e}",
                    pod.ip
                ));
            }
        }
        rollout.step(format!(
            "key rotation: {name} written to the Secret volume of {} pods, one by one, in {:.2} s",
            cluster.pods.len(),
            began.elapsed().as_secs_f64()
        ));
        let deadline = began + STEP_TIMEOUT;
        let (reports, complete) = loop {
            let reports = self.reports(cluster).await;
            let complete =
                reports.len() == cluster.pods.len() && reports.iter().all(|(_, r)| self.loaded(r));
            if complete || Instant::now() > deadline {
                break (reports, complete);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let took = began.elapsed();
        if complete {
            rollout.step(format!(
                "key rotation: every pod reports {name} ({:.2} s after the first write)",
                took.as_secs_f64()
            ));
        } else {
            self.report.failures.push(format!(
                "{name}: not every pod reported it within {STEP_TIMEOUT:?}: {reports:?}"
            ));
        }
        for pod in &cluster.pods {
            let count = |result: &str| {
                let sample = format!("tether_key_ring_reloads_total{{result=\"{result}\"}}");
                async move { pod.metric(&sample).await.unwrap_or(f64::NAN) }
            };
            let (applied, invalid) = (count("applied").await, count("invalid").await);
            self.report.reloads.retain(|(ip, ..)| *ip != pod.ip);
            self.report.reloads.push((pod.ip, applied, invalid));
        }
        self.report.steps.push(RotationStep {
            name,
            at,
            took,
            reports,
            complete,
        });
    }
}

/// `echo` in `session` through `client`, answered with its text.
async fn echo(client: &McpClient, session: &Session, id: u64) -> Result<(), String> {
    let text = format!("rotation {id}");
    let resp = client
        .post(
            Some(session),
            &tool_call(id, "echo", json!({ "text": text }), None),
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    if status != http::StatusCode::OK {
        let body = body_text(resp).await.unwrap_or_default();
        return Err(format!("{status}: {body:.300}"));
    }
    let answer = messages(resp, Duration::from_secs(10))
        .await
        .map_err(|e: HarnessError| e.to_string())?;
    match answer.last().and_then(result_text) {
        Some(t) if t == text => Ok(()),
        other => Err(format!("answered {other:?}")),
    }
}

//! The rolling upgrade (`docs/guide/rolling-upgrade.md`): every pod of an endpoint replaced by a
//! pod of a newer revision, one at a time, under a load of real MCP sessions; what the clients
//! experienced and what the sidecars counted, in one [`RolloutReport`].
//!
//! The load (module `clients`) starts before the rollout and overlaps all of it: every session
//! initializes, then loops `slow` calls with unique `call_id`s (cut and resumed with
//! `Last-Event-ID` at random), some keep a standalone GET stream open and call `notify` on it
//! (module `standalone`), some call `counter` and watch it restart (tool state the journal does not
//! carry). Sessions keep calling until the rollout is done, then make one more call each, so
//! resumes land on the new pods. A session answered 404 is started again, as clients must
//! (spec S-05).
//!
//! With [`RolloutConfig::auth`] (the default) the MCP servers require bearer tokens
//! (`tether-example-server --auth-key`): every client is its own user with short-lived tokens
//! it refreshes as OAuth clients do — most before expiry, some only after a 401 — and now and
//! then another user tries a client's session, which must get the 404 of an unknown session.
//!
//! Clients send a public `Host` and the browser `Origin` the endpoint allows
//! ([`PUBLIC_HEADERS`]); the MCP servers defend against DNS rebinding as SDK servers on
//! loopback do (`tether-example-server --local-only`, or the Python SDK fixture of
//! [`RolloutConfig::upstream`]) and must refuse none of tether's requests.
//!
//! One replacement follows the order Kubernetes gives a rolling update:
//! 1. the new pod (revision [`NEW_REVISION`]) starts, becomes ready and routable in every peers
//!    file, and the client Service sends it traffic;
//! 2. the old pod leaves the Service (its readiness fails) and turns `draining` in every peers
//!    file (its deletion timestamp);
//! 3. `tether-sidecar drain` in it (the sidecar's preStop hook), timed: the drain time;
//! 4. its sidecar metrics and peak RSS are read, SIGTERM goes to the sidecar (waited for), the
//!    example server's `/stats` are read and the server stops;
//! 5. the pod leaves every peers file.
//!
//! Beside the sessions, 2026-07-28 clients (module `modern`) make stateless calls, create tasks
//! polled at random entries and keep `subscriptions/listen` streams open, as the clients of a
//! dual-era endpoint do ([`ModernFigures`] in the report).
//!
//! With [`RolloutConfig::rotate_key`], the endpoint's key rotates during the rollout, in the
//! operator's three steps interleaved with the replacements (module `rotation`, its
//! [`RotationReport`] in the report).

mod clients;
pub mod fault;
mod modern;
mod report;
mod rotation;
mod soak;
mod standalone;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use modern::ModernFigures;
pub use report::{AuthFigures, DrainRecord, RolloutReport, SidecarCounters, table};
pub use rotation::{RotationReport, RotationStep};
pub use soak::{SoakRow, soak_table};

use crate::auth::Issuer;
use crate::client::{McpClient, PUBLIC_HEADERS};
use crate::cluster::Cluster;
use crate::incident::{Incident, IncidentKind};
use crate::load::Executions;
use crate::pod::{Pod, PodSpec, Upstream};
use crate::{HarnessError, Result, addr};

/// Revision of the replacement pods (the first pods have [`crate::cluster::FIRST_REVISION`]).
pub const NEW_REVISION: &str = "v2";
/// How long the sessions may take to initialize before the rollout starts anyway.
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);
/// Added to `spec.drain.timeout` to bound `tether-sidecar drain` and the sidecar's exit.
const STOP_MARGIN: Duration = Duration::from_secs(10);
/// How long the sessions may take for their last calls once the rollout is done.
const FINISH_TIMEOUT: Duration = Duration::from_secs(90);

/// What to run. The default is the reduced run of CI: 3 pods, 200 sessions.
#[derive(Clone, Debug)]
pub struct RolloutConfig {
    /// Pods before and after the rollout; each is replaced once.
    pub pods: usize,
    /// MCP sessions, all running for the whole rollout.
    pub sessions: usize,
    /// `slow` calls each session makes at least; it keeps calling until the rollout is done,
    /// then makes one more.
    pub calls: usize,
    /// Progress notifications per `slow` call.
    pub count: u32,
    /// Milliseconds between progress notifications.
    pub interval_ms: u64,
    /// Probability (0..=1) that a client cuts a `slow` call's connection (once or twice) and
    /// resumes, and that it cuts its standalone GET stream after a `notify` call.
    pub cut_probability: f64,
    /// Longest pause between a cut and the resume, in ms.
    pub max_pause_ms: u64,
    /// Fraction (0..=1) of sessions that keep a standalone GET stream open and call `notify`
    /// before each `slow` call.
    pub standalone_fraction: f64,
    /// Fraction (0..=1) of sessions that call `counter` before each `slow` call.
    pub counter_fraction: f64,
    /// Log notifications per `notify` call.
    pub notify_count: u32,
    /// Protocol versions sessions ask for, round-robin (at least one).
    pub versions: Vec<String>,
    /// Whether draining sidecars hand their sessions off (`--handoff`); `false` is the
    /// baseline.
    pub handoff: bool,
    /// `spec.session.migration`: `Replay` or `Pin`.
    pub migration: String,
    /// `spec.session.replication`: `None`, `Sessions` or `Events`; `None` (the Rust value):
    /// the manifest does not name it, the sidecar's default applies.
    pub replication: Option<String>,
    /// `spec.drain.timeout`.
    pub drain_timeout: Duration,
    /// Clients start at random moments spread over this time, as real clients arrive (not in
    /// the same millisecond, which would also keep every client's calls in lockstep); the
    /// rollout begins once all are initialized.
    pub ramp_up: Duration,
    /// Whether the MCP servers require authorization, and how clients use their tokens;
    /// `None`: no auth (the only choice for [`Upstream::PythonSdk`], which has none).
    pub auth: Option<AuthLoad>,
    /// The MCP server of every pod.
    pub upstream: Upstream,
    /// The sidecar the pods run before the rollout, when it is not the new pods' (a rollout of
    /// tether itself); `None`: the same sidecar before and after.
    pub old_sidecar: Option<OldSidecar>,
    /// Rotate the endpoint's key during the rollout: stage after the first replacement,
    /// promote after the second, retire once no session of the old key is left (module
    /// `rotation`). The pods then mount a key ring of their own, each in its own Secret volume.
    pub rotate_key: bool,
    /// `spec.peer.tls` of every pod: mutual TLS between sidecars (on by default).
    pub peer_tls: bool,
    /// 2026-07-28 clients beside the sessions: each loops a `slow` call, a `confirm` multi
    /// round-trip request and a `job` task (module `modern`); needs an MCP server with `job`
    /// and `confirm` ([`Upstream::Example`]).
    pub modern_clients: usize,
    /// 2026-07-28 clients that keep a `subscriptions/listen` stream open.
    pub listeners: usize,
    /// The sidecars' log filter (`RUST_LOG`), e.g. one that writes every session's requests
    /// and moves so that the report explains each incident ([`RolloutReport::explain`]);
    /// `None`: the harness's (`TETHER_TEST_LOG`, else `info`).
    pub sidecar_log: Option<String>,
}

/// The sidecar of the pods before a rollout of tether itself: another build's binary.
#[derive(Clone, Debug)]
pub struct OldSidecar {
    /// Its binary.
    pub bin: std::path::PathBuf,
}

impl OldSidecar {
    /// The `tether-sidecar` of another build, in `dir`.
    ///
    /// # Errors
    /// [`HarnessError`] when the binary cannot be run.
    pub fn in_dir(dir: &std::path::Path) -> Result<Self> {
        let bin = dir.join("tether-sidecar");
        std::process::Command::new(&bin)
            .arg("--version")
            .output()
            .map_err(|e| HarnessError::Start(format!("{}: {e}", bin.display())))?;
        Ok(Self { bin })
    }
}

/// How the clients of an authenticated rollout use their tokens.
#[derive(Clone, Debug)]
pub struct AuthLoad {
    /// Lifetime of every token (at least 1 s).
    pub token_ttl: Duration,
    /// Fraction (0..=1) of clients that refresh their token only after a 401; the others
    /// refresh it in its last quarter.
    pub lazy_fraction: f64,
    /// Probability (0..=1) that, after one of a client's `slow` calls, another user (with a
    /// valid token of the same issuer) sends a `ping` in the client's session.
    pub probe_probability: f64,
}

impl Default for AuthLoad {
    /// 5 s tokens (the CI rollout runs about 20 s: every client lives through several), a
    /// quarter of the clients refreshing only after a 401, a probe after one call in twenty.
    fn default() -> Self {
        Self {
            token_ttl: Duration::from_secs(5),
            lazy_fraction: 0.25,
            probe_probability: 0.05,
        }
    }
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            pods: 3,
            sessions: 200,
            calls: 5,
            count: 10,
            interval_ms: 100,
            cut_probability: 0.3,
            max_pause_ms: 50,
            standalone_fraction: 0.2,
            counter_fraction: 0.2,
            notify_count: 3,
            versions: ["2025-03-26", "2025-06-18", "2025-11-25"]
                .map(String::from)
                .to_vec(),
            handoff: true,
            migration: "Replay".into(),
            replication: None,
            drain_timeout: Duration::from_secs(3),
            ramp_up: Duration::from_secs(1),
            auth: Some(AuthLoad::default()),
            upstream: Upstream::Example,
            old_sidecar: None,
            rotate_key: false,
            peer_tls: true,
            sidecar_log: None,
            modern_clients: 20,
            listeners: 4,
        }
    }
}

impl RolloutConfig {
    /// The same run without handoff (`--handoff false`) nor replication: the baseline.
    pub fn baseline(&self) -> Self {
        Self {
            handoff: false,
            replication: Some("None".into()),
            ..self.clone()
        }
    }

    /// The run's name, the title of its column: `handoff`, `baseline`, the migration mode
    /// when it is not `Replay` (e.g. `Pin`), `upgrade` for a rollout of tether itself, or
    /// `rotation` for one during which the key rotates.
    pub fn label(&self) -> String {
        if self.migration != "Replay" {
            self.migration.clone()
        } else if !self.handoff {
            "baseline".into()
        } else if self.old_sidecar.is_some() {
            "upgrade".into()
        } else if self.rotate_key {
            "rotation".into()
        } else {
            "handoff".into()
        }
    }

    /// The spec of the pods before the rollout: [`RolloutConfig::pod_spec`] with the old
    /// sidecar, when there is one.
    fn old_pod_spec(&self, issuer: Option<&Issuer>) -> PodSpec {
        let mut spec = self.pod_spec(issuer);
        if let Some(old) = &self.old_sidecar {
            spec.sidecar_bin = Some(old.bin.clone());
        }
        spec
    }

    /// The pods' spec: MCP servers defending against DNS rebinding, accepting `issuer`'s
    /// tokens when given.
    fn pod_spec(&self, issuer: Option<&Issuer>) -> PodSpec {
        let mut server_args = Vec::new();
        if self.upstream == Upstream::Example {
            server_args.push("--local-only".to_owned());
            server_args.extend(issuer.map(Issuer::server_args).unwrap_or_default());
        }
        PodSpec {
            migration: self.migration.clone(),
            replication: self.replication.clone(),
            drain_timeout: format!("{}ms", self.drain_timeout.as_millis()),
            sidecar_args: vec!["--handoff".into(), self.handoff.to_string()],
            server: self.upstream,
            server_args,
            peer_tls: self.peer_tls,
            sidecar_env: self
                .sidecar_log
                .iter()
                .map(|filter| ("RUST_LOG".to_owned(), filter.clone()))
                .collect(),
            ..PodSpec::default()
        }
    }

    /// The issuer of the clients' tokens, when the MCP servers require them.
    fn issuer(&self) -> Result<Option<Arc<Issuer>>> {
        self.auth
            .as_ref()
            .map(|_| Issuer::new().map(Arc::new))
            .transpose()
    }

    /// The old pods' and the new pods' addresses (fresh ones of [`addr::next_ip`]), once the
    /// configuration is checked.
    fn addresses(&self) -> Result<(Vec<Ipv4Addr>, Vec<Ipv4Addr>)> {
        if self.versions.is_empty() {
            return Err(HarnessError::Start(
                "a rollout needs at least one protocol version".into(),
            ));
        }
        if self.auth.is_some() && self.upstream != Upstream::Example {
            return Err(HarnessError::Start(format!(
                "{} requires no auth: run its rollout with auth: None",
                self.upstream.name()
            )));
        }
        if self.pods == 0 {
            return Err(HarnessError::Start(
                "a rollout needs at least one pod".into(),
            ));
        }
        let old = (0..self.pods).map(|_| addr::next_ip()).collect();
        let new = (0..self.pods).map(|_| addr::next_ip()).collect();
        Ok((old, new))
    }
}

/// Runs the rollout: starts `cfg.pods` pods, the load, replaces every pod, lets the sessions
/// finish and reports. Every process is stopped when it returns.
///
/// # Errors
/// [`HarnessError`] when a pod does not start, a membership change does not propagate or a
/// drain does not answer: the rollout itself failed. What clients experienced is never an
/// error; it is in the report.
pub async fn run(cfg: &RolloutConfig) -> Result<RolloutReport> {
    let (old, new) = cfg.addresses()?;
    let issuer = cfg.issuer()?;
    let mut rotation = cfg
        .rotate_key
        .then(|| rotation::Rotation::new(issuer.as_deref()))
        .transpose()?;
    let mut old_spec = cfg.old_pod_spec(issuer.as_deref());
    old_spec.key_ring = rotation.as_ref().map(rotation::Rotation::files);
    let mut cluster = Cluster::start(&old, old_spec).await?;
    cluster.set_revision(NEW_REVISION);
    cluster.set_spec(cfg.pod_spec(issuer.as_deref()));
    cluster.set_key_ring(rotation.as_ref().map(rotation::Rotation::files));
    let mut rollout = Rollout::new(cfg, cfg.label());
    let loads = rollout.start_load(&cluster, issuer).await;
    rollout.step("every session initialized; rolling out".into());
    if let Some(rotation) = &mut rotation {
        rotation.mint_witness(&cluster).await;
    }
    for (i, (&old, &new)) in old.iter().zip(&new).enumerate() {
        rollout
            .replace(&mut cluster, &loads.client, old, new)
            .await?;
        if let Some(rotation) = &mut rotation {
            rotation.joined(&cluster, new).await;
            if i == 0 {
                rotation.stage(&mut cluster, &mut rollout).await;
            }
            if i == 1.min(cfg.pods - 1) {
                rotation.promote(&mut cluster, &mut rollout).await;
            }
        }
    }
    let mut retired = true;
    if let Some(rotation) = &mut rotation {
        retired = rotation.retire_if_unused(&mut cluster, &mut rollout).await;
    }
    rollout.step("rollout done; every session makes its last calls".into());
    let figures = rollout.finish_load(loads).await;
    if let Some(rotation) = &mut rotation
        && !retired
    {
        rotation.retire(&mut cluster, &mut rollout).await;
    }
    rollout.report.rotation = rotation.map(|r| r.report);
    rollout.read_pods(&cluster).await;
    Ok(rollout.finish(figures))
}

/// The error for a pod the cluster does not have.
fn no_pod(ip: Ipv4Addr) -> HarnessError {
    HarnessError::Start(format!("no pod on {ip}"))
}

/// A rollout under way (or another run of its load, [`fault`]): the report it fills in.
struct Rollout<'a> {
    cfg: &'a RolloutConfig,
    report: RolloutReport,
    executions: Executions,
    started: Instant,
}

/// The loads of a run, and the client (the Service) they share.
struct Loads {
    client: McpClient,
    sessions: clients::Load,
    modern: modern::ModernLoad,
}

impl<'a> Rollout<'a> {
    /// A run of `cfg`'s load whose column is named `label`, starting now.
    fn new(cfg: &'a RolloutConfig, label: String) -> Self {
        Self {
            cfg,
            report: RolloutReport::new(label, cfg.pods, cfg.sessions),
            executions: Executions::default(),
            started: Instant::now(),
        }
    }

    /// Starts the sessions and the 2026-07-28 clients against the routable pods of `cluster`,
    /// with tokens of `issuer`, and waits (at most [`INITIALIZE_TIMEOUT`]) until every session
    /// initialized.
    async fn start_load(&mut self, cluster: &Cluster, issuer: Option<Arc<Issuer>>) -> Loads {
        let client = McpClient::spread(cluster.routable_urls()).honouring_retry_after();
        client.set_headers(&PUBLIC_HEADERS);
        self.step(format!(
            "{} pods up; starting {} sessions",
            self.cfg.pods, self.cfg.sessions
        ));
        let modern = modern::ModernLoad::start(&client, self.cfg, issuer.as_ref());
        let sessions = clients::Load::start(&client, self.cfg, issuer);
        if !sessions.initialized(INITIALIZE_TIMEOUT).await {
            self.report.load.failures.push(format!(
                "harness: the sessions did not initialize within {INITIALIZE_TIMEOUT:?}"
            ));
        }
        Loads {
            client,
            sessions,
            modern,
        }
    }

    /// Tells the clients the run is done and waits for them: the sessions' figures (the
    /// 2026-07-28 clients' and the late requests are in the report).
    async fn finish_load(&mut self, loads: Loads) -> clients::Figures {
        let figures = loads.sessions.finish(FINISH_TIMEOUT).await;
        self.report.modern = loads.modern.finish(FINISH_TIMEOUT).await;
        let failures = self.report.modern.failures.iter().cloned();
        self.report.load.failures.extend(failures);
        self.report.late_heads = loads.client.late_heads();
        let late = loads
            .client
            .late_requests()
            .into_iter()
            .map(|late| Incident {
                kind: IncidentKind::Hung,
                session: late.session,
                detail: late.detail,
            });
        self.report.load.incidents.extend(late);
        self.step("load done".into());
        figures
    }

    /// Reads every running pod of `cluster`: its sidecar, its MCP server's `/stats`, its log.
    async fn read_pods(&mut self, cluster: &Cluster) {
        for pod in &cluster.pods {
            self.read_sidecar(pod).await;
            self.read_stats(pod).await;
            self.keep_log(pod);
        }
    }

    /// Records (and prints, to stderr) a step of the timeline.
    fn step(&mut self, what: String) {
        let at = self.started.elapsed();
        eprintln!("[{} {:>7.2} s] {what}", self.report.label, at.as_secs_f64());
        self.report.timeline.push((at, what));
    }

    /// Replaces the pod on `old` by a new one on `new`, in the order Kubernetes does.
    async fn replace(
        &mut self,
        cluster: &mut Cluster,
        client: &McpClient,
        old: Ipv4Addr,
        new: Ipv4Addr,
    ) -> Result<()> {
        cluster.add(new).await?;
        client.set_entries(cluster.routable_urls());
        self.step(format!(
            "{new} ({NEW_REVISION}) started, routable, in the Service"
        ));
        let old_url = cluster.pod(old).ok_or_else(|| no_pod(old))?.mcp_url.clone();
        let entries = cluster.routable_urls().into_iter();
        client.set_entries(entries.filter(|u| *u != old_url).collect());
        cluster.set_state(old, Some("draining")).await?;
        self.step(format!(
            "{old} out of the Service, draining in every peers file"
        ));
        let pod = cluster.pod(old).ok_or_else(|| no_pod(old))?;
        let drained = tokio::time::timeout(self.cfg.drain_timeout + STOP_MARGIN, pod.drain())
            .await
            .map_err(|_| {
                HarnessError::Start(format!("{old}: tether-sidecar drain did not return"))
            })??;
        self.step(format!(
            "{old} tether-sidecar drain {} after {:.2} s: {}",
            if drained.done { "drained" } else { "timed out" },
            drained.elapsed.as_secs_f64(),
            drained.body
        ));
        self.report.drains.push(DrainRecord {
            ip: old,
            elapsed: drained.elapsed,
            drained: drained.done,
        });
        self.read_sidecar(pod).await;
        let mut pod = cluster.take(old).ok_or_else(|| no_pod(old))?;
        self.report.first_stop.get_or_insert(self.started.elapsed());
        let stopping = Instant::now();
        match pod
            .terminate_sidecar(self.cfg.drain_timeout + STOP_MARGIN)
            .await
        {
            Ok(Some(_)) => self.step(format!(
                "{old} sidecar exited {:.2} s after SIGTERM",
                stopping.elapsed().as_secs_f64()
            )),
            Ok(None) | Err(_) => {
                self.report.load.failures.push(format!(
                    "harness: the sidecar on {old} did not exit after SIGTERM; killed"
                ));
                pod.kill_sidecar().await?;
            }
        }
        self.read_stats(&pod).await;
        pod.kill_server().await?;
        self.keep_log(&pod);
        drop(pod);
        cluster.set_state(old, None).await?;
        self.step(format!("{old} stopped and out of every peers file"));
        Ok(())
    }

    /// Keeps a pod's sidecar log in the report, to explain the incidents of its sessions.
    fn keep_log(&mut self, pod: &Pod) {
        self.report
            .sidecar_logs
            .push((format!("pod {}", pod.ip), pod.sidecar_log()));
    }

    /// Adds a running sidecar's counters and peak RSS to the report, and its log's warnings.
    async fn read_sidecar(&mut self, pod: &Pod) {
        self.report.sidecar.add_log(&pod.sidecar_log());
        self.read_counters(pod).await;
    }

    /// Adds a running sidecar's counters and peak RSS to the report.
    async fn read_counters(&mut self, pod: &Pod) {
        match pod.metrics().await {
            Ok(text) => self.report.sidecar.add(&text),
            Err(e) => self
                .report
                .load
                .failures
                .push(format!("harness: metrics of {}: {e}", pod.ip)),
        }
        match pod.sidecar_peak_rss() {
            Ok(rss) => self.report.peak_rss_bytes = self.report.peak_rss_bytes.max(rss),
            Err(e) => self
                .report
                .load
                .failures
                .push(format!("harness: peak RSS of {}: {e}", pod.ip)),
        }
    }

    /// Adds an example server's executions and refusals to the report.
    async fn read_stats(&mut self, pod: &Pod) {
        match pod.stats().await {
            Ok(stats) => {
                self.executions.add(&stats);
                let count = |name: &str| stats[name].as_u64().unwrap_or_default();
                self.report.auth.upstream_unauthenticated += count("unauthenticated");
                self.report.auth.upstream_missing_credentials += count("missing_credentials");
                self.report.upstream_not_local +=
                    count("rejected_hosts") + count("rejected_origins");
            }
            Err(e) => self
                .report
                .load
                .failures
                .push(format!("harness: /stats of {}: {e}", pod.ip)),
        }
    }

    /// The report, with the clients' figures.
    fn finish(mut self, figures: clients::Figures) -> RolloutReport {
        let failures = std::mem::take(&mut self.report.load.failures);
        self.report.load.add(figures.report);
        self.report.load.failures.extend(failures);
        self.report.load.executed_twice = self.executions.executed_twice();
        self.report.slow_executions = self.executions.total();
        self.report.load.elapsed = self.started.elapsed();
        let modern = &self.report.modern;
        self.report.slow_calls = figures.slow_calls + modern.slow_calls + modern.tasks;
        self.report.counter_restarts = figures.counter_restarts;
        self.report.sessions_lost = figures.sessions_lost;
        self.report.auth.on = self.cfg.auth.is_some();
        self.report.auth.refreshes = figures.refreshes;
        self.report.auth.probes = figures.probes;
        self.report.auth.probes_refused = figures.probes_refused;
        self.report.first_not_found = figures
            .first_not_found
            .map(|t| t.saturating_duration_since(self.started));
        self.report
    }
}

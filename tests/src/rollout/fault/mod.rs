//! The fault mode of the demo (`tether-demo --fault`): one pod of the endpoint lost without
//! warning under the rolling upgrade's load, with replication (`spec.session.replication`) and
//! without, so that what a replica saves shows beside what is lost without one.
//!
//! The endpoint and its load are the rollout's ([`RolloutConfig`]: the sessions with their slow
//! calls, cuts, resumes and standalone streams, the 2026-07-28 clients, auth); its pods run with
//! [`FaultConfig::replication`] and nothing is rolled out. [`FaultConfig::fault_after`] after
//! every session initialized, the first pod fails ([`Fault`]):
//! - a *sidecar crash*: its sidecar is killed (SIGKILL) and started again at once with the same
//!   pod UID and address, as the kubelet restarts a crashed container; its MCP server keeps
//!   running. The pod is out of the client Service while its sidecar is down (its readiness)
//!   and stays in the membership;
//! - a *pod loss*: its sidecar and its MCP server are killed (SIGKILL). The client Service stops
//!   sending to it at once (its address refuses connections, which a load balancer notices),
//!   the membership only [`FaultConfig::detection_delay`] later (the node's loss noticed, the
//!   pod deleted: it leaves every peers file); then a replacement pod starts with a new UID and
//!   address, as the ReplicaSet starts one.
//!
//! The load goes on for [`FaultConfig::settle`] once the pod is back or replaced, then the
//! clients finish their calls. The [`FaultReport`] counts what the clients saw, the sessions the
//! lost pod held among them; with replication the bar is no client-visible 404, no session
//! lost, no tool executed twice and no event lost without the sidecar saying so
//! ([`FaultReport::meets_bar`]).

mod report;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

pub use report::{FaultReport, table};

use super::{Rollout, RolloutConfig, no_pod};
use crate::cluster::Cluster;
use crate::pod::Upstream;
use crate::{HarnessError, Result};

/// The `spec.session.replication` of a baseline run: no replica.
pub const NO_REPLICATION: &str = "None";

/// How a pod fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Its sidecar crashes and the kubelet starts it again at once (same pod UID and address);
    /// its MCP server keeps running.
    SidecarCrash,
    /// The pod is gone (its sidecar and MCP server killed); after the detection delay it
    /// leaves the membership and a replacement starts with a new UID and address.
    PodLoss,
}

impl Fault {
    /// Both faults, in the order the demo runs them.
    pub const ALL: [Fault; 2] = [Fault::SidecarCrash, Fault::PodLoss];

    /// Its name in reports (and, with dashes, on `tether-demo`'s command line).
    pub fn name(self) -> &'static str {
        match self {
            Self::SidecarCrash => "sidecar crash",
            Self::PodLoss => "pod loss",
        }
    }
}

/// What to run: a fault under a rollout's load, with a replication mode.
#[derive(Clone, Debug)]
pub struct FaultConfig {
    /// How the pod fails.
    pub fault: Fault,
    /// The endpoint and its load (pods, sessions, the clients' mix, auth); its
    /// [`RolloutConfig::replication`] is [`FaultConfig::replication`]'s.
    pub load: RolloutConfig,
    /// `spec.session.replication`: `Sessions` or `Events`, or [`NO_REPLICATION`] (the
    /// baseline).
    pub replication: String,
    /// From the kill of a lost pod until it leaves the membership ([`Fault::PodLoss`]).
    pub detection_delay: Duration,
    /// From every session initialized until the kill.
    pub fault_after: Duration,
    /// How long the load goes on once the pod is back or replaced, before the clients finish.
    pub settle: Duration,
}

impl FaultConfig {
    /// `fault` under a load of `sessions` sessions (the CI rollout's load, [`RolloutConfig`]'s
    /// default, at that scale: a tenth as many 2026-07-28 clients, a fiftieth as many
    /// listeners), with replication `Sessions`, a 5 s detection delay, the kill 2 s after
    /// every session initialized and 3 s of load after the pod is back.
    pub fn scaled(fault: Fault, sessions: usize) -> Self {
        Self::new(
            fault,
            RolloutConfig {
                sessions,
                modern_clients: sessions / 10,
                listeners: sessions / 50,
                ..RolloutConfig::default()
            },
        )
    }

    /// `fault` under `load`, with replication `Sessions` and the timings of
    /// [`FaultConfig::scaled`].
    pub fn new(fault: Fault, load: RolloutConfig) -> Self {
        Self {
            fault,
            load,
            replication: "Sessions".into(),
            detection_delay: Duration::from_secs(5),
            fault_after: Duration::from_secs(2),
            settle: Duration::from_secs(3),
        }
    }

    /// The same run without replication: the baseline.
    pub fn baseline(&self) -> Self {
        Self {
            replication: NO_REPLICATION.into(),
            ..self.clone()
        }
    }

    /// Whether the pods keep replicas (the bar applies).
    pub fn replicated(&self) -> bool {
        self.replication != NO_REPLICATION
    }

    /// The run's name, the title of its column: the fault and the replication mode.
    pub fn label(&self) -> String {
        format!("{} / {}", self.fault.name(), self.replication)
    }

    /// The load's configuration with this run's replication.
    fn load_config(&self) -> RolloutConfig {
        RolloutConfig {
            replication: Some(self.replication.clone()),
            ..self.load.clone()
        }
    }
}

/// Runs `cfg`: starts the pods and the load, fails the first pod, lets the load go on and
/// finish, and reports. Every process is stopped when it returns.
///
/// # Errors
/// [`HarnessError`] when a pod does not start (or start again), or a membership change does
/// not propagate: the run itself failed. What clients experienced is never an error; it is in
/// the report.
pub async fn run(cfg: &FaultConfig) -> Result<FaultReport> {
    let load = cfg.load_config();
    let (ips, spares) = load.addresses()?;
    let issuer = load.issuer()?;
    let mut spec = load.pod_spec(issuer.as_deref());
    if load.upstream == Upstream::Example {
        // Its executions, read from its log once it is killed.
        spec.server_args.push("--log-calls".into());
    }
    let mut cluster = Cluster::start(&ips, spec).await?;
    let mut run = Rollout::new(&load, cfg.label());
    let loads = run.start_load(&cluster, issuer).await;
    run.step(format!(
        "every session initialized; {} in {:.1} s",
        cfg.fault.name(),
        cfg.fault_after.as_secs_f64()
    ));
    tokio::time::sleep(cfg.fault_after).await;
    let victim = ips[0];
    let pod = cluster.pod(victim).ok_or_else(|| no_pod(victim))?;
    // What its sidecar counted and its peak RSS, before they are gone.
    run.read_counters(pod).await;
    let victim_url = pod.mcp_url.clone();
    let client = loads.client.clone();
    let held = loads.sessions.held_on(&victim.to_string());
    let lost_pod_sessions = held.len();
    let unavailable = client.unavailable();
    let entries = cluster.routable_urls().into_iter();
    client.set_entries(entries.filter(|u| *u != victim_url).collect());
    let killed = Instant::now();
    client.watch_sessions(killed, held);
    match cfg.fault {
        Fault::SidecarCrash => crash(&mut run, &mut cluster, victim).await?,
        Fault::PodLoss => {
            let until = killed + cfg.detection_delay;
            lose(&mut run, &mut cluster, victim, spares[0], until).await?;
        }
    }
    let back_after = killed.elapsed();
    client.set_entries(cluster.routable_urls());
    tokio::time::sleep(cfg.settle).await;
    run.step("every session makes its last calls".into());
    let figures = run.finish_load(loads).await;
    run.read_pods(&cluster).await;
    Ok(FaultReport {
        fault: cfg.fault,
        replication: cfg.replication.clone(),
        lost_pod_sessions,
        failover: client
            .first_served()
            .map(|at| at.saturating_duration_since(killed)),
        unavailable: client.unavailable() - unavailable,
        back_after,
        run: run.finish(figures),
    })
}

/// Kills the sidecar of the pod on `victim` and starts it again at once.
async fn crash(run: &mut Rollout<'_>, cluster: &mut Cluster, victim: Ipv4Addr) -> Result<()> {
    let started = Instant::now();
    let pod = cluster.pods.iter_mut().find(|p| p.ip == victim);
    pod.ok_or_else(|| no_pod(victim))?.restart_sidecar().await?;
    run.step(format!(
        "{victim} sidecar killed (SIGKILL) and started again: ready after {:.2} s, back in \
         the Service",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Kills the sidecar and the MCP server of the pod on `victim`, takes it out of the membership
/// at `until`, then starts a replacement on `spare`.
async fn lose(
    run: &mut Rollout<'_>,
    cluster: &mut Cluster,
    victim: Ipv4Addr,
    spare: Ipv4Addr,
    until: Instant,
) -> Result<()> {
    let mut pod = cluster.take(victim).ok_or_else(|| no_pod(victim))?;
    pod.kill_sidecar().await?;
    pod.kill_server().await?;
    run.step(format!(
        "{victim} lost: sidecar and MCP server killed (SIGKILL), out of the Service"
    ));
    for call_id in pod.server_log().lines().filter_map(executed) {
        run.executions.record(call_id);
    }
    run.report.sidecar.add_log(&pod.sidecar_log());
    run.keep_log(&pod);
    drop(pod);
    tokio::time::sleep_until(until.into()).await;
    cluster.set_state(victim, None).await?;
    run.step(format!("{victim} out of every peers file"));
    cluster.add(spare).await.map_err(|e| {
        HarnessError::Start(format!("the replacement pod on {spare} did not start: {e}"))
    })?;
    run.step(format!(
        "{spare} (a new pod UID) started, routable, in the Service"
    ));
    Ok(())
}

/// The call id of an example server's `--log-calls` line, `executed "<call_id>"`.
fn executed(line: &str) -> Option<&str> {
    line.strip_prefix("executed \"")?.strip_suffix('"')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_baseline_keeps_no_replica_and_names_its_column() {
        let cfg = FaultConfig::scaled(Fault::PodLoss, 100);
        assert_eq!(
            (
                cfg.load.sessions,
                cfg.load.modern_clients,
                cfg.load.listeners
            ),
            (100, 10, 2)
        );
        assert!(cfg.replicated());
        assert_eq!(cfg.label(), "pod loss / Sessions");
        let baseline = cfg.baseline();
        assert!(!baseline.replicated());
        assert_eq!(baseline.label(), "pod loss / None");
        assert_eq!(
            baseline.load_config().replication.as_deref(),
            Some(NO_REPLICATION)
        );
    }

    #[test]
    fn executions_are_read_from_the_servers_log() {
        assert_eq!(executed(r#"executed "r3-0a-c1""#), Some("r3-0a-c1"));
        assert_eq!(executed("listening on 127.0.0.2:3000"), None);
    }
}

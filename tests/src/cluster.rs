//! Several pods of one endpoint on loopback, with static membership (`--peers-file`).
//!
//! Every pod reads its own copy of the peers file, so a test can let sidecars disagree on
//! membership for a while ([`Cluster::write_peers_of`]); [`Cluster::publish`] writes the same
//! list everywhere and waits until every sidecar has applied it.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::client::McpClient;
use crate::pod::{Drained, LISTEN_PORT, Pod, PodSpec, uid};
use crate::{HarnessError, Result, load};

/// How long a membership change may take to reach every sidecar (the peers file is polled
/// every 200 ms).
pub const PROPAGATION_TIMEOUT: Duration = Duration::from_secs(5);

/// The revision of the pods a [`Cluster`] starts with.
pub const FIRST_REVISION: &str = "v1";

/// A pod's entry in the peers file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The pod's IP (its UID is `pod-<ip>`).
    pub ip: Ipv4Addr,
    /// `routable`, `draining` or `gone`.
    pub state: &'static str,
    /// The pod's revision (a Deployment's `pod-template-hash`); the youngest routable pod's is
    /// the newest.
    pub revision: String,
    /// Where its peers reach it (its MCP port there, and the peer port of the same address):
    /// its IP, or the address of something in front of it ([`Cluster::reach_via`]).
    pub address: Ipv4Addr,
}

impl Member {
    /// The pod on `ip` in `state`, of revision [`FIRST_REVISION`].
    pub fn new(ip: Ipv4Addr, state: &'static str) -> Self {
        Self {
            ip,
            state,
            revision: FIRST_REVISION.to_owned(),
            address: ip,
        }
    }
}

/// A set of pods sharing one membership.
pub struct Cluster {
    /// The pods, in start order.
    pub pods: Vec<Pod>,
    /// The membership last published, oldest pod first.
    pub members: Vec<Member>,
    revision: String,
    spec: PodSpec,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts one pod per IP (all routable, of revision [`FIRST_REVISION`]) with `spec`.
    ///
    /// # Errors
    /// [`HarnessError`] when a pod does not start.
    pub async fn start(ips: &[Ipv4Addr], spec: PodSpec) -> Result<Self> {
        let mut cluster = Self {
            pods: Vec::new(),
            members: ips.iter().map(|&ip| Member::new(ip, "routable")).collect(),
            revision: FIRST_REVISION.to_owned(),
            spec,
            dir: tempfile::tempdir()?,
        };
        let mut starting = Vec::new();
        for &ip in ips {
            let spec = cluster.pod_spec(ip)?;
            starting.push(tokio::spawn(Pod::start_at(ip, spec)));
        }
        for task in starting {
            let pod = task
                .await
                .map_err(|e| HarnessError::Start(format!("pod start task: {e}")))??;
            cluster.pods.push(pod);
        }
        Ok(cluster)
    }

    /// The peers file of the pod on `ip`.
    pub fn peers_path(&self, ip: Ipv4Addr) -> PathBuf {
        self.dir.path().join(format!("peers-{ip}.yaml"))
    }

    fn pod_spec(&self, ip: Ipv4Addr) -> Result<PodSpec> {
        let path = self.peers_path(ip);
        std::fs::write(&path, render(&self.members))?;
        let mut spec = self.spec.clone();
        spec.sidecar_args
            .extend(["--peers-file".to_owned(), path.display().to_string()]);
        Ok(spec)
    }

    /// Sets the revision of the pods [`Cluster::add`] starts from now on (a new pod template).
    pub fn set_revision(&mut self, revision: impl Into<String>) {
        self.revision = revision.into();
    }

    /// Sets the spec of the pods [`Cluster::add`] starts from now on (a new sidecar, as in a
    /// rollout of tether itself).
    pub fn set_spec(&mut self, spec: PodSpec) {
        self.spec = spec;
    }

    /// Sets the endpoint's Secret the pods [`Cluster::add`] starts from now on mount
    /// ([`PodSpec::key_ring`]): the key ring as it is at that moment of a rotation. The running
    /// pods' volumes are not touched ([`Pod::mount_keys`]).
    pub fn set_key_ring(&mut self, files: Option<crate::keyring::KeyFiles>) {
        self.spec.key_ring = files;
    }

    /// Starts a pod on `ip`, then adds it (routable, as the youngest, of the current revision)
    /// to everyone's membership. Returns its index in [`Cluster::pods`].
    ///
    /// # Errors
    /// [`HarnessError`] when it does not start or the membership does not propagate.
    pub async fn add(&mut self, ip: Ipv4Addr) -> Result<usize> {
        let mut members = self.members.clone();
        members.push(Member {
            revision: self.revision.clone(),
            ..Member::new(ip, "routable")
        });
        let path = self.peers_path(ip);
        std::fs::write(&path, render(&members))?;
        let mut spec = self.spec.clone();
        spec.sidecar_args
            .extend(["--peers-file".to_owned(), path.display().to_string()]);
        self.pods.push(Pod::start_at(ip, spec).await?);
        self.publish(members).await?;
        Ok(self.pods.len() - 1)
    }

    /// Sets the state of the pod on `ip` in everyone's membership (`None` removes it).
    ///
    /// # Errors
    /// [`HarnessError`] when the change does not propagate.
    pub async fn set_state(&mut self, ip: Ipv4Addr, state: Option<&'static str>) -> Result<()> {
        let mut members = self.members.clone();
        match state {
            Some(state) => {
                for m in members.iter_mut().filter(|m| m.ip == ip) {
                    m.state = state;
                }
            }
            None => members.retain(|m| m.ip != ip),
        }
        self.publish(members).await
    }

    /// Makes everyone's membership name `address` as where the pod on `ip` is reached (its UID
    /// unchanged): peers then probe, push to and forward to whatever listens there, e.g. relays
    /// in front of the pod's ports.
    ///
    /// # Errors
    /// [`HarnessError`] when the change does not propagate.
    pub async fn reach_via(&mut self, ip: Ipv4Addr, address: Ipv4Addr) -> Result<()> {
        let mut members = self.members.clone();
        for m in members.iter_mut().filter(|m| m.ip == ip) {
            m.address = address;
        }
        self.publish(members).await
    }

    /// Writes `members` to every pod's peers file and waits until each sidecar whose file
    /// changed applied it.
    ///
    /// # Errors
    /// [`HarnessError::Start`] when a sidecar has not applied it within
    /// [`PROPAGATION_TIMEOUT`].
    pub async fn publish(&mut self, members: Vec<Member>) -> Result<()> {
        let before = self.membership_changes().await?;
        let text = render(&members);
        let mut changed = Vec::with_capacity(self.pods.len());
        for pod in &self.pods {
            let path = self.peers_path(pod.ip);
            changed.push(std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()));
            std::fs::write(path, &text)?;
        }
        self.members = members;
        let deadline = Instant::now() + PROPAGATION_TIMEOUT;
        loop {
            let now = self.membership_changes().await?;
            let applied = now.iter().zip(&before).zip(&changed);
            if applied.into_iter().all(|((n, b), &c)| !c || n > b) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Start(format!(
                    "membership did not propagate: changes before {before:?}, after {now:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Writes `members` to the peers file of the pod on `ip` only (a sidecar that disagrees
    /// with the others) and waits until it applied it.
    ///
    /// # Errors
    /// [`HarnessError`] when the pod is unknown or the change does not propagate.
    pub async fn write_peers_of(&self, ip: Ipv4Addr, members: &[Member]) -> Result<()> {
        let pod = self
            .pods
            .iter()
            .find(|p| p.ip == ip)
            .ok_or_else(|| HarnessError::Start(format!("no pod on {ip}")))?;
        let sample = "tether_membership_changes_total{source=\"peers_file\"}";
        let before = pod.metric(sample).await?;
        std::fs::write(self.peers_path(ip), render(members))?;
        let now = pod
            .wait_for_metric(sample, PROPAGATION_TIMEOUT, |n| n > before)
            .await?;
        if now <= before {
            return Err(HarnessError::Start(format!(
                "{ip} did not apply its peers file"
            )));
        }
        Ok(())
    }

    async fn membership_changes(&self) -> Result<Vec<f64>> {
        self.metric_each("tether_membership_changes_total{source=\"peers_file\"}")
            .await
    }

    /// Drains the pod on `ip`, stops it and removes it from everyone's membership: a pod gone
    /// after its drain. What its drain reported.
    ///
    /// # Errors
    /// [`HarnessError`] when there is no such pod, the drain fails or the change does not
    /// propagate.
    pub async fn drain_and_remove(&mut self, ip: Ipv4Addr) -> Result<Drained> {
        let pod = self
            .take(ip)
            .ok_or_else(|| HarnessError::Protocol(format!("no pod on {ip}")))?;
        let drained = pod
            .start_drain()
            .await
            .map_err(|e| HarnessError::Protocol(format!("the drain of {ip} failed: {e}")))??;
        drop(pod);
        self.set_state(ip, None).await?;
        Ok(drained)
    }

    /// Takes the pod on `ip` out of [`Cluster::pods`] (its membership entry stays): the caller
    /// stops it, and later publishes go to the remaining pods only.
    pub fn take(&mut self, ip: Ipv4Addr) -> Option<Pod> {
        let index = self.pods.iter().position(|p| p.ip == ip)?;
        Some(self.pods.remove(index))
    }

    /// The MCP URLs of the running pods that are routable in the last published membership:
    /// the endpoints of the client Service.
    pub fn routable_urls(&self) -> Vec<String> {
        self.pods
            .iter()
            .filter(|p| {
                self.members
                    .iter()
                    .any(|m| m.ip == p.ip && m.state == "routable")
            })
            .map(|p| p.mcp_url.clone())
            .collect()
    }

    /// A client whose requests enter at a random pod of `ips`.
    pub fn client_of(&self, ips: &[Ipv4Addr]) -> McpClient {
        McpClient::spread(
            self.pods
                .iter()
                .filter(|p| ips.contains(&p.ip))
                .map(|p| p.mcp_url.clone())
                .collect(),
        )
    }

    /// A client whose requests enter at a random pod of the cluster.
    pub fn client(&self) -> McpClient {
        McpClient::spread(self.pods.iter().map(|p| p.mcp_url.clone()).collect())
    }

    /// The pod on `ip`.
    pub fn pod(&self, ip: Ipv4Addr) -> Option<&Pod> {
        self.pods.iter().find(|p| p.ip == ip)
    }

    /// One metric sample of every pod, in [`Cluster::pods`] order.
    ///
    /// # Errors
    /// [`HarnessError`] when a pod's metrics cannot be read.
    pub async fn metric_each(&self, sample: &str) -> Result<Vec<f64>> {
        let mut out = Vec::with_capacity(self.pods.len());
        for pod in &self.pods {
            out.push(pod.metric(sample).await?);
        }
        Ok(out)
    }

    /// The sum of one metric sample over every pod.
    ///
    /// # Errors
    /// [`HarnessError`] when a pod's metrics cannot be read.
    pub async fn metric_sum(&self, sample: &str) -> Result<f64> {
        Ok(self.metric_each(sample).await?.iter().sum())
    }

    /// Polls [`Cluster::metric_sum`] (every 20 ms, at most `within`) until `done` holds for it;
    /// returns the last sum read (the caller asserts on it).
    ///
    /// # Errors
    /// [`HarnessError`] when a pod's metrics cannot be read.
    pub async fn wait_for_metric_sum(
        &self,
        sample: &str,
        within: Duration,
        done: impl Fn(f64) -> bool,
    ) -> Result<f64> {
        let every = Duration::from_millis(20);
        crate::poll(within, every, || self.metric_sum(sample), |&v| done(v)).await
    }

    /// Call ids an example server executed more than once, summed over the pods
    /// ([`load::executed_twice`] of each one's `/stats`).
    ///
    /// # Errors
    /// [`HarnessError`] when a pod's `/stats` cannot be read.
    pub async fn executed_twice(&self) -> Result<u64> {
        let mut sum = 0;
        for pod in &self.pods {
            sum += load::executed_twice(&pod.stats().await?);
        }
        Ok(sum)
    }

    /// [`Cluster::metric_sum`] once it has settled: two reads 100 ms apart agree (a request's
    /// counters are updated when its exchange is logged, just after the client got the answer).
    /// Gives up after 3 s and returns the last value.
    ///
    /// # Errors
    /// [`HarnessError`] when a pod's metrics cannot be read.
    pub async fn metric_sum_settled(&self, sample: &str) -> Result<f64> {
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut last = self.metric_sum(sample).await?;
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = self.metric_sum(sample).await?;
            if now == last || Instant::now() > deadline {
                return Ok(now);
            }
            last = now;
        }
    }

    /// Every pod's logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for pod in &self.pods {
            let _ = writeln!(out, "===== pod {} =====\n{}", pod.ip, pod.logs());
        }
        out
    }
}

/// The peers file text of `members`.
pub fn render(members: &[Member]) -> String {
    let mut out = String::new();
    for m in members {
        let _ = writeln!(
            out,
            "- {{uid: {}, address: '{}:{LISTEN_PORT}', state: {}, revision: '{}'}}",
            uid(m.ip),
            m.address,
            m.state,
            m.revision
        );
    }
    out
}

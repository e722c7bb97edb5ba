//! A handoff scenario: a cluster whose first pod, A, holds the sessions under test until it drains
//! (`draining` in the membership, then `tether-sidecar drain`) and hands them to its peers. The
//! fault-injection tests inject their fault around that move.
//!
//! A scenario is a test fixture: its steps check what they expect of the cluster (A's peers
//! acknowledge the sessions in time, the drain moves every session, A's sidecar exits cleanly)
//! and panic with every pod's logs when it does not happen.

use std::fmt::Display;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::Result;
use crate::addr;
use crate::call::{CallPlan, Tracked};
use crate::client::{Events, McpClient, Session};
use crate::cluster::Cluster;
use crate::pod::{Drained, Pod, PodSpec};

/// How long A's peers may take to acknowledge the sessions A hands them.
const MOVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long A's sidecar may take to exit after SIGTERM once drained.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A's `tether-sidecar drain` under way ([`Pod::start_drain`]).
pub type DrainTask = JoinHandle<Result<Drained>>;

/// A cluster whose first pod, A, holds the sessions under test until it drains.
pub struct Scenario {
    /// The running pods, A first until it stops.
    pub cluster: Cluster,
    /// A's address.
    pub a: Ipv4Addr,
    /// The other pods' addresses.
    pub rest: Vec<Ipv4Addr>,
}

impl Scenario {
    /// Starts `pods` pods (at least 2) with `spec`.
    ///
    /// # Panics
    /// When a pod does not start.
    pub async fn start(pods: usize, spec: PodSpec) -> Self {
        let ips: Vec<Ipv4Addr> = (0..pods).map(|_| addr::next_ip()).collect();
        let cluster = Cluster::start(&ips, spec)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Self {
            cluster,
            a: ips[0],
            rest: ips[1..].to_vec(),
        }
    }

    /// A client entering at A only.
    pub fn via_a(&self) -> McpClient {
        self.cluster.client_of(&[self.a])
    }

    /// A client entering at a random pod other than A.
    pub fn via_rest(&self) -> McpClient {
        self.cluster.client_of(&self.rest)
    }

    /// One client per pod other than A, entering there.
    pub fn each_of_rest(&self) -> Vec<McpClient> {
        self.rest
            .iter()
            .map(|&ip| self.cluster.client_of(&[ip]))
            .collect()
    }

    /// Pod A.
    ///
    /// # Panics
    /// Once A stopped ([`Scenario::stop_a`]).
    pub fn pod_a(&self) -> &Pod {
        self.cluster.pod(self.a).expect("A runs")
    }

    /// A session initialized through A (which places it there), negotiating `version`.
    pub async fn on_a(&self, version: &str) -> Session {
        let session = self.via_a().initialize(version).await;
        self.check(session)
    }

    /// A `slow` call of `count` progress notifications through A, read whole to its answer.
    pub async fn completed_on_a(
        &self,
        session: &Session,
        id: u64,
        call_id: &str,
        count: u32,
    ) -> Tracked {
        let (mut call, events) = self.post_on_a(session, id, call_id, (count, 10)).await;
        call.finish(events).await;
        self.check(call.whole());
        call
    }

    /// A `slow` call (`count` progress notifications `interval_ms` apart) through A whose client
    /// reads `read` messages, then loses its connection.
    pub async fn cut_on_a(
        &self,
        session: &Session,
        (id, call_id): (u64, &str),
        (count, interval_ms): (u32, u64),
        read: usize,
    ) -> Tracked {
        let (mut call, mut events) = self
            .post_on_a(session, id, call_id, (count, interval_ms))
            .await;
        call.take_messages(&mut events, read).await;
        call
    }

    async fn post_on_a(
        &self,
        session: &Session,
        id: u64,
        call_id: &str,
        (count, interval_ms): (u32, u64),
    ) -> (Tracked, Events) {
        let plan = CallPlan::steady(count, interval_ms);
        let posted = Tracked::post(&self.via_a(), session, id, call_id, &plan).await;
        self.check(posted)
    }

    /// Marks A draining in everyone's membership, then starts `tether-sidecar drain` in it.
    pub async fn drain_a(&mut self) -> DrainTask {
        let draining = self.cluster.set_state(self.a, Some("draining")).await;
        self.check(draining);
        self.pod_a().start_drain()
    }

    /// The sum of metric `sample` over the running pods other than A.
    pub async fn metric_of_rest(&self, sample: &str) -> f64 {
        let mut sum = 0.0;
        for pod in self.cluster.pods.iter().filter(|p| p.ip != self.a) {
            sum += self.check(pod.metric(sample).await);
        }
        sum
    }

    /// Sessions the pods other than A acknowledged (`tether_handoffs_received_total`).
    pub async fn received(&self) -> f64 {
        self.metric_of_rest("tether_handoffs_received_total").await
    }

    /// Waits until A's peers acknowledged `n` sessions.
    pub async fn wait_moved(&self, n: f64) {
        let deadline = Instant::now() + MOVE_TIMEOUT;
        loop {
            let received = self.received().await;
            if received >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{received} of {n} sessions handed off\n{}",
                self.cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for A's drain to end (every session moved), stops its sidecar with SIGTERM and
    /// removes it from the membership. Returns the pod, whose example server still runs.
    pub async fn stop_a(&mut self, drain: DrainTask) -> Pod {
        let answered = self.check(drain.await);
        let drained = self.check(answered);
        let body = &drained.body;
        assert!(drained.done, "{body}\n{}", self.cluster.logs());
        assert_eq!(body["notMoved"], 0, "{body}");
        let mut old = self.cluster.take(self.a).expect("A runs");
        let exit = self.check(old.terminate_sidecar(STOP_TIMEOUT).await);
        assert!(
            exit.is_some_and(|e| e.success()),
            "{exit:?}\n{}",
            old.logs()
        );
        let gone = self.cluster.set_state(self.a, None).await;
        self.check(gone);
        old
    }

    /// `slow` executions summed over the example servers of the running pods.
    pub async fn executions(&self) -> u64 {
        let mut sum = 0;
        for pod in &self.cluster.pods {
            let stats = self.check(pod.stats().await);
            sum += stats["executions"].as_u64().unwrap_or_default();
        }
        sum
    }

    /// The value of `result`; panics with its problem and every pod's logs.
    pub fn check<T, E: Display>(&self, result: std::result::Result<T, E>) -> T {
        result.unwrap_or_else(|problem| panic!("{problem}\n{}", self.cluster.logs()))
    }
}

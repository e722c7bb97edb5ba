//! The end-to-end tests against a real cluster (`docs/dev/e2e.md`), run only when
//! `TETHER_E2E_KUBECONFIG` names a kubeconfig; without it each test prints why it is skipped and
//! passes, so `cargo test` builds and runs them everywhere.
//!
//! With a cluster, the first test to run installs the operator with the Helm chart
//! (`charts/tether`, 2 replicas with leader election, the images of `TETHER_E2E_*_IMAGE`); each
//! test then works in a fresh namespace, which is deleted at its end whatever happened. The cases:
//!
//! - [`traffic`]: an MCP session through `<name>-mcp` (a tool call, a cut SSE stream resumed with
//!   `Last-Event-ID`), rolling upgrades of the MCP server under load (a restart and an image
//!   change) without a client-visible 404, a lost event or a tool run twice, the client and peer
//!   Services' endpoints with their ports;
//! - [`faults`]: a pod lost without warning under load — force-deleted, or its sidecar killed
//!   and restarted by the kubelet — without a client-visible 404, a silent loss or a tool run
//!   twice;
//! - [`writes`]: what the operator writes: a new endpoint's writes and none while idle (counted
//!   from the API server's audit log, [`audit`]), and next to others: a GitOps tool's
//!   server-side applies, two endpoints on one Deployment, an endpoint deleted under load and
//!   re-created under its name;
//! - [`platform`]: two operator replicas with one leader, a namespace enforcing the
//!   `restricted` Pod Security Standard, the CRD as `kubectl explain` shows it;
//! - [`chart`]: the chart's other shape (`watchNamespaces`) and its upgrade under load. These
//!   change the installation every other test runs against, so each runs alone
//!   ([`exclusive_scenario`]).
//!
//! Settings: `TETHER_E2E_OPERATOR_IMAGE`, `TETHER_E2E_SIDECAR_IMAGE` (required),
//! `TETHER_E2E_SERVER_IMAGE` (optional, replaces the example server's image),
//! `TETHER_E2E_SERVER_NEXT_IMAGE` (optional, another tag of it: the rollout that changes the
//! image), `TETHER_E2E_AUDIT_LOG` (optional, the API server's audit log as JSON lines: the
//! operator's writes are counted from it), `TETHER_E2E_LOAD_SESSIONS` (optional, default 12: the
//! MCP sessions of each load), `TETHER_E2E_IN_CLUSTER_NETWORK` (optional: this process reaches
//! ClusterIPs, as in the local cluster's network namespace; clients then go through kube-proxy
//! instead of the API server's service proxy), `TETHER_E2E_TIMEOUT_SECS` (optional, default
//! 180: the bound of each wait).

mod audit;
mod chart;
mod cluster;
mod faults;
mod install;
mod platform;
mod traffic;
mod writes;

use std::path::PathBuf;
use std::time::Duration;

/// Default bound of each wait.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(180);
/// Default MCP sessions of a load.
const DEFAULT_LOAD_SESSIONS: usize = 12;

/// What the environment asks for.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// The kubeconfig whose current context is the cluster.
    pub kubeconfig: PathBuf,
    /// The operator's image, `repository:tag`.
    pub operator_image: String,
    /// The sidecar's image, `repository:tag` (the chart's `sidecar.image`).
    pub sidecar_image: String,
    /// Replaces the example server's image when set.
    pub server_image: Option<String>,
    /// Another tag of the example server's image, for the rollout that changes the image.
    pub server_next_image: Option<String>,
    /// The API server's audit log (JSON lines), when the tests may read it.
    pub audit_log: Option<PathBuf>,
    /// MCP sessions of each load the tests run through an endpoint.
    pub load_sessions: usize,
    /// Whether this process runs in the cluster's network: clients then use a Service's
    /// ClusterIP, else the API server's service proxy.
    pub in_cluster_network: bool,
    /// Bound of each wait.
    pub timeout: Duration,
}

impl Settings {
    /// The settings, `None` when `TETHER_E2E_KUBECONFIG` is unset (the tests are skipped).
    fn from_env() -> Option<Result<Self, String>> {
        let kubeconfig = std::env::var_os("TETHER_E2E_KUBECONFIG").filter(|v| !v.is_empty())?;
        Some(Self::with_kubeconfig(kubeconfig.into()))
    }

    /// The settings for `kubeconfig`, the others from the environment.
    fn with_kubeconfig(kubeconfig: PathBuf) -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let required = |name: &str, what: &str| {
            var(name).ok_or(format!(
                "TETHER_E2E_KUBECONFIG is set but {name} is not: name the {what} image the \
                 cluster can run, as repository:tag (see docs/dev/e2e.md)"
            ))
        };
        let timeout = match var("TETHER_E2E_TIMEOUT_SECS") {
            None => DEFAULT_TIMEOUT,
            Some(s) => Duration::from_secs(s.parse().map_err(|e| {
                format!("TETHER_E2E_TIMEOUT_SECS={s:?} is not a number of seconds: {e}")
            })?),
        };
        let load_sessions = match var("TETHER_E2E_LOAD_SESSIONS") {
            None => DEFAULT_LOAD_SESSIONS,
            Some(s) => s.parse().map_err(|e| {
                format!("TETHER_E2E_LOAD_SESSIONS={s:?} is not a number of sessions: {e}")
            })?,
        };
        Ok(Self {
            kubeconfig,
            operator_image: required("TETHER_E2E_OPERATOR_IMAGE", "tether-operator")?,
            sidecar_image: required("TETHER_E2E_SIDECAR_IMAGE", "tether-sidecar")?,
            server_image: var("TETHER_E2E_SERVER_IMAGE"),
            server_next_image: var("TETHER_E2E_SERVER_NEXT_IMAGE"),
            audit_log: var("TETHER_E2E_AUDIT_LOG").map(PathBuf::from),
            load_sessions,
            in_cluster_network: var("TETHER_E2E_IN_CLUSTER_NETWORK").is_some_and(|v| v != "0"),
            timeout,
        })
    }
}

/// Held shared by every scenario and exclusively by one that changes the installation (the
/// chart's values): such a scenario runs alone, and the others never see the operator change
/// under them.
static INSTALLATION: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Runs `scenario` as [`cluster::Cluster::run`] does, in a namespace labelled `labels` of the
/// cluster with the operator installed; when the tests are not enabled it only says so.
///
/// # Panics
/// As `cluster()` and [`cluster::Cluster::run`] do.
pub(crate) async fn scenario(
    labels: &[(&str, &str)],
    scenario: impl AsyncFnOnce(&cluster::Cluster, &str) -> cluster::Outcome,
) {
    if let Some(cluster) = cluster().await {
        let _shared = INSTALLATION.read().await;
        cluster.run(labels, scenario).await;
    }
}

/// [`scenario`] for a scenario that changes the installation: it runs while no other does.
///
/// # Panics
/// As [`scenario`].
pub(crate) async fn exclusive_scenario(
    scenario: impl AsyncFnOnce(&cluster::Cluster, &str) -> cluster::Outcome,
) {
    if let Some(cluster) = cluster().await {
        let _alone = INSTALLATION.write().await;
        cluster.run(&[], scenario).await;
    }
}

/// The settings and a cluster with the operator installed; `None` (after saying so) when the
/// tests are not enabled.
///
/// # Panics
/// When the settings are wrong, the cluster cannot be reached or the chart does not install.
async fn cluster() -> Option<cluster::Cluster> {
    let Some(settings) = Settings::from_env() else {
        eprintln!(
            "skipped: set TETHER_E2E_KUBECONFIG=<path to a kubeconfig> to run the real-cluster \
             tests (see docs/dev/e2e.md)"
        );
        return None;
    };
    let settings = settings.unwrap_or_else(|e| panic!("{e}"));
    install::operator(&settings).unwrap_or_else(|e| panic!("installing the chart: {e}"));
    Some(
        cluster::Cluster::connect(settings)
            .await
            .unwrap_or_else(|e| panic!("connecting to the cluster: {e}")),
    )
}

//! `tether-operator`: the control plane of tether (`docs/design/operator.md`).
//!
//! - `tether-operator run`: the controller. It reconciles every `McpEndpoint` of the cluster,
//!   or of the namespaces of `--watch-namespaces` ([`tether_operator::controller`]) and is woken when one of its children or an injected
//!   Deployment changes; it stops on SIGINT/SIGTERM after the reconciles under way (a replica
//!   that waits for the leader-election lease stops at once). The admin
//!   listener (`--admin-addr`) serves `/healthz`, `/readyz` and `/metrics`
//!   ([`tether_operator::admin`]).
//! - `tether-operator plan`: prints what one reconcile of an endpoint would write, from files,
//!   without an API server ([`tether_operator::preview`]); exit 2 when the endpoint is
//!   `Degraded`, 1 when a file is unusable.
//! - `tether-operator crd`: prints the `McpEndpoint` CustomResourceDefinition (`make crds`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::Client;
use kube::api::{Api, ListParams};
use tether_crds::McpEndpoint;
use tether_operator::admin::AdminState;
use tether_operator::admission::{ImagePattern, Policy};
use tether_operator::controller::Context;
use tether_operator::leader::Election;
use tether_operator::plan::Defaults;
use tether_operator::preview::{self, Inputs, Outcome};

/// tether's operator.
#[derive(Debug, Parser)]
#[command(name = "tether-operator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controller (in-cluster config, or KUBECONFIG outside a cluster).
    Run(Box<RunArgs>),
    /// Print what one reconcile of an McpEndpoint would write (YAML), without an API server.
    /// Exit status 2 when the endpoint would be Degraded, 1 when a file is unusable.
    Plan(Box<PlanArgs>),
    /// Print the McpEndpoint CustomResourceDefinition (YAML) to stdout.
    Crd,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Address of the admin listener (`/healthz`, `/readyz`, `/metrics`).
    #[arg(long, env = "TETHER_ADMIN_ADDR", default_value = tether_operator::admin::DEFAULT_ADDR)]
    admin_addr: std::net::SocketAddr,
    /// Log format; the level comes from `RUST_LOG` (default `info`).
    #[arg(long, env = "TETHER_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(flatten)]
    defaults: DefaultsArgs,
    /// Run only while holding the Lease `--lease-name` (for 2 or more replicas).
    #[arg(long, env = "TETHER_LEADER_ELECT")]
    leader_elect: bool,
    /// Name of the leader-election Lease.
    #[arg(long, env = "TETHER_LEASE_NAME", default_value = "tether-operator")]
    lease_name: String,
    /// Namespace of the Lease: the operator's own (downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// This replica's identity in the Lease: its pod name (downward API); default the host name.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Watch only these namespaces (comma-separated), each with the operator's rules granted
    /// by a Role there (chart value `watchNamespaces`). Default: every namespace (a ClusterRole).
    #[arg(
        long,
        env = "TETHER_WATCH_NAMESPACES",
        value_name = "NS,NS",
        value_delimiter = ','
    )]
    watch_namespaces: Vec<String>,
}

/// The operator-wide defaults of `run` and `plan`: what endpoints leave out of `spec.sidecar`.
#[derive(Debug, Args)]
struct DefaultsArgs {
    /// Sidecar image for endpoints whose spec.sidecar.image is unset.
    #[arg(
        long,
        env = "TETHER_SIDECAR_IMAGE",
        default_value = concat!("ghcr.io/tether-dev/tether-sidecar:", env!("CARGO_PKG_VERSION"))
    )]
    sidecar_image: String,
    /// CPU and memory requests and limits of injected sidecars, as the JSON of a Kubernetes
    /// `ResourceRequirements` (e.g. `{"requests":{"cpu":"50m","memory":"64Mi"}}`), for
    /// endpoints whose spec.sidecar.resources is unset. Default: 50m CPU and 64Mi memory
    /// requested, 256Mi memory limit.
    #[arg(long, env = "TETHER_SIDECAR_RESOURCES", value_name = "JSON", value_parser = parse_resources)]
    sidecar_resources: Option<ResourceRequirements>,
    /// UID and GID of injected sidecars, or `platform` to set none and let the platform assign
    /// one (OpenShift's `restricted-v2` rejects a fixed UID outside the namespace's range).
    #[arg(long, env = "TETHER_SIDECAR_RUN_AS_USER", value_name = "UID|platform",
          default_value = "65532", value_parser = parse_user)]
    sidecar_run_as_user: RunAs,
    /// Images an endpoint's spec.sidecar.image may name (comma-separated): a repository (any
    /// tag or digest of it) or a path prefix ending in `/*`. Default: the repository of
    /// `--sidecar-image`, which itself is always allowed. Any other image: the endpoint is
    /// Degraded (ImageNotAllowed).
    #[arg(long, env = "TETHER_ALLOWED_SIDECAR_IMAGES", value_name = "PATTERN,PATTERN",
          value_delimiter = ',', value_parser = ImagePattern::parse)]
    allowed_sidecar_images: Vec<ImagePattern>,
}

impl DefaultsArgs {
    /// The policy these flags ask for.
    fn policy(&self) -> Policy {
        Policy::new(self.allowed_sidecar_images.clone(), &self.sidecar_image)
    }

    /// The defaults these flags ask for.
    fn defaults(self) -> Defaults {
        let mut defaults = Defaults::with_image(self.sidecar_image);
        if let Some(resources) = self.sidecar_resources {
            defaults.sidecar_resources = resources;
        }
        defaults.sidecar_user = self.sidecar_run_as_user.0;
        defaults
    }
}

#[derive(Debug, Args)]
struct PlanArgs {
    /// The McpEndpoint manifest (YAML, one document). Without metadata.uid its children's owner
    /// references show a placeholder UID.
    #[arg(long, value_name = "FILE")]
    endpoint: PathBuf,
    /// Its target Deployment (YAML, one document), as written or as `kubectl get -o yaml` prints it.
    #[arg(long, value_name = "FILE")]
    deployment: PathBuf,
    /// A directory of YAML manifests (or one file) of the live objects a reconcile reads: the
    /// endpoint's ConfigMap, Secret, Services, ServiceAccount, Role, RoleBinding, the
    /// namespace's PodDisruptionBudgets, the target's Pods. Without it nothing is live (the
    /// endpoint's first reconcile).
    #[arg(long, value_name = "DIR")]
    live: Option<PathBuf>,
    #[command(flatten)]
    defaults: DefaultsArgs,
}

/// Parses `--sidecar-resources`.
fn parse_resources(json: &str) -> Result<ResourceRequirements, String> {
    serde_json::from_str(json).map_err(|e| {
        format!("not the JSON of a ResourceRequirements ({e}); e.g. {{\"limits\":{{\"memory\":\"256Mi\"}}}}")
    })
}

/// The user injected sidecars run as (`--sidecar-run-as-user`).
#[derive(Clone, Copy, Debug)]
struct RunAs(Option<i64>);

/// Parses `--sidecar-run-as-user`: a UID ≥ 1, or `platform`.
fn parse_user(value: &str) -> Result<RunAs, String> {
    if value == "platform" {
        return Ok(RunAs(None));
    }
    match value.parse::<i64>() {
        Ok(uid) if uid >= 1 => Ok(RunAs(Some(uid))),
        _ => Err(format!(
            "{value:?} is neither a UID ≥ 1 (the sidecar never runs as root) nor \"platform\""
        )),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Crd => match tether_crds::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("tether-operator: cannot render the CRD: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Run(args) => run(*args).await,
        Command::Plan(args) => plan(*args).await,
    }
}

/// `tether-operator plan`: the preview on stdout, notes and the `Degraded` reason on stderr.
async fn plan(args: PlanArgs) -> ExitCode {
    let inputs = match Inputs::load(&args.endpoint, &args.deployment, args.live.as_deref()) {
        Ok(inputs) => inputs,
        Err(e) => {
            eprintln!("tether-operator plan: {e}");
            return ExitCode::FAILURE;
        }
    };
    for note in inputs.notes() {
        eprintln!("tether-operator plan: note: {note}");
    }
    let policy = args.defaults.policy();
    match preview::preview(&inputs, &args.defaults.defaults(), &policy).await {
        Ok(Outcome::Planned(preview)) => {
            print!("{}", preview.to_yaml());
            ExitCode::SUCCESS
        }
        Ok(Outcome::Degraded(conflict)) => {
            eprintln!(
                "tether-operator plan: Degraded: {}: {}; the operator would write nothing but the status",
                conflict.reason, conflict.message
            );
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("tether-operator plan: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: RunArgs) -> ExitCode {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match args.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    // Before anything else: a process without handlers (PID 1 of a container) ignores SIGTERM,
    // and the kubelet would wait out the grace period to kill it.
    let mut signals = Signals::install();
    let admin = Arc::new(AdminState::default());
    let listener = match tokio::net::TcpListener::bind(args.admin_addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(addr = %args.admin_addr, error = %e, "cannot bind the admin listener");
            return ExitCode::FAILURE;
        }
    };
    tokio::spawn(tether_operator::admin::serve(listener, Arc::clone(&admin)));
    let client = match tether_crds::client::with_user_agent(concat!(
        "tether-operator/v",
        env!("CARGO_PKG_VERSION")
    ))
    .await
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "no Kubernetes configuration (in-cluster or KUBECONFIG)");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = can_list_endpoints(&client, &args.watch_namespaces).await {
        tracing::error!(error = %e, "cannot list McpEndpoints; is the CRD installed (kubectl apply -f crds/) and are the operator's RBAC rules granted where it watches?");
        return ExitCode::FAILURE;
    }
    let identity = args.identity.clone().unwrap_or_else(host_name);
    let policy = args.defaults.policy();
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            args.defaults.defaults(),
            Arc::clone(&admin.metrics),
            Some(identity.clone()),
        )
        .with_policy(policy),
    );
    admin
        .ready
        .store(true, std::sync::atomic::Ordering::Release);
    let mut leading = None;
    if args.leader_elect {
        let election = Election {
            namespace: args.lease_namespace,
            name: args.lease_name,
            identity,
        };
        tokio::select! {
            led = tether_operator::leader::lead(client.clone(), &election) => match led {
                Ok(rx) => leading = Some(rx),
                Err(e) => {
                    tracing::error!(error = %e, "leader election failed");
                    return ExitCode::FAILURE;
                }
            },
            signal = signals.recv() => {
                tracing::info!("{signal}: stopping (never held the lease)");
                return ExitCode::SUCCESS;
            }
        }
    }
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = stop_signal(signals, leading, Arc::clone(&lost));
    match args.watch_namespaces.as_slice() {
        [] => tracing::info!("reconciling McpEndpoints of every namespace"),
        namespaces => tracing::info!(?namespaces, "reconciling McpEndpoints of these namespaces"),
    }
    tether_operator::watches::run(ctx, &args.watch_namespaces, stop).await;
    if lost.load(std::sync::atomic::Ordering::Acquire) {
        tracing::error!("lost the leader-election lease; exiting so a new candidate starts");
        return ExitCode::FAILURE;
    }
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

/// Lists at most one McpEndpoint where the operator watches (every namespace when `namespaces`
/// is empty): fails when the CRD is missing or the operator's rules are not granted there.
async fn can_list_endpoints(client: &Client, namespaces: &[String]) -> Result<(), kube::Error> {
    let one = ListParams::default().limit(1);
    if namespaces.is_empty() {
        Api::<McpEndpoint>::all(client.clone()).list(&one).await?;
    }
    for namespace in namespaces {
        Api::<McpEndpoint>::namespaced(client.clone(), namespace)
            .list(&one)
            .await?;
    }
    Ok(())
}

/// The handlers of SIGINT and SIGTERM, installed once at start.
struct Signals {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Installs the handlers; one that cannot be installed never fires (and says so).
    fn install() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        let handler = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "cannot handle {name}");
                None
            }
        };
        Self {
            interrupt: handler(SignalKind::interrupt(), "SIGINT"),
            terminate: handler(SignalKind::terminate(), "SIGTERM"),
        }
    }

    /// Resolves on the next SIGINT or SIGTERM, with its name.
    async fn recv(&mut self) -> &'static str {
        async fn next(signal: Option<&mut tokio::signal::unix::Signal>) {
            match signal {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        tokio::select! {
            () = next(self.interrupt.as_mut()) => "SIGINT",
            () = next(self.terminate.as_mut()) => "SIGTERM",
        }
    }
}

/// Resolves on SIGINT or SIGTERM, or when the lease in `leading` is lost (then sets `lost`).
async fn stop_signal(
    mut signals: Signals,
    leading: Option<tokio::sync::watch::Receiver<bool>>,
    lost: Arc<std::sync::atomic::AtomicBool>,
) {
    let lease_lost = async move {
        match leading {
            Some(mut rx) => {
                let _ = rx.wait_for(|held| !*held).await;
                lost.store(true, std::sync::atomic::Ordering::Release);
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        signal = signals.recv() => tracing::info!("{signal}: stopping"),
        () = lease_lost => {}
    }
}

/// The host name (a pod's name in Kubernetes), else a random identity.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .unwrap_or_else(|_| format!("tether-operator-{:08x}", rand::random::<u32>()))
}

//! One pod on loopback: an MCP server and `tether-sidecar` as processes.
//!
//! Each pod gets its own IP from [`crate::addr`] and fixed ports on it: the sidecar's MCP
//! listener on [`LISTEN_PORT`], its admin listener on [`ADMIN_PORT`], the MCP server on
//! [`UPSTREAM_PORT`]. The MCP server is [`PodSpec::server`]: `tether-example-server` (rmcp), the
//! fixture on the official Python SDK (`tests/fixtures/python-sdk-server/`), which answers the
//! same tools and `/stats`, or `tether-bench-origin`, a fast origin with tools of its own for
//! benchmarks. Its manifest, secret and both processes' logs live in a
//! temporary directory. Processes are killed when the [`Pod`] is dropped, so tests stop by
//! themselves.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use crate::client::{Http, McpClient, body_text};
use crate::{HarnessError, Result, addr, bins};

/// Port of the sidecar's MCP listener.
pub const LISTEN_PORT: u16 = 8080;
/// Port of the sidecar's admin listener.
pub const ADMIN_PORT: u16 = 9901;
/// The sidecar's peer (handoff) listener port (`spec.peer.port`).
pub const PEER_PORT: u16 = 9902;
/// Port of the MCP server.
pub const UPSTREAM_PORT: u16 = 3000;
/// How long a pod may take to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The sidecar's drain socket, in the pod's directory.
const DRAIN_SOCKET: &str = "drain.sock";
/// When set, each pod's directory (`sidecar.log`, `server.log`, its manifest) stays after the
/// test, for reading a failure's whole story; its path is printed at start.
const KEEP_LOGS: &str = "TETHER_TEST_KEEP_LOGS";
/// The directory of a pod's key ring, in the pod's directory (`--secret-dir`).
pub const KEYS_DIR: &str = "keys";

/// The key ring of test endpoints: every pod of a test process shares it, as the pods of one
/// endpoint share its Secret (an HMAC key, the per-endpoint CA and the peer certificate).
pub fn key_ring() -> &'static tether_crds::keyring::Generation {
    static RING: std::sync::OnceLock<tether_crds::keyring::Generation> = std::sync::OnceLock::new();
    RING.get_or_init(|| {
        tether_crds::keyring::Generation::new("test/endpoint")
            .expect("the test key ring is generated")
    })
}

/// The HMAC key of [`key_ring`] as a sidecar reads it: the key that mints the test endpoints'
/// session ids, and their digests in the sidecars' logs.
pub fn session_key() -> &'static [u8] {
    tether_crds::keyring::key_material(&key_ring().key)
}

/// Writes the files of [`key_ring`] into `dir` (created when missing), as the kubelet mounts the
/// endpoint's Secret.
///
/// # Errors
/// [`HarnessError`] when a file cannot be written.
pub fn write_key_ring(dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, bytes) in key_ring().files() {
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}

/// The MCP server of a pod, behind its sidecar. The first two serve the tool contract of
/// `tether-example-server` (`echo`, `slow`, `counter`, `notify`) and its `/stats`; the third
/// only `echo` and `stream`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Upstream {
    /// `tether-example-server`, on the official Rust SDK (rmcp).
    #[default]
    Example,
    /// The fixture on the official Python SDK (`tests/fixtures/python-sdk-server/server.py`),
    /// run by the interpreter of the virtualenv `make python-sdk` creates
    /// ([`bins::python_sdk_venv`]). It defends against DNS rebinding as the SDK does on
    /// loopback, and its `/stats` also count the requests that defence refused
    /// (`rejected_hosts`, `rejected_origins`).
    PythonSdk,
    /// `tether-bench-origin` (`examples/src/bin/bench_origin.rs`): a minimal origin on hyper
    /// that writes events as fast as the connection takes them, for benchmarks. Its tools are
    /// `echo` and `stream` (`count` progress events, `size` bytes of padding each, `interval_us`
    /// apart); its `/stats` have `executions`, `calls` and `duplicates` as the example
    /// server's, and `sessions`. No standalone stream (GET: 405), no resumption.
    Origin,
}

impl Upstream {
    /// The process's name, for errors.
    pub fn name(self) -> &'static str {
        match self {
            Self::Example => "tether-example-server",
            Self::PythonSdk => "the Python SDK fixture (server.py)",
            Self::Origin => "tether-bench-origin",
        }
    }

    /// The command that starts it, listening on `ip`:[`UPSTREAM_PORT`].
    ///
    /// # Errors
    /// [`HarnessError`] when its binary or virtualenv is missing.
    fn command(self, ip: Ipv4Addr) -> Result<Command> {
        let mut command = match self {
            Self::Example => Command::new(bins::path("tether-example-server")?),
            Self::PythonSdk => {
                let (python, script) = bins::python_sdk_server()?;
                let mut command = Command::new(python);
                // Unbuffered, so the pod's log shows what it printed before it died.
                command.arg("-u").arg(script);
                command
            }
            Self::Origin => Command::new(bins::path("tether-bench-origin")?),
        };
        command.arg("--listen").arg(format!("{ip}:{UPSTREAM_PORT}"));
        Ok(command)
    }
}

/// What to run: the manifest's settings, the MCP server and extra flags.
#[derive(Clone, Debug)]
pub struct PodSpec {
    /// `spec.protocolVersions`.
    pub versions: Vec<String>,
    /// `spec.origins.allow`.
    pub origins: Vec<String>,
    /// `spec.origins.allowMissing`.
    pub allow_missing_origin: bool,
    /// `spec.buffer.maxEvents`.
    pub max_events: u32,
    /// `spec.buffer.maxBytes`.
    pub max_bytes: u64,
    /// `spec.buffer.ttl`.
    pub ttl: String,
    /// `spec.session.idleTimeout`.
    pub idle_timeout: String,
    /// `spec.session.migration` (`Replay` or `Pin`).
    pub migration: String,
    /// `spec.session.replication` (`None`, `Sessions` or `Events`); `None` (the Rust value):
    /// the manifest does not name it (the sidecar's default).
    pub replication: Option<String>,
    /// `spec.session.writeAhead`; `None`: the manifest does not name it (the default, `true`).
    pub write_ahead: Option<bool>,
    /// `spec.drain.timeout` (a Kubernetes-style duration: `5s`, `1500ms`).
    pub drain_timeout: String,
    /// `spec.drain.shutdownDelay`: `0s` by default, as the harness's clients and peers learn
    /// of a pod's drain at once (no kube-proxy between them and the pods).
    pub shutdown_delay: String,
    /// `spec.auth.revalidate`.
    pub revalidate: String,
    /// `spec.upstream.forwardOrigin`.
    pub forward_origin: bool,
    /// Extra `tether-sidecar` flags.
    pub sidecar_args: Vec<String>,
    /// The MCP server.
    pub server: Upstream,
    /// Extra flags of the MCP server.
    pub server_args: Vec<String>,
    /// The `tether-sidecar` binary to run; `None`: the workspace's ([`bins::path`]). A
    /// benchmark compares another build's sidecar with this one so.
    pub sidecar_bin: Option<PathBuf>,
    /// `spec.peer.tls`: mutual TLS between the sidecars (the default, as in production). The
    /// manifest names it only when `false`, so a sidecar of a release before the field reads it.
    pub peer_tls: bool,
    /// The endpoint's Secret this pod mounts (`--secret-dir`), written as the kubelet writes a
    /// Secret volume ([`crate::keyring::mount`]) so that [`Pod::mount_keys`] can update it
    /// atomically later: an endpoint whose key ring rotates. `None`: the key ring every test
    /// endpoint of the process shares ([`key_ring`]), as plain files.
    pub key_ring: Option<crate::keyring::KeyFiles>,
    /// Environment variables added to the sidecar's, e.g. `KUBECONFIG` for an EndpointSlice
    /// watch against a fake API server ([`crate::kube_api`]), or a `RUST_LOG` of its own.
    pub sidecar_env: Vec<(String, String)>,
    /// Where the sidecar dials its MCP server (`--upstream`): something in front of the server
    /// (a [`crate::tap::Tap`] that records what reaches it); `None`: the server itself.
    pub upstream_via: Option<std::net::SocketAddr>,
}

impl Default for PodSpec {
    /// The test endpoint: one allowed Origin (`https://app.example.com`; a missing one passes),
    /// a buffer of 1024 events, 4 MiB and 10 min, 30 min idle sessions under `Replay`, a 5 s
    /// drain, every protocol version, credentials revalidated after 60 s, the client's `Origin`
    /// not passed to the MCP server, `tether-example-server` as the MCP server and the
    /// workspace's sidecar.
    fn default() -> Self {
        Self {
            versions: ["2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"]
                .map(String::from)
                .to_vec(),
            origins: vec!["https://app.example.com".into()],
            allow_missing_origin: true,
            max_events: 1024,
            max_bytes: 4 * 1024 * 1024,
            ttl: "10m".into(),
            idle_timeout: "30m".into(),
            migration: "Replay".into(),
            replication: None,
            write_ahead: None,
            drain_timeout: "5s".into(),
            shutdown_delay: "0s".into(),
            revalidate: "60s".into(),
            forward_origin: false,
            sidecar_args: Vec::new(),
            server: Upstream::Example,
            server_args: Vec::new(),
            sidecar_bin: None,
            peer_tls: true,
            key_ring: None,
            sidecar_env: Vec::new(),
            upstream_via: None,
        }
    }
}

impl PodSpec {
    /// This spec with `spec.session.replication: None`: what a drain's handoff guarantees by
    /// itself, with no replica to fall back on.
    pub fn unreplicated(self) -> Self {
        Self {
            replication: Some("None".into()),
            ..self
        }
    }

    /// The McpEndpoint manifest for this spec.
    pub fn manifest(&self) -> String {
        let quote = |v: &[String]| {
            v.iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "apiVersion: mcp.tether.dev/v1alpha1\n\
             kind: McpEndpoint\n\
             metadata: {{name: test, namespace: default}}\n\
             spec:\n\
             \x20 targetRef: {{kind: Deployment, name: test}}\n\
             \x20 upstream: {{port: {UPSTREAM_PORT}, path: /mcp, forwardOrigin: {}}}\n\
             \x20 listen: {{port: {LISTEN_PORT}, path: /mcp}}\n\
             \x20 admin: {{port: {ADMIN_PORT}}}\n\
             \x20 peer: {{port: {PEER_PORT}{}}}\n\
             \x20 origins: {{allow: [{}], allowMissing: {}}}\n\
             \x20 protocolVersions: [{}]\n\
             \x20 buffer: {{maxEvents: {}, maxBytes: {}, ttl: {}}}\n\
             \x20 session: {{idleTimeout: {}, migration: {}{}}}\n\
             \x20 drain: {{timeout: {}, shutdownDelay: {}}}\n\
             \x20 auth: {{revalidate: {}}}\n",
            self.forward_origin,
            if self.peer_tls { "" } else { ", tls: false" },
            quote(&self.origins),
            self.allow_missing_origin,
            quote(&self.versions),
            self.max_events,
            self.max_bytes,
            self.ttl,
            self.idle_timeout,
            self.migration,
            self.replication
                .as_ref()
                .map_or_else(String::new, |r| format!(", replication: {r}"))
                + &self
                    .write_ahead
                    .map_or_else(String::new, |w| format!(", writeAhead: {w}")),
            self.drain_timeout,
            self.shutdown_delay,
            self.revalidate,
        )
    }
}

/// A running pod.
pub struct Pod {
    /// The pod's IP.
    pub ip: Ipv4Addr,
    /// The sidecar's MCP endpoint, `http://ip:8080/mcp`.
    pub mcp_url: String,
    /// The sidecar's admin base URL, `http://ip:9901`.
    pub admin_url: String,
    /// The MCP server's base URL, `http://ip:3000`.
    pub server_url: String,
    /// The pod's UID, `pod-<ip>`.
    pub uid: String,
    dir: tempfile::TempDir,
    spec: PodSpec,
    server: Child,
    sidecar: Child,
    http: Http,
}

impl Pod {
    /// Starts a pod with the default spec.
    ///
    /// # Errors
    /// [`HarnessError`] when a binary is missing or a process does not become ready.
    pub async fn start_default() -> Result<Self> {
        Self::start(PodSpec::default()).await
    }

    /// Starts the MCP server and the sidecar and waits until the sidecar is ready.
    ///
    /// # Errors
    /// [`HarnessError`] when a binary (or the Python SDK fixture's virtualenv) is missing or a
    /// process does not become ready.
    pub async fn start(spec: PodSpec) -> Result<Self> {
        Self::start_at(addr::next_ip(), spec).await
    }

    /// Starts a pod on `ip` (which no other running pod may use).
    ///
    /// # Errors
    /// [`HarnessError`] when a binary is missing or a process does not become ready.
    pub async fn start_at(ip: Ipv4Addr, spec: PodSpec) -> Result<Self> {
        let mut pod = Self::launch_at(ip, spec)?;
        pod.wait_ready().await?;
        Ok(pod)
    }

    /// Starts the MCP server and the sidecar on `ip` without waiting for the sidecar to be
    /// ready: for a test of what a pod does before it is ([`Pod::wait_ready`] waits).
    ///
    /// # Errors
    /// [`HarnessError`] when a binary is missing or a file cannot be written.
    pub fn launch_at(ip: Ipv4Addr, spec: PodSpec) -> Result<Self> {
        let mut dir = tempfile::tempdir()?;
        if std::env::var_os(KEEP_LOGS).is_some() {
            dir.disable_cleanup(true);
            eprintln!("pod {ip}: logs kept in {}", dir.path().display());
        }
        std::fs::write(dir.path().join("endpoint.yaml"), spec.manifest())?;
        match &spec.key_ring {
            Some(files) => crate::keyring::mount(&dir.path().join(KEYS_DIR), files)?,
            None => write_key_ring(&dir.path().join(KEYS_DIR))?,
        }
        let server = spawn_server(ip, &spec, dir.path().join("server.log"))?;
        let sidecar = spawn_sidecar(ip, &spec, dir.path())?;
        Ok(Self {
            ip,
            mcp_url: format!("http://{ip}:{LISTEN_PORT}/mcp"),
            admin_url: format!("http://{ip}:{ADMIN_PORT}"),
            server_url: format!("http://{ip}:{UPSTREAM_PORT}"),
            uid: uid(ip),
            dir,
            spec,
            server,
            sidecar,
            http: Http::new(),
        })
    }

    /// Updates the pod's Secret volume to `files`, atomically, as the kubelet does when the
    /// endpoint's Secret changed ([`crate::keyring::mount`]); the sidecar reloads its key ring
    /// within a second.
    ///
    /// # Errors
    /// [`HarnessError::Io`] when a file cannot be written.
    pub fn mount_keys(&self, files: &crate::keyring::KeyFiles) -> Result<()> {
        crate::keyring::mount(&self.dir.path().join(KEYS_DIR), files)
    }

    /// The sidecar's `GET /keys`: the key ring it loaded and its sessions by minting key.
    ///
    /// # Errors
    /// [`HarnessError`] when it cannot be read.
    pub async fn key_report(&self) -> Result<tether_crds::keyring::KeyReport> {
        crate::keyring::key_report(&self.http, &self.admin_url).await
    }

    /// The status of the sidecar's `GET /readyz`.
    ///
    /// # Errors
    /// [`HarnessError::Http`] when the exchange fails.
    pub async fn readyz(&self) -> Result<StatusCode> {
        Ok(self
            .http
            .get_text(&format!("{}/readyz", self.admin_url))
            .await?
            .0)
    }

    /// Waits until the sidecar drains (`/readyz` answers 503), at most `within`.
    ///
    /// # Errors
    /// [`HarnessError::Protocol`] when it does not within `within`.
    pub async fn wait_draining(&self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        while self.readyz().await? != StatusCode::SERVICE_UNAVAILABLE {
            if Instant::now() >= deadline {
                return Err(HarnessError::Protocol(format!(
                    "pod {} not draining after {within:?}",
                    self.ip
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Replaces the sidecar's endpoint file with `manifest`, atomically (written aside, then
    /// renamed over it, as the kubelet swaps a ConfigMap volume's files).
    ///
    /// # Errors
    /// [`HarnessError`] when the file cannot be written.
    pub fn rewrite_endpoint(&self, manifest: &str) -> Result<()> {
        let aside = self.dir.path().join("endpoint.yaml.new");
        std::fs::write(&aside, manifest)?;
        std::fs::rename(&aside, self.dir.path().join("endpoint.yaml"))?;
        Ok(())
    }

    /// A client of this pod's MCP endpoint.
    pub fn client(&self) -> McpClient {
        McpClient::new(self.mcp_url.clone())
    }

    /// Waits (at most [`READY_TIMEOUT`]) until the sidecar's `/readyz` answers 200.
    ///
    /// # Errors
    /// [`HarnessError::Start`] when a process exits first or the time is up.
    pub async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let url = format!("{}/readyz", self.admin_url);
        loop {
            let exited = [
                (self.spec.server.name(), self.server.try_wait()?),
                ("tether-sidecar", self.sidecar.try_wait()?),
            ];
            if let Some((name, Some(status))) = exited.iter().find(|(_, s)| s.is_some()) {
                let hint = if self.spec.server == Upstream::PythonSdk {
                    " (an incomplete virtualenv? make python-sdk)"
                } else {
                    ""
                };
                return Err(HarnessError::Start(format!(
                    "{name} exited with {status} during start-up{hint}\n{}",
                    self.logs()
                )));
            }
            if let Ok((StatusCode::OK, _)) = self.http.get_text(&url).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Start(format!(
                    "pod {} not ready within {READY_TIMEOUT:?}\n{}",
                    self.ip,
                    self.logs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The MCP server's `/stats`.
    ///
    /// # Errors
    /// [`HarnessError`] when it cannot be read.
    pub async fn stats(&self) -> Result<Value> {
        let (_, text) = self
            .http
            .get_text(&format!("{}/stats", self.server_url))
            .await?;
        serde_json::from_str(&text).map_err(|e| HarnessError::Protocol(e.to_string()))
    }

    /// The sidecar's `/metrics` text.
    ///
    /// # Errors
    /// [`HarnessError`] when it cannot be read.
    pub async fn metrics(&self) -> Result<String> {
        Ok(self
            .http
            .get_text(&format!("{}/metrics", self.admin_url))
            .await?
            .1)
    }

    /// The value of one metric sample, e.g. `tether_not_found_total{reason="forged"}` (0 when
    /// absent).
    ///
    /// # Errors
    /// [`HarnessError`] when the metrics cannot be read.
    pub async fn metric(&self, sample: &str) -> Result<f64> {
        Ok(sample_value(&self.metrics().await?, sample))
    }

    /// Polls metric `sample` (every 50 ms, at most `within`) until `done` holds for its value;
    /// returns the last value read (the caller asserts on it).
    ///
    /// # Errors
    /// [`HarnessError`] when the metrics cannot be read.
    pub async fn wait_for_metric(
        &self,
        sample: &str,
        within: Duration,
        done: impl Fn(f64) -> bool,
    ) -> Result<f64> {
        let every = Duration::from_millis(50);
        crate::poll(within, every, || self.metric(sample), |&v| done(v)).await
    }

    /// Polls the MCP server's `/stats` (every 50 ms, at most `within`) until `done` holds
    /// for them; returns the last ones read (the caller asserts on them).
    ///
    /// # Errors
    /// [`HarnessError`] when they cannot be read.
    pub async fn wait_for_stats(
        &self,
        within: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        crate::poll(within, Duration::from_millis(50), || self.stats(), done).await
    }

    /// `tether-sidecar drain` in the pod (the sidecar container's `preStop` hook): waits until
    /// the drain is done or `spec.drain.timeout` passed.
    ///
    /// # Errors
    /// [`HarnessError`] when the command cannot run or reach the sidecar, or prints no JSON.
    pub async fn drain(&self) -> Result<Drained> {
        drain(self.drain_socket()).await
    }

    /// [`Pod::drain`] in a task of its own, so that the caller acts while the pod drains.
    pub fn start_drain(&self) -> JoinHandle<Result<Drained>> {
        tokio::spawn(drain(self.drain_socket()))
    }

    /// `GET /drained` on the admin port (the MCP server container's `preStop httpGet`): waits
    /// until the pod's drain has ended, at most `spec.drain.timeout` + 2 s; the status and the
    /// JSON body.
    ///
    /// # Errors
    /// [`HarnessError`] when the exchange fails or the body is not JSON.
    pub async fn wait_drained(&self) -> Result<(StatusCode, Value)> {
        let resp = self
            .http
            .send(
                Method::GET,
                &format!("{}/drained", self.admin_url),
                &[],
                None,
            )
            .await?;
        let status = resp.status();
        let text = body_text(resp).await?;
        let body = serde_json::from_str(&text)
            .map_err(|e| HarnessError::Protocol(format!("/drained answered {text:?}: {e}")))?;
        Ok((status, body))
    }

    /// The sidecar's drain socket (`--drain-socket`), in the pod's directory.
    pub fn drain_socket(&self) -> PathBuf {
        self.dir.path().join(DRAIN_SOCKET)
    }

    /// The sidecar's peak resident set size in bytes (`VmHWM` in `/proc/<pid>/status`).
    ///
    /// # Errors
    /// [`HarnessError`] when the sidecar exited or its status cannot be read.
    pub fn sidecar_peak_rss(&self) -> Result<u64> {
        self.sidecar_status_bytes("VmHWM")
    }

    /// The sidecar's resident set size now, in bytes (`VmRSS` in `/proc/<pid>/status`).
    ///
    /// # Errors
    /// [`HarnessError`] when the sidecar exited or its status cannot be read.
    pub fn sidecar_rss(&self) -> Result<u64> {
        self.sidecar_status_bytes("VmRSS")
    }

    /// Field `field` (a size in kB) of the sidecar's `/proc/<pid>/status`, in bytes.
    fn sidecar_status_bytes(&self, field: &str) -> Result<u64> {
        let pid = self
            .sidecar
            .id()
            .ok_or_else(|| HarnessError::Start("the sidecar already exited".into()))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .ok_or_else(|| HarnessError::Protocol(format!("no {field} in /proc/{pid}/status")))
    }

    /// CPU time the sidecar has used so far ([`process_cpu`]).
    ///
    /// # Errors
    /// [`HarnessError`] when the sidecar exited or its tasks cannot be read.
    pub fn sidecar_cpu(&self) -> Result<Duration> {
        let pid = self
            .sidecar_pid()
            .ok_or_else(|| HarnessError::Start("the sidecar already exited".into()))?;
        process_cpu(pid)
    }

    /// The sidecar's process id, while it runs.
    pub fn sidecar_pid(&self) -> Option<u32> {
        self.sidecar.id()
    }

    /// The MCP server's process id, while it runs.
    pub fn server_pid(&self) -> Option<u32> {
        self.server.id()
    }

    /// Whether the sidecar process still runs (bad input never ends it).
    ///
    /// # Errors
    /// [`HarnessError::Io`] when its state cannot be read.
    pub fn sidecar_running(&mut self) -> Result<bool> {
        Ok(self.sidecar.try_wait()?.is_none())
    }

    /// Stops the MCP server (SIGKILL) and starts it again: the upstream loses every session.
    ///
    /// # Errors
    /// [`HarnessError`] when it cannot be restarted.
    pub async fn restart_server(&mut self) -> Result<()> {
        self.server.kill().await?;
        self.server = spawn_server(self.ip, &self.spec, self.dir.path().join("server.log"))?;
        self.wait_ready().await
    }

    /// Stops the MCP server for good (SIGKILL).
    ///
    /// # Errors
    /// [`HarnessError::Io`] when it cannot be killed.
    pub async fn kill_server(&mut self) -> Result<()> {
        self.server.kill().await?;
        Ok(())
    }

    /// Kills the sidecar (SIGKILL), as a crashed pod; the MCP server keeps running.
    ///
    /// # Errors
    /// [`HarnessError::Io`] when it cannot be killed.
    pub async fn kill_sidecar(&mut self) -> Result<()> {
        self.sidecar.kill().await?;
        Ok(())
    }

    /// Kills the sidecar (SIGKILL) and starts it again at once with the same pod UID, address,
    /// manifest, peers file and Secret, as the kubelet restarts a crashed container; waits
    /// until it is ready. The MCP server keeps running; the new sidecar's log follows the old
    /// one's in the same file.
    ///
    /// # Errors
    /// [`HarnessError`] when it cannot be killed, or started again and ready.
    pub async fn restart_sidecar(&mut self) -> Result<()> {
        self.sidecar.kill().await?;
        self.sidecar = spawn_sidecar(self.ip, &self.spec, self.dir.path())?;
        self.wait_ready().await
    }

    /// Sends `SIG<name>` (e.g. `STOP`, `CONT`) to the sidecar.
    ///
    /// # Errors
    /// [`HarnessError`] when the sidecar exited or the signal cannot be sent.
    pub async fn signal_sidecar(&mut self, name: &str) -> Result<()> {
        let pid = self
            .sidecar
            .id()
            .ok_or_else(|| HarnessError::Start("the sidecar already exited".into()))?;
        let sent = Command::new("kill")
            .args([format!("-{name}"), pid.to_string()])
            .status()
            .await?;
        if !sent.success() {
            return Err(HarnessError::Start(format!("kill -{name} {pid} failed")));
        }
        Ok(())
    }

    /// Sends SIGTERM to the sidecar and waits (at most `within`) for it to exit; returns its
    /// exit status, or `None` when it is still running.
    ///
    /// # Errors
    /// [`HarnessError::Io`] when the signal cannot be sent.
    pub async fn terminate_sidecar(
        &mut self,
        within: Duration,
    ) -> Result<Option<std::process::ExitStatus>> {
        self.signal_sidecar("TERM").await?;
        Ok(tokio::time::timeout(within, self.sidecar.wait())
            .await
            .ok()
            .transpose()?)
    }

    /// Both processes' logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["server.log", "sidecar.log"] {
            let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            let _ = writeln!(out, "--- {name} (last lines) ---");
            for line in tail.into_iter().rev() {
                let _ = writeln!(out, "{line}");
            }
        }
        out
    }

    /// The sidecar's whole log.
    pub fn sidecar_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sidecar.log")).unwrap_or_default()
    }

    /// The MCP server's whole log (it outlives the server: e.g. the executions it printed
    /// with `--log-calls` before it was killed).
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

/// What `tether-sidecar drain` reported.
#[derive(Clone, Debug)]
pub struct Drained {
    /// Exit code 0: the drain finished; 1: `spec.drain.timeout` passed first.
    pub done: bool,
    /// `{"drained": bool, "inFlight": N, "elapsedMs": N, …}`.
    pub body: Value,
    /// Wall time from the command's start to its exit.
    pub elapsed: Duration,
}

/// Runs `tether-sidecar drain` against the drain socket `socket`.
async fn drain(socket: PathBuf) -> Result<Drained> {
    let started = Instant::now();
    let out = Command::new(bins::path("tether-sidecar")?)
        .arg("drain")
        .arg("--drain-socket")
        .arg(&socket)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let done = match out.status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => {
            return Err(HarnessError::Protocol(format!(
                "tether-sidecar drain failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
    };
    let body = serde_json::from_str(&stdout).map_err(|e| {
        HarnessError::Protocol(format!("tether-sidecar drain printed {stdout:?}: {e}"))
    })?;
    Ok(Drained {
        done,
        body,
        elapsed: started.elapsed(),
    })
}

/// CPU time process `pid` has used so far, every thread's (the first field of each
/// `/proc/<pid>/task/<tid>/schedstat`, in nanoseconds); threads that already ended are not
/// counted (pingora's and tokio's workers are long-lived).
///
/// # Errors
/// [`HarnessError::Io`] when the process exited or its tasks cannot be read.
pub fn process_cpu(pid: u32) -> Result<Duration> {
    let mut nanos = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = std::fs::read_to_string(task?.path().join("schedstat"))?;
        nanos += stat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(Duration::from_nanos(nanos))
}

/// The value of metric sample `sample` (name and labels, e.g. `tether_drain_seconds_count`) in
/// Prometheus text `text`; 0 when absent.
pub fn sample_value(text: &str, sample: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(sample)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Every sample of metric family `name` in a Prometheus text: its label set (`reason="x"`,
/// empty without labels) and value.
pub fn family_samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> {
    text.lines().filter_map(move |l| {
        let rest = l.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(labelled) => labelled.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        Some((labels, value.trim().parse().ok()?))
    })
}

/// The UID of the pod on `ip`.
pub fn uid(ip: Ipv4Addr) -> String {
    format!("pod-{ip}")
}

fn log_file(path: PathBuf) -> Result<(Stdio, Stdio)> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    Ok((Stdio::from(file.try_clone()?), Stdio::from(file)))
}

fn spawn_server(ip: Ipv4Addr, spec: &PodSpec, log: PathBuf) -> Result<Child> {
    let (out, err) = log_file(log)?;
    Ok(spec
        .server
        .command(ip)?
        .args(&spec.server_args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()?)
}

fn spawn_sidecar(ip: Ipv4Addr, spec: &PodSpec, dir: &std::path::Path) -> Result<Child> {
    let (out, err) = log_file(dir.join("sidecar.log"))?;
    let bin = match &spec.sidecar_bin {
        Some(bin) => bin.clone(),
        None => bins::path("tether-sidecar")?,
    };
    Ok(Command::new(bin)
        .arg("--endpoint")
        .arg(dir.join("endpoint.yaml"))
        .arg("--pod-ip")
        .arg(ip.to_string())
        .arg("--pod-uid")
        .arg(uid(ip))
        .arg("--secret-dir")
        .arg(dir.join(KEYS_DIR))
        .arg("--upstream")
        .arg(
            spec.upstream_via
                .map_or_else(|| format!("{ip}:{UPSTREAM_PORT}"), |via| via.to_string()),
        )
        .arg("--drain-socket")
        .arg(dir.join(DRAIN_SOCKET))
        .args(&spec.sidecar_args)
        .env(
            "RUST_LOG",
            std::env::var("TETHER_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .envs(spec.sidecar_env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()?)
}

//! `tether-tests`: the multi-process harness of tether.
//!
//! It starts real processes (the example MCP server and `tether-sidecar`) on addresses of
//! 127.0.0.0/8, talks MCP Streamable HTTP to them with its own small client, and measures what
//! clients experience. The multi-process tests (`tests/tests/it/`), the static checks of the
//! repository (`tests/tests/repo/`) and the local demo (`make demo`) are built on it
//! (`docs/dev/testing.md`).
//!
//! - [`auth`]: bearer tokens for an upstream that requires them (`--auth-key`);
//! - [`bins`]: finds the workspace's binaries and the Python SDK fixture's virtualenv;
//! - [`pod`]: one pod (an MCP server, `tether-example-server`, the Python SDK fixture or the
//!   benchmarks' `tether-bench-origin`, + sidecar) with its manifest, secret and logs;
//! - [`cluster`]: several pods sharing a membership (`--peers-file`);
//! - [`conformance`]: the official MCP conformance suite, run against a URL, its checks read back;
//! - [`keyring`]: an endpoint's key ring through a rotation, mounted as the kubelet mounts a
//!   Secret;
//! - [`kube_api`]: the in-memory Kubernetes API server (`tether-fake-kube`) over HTTP, playing the
//!   EndpointSlice controller, for the sidecar's EndpointSlice watch;
//! - [`clock`]: the machine's monotonic clock, shared by its processes;
//! - [`client`]: an MCP client on hyper that can cut its connection and resume with
//!   `Last-Event-ID`;
//! - [`call`]: one `slow` tool call with cuts and resumes, checked event by event;
//! - [`follow`]: reconnecting to a stream like EventSource (retry hint, `Retry-After`, 404);
//! - [`modern`]: a 2026-07-28 (stateless) client, tasks included;
//! - [`incident`]: what a client saw go wrong, traced in the sidecars' logs by session digest;
//! - [`load`]: many concurrent sessions of such calls, summed up in a [`load::Report`];
//! - [`rollout`]: a rolling replacement of every pod under such a load, in a [`rollout::RolloutReport`];
//! - [`scenario`]: a cluster whose first pod drains and hands its sessions off, for faults
//!   injected around the move;
//! - [`relay`]: a TCP relay that cuts every connection on demand (for clients we do not control),
//!   or refuses connections for a while (a pod's port unavailable);
//! - [`tap`]: a relay in front of a plaintext peer port that records each request passing and can
//!   withhold answers (to replay a captured message, to lose an acknowledgement);
//! - [`trickle`]: slow connections that send their bytes one at a time (slow-loris clients);
//! - [`stand_in`]: something in the membership that is no sidecar and answers 200 to everything;
//! - [`addr`]: unique loopback addresses per test;
//! - [`repo`]: files of this repository, for the tests that check them;
//! - [`table`]: the plain-text tables the reports print.

pub mod addr;
pub mod auth;
pub mod bins;
pub mod call;
pub mod client;
pub mod clock;
pub mod cluster;
pub mod conformance;
pub mod follow;
pub mod incident;
pub mod keyring;
pub mod kube_api;
pub mod load;
pub mod modern;
pub mod pod;
pub mod relay;
pub mod repo;
pub mod rollout;
pub mod scenario;
pub mod serve;
pub mod stand_in;
pub mod table;
pub mod tap;
pub mod trickle;

/// Errors of the harness.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A binary of the workspace is missing.
    #[error(
        "{0} not found in {1}: build the workspace binaries first (cargo build --workspace --bins)"
    )]
    MissingBinary(String, String),
    /// The virtualenv of the Python SDK fixture is missing or incomplete.
    #[error(
        "{0} is not a complete virtualenv of the Python SDK fixture: create it first (make python-sdk)"
    )]
    MissingPythonSdk(String),
    /// The official conformance suite or its Node.js is not installed.
    #[error(
        "the MCP conformance suite is not installed in {0}: install it first (make conformance)"
    )]
    MissingConformance(String),
    /// A process could not be started or did not become ready.
    #[error("{0}")]
    Start(String),
    /// An HTTP exchange failed.
    #[error("http: {0}")]
    Http(String),
    /// The connection of an HTTP exchange failed before any response headers: refused, reset
    /// or closed (the server it went to is gone, say).
    #[error("http: {0}")]
    Connection(String),
    /// A peer answered something unexpected.
    #[error("protocol: {0}")]
    Protocol(String),
    /// A peer answered with a status the exchange does not expect.
    #[error("{what} answered {status}: {body:.200}")]
    Status {
        /// The exchange, e.g. `initialize` or `tools/call counter`.
        what: String,
        /// The status.
        status: http::StatusCode,
        /// The body, as text.
        body: String,
    },
    /// I/O failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl HarnessError {
    /// Whether a peer answered 404 Not Found: the session is gone (spec S-05).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Status { status, .. } if *status == http::StatusCode::NOT_FOUND)
    }
}

/// Result of the harness.
pub type Result<T, E = HarnessError> = std::result::Result<T, E>;

/// Reads a value with `read` every `every` until `done` holds for it or `within` passed;
/// returns the last value read (the caller asserts on it).
async fn poll<T, F>(
    within: std::time::Duration,
    every: std::time::Duration,
    mut read: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> Result<T>
where
    F: Future<Output = Result<T>>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        let value = read().await?;
        if done(&value) || std::time::Instant::now() > deadline {
            return Ok(value);
        }
        tokio::time::sleep(every).await;
    }
}

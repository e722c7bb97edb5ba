//! The sidecar's runtime configuration: the endpoint manifest plus flags, checked once at
//! start-up. Anything wrong is a [`ConfigError`] naming the manifest field or the flag.

pub(crate) mod cli;
pub(crate) mod metrics;
pub(crate) mod reload;

use std::net::SocketAddr;

use http::Uri;
use tether_crds::{McpEndpointSpec, PodSettings, ProtocolVersion, load_manifest, validate_spec};

use std::sync::Arc;

use crate::broker::metrics::BrokerMetrics;
use crate::broker::{Broker, BrokerConfig};
use crate::cluster::membership::Snapshot;
use crate::cluster::membership::peers_file::{self, valid_uid};
use crate::cluster::membership::reports::{MAX_REVISION, valid_revision};
use crate::config::cli::Cli;
use crate::keys::{KeyError, KeyRing};
use crate::mcp::admission::AdmissionPolicy;
use crate::mcp::home::HomeToken;
use crate::mcp::jsonrpc::EnvelopeLimits;
use crate::mcp::origin::OriginPolicy;
use crate::mcp::session_id::IdMinter;
use crate::retained::Retained;
use crate::session::Registry;
use crate::stream::buffer::BufferLimits;
use crate::upstream::Upstream;

/// Consecutive failed upstream stream resumes before a stream is given up.
pub(crate) const UPSTREAM_RESUME_ATTEMPTS: u32 = 5;

/// Why the sidecar cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The McpEndpoint manifest is unreadable or invalid.
    #[error(transparent)]
    Manifest(#[from] tether_crds::ManifestError),
    /// The key ring is unreadable, too short or its TLS files do not fit together.
    #[error(transparent)]
    Keys(#[from] KeyError),
    /// `spec.peer.tls` is on and the key ring holds no TLS files.
    #[error(
        "spec.peer.tls is true but the key ring has no tls.crt, tls.key and ca.crt: give \
         --secret-dir the endpoint's Secret (or `tether-sidecar keygen DIR`), or set \
         spec.peer.tls: false"
    )]
    NoPeerTls,
    /// `--upstream` is not `http://host:port[/path]` or `host:port`.
    #[error("--upstream {0:?}: expected http://host:port[/path] or host:port")]
    Upstream(String),
    /// A listener address cannot be bound (in use, or not an address of this host).
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The drain socket cannot be created (its directory is missing or not writable).
    #[error(
        "cannot listen on the drain socket {} (--drain-socket): {source}; give the sidecar a writable directory of its own there",
        path.display()
    )]
    DrainSocket {
        /// The socket's path.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A flag has an unusable value.
    #[error("{flag}: {message}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// Where the sidecar learns about its peers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipConfig {
    /// No peers: this pod is the endpoint.
    Alone,
    /// A static peers file and the membership read from it at start-up.
    PeersFile(std::path::PathBuf, Snapshot),
    /// A watch of the endpoint's peer Service's EndpointSlices.
    Kubernetes {
        /// Namespace of the Service.
        namespace: String,
        /// The peer Service (`--peer-service`).
        service: String,
    },
}

/// Everything the sidecar needs to run.
#[derive(Debug)]
pub struct Config {
    /// Endpoint name (`metadata.name`), for logs.
    pub(crate) endpoint: String,
    /// Where the MCP listener binds.
    pub listen_addr: SocketAddr,
    /// Where the admin listener binds.
    pub admin_addr: SocketAddr,
    /// Where the peer (handoff) listener binds; peers' listeners use the same port.
    pub peer_addr: SocketAddr,
    /// Whether draining hands sessions to peers (`--handoff` and `spec.session.migration`).
    pub(crate) handoff: bool,
    /// Largest peer-protocol message, in bytes.
    pub(crate) peer_max_message_bytes: usize,
    /// The upstream MCP endpoint.
    pub(crate) upstream: Uri,
    /// `Host` of every request to the MCP server: `spec.upstream.host`, else the authority of
    /// [`Config::upstream`].
    pub(crate) upstream_host: String,
    /// Idle connections to the MCP server kept for reuse (`--upstream-max-idle-connections`).
    pub(crate) upstream_max_idle: usize,
    /// Admission settings.
    pub(crate) admission: AdmissionPolicy,
    /// Broker settings.
    pub(crate) broker: BrokerConfig,
    /// The endpoint's key ring.
    pub(crate) keys: KeyRing,
    /// Whether sidecar-to-sidecar traffic is mutual TLS (`spec.peer.tls`).
    pub(crate) peer_tls: bool,
    /// This pod's UID.
    pub(crate) pod_uid: String,
    /// This pod's revision (`--revision`), reported to its peers.
    pub(crate) revision: String,
    /// Most sessions held.
    pub(crate) max_sessions: usize,
    /// Most sessions of one principal (`--max-principal-sessions`).
    pub(crate) max_principal_sessions: usize,
    /// The pod's byte budget for everything its sessions retain (`--pod-retained-bytes`).
    pub(crate) pod_retained_bytes: u64,
    /// Each session's share of buffered event data (`--max-session-buffer-bytes`).
    pub(crate) max_session_buffer_bytes: u64,
    /// What one principal's sessions pin at most (`--max-principal-retained-bytes`).
    pub(crate) max_principal_retained_bytes: u64,
    /// Request body deadline.
    pub(crate) request_timeout: std::time::Duration,
    /// Request head deadline: a connection's first from its accept, a later one from its first
    /// byte (`--header-timeout`).
    pub(crate) header_timeout: std::time::Duration,
    /// Longest wait of one write to a client (`--client-write-timeout`).
    pub(crate) client_write_timeout: std::time::Duration,
    /// Most open client connections of the MCP listener (`--max-connections`).
    pub(crate) max_connections: usize,
    /// Most open connections from one source address (`spec.listen.maxConnectionsPerSource`,
    /// else `--max-connections-per-source`).
    pub(crate) max_connections_per_source: usize,
    /// Most open connections of the admin listener (`--admin-max-connections`).
    pub(crate) admin_max_connections: usize,
    /// Most open admin connections from one source address
    /// (`--admin-max-connections-per-source`).
    pub(crate) admin_max_connections_per_source: usize,
    /// Most idle pooled connections to peers and the MCP server (`--peer-pool-size`).
    pub(crate) peer_pool_size: usize,
    /// Most requests at once on one HTTP/2 connection between sidecars (`--peer-max-streams`).
    pub(crate) peer_max_streams: u32,
    /// `spec.drain.timeout`: the grace period of a shutdown.
    pub(crate) drain_timeout: std::time::Duration,
    /// `spec.drain.shutdownDelay`: how long after the drain began the listeners stay open.
    pub(crate) shutdown_delay: std::time::Duration,
    /// The Unix socket that takes the request to drain (`--drain-socket`).
    pub drain_socket: std::path::PathBuf,
    /// Listener threads.
    pub(crate) threads: usize,
    /// The membership source.
    pub membership: MembershipConfig,
    /// How often the endpoint file is checked for changes (`--config-poll`).
    pub(crate) config_poll: std::time::Duration,
    /// How long membership may go unconfirmed before lookups of sessions found nowhere get 503
    /// (`--membership-stale-after`).
    pub(crate) membership_stale_after: std::time::Duration,
    /// How long a pod is routable before adopted sessions follow it (`--rebalance-dwell`).
    pub(crate) rebalance_dwell: std::time::Duration,
    /// What a reload of the endpoint file needs.
    pub source: ConfigSource,
}

impl Config {
    /// The pod's client of its MCP server (`upstream`, its `Host`, the body timeout, the idle
    /// connections kept).
    pub(crate) fn upstream_client(&self) -> Upstream {
        Upstream::new(
            self.upstream.clone(),
            &self.upstream_host,
            self.broker.upstream_body_timeout,
            self.upstream_max_idle,
        )
    }

    /// The pod's broker: its settings, session ids minted for this pod, its client of the
    /// upstream, its registry within the pod's bounds, and the pod's metrics.
    pub(crate) fn broker_of(&self, upstream: Upstream, metrics: Arc<BrokerMetrics>) -> Arc<Broker> {
        Broker::new(
            self.broker.clone(),
            IdMinter::new(self.keys.clone(), HomeToken::for_pod(&self.pod_uid)),
            upstream,
            Registry::new(
                self.max_sessions,
                Retained::with_shares(
                    self.pod_retained_bytes,
                    self.max_session_buffer_bytes.min(self.pod_retained_bytes),
                    self.max_principal_retained_bytes,
                ),
            )
            .with_max_principal_sessions(self.max_principal_sessions),
            metrics,
        )
    }

    /// Loads the manifest and secret and combines them with the flags.
    ///
    /// # Errors
    /// [`ConfigError`] naming the field or flag at fault.
    pub fn load(cli: &Cli) -> Result<Self, ConfigError> {
        let endpoint = load_manifest(&cli.endpoint)?;
        let spec = &match &cli.pod_settings {
            None => endpoint.spec.clone(),
            Some(json) => own_pod_settings(&endpoint.spec, json)?,
        };
        let keys = match (&cli.secret_dir, &cli.secret_file) {
            (Some(dir), _) => KeyRing::from_dir(dir)?,
            (None, Some(file)) => KeyRing::from_file(file)?,
            (None, None) => {
                return Err(ConfigError::Flag {
                    flag: "--secret-dir",
                    message: "the key ring is required (or --secret-file)".into(),
                });
            }
        };
        let peer_tls = spec.peer.tls;
        if peer_tls && keys.load().tls().is_none() {
            return Err(ConfigError::NoPeerTls);
        }
        let upstream = match &cli.upstream {
            Some(u) => parse_upstream(u, &spec.upstream.path)?,
            None => format!(
                "http://127.0.0.1:{}{}",
                spec.upstream.port, spec.upstream.path
            )
            .parse()
            .map_err(|_| ConfigError::Upstream(spec.upstream.path.clone()))?,
        };
        for (flag, value) in [
            ("--max-sessions", cli.max_sessions),
            ("--max-principal-sessions", cli.max_principal_sessions),
            ("--max-request-bytes", cli.max_request_bytes),
            ("--threads", cli.threads),
            ("--peer-max-message-bytes", cli.peer_max_message_bytes),
            ("--max-connections", cli.max_connections),
            ("--admin-max-connections", cli.admin_max_connections),
            ("--max-session-calls", cli.max_session_calls),
            ("--max-principal-calls", cli.max_principal_calls),
            ("--max-calls", cli.max_calls()),
            ("--peer-pool-size", cli.peer_pool_size),
            ("--peer-max-streams", cli.peer_max_streams as usize),
            ("--max-event-bytes", cli.max_event_bytes),
        ] {
            if value == 0 {
                return Err(ConfigError::Flag {
                    flag,
                    message: "must be at least 1".into(),
                });
            }
        }
        if !valid_uid(&cli.pod_uid) {
            return Err(ConfigError::Flag {
                flag: "--pod-uid",
                message: "must be non-empty visible ASCII without ','".into(),
            });
        }
        let revision = cli.revision.clone().unwrap_or_default();
        if !valid_revision(&revision) {
            return Err(ConfigError::Flag {
                flag: "--revision",
                message: format!(
                    "must be at most {MAX_REVISION} characters of A-Z a-z 0-9 - _ . (a label value)"
                ),
            });
        }
        let membership = match (&cli.peers_file, &cli.peer_service) {
            (Some(path), _) => MembershipConfig::PeersFile(
                path.clone(),
                peers_file::load(path).map_err(|e| ConfigError::Flag {
                    flag: "--peers-file",
                    message: e.to_string(),
                })?,
            ),
            (None, Some(service)) => MembershipConfig::Kubernetes {
                namespace: cli.namespace.clone(),
                service: service.clone(),
            },
            (None, None) => MembershipConfig::Alone,
        };
        let source = ConfigSource {
            path: cli.endpoint.clone(),
            started_with: spec.clone(),
            cli: cli.clone(),
        };
        Ok(Self {
            endpoint: endpoint.metadata.name.clone().unwrap_or_default(),
            listen_addr: SocketAddr::new(cli.pod_ip, spec.listen.port),
            admin_addr: SocketAddr::new(cli.pod_ip, spec.admin.port),
            peer_addr: SocketAddr::new(cli.pod_ip, spec.peer.port),
            handoff: cli.handoff && spec.session.migration == tether_crds::Migration::Replay,
            peer_max_message_bytes: cli.peer_max_message_bytes,
            upstream_host: spec.upstream.host.clone().unwrap_or_else(|| {
                upstream
                    .authority()
                    .map(|a| a.as_str().to_owned())
                    .unwrap_or_default()
            }),
            upstream,
            upstream_max_idle: cli.upstream_max_idle_connections,
            admission: source.admission(spec),
            broker: source.broker(spec),
            keys,
            peer_tls,
            pod_uid: cli.pod_uid.clone(),
            revision,
            max_sessions: cli.max_sessions,
            max_principal_sessions: cli.max_principal_sessions,
            pod_retained_bytes: cli.pod_retained_bytes(),
            max_session_buffer_bytes: cli.max_session_buffer_bytes,
            max_principal_retained_bytes: cli.max_principal_retained_bytes(),
            request_timeout: cli.request_timeout,
            header_timeout: cli.header_timeout,
            client_write_timeout: cli.client_write_timeout,
            max_connections: cli.max_connections,
            max_connections_per_source: spec
                .listen
                .max_connections_per_source
                .map_or(cli.max_connections_per_source, |n| n as usize),
            admin_max_connections: cli.admin_max_connections,
            admin_max_connections_per_source: cli.admin_max_connections_per_source,
            peer_pool_size: cli.peer_pool_size,
            peer_max_streams: cli.peer_max_streams,
            drain_timeout: spec.drain.timeout.into(),
            shutdown_delay: spec.drain.shutdown_delay.into(),
            drain_socket: cli.drain_socket.clone(),
            threads: cli.threads,
            membership,
            config_poll: cli.config_poll,
            membership_stale_after: cli.membership_stale_after,
            rebalance_dwell: cli.rebalance_dwell,
            source,
        })
    }
}

/// What reloading the endpoint file needs (`config/reload.rs`): the file, the spec the
/// sidecar started with (its pod settings stay in force) and the flags.
#[derive(Clone, Debug)]
pub struct ConfigSource {
    /// The endpoint file (`--endpoint`; in Kubernetes the operator's ConfigMap).
    pub(crate) path: std::path::PathBuf,
    /// The spec read at start-up.
    pub started_with: McpEndpointSpec,
    cli: Cli,
}

impl ConfigSource {
    /// Admission settings for `spec` under these flags.
    pub(crate) fn admission(&self, spec: &McpEndpointSpec) -> AdmissionPolicy {
        AdmissionPolicy {
            path: spec.listen.path.clone(),
            origins: OriginPolicy::new(&spec.origins.allow, spec.origins.allow_missing),
            versions: versions(spec),
            max_body_bytes: self.cli.max_request_bytes,
            envelope: EnvelopeLimits {
                max_batch: self.cli.max_batch,
            },
        }
    }

    /// Broker settings for `spec` under these flags.
    pub(crate) fn broker(&self, spec: &McpEndpointSpec) -> BrokerConfig {
        broker_config(spec, &self.cli)
    }
}

/// `spec` with the pod settings of `--pod-settings` (the pod's annotation).
fn own_pod_settings(spec: &McpEndpointSpec, json: &str) -> Result<McpEndpointSpec, ConfigError> {
    let flag = |message: String| ConfigError::Flag {
        flag: "--pod-settings",
        message,
    };
    let settings = PodSettings::parse(json).map_err(|e| flag(e.to_string()))?;
    let spec = spec.with_pod_settings(&settings);
    let errors = validate_spec(&spec);
    if !errors.is_empty() {
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        return Err(flag(messages.join("; ")));
    }
    Ok(spec)
}

/// The protocol versions of `spec.protocolVersions` the sidecar knows, in the spec's order.
pub(crate) fn versions(spec: &McpEndpointSpec) -> Vec<ProtocolVersion> {
    spec.protocol_versions
        .iter()
        .filter_map(|v| ProtocolVersion::parse(v))
        .collect()
}

fn broker_config(spec: &McpEndpointSpec, cli: &Cli) -> BrokerConfig {
    BrokerConfig {
        versions: versions(spec),
        buffer: BufferLimits {
            max_events: spec.buffer.max_events as usize,
            max_bytes: spec.buffer.max_bytes,
            ttl: spec.buffer.ttl.into(),
            unread_ttl: cli.unread_ttl.min(spec.buffer.ttl.into()),
        },
        idle_timeout: spec.session.idle_timeout.into(),
        reloaded_at: None,
        keep_alive: cli.keep_alive,
        max_upstream_body_bytes: usize::try_from(spec.buffer.max_bytes)
            .unwrap_or(usize::MAX)
            .max(cli.max_request_bytes),
        upstream_body_timeout: cli.upstream_timeout,
        upstream_retry: cli.upstream_retry,
        rebuild_retry_for: cli.rebuild_retry_for,
        upstream_resume_attempts: UPSTREAM_RESUME_ATTEMPTS,
        migration: spec.session.migration,
        replication: spec.session.replication,
        write_ahead: spec.session.write_ahead,
        resume_budget: std::num::NonZeroU32::new(cli.resume_budget),
        max_initialize_bytes: cli.max_initialize_bytes,
        max_journal_bytes: cli.max_journal_bytes,
        max_session_retry_bytes: cli.max_session_retry_bytes,
        retry_window: crate::session::RetryWindow {
            requests: cli.retry_window as usize,
            bytes: cli.retry_window_bytes,
            ttl: spec.buffer.ttl.into(),
        },
        forward_headers: spec
            .auth
            .forward_headers
            .iter()
            .filter_map(|name| http::HeaderName::from_bytes(name.as_bytes()).ok())
            .collect(),
        binding: spec.auth.binding,
        revalidate: spec.auth.revalidate.into(),
        forward_origin: spec.upstream.forward_origin,
        max_takeovers: std::num::NonZeroU32::new(cli.max_takeovers),
        tasks: crate::broker::TaskLimits {
            max_open: cli.max_open_tasks,
            per_owner: cli.max_principal_open_tasks,
            poll_window: cli.task_poll_window,
        },
        calls: crate::broker::CallLimits {
            session: cli.max_session_calls,
            principal: cli.max_principal_calls,
            pod: cli.max_calls(),
        },
        max_upstream_deletes: cli.max_upstream_deletes as usize,
        write_ahead_max_tools: cli.write_ahead_max_tools,
        // The buffer keeps a stream's newest event even over its own bounds: one event must fit
        // in the pod's budget.
        max_event_bytes: cli
            .max_event_bytes
            .min(usize::try_from(cli.pod_retained_bytes()).unwrap_or(usize::MAX)),
    }
}

/// Parses `--upstream`: `http://host:port[/path]` or `host:port` (path from the spec).
fn parse_upstream(value: &str, default_path: &str) -> Result<Uri, ConfigError> {
    let err = || ConfigError::Upstream(value.to_owned());
    let with_scheme = if value.contains("://") {
        value.to_owned()
    } else {
        format!("http://{value}")
    };
    let uri: Uri = with_scheme.parse().map_err(|_| err())?;
    if uri.scheme_str() != Some("http") || uri.port_u16().is_none() || uri.host().is_none() {
        return Err(err());
    }
    let path = match uri.path() {
        "" | "/" if !value.ends_with('/') => default_path,
        p => p,
    };
    format!(
        "http://{}{}",
        uri.authority().map(|a| a.as_str()).unwrap_or_default(),
        path
    )
    .parse()
    .map_err(|_| err())
}

/// A test pod's flags: the endpoint file `dir/endpoint.yaml` (written by the test), a key ring
/// written to `dir/keys`, pod IP 127.0.0.1, UID `pod-a`, then `extra`.
#[cfg(test)]
pub(crate) fn test_cli(dir: &std::path::Path, extra: &[&str]) -> Cli {
    use clap::Parser;
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let generation = tether_crds::keyring::Generation::new("test/endpoint").unwrap();
    for (name, bytes) in generation.files() {
        std::fs::write(keys.join(name), bytes).unwrap();
    }
    let endpoint = dir.join("endpoint.yaml");
    let mut args = vec![
        "tether-sidecar".to_owned(),
        format!("--endpoint={}", endpoint.display()),
        format!("--secret-dir={}", keys.display()),
        "--pod-ip=127.0.0.1".to_owned(),
        "--pod-uid=pod-a".to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    Cli::try_parse_from(args).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_flag_forms() {
        assert_eq!(
            parse_upstream("127.0.0.1:3000", "/mcp").unwrap(),
            "http://127.0.0.1:3000/mcp"
        );
        assert_eq!(
            parse_upstream("http://127.0.0.2:4000/other", "/mcp").unwrap(),
            "http://127.0.0.2:4000/other"
        );
        assert_eq!(
            parse_upstream("http://localhost:4000", "/mcp").unwrap(),
            "http://localhost:4000/mcp"
        );
        for bad in ["https://x:1/mcp", "nohost", "http://x/mcp", "ftp://x:1"] {
            assert!(parse_upstream(bad, "/mcp").is_err(), "{bad}");
        }
    }

    /// A directory holding `endpoint.yaml`: the smallest endpoint (`w`, its target `w`).
    fn minimal_endpoint_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("endpoint.yaml"),
            "apiVersion: mcp.tether.dev/v1alpha1\nkind: McpEndpoint\nmetadata: {name: w}\nspec:\n  targetRef: {kind: Deployment, name: w}\n",
        )
        .unwrap();
        dir
    }

    #[test]
    fn pod_settings_override_the_file_and_are_checked() {
        let dir = minimal_endpoint_dir();
        let file = dir.path().join("endpoint.yaml");
        let load =
            |settings: &str| Config::load(&test_cli(dir.path(), &["--pod-settings", settings]));
        let mut own = tether_crds::parse_manifest(&std::fs::read_to_string(&file).unwrap())
            .unwrap()
            .spec;
        own.listen.port = 8181;
        own.drain.timeout = "7s".parse().unwrap();
        own.drain.shutdown_delay = "2s".parse().unwrap();
        let cfg = load(&own.pod_settings().annotation()).unwrap();
        assert_eq!(cfg.listen_addr.port(), 8181);
        assert_eq!(cfg.drain_timeout, std::time::Duration::from_secs(7));
        assert_eq!(cfg.shutdown_delay, std::time::Duration::from_secs(2));
        assert_eq!(cfg.source.started_with.pod_settings(), own.pod_settings());
        for bad in ["{not json", "{\"listen\": 1}"] {
            let err = load(bad).unwrap_err().to_string();
            assert!(err.starts_with("--pod-settings: "), "{err}");
        }
        own.admin.port = own.listen.port;
        let err = load(&own.pod_settings().annotation())
            .unwrap_err()
            .to_string();
        assert!(err.contains("spec.admin.port"), "{err}");
    }

    #[test]
    fn the_endpoint_sets_the_per_source_connection_bound_over_the_flag() {
        let dir = minimal_endpoint_dir();
        let file = dir.path().join("endpoint.yaml");
        let bound = |extra: &[&str]| {
            Config::load(&test_cli(dir.path(), extra))
                .unwrap()
                .max_connections_per_source
        };
        assert_eq!(bound(&[]), 1024);
        assert_eq!(bound(&["--max-connections-per-source", "7"]), 7);
        let mut own = tether_crds::parse_manifest(&std::fs::read_to_string(&file).unwrap())
            .unwrap()
            .spec;
        own.listen.max_connections_per_source = Some(0);
        let settings = own.pod_settings().annotation();
        assert_eq!(
            bound(&[
                "--max-connections-per-source",
                "7",
                "--pod-settings",
                &settings
            ]),
            0,
            "spec.listen.maxConnectionsPerSource wins; 0: no per-source bound"
        );
    }

    #[test]
    fn the_revision_must_read_as_a_label_value() {
        let dir = minimal_endpoint_dir();
        let load = |extra: &[&str]| Config::load(&test_cli(dir.path(), extra));
        assert_eq!(load(&[]).unwrap().revision, "");
        assert_eq!(
            load(&["--revision", "5d8f7c9b6"]).unwrap().revision,
            "5d8f7c9b6"
        );
        let too_long = "a".repeat(MAX_REVISION + 1);
        for bad in ["5d8f 7c9b6", "r1\nforged", too_long.as_str()] {
            let err = load(&["--revision", bad]).unwrap_err().to_string();
            assert!(err.starts_with("--revision: "), "{err}");
        }
    }

    #[test]
    fn an_upstream_event_may_be_at_most_the_pod_buffer() {
        let dir = minimal_endpoint_dir();
        let event_limit = |extra: &[&str]| {
            Config::load(&test_cli(dir.path(), extra))
                .unwrap()
                .broker
                .max_event_bytes
        };
        assert_eq!(event_limit(&[]), 4 << 20);
        assert_eq!(event_limit(&["--pod-buffer-bytes", "20000"]), 20000);
        assert_eq!(event_limit(&["--max-event-bytes", "100"]), 100);
        assert!(Config::load(&test_cli(dir.path(), &["--max-event-bytes", "0"])).is_err());
    }

    #[test]
    fn calls_and_principal_shares_follow_the_flags_else_the_memory_limit_and_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let cli = |extra: &[&str]| test_cli(dir.path(), extra);
        assert_eq!(cli(&[]).max_calls(), 4096);
        assert_eq!(
            cli(&["--memory-limit", "268435456"]).max_calls(),
            655,
            "a quarter of 256 MiB in calls of 100 KiB"
        );
        let both = ["--memory-limit", "268435456", "--max-calls", "10"];
        assert_eq!(cli(&both).max_calls(), 10);
        assert_eq!(cli(&[]).max_principal_retained_bytes(), 32 << 20);
        assert_eq!(
            cli(&["--pod-retained-bytes", "1000"]).max_principal_retained_bytes(),
            250
        );
        let flag = ["--max-principal-retained-bytes", "7"];
        assert_eq!(cli(&flag).max_principal_retained_bytes(), 7);
    }

    #[test]
    fn the_pod_budget_is_the_flag_else_half_the_memory_limit_else_128_mib() {
        let dir = tempfile::tempdir().unwrap();
        let budget = |extra: &[&str]| test_cli(dir.path(), extra).pod_retained_bytes();
        assert_eq!(budget(&[]), 128 << 20);
        assert_eq!(budget(&["--memory-limit", "268435456"]), 128 << 20);
        assert_eq!(budget(&["--memory-limit", "1073741824"]), 512 << 20);
        let both = [
            "--memory-limit",
            "1073741824",
            "--pod-retained-bytes",
            "1000",
        ];
        assert_eq!(budget(&both), 1000);
        assert_eq!(
            budget(&["--pod-buffer-bytes", "2000"]),
            2000,
            "the older name of the flag"
        );
    }
}

//! Reloading the endpoint file while the sidecar runs.
//!
//! In Kubernetes the file is the operator's ConfigMap: on a data-plane change of the
//! McpEndpoint the operator rewrites only the ConfigMap, the kubelet swaps the mounted file
//! (within its sync period, about a minute) and every sidecar picks the change up here, without
//! a restart. Every `--config-poll` the [`Reloader`] reads the file; when its bytes changed it
//! parses and validates it as at start-up, then:
//!
//! - applies the reloadable fields (`tether_crds::reload`: origins, protocol versions, buffer
//!   bounds, idle timeout) to admission and to the broker — requests admitted from then on see
//!   them, buffer bounds apply to streams opened from then on, and a shortened idle timeout
//!   counts from the reload (sessions do not all expire at once);
//! - keeps the pod settings it started with (ports, paths, upstream, migration, drain; in
//!   Kubernetes those of its own pod's annotation, `--pod-settings`): the
//!   operator rolls the pods for those, and until this pod restarts the change is reported as
//!   pending (`tether_config_restart_pending` 1, a warning naming the fields);
//! - keeps everything in force when the file is unreadable or invalid (a warning with the
//!   reason, once per distinct content).
//!
//! Outcomes are counted in `tether_config_reloads_total{result}`.

use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tether_crds::{McpEndpointSpec, parse_manifest};

use crate::broker::{Broker, BrokerConfig};
use crate::config::ConfigSource;
use crate::config::metrics::{ConfigMetrics, ConfigReload};
use crate::mcp::admission::AdmissionPolicy;

/// What one check of the endpoint file found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reload {
    /// The file is as last seen (or back to the settings in force).
    Unchanged,
    /// The reloadable fields were applied. `restart_pending` names the pod settings (spec
    /// paths such as `spec.listen`) the file changes that only a restart applies; empty when
    /// none.
    Applied {
        /// Pod settings that differ from the running ones.
        restart_pending: Vec<&'static str>,
    },
    /// The file does not hold a valid McpEndpoint; the settings in force stay. The message
    /// names the field.
    Invalid(String),
    /// The file cannot be read; the settings in force stay.
    Unreadable(String),
}

impl Reload {
    /// The `result` label of `tether_config_reloads_total` (`None`: nothing to count).
    fn result(&self) -> Option<ConfigReload> {
        match self {
            Reload::Unchanged => None,
            Reload::Applied { .. } => Some(ConfigReload::Applied),
            Reload::Invalid(_) => Some(ConfigReload::Invalid),
            Reload::Unreadable(_) => Some(ConfigReload::Unreadable),
        }
    }
}

/// The content last read, or why it could not be read.
type Seen = Result<Vec<u8>, String>;

struct State {
    last: Option<Seen>,
    /// The newest valid spec read from the file (at first, the one the sidecar started with).
    newest: McpEndpointSpec,
}

/// Watches the endpoint file and applies its reloadable fields (see the module docs).
pub(crate) struct Reloader {
    source: ConfigSource,
    admission: Arc<ArcSwap<AdmissionPolicy>>,
    broker: Arc<Broker>,
    metrics: Arc<ConfigMetrics>,
    state: Mutex<State>,
}

impl Reloader {
    /// A reloader of `source`'s file that updates `admission` (read by the proxy per request)
    /// and `broker`, counting outcomes in `metrics`.
    pub(crate) fn new(
        source: ConfigSource,
        admission: Arc<ArcSwap<AdmissionPolicy>>,
        broker: Arc<Broker>,
        metrics: Arc<ConfigMetrics>,
    ) -> Self {
        let newest = source.started_with.clone();
        Self {
            source,
            admission,
            broker,
            metrics,
            state: Mutex::new(State { last: None, newest }),
        }
    }

    /// Reads the file once and applies what changed; see [`Reload`].
    pub(crate) fn check(&self) -> Reload {
        let seen: Seen = std::fs::read(&self.source.path).map_err(|e| e.to_string());
        let mut state = self.state.lock();
        if state.last.as_ref() == Some(&seen) {
            return Reload::Unchanged;
        }
        state.last = Some(seen.clone());
        let bytes = match seen {
            Ok(bytes) => bytes,
            Err(e) => {
                return Reload::Unreadable(format!(
                    "cannot read {}: {e}",
                    self.source.path.display()
                ));
            }
        };
        let newer = match std::str::from_utf8(&bytes)
            .map_err(|e| format!("not UTF-8: {e}"))
            .and_then(|text| parse_manifest(text).map_err(|e| e.to_string()))
        {
            Ok(endpoint) => endpoint.spec,
            Err(e) => return Reload::Invalid(e),
        };
        if newer == state.newest {
            return Reload::Unchanged;
        }
        let started = &self.source.started_with;
        let effective = started.with_reloaded_from(&newer);
        self.admission
            .store(Arc::new(self.source.admission(&effective)));
        self.broker.reconfigure(BrokerConfig {
            reloaded_at: Some(std::time::Instant::now()),
            ..self.source.broker(&effective)
        });
        let restart_pending = started.pod_settings().differences(&newer.pod_settings());
        state.newest = newer;
        Reload::Applied { restart_pending }
    }

    /// [`Reloader::check`], then logs and counts the outcome.
    pub(crate) fn poll(&self) {
        let outcome = self.check();
        if let Some(result) = outcome.result() {
            self.metrics.config_reload(result);
        }
        let path = self.source.path.display();
        match outcome {
            Reload::Unchanged => {}
            Reload::Applied { restart_pending } => {
                self.metrics.restart_pending(!restart_pending.is_empty());
                tracing::info!(file = %path, "endpoint file reloaded: origins, protocol versions, buffer bounds and idle timeout in force");
                if !restart_pending.is_empty() {
                    tracing::warn!(file = %path, fields = ?restart_pending, "endpoint file changes settings that take effect when the pod restarts; the running ones stay");
                }
            }
            Reload::Invalid(e) | Reload::Unreadable(e) => {
                tracing::warn!(file = %path, error = %e, "endpoint file not reloaded; the settings in force stay");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use http::{HeaderMap, HeaderValue, header};

    use super::*;
    use crate::config::{Config, test_cli};
    use crate::mcp::origin::OriginCheck;
    use crate::metrics::Metrics;

    const HEAD: &str = "apiVersion: mcp.tether.dev/v1alpha1\nkind: McpEndpoint\nmetadata: {name: weather}\nspec:\n  targetRef: {kind: Deployment, name: weather}\n";

    fn write(path: &Path, spec: &str) {
        std::fs::write(path, format!("{HEAD}{spec}")).unwrap();
    }

    fn origin(policy: &AdmissionPolicy, value: &'static str) -> bool {
        let mut headers = HeaderMap::new();
        headers.insert(header::ORIGIN, HeaderValue::from_static(value));
        matches!(policy.origins.check(&headers), OriginCheck::Allowed(_))
    }

    #[test]
    fn reloads_data_plane_fields_and_keeps_pod_settings() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("endpoint.yaml");
        write(&file, "  origins: {allow: [\"https://a.example\"]}\n");
        let cfg = Config::load(&test_cli(dir.path(), &[])).unwrap();
        let metrics = Metrics::new();
        let upstream = cfg.upstream_client();
        let broker = cfg.broker_of(upstream, Arc::clone(&metrics.broker));
        let admission = Arc::new(ArcSwap::from_pointee(cfg.admission.clone()));
        let reloader = Reloader::new(
            cfg.source.clone(),
            Arc::clone(&admission),
            broker.clone(),
            Arc::clone(&metrics.config),
        );

        // The file as the sidecar started with it.
        assert_eq!(reloader.check(), Reload::Unchanged);
        assert!(origin(&admission.load(), "https://a.example"));

        // A data-plane change: applied in place, nothing pending.
        write(
            &file,
            "  origins: {allow: [\"https://b.example\"]}\n  protocolVersions: [\"2025-06-18\"]\n  buffer: {maxEvents: 7}\n  session: {idleTimeout: 1m}\n",
        );
        assert_eq!(
            reloader.check(),
            Reload::Applied {
                restart_pending: vec![]
            }
        );
        let policy = admission.load();
        assert!(origin(&policy, "https://b.example"));
        assert!(!origin(&policy, "https://a.example"));
        assert_eq!(policy.versions, [tether_crds::ProtocolVersion::V2025_06_18]);
        let settings = broker.cfg();
        assert_eq!(settings.buffer.max_events, 7);
        assert_eq!(settings.idle_timeout, std::time::Duration::from_secs(60));
        assert_eq!(settings.versions, policy.versions);
        assert!(
            settings.reloaded_at.is_some(),
            "idle time counts from the reload"
        );
        assert_eq!(reloader.check(), Reload::Unchanged, "same bytes again");

        // A pod setting: reported, not applied; the reloadable part still is.
        write(
            &file,
            "  origins: {allow: [\"https://c.example\"]}\n  listen: {port: 9000, path: /other}\n  session: {migration: Pin}\n",
        );
        assert_eq!(
            reloader.check(),
            Reload::Applied {
                restart_pending: vec!["spec.listen", "spec.session.migration"]
            }
        );
        let policy = admission.load();
        assert!(origin(&policy, "https://c.example"));
        assert_eq!(policy.path, "/mcp", "the listener keeps its path");
        assert_eq!(broker.cfg().migration, tether_crds::Migration::Replay);
        let default = tether_crds::BufferSpec::default().max_events as usize;
        assert_eq!(
            broker.cfg().buffer.max_events,
            default,
            "back to the default"
        );

        // Invalid or missing files change nothing and are reported once.
        write(&file, "  buffer: {maxEvents: 0}\n");
        let Reload::Invalid(message) = reloader.check() else {
            panic!("an invalid file must be reported")
        };
        assert!(message.contains("spec.buffer.maxEvents"), "{message}");
        assert_eq!(reloader.check(), Reload::Unchanged);
        assert!(origin(&admission.load(), "https://c.example"));
        std::fs::remove_file(&file).unwrap();
        assert!(matches!(reloader.check(), Reload::Unreadable(_)));
        assert_eq!(reloader.check(), Reload::Unchanged);
        assert!(origin(&admission.load(), "https://c.example"));
    }
}

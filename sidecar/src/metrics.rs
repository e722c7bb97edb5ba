//! Prometheus metrics of the sidecar (`docs/reference/metrics.md`), served on the admin port at
//! `/metrics`: the assembly of the metrics each layer owns (its folder's `metrics.rs`), in one
//! registry, and their encoding.
//!
//! Every name starts with `tether_`. Labels never carry a session id: only reasons, methods,
//! eras and protocol versions, each from a small fixed set — an enum per label, whose values
//! the reference lists (the test below holds them to it).

use std::sync::Arc;

use prometheus_client::registry::Registry;

use crate::broker::metrics::BrokerMetrics;
use crate::cluster::metrics::ClusterMetrics;
use crate::config::metrics::ConfigMetrics;
use crate::handoff::metrics::HandoffMetrics;
use crate::ops::admin::Exposition;
use crate::ops::metrics::OpsMetrics;
use crate::proxy::metrics::ProxyMetrics;

/// The sidecar's metrics: each layer's, registered in one registry.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    /// Answers, sessions, streams, buffers, resumes, retries, calls, tasks, upstream exchanges.
    pub(crate) broker: Arc<BrokerMetrics>,
    /// Requests admitted, forwards, connections.
    pub(crate) proxy: Arc<ProxyMetrics>,
    /// Handoffs, tails, requests cut, peer authentication, membership's age.
    pub(crate) handoff: Arc<HandoffMetrics>,
    /// Membership changes, the ring's pods, peers down.
    pub(crate) cluster: Arc<ClusterMetrics>,
    /// Drains and refused admin requests.
    pub(crate) ops: Arc<OpsMetrics>,
    /// Reloads of the endpoint file and the key ring.
    pub(crate) config: Arc<ConfigMetrics>,
}

impl Metrics {
    /// Creates and registers every metric.
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("tether");
        let r = &mut registry;
        Self {
            broker: Arc::new(BrokerMetrics::new(r)),
            proxy: Arc::new(ProxyMetrics::new(r)),
            handoff: Arc::new(HandoffMetrics::new(r)),
            cluster: Arc::new(ClusterMetrics::new(r)),
            ops: Arc::new(OpsMetrics::new(r)),
            config: Arc::new(ConfigMetrics::new(r)),
            registry,
        }
    }
}

impl Exposition for Metrics {
    /// The metrics in the Prometheus text format.
    fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::Duration;

    use http::{Method, StatusCode};
    use strum::VariantArray;
    use tether_crds::ProtocolVersion;

    use super::*;
    use crate::broker::metrics::{
        Eviction, IdReuse, ResumeMiss, Revalidation, ToolRerun, UpstreamFailure,
    };
    use crate::cluster::membership::{PeerState, Source};
    use crate::cluster::peer_health::Down;
    use crate::cluster::routing::ForwardKind;
    use crate::config::metrics::{ConfigReload, KeyRingReload};
    use crate::handoff::metrics::{HandoffFailure, ReplicaSent, TakeOver, WriteAheadOutcome};
    use crate::mcp::admission::Era;
    use crate::mcp::rejection::{NotFound, Rejection};
    use crate::ops::metrics::AdminRefusal;
    use crate::peer::auth::AuthFailure;
    use crate::proxy::metrics::{ForwardOutcome, Full, ListenerName, MrtrRetry, RequestMethod};
    use crate::retained::Kind;
    use crate::stream::buffer::Evictions;

    /// The labels whose values are not a label enum's: a rejection's HTTP status and reason
    /// (the `data.reason` of its error body, `docs/reference/status-codes.md`), a hop number.
    const NOT_ENUMERATED: [(&str, &str); 3] = [
        ("tether_rejections_total", "status"),
        ("tether_rejections_total", "reason"),
        ("tether_forward_hops_total", "hop"),
    ];

    /// The labels of every value of a label enum.
    fn all<T: VariantArray + Copy>(label: fn(T) -> &'static str) -> Vec<&'static str> {
        T::VARIANTS.iter().map(|v| label(*v)).collect()
    }

    /// Every labelled family (as exposed), each label, and every value it can take.
    fn label_values() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
        vec![
            ("tether_requests_total", "method", all(RequestMethod::label)),
            ("tether_requests_total", "era", all(Era::label)),
            ("tether_not_found_total", "reason", all(NotFound::label)),
            (
                "tether_protocol_version_requests_total",
                "version",
                ProtocolVersion::ALL.iter().map(|v| v.as_str()).collect(),
            ),
            // The reasons `Broker::end_session` is given.
            (
                "tether_sessions_ended_total",
                "reason",
                [NotFound::Deleted, NotFound::Expired, NotFound::UpstreamGone]
                    .map(NotFound::label)
                    .to_vec(),
            ),
            (
                "tether_buffer_evictions_total",
                "reason",
                all(Eviction::label),
            ),
            ("tether_resumes_total", "result", vec!["hit", "miss"]),
            (
                "tether_resumes_total",
                "reason",
                [vec!["none"], all(ResumeMiss::label)].concat(),
            ),
            (
                "tether_request_id_reuse_total",
                "outcome",
                all(IdReuse::label),
            ),
            (
                "tether_mrtr_retries_total",
                "outcome",
                all(MrtrRetry::label),
            ),
            (
                "tether_upstream_errors_total",
                "reason",
                all(UpstreamFailure::label),
            ),
            (
                "tether_revalidations_total",
                "result",
                all(Revalidation::label),
            ),
            (
                "tether_retained_bytes",
                "kind",
                Kind::ALL.map(Kind::label).to_vec(),
            ),
            (
                "tether_membership_changes_total",
                "source",
                all(Source::label),
            ),
            ("tether_ring_pods", "state", all(PeerState::label)),
            ("tether_peers_down", "reason", all(Down::label)),
            ("tether_forwards_total", "kind", all(ForwardKind::label)),
            (
                "tether_forwards_total",
                "outcome",
                all(ForwardOutcome::label),
            ),
            (
                "tether_peer_connects_total",
                "reused",
                vec!["true", "false"],
            ),
            (
                "tether_connections_refused_total",
                "listener",
                all(ListenerName::label),
            ),
            (
                "tether_connections_refused_total",
                "reason",
                all(Full::label),
            ),
            (
                "tether_peer_auth_failures_total",
                "reason",
                all(AuthFailure::label),
            ),
            (
                "tether_handoffs_failed_total",
                "reason",
                all(HandoffFailure::label),
            ),
            (
                "tether_replicas_taken_over_total",
                "how",
                all(TakeOver::label),
            ),
            (
                "tether_replicas_sent_total",
                "outcome",
                all(ReplicaSent::label),
            ),
            (
                "tether_write_ahead_total",
                "outcome",
                all(WriteAheadOutcome::label),
            ),
            ("tether_write_ahead_tools", "rerun", all(ToolRerun::label)),
            (
                "tether_admin_refused_total",
                "reason",
                all(AdminRefusal::label),
            ),
            (
                "tether_config_reloads_total",
                "result",
                all(ConfigReload::label),
            ),
            (
                "tether_key_ring_reloads_total",
                "result",
                all(KeyRingReload::label),
            ),
        ]
    }

    /// Metrics with a sample in each labelled family, through the recording methods the
    /// sidecar uses (a labelled family prints nothing until it has one).
    fn sampled() -> Metrics {
        let m = Metrics::new();
        m.proxy.request(&Method::POST, Era::Sessionful);
        m.broker
            .rejection(&Rejection::SessionNotFound(NotFound::Forged));
        m.broker.protocol_version(ProtocolVersion::V2025_11_25);
        m.broker.session_ended(NotFound::Deleted);
        m.broker.evictions(&Evictions {
            ttl: 1,
            ..Evictions::default()
        });
        m.broker.resume_hit(1, Duration::from_millis(1));
        m.broker.resume_miss(ResumeMiss::Ahead);
        m.broker.upstream_error(UpstreamFailure::Lost);
        m.cluster.membership_change(Source::Kubernetes);
        m.cluster.set_ring_size(PeerState::Routable, 1);
        m.proxy.forward(ForwardKind::Home, ForwardOutcome::Ok);
        m.proxy.forward_hop(1);
        m.proxy.peer_connect(true);
        m.cluster.peers_down(Down::Refused, 1);
        m.handoff.handoff_failed(HandoffFailure::InDoubt);
        m.config.config_reload(ConfigReload::Applied);
        m.config.key_ring_reload(KeyRingReload::Applied);
        m.handoff.peer_auth_failure(AuthFailure::Mac);
        m.ops.admin_refused(AdminRefusal::DrainNotLocal);
        m.proxy.connection_refused(ListenerName::Mcp, Full::Source);
        m.broker.retained(Kind::Journal, 1);
        m.broker.revalidation(StatusCode::OK);
        m.broker.request_id_reuse(IdReuse::Run);
        m.proxy.mrtr_retry(MrtrRetry::Forwarded);
        m.handoff.replica_taken_over(TakeOver::Promoted);
        m.handoff.replica_sent(ReplicaSent::Kept);
        m.handoff.write_ahead(WriteAheadOutcome::Written);
        m.broker.write_ahead_tools(1, 0);
        m
    }

    /// The labels of the samples of `exposition`: family (as a counter's samples name it) →
    /// label → values.
    fn sample_labels(exposition: &str) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
        let mut out: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for line in exposition.lines().filter(|l| !l.starts_with('#')) {
            let Some((family, rest)) = line.split_once('{') else {
                continue;
            };
            let labels = &rest[..rest.find('}').unwrap()];
            for pair in labels.split(',') {
                let (label, value) = pair.split_once('=').unwrap();
                if label == "le" {
                    continue;
                }
                out.entry(family.to_owned())
                    .or_default()
                    .entry(label.to_owned())
                    .or_default()
                    .insert(value.trim_matches('"').to_owned());
            }
        }
        out
    }

    #[test]
    fn every_metric_is_registered() {
        // Each metric field of a layer's metrics needs a `register` call; count both in the
        // layers' sources.
        let sources = [
            include_str!("broker/metrics.rs"),
            include_str!("proxy/metrics.rs"),
            include_str!("handoff/metrics.rs"),
            include_str!("cluster/metrics.rs"),
            include_str!("ops/metrics.rs"),
            include_str!("config/metrics.rs"),
        ];
        let mut fields = 0;
        for source in sources {
            let start = source.find("Metrics {\n").unwrap();
            let block = &source[start..start + source[start..].find("\n}").unwrap()];
            let declared = block
                .lines()
                .map(str::trim_start)
                .filter(|l| {
                    [
                        ": Family<",
                        ": Counter,",
                        ": Counter<",
                        ": Gauge,",
                        ": Gauge<",
                        ": Histogram,",
                    ]
                    .iter()
                    .any(|t| l.contains(t))
                })
                .count();
            let registrations = source.matches("r.register(").count();
            assert_eq!(registrations, declared, "a metric field is not registered");
            fields += declared;
        }
        assert_eq!(fields, 68);
    }

    #[test]
    fn the_metrics_doc_lists_every_sidecar_metric_with_its_type() {
        use tether_tests::repo::{assert_documented, documented_metrics, exposed_families};
        let families = exposed_families(&sampled().encode());
        assert_eq!(
            families.len(),
            68,
            "a family has no sample here: record one of each new labelled family"
        );
        assert_documented(
            "the sidecar's",
            &families,
            &documented_metrics(Some("Sidecar")),
        );
    }

    #[test]
    fn every_label_is_enumerated_and_the_doc_lists_each_value_on_its_metric_s_row() {
        use tether_tests::repo::{METRICS_REFERENCE, read};
        let enumerated = label_values();
        // Each label exposed is enumerated, with the value exposed among its values.
        for (family, labels) in sample_labels(&sampled().encode()) {
            for (label, exposed) in labels {
                if NOT_ENUMERATED.contains(&(family.as_str(), label.as_str())) {
                    continue;
                }
                let Some((_, _, values)) = enumerated
                    .iter()
                    .find(|(f, l, _)| *f == family && *l == label)
                else {
                    panic!("{family}{{{label}}} is not enumerated in label_values()");
                };
                for value in exposed {
                    assert!(
                        values.contains(&value.as_str()),
                        "{family}{{{label}=\"{value}\"}} is not a value of its label's enum"
                    );
                }
            }
        }
        // Each value is on its metric's row of the reference.
        let doc = read(METRICS_REFERENCE);
        let mut missing = Vec::new();
        for (family, label, values) in &enumerated {
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| `{family}` |")))
                .unwrap_or_else(|| panic!("{METRICS_REFERENCE} has no row for {family}"));
            assert!(
                row.contains(&format!("`{label}`")),
                "{METRICS_REFERENCE}: the row of {family} does not name its label `{label}`"
            );
            for value in values {
                if !row.contains(&format!("`{value}`")) {
                    missing.push(format!("{family}{{{label}=\"{value}\"}}"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "label values missing from their metric's row in {METRICS_REFERENCE}: {missing:?}"
        );
    }

    #[test]
    fn encodes_with_the_tether_prefix() {
        let m = Metrics::new();
        m.broker
            .rejection(&Rejection::SessionNotFound(NotFound::Forged));
        m.broker.evictions(&Evictions {
            ttl: 2,
            ..Evictions::default()
        });
        let text = m.encode();
        assert!(
            text.contains("tether_not_found_total{reason=\"forged\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tether_buffer_evictions_total{reason=\"ttl\"} 2"),
            "{text}"
        );
        assert!(text.contains("# EOF"));
    }
}

//! What reloads count (`docs/reference/metrics.md`): the changes of the endpoint file and of
//! the key ring's files seen, and whether pod settings wait for a restart.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// What a change of the endpoint file came to (`tether_config_reloads_total{result}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum ConfigReload {
    /// The reloadable fields were applied.
    Applied,
    /// The file does not hold a valid McpEndpoint.
    Invalid,
    /// The file cannot be read.
    Unreadable,
}

impl ConfigReload {
    /// The `result` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Invalid => "invalid",
            Self::Unreadable => "unreadable",
        }
    }
}

/// What a change of the key ring's files came to (`tether_key_ring_reloads_total{result}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum KeyRingReload {
    /// The new ring is in force.
    Applied,
    /// The ring does not load: the last good one stays.
    Invalid,
}

impl KeyRingReload {
    /// The `result` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Invalid => "invalid",
        }
    }
}

label_value!(ConfigReload, KeyRingReload);

/// Labels of `tether_config_reloads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConfigLabel {
    /// What the change came to.
    result: ConfigReload,
}

/// Labels of `tether_key_ring_reloads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KeyRingLabel {
    /// What the change came to.
    result: KeyRingReload,
}

/// The metrics of reloads.
#[derive(Debug, Default)]
pub(crate) struct ConfigMetrics {
    /// Changes of the endpoint file seen, by result.
    config_reloads: Family<ConfigLabel, Counter>,
    /// Changes of the key ring's files seen, by result.
    key_ring_reloads: Family<KeyRingLabel, Counter>,
    /// 1 while the endpoint file asks for pod settings other than the running ones (they take
    /// effect when the pod restarts), else 0.
    config_restart_pending: Gauge,
}

impl ConfigMetrics {
    /// The metrics of reloads, registered in `r`.
    pub(crate) fn new(r: &mut Registry) -> Self {
        let m = Self::default();
        r.register(
            "key_ring_reloads",
            "Changes of the key ring's files seen, by result",
            m.key_ring_reloads.clone(),
        );
        r.register(
            "config_reloads",
            "Changes of the endpoint file seen, by result",
            m.config_reloads.clone(),
        );
        r.register(
            "config_restart_pending",
            "1 while the endpoint file asks for pod settings that need a restart",
            m.config_restart_pending.clone(),
        );
        m
    }

    /// A change of the endpoint file seen (`tether_config_reloads_total{result}`).
    pub(crate) fn config_reload(&self, result: ConfigReload) {
        self.config_reloads
            .get_or_create(&ConfigLabel { result })
            .inc();
    }

    /// A change of the key ring's files seen (`tether_key_ring_reloads_total{result}`).
    pub(crate) fn key_ring_reload(&self, result: KeyRingReload) {
        self.key_ring_reloads
            .get_or_create(&KeyRingLabel { result })
            .inc();
    }

    /// Whether pod settings of the endpoint file wait for a restart
    /// (`tether_config_restart_pending`, 1 or 0).
    pub(crate) fn restart_pending(&self, pending: bool) {
        self.config_restart_pending.set(i64::from(pending));
    }
}

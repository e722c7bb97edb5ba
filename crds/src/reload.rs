//! The split of the spec between what a running sidecar reloads from its ConfigMap file and
//! what needs new pods, defined once for both sides:
//!
//! - **reloaded** in place ([`McpEndpointSpec::with_reloaded_from`]): `origins`,
//!   `protocolVersions`, `buffer`, `session.idleTimeout`, `auth` — the operator only rewrites the
//!   ConfigMap, and each sidecar picks the change up without a restart;
//! - **pod settings** ([`PodSettings`]): everything else but `targetRef` (ports, paths, upstream,
//!   `session.migration`, `drain`, `sidecar`) — the listeners, the upstream and the drain are set
//!   up once at start. The operator writes them into the pod template as the
//!   [`POD_SETTINGS_ANNOTATION`], so changing one rolls the pods; a sidecar that reads a changed
//!   pod setting from its file keeps the running one and says a restart is pending.

use serde::{Deserialize, Serialize};

use crate::spec::{
    AdminSpec, DrainSpec, ListenSpec, McpEndpointSpec, Migration, PeerSpec, SidecarSpec,
    UpstreamSpec,
};

/// Pod-template annotation holding [`PodSettings`] as compact JSON (a change rolls the pods).
/// The sidecar reads its own pod's value through the downward API (`TETHER_POD_SETTINGS`), so a
/// sidecar restarted in an old pod during a rollout keeps that pod's settings.
pub const POD_SETTINGS_ANNOTATION: &str = "mcp.tether.dev/pod-settings";

/// The spec fields a sidecar reads only at start (see the module docs).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodSettings {
    /// `spec.upstream`.
    pub upstream: UpstreamSpec,
    /// `spec.listen`.
    pub listen: ListenSpec,
    /// `spec.admin`.
    pub admin: AdminSpec,
    /// `spec.peer`.
    pub peer: PeerSpec,
    /// `spec.session.migration`.
    pub migration: Migration,
    /// `spec.drain`.
    pub drain: DrainSpec,
    /// `spec.sidecar`.
    pub sidecar: SidecarSpec,
}

impl PodSettings {
    /// The value of [`POD_SETTINGS_ANNOTATION`]: compact JSON, fields in declaration order (the
    /// same spec always gives the same string).
    pub fn annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses an annotation value written by [`PodSettings::annotation`].
    ///
    /// # Errors
    /// The JSON error (position and field) when `value` is not such a document.
    pub fn parse(value: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(value)
    }

    /// The spec paths (`spec.listen`, `spec.session.migration`, …) whose values differ between
    /// `self` and `other`, in declaration order.
    pub fn differences(&self, other: &Self) -> Vec<&'static str> {
        let changed = [
            ("spec.upstream", self.upstream != other.upstream),
            ("spec.listen", self.listen != other.listen),
            ("spec.admin", self.admin != other.admin),
            ("spec.peer", self.peer != other.peer),
            ("spec.session.migration", self.migration != other.migration),
            ("spec.drain", self.drain != other.drain),
            ("spec.sidecar", self.sidecar != other.sidecar),
        ];
        changed
            .into_iter()
            .filter_map(|(path, differs)| differs.then_some(path))
            .collect()
    }
}

impl McpEndpointSpec {
    /// The settings that need new pods to change.
    pub fn pod_settings(&self) -> PodSettings {
        PodSettings {
            upstream: self.upstream.clone(),
            listen: self.listen.clone(),
            admin: self.admin.clone(),
            peer: self.peer.clone(),
            migration: self.session.migration,
            drain: self.drain.clone(),
            sidecar: self.sidecar.clone(),
        }
    }

    /// This spec with its pod settings replaced by `settings` (a pod's own, from its
    /// annotation).
    pub fn with_pod_settings(&self, settings: &PodSettings) -> McpEndpointSpec {
        let mut spec = self.clone();
        spec.upstream = settings.upstream.clone();
        spec.listen = settings.listen.clone();
        spec.admin = settings.admin.clone();
        spec.peer = settings.peer.clone();
        spec.session.migration = settings.migration;
        spec.drain = settings.drain.clone();
        spec.sidecar = settings.sidecar.clone();
        spec
    }

    /// This spec with the reloadable fields taken from `newer`: what a running sidecar applies
    /// when its file changes (its pod settings stay those it started with).
    pub fn with_reloaded_from(&self, newer: &McpEndpointSpec) -> McpEndpointSpec {
        newer.with_pod_settings(&self.pod_settings())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use crate::parse_manifest;

    /// Every field set to a value other than its default (and `targetRef` as in `a`).
    const ALL_CHANGED: &str = r#"
apiVersion: mcp.tether.dev/v1alpha1
kind: McpEndpoint
metadata: {name: weather}
spec:
  targetRef: {kind: Deployment, name: weather}
  upstream: {port: 3001, path: /other}
  listen: {port: 8081, path: /mcp2}
  admin: {port: 9911}
  peer: {port: 9912}
  origins: {allow: ["https://app.example.com"], allowMissing: false}
  protocolVersions: ["2025-06-18"]
  buffer: {maxEvents: 7, maxBytes: 4096, ttl: 3m}
  session: {idleTimeout: 2m, migration: Pin}
  drain: {timeout: 20s}
  sidecar:
    image: example.com/tether-sidecar:x
    resources: {limits: {memory: 64Mi}}
"#;

    const MINIMAL: &str = r#"
apiVersion: mcp.tether.dev/v1alpha1
kind: McpEndpoint
metadata: {name: weather}
spec:
  targetRef: {kind: Deployment, name: weather}
"#;

    /// JSON paths of the leaves where `a` and `b` differ (a leaf missing on one side counts).
    fn differing(a: &Value, b: &Value, path: &str, out: &mut BTreeSet<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let (l, r) = (
                        x.get(k).unwrap_or(&Value::Null),
                        y.get(k).unwrap_or(&Value::Null),
                    );
                    differing(l, r, &format!("{path}.{k}"), out);
                }
            }
            _ if a != b => {
                out.insert(path.to_owned());
            }
            _ => {}
        }
    }

    fn diff(a: &crate::McpEndpointSpec, b: &crate::McpEndpointSpec) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let (a, b) = (
            serde_json::to_value(a).unwrap(),
            serde_json::to_value(b).unwrap(),
        );
        differing(&a, &b, "spec", &mut out);
        out
    }

    fn top(paths: &BTreeSet<String>) -> BTreeSet<String> {
        paths
            .iter()
            .map(|p| {
                let parts: Vec<&str> = p.split('.').collect();
                // `session` is split: name its fields; every other field goes whole.
                let depth = if parts.get(1) == Some(&"session") {
                    3
                } else {
                    2
                };
                parts[..depth.min(parts.len())].join(".")
            })
            .collect()
    }

    #[test]
    fn every_field_is_either_reloaded_or_a_pod_setting() {
        let running = parse_manifest(MINIMAL).unwrap().spec;
        let newer = parse_manifest(ALL_CHANGED).unwrap().spec;
        let all = diff(&running, &newer);
        assert!(!all.iter().any(|p| p.starts_with("spec.targetRef")));
        let reloaded = running.with_reloaded_from(&newer);
        assert_eq!(reloaded.pod_settings(), running.pod_settings());
        // What reloading took over and what it left, as top-level spec paths.
        let taken = top(&diff(&running, &reloaded));
        let left = top(&diff(&reloaded, &newer));
        assert_eq!(
            taken,
            [
                "spec.buffer",
                "spec.origins",
                "spec.protocolVersions",
                "spec.session.idleTimeout"
            ]
            .map(String::from)
            .into()
        );
        assert!(taken.is_disjoint(&left), "{taken:?} / {left:?}");
        assert_eq!(&taken | &left, top(&all), "a field is in neither group");
        let mut named: Vec<&str> = running.pod_settings().differences(&newer.pod_settings());
        named.sort_unstable();
        let left: Vec<String> = left.into_iter().collect();
        assert_eq!(named, left);
    }

    #[test]
    fn the_annotation_changes_with_a_pod_setting_only() {
        let a = parse_manifest(MINIMAL).unwrap().spec;
        let newer = parse_manifest(ALL_CHANGED).unwrap().spec;
        let reloaded = a.with_reloaded_from(&newer);
        assert_eq!(
            a.pod_settings().annotation(),
            reloaded.pod_settings().annotation()
        );
        let mut drained = a.clone();
        drained.drain.timeout = "90s".parse().unwrap();
        assert_ne!(
            a.pod_settings().annotation(),
            drained.pod_settings().annotation()
        );
        assert_eq!(
            a.pod_settings().differences(&drained.pod_settings()),
            ["spec.drain"]
        );
        assert!(a.pod_settings().annotation().starts_with("{\"upstream\":{"));
        // A pod's annotation parses back to its settings.
        let full = parse_manifest(ALL_CHANGED).unwrap().spec;
        let back = crate::PodSettings::parse(&full.pod_settings().annotation()).unwrap();
        assert_eq!(back, full.pod_settings());
        assert_eq!(
            a.with_pod_settings(&back).pod_settings(),
            full.pod_settings()
        );
        assert!(crate::PodSettings::parse("{\"listen\": 1}").is_err());
    }
}

//! The user documentation against the code (issue 6): `docs/reference/metrics.md` lists exactly the
//! metrics the sidecar and the operator register, each with its type, and the Grafana dashboard
//! `charts/tether/dashboards/tether.json` parses, has the variables it documents and queries only
//! series the sidecar and the operator expose.
//!
//! The metric families come from the registries themselves, as `# TYPE` lines of their text
//! encoding. A labelled family prints nothing until it has a sample, so the test records one in
//! each; the sidecar's family count is pinned, so a new labelled family that is not touched here
//! fails the test instead of going unnoticed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::Value;

/// A file of the repository, by its path from the workspace root.
fn read(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// One registered metric family: its name as exposed (counters with `_total`) and its type.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Family {
    exposed: String,
    kind: String,
    /// The sample names a query may use.
    series: Vec<String>,
}

/// Families the sidecar registers (its own unit test counts the fields and registrations).
const SIDECAR_FAMILIES: usize = 34;
/// Families the operator registers.
const OPERATOR_FAMILIES: usize = 3;

/// The sidecar's metrics with one sample in each labelled family, encoded.
fn sidecar_exposition() -> String {
    use tether_sidecar::metrics::{
        ForwardLabels, HopLabel, Metrics, Reason, RejectionLabels, RequestLabels, ResultLabel,
        ResumeLabels, SourceLabel, StateLabel, VersionLabel,
    };
    let m = Metrics::new();
    let reason = Reason { reason: "x" };
    m.requests
        .get_or_create(&RequestLabels {
            method: "POST",
            era: "sessionful",
        })
        .inc();
    m.rejections
        .get_or_create(&RejectionLabels {
            status: 400,
            reason: "x",
        })
        .inc();
    m.not_found.get_or_create(&reason).inc();
    m.protocol_versions
        .get_or_create(&VersionLabel {
            version: "2025-11-25",
        })
        .inc();
    m.sessions_ended.get_or_create(&reason).inc();
    m.evictions.get_or_create(&reason).inc();
    m.resumes
        .get_or_create(&ResumeLabels {
            result: "hit",
            reason: "none",
        })
        .inc();
    m.upstream_errors.get_or_create(&reason).inc();
    m.membership_changes
        .get_or_create(&SourceLabel {
            source: "kubernetes",
        })
        .inc();
    m.ring_pods
        .get_or_create(&StateLabel { state: "routable" })
        .set(1);
    m.forwards
        .get_or_create(&ForwardLabels {
            kind: "home",
            outcome: "ok",
        })
        .inc();
    m.forward_hops.get_or_create(&HopLabel { hop: 1 }).inc();
    m.peers_down.get_or_create(&reason).set(1);
    m.handoffs_failed.get_or_create(&reason).inc();
    m.config_reloads
        .get_or_create(&ResultLabel { result: "applied" })
        .inc();
    m.encode()
}

/// The operator's metrics after one failed reconcile (every family has a sample), encoded.
fn operator_exposition() -> String {
    let m = tether_operator::metrics::Metrics::default();
    m.observe(Err("api"), std::time::Duration::from_millis(1));
    m.encode()
}

/// The `# TYPE` lines of an exposition.
fn type_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with("# TYPE ")).collect()
}

/// Every family of the sidecar's and the operator's registries, by exposed name.
fn families() -> BTreeMap<String, Family> {
    let (sidecar, operator) = (sidecar_exposition(), operator_exposition());
    assert_eq!(
        type_lines(&sidecar).len(),
        SIDECAR_FAMILIES,
        "the sidecar registers a family this test does not know: record a sample of each new \
         labelled family in sidecar_exposition() and update SIDECAR_FAMILIES"
    );
    assert_eq!(
        type_lines(&operator).len(),
        OPERATOR_FAMILIES,
        "the operator registers a family this test does not know: give it a sample in \
         operator_exposition() and update OPERATOR_FAMILIES"
    );
    let text = format!("{sidecar}{operator}");
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            panic!("unexpected TYPE line: {line}");
        };
        let (exposed, series) = match kind {
            "counter" => {
                let total = format!("{name}_total");
                (total.clone(), vec![total])
            }
            "histogram" => (
                name.to_owned(),
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{name}{s}"))
                    .collect(),
            ),
            "gauge" => (name.to_owned(), vec![name.to_owned()]),
            other => panic!("metric type {other} of {name} is not documented by this test"),
        };
        out.insert(
            exposed.clone(),
            Family {
                exposed,
                kind: kind.to_owned(),
                series,
            },
        );
    }
    out
}

/// Every sample name of every family.
fn series_names(families: &BTreeMap<String, Family>) -> BTreeSet<String> {
    families
        .values()
        .flat_map(|f| f.series.iter().cloned())
        .collect()
}

/// The `tether_…` words of `text` (metric names as written): a word that ends with `_` is a
/// prefix, not a name, and is left out.
fn metric_words(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
    let mut out = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("tether_") {
        let start = from + at;
        let mut end = start + "tether_".len();
        while end < bytes.len() && word(bytes[end]) {
            end += 1;
        }
        let before_is_word = start > 0 && (bytes[start - 1].is_ascii_alphanumeric());
        let name = &text[start..end];
        if !before_is_word && !name.ends_with('_') {
            out.insert(name.to_owned());
        }
        from = end;
    }
    out
}

/// The rows of `docs/reference/metrics.md`'s tables whose first cell is a metric: name → type cell.
fn documented() -> BTreeMap<String, String> {
    let doc = read("docs/reference/metrics.md");
    let mut out = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // "| `name` | type | labels | meaning |" splits into ["", name, type, …, ""].
        if cells.len() < 4 {
            continue;
        }
        let Some(name) = cells[1]
            .strip_prefix('`')
            .and_then(|c| c.strip_suffix('`'))
            .filter(|c| c.starts_with("tether_"))
        else {
            continue;
        };
        let previous = out.insert(name.to_owned(), cells[2].to_owned());
        assert!(
            previous.is_none(),
            "docs/reference/metrics.md lists {name} twice"
        );
    }
    out
}

#[test]
fn the_metrics_doc_lists_every_metric_with_its_type() {
    let families = families();
    let documented = documented();
    let missing: Vec<&String> = families
        .keys()
        .filter(|n| !documented.contains_key(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics missing from docs/reference/metrics.md (list them as exposed, counters with _total): {missing:?}"
    );
    let unknown: Vec<&String> = documented
        .keys()
        .filter(|n| !families.contains_key(*n))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/reference/metrics.md lists metrics that no registry has: {unknown:?}"
    );
    for (name, kind) in &documented {
        assert_eq!(
            kind, &families[name].kind,
            "docs/reference/metrics.md gives {name} the wrong type"
        );
    }
}

#[test]
fn every_metric_name_in_the_docs_exists() {
    let families = families();
    let mut known = series_names(&families);
    known.extend(families.keys().cloned());
    for doc in [
        "docs/reference/metrics.md",
        "docs/guide/rolling-upgrade.md",
        "docs/guide/troubleshooting.md",
        "docs/guide/upgrade.md",
        "docs/guide/install.md",
    ] {
        let unknown: Vec<String> = metric_words(&read(doc))
            .into_iter()
            .filter(|w| !known.contains(w))
            .collect();
        assert!(
            unknown.is_empty(),
            "{doc} names metrics that do not exist: {unknown:?}"
        );
    }
}

#[test]
fn the_word_scanner_finds_names_and_skips_prefixes() {
    let words = metric_words(
        "rate(tether_resumes_total[5m]) and `tether_`, tether_operator_; not mytether_x",
    );
    assert_eq!(
        words.into_iter().collect::<Vec<_>>(),
        ["tether_resumes_total"]
    );
}

/// Every string under a key named `expr`, `query` or `definition` (PromQL of panels and
/// variables), anywhere in `v`.
fn queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "query" | "definition", Value::String(s)) => out.push(s.clone()),
                    _ => queries(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| queries(i, out)),
        _ => {}
    }
}

fn dashboard() -> Value {
    serde_json::from_str(&read("charts/tether/dashboards/tether.json"))
        .expect("charts/tether/dashboards/tether.json is valid JSON")
}

#[test]
fn the_dashboard_queries_only_metrics_that_exist() {
    let dashboard = dashboard();
    let known = series_names(&families());
    let mut exprs = Vec::new();
    queries(&dashboard, &mut exprs);
    assert!(
        exprs.len() > 10,
        "the dashboard has too few queries: {exprs:?}"
    );
    let used: BTreeSet<String> = exprs.iter().flat_map(|e| metric_words(e)).collect();
    let unknown: Vec<&String> = used.iter().filter(|w| !known.contains(*w)).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries series that are not exposed (counters end in _total, histograms \
         are queried as _bucket, _sum or _count): {unknown:?}"
    );
    for needed in [
        "tether_sessions",
        "tether_resumes_total",
        "tether_handoffs_sent_total",
        "tether_handoffs_received_total",
        "tether_handoffs_failed_total",
        "tether_drain_seconds_bucket",
        "tether_not_found_total",
        "tether_rejections_total",
    ] {
        assert!(
            used.contains(needed),
            "the dashboard has no panel on {needed}"
        );
    }
}

#[test]
fn the_dashboard_has_its_variables_and_uses_the_datasource_variable() {
    let dashboard = dashboard();
    assert_eq!(dashboard["schemaVersion"], 39);
    let variables: BTreeMap<&str, &str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap_or_default(),
                v["type"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(variables.get("datasource"), Some(&"datasource"));
    assert_eq!(variables.get("namespace"), Some(&"query"));
    assert_eq!(variables.get("pod"), Some(&"query"));
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(
            ids.insert(panel["id"].as_i64().expect("a panel id")),
            "duplicate panel id at {title}"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "panel {title} does not use the datasource variable"
        );
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title} has no query");
        for t in targets {
            assert_eq!(
                t["datasource"]["uid"], "${datasource}",
                "a query of {title}"
            );
        }
    }
}

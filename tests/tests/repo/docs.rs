//! The docs and the Grafana dashboard `charts/tether/dashboards/tether.json` against the
//! metrics reference `docs/reference/metrics.md`: the dashboard parses, has its variables,
//! queries through the datasource variable and only series the reference lists; the guides
//! name only metrics it lists. The reference itself is checked against the registries by the
//! sidecar's and the operator's own tests (`the_metrics_doc_lists_every_*_metric_with_its_type`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use tether_tests::repo::{documented_metrics, read, series};

fn dashboard() -> Value {
    serde_json::from_str(&read("charts/tether/dashboards/tether.json"))
        .expect("charts/tether/dashboards/tether.json is valid JSON")
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

/// Every sample name of the documented families (`name → type`, see [`documented_metrics`]).
fn series_names(documented: &BTreeMap<String, String>) -> BTreeSet<String> {
    documented
        .iter()
        .flat_map(|(name, kind)| series(name, kind))
        .collect()
}

/// The `tether_…` words of `text` (metric names as written): a word that ends with `_` is a
/// prefix, not a name, and one followed by `::` a Rust path (`tether_crds::reload`); both are
/// left out.
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
        if !before_is_word && !name.ends_with('_') && !text[end..].starts_with("::") {
            out.insert(name.to_owned());
        }
        from = end;
    }
    out
}

#[test]
fn every_metric_name_in_the_docs_exists() {
    let documented = documented_metrics(None);
    let mut known = series_names(&documented);
    known.extend(documented.keys().cloned());
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
        "rate(tether_resumes_total[5m]) and `tether_`, tether_operator_; not mytether_x, \
         not tether_crds::reload",
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

#[test]
fn the_dashboard_queries_only_metrics_that_exist() {
    let dashboard = dashboard();
    let known = series_names(&documented_metrics(None));
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

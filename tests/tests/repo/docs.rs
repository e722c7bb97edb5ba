//! The Grafana dashboard `charts/tether/dashboards/tether.json` (`docs/reference/metrics.md`):
//! it parses, has its variables, and every panel queries through the datasource variable. That
//! it queries only series the sidecar and the operator expose is checked against their
//! registries in the `it` binary (`it/metrics.rs`), which links them.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use tether_tests::repo::read;

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

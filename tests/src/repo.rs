//! Files of this repository, for the tests that check them against the code (the chart, the
//! docs, the images, the example manifests).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The workspace root (the directory holding the workspace's `Cargo.toml`).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// The text of the file at `path`: a path from the workspace root (e.g. `docs/reference/metrics.md`) or
/// an absolute one.
///
/// # Panics
/// When the file cannot be read: a test that reads a file of the repository needs it.
pub fn read(path: impl AsRef<Path>) -> String {
    let path = root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The files below `dir` (a path from the workspace root; `""` for the whole repository) whose
/// names end with one of `extensions` (`"rs"`, `"md"`), as paths from the workspace root, sorted.
/// Build output (`target/`) and hidden folders (`.git/`) are left out.
///
/// # Panics
/// When a folder cannot be read.
pub fn files(dir: &str, extensions: &[&str]) -> Vec<String> {
    fn walk(dir: &Path, extensions: &[&str], out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    walk(&path, extensions, out);
                }
            } else if extensions.iter().any(|e| name.ends_with(&format!(".{e}"))) {
                out.push(path);
            }
        }
    }
    let root = root();
    let start = root.join(dir);
    let mut found = Vec::new();
    if start.is_file() {
        found.push(start);
    } else {
        walk(&start, extensions, &mut found);
    }
    let mut out: Vec<String> = found
        .iter()
        .map(|p| {
            p.strip_prefix(&root)
                .unwrap_or(p)
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    out.sort();
    out
}

/// The metric families of a Prometheus text exposition, from its `# TYPE` lines: the name as
/// exposed (counters with `_total`) → its type (`counter`, `gauge`, `histogram`).
///
/// # Panics
/// On a malformed `# TYPE` line.
pub fn exposed_families(exposition: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            panic!("unexpected TYPE line: {line}");
        };
        let exposed = match kind {
            "counter" => format!("{name}_total"),
            _ => name.to_owned(),
        };
        out.insert(exposed, kind.to_owned());
    }
    out
}

/// The sample names a query of the family `exposed` of type `kind` may use: the name itself,
/// or `_bucket`, `_sum` and `_count` of a histogram.
///
/// # Panics
/// On a type the metrics reference does not use.
pub fn series(exposed: &str, kind: &str) -> Vec<String> {
    match kind {
        "counter" | "gauge" => vec![exposed.to_owned()],
        "histogram" => ["_bucket", "_sum", "_count"]
            .iter()
            .map(|s| format!("{exposed}{s}"))
            .collect(),
        other => panic!("metric type {other} of {exposed} is not one the reference documents"),
    }
}

/// The metrics `docs/reference/metrics.md` lists, in the section under `## {section}` (every
/// section with `None`): the rows whose first cell is a metric, name → type cell.
///
/// # Panics
/// When a metric is listed twice.
pub fn documented_metrics(section: Option<&str>) -> BTreeMap<String, String> {
    let doc = read(METRICS_REFERENCE);
    let mut out = BTreeMap::new();
    let mut inside = section.is_none();
    for line in doc.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            inside = section.is_none_or(|s| s == heading.trim());
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // "| `name` | type | labels | meaning |" splits into ["", name, type, …, ""].
        if !inside || cells.len() < 4 {
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
        assert!(previous.is_none(), "{METRICS_REFERENCE} lists {name} twice");
    }
    out
}

/// The metrics reference, from the workspace root.
pub const METRICS_REFERENCE: &str = "docs/reference/metrics.md";

/// Asserts that the `registered` families (see [`exposed_families`]) are exactly the
/// `documented` ones (see [`documented_metrics`]), each with its type; `who` names the
/// registry in the messages.
///
/// # Panics
/// Naming the families missing from the reference, those it lists that `who` does not
/// register, and those it gives the wrong type.
pub fn assert_documented(
    who: &str,
    registered: &BTreeMap<String, String>,
    documented: &BTreeMap<String, String>,
) {
    let missing: Vec<&String> = registered
        .keys()
        .filter(|n| !documented.contains_key(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "{who} metrics missing from {METRICS_REFERENCE} (list them as exposed, counters with \
         _total): {missing:?}"
    );
    let unknown: Vec<&String> = documented
        .keys()
        .filter(|n| !registered.contains_key(*n))
        .collect();
    assert!(
        unknown.is_empty(),
        "{METRICS_REFERENCE} lists {who} metrics that its registry does not have: {unknown:?}"
    );
    for (name, kind) in documented {
        assert_eq!(
            kind, &registered[name],
            "{METRICS_REFERENCE} gives {name} the wrong type"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_and_their_series_are_read_from_an_exposition() {
        let families = exposed_families(
            "# TYPE tether_a counter\ntether_a_total 1\n# TYPE tether_b histogram\n# EOF\n",
        );
        assert_eq!(families["tether_a_total"], "counter");
        assert_eq!(
            series("tether_b", &families["tether_b"]),
            ["tether_b_bucket", "tether_b_sum", "tether_b_count"]
        );
        assert!(documented_metrics(Some("Sidecar")).contains_key("tether_sessions"));
        assert!(!documented_metrics(Some("Operator")).contains_key("tether_sessions"));
    }

    #[test]
    fn the_root_holds_the_workspace_manifest() {
        assert!(read("Cargo.toml").contains("[workspace]"));
    }

    #[test]
    fn files_are_found_by_extension_outside_build_output() {
        let all = files("", &["md"]);
        assert!(all.contains(&"README.md".to_owned()), "{all:?}");
        assert!(
            all.iter()
                .all(|f| !f.starts_with("target/") && f.ends_with(".md"))
        );
        assert_eq!(files("tests/src/repo.rs", &["rs"]), ["tests/src/repo.rs"]);
        assert!(files("tests/src", &["rs"]).contains(&"tests/src/repo.rs".to_owned()));
    }
}

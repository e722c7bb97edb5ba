//! The layers of the code keep their rules (`docs/design/architecture.md#layers`,
//! `docs/design/operator.md`): which top-level module of a crate may import which, and no
//! import circles. Read from the sources: every `crate::<module>` path outside comments and
//! outside the inline `#[cfg(test)] mod tests { … }` at the end of a file (unit tests may assemble
//! whatever they test). A test module of its own file (`mod tests;`, the in-process component
//! tests) is read like production code: it assembles its layer from what that layer may import.

use std::collections::{BTreeMap, BTreeSet};

use tether_tests::repo::{files, read};

/// Top-level module → the top-level modules its production code names (`crate::x`).
type Imports = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file of the crate whose sources are in `src`: its path from `src`, and its
/// production code (the file before an inline `#[cfg(test)] mod tests { … }` at its end).
fn production_sources(src: &str) -> Vec<(String, String)> {
    files(src, &["rs"])
        .into_iter()
        .map(|file| {
            let rel = file
                .strip_prefix(src)
                .unwrap_or(&file)
                .trim_start_matches('/')
                .to_owned();
            let mut text = read(&file);
            if let Some(at) = text.find("\n#[cfg(test)]\nmod tests {") {
                text.truncate(at);
            }
            (rel, text)
        })
        .collect()
}

/// The imports between the top-level modules of the crate whose sources are in `src` (a path
/// from the workspace root), and which files name `crate::<path>` for each `path` in `watch`.
fn imports(src: &str, watch: &[&str]) -> (Imports, BTreeMap<String, BTreeSet<String>>) {
    let mut graph = Imports::new();
    let mut users: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, production) in production_sources(src) {
        let top = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_owned();
        if top == "lib" || top == "main" {
            continue;
        }
        let entry = graph.entry(top.clone()).or_default();
        for line in production.lines() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for (at, _) in code.match_indices("crate::") {
                let path: String = code[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let module = path.split("::").next().unwrap_or_default().to_owned();
                if !module.is_empty() && module != top {
                    entry.insert(module);
                }
                for w in watch {
                    if path.starts_with(w) && !rel.starts_with(w.split("::").next().unwrap()) {
                        users
                            .entry((*w).to_owned())
                            .or_default()
                            .insert(rel.clone());
                    }
                }
            }
        }
    }
    (graph, users)
}

/// The imports between the files of each folder of the crate whose sources are in `src`:
/// folder → file → the files of the same folder its production code names (`super::x`,
/// `crate::<folder>::x`). A folder's `mod.rs` is left out (it declares the others).
fn file_imports(src: &str) -> BTreeMap<String, Imports> {
    let mut folders: BTreeMap<String, Imports> = BTreeMap::new();
    for (rel, production) in production_sources(src) {
        let parts: Vec<&str> = rel.split('/').collect();
        let [.., _, name] = parts.as_slice() else {
            continue;
        };
        let stem = name.trim_end_matches(".rs");
        if stem == "mod" {
            continue;
        }
        let folder_path = parts[..parts.len() - 1].join("::");
        let entry = folders
            .entry(folder_path.clone())
            .or_default()
            .entry(stem.to_owned())
            .or_default();
        let own = format!("crate::{folder_path}::");
        for line in production.lines() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for prefix in ["super::", own.as_str()] {
                for (at, _) in code.match_indices(prefix) {
                    // `x::super::` is a path inside a nested module, not the folder's.
                    if code[..at].ends_with("::") {
                        continue;
                    }
                    let used: String = code[at + prefix.len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !used.is_empty() && used != stem && used.chars().all(|c| !c.is_uppercase()) {
                        entry.insert(used);
                    }
                }
            }
        }
    }
    folders
}

/// A circle of imports, if there is one.
fn circle(graph: &Imports) -> Option<Vec<String>> {
    fn visit(
        graph: &Imports,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(graph, next, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(graph, n, &mut Vec::new(), &mut done))
}

/// Fails naming every module of `graph` that imports one it may not.
fn check(graph: &Imports, may_import: &[(&str, &[&str])]) {
    let mut broken = Vec::new();
    for (module, allowed) in may_import {
        for used in graph.get(*module).into_iter().flatten() {
            if !allowed.contains(&used.as_str()) {
                broken.push(format!("{module} imports {used}"));
            }
        }
    }
    assert!(broken.is_empty(), "layer rules broken: {broken:?}");
}

#[test]
fn sidecar_layers_keep_their_rules() {
    let (graph, users) = imports("sidecar/src", &["peer::wire", "handoff::image"]);
    assert!(
        graph.contains_key("session") && graph.contains_key("mcp"),
        "the sidecar's folders moved: {:?}",
        graph.keys()
    );
    check(
        &graph,
        &[
            // The key ring is a leaf; the protocol rules are pure: nothing but the keys
            // (session-id MACs).
            ("keys", &[]),
            ("mcp", &["keys"]),
            // The tally of retained bytes knows only whose bytes they are (a principal's
            // digest); state never reaches up.
            ("retained", &["mcp"]),
            ("stream", &["mcp", "retained"]),
            // A session's digests are keyed by the key that minted its id.
            ("session", &["mcp", "stream", "retained", "keys", "counts"]),
            // Counts by key are a leaf.
            ("counts", &[]),
            // The peer protocol knows no session, no broker and no membership: its messages,
            // their MACs, the client that sends them, the hop headers.
            ("peer", &["keys", "mcp", "upstream"]),
            // Membership and routing know no state and no broker; they count in their own
            // metrics (`cluster/metrics.rs`), which `metrics.rs` assembles from above.
            ("cluster", &["mcp", "keys", "peer"]),
        ],
    );
    let broker = graph.get("broker").cloned().unwrap_or_default();
    for above in ["handoff", "proxy", "ops", "config", "server", "cluster"] {
        assert!(
            !broker.contains(above),
            "broker/ imports {above}: the broker knows nothing of peers"
        );
    }
    // The wire format is read where messages are made and served: handoff/ (sessions, tails,
    // cancellations), and the exchange of reports (cluster/membership/reports.rs).
    let wire = users.get("peer::wire").cloned().unwrap_or_default();
    let elsewhere: Vec<&String> = wire
        .iter()
        .filter(|f| !f.starts_with("handoff/") && f.as_str() != "cluster/membership/reports.rs")
        .collect();
    assert!(
        elsewhere.is_empty(),
        "the peer protocol's wire format is used outside handoff/: {elsewhere:?}"
    );
    assert!(
        !users.contains_key("handoff::image"),
        "a session's image is made outside handoff/: {users:?}"
    );
    assert_eq!(circle(&graph), None, "an import circle in the sidecar");
    for (folder, files) in file_imports("sidecar/src") {
        assert_eq!(
            circle(&files),
            None,
            "an import circle between the files of sidecar/src/{folder}"
        );
    }
}

#[test]
fn operator_modules_form_no_circle_and_the_pure_steps_stay_pure() {
    let (graph, _) = imports("operator/src", &[]);
    assert!(graph.contains_key("plan"), "the operator's modules moved");
    assert_eq!(circle(&graph), None, "an import circle in the operator");
    for pure in [
        "operator/src/plan",
        "operator/src/keys",
        "operator/src/validate.rs",
        "operator/src/status.rs",
        "operator/src/diff.rs",
    ] {
        for file in files(pure, &["rs"]) {
            let text = read(&file);
            for api in ["kube::Client", "Api<", "Api::", ".await"] {
                assert!(
                    !text.contains(api),
                    "{file} uses {api}: the pure steps of the reconcile talk to no API server"
                );
            }
        }
    }
}

#[test]
fn a_circle_is_found() {
    let mut graph = Imports::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    assert_eq!(circle(&graph), None);
    graph.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        circle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

//! Static checks of the Helm chart `charts/tether` (Helm itself may be absent): Chart.yaml
//! follows the workspace version; every template is YAML of Kubernetes objects once its Helm
//! directives are stripped; every `.Values` path a template reads exists in values.yaml; every
//! `include` names a template of `_helpers.tpl`; the RBAC rules are exactly the operator's
//! (`tether_operator::access`), rendered as a ClusterRole or, with `watchNamespaces`, as a Role
//! in each watched namespace; every environment variable the operator's Deployment sets is a
//! flag of `tether-operator run`; files read with `.Files.Get` exist; the CRD is rendered only
//! with `crds.install`. The CRD template is checked against the types in `crds/tests/crd.rs`.
//! With `helm` on PATH, `helm lint --strict` and `helm template` (with and without `crds.install`) run
//! too; without it the test says it skipped them.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use tether_operator::access::{LEADER_ELECTION, RECONCILE, policy_rules};
use tether_tests::repo::{read, root};

fn chart() -> PathBuf {
    root().join("charts/tether")
}

/// The chart's manifest templates, by file name, sorted.
fn templates() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(chart().join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                read(&p),
            )
        })
        .collect();
    out.sort();
    out
}

/// `text` without Helm: whole-line directives dropped, inline ones replaced by `x`.
fn strip(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("{{") && trimmed.ends_with("}}") {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("{{") {
            out.push_str(&rest[..start]);
            out.push('x');
            rest = rest[start..]
                .find("}}")
                .map_or("", |end| &rest[start + end + 2..]);
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}

/// The YAML documents of a stripped template.
fn documents(name: &str, text: &str) -> Vec<Value> {
    strip(text)
        .split("\n---\n")
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .map(|d| {
            yaml_serde::from_str(d)
                .unwrap_or_else(|e| panic!("{name}: not YAML once stripped: {e}"))
        })
        .collect()
}

/// The values of a template's document of `kind`.
fn object(kind: &str) -> Value {
    templates()
        .iter()
        .flat_map(|(name, text)| documents(name, text))
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} template"))
}

/// Every `.Values.a.b` path read in `text`.
fn value_paths(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find(".Values.") {
        rest = &rest[i + ".Values.".len()..];
        let path: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_')
            .collect();
        out.insert(path.trim_end_matches('.').to_owned());
    }
    out
}

#[test]
fn chart_versions_follow_the_workspace() {
    let meta: Value = yaml_serde::from_str(&read(chart().join("Chart.yaml"))).unwrap();
    assert_eq!(meta["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(meta["appVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(meta["apiVersion"], "v2");
}

#[test]
fn every_template_is_kubernetes_yaml_once_stripped() {
    let all = templates();
    assert!(all.len() >= 8, "{all:?}");
    for (name, text) in &all {
        for doc in documents(name, text) {
            assert!(
                doc["apiVersion"].is_string() && doc["kind"].is_string(),
                "{name}: a document without apiVersion and kind: {doc}"
            );
        }
    }
    // The stripping itself: a directive line goes, an inline one becomes a scalar.
    assert_eq!(
        strip("a: {{ .Values.x }}\n{{- if .Values.y }}\nb: \"p:{{ .Values.z }}\"\n"),
        "a: x\nb: \"p:x\"\n"
    );
}

#[test]
fn every_value_a_template_reads_exists() {
    let values: Value = yaml_serde::from_str(&read(chart().join("values.yaml"))).unwrap();
    let mut sources = templates();
    sources.push((
        "NOTES.txt".into(),
        read(chart().join("templates/NOTES.txt")),
    ));
    sources.push((
        "_helpers.tpl".into(),
        read(chart().join("templates/_helpers.tpl")),
    ));
    let mut seen = 0;
    for (name, text) in &sources {
        for path in value_paths(text) {
            let found = path.split('.').try_fold(&values, |v, key| v.get(key));
            assert!(
                found.is_some(),
                "{name} reads .Values.{path}, which values.yaml lacks"
            );
            seen += 1;
        }
    }
    assert!(seen > 20, "only {seen} value paths found");
    assert_eq!(
        value_paths("{{ .Values.a.b_c }} {{ toYaml .Values.d | nindent 2 }}"),
        ["a.b_c", "d"].map(String::from).into()
    );
}

#[test]
fn includes_and_files_exist() {
    let helpers = read(chart().join("templates/_helpers.tpl"));
    let defined: BTreeSet<&str> = helpers
        .split("define \"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .collect();
    for (name, text) in templates() {
        for used in text
            .split("include \"")
            .skip(1)
            .filter_map(|s| s.split('"').next())
        {
            assert!(defined.contains(used), "{name} includes undefined {used:?}");
        }
        for file in text
            .split(".Files.Get \"")
            .skip(1)
            .filter_map(|s| s.split('"').next())
        {
            assert!(
                chart().join(file).is_file(),
                "{name} reads missing file {file}"
            );
        }
    }
}

/// The body of `define "name"` in `_helpers.tpl`.
fn helper(name: &str) -> String {
    let helpers = read(chart().join("templates/_helpers.tpl"));
    let start = format!("{{{{- define \"{name}\" -}}}}\n");
    let body = helpers
        .split_once(&start)
        .unwrap_or_else(|| panic!("no define {name:?}"))
        .1;
    body.split_once("{{- end }}").unwrap().0.to_owned()
}

/// `rbac.yaml` rendered as Helm would with `rbac.create` and `watchNamespaces` = `watched`:
/// its `if` / `else` / `range` / `end` lines evaluated, `tether.operatorRules` included,
/// `{{ . }}` the namespace of the range, other directives stripped ([`strip`]).
fn render_rbac(watched: &[&str]) -> Vec<Value> {
    let text = read(chart().join("templates/rbac.yaml"));
    let rules = helper("tether.operatorRules");
    // Whether each enclosing `if` / `else` renders; the body of the open `range`.
    let mut out = String::new();
    let mut shown = vec![true];
    let mut range: Option<String> = None;
    for line in text.lines() {
        let t = line.trim();
        match t {
            "{{- if .Values.rbac.create }}" => shown.push(*shown.last().unwrap()),
            "{{- if not .Values.watchNamespaces }}" => {
                shown.push(*shown.last().unwrap() && watched.is_empty());
            }
            "{{- else }}" => {
                let inner = shown.pop().unwrap();
                shown.push(*shown.last().unwrap() && !inner);
            }
            "{{- range .Values.watchNamespaces }}" => range = Some(String::new()),
            "{{- end }}" => match range.take() {
                Some(body) => {
                    if *shown.last().unwrap() {
                        for ns in watched {
                            out.push_str(&body.replace("{{ . }}", ns));
                        }
                    }
                }
                None => {
                    shown.pop();
                }
            },
            _ => {
                if !*shown.last().unwrap() {
                    continue;
                }
                let target = range.as_mut().unwrap_or(&mut out);
                if t.starts_with("{{- include \"tether.operatorRules\"") {
                    let indent = " ".repeat(line.len() - line.trim_start().len());
                    for rule in rules.lines() {
                        target.push_str(&format!("{indent}{rule}\n"));
                    }
                } else {
                    target.push_str(line);
                    target.push('\n');
                }
            }
        }
    }
    documents("rbac.yaml", &out)
}

#[test]
fn rbac_rules_are_the_operators_in_both_install_shapes() {
    let as_json = |rules| serde_json::to_value(policy_rules(rules)).unwrap();
    let kinds = |docs: &[Value]| -> Vec<String> {
        docs.iter()
            .map(|d| {
                let ns = d["metadata"]["namespace"].as_str().unwrap_or("-");
                format!("{} {ns}", d["kind"].as_str().unwrap())
            })
            .collect()
    };
    // Every namespace: one ClusterRole of the reconcile's rules, bound to the operator.
    let cluster = render_rbac(&[]);
    assert_eq!(kinds(&cluster), ["ClusterRole -", "ClusterRoleBinding -"]);
    assert_eq!(cluster[0]["rules"], as_json(RECONCILE), "ClusterRole rules");
    assert_eq!(cluster[1]["roleRef"]["kind"], "ClusterRole");
    // watchNamespaces: the same rules as a Role in each namespace, no ClusterRole.
    let namespaced = render_rbac(&["team-a", "team-b"]);
    assert_eq!(
        kinds(&namespaced),
        [
            "Role team-a",
            "RoleBinding team-a",
            "Role team-b",
            "RoleBinding team-b"
        ]
    );
    for doc in namespaced.iter().filter(|d| d["kind"] == "Role") {
        assert_eq!(doc["rules"], as_json(RECONCILE), "Role rules");
    }
    for doc in namespaced.iter().filter(|d| d["kind"] == "RoleBinding") {
        assert_eq!(doc["roleRef"]["kind"], "Role");
        assert_eq!(doc["subjects"][0]["kind"], "ServiceAccount");
    }
    let lease = documents(
        "leader-election-role.yaml",
        &read(chart().join("templates/leader-election-role.yaml")),
    );
    assert_eq!(
        lease[0]["rules"],
        as_json(LEADER_ELECTION),
        "leader-election Role rules"
    );
    // The operator reads the namespaces to watch from the same value.
    let deployment = read(chart().join("templates/deployment.yaml"));
    assert!(deployment.contains("TETHER_WATCH_NAMESPACES"));
    assert!(deployment.contains("{{- with .Values.watchNamespaces }}"));
}

#[test]
fn the_operators_environment_is_its_flags() {
    let deployment = object("Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["args"], serde_json::json!(["run"]));
    let help = Command::new(tether_tests::bins::path("tether-operator").unwrap())
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let env = container["env"].as_array().unwrap();
    assert!(env.len() >= 8);
    for var in env {
        let name = var["name"].as_str().unwrap();
        // RUST_LOG is read by the log filter, not by a flag.
        assert!(
            name == "RUST_LOG" || help.contains(&format!("[env: {name}=")),
            "the chart sets {name}, which `tether-operator run` does not read"
        );
    }
    // The template sets TETHER_SIDECAR_RESOURCES only when given; it is a flag too.
    assert!(help.contains("[env: TETHER_SIDECAR_RESOURCES="));
}

#[test]
fn the_crd_is_rendered_only_with_crds_install() {
    // Default on; `crds.install=false` is how a release installs over a CRD another release or
    // `kubectl` left (docs/guide/install.md#a-crd-left-by-an-earlier-release).
    let values: Value = yaml_serde::from_str(&read(chart().join("values.yaml"))).unwrap();
    assert_eq!(values["crds"]["install"], Value::Bool(true));
    let mut with_crd = Vec::new();
    for (name, text) in templates() {
        if documents(&name, &text)
            .iter()
            .any(|d| d["kind"] == "CustomResourceDefinition")
        {
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(
                (lines.first(), lines.last()),
                (Some(&"{{- if .Values.crds.install }}"), Some(&"{{- end }}")),
                "{name}: the CRD must be rendered only with crds.install"
            );
            with_crd.push(name);
        }
    }
    assert_eq!(with_crd, ["crd.yaml"]);
}

#[test]
fn helm_lint_and_template_when_helm_is_installed() {
    let Ok(version) = Command::new("helm").arg("version").output() else {
        eprintln!("skipped: helm is not on PATH; `helm lint` and `helm template` did not run");
        return;
    };
    assert!(version.status.success());
    let chart = chart();
    for args in [
        vec!["lint", "--strict", chart.to_str().unwrap()],
        vec!["template", "t", chart.to_str().unwrap()],
        vec![
            "template",
            "t",
            chart.to_str().unwrap(),
            "--set",
            "replicaCount=2,leaderElection.enabled=true,metrics.serviceMonitor.enabled=true,dashboard.enabled=true",
        ],
        vec![
            "template",
            "t",
            chart.to_str().unwrap(),
            "--set",
            "watchNamespaces={team-a,team-b},allowedSidecarImages={registry.example.com/*}",
        ],
    ] {
        let out = Command::new("helm").args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "helm {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The CRD with the default values, none with `crds.install=false`.
    for (set, crds) in [("crds.install=true", 1), ("crds.install=false", 0)] {
        let out = Command::new("helm")
            .args(["template", "t", chart.to_str().unwrap(), "--set", set])
            .output()
            .unwrap();
        assert!(out.status.success(), "helm template --set {set}");
        let rendered = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            rendered
                .matches("\nkind: CustomResourceDefinition\n")
                .count(),
            crds,
            "helm template --set {set}"
        );
    }
    let refused = Command::new("helm")
        .args([
            "template",
            "t",
            chart.to_str().unwrap(),
            "--set",
            "replicaCount=2",
        ])
        .output()
        .unwrap();
    assert!(
        !refused.status.success(),
        "2 replicas without leader election must be refused"
    );
}

//! Every citation in the repository leads somewhere inside it. Over each `.rs`, `.yaml` and `.md`
//! file (build output and hidden folders left out), one test per rule:
//!
//! - no document is cited that a checkout does not hold: design notes, notes, field reports or
//!   issue numbers kept elsewhere (a full URL is fine: anyone can follow it);
//! - a relative Markdown link leads to a file that exists and, with `#anchor`, to a heading of it
//!   (GitHub's slugs);
//! - a repository path in backticks (`` `docs/…` ``, `` `sidecar/src/…` ``) exists, and so does
//!   its `#anchor` on a Markdown page;
//! - a backticked test name (a snake_case word of four parts or more) is a `fn` of the workspace;
//! - a spec id (`R-03`) is one `docs/reference/spec-checklist.md` lists, and that page lists under
//!   each id and each field scenario (`fr15`) exactly the functions named after it.
//!
//! This file spells out the patterns it looks for, so it is the one file the rules skip.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use tether_tests::repo::{files, read, root};

/// This file, which names what it forbids.
const SELF: &str = "tests/tests/repo/references.rs";

/// The page that lists the spec ids and field scenarios.
const CHECKLIST: &str = "docs/reference/spec-checklist.md";

/// Documents cited in the project's history that a checkout does not hold (compared without
/// case). Spelled in parts where a plain repository grep for such citations would otherwise
/// find this list instead of a real citation.
const FOREIGN_DOCUMENTS: [&str; 8] = [
    "design.md",
    "design §",
    concat!("rust", "-notes"),
    "mcp-spec",
    "field-reports",
    "bug-reports.md",
    "../shared",
    "/work/shared",
];

/// Words that, followed by a number, cite an issue or a report kept elsewhere.
const NUMBERED_CITATIONS: [&str; 2] = ["field report", "issue"];

/// The folders of the repository a backticked path may start with.
const PATH_ROOTS: [&str; 8] = [
    "docs/",
    "sidecar/",
    "tests/",
    "operator/",
    "crds/",
    "charts/",
    "examples/",
    "images/",
];

/// A file of the repository: its path from the root and its text.
struct Source {
    path: String,
    text: String,
}

fn sources() -> &'static [Source] {
    static SOURCES: OnceLock<Vec<Source>> = OnceLock::new();
    SOURCES.get_or_init(|| {
        files("", &["rs", "yaml", "yml", "md"])
            .into_iter()
            .filter(|p| p != SELF)
            .map(|path| Source {
                text: read(&path),
                path,
            })
            .collect()
    })
}

/// A line of a source: its number (from 1), its text, and whether it is prose — in a Markdown
/// file the lines of fenced code blocks are not.
struct Line<'a> {
    number: usize,
    text: &'a str,
    prose: bool,
}

fn lines<'a>(path: &str, text: &'a str) -> Vec<Line<'a>> {
    let markdown = path.ends_with(".md");
    let mut fenced = false;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            let fence = markdown && {
                let t = line.trim_start();
                t.starts_with("```") || t.starts_with("~~~")
            };
            if fence {
                fenced = !fenced;
            }
            Line {
                number: i + 1,
                text: line,
                prose: !fence && !fenced,
            }
        })
        .collect()
}

/// The code spans of one line (a run of backticks up to the next run of the same length), and
/// the line with them blanked out.
fn code_spans(line: &str) -> (Vec<&str>, String) {
    let bytes = line.as_bytes();
    let run = |from: usize| bytes[from..].iter().take_while(|&&b| b == b'`').count();
    let mut spans = Vec::new();
    let mut rest = line.to_owned().into_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let open = run(i);
        let start = i + open;
        let mut j = start;
        let mut close = None;
        while j < bytes.len() {
            if bytes[j] == b'`' {
                let n = run(j);
                if n == open {
                    close = Some(j);
                    break;
                }
                j += n;
            } else {
                j += 1;
            }
        }
        let Some(end) = close else {
            i = start;
            continue;
        };
        spans.push(line[start..end].trim());
        rest[i..end + open].fill(b' ');
        i = end + open;
    }
    // Only ASCII bytes were blanked, so the rest is still UTF-8.
    (spans, String::from_utf8(rest).unwrap_or_default())
}

/// GitHub's anchor of a heading: lowercase, punctuation dropped but `-` and `_`, spaces → `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of the headings of a Markdown page; a repeated heading gets `-1`, `-2`, ….
fn anchors(path: &str, text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in lines(path, text).into_iter().filter(|l| l.prose) {
        let t = line.text.trim_start();
        let level = t.bytes().take_while(|&b| b == b'#').count();
        if !(1..=6).contains(&level) || !t[level..].starts_with(' ') {
            continue;
        }
        let base = slug(t[level..].trim().trim_end_matches('#'));
        let n = seen.entry(base.clone()).or_default();
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The anchors of every Markdown page, by path.
fn headings() -> &'static BTreeMap<String, BTreeSet<String>> {
    static HEADINGS: OnceLock<BTreeMap<String, BTreeSet<String>>> = OnceLock::new();
    HEADINGS.get_or_init(|| {
        sources()
            .iter()
            .filter(|s| s.path.ends_with(".md"))
            .map(|s| (s.path.clone(), anchors(&s.path, &s.text)))
            .collect()
    })
}

/// The targets of the inline links `[text](target)` of a line whose code spans are blanked out.
fn link_targets(line: &str) -> Vec<&str> {
    line.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &line[at + 2..];
            let end = rest.find(|c: char| c == ')' || c.is_whitespace())?;
            Some(&rest[..end])
        })
        .collect()
}

/// `target` relative to the folder of the file `from` (both paths from the root), or `None`
/// when it leaves the repository.
fn resolve(from: &str, target: &str) -> Option<String> {
    let mut parts: Vec<&str> = from.split('/').collect();
    parts.pop();
    for segment in target.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts.join("/"))
}

/// Why `path#anchor` (a path from the root, `anchor` possibly empty) leads nowhere, if it does.
fn dead_end(path: &str, anchor: &str) -> Option<String> {
    if !root().join(path).exists() {
        return Some("no such file".into());
    }
    if anchor.is_empty() || !path.ends_with(".md") {
        return None;
    }
    let known = headings().get(path)?;
    (!known.contains(anchor)).then(|| format!("no heading #{anchor} in {path}"))
}

/// A repository path a code span names, split at its `#`: `docs/guide/x.md#y` → (path, anchor).
/// Globs and placeholders (`images/*.Dockerfile`, `docs/…`) are not paths.
fn repo_path(span: &str) -> Option<(&str, &str)> {
    if !PATH_ROOTS.iter().any(|r| span.starts_with(r))
        || span.contains(|c: char| c.is_whitespace() || "*?<>{}[]$…".contains(c))
    {
        return None;
    }
    Some(span.split_once('#').unwrap_or((span, "")))
}

/// The test a code span names, if it names one: a snake_case word of four parts or more,
/// possibly the last segment of a `module::path` or followed by `()`. Metric names (`tether_…`)
/// are not tests.
fn test_name(span: &str) -> Option<&str> {
    let span = span.strip_suffix("()").unwrap_or(span);
    let snake = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    if !span.split("::").all(snake) {
        return None;
    }
    let word = span.rsplit("::").next()?;
    let parts = word.split('_').collect::<Vec<_>>();
    (word.starts_with(|c: char| c.is_ascii_lowercase())
        && !word.starts_with("tether_")
        && parts.len() >= 4
        && parts.iter().all(|p| !p.is_empty()))
    .then_some(word)
}

/// Every function name of the workspace's Rust files, this one's included.
fn functions() -> &'static BTreeSet<String> {
    static FUNCTIONS: OnceLock<BTreeSet<String>> = OnceLock::new();
    FUNCTIONS.get_or_init(|| {
        let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        let own = read(SELF);
        let rust = sources().iter().filter(|s| s.path.ends_with(".rs"));
        let mut out = BTreeSet::new();
        for text in rust.map(|s| s.text.as_str()).chain([own.as_str()]) {
            let bytes = text.as_bytes();
            for (at, _) in text.match_indices("fn ") {
                if at > 0 && ident(bytes[at - 1]) {
                    continue;
                }
                let name: String = text[at + 3..]
                    .bytes()
                    .take_while(|&b| ident(b))
                    .map(char::from)
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
        out
    })
}

/// The spec ids `text` cites: a capital letter, `-` and two digits, as a word of its own.
fn spec_ids(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let word = |i: usize| {
        b.get(i)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
    };
    (0..b.len().saturating_sub(3))
        .filter(|&i| {
            b[i].is_ascii_uppercase()
                && b[i + 1] == b'-'
                && b[i + 2].is_ascii_digit()
                && b[i + 3].is_ascii_digit()
                && (i == 0 || !word(i - 1))
                && !word(i + 4)
        })
        .map(|i| &text[i..i + 4])
        .collect()
}

/// The ids a function's name is led by, in the checklist's spelling:
/// `r01_r03_fr9_interleaved_…` → `R-01`, `R-03`, `fr9`. Only letters of `families` make ids.
fn leading_ids(name: &str, families: &BTreeSet<char>) -> Vec<String> {
    let mut out = Vec::new();
    for part in name.split('_') {
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let mut chars = part.chars();
        match (chars.next(), part.strip_prefix("fr")) {
            (_, Some(n)) if digits(n) => out.push(part.to_owned()),
            (Some(c), _)
                if part.len() == 3
                    && digits(&part[1..])
                    && families.contains(&c.to_ascii_uppercase()) =>
            {
                out.push(format!("{}-{}", c.to_ascii_uppercase(), &part[1..]));
            }
            _ => break,
        }
    }
    out
}

/// The citations in `line` of documents the repository does not hold.
fn foreign_citations(line: &str) -> Vec<String> {
    let lower = line.to_lowercase();
    let mut out: Vec<String> = FOREIGN_DOCUMENTS
        .iter()
        .filter(|d| lower.contains(*d))
        .map(|d| (*d).to_owned())
        .collect();
    for word in NUMBERED_CITATIONS {
        for (at, _) in lower.match_indices(word) {
            if lower[..at].ends_with(|c: char| c.is_alphanumeric()) {
                continue;
            }
            let after = &lower[at + word.len()..];
            let after = after.strip_prefix('s').unwrap_or(after);
            let number = after.trim_start_matches([' ', '#']);
            let digits = number.bytes().take_while(u8::is_ascii_digit).count();
            if number.len() < after.len() && digits > 0 {
                let end = lower.len() - number.len() + digits;
                out.push(lower[at..end].to_owned());
            }
        }
    }
    out
}

/// The rows of the checklist's tables whose first cell is an id (`R-03`, `fr15`): id → the
/// function names in the row's last cell.
fn checklist() -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for line in read(CHECKLIST).lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // "| `R-03` | … | `r03_x`, `r03_y` |" splits into ["", id, …, tests, ""].
        if cells.len() < 4 {
            continue;
        }
        let id = cells[1].trim_matches('`');
        let is_id = spec_ids(id) == [id] || leading_ids(id, &BTreeSet::new()) == [id];
        if !is_id {
            continue;
        }
        let tests = code_spans(cells[cells.len() - 2]).0;
        let previous = out.insert(
            id.to_owned(),
            tests.into_iter().map(str::to_owned).collect(),
        );
        assert!(previous.is_none(), "{CHECKLIST} lists {id} twice");
    }
    out
}

/// The letters of the spec ids the checklist lists (`R` for `R-03`).
fn families(listed: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<char> {
    listed
        .keys()
        .filter(|id| id.len() == 4 && id.as_bytes()[1] == b'-')
        .filter_map(|id| id.chars().next())
        .collect()
}

/// Fails with one line per violation, `file:line: what`.
fn report(rule: &str, violations: &[String]) {
    assert!(
        violations.is_empty(),
        "{rule} ({} found):\n{}",
        violations.len(),
        violations.join("\n")
    );
}

#[test]
fn no_file_cites_a_document_the_repository_does_not_hold() {
    let mut found = Vec::new();
    for source in sources() {
        for line in lines(&source.path, &source.text) {
            for citation in foreign_citations(line.text) {
                found.push(format!("{}:{}: {citation}", source.path, line.number));
            }
        }
    }
    report(
        "citations of documents that are not in the repository: link a page of docs/ or name \
         the test instead",
        &found,
    );
}

#[test]
fn relative_markdown_links_lead_to_a_file_and_a_heading_of_it() {
    let mut found = Vec::new();
    for source in sources().iter().filter(|s| s.path.ends_with(".md")) {
        for line in lines(&source.path, &source.text)
            .into_iter()
            .filter(|l| l.prose)
        {
            let (_, text) = code_spans(line.text);
            for target in link_targets(&text) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
                let resolved = if path.is_empty() {
                    Some(source.path.clone())
                } else {
                    resolve(&source.path, path)
                };
                let why = match &resolved {
                    None => Some("leaves the repository".to_owned()),
                    Some(p) => dead_end(p, anchor),
                };
                if let Some(why) = why {
                    found.push(format!(
                        "{}:{}: ({target}): {why}",
                        source.path, line.number
                    ));
                }
            }
        }
    }
    report("links that lead nowhere", &found);
}

#[test]
fn backticked_repository_paths_exist() {
    let mut found = Vec::new();
    for source in sources() {
        for line in lines(&source.path, &source.text) {
            for span in code_spans(line.text).0 {
                let Some((path, anchor)) = repo_path(span) else {
                    continue;
                };
                if let Some(why) = dead_end(path.trim_end_matches('/'), anchor) {
                    found.push(format!("{}:{}: `{span}`: {why}", source.path, line.number));
                }
            }
        }
    }
    report("repository paths that do not exist", &found);
}

#[test]
fn backticked_test_names_are_functions_of_the_workspace() {
    let known = functions();
    let mut found = Vec::new();
    for source in sources() {
        for line in lines(&source.path, &source.text) {
            for span in code_spans(line.text).0 {
                if let Some(name) = test_name(span).filter(|n| !known.contains(*n)) {
                    found.push(format!("{}:{}: `{name}`", source.path, line.number));
                }
            }
        }
    }
    report(
        "test names that are no function of the workspace (renamed or removed?)",
        &found,
    );
}

#[test]
fn every_cited_spec_id_is_in_the_checklist() {
    let listed = checklist();
    let families = families(&listed);
    assert!(
        families.len() >= 8,
        "{CHECKLIST} lists too few families: {families:?}"
    );
    let mut found = Vec::new();
    for source in sources() {
        for line in lines(&source.path, &source.text) {
            for id in spec_ids(line.text) {
                let family = id.chars().next().unwrap_or_default();
                if families.contains(&family) && !listed.contains_key(id) {
                    found.push(format!("{}:{}: {id}", source.path, line.number));
                }
            }
        }
    }
    for name in functions() {
        for id in leading_ids(name, &families) {
            if !listed.contains_key(&id) {
                found.push(format!("fn {name}: {id}"));
            }
        }
    }
    report(&format!("ids that {CHECKLIST} does not list"), &found);
}

#[test]
fn the_checklist_lists_exactly_the_tests_named_after_each_id() {
    let listed = checklist();
    let families = families(&listed);
    let mut named: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for name in functions() {
        for id in leading_ids(name, &families) {
            named.entry(id).or_default().insert(name.clone());
        }
    }
    let mut found = Vec::new();
    for (id, tests) in &listed {
        let expected = named.remove(id).unwrap_or_default();
        for missing in expected.difference(tests) {
            found.push(format!("{id}: `{missing}` is not listed"));
        }
        for extra in tests.difference(&expected) {
            found.push(format!(
                "{id}: `{extra}` is listed but not named after {id}"
            ));
        }
    }
    report(&format!("{CHECKLIST} against the test names"), &found);
}

/// The CRD as the API server gets it: what `kubectl explain` and `kubectl describe crd` show.
const CRDS: [&str; 2] = [
    "crds/mcpendpoints.mcp.tether.dev.yaml",
    "charts/tether/templates/crd.yaml",
];

#[test]
fn what_kubectl_explain_shows_names_no_file_and_no_spec_id() {
    let mut found = Vec::new();
    for crd in CRDS {
        // Comments (the chart template's header) do not reach the API server.
        let text = read(crd);
        let served = lines(crd, &text)
            .into_iter()
            .filter(|l| !l.text.trim_start().starts_with('#'));
        for line in served {
            let words = line
                .text
                .split(|c: char| c.is_whitespace() || "`'\"()[],;".contains(c));
            let files =
                words.filter(|w| PATH_ROOTS.iter().any(|r| w.starts_with(r)) || w.ends_with(".md"));
            for cited in files.chain(spec_ids(line.text)) {
                found.push(format!("{crd}:{}: {cited}", line.number));
            }
        }
    }
    report(
        "CRD descriptions that name a file or a spec id (a user of the API has neither: say the \
         behaviour; the descriptions are the doc comments of crds/src/spec.rs, then `make crds`)",
        &found,
    );
}

#[test]
fn the_helpers_parse_what_the_rules_read() {
    // GitHub's slugs: code and punctuation dropped, `-`/`_` kept, each space a dash.
    assert_eq!(slug("1. Prerequisites"), "1-prerequisites");
    assert_eq!(
        slug("Static peers file: `--peers-file FILE` (`TETHER_PEERS_FILE`)"),
        "static-peers-file---peers-file-file-tether_peers_file"
    );
    assert_eq!(
        slug("The session ring (hash contract v1)"),
        "the-session-ring-hash-contract-v1"
    );
    assert_eq!(slug("`spec.admin`"), "specadmin");
    let page = "# A\n## Drain\n```sh\n# not a heading\n```\n## Drain\n#not-one\n## B ##\n";
    assert_eq!(
        anchors("x.md", page).into_iter().collect::<Vec<_>>(),
        ["a", "b", "drain", "drain-1"]
    );
    // Code spans of any backtick run; a lone backtick opens nothing.
    let (spans, rest) = code_spans("a `b` ``c ` d`` e [x](`y`), a lone ` here");
    assert_eq!(spans, ["b", "c ` d", "y"]);
    assert_eq!(link_targets(&rest), [""]);
    assert_eq!(
        link_targets("[a](../b.md#c) and [d](#e \"t\") ![i](img.png)"),
        ["../b.md#c", "#e", "img.png"]
    );
    assert_eq!(
        resolve("docs/guide/x.md", "../design/y.md"),
        Some("docs/design/y.md".into())
    );
    assert_eq!(resolve("README.md", "docs/"), Some("docs".into()));
    assert_eq!(resolve("README.md", "../x.md"), None);
    assert_eq!(repo_path("docs/a.md#b"), Some(("docs/a.md", "b")));
    assert_eq!(repo_path("images/*.Dockerfile"), None);
    assert_eq!(repo_path("cargo test -p x"), None);
    assert_eq!(
        test_name("faults::r05_a_lost_priming_event"),
        Some("r05_a_lost_priming_event")
    );
    assert_eq!(test_name("a_b_c_d()"), Some("a_b_c_d"));
    assert_eq!(test_name("tether_not_found_total"), None);
    assert_eq!(test_name("unsupported_protocol_version"), None);
    assert_eq!(test_name("__meta_kubernetes_pod_container_init"), None);
    assert_eq!(test_name("Mixed_case_is_not_a_test"), None);
    assert_eq!(
        spec_ids("R-03, (S-05/S-06) SHA-256 UTF-8 XR-01 R-012"),
        ["R-03", "S-05", "S-06"]
    );
    let families: BTreeSet<char> = ['R', 'O'].into();
    assert_eq!(
        leading_ids("o02_fr24_r01_bad_r05", &families),
        ["O-02", "fr24", "R-01"]
    );
    assert_eq!(leading_ids("u64_be_bytes", &families), Vec::<String>::new());
    assert_eq!(
        foreign_citations("see Design.md §4, field reports 4 and 5, Issue #13"),
        ["design.md", "field reports 4", "issue #13"]
    );
    assert_eq!(
        foreign_citations("rust-sdk/issues/791 is public; a tissue 5, an issue of size"),
        Vec::<String>::new()
    );
}

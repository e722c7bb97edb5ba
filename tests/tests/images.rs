//! The container images (issue 6): each `images/*.Dockerfile` is checked against the code it
//! packages, since no test here can build an image.
//!
//! A small Dockerfile parser (comments, blank lines and `\` continuations) splits a file into
//! stages; [`check`] then reports, per [`Check`]:
//!
//! - `Syntax`: the file parses, and only `ARG` comes before the first `FROM`;
//! - `MultiStage`: a builder stage and a different, non-Rust runtime base for the final stage;
//! - `Pinned`: every base image has an explicit tag other than `latest` (no `$VARIABLE`);
//! - `Toolchain`: the builder is `rust:X.Y.Z-…`, an exact release not older than the
//!   workspace's `rust-version`;
//! - `Build`: the builder runs `cargo build --release --locked -p <package> --bin <binary>`
//!   with the package's own name and one of its binaries (its `[[bin]]` names);
//! - `Copy`: the final stage copies that binary from the stage that built it, from a path the
//!   build step produced outside its cache mounts;
//! - `Entrypoint`: the exec-form `ENTRYPOINT` runs the copied file, named like the binary;
//! - `User`: a numeric, non-root `USER uid:gid` (the injected sidecar's `runAsUser` and
//!   `runAsGroup` for the sidecar image);
//! - `Expose`: the TCP ports the binary listens on by default, taken from the code;
//! - `Shell`: nothing in the final stage needs a shell, which distroless lacks (no `RUN`,
//!   `SHELL` or `ONBUILD`; exec-form `ENTRYPOINT`, `CMD` and `HEALTHCHECK`);
//! - `Labels`: OCI labels title (the binary), source and licenses (the workspace's).
//!
//! [`each_check_fails_on_its_mutation`] shows that every check can fail.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use k8s_openapi::api::apps::v1::Deployment;

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

/// One instruction, its continuation lines joined.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Instruction {
    /// Line of the instruction's first line (1-based).
    line: usize,
    /// The keyword, upper-cased (`FROM`, `RUN`, …).
    keyword: String,
    /// Everything after the keyword.
    args: String,
}

/// Splits a Dockerfile into instructions: lines whose first non-blank character is `#` are
/// comments (parser directives included) and are dropped, also inside a continuation, as are
/// blank lines; a line ending in `\` continues on the next one.
fn parse(text: &str) -> Result<Vec<Instruction>, String> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if let Some(comment) = trimmed.strip_prefix('#') {
            if comment
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("escape=")
            {
                return Err(format!(
                    "line {}: the escape directive is not supported",
                    i + 1
                ));
            }
            continue;
        }
        if trimmed.is_empty() {
            continue;
        }
        let (body, continues) = match trimmed.strip_suffix('\\') {
            Some(body) => (body.trim_end(), true),
            None => (trimmed, false),
        };
        let (line, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        if !joined.is_empty() && !body.is_empty() {
            joined.push(' ');
        }
        joined.push_str(body);
        if continues {
            pending = Some((line, joined));
        } else {
            out.push(instruction(line, &joined)?);
        }
    }
    match pending {
        Some((line, _)) => Err(format!(
            "line {line}: a continuation runs past the end of the file"
        )),
        None => Ok(out),
    }
}

fn instruction(line: usize, text: &str) -> Result<Instruction, String> {
    let (keyword, args) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    if keyword.is_empty() || !keyword.chars().all(|c| c.is_ascii_alphabetic()) {
        return Err(format!("line {line}: `{keyword}` is not an instruction"));
    }
    Ok(Instruction {
        line,
        keyword: keyword.to_ascii_uppercase(),
        args: args.trim().to_owned(),
    })
}

/// A build stage: its `FROM` and the instructions up to the next one.
#[derive(Clone, Debug)]
struct Stage {
    /// The base: an image reference or an earlier stage's name.
    image: String,
    /// `AS <name>`.
    name: Option<String>,
    line: usize,
    body: Vec<Instruction>,
}

impl Stage {
    fn all<'a>(&'a self, keyword: &'a str) -> impl Iterator<Item = &'a Instruction> + 'a {
        self.body.iter().filter(move |i| i.keyword == keyword)
    }

    fn last(&self, keyword: &str) -> Option<&Instruction> {
        self.body.iter().rev().find(|i| i.keyword == keyword)
    }
}

fn stages(instructions: &[Instruction]) -> Result<Vec<Stage>, String> {
    let mut out: Vec<Stage> = Vec::new();
    for ins in instructions {
        if ins.keyword == "FROM" {
            let mut words = ins.args.split_whitespace().filter(|w| !w.starts_with("--"));
            let image = words
                .next()
                .ok_or_else(|| format!("line {}: FROM names no image", ins.line))?;
            let name = match (words.next(), words.next()) {
                (Some(r#as), Some(name)) if r#as.eq_ignore_ascii_case("as") => {
                    Some(name.to_owned())
                }
                (None, None) => None,
                _ => return Err(format!("line {}: malformed FROM", ins.line)),
            };
            out.push(Stage {
                image: image.to_owned(),
                name,
                line: ins.line,
                body: Vec::new(),
            });
        } else if let Some(stage) = out.last_mut() {
            stage.body.push(ins.clone());
        } else if ins.keyword != "ARG" {
            return Err(format!(
                "line {}: {} before the first FROM",
                ins.line, ins.keyword
            ));
        }
    }
    if out.is_empty() {
        return Err("no FROM".into());
    }
    Ok(out)
}

/// The exec form (`["a", "b"]`) of an `ENTRYPOINT`, `CMD` or `HEALTHCHECK CMD`; `None` for the
/// shell form.
fn exec_form(args: &str) -> Option<Vec<String>> {
    serde_json::from_str(args).ok()
}

/// A `RUN`'s options (`--mount=…`) and its shell commands (split at `&&`, `||` and `;`), each
/// as words.
fn run_commands(args: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut words = args.split_whitespace().peekable();
    let mut options = Vec::new();
    while let Some(w) = words.next_if(|w| w.starts_with("--")) {
        options.push(w.to_owned());
    }
    let rest: Vec<&str> = words.collect();
    let script = rest
        .join(" ")
        .replace("&&", "\n")
        .replace("||", "\n")
        .replace(';', "\n");
    let commands = script
        .lines()
        .map(|c| c.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter(|c| !c.is_empty())
        .collect();
    (options, commands)
}

/// Targets of a `RUN`'s `--mount=type=cache,target=…` options.
fn cache_mounts(options: &[String]) -> Vec<String> {
    options
        .iter()
        .filter_map(|o| o.strip_prefix("--mount="))
        .filter(|m| m.split(',').any(|kv| kv == "type=cache"))
        .filter_map(|m| {
            m.split(',')
                .find_map(|kv| kv.strip_prefix("target=").or(kv.strip_prefix("dst=")))
                .map(str::to_owned)
        })
        .collect()
}

/// What a `cargo build` command asks for.
#[derive(Debug, Default)]
struct CargoBuild {
    release: bool,
    locked: bool,
    bins: Vec<String>,
    packages: Vec<String>,
}

fn cargo_build(words: &[String]) -> Option<CargoBuild> {
    let mut rest = words.strip_prefix(&["cargo".to_owned()])?;
    if rest.first().is_some_and(|w| w.starts_with('+')) {
        rest = &rest[1..];
    }
    let rest = rest.strip_prefix(&["build".to_owned()])?;
    let mut build = CargoBuild::default();
    let mut it = rest.iter();
    while let Some(w) = it.next() {
        match w.as_str() {
            "--release" | "-r" => build.release = true,
            "--locked" | "--frozen" => build.locked = true,
            "--bin" => build.bins.extend(it.next().cloned()),
            "-p" | "--package" => build.packages.extend(it.next().cloned()),
            _ => {
                if let Some(bin) = w.strip_prefix("--bin=") {
                    build.bins.push(bin.to_owned());
                } else if let Some(p) = w.strip_prefix("--package=") {
                    build.packages.push(p.to_owned());
                }
            }
        }
    }
    Some(build)
}

/// `(source, destination)` of an `install` or `cp` command with one source.
fn copy_command(words: &[String]) -> Option<(String, String)> {
    let (command, args) = words.split_first()?;
    if command != "install" && command != "cp" {
        return None;
    }
    let mut operands = Vec::new();
    let mut it = args.iter();
    while let Some(w) = it.next() {
        if command == "install" && matches!(w.as_str(), "-m" | "-o" | "-g") {
            it.next();
        } else if !w.starts_with('-') {
            operands.push(w.clone());
        }
    }
    match operands.as_slice() {
        [src, dst] => Some((src.clone(), dst.clone())),
        _ => None,
    }
}

/// `key=value` pairs of a `LABEL` (values bare or double-quoted).
fn labels(args: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut chars = args.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        if chars.next() != Some('=') {
            return Err(format!("LABEL {key}: not key=value"));
        }
        let mut value = String::new();
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('"') => break,
                    Some(c) => value.push(c),
                    None => return Err(format!("LABEL {key}: unterminated quote")),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                value.push(c);
            }
        }
        out.push((key, value));
    }
}

/// A Rust release, `1.95.0` (`1.89` reads as `1.89.0`).
fn version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
    let v = (
        parts.next()??,
        parts.next()??,
        parts.next().unwrap_or(Some(0))?,
    );
    parts.next().is_none().then_some(v)
}

// ---------------------------------------------------------------------------------------------
// Checking
// ---------------------------------------------------------------------------------------------

/// The checks [`check`] runs; each problem names one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Check {
    Syntax,
    MultiStage,
    Pinned,
    Toolchain,
    Build,
    Copy,
    Entrypoint,
    User,
    Expose,
    Shell,
    Labels,
}

/// What an image must hold, from the code.
#[derive(Clone, Debug)]
struct Expect {
    /// The binary the image runs.
    binary: String,
    /// The Cargo package that builds it, and every binary of that package.
    package: String,
    package_bins: Vec<String>,
    /// The UID and GID it must run as; `None`: any non-root ones.
    user: Option<u32>,
    /// TCP ports the binary listens on by default.
    ports: BTreeSet<u16>,
    /// The workspace's `rust-version`.
    min_rust: (u32, u32, u32),
    /// The workspace's `license` and `repository`.
    license: String,
    source: String,
}

type Problems = Vec<(Check, String)>;

/// Every problem of `dockerfile` against `expect` (empty when it is right).
fn check(dockerfile: &str, expect: &Expect) -> Problems {
    let mut problems = Problems::new();
    let stages = match parse(dockerfile).and_then(|i| stages(&i)) {
        Ok(s) => s,
        Err(e) => return vec![(Check::Syntax, e)],
    };
    let last = stages.last().expect("stages() returns at least one");
    let stage_names: Vec<&str> = stages.iter().filter_map(|s| s.name.as_deref()).collect();

    // Multi-stage: a builder, and a runtime base that is neither a stage nor a Rust image.
    if stages.len() < 2 {
        problems.push((Check::MultiStage, "one stage: no separate builder".into()));
    }
    if stage_names.contains(&last.image.as_str()) || last.image.starts_with("rust:") {
        problems.push((
            Check::MultiStage,
            format!(
                "the final stage builds on {}, not on a small runtime image",
                last.image
            ),
        ));
    }

    // Pinned bases.
    for (i, stage) in stages.iter().enumerate() {
        let earlier = stages[..i]
            .iter()
            .any(|s| s.name.as_deref() == Some(&stage.image));
        if earlier {
            continue;
        }
        let reference = stage.image.split('@').next().unwrap_or_default();
        let tag = reference
            .rsplit_once(':')
            .filter(|(_, tag)| !tag.contains('/'))
            .map(|(_, tag)| tag);
        let problem = if stage.image.contains('$') {
            Some("is a variable")
        } else {
            match tag {
                None => Some("has no tag"),
                Some("latest") => Some("is `latest`"),
                Some(_) => None,
            }
        };
        if let Some(problem) = problem {
            problems.push((
                Check::Pinned,
                format!("line {}: base {} {problem}", stage.line, stage.image),
            ));
        }
    }

    // The build: one stage runs `cargo build` for the binary.
    let mut built = None;
    for (si, stage) in stages.iter().enumerate() {
        for run in stage.all("RUN") {
            let (options, commands) = run_commands(&run.args);
            for command in &commands {
                if let Some(build) = cargo_build(command) {
                    built = Some((si, build, options.clone(), commands.clone()));
                }
            }
        }
    }
    let Some((builder, build, build_options, build_commands)) = built else {
        problems.push((Check::Build, "no stage runs `cargo build`".into()));
        return problems;
    };
    let builder_stage = &stages[builder];
    let rust = builder_stage
        .image
        .split('@')
        .next()
        .and_then(|r| r.strip_prefix("rust:"))
        .map(|tag| tag.split('-').next().unwrap_or_default());
    match rust {
        None => problems.push((
            Check::Toolchain,
            format!(
                "the builder's base {} is no rust image",
                builder_stage.image
            ),
        )),
        Some(tag) => match version(tag) {
            Some(v) if tag.split('.').count() == 3 && v >= expect.min_rust => {}
            Some(_) if tag.split('.').count() == 3 => problems.push((
                Check::Toolchain,
                format!(
                    "rust {tag} is older than the workspace's rust-version {:?}",
                    expect.min_rust
                ),
            )),
            _ => problems.push((
                Check::Toolchain,
                format!("rust:{tag} is not an exact release (X.Y.Z)"),
            )),
        },
    }
    if builder == stages.len() - 1 {
        problems.push((Check::Build, "the final stage is the builder".into()));
    }
    if build.bins != [expect.binary.clone()] {
        problems.push((
            Check::Build,
            format!("cargo builds --bin {:?}, not {}", build.bins, expect.binary),
        ));
    }
    if !expect.package_bins.contains(&expect.binary) {
        problems.push((
            Check::Build,
            format!(
                "{} is not a binary of {} ({:?})",
                expect.binary, expect.package, expect.package_bins
            ),
        ));
    }
    if build.packages != [expect.package.clone()] {
        problems.push((
            Check::Build,
            format!(
                "cargo builds -p {:?}, not {}",
                build.packages, expect.package
            ),
        ));
    }
    if !build.release || !build.locked {
        problems.push((
            Check::Build,
            "cargo build without --release or --locked".into(),
        ));
    }

    // The copy: the final stage takes the built binary from the builder.
    let built_path = format!("target/release/{}", expect.binary);
    let caches = cache_mounts(&build_options);
    let mut copied = None;
    for copy in last.all("COPY") {
        let words: Vec<&str> = copy.args.split_whitespace().collect();
        let Some(from) = words.iter().find_map(|w| w.strip_prefix("--from=")) else {
            continue;
        };
        let paths: Vec<&str> = words
            .iter()
            .copied()
            .filter(|w| !w.starts_with("--"))
            .collect();
        let [src, dst] = paths.as_slice() else {
            problems.push((
                Check::Copy,
                format!("line {}: COPY of several files", copy.line),
            ));
            continue;
        };
        if builder_stage.name.as_deref() != Some(from) {
            problems.push((
                Check::Copy,
                format!("line {}: copies from {from}, not the builder", copy.line),
            ));
            continue;
        }
        let name = |p: &str| p.rsplit('/').next().unwrap_or_default().to_owned();
        if name(src) != expect.binary {
            problems.push((
                Check::Copy,
                format!("line {}: copies {src}, not {}", copy.line, expect.binary),
            ));
        }
        let produced = build_commands
            .iter()
            .filter_map(|c| copy_command(c))
            .any(|(from, to)| from.trim_start_matches("./").ends_with(&built_path) && to == *src);
        let in_cache = caches
            .iter()
            .any(|c| src.starts_with(&format!("{}/", c.trim_end_matches('/'))));
        if !(produced || (src.ends_with(&built_path) && src.starts_with('/') && !in_cache)) {
            problems.push((
                Check::Copy,
                format!(
                    "line {}: the build step does not leave {built_path} at {src} (outside its cache mounts)",
                    copy.line
                ),
            ));
        }
        let dst = if dst.ends_with('/') {
            format!("{dst}{}", name(src))
        } else {
            (*dst).to_owned()
        };
        copied = Some(dst);
    }
    let Some(copied) = copied else {
        problems.push((
            Check::Copy,
            "the final stage copies nothing from the builder".into(),
        ));
        return problems;
    };

    // The entrypoint runs the copied binary.
    match last.last("ENTRYPOINT").map(|e| exec_form(&e.args)) {
        None => problems.push((Check::Entrypoint, "no ENTRYPOINT".into())),
        Some(None) => problems.push((
            Check::Shell,
            "ENTRYPOINT in shell form (needs /bin/sh)".into(),
        )),
        Some(Some(argv)) => {
            let program = argv.first().map(String::as_str).unwrap_or_default();
            if program != copied || !program.ends_with(&format!("/{}", expect.binary)) {
                problems.push((
                    Check::Entrypoint,
                    format!(
                        "ENTRYPOINT runs {program:?}; the image holds {} at {copied}",
                        expect.binary
                    ),
                ));
            }
        }
    }

    // The user.
    match last.last("USER") {
        None => problems.push((
            Check::User,
            "the final stage sets no USER (the base's is not checked)".into(),
        )),
        Some(user) => {
            let (uid, gid) = user
                .args
                .split_once(':')
                .unwrap_or((&user.args, &user.args));
            match (uid.parse::<u32>(), gid.parse::<u32>()) {
                (Ok(uid), Ok(gid)) => {
                    if uid == 0 || gid == 0 {
                        problems.push((Check::User, format!("USER {} is root", user.args)));
                    }
                    if let Some(want) = expect.user
                        && (uid != want || gid != want)
                    {
                        problems.push((
                            Check::User,
                            format!("USER {}; the pods run as {want}:{want}", user.args),
                        ));
                    }
                }
                _ => problems.push((
                    Check::User,
                    format!(
                        "USER {} is not numeric (runAsNonRoot cannot verify it)",
                        user.args
                    ),
                )),
            }
        }
    }

    // The ports.
    let mut exposed = BTreeSet::new();
    for expose in last.all("EXPOSE") {
        for port in expose.args.split_whitespace() {
            let (number, protocol) = port.split_once('/').unwrap_or((port, "tcp"));
            match number.parse::<u16>() {
                Ok(n) if protocol.eq_ignore_ascii_case("tcp") => {
                    exposed.insert(n);
                }
                _ => problems.push((Check::Expose, format!("EXPOSE {port}: not a TCP port"))),
            }
        }
    }
    if exposed != expect.ports {
        problems.push((
            Check::Expose,
            format!(
                "EXPOSE {exposed:?}; the binary listens on {:?}",
                expect.ports
            ),
        ));
    }

    // Nothing that needs a shell in the final stage.
    for ins in &last.body {
        let shell = match ins.keyword.as_str() {
            "RUN" | "SHELL" | "ONBUILD" => true,
            "CMD" => exec_form(&ins.args).is_none(),
            "HEALTHCHECK" => ins
                .args
                .split_once("CMD")
                .is_some_and(|(_, cmd)| exec_form(cmd.trim()).is_none()),
            _ => false,
        };
        if shell {
            problems.push((
                Check::Shell,
                format!(
                    "line {}: {} in the final stage needs a shell",
                    ins.line, ins.keyword
                ),
            ));
        }
    }

    // OCI labels.
    let mut found = Vec::new();
    for label in last.all("LABEL") {
        match labels(&label.args) {
            Ok(pairs) => found.extend(pairs),
            Err(e) => problems.push((Check::Labels, e)),
        }
    }
    let label = |key: &str| {
        found
            .iter()
            .rev()
            .find(|(k, _)| k == &format!("org.opencontainers.image.{key}"))
            .map(|(_, v)| v.clone())
    };
    for (key, want) in [
        ("title", &expect.binary),
        ("source", &expect.source),
        ("licenses", &expect.license),
    ] {
        if label(key).as_ref() != Some(want) {
            problems.push((
                Check::Labels,
                format!(
                    "org.opencontainers.image.{key} is {:?}, not {want:?}",
                    label(key)
                ),
            ));
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// The workspace
// ---------------------------------------------------------------------------------------------

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `(section, key, value)` of a Cargo manifest's `key = value` lines (each value on one line,
/// as in this workspace); the n-th `[[bin]]` is section `bin#n`.
fn manifest(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut bins = 0;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line == "[[bin]]" {
            bins += 1;
            section = format!("bin#{bins}");
        } else if let Some(s) = line.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = s.to_owned();
        } else if let Some((key, value)) = line.split_once('=')
            && !line.starts_with('#')
        {
            out.push((
                section.clone(),
                key.trim().to_owned(),
                value.trim().to_owned(),
            ));
        }
    }
    out
}

/// The string value of `key` in `section`.
fn manifest_string(entries: &[(String, String, String)], section: &str, key: &str) -> String {
    let raw = entries
        .iter()
        .find(|(s, k, _)| s == section && k == key)
        .map(|(_, _, v)| v)
        .unwrap_or_else(|| panic!("no {key} in [{section}]"));
    raw.split('"')
        .nth(1)
        .unwrap_or_else(|| panic!("[{section}] {key} = {raw} is not a string"))
        .to_owned()
}

/// The package name of crate directory `dir` and its binaries (the `[[bin]]` names, else the
/// package's own name when it has `src/main.rs`).
fn package(dir: &str) -> (String, Vec<String>) {
    let entries = manifest(&read(&format!("{dir}/Cargo.toml")));
    let name = manifest_string(&entries, "package", "name");
    let mut bins: Vec<String> = entries
        .iter()
        .filter(|(s, k, _)| s.starts_with("bin#") && k == "name")
        .map(|(s, _, _)| manifest_string(&entries, s, "name"))
        .collect();
    if bins.is_empty() && root().join(dir).join("src/main.rs").is_file() {
        bins.push(name.clone());
    }
    (name, bins)
}

/// The workspace's `[workspace.package]` fields.
struct Workspace {
    version: String,
    min_rust: (u32, u32, u32),
    license: String,
    repository: String,
}

fn workspace() -> Workspace {
    let entries = manifest(&read("Cargo.toml"));
    let field = |key| manifest_string(&entries, "workspace.package", key);
    Workspace {
        version: field("version"),
        min_rust: version(&field("rust-version")).expect("rust-version is X.Y[.Z]"),
        license: field("license"),
        repository: field("repository"),
    }
}

fn expect(dir: &str, binary: &str, user: Option<u32>, ports: &[u16]) -> Expect {
    let ws = workspace();
    let (package, package_bins) = package(dir);
    Expect {
        binary: binary.to_owned(),
        package,
        package_bins,
        user,
        ports: ports.iter().copied().collect(),
        min_rust: ws.min_rust,
        license: ws.license,
        source: ws.repository,
    }
}

fn assert_clean(dockerfile: &str, expect: &Expect) {
    let problems = check(&read(dockerfile), expect);
    assert!(
        problems.is_empty(),
        "{dockerfile}:\n{}",
        problems
            .iter()
            .map(|(c, p)| format!("  {c:?}: {p}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The ENTRYPOINT binary's name of a Dockerfile of the repository.
fn entrypoint_binary(dockerfile: &str) -> String {
    let stages = stages(&parse(&read(dockerfile)).unwrap()).unwrap();
    let argv = exec_form(&stages.last().unwrap().last("ENTRYPOINT").unwrap().args).unwrap();
    argv[0].rsplit('/').next().unwrap().to_owned()
}

// ---------------------------------------------------------------------------------------------
// The repository's images
// ---------------------------------------------------------------------------------------------

#[test]
fn sidecar_image_runs_the_sidecar_as_the_injected_container_does() {
    let binary = tether_sidecar::cli::Cli::command().get_name().to_owned();
    let (_, bins) = package("sidecar");
    assert_eq!(
        bins,
        std::slice::from_ref(&binary),
        "the sidecar package's binaries"
    );
    let user = u32::try_from(tether_operator::build::inject::SIDECAR_USER).unwrap();
    let ports = [
        tether_crds::ListenSpec::default().port,
        tether_crds::AdminSpec::default().port,
        tether_crds::PeerSpec::default().port,
    ];
    assert_clean(
        "images/sidecar.Dockerfile",
        &expect("sidecar", &binary, Some(user), &ports),
    );
}

#[test]
fn operator_image_runs_the_operator_and_exposes_its_admin_port() {
    let (_, bins) = package("operator");
    assert_eq!(bins, ["tether-operator"], "the operator package's binaries");
    // The CLI (operator/src/main.rs, a binary) takes its --admin-addr default from the library.
    assert!(
        read("operator/src/main.rs")
            .contains("default_value = tether_operator::admin::DEFAULT_ADDR"),
        "tether-operator's --admin-addr default is not tether_operator::admin::DEFAULT_ADDR"
    );
    let admin: SocketAddr = tether_operator::admin::DEFAULT_ADDR.parse().unwrap();
    assert!(
        admin.ip().is_unspecified(),
        "the admin listener must bind every interface to be reachable in a pod"
    );
    assert_clean(
        "images/operator.Dockerfile",
        &expect("operator", "tether-operator", None, &[admin.port()]),
    );
}

/// The `--listen` default of `tether-example-server`: its CLI lives in a binary of
/// `tether-examples` (which depends on this crate, so it cannot be linked here); the attribute is
/// read from the source.
fn example_server_listen_default() -> SocketAddr {
    let source = read("examples/src/bin/example_server.rs");
    let lines: Vec<&str> = source.lines().collect();
    let field = lines
        .iter()
        .position(|l| l.trim() == "listen: SocketAddr,")
        .expect("example_server.rs has no `listen: SocketAddr` field");
    let attribute = lines[..field]
        .iter()
        .rev()
        .take_while(|l| l.trim_start().starts_with("#[") || l.trim_start().starts_with("///"))
        .find(|l| l.contains("default_value"))
        .expect("the listen field has no default_value");
    attribute
        .split("default_value = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("default_value is a string literal")
        .parse()
        .expect("the listen default is a socket address")
}

#[test]
fn example_server_image_runs_the_example_server_and_exposes_its_port() {
    let (_, bins) = package("examples");
    assert!(
        bins.contains(&"tether-example-server".to_owned()),
        "{bins:?}"
    );
    let listen = example_server_listen_default();
    assert_clean(
        "images/example-server.Dockerfile",
        &expect("examples", "tether-example-server", None, &[listen.port()]),
    );
}

/// `make images` builds every Dockerfile of `images/`, each under its binary's name, and the
/// default names are the ones the manifests use.
#[test]
fn make_images_builds_every_dockerfile_under_its_binary_name() {
    let mut files: Vec<String> = std::fs::read_dir(root().join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".Dockerfile"))
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "example-server.Dockerfile",
            "operator.Dockerfile",
            "sidecar.Dockerfile"
        ],
        "a Dockerfile in images/ that this test does not check"
    );
    let makefile = read("Makefile");
    let variable = |name: &str| {
        makefile
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with('\t'))
            .find_map(|l| {
                let (k, v) = l.split_once('=')?;
                let k = k.trim_end_matches([':', '?']).trim();
                (k == name).then(|| v.trim().to_owned())
            })
            .unwrap_or_else(|| panic!("the Makefile sets no {name}"))
    };
    assert!(
        makefile
            .lines()
            .any(|l| l.starts_with(".PHONY:") && l.split_whitespace().any(|w| w == "images")),
        "images is not .PHONY"
    );
    let images: Vec<(String, String)> = variable("IMAGES")
        .split_whitespace()
        .map(|pair| {
            let (file, name) = pair.split_once(':').unwrap();
            (format!("{file}.Dockerfile"), name.to_owned())
        })
        .collect();
    let mut built: Vec<&str> = images.iter().map(|(f, _)| f.as_str()).collect();
    built.sort_unstable();
    assert_eq!(built, files, "make images builds these Dockerfiles");
    for (file, name) in &images {
        assert_eq!(
            &entrypoint_binary(&format!("images/{file}")),
            name,
            "make images names the image of images/{file}"
        );
    }

    // The default tags are the images the example manifests name.
    let repo = variable("IMAGE_REPO");
    let version = workspace().version;
    let deployment: Deployment =
        yaml_serde::from_str(&read("examples/k8s/deployment.yaml")).unwrap();
    let server = &deployment.spec.unwrap().template.spec.unwrap().containers[0];
    assert_eq!(
        server.image.as_deref(),
        Some(format!("{repo}/tether-example-server:{version}").as_str()),
        "examples/k8s/deployment.yaml's image is not what `make images` tags by default"
    );
}

#[test]
fn dockerignore_drops_build_outputs_and_keeps_the_workspace() {
    let ignore = read(".dockerignore");
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for needed in ["target/", ".git/"] {
        assert!(patterns.contains(&needed), ".dockerignore lacks {needed}");
    }
    let entries = manifest(&read("Cargo.toml"));
    let members = entries
        .iter()
        .find(|(s, k, _)| s == "workspace" && k == "members")
        .map(|(_, _, v)| v.clone())
        .unwrap();
    let mut inputs: Vec<String> = members
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(!inputs.is_empty());
    inputs.extend(["Cargo.toml".to_owned(), "Cargo.lock".to_owned()]);
    for input in &inputs {
        for pattern in &patterns {
            let p = pattern.trim_start_matches('/').trim_end_matches('/');
            assert!(
                p != input && p != "*" && p != "**",
                ".dockerignore pattern {pattern} drops {input}, which the build needs"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The parser and the checker
// ---------------------------------------------------------------------------------------------

#[test]
fn parser_joins_continuations_and_drops_comments() {
    let text = "# syntax=docker/dockerfile:1\n\
                ARG X=1\n\
                FROM a:1 AS b\n\
                RUN one \\\n\
                # a comment inside the continuation\n\
                \n\
                    two \\   \n\
                    three\n\
                  # indented comment\n\
                copy --from=b /x /y\n";
    let ins = parse(text).unwrap();
    let got: Vec<(usize, &str, &str)> = ins
        .iter()
        .map(|i| (i.line, i.keyword.as_str(), i.args.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (2, "ARG", "X=1"),
            (3, "FROM", "a:1 AS b"),
            (4, "RUN", "one two three"),
            (10, "COPY", "--from=b /x /y"),
        ]
    );
    let parsed = stages(&ins).unwrap();
    assert_eq!(parsed.len(), 1);
    assert_eq!(parsed[0].name.as_deref(), Some("b"));
    assert_eq!(parsed[0].body.len(), 2);

    assert!(
        parse("FROM a:1\nRUN x \\\n").is_err(),
        "dangling continuation"
    );
    assert!(parse("# escape=`\nFROM a:1\n").is_err(), "escape directive");
    assert!(parse("FROM a:1\n-x\n").is_err(), "not an instruction");
    assert!(
        stages(&parse("RUN x\nFROM a:1\n").unwrap()).is_err(),
        "RUN before FROM"
    );
    assert_eq!(
        labels(r#"a=1 b="two words" c="q\"d""#).unwrap(),
        [
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "two words".to_owned()),
            ("c".to_owned(), "q\"d".to_owned()),
        ]
    );
    assert!(labels("a b").is_err());
}

const GOOD: &str = r#"# syntax=docker/dockerfile:1
FROM rust:1.95.0-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/src/target \
    cargo build --release --locked -p tether-sidecar --bin tether-sidecar \
 && install -D -m 0755 target/release/tether-sidecar /out/tether-sidecar

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="tether-sidecar" \
      org.opencontainers.image.source="https://example.com/tether" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/tether-sidecar /usr/local/bin/tether-sidecar
USER 65532:65532
EXPOSE 8080 9901 9902
ENTRYPOINT ["/usr/local/bin/tether-sidecar"]
"#;

fn good_expect() -> Expect {
    Expect {
        binary: "tether-sidecar".into(),
        package: "tether-sidecar".into(),
        package_bins: vec!["tether-sidecar".into()],
        user: Some(65532),
        ports: [8080, 9901, 9902].into(),
        min_rust: (1, 89, 0),
        license: "Apache-2.0".into(),
        source: "https://example.com/tether".into(),
    }
}

/// Every check fails on a Dockerfile broken in its way (and the unbroken one passes).
#[test]
fn each_check_fails_on_its_mutation() {
    assert_eq!(check(GOOD, &good_expect()), Problems::new());
    let mutations: &[(Check, &str, &str)] = &[
        (
            Check::Syntax,
            "tether-sidecar\"]\n",
            "tether-sidecar\"] \\\n",
        ),
        (Check::Syntax, "FROM rust", "ENV A=1\nFROM rust"),
        (
            Check::MultiStage,
            "FROM gcr.io/distroless/cc-debian12:nonroot",
            "FROM builder",
        ),
        (
            Check::MultiStage,
            "cc-debian12:nonroot",
            "cc-debian12:nonroot\nFROM rust:1.95.0-bookworm",
        ),
        (Check::Pinned, "cc-debian12:nonroot", "cc-debian12"),
        (Check::Pinned, "cc-debian12:nonroot", "cc-debian12:latest"),
        (Check::Pinned, "cc-debian12:nonroot", "cc-debian12:${TAG}"),
        (Check::Pinned, "rust:1.95.0-bookworm", "rust"),
        (
            Check::Toolchain,
            "rust:1.95.0-bookworm",
            "rust:1.95-bookworm",
        ),
        (
            Check::Toolchain,
            "rust:1.95.0-bookworm",
            "rust:1.80.0-bookworm",
        ),
        (Check::Toolchain, "rust:1.95.0-bookworm", "debian:12"),
        (
            Check::Build,
            "--bin tether-sidecar \\",
            "--bin tether-operator \\",
        ),
        (Check::Build, "-p tether-sidecar", "-p tether-operator"),
        (Check::Build, "--release --locked", "--locked"),
        (Check::Build, "--release --locked", "--release"),
        (Check::Build, "cargo build", "cargo check"),
        (
            Check::Copy,
            "--from=builder /out/tether-sidecar",
            "--from=builder /out/tether-demo",
        ),
        (
            Check::Copy,
            "--from=builder /out/tether-sidecar",
            "--from=other /out/tether-sidecar",
        ),
        (Check::Copy, "/out/tether-sidecar\n", "/out/elsewhere\n"),
        (
            Check::Copy,
            "--from=builder /out/tether-sidecar",
            "--from=builder /src/target/release/tether-sidecar",
        ),
        (Check::Copy, "COPY --from=builder", "COPY"),
        (
            Check::Entrypoint,
            "[\"/usr/local/bin/tether-sidecar\"]",
            "[\"/bin/tether-sidecar\"]",
        ),
        (
            Check::Entrypoint,
            "ENTRYPOINT [\"/usr/local/bin/tether-sidecar\"]",
            "CMD []",
        ),
        (Check::User, "USER 65532:65532", "USER 0:0"),
        (Check::User, "USER 65532:65532", "USER 65532:0"),
        (Check::User, "USER 65532:65532", "USER nonroot"),
        (Check::User, "USER 65532:65532", "USER 1000:1000"),
        (Check::User, "USER 65532:65532\n", ""),
        (Check::Expose, "EXPOSE 8080 9901 9902", "EXPOSE 8080 9901"),
        (
            Check::Expose,
            "EXPOSE 8080 9901 9902",
            "EXPOSE 8080 9901 9902 3000",
        ),
        (
            Check::Expose,
            "EXPOSE 8080 9901 9902",
            "EXPOSE 8080 9901 9902/udp",
        ),
        (Check::Shell, "USER 65532", "RUN mkdir /data\nUSER 65532"),
        (
            Check::Shell,
            "USER 65532",
            "SHELL [\"/bin/sh\", \"-c\"]\nUSER 65532",
        ),
        (Check::Shell, "USER 65532", "CMD --help\nUSER 65532"),
        (
            Check::Shell,
            "USER 65532",
            "HEALTHCHECK CMD curl -f localhost\nUSER 65532",
        ),
        (
            Check::Shell,
            "[\"/usr/local/bin/tether-sidecar\"]",
            "/usr/local/bin/tether-sidecar",
        ),
        (
            Check::Labels,
            "image.title=\"tether-sidecar\"",
            "image.title=\"sidecar\"",
        ),
        (Check::Labels, "licenses=\"Apache-2.0\"", "licenses=\"MIT\""),
        (
            Check::Labels,
            "org.opencontainers.image.source=",
            "org.opencontainers.image.url=",
        ),
        (Check::Labels, "LABEL org", "LABEL broken\nLABEL org"),
    ];
    for (want, from, to) in mutations {
        assert!(GOOD.contains(from), "mutation {from:?} does not apply");
        let bad = GOOD.replacen(from, to, 1);
        let problems = check(&bad, &good_expect());
        assert!(
            problems.iter().any(|(c, _)| c == want),
            "{want:?} did not fail after replacing {from:?} with {to:?}: {problems:?}"
        );
    }
    // The expectations are checked too: a binary the package does not have.
    let mut other = good_expect();
    other.package_bins = vec!["tether-other".into()];
    assert!(check(GOOD, &other).iter().any(|(c, _)| *c == Check::Build));
}

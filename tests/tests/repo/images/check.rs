//! The checks of one Dockerfile against what the code expects of its image ([`check`]).

use std::collections::BTreeSet;

use super::dockerfile::*;

/// The checks [`check`] runs; each problem names one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Check {
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
pub(crate) struct Expect {
    /// The binary the image runs.
    pub(crate) binary: String,
    /// The Cargo package that builds it, and every binary of that package.
    pub(crate) package: String,
    pub(crate) package_bins: Vec<String>,
    /// The UID and GID it must run as; `None`: any non-root ones.
    pub(crate) user: Option<u32>,
    /// TCP ports the binary listens on by default.
    pub(crate) ports: BTreeSet<u16>,
    /// The workspace's `rust-version`.
    pub(crate) min_rust: (u32, u32, u32),
    /// The workspace's `license` and `repository`.
    pub(crate) license: String,
    pub(crate) source: String,
}

pub(crate) type Problems = Vec<(Check, String)>;

/// Every problem of `dockerfile` against `expect` (empty when it is right).
pub(crate) fn check(dockerfile: &str, expect: &Expect) -> Problems {
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

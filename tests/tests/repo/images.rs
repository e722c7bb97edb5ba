//! The container images (`docs/dev/images.md`): each `images/*.Dockerfile` is checked against
//! the code it packages, since no test here can build an image.
//!
//! A small Dockerfile parser ([`dockerfile`]: comments, blank lines and `\` continuations)
//! splits a file into stages; [`check`] then reports, per [`Check`]:
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

use std::net::SocketAddr;

use k8s_openapi::api::apps::v1::Deployment;
use tether_tests::repo::{read, root};

mod check;
mod dockerfile;

use check::*;
use dockerfile::*;

// ---------------------------------------------------------------------------------------------
// The workspace
// ---------------------------------------------------------------------------------------------

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
    let entries = manifest(&read(format!("{dir}/Cargo.toml")));
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

/// The command name a built binary of the workspace reports: the first word of its `--version`.
fn command_name(binary: &str) -> String {
    let path = tether_tests::bins::path(binary).unwrap();
    let out = std::process::Command::new(&path)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(out.status.success(), "{binary} --version: {out:?}");
    let version = String::from_utf8_lossy(&out.stdout);
    version
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("{binary} --version printed nothing"))
        .to_owned()
}

// ---------------------------------------------------------------------------------------------
// The repository's images
// ---------------------------------------------------------------------------------------------

#[test]
fn sidecar_image_runs_the_sidecar_as_the_injected_container_does() {
    // The name the sidecar's command line gives itself (clap's command name, which `--version`
    // prints whatever the file is called): the binary itself, not linked here.
    let binary = command_name("tether-sidecar");
    let (_, bins) = package("sidecar");
    assert_eq!(
        bins,
        std::slice::from_ref(&binary),
        "the sidecar package's binaries"
    );
    let user = u32::try_from(tether_operator::plan::inject::SIDECAR_USER).unwrap();
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
    let source = read("examples/src/bin/example_server/main.rs");
    let lines: Vec<&str> = source.lines().collect();
    let field = lines
        .iter()
        .position(|l| l.trim() == "listen: SocketAddr,")
        .expect("example_server/main.rs has no `listen: SocketAddr` field");
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

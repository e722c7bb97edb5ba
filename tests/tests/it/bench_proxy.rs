//! A smoke of `tether-bench-proxy` (`make bench-proxy`, too long for the tests): one short
//! round on every target it finds (nginx only when installed; tether with each replication),
//! every answer and event checked; then 20 resumes at once and a handoff of 50 sessions, each
//! checked.

use tokio::process::Command;

#[tokio::test]
async fn the_proxy_bench_runs_and_its_table_lists_every_target() {
    let bench = tether_tests::bins::path("tether-bench-proxy").unwrap();
    let out = Command::new(bench)
        .args(["--quick", "--seconds", "0.3"])
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let header = stdout
        .lines()
        .find(|l| l.starts_with("| measure"))
        .unwrap_or_else(|| panic!("no table: {stdout}"));
    for column in [
        "direct",
        "tether None",
        "tether Sessions",
        "tether Events",
        "tether Sessions, no write-ahead",
        "tether / direct",
        "Sessions / None",
        "Events / None",
        "Sessions without write-ahead / None",
    ] {
        assert!(header.contains(column), "no column {column}: {header}");
    }
    let columns: Vec<&str> = header.split('|').map(str::trim).collect();
    let nginx = columns.contains(&"nginx");
    assert_eq!(nginx, !stdout.contains("nginx: skipped"), "{stdout}");
    let errors = stdout
        .lines()
        .find(|l| l.starts_with("| wrong answers"))
        .unwrap_or_else(|| panic!("no error row: {stdout}"));
    let counts: Vec<&str> = errors
        .split('|')
        .map(str::trim)
        .skip(2)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(counts.len(), if nginx { 6 } else { 5 }, "{errors}");
    assert!(counts.iter().all(|c| *c == "0"), "{errors}");
    for row in [
        "JSON echo, 1 user: req/s",
        "JSON read-only lookup, 1 user: req/s",
        "server CPU per event",
        "lag p99",
    ] {
        assert!(stdout.contains(row), "no row {row}: {stdout}");
    }
    // The resume and handoff table: every session of the drained pod handed off, nothing wrong.
    let cell = |prefix: &str| {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no row {prefix}: {stdout}"));
        line.split('|').nth(2).unwrap_or_default().trim().to_owned()
    };
    let resume = cell("| resume, 20 at once");
    assert!(resume.contains(" / "), "p50 / p99: {resume}");
    assert!(
        stdout.contains("| handoff of 50 sessions with buffers (50 held, 50 handed off)"),
        "{stdout}"
    );
    assert_eq!(cell("| resumes replaying wrong events"), "0", "{stdout}");
}

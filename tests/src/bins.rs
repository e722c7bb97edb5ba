//! Locating the workspace's binaries (`tether-sidecar`, `tether-example-server`).
//!
//! Integration tests run from `target/<profile>/deps/`, the demo from `target/<profile>/`; the
//! binaries sit in `target/<profile>/`. `TETHER_BIN_DIR` overrides the directory.

use std::path::PathBuf;

use crate::{HarnessError, Result};

/// The directory holding the workspace binaries.
pub fn dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TETHER_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// The path of binary `name`.
///
/// # Errors
/// [`HarnessError::MissingBinary`] when it has not been built.
pub fn path(name: &str) -> Result<PathBuf> {
    let dir = dir();
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(HarnessError::MissingBinary(
            name.to_owned(),
            dir.display().to_string(),
        ))
    }
}

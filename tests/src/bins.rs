//! Locating the workspace's binaries (`tether-sidecar`, `tether-example-server`,
//! `tether-bench-origin`), and the Python SDK fixture (`tests/fixtures/python-sdk-server/`) with its virtualenv.
//!
//! Integration tests run from `target/<profile>/deps/`, the demo from `target/<profile>/`; the
//! binaries sit in `target/<profile>/`. `TETHER_BIN_DIR` overrides the directory. The fixture's
//! virtualenv is the one `make python-sdk` creates, `target/python-sdk-venv` in the workspace;
//! `TETHER_PYTHON_SDK_VENV` overrides it.

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

/// The Python SDK fixture's script, from the workspace root.
pub const PYTHON_SDK_SERVER: &str = "tests/fixtures/python-sdk-server/server.py";

/// The Python SDK fixture's virtualenv: `TETHER_PYTHON_SDK_VENV`, else `target/python-sdk-venv`
/// in the workspace (where `make python-sdk` creates it).
pub fn python_sdk_venv() -> PathBuf {
    std::env::var_os("TETHER_PYTHON_SDK_VENV").map_or_else(
        || crate::repo::root().join("target/python-sdk-venv"),
        PathBuf::from,
    )
}

/// The interpreter of the Python SDK fixture's virtualenv, and the fixture's script.
///
/// # Errors
/// [`HarnessError::MissingPythonSdk`] when the virtualenv is not complete: no interpreter, or
/// (for the one `make python-sdk` makes) no `.installed` stamp, which it writes once the
/// requirements are installed.
pub fn python_sdk_server() -> Result<(PathBuf, PathBuf)> {
    let venv = python_sdk_venv();
    let python = venv.join("bin/python");
    let own = std::env::var_os("TETHER_PYTHON_SDK_VENV").is_none();
    if python.is_file() && (!own || venv.join(".installed").is_file()) {
        Ok((python, crate::repo::root().join(PYTHON_SDK_SERVER)))
    } else {
        Err(HarnessError::MissingPythonSdk(venv.display().to_string()))
    }
}

//! `docs/reference/crd.md` against the CRD: the committed configuration reference is exactly what
//! [`tether_crds::reference::markdown`] renders from the `McpEndpoint` schema. With
//! `TETHER_BLESS=1` the test rewrites the file instead of failing.

use std::path::PathBuf;

use tether_crds::reference::{REFERENCE_FILE, REGENERATE, markdown};

/// The reference file in the workspace (this crate lives in `crds/`).
fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(REFERENCE_FILE)
}

#[test]
fn the_committed_reference_matches_the_crd() {
    let path = path();
    let current = markdown();
    if std::env::var("TETHER_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &current)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != current {
        let line = committed
            .lines()
            .zip(current.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(current.lines().count()))
            + 1;
        panic!(
            "{REFERENCE_FILE} differs from the McpEndpoint CRD (first difference at line {line}): \
             regenerate it with `{REGENERATE}` and commit it"
        );
    }
}

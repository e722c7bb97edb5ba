//! `docs/reference/crd.md` against the CRD: the committed configuration reference is exactly what
//! [`tether_crds::reference::markdown`] renders from the `McpEndpoint` schema. With
//! `TETHER_BLESS=1` the test rewrites the file instead of failing.

use std::path::Path;

use tether_crds::reference::{REFERENCE_FILE, check_generated, markdown};

#[test]
fn the_committed_reference_matches_the_crd() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if let Err(e) = check_generated(&root, REFERENCE_FILE, &markdown()) {
        panic!("{e}");
    }
}

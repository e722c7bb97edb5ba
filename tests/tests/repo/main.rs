//! Static checks of the repository: the Helm chart, the dashboard and the container images
//! against the code they package, the layers of the code, and every citation of the docs and
//! comments (`docs/dev/testing.md#citations`). Nothing here starts a process of the workspace or
//! links the sidecar, so this binary builds fast; `docs/dev/testing.md` lists the other test
//! binaries.

mod chart;
mod docs;
mod images;
mod layers;
mod references;

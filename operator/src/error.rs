//! The crate's one error type: what makes a reconcile fail and retry after a back-off. A
//! conflict is no error: the status reports it (`docs/design/operator.md`).

use kube::runtime::finalizer;

/// Reconcile failures (API errors); conflicts are reported in the status instead.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// The endpoint has no name or namespace.
    #[error("the McpEndpoint has no name or namespace")]
    Unnamed,
    /// Adding or removing the finalizer, or the step it guards, failed (boxed: the finalizer's
    /// error holds this type).
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
    /// An object did not serialize to JSON (not expected).
    #[error("serialization: {0}")]
    Json(#[from] serde_json::Error),
    /// New peer certificates could not be made (not expected: their parameters are fixed).
    #[error("{0}")]
    Generate(#[from] tether_crds::keyring::GenerateError),
    /// A deleted endpoint's pods still run its sidecar: its finalizer stays (and its children
    /// with it) until they are gone. Not a failure: the reconcile looks again soon.
    #[error("{0} pods still run the sidecar; the endpoint's children stay until they are gone")]
    PodsStillInjected(usize),
}

impl Error {
    /// A short label for metrics (`reconcile_failures_total{reason}`).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "api",
            Error::Unnamed => "unnamed",
            Error::Finalizer(_) => "finalizer",
            Error::Json(_) => "json",
            Error::Generate(_) => "certificates",
            Error::PodsStillInjected(_) => "waiting_for_pods",
        }
    }

    /// Whether this is a wait, not a failure: [`Error::PodsStillInjected`], also inside the
    /// finalizer's error.
    pub fn is_wait(&self) -> bool {
        match self {
            Error::PodsStillInjected(_) => true,
            Error::Finalizer(inner) => matches!(
                inner.as_ref(),
                finalizer::Error::CleanupFailed(e) | finalizer::Error::ApplyFailed(e) if e.is_wait()
            ),
            _ => false,
        }
    }
}

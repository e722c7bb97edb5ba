//! The Kubernetes client of tether's binaries (feature `client`): the in-cluster configuration,
//! else `KUBECONFIG`, as [`kube::Client::try_default`] reads it, and a `User-Agent` naming the
//! binary and its release, by which audit logs, API Priority and Fairness and the default field
//! manager of a write tell tether's requests from everyone else's.

use http::HeaderValue;
use http::header::USER_AGENT;

/// A client whose every request carries `User-Agent: <agent>`, e.g.
/// `concat!("tether-operator/v", env!("CARGO_PKG_VERSION"))`.
///
/// # Errors
/// When no configuration is found, or a client cannot be built from it.
pub async fn with_user_agent(agent: &'static str) -> Result<kube::Client, kube::Error> {
    let mut config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    config
        .headers
        .push((USER_AGENT, HeaderValue::from_static(agent)));
    kube::Client::try_from(config)
}

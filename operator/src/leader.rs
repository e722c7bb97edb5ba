//! Leader election for running more than one replica: a `coordination.k8s.io/v1` Lease held
//! through kube-lease-manager; only the holder runs the controller, and a replica that loses
//! the lease exits (`docs/design/operator.md`). RBAC: `leases: get, create, patch` in the
//! lease's namespace.

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;

use crate::names::OPERATOR;

/// Seconds a lease stays valid after its last renewal.
pub const LEASE_SECONDS: u64 = 15;
/// Seconds before expiry the holder renews.
pub(crate) const RENEW_GRACE_SECONDS: u64 = 5;

/// Where the lease lives and who this replica is.
#[derive(Clone, Debug)]
pub struct Election {
    /// Namespace of the Lease (the operator's own).
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
}

impl Election {
    /// The field manager of this candidate's Lease writes, `tether-operator/<identity>`: unique
    /// per candidate, as kube-lease-manager's lock needs (a server-side apply conflict is what
    /// keeps a second candidate from taking a held Lease; one shared manager never conflicts).
    pub fn field_manager(&self) -> String {
        format!("{OPERATOR}/{}", self.identity)
    }
}

/// Why leader election could not start.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The Lease could not be read or created.
    #[error("lease: {0}")]
    Lease(#[from] LeaseManagerError),
    /// The lease manager's task ended before this replica held the lease.
    #[error("the lease manager stopped before the lease was held")]
    Ended,
}

/// Waits until this replica holds the lease; the receiver turns `false` if it is lost later
/// (keep it alive: dropping it releases the lease).
///
/// # Errors
/// [`LeaderError`].
pub async fn lead(
    client: Client,
    election: &Election,
) -> Result<watch::Receiver<bool>, LeaderError> {
    let manager = LeaseManagerBuilder::new(client, &election.name)
        .with_namespace(&election.namespace)
        .with_identity(&election.identity)
        .with_field_manager(election.field_manager())
        .with_duration(LEASE_SECONDS)
        .with_grace(RENEW_GRACE_SECONDS)
        .build()
        .await?;
    let (mut leading, _task) = manager.watch().await;
    tracing::info!(lease = %election.name, identity = %election.identity, "waiting for the lease");
    if leading.wait_for(|held| *held).await.is_err() {
        return Err(LeaderError::Ended);
    }
    tracing::info!(lease = %election.name, "holding the lease; reconciling");
    Ok(leading)
}

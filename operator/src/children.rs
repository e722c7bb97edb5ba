//! Step 3 of the reconcile pipeline: writing the [`Plan`] — each child read first and
//! server-side applied only when the live object lacks something ([`covers`]), the HMAC Secret
//! created once, the injection applied last — and removing the children the plan no longer
//! wants:
//!
//! - our PodDisruptionBudget, when one of the user's selects the same pods ([`covering_pdb`]:
//!   the eviction API refuses pods that two budgets cover);
//! - our dedicated ServiceAccount, once the pods name one of the user's and no pod runs with
//!   ours any more; until then the RoleBinding binds both, so the sidecars of old pods keep
//!   their Pod watch through the rollout.
//!
//! Only objects whose controller owner is the endpoint are deleted, with a UID precondition.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::diff::covers;
use crate::error::Error;
use crate::names::{FIELD_MANAGER, Names};
use crate::plan::Plan;
use crate::plan::config::{self, HMAC_KEY_BYTES};
use crate::plan::network::covering_pdb;
use crate::plan::rbac;
use crate::validate::Target;

/// Applies `plan`; returns what it wrote (`Kind/name`, deletions as `Kind/name (deleted)`) and
/// whether the pod template changed (the pods roll).
///
/// # Errors
/// [`Error::Kube`] when a request fails (what was written before stays; the next reconcile
/// goes on from there).
pub async fn write(
    client: &Client,
    names: &Names,
    owner: &OwnerReference,
    target: &Target<'_>,
    plan: &Plan,
) -> Result<(Vec<String>, bool), Error> {
    let ns = &names.namespace;
    let mut written = Vec::new();
    let w = &mut written;
    ensure(&Api::namespaced(client.clone(), ns), &plan.config_map, w).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    if secrets.get_opt(&names.config()).await?.is_none() {
        let key: [u8; HMAC_KEY_BYTES] = rand::random();
        let secret = config::secret(names, owner, &key);
        secrets.create(&PostParams::default(), &secret).await?;
        w.push(format!("Secret/{}", names.config()));
    }
    for service in &plan.services {
        ensure(&Api::namespaced(client.clone(), ns), service, w).await?;
    }
    let mut binding = plan.role_binding.clone();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    match &plan.service_account {
        Some(sa) => ensure(&accounts, sa, w).await?,
        None => {
            let name = names.sidecar_rbac();
            if let Some(ours) = owned(&accounts, &name, owner).await? {
                if runs_as(client, ns, target, &name).await? {
                    rbac::also_bind(&mut binding, &name);
                } else {
                    delete(&accounts, &ours, w).await?;
                }
            }
        }
    }
    ensure(&Api::namespaced(client.clone(), ns), &plan.role, w).await?;
    ensure(&Api::namespaced(client.clone(), ns), &binding, w).await?;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let existing = budgets.list(&ListParams::default()).await?.items;
    match covering_pdb(&existing, names, target) {
        None => ensure(&budgets, &plan.pdb, w).await?,
        Some(theirs) => {
            if let Some(ours) = owned(&budgets, &names.pdb(), owner).await? {
                delete(&budgets, &ours, w).await?;
                tracing::info!(endpoint = %names.endpoint, pdb = theirs, "the user's PodDisruptionBudget covers the pods: ours deleted");
            }
        }
    }
    let deployment = target.deployment;
    if covers(&serde_json::to_value(deployment)?, &plan.injection) {
        return Ok((written, false));
    }
    let name = deployment.name_any();
    Api::<Deployment>::namespaced(client.clone(), ns)
        .patch(&name, &apply_params(), &Patch::Apply(&plan.injection))
        .await?;
    written.push(format!("Deployment/{name}"));
    Ok((written, true))
}

/// Server-side apply with the operator's field manager, forced (it owns these fields).
pub(crate) fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// The note of the `Applied` Event: what was written and what happens next.
pub fn applied_note(written: &[String], rolled: bool) -> String {
    let list = written.join(", ");
    if rolled {
        format!("applied {list}; the pod template changed, so the pods are replaced")
    } else if written.iter().any(|w| w.starts_with("ConfigMap/")) {
        format!("applied {list}; running sidecars reload the configuration without a restart")
    } else {
        format!("applied {list}")
    }
}

/// Server-side applies `desired` unless the live object already holds all of it.
async fn ensure<K>(api: &Api<K>, desired: &K, written: &mut Vec<String>) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
{
    let name = desired.meta().name.clone().ok_or(Error::Unnamed)?;
    let body = serde_json::to_value(desired)?;
    if let Some(live) = api.get_opt(&name).await?
        && covers(&serde_json::to_value(&live)?, &body)
    {
        return Ok(());
    }
    api.patch(&name, &apply_params(), &Patch::Apply(&body))
        .await?;
    written.push(format!("{}/{name}", K::kind(&())));
    Ok(())
}

/// The `K` named `name` when it exists and its controller owner is `owner` (the endpoint).
async fn owned<K>(api: &Api<K>, name: &str, owner: &OwnerReference) -> Result<Option<K>, Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
{
    Ok(api.get_opt(name).await?.filter(|live| {
        live.meta()
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.uid == owner.uid && r.controller == Some(true))
    }))
}

/// Deletes `live` unless it was replaced since it was read (UID precondition); adds
/// `Kind/name (deleted)` to `written`.
async fn delete<K>(api: &Api<K>, live: &K, written: &mut Vec<String>) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
{
    let name = live.name_any();
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: live.meta().uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    api.delete(&name, &params).await?;
    written.push(format!("{}/{name} (deleted)", K::kind(&())));
    Ok(())
}

/// Whether a pod of the target (by its selector) still runs as ServiceAccount `account`.
async fn runs_as(
    client: &Client,
    namespace: &str,
    target: &Target<'_>,
    account: &str,
) -> Result<bool, Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let listed = pods
        .list(&ListParams::default().labels(&target.selector))
        .await?;
    Ok(listed.items.iter().any(|pod| {
        pod.spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref())
            == Some(account)
    }))
}

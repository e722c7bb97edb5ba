//! Writing what the plan decided, with generic operations only: ensure (server-side apply,
//! field manager [`FIELD_MANAGER`], forced, sent only when the live object lacks something:
//! [`covers`]), create once, delete a retired child (UID precondition), and the unconditional
//! applies of a status and of an empty body (`docs/design/operator.md`).

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::diff::covers;
use crate::error::Error;
use crate::names::{FIELD_MANAGER, Names};
use crate::plan::steps::{Ensure, Retire, Step, Steps};

/// What [`steps`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Written {
    /// `Kind/name` of each object written, in order; deletions as `Kind/name (deleted)`.
    pub objects: Vec<String>,
    /// Whether the pod template changed (the pods roll).
    pub rolled: bool,
}

/// Sends `steps` in order, in the endpoint's namespace.
///
/// # Errors
/// [`Error::Kube`] when a request fails (what was written before stays; the next reconcile
/// goes on from there).
pub(crate) async fn steps(
    client: &Client,
    names: &Names,
    steps: &Steps<'_>,
) -> Result<Written, Error> {
    let ns = &names.namespace;
    let mut objects = Vec::new();
    let w = &mut objects;
    ensure(&Api::namespaced(client.clone(), ns), &steps.config_map, w).await?;
    if let Some(secret) = &steps.secret {
        create(&Api::namespaced(client.clone(), ns), secret, w).await?;
    }
    for service in &steps.services {
        ensure(&Api::namespaced(client.clone(), ns), service, w).await?;
    }
    step(
        &Api::namespaced(client.clone(), ns),
        &steps.service_account,
        w,
    )
    .await?;
    ensure(&Api::namespaced(client.clone(), ns), &steps.role, w).await?;
    ensure(&Api::namespaced(client.clone(), ns), &steps.role_binding, w).await?;
    step(&Api::namespaced(client.clone(), ns), &steps.pdb, w).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let rolled = ensure(&deployments, &steps.injection, w).await?;
    Ok(Written { objects, rolled })
}

/// Server-side applies the status `status` of the `K` named `name`.
///
/// # Errors
/// [`Error::Kube`] when the request fails.
pub(crate) async fn status<K>(
    api: &Api<K>,
    name: &str,
    status: &impl Serialize,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
{
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(name, &apply_params(), &Patch::Apply(&body))
        .await?;
    Ok(())
}

/// Server-side applies an empty body to the `K` named `name` of `namespace`: the API server
/// drops every field the operator's field manager owns there, and nothing else.
///
/// # Errors
/// [`Error::Kube`] when the request fails.
pub(crate) async fn release<K>(api: &Api<K>, namespace: &str, name: &str) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
{
    let empty = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"name": name, "namespace": namespace},
    });
    api.patch(name, &apply_params(), &Patch::Apply(&empty))
        .await?;
    Ok(())
}

/// Server-side apply with the operator's field manager, forced (it owns these fields).
fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Server-side applies `ensure.desired` unless its live object already holds all of it; returns
/// whether it wrote (and adds `Kind/name` to `written`).
async fn ensure<K, B>(
    api: &Api<K>,
    ensure: &Ensure<'_, K, B>,
    written: &mut Vec<String>,
) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
    B: Serialize,
{
    let body = serde_json::to_value(&ensure.desired)?;
    let name = body["metadata"]["name"]
        .as_str()
        .ok_or(Error::Unnamed)?
        .to_owned();
    if let Some(live) = ensure.live
        && covers(&serde_json::to_value(live)?, &body)
    {
        return Ok(false);
    }
    api.patch(&name, &apply_params(), &Patch::Apply(&body))
        .await?;
    written.push(format!("{}/{name}", K::kind(&())));
    Ok(true)
}

/// Ensures or deletes as `step` says.
async fn step<K>(api: &Api<K>, step: &Step<'_, K>, written: &mut Vec<String>) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
{
    match step {
        Step::Ensure(e) => ensure(api, e, written).await.map(drop),
        Step::Retire(r) => delete(api, r, written).await,
        Step::Leave => Ok(()),
    }
}

/// Creates `object` (it did not exist when read).
async fn create<K>(api: &Api<K>, object: &K, written: &mut Vec<String>) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
{
    api.create(&PostParams::default(), object).await?;
    written.push(format!("{}/{}", K::kind(&()), object.name_any()));
    Ok(())
}

/// Deletes the retired child unless it was replaced since it was read (UID precondition); adds
/// `Kind/name (deleted)` to `written`.
async fn delete<K>(
    api: &Api<K>,
    retire: &Retire<'_, K>,
    written: &mut Vec<String>,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
{
    let live = retire.live();
    let name = live.name_any();
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: live.meta().uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    api.delete(&name, &params).await?;
    let object = format!("{}/{name}", K::kind(&()));
    tracing::info!(%object, reason = retire.reason(), "deleted a child the endpoint no longer needs");
    written.push(format!("{object} (deleted)"));
    Ok(())
}

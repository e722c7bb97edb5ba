//! Writing what the plan decided, with generic operations only: ensure (server-side apply with
//! the endpoint's field manager, [`Names::field_manager`], sent only when the live object lacks
//! something: `Ensure::covered`; forced on the endpoint's own children, never on the user's
//! Deployment, where a conflict is reported instead), create once, patch the key-ring Secret (a
//! JSON patch that tests the `resourceVersion` read), delete a retired child (UID
//! precondition), and the unconditional applies of a status and of an empty body
//! (`docs/design/operator.md`).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::error::Error;
use crate::names::Names;
use crate::plan::inject;
use crate::plan::keys::KeyStep;
use crate::plan::steps::{Ensure, Retire, Step, Steps};
use crate::validate::Conflict;

/// What [`steps`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Written {
    /// `Kind/name` of each object written, in order; deletions as `Kind/name (deleted)`.
    pub objects: Vec<String>,
    /// Whether the pod template changed (the pods roll).
    pub rolled: bool,
    /// Why the injection was not applied: fields of the Deployment that another field manager
    /// manages and tether would change (`FieldConflict`).
    pub refused: Option<Conflict>,
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
    let ours = Manager::forced(names);
    ensure(
        &Api::namespaced(client.clone(), ns),
        &steps.config_map,
        &ours,
        w,
    )
    .await?;
    let secrets = Api::namespaced(client.clone(), ns);
    key_ring(&secrets, names, &steps.key_ring, w).await?;
    for service in &steps.services {
        ensure(&Api::namespaced(client.clone(), ns), service, &ours, w).await?;
    }
    let accounts = Api::namespaced(client.clone(), ns);
    step(&accounts, &steps.service_account, &ours, w).await?;
    ensure(&Api::namespaced(client.clone(), ns), &steps.role, &ours, w).await?;
    let bindings = Api::namespaced(client.clone(), ns);
    ensure(&bindings, &steps.role_binding, &ours, w).await?;
    step(&Api::namespaced(client.clone(), ns), &steps.pdb, &ours, w).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let injection = inject(&deployments, names, steps, w).await?;
    Ok(Written {
        objects,
        rolled: injection.as_ref().is_ok_and(|rolled| *rolled),
        refused: injection.err(),
    })
}

/// Applies the injection without force unless the Deployment holds all of it
/// (`Ensure::covered`); returns whether the pod template changed (the Deployment's
/// `metadata.generation` moved), or the conflict that kept it from writing. A conflict that
/// lies only in what tether alone puts into the pod template ([`inject::is_own_field`]) is
/// resolved with force.
async fn inject(
    api: &Api<Deployment>,
    names: &Names,
    steps: &Steps<'_>,
    written: &mut Vec<String>,
) -> Result<Result<bool, Conflict>, Error> {
    let live = steps.injection.live;
    let body = &steps.injection.desired;
    if steps.injection.covered(body)? {
        return Ok(Ok(false));
    }
    let answer = match send(api, body, &Manager::gentle(names), written).await {
        Ok(answer) => answer,
        Err(Error::Kube(kube::Error::Api(status))) if status.code == 409 => {
            let conflicts = field_conflicts(&status);
            let ours = |(field, _): &(String, String)| inject::is_own_field(field);
            if conflicts.is_empty() || !conflicts.iter().all(ours) {
                let hint = Hint {
                    grace: steps.grace_needed,
                };
                return Ok(Err(field_conflict(&conflicts, &status.message, &hint)));
            }
            send(api, body, &Manager::forced(names), written).await?
        }
        Err(other) => return Err(other),
    };
    let generation = |d: Option<&Deployment>| d.and_then(|d| d.metadata.generation);
    Ok(Ok(generation(Some(&answer)) != generation(live)))
}

/// `(field, manager)` of each cause of a server-side apply conflict (`409`, causes of reason
/// `FieldManagerConflict`, whose message reads `conflict with "<manager>" …`).
fn field_conflicts(status: &kube::core::Status) -> Vec<(String, String)> {
    let causes = status.details.iter().flat_map(|d| d.causes.iter());
    causes
        .filter(|c| c.reason == "FieldManagerConflict")
        .map(|c| {
            let manager = c.message.split('"').nth(1).unwrap_or_default();
            (c.field.clone(), manager.to_owned())
        })
        .collect()
}

/// What tether needs of the fields a conflict names, for its message.
struct Hint {
    /// Seconds of `terminationGracePeriodSeconds` the drain needs.
    grace: i64,
}

impl Hint {
    /// What tether needs of `field`, if it is one the user can set to resolve the conflict.
    fn of(&self, field: &str) -> Option<String> {
        match field {
            ".spec.template.spec.terminationGracePeriodSeconds" => Some(format!(
                "set it to at least {} (the longer of spec.drain.timeout and spec.drain.shutdownDelay, + 15 s)",
                self.grace
            )),
            ".spec.template.spec.serviceAccountName" | ".spec.template.spec.serviceAccount" => {
                Some("remove it, or name a ServiceAccount of your own (not default)".to_owned())
            }
            _ => None,
        }
    }
}

/// The `FieldConflict` for `conflicts` (the API server's `message` when it named none).
fn field_conflict(conflicts: &[(String, String)], message: &str, hint: &Hint) -> Conflict {
    let fields: Vec<String> = conflicts
        .iter()
        .map(|(field, manager)| match hint.of(field) {
            Some(need) => format!("{field} (managed by {manager:?}: {need})"),
            None => format!("{field} (managed by {manager:?})"),
        })
        .collect();
    let listed = if fields.is_empty() {
        message.to_owned()
    } else {
        fields.join(", ")
    };
    Conflict::new(
        "FieldConflict",
        format!(
            "tether must set fields of the Deployment that another field manager manages, and never takes a field over: {listed}. Change them in your manifest (docs/guide/troubleshooting.md#fieldconflict)"
        ),
    )
}

/// Server-side applies the status `status` of the endpoint `names` (a `K`).
///
/// # Errors
/// [`Error::Kube`] when the request fails.
pub(crate) async fn status<K>(
    api: &Api<K>,
    names: &Names,
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
    let manager = Manager::forced(names);
    api.patch_status(&names.endpoint, &manager.0, &Patch::Apply(&body))
        .await?;
    Ok(())
}

/// Server-side applies an empty body to the `K` named `name` of `namespace` with field manager
/// `manager`: the API server drops every field that manager alone manages there, and nothing
/// else. Returns the object as the API server answered.
///
/// # Errors
/// [`Error::Kube`] when the request fails.
pub(crate) async fn release<K>(
    api: &Api<K>,
    namespace: &str,
    name: &str,
    manager: &str,
) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
{
    let empty = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"name": name, "namespace": namespace},
    });
    Ok(api
        .patch(name, &PatchParams::apply(manager), &Patch::Apply(&empty))
        .await?)
}

/// The field manager and force of an apply.
struct Manager(PatchParams);

impl Manager {
    /// The endpoint's manager, forced: for the endpoint's own children and status.
    fn forced(names: &Names) -> Self {
        Self(PatchParams::apply(&names.field_manager()).force())
    }

    /// The endpoint's manager, not forced: for the user's Deployment.
    fn gentle(names: &Names) -> Self {
        Self(PatchParams::apply(&names.field_manager()))
    }
}

/// Server-side applies `ensure.desired` unless its live object already holds all of it (and adds
/// `Kind/name` to `written` when it wrote).
async fn ensure<K, B>(
    api: &Api<K>,
    ensure: &Ensure<'_, K, B>,
    manager: &Manager,
    written: &mut Vec<String>,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
    B: Serialize,
{
    let body = serde_json::to_value(&ensure.desired)?;
    if ensure.covered(&body)? {
        return Ok(());
    }
    send(api, &body, manager, written).await.map(drop)
}

/// Server-side applies `body` (it names the object); returns the object as the API server
/// answered, and adds `Kind/name` to `written`.
async fn send<K>(
    api: &Api<K>,
    body: &serde_json::Value,
    manager: &Manager,
    written: &mut Vec<String>,
) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
{
    let name = body["metadata"]["name"].as_str().ok_or(Error::Unnamed)?;
    let answer = api.patch(name, &manager.0, &Patch::Apply(body)).await?;
    written.push(format!("{}/{name}", K::kind(&())));
    Ok(answer)
}

/// Ensures or deletes as `step` says.
async fn step<K>(
    api: &Api<K>,
    step: &Step<'_, K>,
    manager: &Manager,
    written: &mut Vec<String>,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
{
    match step {
        Step::Ensure(e) => ensure(api, e, manager, written).await,
        Step::Retire(r) => delete(api, r, written).await,
        Step::Leave => Ok(()),
    }
}

/// Writes the key-ring Secret as `step` says: a creation is listed in `written`; a patch (a
/// rotation step, which an Event of its own reports) is not.
async fn key_ring(
    api: &Api<Secret>,
    names: &Names,
    step: &KeyStep,
    written: &mut Vec<String>,
) -> Result<(), Error> {
    match step {
        KeyStep::Leave => Ok(()),
        KeyStep::Create(secret) => create(api, names, secret.as_ref(), written).await,
        KeyStep::Patch { name, body } => {
            let patch = Patch::Json::<()>(serde_json::from_value(body.clone())?);
            let params = PatchParams {
                field_manager: Some(names.field_manager()),
                ..PatchParams::default()
            };
            api.patch(name, &params, &patch).await?;
            Ok(())
        }
    }
}

/// Creates `object` (it did not exist when read), with the endpoint's field manager: the fields
/// it sets are the endpoint's in `managedFields`, as those of its applies are.
async fn create<K>(
    api: &Api<K>,
    names: &Names,
    object: &K,
    written: &mut Vec<String>,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
{
    let params = PostParams {
        field_manager: Some(names.field_manager()),
        ..PostParams::default()
    };
    api.create(&params, object).await?;
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_conflict_names_each_field_and_its_manager() {
        let status: kube::core::Status = serde_json::from_value(json!({
            "status": "Failure", "code": 409, "reason": "Conflict",
            "message": "Apply failed with 2 conflicts: conflict with \"helm\" using apps/v1: .spec.template.spec.terminationGracePeriodSeconds\nconflict with \"kubectl\": .spec.template.spec.serviceAccountName",
            "details": {"causes": [
                {"reason": "FieldManagerConflict", "message": "conflict with \"helm\" using apps/v1",
                 "field": ".spec.template.spec.terminationGracePeriodSeconds"},
                {"reason": "FieldManagerConflict", "message": "conflict with \"kubectl\"",
                 "field": ".spec.template.spec.serviceAccountName"},
                {"reason": "FieldValueInvalid", "message": "x", "field": ".spec"},
            ]},
        }))
        .unwrap();
        let conflicts = field_conflicts(&status);
        assert_eq!(
            conflicts,
            [
                (
                    ".spec.template.spec.terminationGracePeriodSeconds".to_owned(),
                    "helm".to_owned()
                ),
                (
                    ".spec.template.spec.serviceAccountName".to_owned(),
                    "kubectl".to_owned()
                ),
            ]
        );
        let hint = Hint { grace: 75 };
        let conflict = field_conflict(&conflicts, &status.message, &hint);
        assert_eq!(conflict.reason, "FieldConflict");
        assert!(
            conflict.message.contains(
                ".spec.template.spec.terminationGracePeriodSeconds (managed by \"helm\": set it to at least 75"
            ) && conflict.message.contains("(managed by \"kubectl\": remove it"),
            "{}",
            conflict.message
        );
        // Without causes, the API server's own message is kept.
        let bare = field_conflict(&[], "Apply failed with 1 conflict", &hint);
        assert!(bare.message.contains("Apply failed with 1 conflict"));
    }
}

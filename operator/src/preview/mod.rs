//! `tether-operator plan`: what one reconcile of an endpoint would write, printed instead of
//! sent, like `helm template` (`docs/guide/install.md#preview-what-the-operator-will-write`).
//! It runs the controller's own decision on manifests read from files — `plan::target` (admit
//! and validate) and `plan::decide` (the key ring, the plan, the steps against the live
//! children), with the live children read by [`dereference::children`] from a
//! [`Snapshot`](dereference::Snapshot) instead of the API server — and contacts no API server.
//! It asks no pod for its key report (`plan::Rotation::Skip`), so the steps of a rotation are
//! not previewed; the keys are always redacted.
//!
//! - `inputs`: reading the files into [`Inputs`] (the endpoint, its target, the live objects);
//! - `yaml`: rendering a [`Preview`] as the YAML stream the command prints ([`Preview::to_yaml`]).

mod inputs;
mod yaml;

use k8s_openapi::api::core::v1::Secret;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};

use crate::admission::Policy;
use crate::dereference;
use crate::error::Error;
use crate::plan::keys::KeyStep;
use crate::plan::steps::{Ensure, Step};
use crate::plan::{self, Defaults, Rotation};
use crate::validate::Conflict;

pub use inputs::{InputError, Inputs};

/// What the key-ring Secret's data shows instead of a key or a certificate.
const REDACTED: &str = "<redacted>";

/// What one reconcile would do with one object.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Server-side apply of this body.
    Apply(Value),
    /// Create this object (the key-ring Secret, its data [`REDACTED`]).
    Create(Value),
    /// Delete the object with this UID (a precondition), for this reason.
    Delete {
        /// The live object's UID.
        uid: Option<String>,
        /// Why the plan no longer wants it.
        reason: String,
    },
    /// Nothing: the live object already holds every field of the apply body.
    Unchanged,
}

/// One object of a [`Preview`].
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// Its `apiVersion`.
    pub api_version: String,
    /// Its `kind`.
    pub kind: String,
    /// Its name (in the endpoint's namespace).
    pub name: String,
    /// What the reconcile does with it.
    pub write: Write,
}

/// What one reconcile of a valid endpoint would send, in the order it sends it.
#[derive(Clone, Debug, PartialEq)]
pub struct Preview {
    /// The endpoint, `namespace/name`.
    pub endpoint: String,
    /// Its target Deployment's name.
    pub target: String,
    /// Every object the reconcile considers, in order.
    pub items: Vec<Item>,
}

/// A preview, or why the operator would write nothing.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The endpoint is valid: what a reconcile sends.
    Planned(Preview),
    /// A validation conflict: `Degraded` with this reason and message, nothing written.
    Degraded(Conflict),
}

/// Previews one reconcile of `inputs` with the operator-wide `defaults` (`--sidecar-image`,
/// `--sidecar-resources`).
///
/// # Errors
/// [`Error::Json`] when a live manifest does not parse as its kind (not expected:
/// [`Inputs::load`] checks them).
pub async fn preview(
    inputs: &Inputs,
    defaults: &Defaults,
    policy: &Policy,
) -> Result<Outcome, Error> {
    let Inputs {
        endpoint: ep,
        deployment,
        live,
        names,
        owner,
        ..
    } = inputs;
    let labels = dereference::namespace_labels(live, names, deployment).await?;
    let target = match plan::target(ep, names, deployment, labels.as_ref(), policy) {
        Ok(target) => target,
        Err(conflict) => return Ok(Outcome::Degraded(conflict)),
    };
    // No pod is asked for its key report: a rotation is not previewed.
    let live = dereference::children(live, names, owner, &target, |_| false).await?;
    let steps = match plan::decide(ep, names, owner, defaults, &target, &live, Rotation::Skip)? {
        Ok(decision) => decision.steps,
        Err(conflict) => return Ok(Outcome::Degraded(conflict)),
    };
    // The order of `apply::steps`; the keys are never shown (`created` redacts them).
    let mut items = vec![ensure(&steps.config_map)?];
    if let KeyStep::Create(secret) = &steps.key_ring {
        items.push(created(secret)?);
    }
    for service in &steps.services {
        items.push(ensure(service)?);
    }
    items.extend(step(&steps.service_account)?);
    items.push(ensure(&steps.role)?);
    items.push(ensure(&steps.role_binding)?);
    items.extend(step(&steps.pdb)?);
    items.push(ensure(&steps.injection)?);
    Ok(Outcome::Planned(Preview {
        endpoint: format!("{}/{}", names.namespace, names.endpoint),
        target: ep.spec.target_ref.name.clone(),
        items,
    }))
}

/// The item of an ensure step: its apply body, unless the live object covers it.
fn ensure<K, B>(ensure: &Ensure<'_, K, B>) -> Result<Item, Error>
where
    K: Resource<DynamicType = ()> + Serialize,
    B: Serialize,
{
    let body = serde_json::to_value(&ensure.desired)?;
    let sent = !ensure.covered(&body)?;
    applied::<K>(body, sent)
}

/// The item of the apply `body` of a `K` (it names the object): the body when it is `sent`.
fn applied<K: Resource<DynamicType = ()>>(body: Value, sent: bool) -> Result<Item, Error> {
    let name = body["metadata"]["name"]
        .as_str()
        .ok_or(Error::Unnamed)?
        .to_owned();
    let write = if sent {
        Write::Apply(body)
    } else {
        Write::Unchanged
    };
    Ok(item::<K>(name, write))
}

/// The item of the key-ring Secret's creation, its data redacted.
fn created(secret: &Secret) -> Result<Item, Error> {
    let mut body = serde_json::to_value(secret)?;
    for value in body["data"]
        .as_object_mut()
        .into_iter()
        .flat_map(|d| d.values_mut())
    {
        *value = json!(REDACTED);
    }
    Ok(item::<Secret>(secret.name_any(), Write::Create(body)))
}

/// The item of a step that may retire its child; `None` when it leaves it.
fn step<K>(step: &Step<'_, K>) -> Result<Option<Item>, Error>
where
    K: Resource<DynamicType = ()> + Serialize,
{
    Ok(match step {
        Step::Ensure(e) => Some(ensure(e)?),
        Step::Retire(r) => Some(item::<K>(
            r.live().name_any(),
            Write::Delete {
                uid: r.live().meta().uid.clone(),
                reason: r.reason().to_owned(),
            },
        )),
        Step::Leave => None,
    })
}

fn item<K: Resource<DynamicType = ()>>(name: String, write: Write) -> Item {
    Item {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name,
        write,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;

    use super::*;
    use crate::fixtures::{self, DEPLOYMENT, MINIMAL_ENDPOINT};

    // `defaults`, `planned` and `summary` serve the tests of `inputs` too.
    pub(super) fn defaults() -> Defaults {
        Defaults::with_image("tether-sidecar:test")
    }

    pub(super) fn policy() -> Policy {
        Policy::for_default_image(&defaults().sidecar_image)
    }

    /// The preview of the fixtures' endpoint on `deployment` with `live` objects.
    fn preview_of(deployment: Deployment, live: Vec<Value>) -> Outcome {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let inputs = Inputs::new(ep, deployment, live).expect("valid inputs");
        futures::executor::block_on(preview(&inputs, &defaults(), &policy())).expect("a preview")
    }

    pub(super) fn planned(outcome: Outcome) -> Preview {
        match outcome {
            Outcome::Planned(p) => p,
            Outcome::Degraded(c) => panic!("Degraded: {c}"),
        }
    }

    /// `Kind/name: write` of each item, the write as a word.
    pub(super) fn summary(preview: &Preview) -> Vec<String> {
        preview
            .items
            .iter()
            .map(|i| {
                let write = match &i.write {
                    Write::Apply(_) => "apply",
                    Write::Create(_) => "create",
                    Write::Delete { .. } => "delete",
                    Write::Unchanged => "unchanged",
                };
                format!("{}/{}: {write}", i.kind, i.name)
            })
            .collect()
    }

    fn body<'p>(preview: &'p Preview, kind: &str) -> &'p Value {
        let item = preview.items.iter().find(|i| i.kind == kind).unwrap();
        match &item.write {
            Write::Apply(b) | Write::Create(b) => b,
            other => panic!("{kind}: {other:?}"),
        }
    }

    /// A live object: `body` with a UID, as the API server stores it.
    fn stored(mut body: Value) -> Value {
        let name = body["metadata"]["name"].as_str().unwrap().to_owned();
        body["metadata"]["uid"] = json!(format!("uid-{name}"));
        body
    }

    #[test]
    fn a_first_reconcile_previews_every_child_in_the_order_it_is_sent() {
        let p = planned(preview_of(fixtures::deployment(DEPLOYMENT), Vec::new()));
        assert_eq!(p.endpoint, "tools/weather");
        assert_eq!(
            summary(&p),
            [
                "ConfigMap/weather-tether: apply",
                "Secret/weather-tether-keys-6f1c2a9e: create",
                "Service/weather-mcp: apply",
                "Service/weather-peers: apply",
                "ServiceAccount/weather-tether-sidecar: apply",
                "Role/weather-tether-sidecar: apply",
                "RoleBinding/weather-tether-sidecar: apply",
                "PodDisruptionBudget/weather-tether: apply",
                "Deployment/weather: apply",
            ]
        );
        assert_eq!(
            body(&p, "Secret")["data"],
            json!({"ca.crt": REDACTED, "secret": REDACTED, "tls.crt": REDACTED, "tls.key": REDACTED})
        );
        let sidecar = &body(&p, "Deployment")["spec"]["template"]["spec"]["initContainers"][0];
        assert_eq!(sidecar["name"], "tether-sidecar");
        assert_eq!(sidecar["image"], "tether-sidecar:test");
        let owner = &body(&p, "ConfigMap")["metadata"]["ownerReferences"][0];
        assert_eq!(owner["uid"], "6f1c2a9e-0000-4000-8000-000000000001");
    }

    #[test]
    fn live_objects_holding_the_plan_are_unchanged_and_a_changed_one_is_applied() {
        let deployment = fixtures::deployment(DEPLOYMENT);
        let first = planned(preview_of(deployment.clone(), Vec::new()));
        let mut live = Vec::new();
        let mut injected = serde_json::to_value(&deployment).unwrap();
        for item in &first.items {
            match (&item.write, item.kind.as_str()) {
                (Write::Apply(b), "Deployment") => fixtures::merge(&mut injected, b.clone()),
                (Write::Apply(b), _) => live.push(stored(b.clone())),
                // The redacted data is no base64; a live Secret's content never matters.
                (Write::Create(b), _) => live.push(stored(json!({
                    "apiVersion": b["apiVersion"], "kind": b["kind"], "metadata": b["metadata"],
                }))),
                (other, kind) => panic!("{kind}: {other:?}"),
            }
        }
        let injected: Deployment = serde_json::from_value(injected).unwrap();
        let again = planned(preview_of(injected.clone(), live.clone()));
        let unchanged: Vec<String> = first
            .items
            .iter()
            .filter(|i| i.kind != "Secret")
            .map(|i| format!("{}/{}: unchanged", i.kind, i.name))
            .collect();
        assert_eq!(summary(&again), unchanged, "no Secret is created again");
        // Someone edited the ConfigMap: only it is applied again.
        live[0]["data"]["endpoint.yaml"] = json!("edited");
        let edited = planned(preview_of(injected, live));
        assert_eq!(summary(&edited)[0], "ConfigMap/weather-tether: apply");
        assert!(
            summary(&edited)[1..]
                .iter()
                .all(|s| s.ends_with("unchanged"))
        );
    }

    #[test]
    fn our_children_retire_by_the_controllers_rules() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let uid = ep.metadata.uid.clone().unwrap();
        let owned = |kind: &str, api_version: &str, name: &str| {
            stored(json!({
                "apiVersion": api_version, "kind": kind,
                "metadata": {"name": name, "namespace": "tools", "ownerReferences": [{
                    "apiVersion": "mcp.tether.dev/v1alpha1", "kind": "McpEndpoint",
                    "name": "weather", "uid": uid, "controller": true}]},
            }))
        };
        let budget = |name: &str, namespace: &str| {
            stored(json!({
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "weather"}}},
            }))
        };
        let pod = |app: &str| {
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": format!("{app}-1"), "labels": {"app": app}},
                   "spec": {"serviceAccountName": "weather-tether-sidecar",
                            "containers": [{"name": "server"}]}})
        };
        let users = fixtures::deployment_with(|d| {
            d["spec"]["template"]["spec"]["serviceAccountName"] = json!("app-sa");
        });
        let ours = [
            owned("PodDisruptionBudget", "policy/v1", "weather-tether"),
            owned("ServiceAccount", "v1", "weather-tether-sidecar"),
        ];
        // A budget of another namespace is not the user's over these pods; a pod of another
        // app does not run as our ServiceAccount.
        let mut live = ours.to_vec();
        live.extend([budget("elsewhere", "billing"), pod("billing")]);
        let p = planned(preview_of(users.clone(), live.clone()));
        assert!(summary(&p).contains(&"PodDisruptionBudget/weather-tether: apply".to_owned()));
        let retired = p.items.iter().find(|i| i.kind == "ServiceAccount").unwrap();
        assert_eq!(
            retired.write,
            Write::Delete {
                uid: Some("uid-weather-tether-sidecar".into()),
                reason: "no pod runs with it; the pods name ServiceAccount \"app-sa\"".into(),
            }
        );
        // The user's budget over the pods retires ours; a pod still running as ours keeps it.
        live.extend([budget("theirs", "tools"), pod("weather")]);
        let p = planned(preview_of(users, live));
        let budget = p.items.iter().find(|i| i.kind == "PodDisruptionBudget");
        assert!(
            matches!(&budget.unwrap().write, Write::Delete { reason, .. } if reason.contains("\"theirs\"")),
            "{budget:?}"
        );
        assert!(!p.items.iter().any(|i| i.kind == "ServiceAccount"));
        let subjects = &body(&p, "RoleBinding")["subjects"];
        assert_eq!(subjects[0]["name"], "app-sa");
        assert_eq!(subjects[1]["name"], "weather-tether-sidecar");
    }

    #[test]
    fn a_conflict_is_degraded_and_previews_nothing() {
        let clash = fixtures::deployment_with(|d| {
            d["spec"]["template"]["spec"]["containers"][0]["ports"] =
                json!([{"containerPort": 3000}, {"containerPort": 8080}]);
        });
        match preview_of(clash, Vec::new()) {
            Outcome::Degraded(c) => assert_eq!(c.reason, "PortConflict"),
            Outcome::Planned(p) => panic!("planned {:?}", summary(&p)),
        }
    }

    #[test]
    fn a_live_namespace_manifest_answers_for_the_opt_in() {
        let unlabelled = || {
            fixtures::deployment_with(|d| {
                d["metadata"]["labels"] = json!({});
            })
        };
        match preview_of(unlabelled(), Vec::new()) {
            Outcome::Degraded(c) => assert_eq!(c.reason, "TargetNotOptedIn"),
            Outcome::Planned(p) => panic!("planned {:?}", summary(&p)),
        }
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "tools", "labels": {"mcp.tether.dev/injection": "enabled"}}});
        let p = planned(preview_of(unlabelled(), vec![namespace]));
        assert!(summary(&p).contains(&"Deployment/weather: apply".to_owned()));
    }
}

//! `tether-operator plan`: what one reconcile of an endpoint would write, printed instead of
//! sent, like `helm template` (`docs/guide/install.md#preview-what-the-operator-will-write`).
//! It runs the controller's own steps on manifests read from files — [`validate`], [`plan`],
//! `Plan::steps`, with the live children read by [`dereference::children`] from a
//! [`Snapshot`] instead of the API server — and contacts no API server.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::{Deserialize as _, Serialize};
use serde_json::{Value, json};
use tether_crds::McpEndpoint;

use crate::dereference::{self, Snapshot};
use crate::error::Error;
use crate::names::Names;
use crate::plan::config::HMAC_KEY_BYTES;
use crate::plan::steps::{Ensure, Step};
use crate::plan::{Defaults, plan};
use crate::validate::{Conflict, validate};

/// The UID given to an endpoint manifest without one (its children's owner references need
/// one); clearly not a real object's.
pub const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";
/// What the HMAC Secret's data shows instead of a key.
pub const REDACTED: &str = "<redacted>";

/// A file `plan` cannot use, and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct InputError {
    /// The file (or directory).
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl InputError {
    fn new(path: &Path, message: impl Into<String>) -> Self {
        Self {
            path: path.to_owned(),
            message: message.into(),
        }
    }
}

/// What a preview starts from: the endpoint, its target Deployment and the live children.
#[derive(Clone, Debug)]
pub struct Inputs {
    endpoint: McpEndpoint,
    deployment: Deployment,
    live: Snapshot,
    names: Names,
    owner: OwnerReference,
    notes: Vec<String>,
}

impl Inputs {
    /// The inputs of `endpoint` on its target `deployment`, with `live` (JSON manifests of live
    /// objects; empty: nothing is live, a first reconcile). Either manifest may leave out the
    /// namespace: it is the other's, else `default`; an endpoint without a UID gets
    /// [`PLACEHOLDER_UID`]. Both are said in [`Inputs::notes`].
    ///
    /// # Errors
    /// A message when the endpoint has no name, the Deployment is not its target (name), or
    /// the two name different namespaces.
    pub fn new(
        mut endpoint: McpEndpoint,
        mut deployment: Deployment,
        live: Vec<Value>,
    ) -> Result<Self, String> {
        let mut notes = Vec::new();
        let name = endpoint
            .metadata
            .name
            .clone()
            .ok_or("the McpEndpoint has no metadata.name")?;
        let target = &endpoint.spec.target_ref.name;
        if deployment.metadata.name.as_ref() != Some(target) {
            return Err(format!(
                "the Deployment is named {:?}, but McpEndpoint {name:?} targets {target:?} \
                 (spec.targetRef.name)",
                deployment.metadata.name.as_deref().unwrap_or_default()
            ));
        }
        let namespace = match (&endpoint.metadata.namespace, &deployment.metadata.namespace) {
            (Some(ours), Some(theirs)) if ours != theirs => {
                return Err(format!(
                    "the Deployment is in namespace {theirs:?}, the McpEndpoint in {ours:?}: \
                     the operator looks for the target in the endpoint's namespace"
                ));
            }
            (Some(ns), _) | (None, Some(ns)) => ns.clone(),
            (None, None) => {
                notes.push("neither manifest names a namespace: previewing in \"default\"".into());
                "default".to_owned()
            }
        };
        endpoint.metadata.namespace = Some(namespace.clone());
        deployment.metadata.namespace = Some(namespace);
        if endpoint.metadata.uid.is_none() {
            notes.push(format!(
                "the McpEndpoint has no metadata.uid: its children's owner references show the \
                 placeholder {PLACEHOLDER_UID} (the API server gives the real one)"
            ));
            endpoint.metadata.uid = Some(PLACEHOLDER_UID.to_owned());
        }
        let names = Names::of(&endpoint).ok_or("the McpEndpoint has no name or namespace")?;
        let owner = endpoint
            .controller_owner_ref(&())
            .ok_or("the McpEndpoint has no name or UID")?;
        Ok(Self {
            endpoint,
            deployment,
            live: Snapshot::new(live),
            names,
            owner,
            notes,
        })
    }

    /// Reads the endpoint manifest at `endpoint`, its target at `deployment` (one YAML document
    /// each) and, from `live` (a directory of `.yaml`, `.yml` or `.json` files, or one file;
    /// each file one or more documents, a `kind: List` counting as its items), the live
    /// objects a reconcile reads: ConfigMaps, Secrets, Services, ServiceAccounts, Roles,
    /// RoleBindings, PodDisruptionBudgets and Pods. Other kinds are ignored, with a note.
    ///
    /// # Errors
    /// [`InputError`] naming the file that cannot be read, is not YAML, holds the wrong kind
    /// (or, in the endpoint, an unknown field), or does not fit the other (see [`Inputs::new`]).
    pub fn load(
        endpoint: &Path,
        deployment: &Path,
        live: Option<&Path>,
    ) -> Result<Self, InputError> {
        let mut notes = Vec::new();
        let ep: McpEndpoint = one::<McpEndpoint>(endpoint, &mut notes, true)?;
        if ep.metadata.name.as_deref().is_none_or(str::is_empty) {
            return Err(InputError::new(
                endpoint,
                "the McpEndpoint has no metadata.name",
            ));
        }
        let target: Deployment = one::<Deployment>(deployment, &mut notes, false)?;
        let objects = match live {
            Some(dir) => live_objects(dir, &mut notes)?,
            None => Vec::new(),
        };
        let mut inputs =
            Self::new(ep, target, objects).map_err(|m| InputError::new(deployment, m))?;
        notes.append(&mut inputs.notes);
        inputs.notes = notes;
        Ok(inputs)
    }

    /// What the user should know about how the inputs were read (printed on stderr).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
}

/// What one reconcile would do with one object.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Server-side apply of this body.
    Apply(Value),
    /// Create this object (the HMAC Secret, its data [`REDACTED`]).
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
pub async fn preview(inputs: &Inputs, defaults: &Defaults) -> Result<Outcome, Error> {
    let Inputs {
        endpoint: ep,
        deployment,
        live,
        names,
        owner,
        ..
    } = inputs;
    let target = match validate(ep, names, deployment) {
        Ok(target) => target,
        Err(conflict) => return Ok(Outcome::Degraded(conflict)),
    };
    let live = dereference::children(live, names, owner, &target).await?;
    // The key is never shown: a placeholder, redacted below, stands for the random one.
    let secret = live.secret_name(names);
    let steps = plan(ep, names, &target, defaults, owner, &secret).steps(
        names,
        owner,
        &target,
        &live,
        || [0; HMAC_KEY_BYTES],
    );
    if let Err(conflict) = steps.check_taken(owner) {
        return Ok(Outcome::Degraded(conflict));
    }
    // The order of `apply::steps`.
    let mut items = vec![ensure(&steps.config_map)?];
    if let Some(secret) = &steps.secret {
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
    let name = body["metadata"]["name"].as_str().ok_or(Error::Unnamed)?;
    let write = if ensure.covered(&body)? {
        Write::Unchanged
    } else {
        Write::Apply(body.clone())
    };
    Ok(item::<K>(name.to_owned(), write))
}

/// The item of the HMAC Secret's creation, its data redacted.
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

impl Preview {
    /// The preview as a YAML stream: each object written is a document (`---` between them)
    /// with a `#` comment saying what is done with it; unchanged objects are comments only.
    pub fn to_yaml(&self) -> String {
        let mut out = format!(
            "# tether-operator plan: McpEndpoint {} on Deployment {}: what one reconcile sends,\n\
             # in order. A preview, not for kubectl apply: the Secret's data is redacted and a\n\
             # deletion shows only what it deletes.\n",
            self.endpoint, self.target
        );
        let namespace = self.endpoint.split('/').next().unwrap_or_default();
        let mut documents = 0;
        for item in &self.items {
            let what = format!("{} {}", item.kind, item.name);
            let (comment, body) = match &item.write {
                Write::Unchanged => {
                    out.push_str(&format!(
                        "# unchanged {what}: the live object holds every field of the apply body; \
                         nothing is sent\n"
                    ));
                    continue;
                }
                Write::Apply(body) => (format!("apply {what} (server-side apply)"), body.clone()),
                Write::Create(body) => (
                    format!(
                        "create {what}, once; its data is redacted: the operator draws a random \
                         {HMAC_KEY_BYTES}-byte key when it creates it"
                    ),
                    body.clone(),
                ),
                Write::Delete { uid, reason } => (
                    format!("delete {what} (only while its UID is {uid:?}): {reason}"),
                    json!({
                        "apiVersion": item.api_version,
                        "kind": item.kind,
                        "metadata": {"name": item.name, "namespace": namespace, "uid": uid},
                    }),
                ),
            };
            if documents > 0 {
                out.push_str("---\n");
            }
            documents += 1;
            out.push_str(&format!("# {comment}\n"));
            out.push_str(&yaml_serde::to_string(&body).expect("JSON serializes to YAML"));
        }
        if documents == 0 {
            out.push_str("# nothing to send\n");
        }
        out
    }
}

/// The documents of the YAML file at `path` (a `kind: List` counts as its items; empty
/// documents are skipped).
fn documents(path: &Path) -> Result<Vec<Value>, InputError> {
    let text = std::fs::read_to_string(path).map_err(|e| InputError::new(path, e.to_string()))?;
    let mut out = Vec::new();
    for (at, document) in yaml_serde::Deserializer::from_str(&text).enumerate() {
        let value = Value::deserialize(document)
            .map_err(|e| InputError::new(path, format!("document {}: {e}", at + 1)))?;
        match value {
            Value::Null => {}
            Value::Object(ref o) if o.get("kind") == Some(&json!("List")) => {
                out.extend(
                    o.get("items")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

/// The one `K` the file at `path` holds; `strict`: a field `K` does not know is an error,
/// else a note.
fn one<K>(path: &Path, notes: &mut Vec<String>, strict: bool) -> Result<K, InputError>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let (api_version, kind) = (K::api_version(&()), K::kind(&()));
    let document = match <[Value; 1]>::try_from(documents(path)?) {
        Ok([document]) => document,
        Err(found) => {
            return Err(InputError::new(
                path,
                format!("expected one {kind} document, found {}", found.len()),
            ));
        }
    };
    if document["apiVersion"] != api_version.as_ref() || document["kind"] != kind.as_ref() {
        return Err(InputError::new(
            path,
            format!(
                "expected apiVersion {api_version} kind {kind}, found {} {}",
                document["apiVersion"], document["kind"]
            ),
        ));
    }
    let mut unknown = Vec::new();
    let typed: K = serde_ignored::deserialize(&document, |field| {
        // Some types' deserializers pass through unnamed levels (`?`).
        let field = field.to_string();
        let field: Vec<&str> = field.split('.').filter(|s| *s != "?").collect();
        let field = field.join(".");
        // Checked above; some types' deserializers skip them.
        if field != "apiVersion" && field != "kind" {
            unknown.push(field);
        }
    })
    .map_err(|e| InputError::new(path, e.to_string()))?;
    if !unknown.is_empty() {
        let message = format!("unknown field(s) {}", unknown.join(", "));
        if strict {
            return Err(InputError::new(path, message));
        }
        notes.push(format!("{}: ignored {message}", path.display()));
    }
    Ok(typed)
}

/// A kind a reconcile reads, and a check that a manifest parses as it.
struct ReadKind {
    api_version: String,
    kind: String,
    parses: fn(&Value) -> Result<(), serde_json::Error>,
}

fn read_kind<K: Resource<DynamicType = ()> + DeserializeOwned>() -> ReadKind {
    ReadKind {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        parses: |v| K::deserialize(v).map(drop),
    }
}

/// The live objects a reconcile reads, from the files at `path` (a directory or one file).
fn live_objects(path: &Path, notes: &mut Vec<String>) -> Result<Vec<Value>, InputError> {
    let kinds = [
        read_kind::<ConfigMap>(),
        read_kind::<Secret>(),
        read_kind::<Service>(),
        read_kind::<ServiceAccount>(),
        read_kind::<Role>(),
        read_kind::<RoleBinding>(),
        read_kind::<PodDisruptionBudget>(),
        read_kind::<Pod>(),
    ];
    let files = if path.is_dir() {
        let entries = std::fs::read_dir(path).map_err(|e| InputError::new(path, e.to_string()))?;
        let mut files = Vec::new();
        for entry in entries {
            let file = entry
                .map_err(|e| InputError::new(path, e.to_string()))?
                .path();
            let manifest = file
                .extension()
                .is_some_and(|x| ["yaml", "yml", "json"].contains(&x.to_string_lossy().as_ref()));
            if manifest && file.is_file() {
                files.push(file);
            }
        }
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut objects = Vec::new();
    for file in files {
        for (at, object) in documents(&file)?.into_iter().enumerate() {
            let what = |m: String| InputError::new(&file, format!("object {}: {m}", at + 1));
            let (Some(api_version), Some(kind)) =
                (object["apiVersion"].as_str(), object["kind"].as_str())
            else {
                return Err(what("no apiVersion and kind".into()));
            };
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            match kinds
                .iter()
                .find(|k| k.api_version == api_version && k.kind == kind)
            {
                Some(k) => (k.parses)(&object).map_err(|e| what(format!("{kind} {name}: {e}")))?,
                None => {
                    notes.push(format!(
                        "{}: ignored {kind} {name}: not a kind the operator reads among an \
                         endpoint's children",
                        file.display()
                    ));
                    continue;
                }
            }
            objects.push(object);
        }
    }
    Ok(objects)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, DEPLOYMENT, MINIMAL_ENDPOINT};

    fn defaults() -> Defaults {
        Defaults::with_image("tether-sidecar:test")
    }

    /// The preview of the fixtures' endpoint on `deployment` with `live` objects.
    fn preview_of(deployment: Deployment, live: Vec<Value>) -> Outcome {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let inputs = Inputs::new(ep, deployment, live).expect("valid inputs");
        futures::executor::block_on(preview(&inputs, &defaults())).expect("a preview")
    }

    fn planned(outcome: Outcome) -> Preview {
        match outcome {
            Outcome::Planned(p) => p,
            Outcome::Degraded(c) => panic!("Degraded: {c}"),
        }
    }

    /// `Kind/name: write` of each item, the write as a word.
    fn summary(preview: &Preview) -> Vec<String> {
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
                "Secret/weather-tether-6f1c2a9e: create",
                "Service/weather-mcp: apply",
                "Service/weather-peers: apply",
                "ServiceAccount/weather-tether-sidecar: apply",
                "Role/weather-tether-sidecar: apply",
                "RoleBinding/weather-tether-sidecar: apply",
                "PodDisruptionBudget/weather-tether: apply",
                "Deployment/weather: apply",
            ]
        );
        assert_eq!(body(&p, "Secret")["data"], json!({"secret": REDACTED}));
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
    fn inputs_fill_in_a_namespace_and_a_placeholder_uid_and_refuse_another_target() {
        let mut ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        ep.metadata.namespace = None;
        ep.metadata.uid = None;
        let mut deployment = fixtures::deployment(DEPLOYMENT);
        deployment.metadata.namespace = None;
        let inputs = Inputs::new(ep.clone(), deployment.clone(), Vec::new()).unwrap();
        assert_eq!(inputs.names.namespace, "default");
        assert_eq!(inputs.owner.uid, PLACEHOLDER_UID);
        assert_eq!(inputs.notes().len(), 2, "{:?}", inputs.notes());
        assert!(inputs.notes()[1].contains(PLACEHOLDER_UID));
        // The Deployment's namespace is the endpoint's.
        let mut in_tools = deployment.clone();
        in_tools.metadata.namespace = Some("tools".into());
        let inputs = Inputs::new(ep.clone(), in_tools.clone(), Vec::new()).unwrap();
        assert_eq!(inputs.names.namespace, "tools");
        let mut elsewhere = ep.clone();
        elsewhere.metadata.namespace = Some("billing".into());
        let err = Inputs::new(elsewhere, in_tools, Vec::new()).unwrap_err();
        assert!(err.contains("\"billing\""), "{err}");
        let mut other = deployment;
        other.metadata.name = Some("billing".into());
        let err = Inputs::new(ep, other, Vec::new()).unwrap_err();
        assert!(err.contains("spec.targetRef.name"), "{err}");
    }

    #[test]
    fn files_are_read_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            path
        };
        let ep = write("ep.yaml", MINIMAL_ENDPOINT);
        let deployment = write("deployment.yaml", DEPLOYMENT);
        write(
            "live/a.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: weather-tether-6f1c2a9e, ownerReferences: \
             [{apiVersion: mcp.tether.dev/v1alpha1, kind: McpEndpoint, name: weather, \
             uid: 6f1c2a9e-0000-4000-8000-000000000001, controller: true}]}\n---\n\
             apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: weather}\n",
        );
        write(
            "live/b.yml",
            "apiVersion: v1\nkind: List\nitems:\n- apiVersion: policy/v1\n  kind: PodDisruptionBudget\n  \
             metadata: {name: theirs}\n  spec: {selector: {matchLabels: {app: weather}}}\n",
        );
        write("live/notes.txt", "not a manifest");
        let live = dir.path().join("live");
        let inputs = Inputs::load(&ep, &deployment, Some(&live)).expect("loads");
        assert!(
            inputs
                .notes()
                .iter()
                .any(|n| n.contains("ignored Deployment weather")),
            "{:?}",
            inputs.notes()
        );
        // The live Secret exists and the listed budget of the user's covers the pods.
        let outcome = futures::executor::block_on(preview(&inputs, &defaults())).unwrap();
        let kinds = summary(&planned(outcome));
        assert!(!kinds.iter().any(|s| s.starts_with("Secret/")), "{kinds:?}");
        assert!(
            !kinds.iter().any(|s| s.starts_with("PodDisruptionBudget/")),
            "{kinds:?}"
        );

        let refused = |ep: &Path, deployment: &Path, live: Option<&Path>| {
            let e = Inputs::load(ep, deployment, live).unwrap_err();
            (e.path.clone(), e.message)
        };
        let missing = dir.path().join("missing.yaml");
        assert_eq!(refused(&missing, &deployment, None).0, missing);
        let typo = write(
            "typo.yaml",
            &MINIMAL_ENDPOINT.replace("spec:\n", "spec:\n  sidecarr: {}\n"),
        );
        let (path, message) = refused(&typo, &deployment, None);
        assert_eq!(path, typo);
        assert!(
            message.contains("unknown field(s) spec.sidecarr"),
            "{message}"
        );
        let (path, message) = refused(&deployment, &deployment, None);
        assert_eq!(path, deployment);
        assert!(message.contains("kind McpEndpoint"), "{message}");
        let two = write(
            "two.yaml",
            &format!("{MINIMAL_ENDPOINT}---\n{MINIMAL_ENDPOINT}"),
        );
        assert!(refused(&two, &deployment, None).1.contains("found 2"));
        let bad = write(
            "bad/service.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: weather-mcp}\nspec: {ports: 7}\n",
        );
        let (path, message) = refused(&ep, &deployment, Some(&bad));
        assert_eq!(path, bad);
        assert!(
            message.starts_with("object 1: Service weather-mcp"),
            "{message}"
        );
        let (path, message) = refused(&ep, &missing, None);
        assert_eq!(path, missing);
        assert!(!message.is_empty());
    }

    #[test]
    fn the_yaml_has_a_document_per_write_and_a_comment_for_the_rest() {
        let item = |kind: &str, write: Write| Item {
            api_version: "v1".into(),
            kind: kind.into(),
            name: "weather-tether".into(),
            write,
        };
        let preview = Preview {
            endpoint: "tools/weather".into(),
            target: "weather".into(),
            items: vec![
                item("ConfigMap", Write::Unchanged),
                item(
                    "ConfigMap",
                    Write::Apply(json!({"kind": "ConfigMap", "data": {"a": "1"}})),
                ),
                item(
                    "ServiceAccount",
                    Write::Delete {
                        uid: Some("u-1".into()),
                        reason: "no pod runs with it".into(),
                    },
                ),
            ],
        };
        let yaml = preview.to_yaml();
        assert!(
            yaml.contains("# unchanged ConfigMap weather-tether:"),
            "{yaml}"
        );
        assert!(
            yaml.contains("# delete ServiceAccount weather-tether"),
            "{yaml}"
        );
        let documents: Vec<Value> = yaml_serde::Deserializer::from_str(&yaml)
            .map(|d| Value::deserialize(d).unwrap())
            .collect();
        assert_eq!(
            documents,
            [
                json!({"kind": "ConfigMap", "data": {"a": "1"}}),
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {
                    "name": "weather-tether", "namespace": "tools", "uid": "u-1"}}),
            ]
        );
        let nothing = Preview {
            items: vec![item("ConfigMap", Write::Unchanged)],
            ..preview
        };
        assert!(nothing.to_yaml().ends_with("# nothing to send\n"));
    }
}

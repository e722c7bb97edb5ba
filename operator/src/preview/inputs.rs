//! Reading the files of `tether-operator plan` into [`Inputs`]: the endpoint manifest, its
//! target Deployment and the live objects a reconcile reads, each checked as its kind, with
//! the file named when one cannot be used.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use serde::Deserialize as _;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tether_crds::McpEndpoint;

use crate::dereference::Snapshot;
use crate::names::Names;

/// The UID given to an endpoint manifest without one (its children's owner references need
/// one); clearly not a real object's.
const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

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
    pub(super) endpoint: McpEndpoint,
    pub(super) deployment: Deployment,
    pub(super) live: Snapshot,
    pub(super) names: Names,
    pub(super) owner: OwnerReference,
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
        read_kind::<Namespace>(),
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
    use crate::preview::preview;
    use crate::preview::tests::{defaults, planned, policy, summary};

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
            "apiVersion: v1\nkind: Secret\nmetadata: {name: weather-tether-keys-6f1c2a9e, ownerReferences: \
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
        // The live key ring exists (its data left out, as the guide says) and the listed budget
        // of the user's covers the pods.
        let outcome =
            futures::executor::block_on(preview(&inputs, &defaults(), &policy())).unwrap();
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
}

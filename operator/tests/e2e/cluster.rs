//! The cluster as the tests use it, through kube-rs: a fresh namespace per test (deleted at its
//! end whatever happened), the example manifests of `examples/k8s/` applied into it, and
//! bounded waits on what the operator and the Deployment controller do.

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};
use tether_crds::McpEndpoint;
use tether_operator::admission::OPT_IN_LABEL;
use tether_operator::names::SIDECAR_CONTAINER;

use crate::Settings;

/// Field manager of everything the tests apply (the operator's is `tether-operator`).
pub(crate) const FIELD_MANAGER: &str = "tether-e2e";
/// Label on the tests' namespaces, to find one left behind by an interrupted run.
const NAMESPACE_LABEL: (&str, &str) = ("app.kubernetes.io/created-by", "tether-e2e");
/// The example Deployment's pods (`examples/k8s/deployment.yaml`).
pub(crate) const EXAMPLE_PODS: &str = "app=weather";
/// Interval between two looks at the cluster while waiting.
const POLL: Duration = Duration::from_secs(1);
/// How often the operator looks at an endpoint again without a change
/// (`tether_operator::controller::RECHECK`), plus a margin: a wait this long sees a reconcile.
pub(crate) const A_RECONCILE: Duration = Duration::from_secs(35);

/// Any error of a scenario.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// What a scenario step returns: a value, or what went wrong.
pub(crate) type Outcome<T = ()> = Result<T, BoxError>;

/// A cluster with the operator installed.
#[derive(Clone)]
pub(crate) struct Cluster {
    /// What the environment asked for.
    pub settings: Settings,
    /// A client of the kubeconfig's user (not the operator's).
    pub client: Client,
}

impl Cluster {
    /// A client for the current context of the settings' kubeconfig.
    pub async fn connect(settings: Settings) -> Outcome<Self> {
        let kubeconfig = Kubeconfig::read_from(&settings.kubeconfig)?;
        let options = KubeConfigOptions::default();
        let config = Config::from_custom_kubeconfig(kubeconfig, &options).await?;
        Ok(Self {
            client: Client::try_from(config)?,
            settings,
        })
    }

    /// Runs `scenario` (given this cluster and the namespace) in a new namespace labelled
    /// `labels` (and [`NAMESPACE_LABEL`]), then deletes the namespace whatever happened.
    ///
    /// # Panics
    /// When the scenario fails or panics, or the namespace cannot be created or deleted.
    pub async fn run(
        &self,
        labels: &[(&str, &str)],
        scenario: impl AsyncFnOnce(&Self, &str) -> Outcome,
    ) {
        let ns = format!("tether-e2e-{:08x}", rand::random::<u32>());
        let labels = labels.iter().chain([&NAMESPACE_LABEL]);
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.clone()),
                labels: Some(labels.map(|(k, v)| ((*k).into(), (*v).into())).collect()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
        eprintln!("e2e: namespace {ns}");
        let outcome = AssertUnwindSafe(scenario(self, &ns)).catch_unwind().await;
        let cleaned = self.delete_namespace(&ns).await;
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("e2e (namespace {ns}): {e}"),
            Err(panic) => std::panic::resume_unwind(panic),
        }
        if let Err(e) = cleaned {
            panic!("deleting namespace {ns}: {e}");
        }
    }

    /// Deletes `ns` and waits (bounded) until no `McpEndpoint` is left in it, which the
    /// operator's finalizer ensures; one still there at the deadline loses its finalizers so the
    /// namespace can go. The rest of the namespace (pods draining) goes on its own.
    pub async fn delete_namespace(&self, ns: &str) -> Outcome {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        match namespaces.delete(ns, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let endpoints = self.endpoints(ns);
        let finalized =
            wait_until(
                "no McpEndpoint left",
                self.settings.timeout,
                async || match endpoints.list(&ListParams::default()).await {
                    Ok(left) if left.items.is_empty() => Ok(()),
                    Ok(left) => Err(format!("{} left", left.items.len())),
                    Err(e) => Err(e.to_string()),
                },
            )
            .await;
        if let Err(e) = finalized {
            eprintln!("e2e: {e}; removing the finalizers so namespace {ns} can be deleted");
            let released = json!({"metadata": {"finalizers": null}});
            for ep in endpoints.list(&ListParams::default()).await?.items {
                let name = ep.metadata.name.unwrap_or_default();
                endpoints
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&released))
                    .await?;
            }
        }
        Ok(())
    }

    /// The `McpEndpoint`s of `ns`.
    pub fn endpoints(&self, ns: &str) -> Api<McpEndpoint> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// The Deployments of `ns`.
    pub fn deployments(&self, ns: &str) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// The example Deployment as applied into `ns`: its manifest with the namespace,
    /// `TETHER_E2E_SERVER_IMAGE` and the server's `--log-calls` (what
    /// [`crate::traffic::ServerLogs`] counts), then `edit`.
    pub fn example_deployment(&self, ns: &str, edit: impl FnOnce(&mut Value)) -> Outcome<Value> {
        let mut deployment = example("deployment.yaml")?;
        deployment["metadata"]["namespace"] = json!(ns);
        let server = &mut deployment["spec"]["template"]["spec"]["containers"][0];
        if let Some(image) = &self.settings.server_image {
            server["image"] = json!(image);
        }
        server["args"]
            .as_array_mut()
            .ok_or("the example server without args")?
            .push(json!("--log-calls"));
        edit(&mut deployment);
        Ok(deployment)
    }

    /// Applies the example Deployment (edited by `edit`) into `ns`; returns its name.
    pub async fn deploy(&self, ns: &str, edit: impl FnOnce(&mut Value)) -> Outcome<String> {
        let deployment = self.example_deployment(ns, edit)?;
        let name = name_of(&deployment)?;
        self.deployments(ns)
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&deployment),
            )
            .await
            .map_err(|e| format!("applying Deployment {name}: {e}"))?;
        Ok(name)
    }

    /// Applies the minimal example endpoint into `ns` as `name`, its spec merged with `spec`.
    pub async fn endpoint(&self, ns: &str, name: &str, spec: Value) -> Outcome {
        let mut endpoint = example("mcpendpoint-minimal.yaml")?;
        endpoint["metadata"] = json!({"name": name, "namespace": ns});
        merge(&mut endpoint["spec"], spec);
        self.endpoints(ns)
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&endpoint),
            )
            .await
            .map_err(|e| format!("applying McpEndpoint {name}: {e}"))?;
        Ok(())
    }

    /// Applies endpoint `name` as [`Self::endpoint`] does, then waits until it is Ready
    /// ([`Self::wait_ready`]).
    pub async fn ready_endpoint(&self, ns: &str, name: &str, spec: Value) -> Outcome {
        self.endpoint(ns, name, spec).await?;
        self.wait_ready(ns, name).await
    }

    /// How most scenarios start: the example Deployment, opted in to endpoint `name`, and that
    /// endpoint on it (its spec merged with `spec`), applied into `ns`, once the endpoint is
    /// Ready; returns the Deployment's name.
    pub async fn serve(&self, ns: &str, name: &str, spec: Value) -> Outcome<String> {
        let target = self
            .deploy(ns, |d| {
                d["metadata"]["labels"][OPT_IN_LABEL] = json!(name);
            })
            .await?;
        self.ready_endpoint(ns, name, spec).await?;
        Ok(target)
    }

    /// Fails unless endpoint `name` is `Ready=True` now (no waiting).
    pub async fn ensure_ready(&self, ns: &str, name: &str) -> Outcome {
        let ready = self.condition(ns, name, "Ready").await?;
        if ready.status != "True" {
            return Err(format!("{name}: Ready={} ({})", ready.status, ready.reason).into());
        }
        Ok(())
    }

    /// The condition `type_` of endpoint `name`, if it has one.
    pub async fn condition(&self, ns: &str, name: &str, type_: &str) -> Result<Condition, String> {
        let ep = self
            .endpoints(ns)
            .get(name)
            .await
            .map_err(|e| e.to_string())?;
        let conditions = ep.status.map(|s| s.conditions).unwrap_or_default();
        conditions
            .into_iter()
            .find(|c| c.type_ == type_)
            .ok_or_else(|| format!("no {type_} condition yet"))
    }

    /// Waits until endpoint `name` is `Ready=True` (every pod runs a ready sidecar of the
    /// current template) and its Deployment has no old pod left.
    pub async fn wait_ready(&self, ns: &str, name: &str) -> Outcome {
        wait_until(
            &format!("McpEndpoint {name} Ready"),
            self.settings.timeout,
            async || match self.condition(ns, name, "Ready").await? {
                c if c.status == "True" => Ok(()),
                c => Err(format!("Ready={} ({}: {})", c.status, c.reason, c.message)),
            },
        )
        .await?;
        let target = self.endpoints(ns).get(name).await?.spec.target_ref.name;
        self.wait_rolled(ns, &target).await
    }

    /// Waits until endpoint `name` has nothing left to report: Ready, its Deployment rolled out,
    /// no pod of it terminating, and its status counting exactly its pods, all routable, none
    /// draining, no rollout in progress (the operator writes the status as these change; after
    /// this only a change writes).
    pub async fn wait_settled(&self, ns: &str, name: &str) -> Outcome {
        self.wait_ready(ns, name).await?;
        let target = self.endpoints(ns).get(name).await?.spec.target_ref.name;
        let want = self
            .deployments(ns)
            .get(&target)
            .await?
            .spec
            .and_then(|s| s.replicas)
            .unwrap_or(1);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        wait_until(
            &format!("McpEndpoint {name} settled"),
            self.settings.timeout,
            async || {
                let terminating = terminating_pods(&pods, EXAMPLE_PODS).await?.len();
                let ep = self
                    .endpoints(ns)
                    .get(name)
                    .await
                    .map_err(|e| e.to_string())?;
                let status = ep.status.unwrap_or_default();
                let counts = (status.pods, status.routable, status.draining.unwrap_or(0));
                let rolling = status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Progressing" && c.status == "True");
                if terminating == 0 && counts == (Some(want), Some(want), 0) && !rolling {
                    Ok(())
                } else {
                    Err(format!(
                        "{terminating} pods terminating, (pods, routable, draining) {counts:?}, \
                         progressing {rolling}"
                    ))
                }
            },
        )
        .await
    }

    /// `metadata.generation` of Deployment `name`: a new pod template is a new one.
    pub async fn generation(&self, ns: &str, name: &str) -> Outcome<Option<i64>> {
        Ok(self.deployments(ns).get(name).await?.metadata.generation)
    }

    /// Waits until endpoint `name` is `Degraded=True`; returns the reason.
    pub async fn wait_degraded(&self, ns: &str, name: &str) -> Outcome<String> {
        wait_until(
            &format!("McpEndpoint {name} Degraded"),
            self.settings.timeout,
            async || match self.condition(ns, name, "Degraded").await? {
                c if c.status == "True" => Ok(c.reason),
                c => Err(format!("Degraded={} ({})", c.status, c.reason)),
            },
        )
        .await
    }

    /// Deletes endpoint `name` and waits until it is gone (its finalizer ran).
    pub async fn delete_endpoint(&self, ns: &str, name: &str) -> Outcome {
        let endpoints = self.endpoints(ns);
        endpoints.delete(name, &DeleteParams::default()).await?;
        wait_until(
            &format!("McpEndpoint {name} gone"),
            self.settings.timeout,
            async || match endpoints.get_opt(name).await {
                Ok(None) => Ok(()),
                Ok(Some(ep)) => Err(format!("finalizers {:?}", ep.metadata.finalizers)),
                Err(e) => Err(e.to_string()),
            },
        )
        .await
    }

    /// Waits until Deployment `name` runs only pods of its newest template, all available.
    pub async fn wait_rolled(&self, ns: &str, name: &str) -> Outcome {
        let deployments = self.deployments(ns);
        wait_until(
            &format!("Deployment {name} rolled out"),
            self.settings.timeout,
            async || {
                let d = deployments.get(name).await.map_err(|e| e.to_string())?;
                let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let s = d.status.unwrap_or_default();
                let seen = s.observed_generation >= d.metadata.generation;
                let counts = [s.replicas, s.updated_replicas, s.available_replicas];
                if seen && counts.iter().all(|c| c.unwrap_or(0) == want) {
                    Ok(())
                } else {
                    Err(format!(
                        "want {want}, have (total, updated, available) {counts:?}"
                    ))
                }
            },
        )
        .await
    }

    /// Starts a rolling replacement of Deployment `name`'s pods, as `kubectl rollout restart`
    /// does: a new pod-template annotation.
    pub async fn restart(&self, ns: &str, name: &str) -> Outcome {
        let at = k8s_openapi::jiff::Timestamp::now().to_string();
        let patch = json!({"spec": {"template": {"metadata": {"annotations": {
            "kubectl.kubernetes.io/restartedAt": at}}}}});
        self.deployments(ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// The running pods of `ns` that `selector` selects (not those terminating).
    pub async fn pods(&self, ns: &str, selector: &str) -> Outcome<Vec<Pod>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let listed = pods.list(&ListParams::default().labels(selector)).await?;
        Ok(listed
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect())
    }

    /// Waits until no pod of `ns` is terminating (a rollout's old pods have stopped).
    pub async fn wait_no_terminating_pods(&self, ns: &str) -> Outcome {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        wait_until(
            "the terminating pods to stop",
            self.settings.timeout,
            async || match terminating_pods(&pods, "").await?.as_slice() {
                [] => Ok(()),
                names => Err(format!("still terminating: {names:?}")),
            },
        )
        .await
    }

    /// How many times an Event `reason` was published about endpoint `name` (an Event of a
    /// series counts its occurrences).
    pub async fn events(&self, ns: &str, name: &str, reason: &str) -> Outcome<i32> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), ns);
        let all = events.list(&ListParams::default()).await?.items;
        Ok(all
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| e.series.as_ref().map_or(1, |s| s.count))
            .sum())
    }
}

/// The names of the pods `selector` selects (all when empty) that are terminating; an API error
/// as text, for [`wait_until`].
async fn terminating_pods(pods: &Api<Pod>, selector: &str) -> Result<Vec<String>, String> {
    let listed = pods
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| e.to_string())?;
    Ok(listed
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some())
        .filter_map(|p| p.metadata.name)
        .collect())
}

/// Polls `check` every [`POLL`] until it returns `Ok`, for at most `timeout`; its `Err` says
/// what is not there yet (an API error counts as not yet) and is quoted when time runs out.
pub(crate) async fn wait_until<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Result<T, String>,
) -> Outcome<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(value) => return Ok(value),
            Err(why) => why,
        };
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}: {last}").into());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A manifest of `examples/k8s/` as JSON.
pub(crate) fn example(file: &str) -> Outcome<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/k8s")
        .join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(yaml_serde::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?)
}

/// `metadata.name` of a manifest.
fn name_of(manifest: &Value) -> Outcome<String> {
    Ok(manifest["metadata"]["name"]
        .as_str()
        .ok_or("a manifest without metadata.name")?
        .to_owned())
}

/// Merges JSON `patch` into `into` (objects key by key, anything else replaced).
fn merge(into: &mut Value, patch: Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

/// The injected sidecar among the pod template's init containers.
pub(crate) fn sidecar(d: &Deployment) -> Option<&Container> {
    d.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .init_containers
        .as_ref()?
        .iter()
        .find(|c| c.name == SIDECAR_CONTAINER)
}

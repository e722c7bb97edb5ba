//! The end-to-end test against a real cluster (docs/dev/e2e.md), run only when
//! `TETHER_E2E_KUBECONFIG` names a kubeconfig; without it the test prints why it is skipped and
//! passes.
//!
//! With a cluster it installs the CRD (server-side apply, waits for `Established`), creates a
//! fresh namespace, applies the example Deployment and the minimal `McpEndpoint` of
//! `examples/k8s/` into it, and runs the controller in-process on that namespace. It checks that
//! the sidecar is injected as a native sidecar and the endpoint turns `Ready`, then deletes the
//! endpoint and checks that its finalizer removed the injection (the sidecar and the MCP
//! server's `preStop`). The namespace is deleted at the end whatever happened; the CRD stays.
//!
//! - `TETHER_E2E_SIDECAR_IMAGE` (required): the `tether-sidecar` image the pods run.
//! - `TETHER_E2E_SERVER_IMAGE` (optional): replaces the example server's image.
//! - `TETHER_E2E_TIMEOUT_SECS` (optional, default 120): the bound of each wait.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};
use tether_crds::McpEndpoint;
use tether_operator::controller::Context;
use tether_operator::names::{INJECTED_ANNOTATION, SIDECAR_CONTAINER};
use tether_operator::plan::Defaults;
use tether_operator::watches;

/// Field manager of everything the test applies (the operator's is `tether-operator`).
const FIELD_MANAGER: &str = "tether-e2e";
/// Label on the test's namespaces, to find one left behind by an interrupted run.
const NAMESPACE_LABEL: (&str, &str) = ("app.kubernetes.io/created-by", "tether-e2e");
/// Interval between two looks at the cluster while waiting.
const POLL: Duration = Duration::from_secs(1);
/// Default bound of each wait.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Outcome<T = ()> = Result<T, BoxError>;

/// What the environment asks for.
#[derive(Debug)]
struct Settings {
    kubeconfig: PathBuf,
    sidecar_image: String,
    server_image: Option<String>,
    timeout: Duration,
}

impl Settings {
    /// The settings, `None` when `TETHER_E2E_KUBECONFIG` is unset (the test is skipped).
    fn from_env() -> Option<Result<Self, String>> {
        let kubeconfig = std::env::var_os("TETHER_E2E_KUBECONFIG").filter(|v| !v.is_empty())?;
        Some(Self::with_kubeconfig(kubeconfig.into()))
    }

    /// The settings for `kubeconfig`, the others from the environment.
    fn with_kubeconfig(kubeconfig: PathBuf) -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let sidecar_image = var("TETHER_E2E_SIDECAR_IMAGE").ok_or(
            "TETHER_E2E_KUBECONFIG is set but TETHER_E2E_SIDECAR_IMAGE is not: name the \
             tether-sidecar image the cluster can run (see docs/dev/e2e.md)",
        )?;
        let timeout = match var("TETHER_E2E_TIMEOUT_SECS") {
            None => DEFAULT_TIMEOUT,
            Some(s) => Duration::from_secs(s.parse().map_err(|e| {
                format!("TETHER_E2E_TIMEOUT_SECS={s:?} is not a number of seconds: {e}")
            })?),
        };
        Ok(Self {
            kubeconfig,
            sidecar_image,
            server_image: var("TETHER_E2E_SERVER_IMAGE"),
            timeout,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_injects_its_sidecar_turns_ready_and_its_deletion_removes_the_injection() {
    let Some(settings) = Settings::from_env() else {
        eprintln!(
            "skipped: set TETHER_E2E_KUBECONFIG=<path to a kubeconfig> to run the real-cluster \
             test (see docs/dev/e2e.md)"
        );
        return;
    };
    let settings = settings.unwrap_or_else(|e| panic!("{e}"));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "tether_operator=info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();

    let client = client(&settings.kubeconfig)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", settings.kubeconfig.display()));
    install_crd(&client, settings.timeout)
        .await
        .unwrap_or_else(|e| panic!("installing the CRD: {e}"));
    let ns = create_namespace(&client)
        .await
        .unwrap_or_else(|e| panic!("creating the test namespace: {e}"));
    eprintln!("e2e: namespace {ns}");

    // The controller, in-process, on the test namespace only, as `tether-operator run` would run
    // it with `--sidecar-image $TETHER_E2E_SIDECAR_IMAGE`.
    let ctx = Arc::new(Context::new(
        client.clone(),
        Defaults::with_image(settings.sidecar_image.clone()),
        Arc::default(),
        Some(FIELD_MANAGER.to_owned()),
    ));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let ns = ns.clone();
        async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            watches::run(ctx, Some(&ns), shutdown).await;
        }
    });

    // A panic in the scenario is caught, so that it still reaches the cleanup.
    let outcome = AssertUnwindSafe(scenario(&client, &ns, &settings))
        .catch_unwind()
        .await;
    // The controller keeps running while the namespace goes: an endpoint left behind by a
    // failure is finalized by it, and the namespace does not hang in Terminating.
    let cleaned = cleanup(&client, &ns, settings.timeout).await;
    let _ = stop.send(());
    let joined = tokio::time::timeout(settings.timeout, running).await;

    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("e2e (namespace {ns}): {e}"),
        Err(panic) => std::panic::resume_unwind(panic),
    }
    if let Err(e) = cleaned {
        panic!("cleaning up namespace {ns}: {e}");
    }
    match joined {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("the controller task failed: {e}"),
        Err(_) => panic!("the controller did not stop within {:?}", settings.timeout),
    }
}

/// The scenario in namespace `ns`: the example Deployment and minimal endpoint applied, the
/// injection and `Ready` awaited, the endpoint deleted and the injection checked gone.
async fn scenario(client: &Client, ns: &str, settings: &Settings) -> Outcome {
    let timeout = settings.timeout;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let endpoints: Api<McpEndpoint> = Api::namespaced(client.clone(), ns);
    let apply = PatchParams::apply(FIELD_MANAGER);

    let mut deployment = example("deployment.yaml")?;
    deployment["metadata"]["namespace"] = json!(ns);
    let server = deployment["spec"]["template"]["spec"]["containers"][0]["name"]
        .as_str()
        .ok_or("the example Deployment names no container")?
        .to_owned();
    if let Some(image) = &settings.server_image {
        deployment["spec"]["template"]["spec"]["containers"][0]["image"] = json!(image);
    }
    let target = name_of(&deployment)?;
    deployments
        .patch(&target, &apply, &Patch::Apply(&deployment))
        .await
        .map_err(|e| format!("applying Deployment {target}: {e}"))?;

    let mut endpoint = example("mcpendpoint-minimal.yaml")?;
    endpoint["metadata"]["namespace"] = json!(ns);
    let name = name_of(&endpoint)?;
    endpoints
        .patch(&name, &apply, &Patch::Apply(&endpoint))
        .await
        .map_err(|e| format!("applying McpEndpoint {name}: {e}"))?;
    eprintln!("e2e: applied Deployment {target} and McpEndpoint {name}");

    wait_until(
        "the sidecar injected into the pod template",
        timeout,
        async || {
            let d = deployments.get(&target).await.map_err(|e| e.to_string())?;
            let sidecar = sidecar(&d).ok_or("no sidecar init container yet")?;
            if sidecar.restart_policy.as_deref() != Some("Always") {
                return Err(format!(
                    "the sidecar's restartPolicy is {:?}, not Always (a native sidecar)",
                    sidecar.restart_policy
                ));
            }
            if sidecar.image.as_deref() != Some(settings.sidecar_image.as_str()) {
                return Err(format!("the sidecar runs image {:?}", sidecar.image));
            }
            if !has_pre_stop(&d, &server) {
                return Err(format!("no preStop on container {server:?} yet"));
            }
            Ok(())
        },
    )
    .await?;
    eprintln!("e2e: the sidecar is injected");

    wait_until("the McpEndpoint Ready=True", timeout, async || {
        let ep = endpoints.get(&name).await.map_err(|e| e.to_string())?;
        let conditions = ep.status.map(|s| s.conditions).unwrap_or_default();
        match conditions.iter().find(|c| c.type_ == "Ready") {
            Some(c) if c.status == "True" => Ok(()),
            Some(c) => Err(format!("Ready={} ({}: {})", c.status, c.reason, c.message)),
            None => Err("no Ready condition yet".to_owned()),
        }
    })
    .await?;
    eprintln!("e2e: the McpEndpoint is Ready");

    endpoints
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| format!("deleting McpEndpoint {name}: {e}"))?;
    wait_until(
        "the McpEndpoint gone (its finalizer ran)",
        timeout,
        async || match endpoints.get_opt(&name).await {
            Ok(None) => Ok(()),
            Ok(Some(ep)) => Err(format!(
                "still there, finalizers {:?}",
                ep.metadata.finalizers.unwrap_or_default()
            )),
            Err(e) => Err(e.to_string()),
        },
    )
    .await?;
    eprintln!("e2e: the McpEndpoint is gone");

    // The finalizer is released only after the injection was removed: no wait here.
    let d = deployments
        .get(&target)
        .await
        .map_err(|e| format!("reading Deployment {target}: {e}"))?;
    if sidecar(&d).is_some() {
        return Err(
            "the sidecar is still in the pod template after the endpoint's deletion".into(),
        );
    }
    if has_pre_stop(&d, &server) {
        return Err(format!(
            "container {server:?} still has the operator's preStop after the endpoint's deletion"
        )
        .into());
    }
    let template_annotations = d
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref());
    if template_annotations.is_some_and(|a| a.contains_key(INJECTED_ANNOTATION)) {
        return Err(format!("the pod template still carries {INJECTED_ANNOTATION}").into());
    }
    eprintln!("e2e: the injection is removed");
    Ok(())
}

/// A client for the current context of the kubeconfig at `path`.
async fn client(path: &Path) -> Outcome<Client> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Server-side applies the `McpEndpoint` CRD and waits until it is `Established`.
async fn install_crd(client: &Client, timeout: Duration) -> Outcome {
    let crd: CustomResourceDefinition = yaml_serde::from_str(&tether_crds::crd_yaml()?)?;
    let name = crd.metadata.name.clone().ok_or("the CRD has no name")?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await?;
    wait_until(&format!("CRD {name} Established"), timeout, async || {
        let crd = crds.get(&name).await.map_err(|e| e.to_string())?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        established
            .then_some(())
            .ok_or_else(|| "not Established yet".to_owned())
    })
    .await
}

/// Creates a namespace with a fresh name (`tether-e2e-<random>`), labelled [`NAMESPACE_LABEL`].
async fn create_namespace(client: &Client) -> Outcome<String> {
    let name = format!("tether-e2e-{:08x}", rand::random::<u32>());
    let labels = [NAMESPACE_LABEL].map(|(k, v)| (k.to_owned(), v.to_owned()));
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    Ok(name)
}

/// Deletes the namespace and waits (bounded) until no `McpEndpoint` is left in it, which the
/// running controller's finalizer ensures; one still there at the deadline loses its finalizers
/// so the namespace can go. The rest of the namespace (pods draining) goes on its own.
async fn cleanup(client: &Client, ns: &str, timeout: Duration) -> Outcome {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.delete(ns, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(format!("deleting namespace {ns}: {e}").into()),
    }
    let endpoints: Api<McpEndpoint> = Api::namespaced(client.clone(), ns);
    let finalized = wait_until("no McpEndpoint left", timeout, async || {
        let left = endpoints
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        match left.items.len() {
            0 => Ok(()),
            n => Err(format!("{n} left")),
        }
    })
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
    eprintln!("e2e: namespace {ns} deleted (it terminates once its pods are gone)");
    Ok(())
}

/// Polls `check` every [`POLL`] until it returns `Ok`, for at most `timeout`; its `Err` says
/// what is not there yet (an API error counts as not yet) and is quoted when time runs out.
async fn wait_until<T>(
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
fn example(file: &str) -> Outcome<Value> {
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

/// The injected sidecar among the pod template's init containers.
fn sidecar(d: &Deployment) -> Option<&Container> {
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

/// Whether container `name` of the pod template has a `preStop` hook.
fn has_pre_stop(d: &Deployment, name: &str) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.iter().find(|c| c.name == name))
        .and_then(|c| c.lifecycle.as_ref())
        .is_some_and(|l| l.pre_stop.is_some())
}

//! Running the controller: what it watches and which endpoint each change wakes
//! (`docs/design/operator.md`, "What wakes a reconcile").

use std::future::Future;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tether_crds::McpEndpoint;

use crate::controller::{Context, error_policy, reconcile};
use crate::names::{MANAGED_BY_LABEL, OPERATOR, injected_by};

/// Runs the controller until `shutdown` resolves, then returns once the reconciles under way
/// have finished. With `namespaces` (`--watch-namespaces`) one controller runs per namespace,
/// each watching only its namespace (the operator's rules are granted there by a Role); with
/// none, one controller watches the whole cluster.
pub async fn run(
    ctx: Arc<Context>,
    namespaces: &[String],
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let shutdown = shutdown.boxed().shared();
    if namespaces.is_empty() {
        return run_in(ctx, None, shutdown).await;
    }
    let controllers = namespaces
        .iter()
        .map(|ns| run_in(Arc::clone(&ctx), Some(ns), shutdown.clone()));
    futures::future::join_all(controllers).await;
}

/// One controller, watching `namespace` (`None`: every namespace).
async fn run_in(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let ours = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={OPERATOR}"));
    let controller = Controller::new(
        scoped::<McpEndpoint>(&client, namespace),
        watcher::Config::default(),
    );
    let endpoints = controller.store();
    controller
        .owns(scoped::<ConfigMap>(&client, namespace), ours.clone())
        .owns(scoped::<Service>(&client, namespace), ours.clone())
        .owns(scoped::<ServiceAccount>(&client, namespace), ours.clone())
        .owns(scoped::<Role>(&client, namespace), ours.clone())
        .owns(scoped::<RoleBinding>(&client, namespace), ours.clone())
        .owns(scoped::<PodDisruptionBudget>(&client, namespace), ours)
        .watches(
            scoped::<Deployment>(&client, namespace),
            watcher::Config::default(),
            move |d| endpoints_of(&d, &endpoints.state()),
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(endpoint = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile did not run"),
            }
        })
        .await;
}

/// The endpoints a change of `deployment` concerns: the one its pod template's annotation names
/// ([`injected_by`]) and those of `endpoints` in its namespace whose `targetRef` names it.
pub(crate) fn endpoints_of(
    deployment: &Deployment,
    endpoints: &[Arc<McpEndpoint>],
) -> Vec<ObjectRef<McpEndpoint>> {
    let namespace = deployment.namespace();
    let name = deployment.name_any();
    let mut found: Vec<ObjectRef<McpEndpoint>> = endpoints
        .iter()
        .filter(|ep| ep.namespace() == namespace && ep.spec.target_ref.name == name)
        .map(|ep| ObjectRef::from_obj(ep.as_ref()))
        .collect();
    if let Some(injected) = injected_by(deployment)
        && !found.contains(&injected)
    {
        found.push(injected);
    }
    found
}

/// The API of `K` in `namespace`, or in every namespace.
fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::{self, DEPLOYMENT};
    use crate::names::INJECTED_ANNOTATION;

    fn endpoint(namespace: &str, name: &str, target: &str) -> Arc<McpEndpoint> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "mcp.tether.dev/v1alpha1", "kind": "McpEndpoint",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"targetRef": {"kind": "Deployment", "name": target}},
            }))
            .unwrap(),
        )
    }

    fn names(refs: &[ObjectRef<McpEndpoint>]) -> Vec<String> {
        refs.iter()
            .map(|r| format!("{}/{}", r.namespace.as_deref().unwrap_or("-"), r.name))
            .collect()
    }

    #[test]
    fn a_deployment_wakes_the_endpoints_that_target_or_injected_it() {
        let deployment = fixtures::deployment(DEPLOYMENT);
        assert_eq!(
            (
                deployment.namespace().as_deref(),
                deployment.name_any().as_str()
            ),
            (Some("tools"), "weather")
        );
        let endpoints = [
            endpoint("tools", "weather", "weather"),
            endpoint("tools", "other", "other"),
            endpoint("elsewhere", "weather", "weather"),
        ];
        // A Deployment created after its endpoint: found by targetRef, same namespace only.
        assert_eq!(
            names(&endpoints_of(&deployment, &endpoints)),
            ["tools/weather"]
        );
        assert!(endpoints_of(&deployment, &[]).is_empty());
        // An injected one also wakes the endpoint its annotation names, once.
        let injected = fixtures::deployment_with(|d| {
            d["spec"]["template"]["metadata"]["annotations"] =
                json!({INJECTED_ANNOTATION: "weather"});
        });
        assert_eq!(
            names(&endpoints_of(&injected, &endpoints)),
            ["tools/weather"]
        );
        assert_eq!(names(&endpoints_of(&injected, &[])), ["tools/weather"]);
    }
}

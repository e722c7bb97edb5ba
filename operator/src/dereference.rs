//! Reading what a reconcile acts on, each object once and before anything is written: the
//! target Deployment, then [`Live`], the endpoint's children and what decides their retirement
//! (`docs/design/operator.md`).

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, ListParams};
use kube::{Client, Resource};

use crate::error::Error;
use crate::names::{INJECTED_ANNOTATION, Names};
use crate::validate::{Target, render_selector};

/// The live objects one reconcile of a valid target acts on, as read before it writes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Live {
    /// The config ConfigMap.
    pub config_map: Option<ConfigMap>,
    /// The HMAC Secret the pods mount, when it exists (metadata only: its key is never read, nor
    /// rewritten) — the endpoint's Secret of the name before it carried the UID
    /// ([`Names::legacy_secret`]) while the endpoint controls one, else the one named
    /// [`Names::secret`], whoever controls it.
    pub secret: Option<ObjectMeta>,
    /// The client Service, then the headless peer Service.
    pub services: [Option<Service>; 2],
    /// The sidecar's dedicated ServiceAccount, whoever owns it.
    pub service_account: Option<ServiceAccount>,
    /// Whether a pod of the target still runs as the dedicated ServiceAccount. Listed only when
    /// the answer can matter — the endpoint controls that ServiceAccount and the pod template
    /// names one of the user's — and `false` otherwise.
    pub pods_run_as_ours: bool,
    /// The sidecar's Role.
    pub role: Option<Role>,
    /// The sidecar's RoleBinding.
    pub role_binding: Option<RoleBinding>,
    /// Every PodDisruptionBudget of the namespace (does one of the user's select the pods?).
    pub budgets: Vec<PodDisruptionBudget>,
    /// Our PodDisruptionBudget, whoever owns it.
    pub pdb: Option<PodDisruptionBudget>,
}

/// The Deployment `name` of the endpoint's namespace, if it exists.
///
/// # Errors
/// [`Error::Kube`] when the request fails.
pub(crate) async fn target(
    client: &Client,
    names: &Names,
    name: &str,
) -> Result<Option<Deployment>, Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &names.namespace);
    Ok(deployments.get_opt(name).await?)
}

/// The live children of the endpoint whose controller owner reference is `owner`, on its valid
/// `target`.
///
/// # Errors
/// [`Error::Kube`] when a request fails.
pub(crate) async fn children(
    client: &Client,
    names: &Names,
    owner: &OwnerReference,
    target: &Target<'_>,
) -> Result<Live, Error> {
    let ns = &names.namespace;
    let config_map = get(&Api::namespaced(client.clone(), ns), &names.config()).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let legacy = secrets
        .get_metadata_opt(&names.legacy_secret())
        .await?
        .map(|s| s.metadata)
        .filter(|meta| meta_controlled_by(meta, owner));
    let secret = match legacy {
        Some(meta) => Some(meta),
        None => secrets
            .get_metadata_opt(&names.secret())
            .await?
            .map(|s| s.metadata),
    };
    let services = [
        get(
            &Api::namespaced(client.clone(), ns),
            &names.client_service(),
        )
        .await?,
        get(&Api::namespaced(client.clone(), ns), &names.peer_service()).await?,
    ];
    let service_account: Option<ServiceAccount> =
        get(&Api::namespaced(client.clone(), ns), &names.sidecar_rbac()).await?;
    let retiring = service_account
        .as_ref()
        .is_some_and(|ours| controlled_by(ours, owner))
        && target.users_service_account(names).is_some();
    let pods_run_as_ours =
        retiring && runs_as(client, ns, &target.selector, &names.sidecar_rbac()).await?;
    let role = get(&Api::namespaced(client.clone(), ns), &names.sidecar_rbac()).await?;
    let role_binding = get(&Api::namespaced(client.clone(), ns), &names.sidecar_rbac()).await?;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let all = budgets.list(&ListParams::default()).await?.items;
    Ok(Live {
        config_map,
        secret,
        services,
        service_account,
        pods_run_as_ours,
        role,
        role_binding,
        pdb: get(&budgets, &names.pdb()).await?,
        budgets: all,
    })
}

/// Whether `owner` (the endpoint) is the controller owner of `live`: only such children are
/// ever deleted.
pub(crate) fn controlled_by<K: Resource>(live: &K, owner: &OwnerReference) -> bool {
    meta_controlled_by(live.meta(), owner)
}

/// Whether `owner` is the controller owner of the object with metadata `meta`.
pub(crate) fn meta_controlled_by(meta: &ObjectMeta, owner: &OwnerReference) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| r.uid == owner.uid && r.controller == Some(true))
}

impl Live {
    /// The name of the HMAC Secret the pods mount: the existing one, else a new one's.
    pub(crate) fn secret_name(&self, names: &Names) -> String {
        self.secret
            .as_ref()
            .and_then(|meta| meta.name.clone())
            .unwrap_or_else(|| names.secret())
    }
}

/// The `K` named `name`, if it exists.
async fn get<K>(api: &Api<K>, name: &str) -> Result<Option<K>, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api.get_opt(name).await?)
}

/// How many pods still run the endpoint's sidecar: pods labelled with [`INJECTED_ANNOTATION`]
/// naming it, and, while the target exists, the target's pods whose annotation names it (pods
/// started before the label was set).
///
/// # Errors
/// [`Error::Kube`] when a request fails.
pub(crate) async fn injected_pods(
    client: &Client,
    names: &Names,
    target: Option<&Deployment>,
) -> Result<usize, Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &names.namespace);
    let label = format!("{INJECTED_ANNOTATION}={}", names.endpoint);
    let mut injected: BTreeSet<String> = pods
        .list_metadata(&ListParams::default().labels(&label))
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let selector = target
        .and_then(|d| d.spec.as_ref())
        .map(|spec| render_selector(&spec.selector));
    if let Some(selector) = selector.filter(|s| !s.is_empty()) {
        let listed = pods.list_metadata(&ListParams::default().labels(&selector)).await?;
        injected.extend(listed.items.into_iter().filter_map(|p| {
            let annotation = p.metadata.annotations.as_ref()?.get(INJECTED_ANNOTATION)?;
            (*annotation == names.endpoint).then_some(p.metadata.name?)
        }));
    }
    Ok(injected.len())
}

/// Whether a pod matching `selector` runs as ServiceAccount `account`.
async fn runs_as(
    client: &Client,
    namespace: &str,
    selector: &str,
    account: &str,
) -> Result<bool, Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let listed = pods.list(&ListParams::default().labels(selector)).await?;
    Ok(listed.items.iter().any(|pod| {
        pod.spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref())
            == Some(account)
    }))
}

//! Reading what a reconcile acts on, each object once and before anything is written: the
//! target Deployment, then [`Live`], the endpoint's children and what decides their retirement
//! (`docs/design/operator.md`). [`children`] reads through [`Reads`]: the API server, or a
//! [`Snapshot`] of manifests for `tether-operator plan`, so both decide alike.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::api::{Api, ListParams};
use kube::core::{Selector, SelectorExt};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::names::{INJECTED_ANNOTATION, Names};
use crate::validate::{Target, render_selector};

/// The live objects one reconcile of a valid target acts on, as read before it writes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Live {
    /// The config ConfigMap.
    pub config_map: Option<ConfigMap>,
    /// The HMAC Secret the pods mount, when it exists (metadata only: its key is never needed,
    /// it is never rewritten) — the endpoint's Secret of the name before it carried the UID
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
/// `target`, as `reads` answers: the API server in a reconcile, a [`Snapshot`] in a preview.
///
/// # Errors
/// [`Error::Kube`] when a request fails.
pub(crate) async fn children(
    reads: &impl Reads,
    names: &Names,
    owner: &OwnerReference,
    target: &Target<'_>,
) -> Result<Live, Error> {
    let ns = &names.namespace;
    let config_map = reads.get(ns, &names.config()).await?;
    let metadata = |s: Secret| s.metadata;
    let legacy = reads
        .get::<Secret>(ns, &names.legacy_secret())
        .await?
        .map(metadata)
        .filter(|meta| meta_controlled_by(meta, owner));
    let secret = match legacy {
        Some(meta) => Some(meta),
        None => reads
            .get::<Secret>(ns, &names.secret())
            .await?
            .map(metadata),
    };
    let services = [
        reads.get(ns, &names.client_service()).await?,
        reads.get(ns, &names.peer_service()).await?,
    ];
    let service_account: Option<ServiceAccount> = reads.get(ns, &names.sidecar_rbac()).await?;
    let retiring = service_account
        .as_ref()
        .is_some_and(|ours| controlled_by(ours, owner))
        && target.users_service_account(names).is_some();
    let pods_run_as_ours = retiring && runs_as(reads, ns, target, &names.sidecar_rbac()).await?;
    Ok(Live {
        config_map,
        secret,
        services,
        service_account,
        pods_run_as_ours,
        role: reads.get(ns, &names.sidecar_rbac()).await?,
        role_binding: reads.get(ns, &names.sidecar_rbac()).await?,
        budgets: reads.list(ns, None).await?,
        pdb: reads.get(ns, &names.pdb()).await?,
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
        let listed = pods
            .list_metadata(&ListParams::default().labels(&selector))
            .await?;
        injected.extend(listed.items.into_iter().filter_map(|p| {
            let annotation = p.metadata.annotations.as_ref()?.get(INJECTED_ANNOTATION)?;
            (*annotation == names.endpoint).then_some(p.metadata.name?)
        }));
    }
    Ok(injected.len())
}

/// Whether a pod of `target` runs as ServiceAccount `account`.
async fn runs_as(
    reads: &impl Reads,
    namespace: &str,
    target: &Target<'_>,
    account: &str,
) -> Result<bool, Error> {
    let selector = target.deployment.spec.as_ref().map(|s| &s.selector);
    let pods: Vec<Pod> = reads.list(namespace, selector).await?;
    Ok(pods.iter().any(|pod| {
        pod.spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref())
            == Some(account)
    }))
}

/// A namespaced object [`Reads`] reads.
pub(crate) trait Child:
    Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug
{
}

impl<K> Child for K where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
{
}

/// Where [`children`] reads the live objects: the API server ([`Client`]) or a [`Snapshot`].
pub(crate) trait Reads {
    /// The `K` named `name` of `namespace`, if it exists.
    async fn get<K: Child>(&self, namespace: &str, name: &str) -> Result<Option<K>, Error>;

    /// Every `K` of `namespace`, only those `selector` selects when one is given.
    async fn list<K: Child>(
        &self,
        namespace: &str,
        selector: Option<&LabelSelector>,
    ) -> Result<Vec<K>, Error>;
}

impl Reads for Client {
    async fn get<K: Child>(&self, namespace: &str, name: &str) -> Result<Option<K>, Error> {
        Ok(Api::namespaced(self.clone(), namespace)
            .get_opt(name)
            .await?)
    }

    async fn list<K: Child>(
        &self,
        namespace: &str,
        selector: Option<&LabelSelector>,
    ) -> Result<Vec<K>, Error> {
        let mut params = ListParams::default();
        if let Some(selector) = selector {
            params = params.labels(&render_selector(selector));
        }
        let api: Api<K> = Api::namespaced(self.clone(), namespace);
        Ok(api.list(&params).await?.items)
    }
}

/// Live objects given as manifests instead of read from the API server (`tether-operator plan
/// --live`), answered as the API server would: by `apiVersion`, `kind`, namespace and name, or
/// listed by label selector. A manifest without a namespace is in the one asked for.
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    objects: Vec<serde_json::Value>,
}

impl Snapshot {
    /// The snapshot of `objects` (JSON of Kubernetes objects).
    pub(crate) fn new(objects: Vec<serde_json::Value>) -> Self {
        Self { objects }
    }

    /// The objects of kind `K` in `namespace`.
    fn of_kind<K: Child>(&self, namespace: &str) -> Result<Vec<K>, Error> {
        let wanted = |o: &&serde_json::Value| {
            o["apiVersion"] == K::api_version(&()).as_ref()
                && o["kind"] == K::kind(&()).as_ref()
                && o["metadata"]["namespace"]
                    .as_str()
                    .is_none_or(|n| n == namespace)
        };
        let typed = self
            .objects
            .iter()
            .filter(wanted)
            .map(|o| K::deserialize(o));
        Ok(typed.collect::<Result<_, _>>()?)
    }
}

impl Reads for Snapshot {
    async fn get<K: Child>(&self, namespace: &str, name: &str) -> Result<Option<K>, Error> {
        let mut found = self.of_kind::<K>(namespace)?;
        Ok(found
            .iter()
            .position(|k| k.meta().name.as_deref() == Some(name))
            .map(|at| found.swap_remove(at)))
    }

    async fn list<K: Child>(
        &self,
        namespace: &str,
        selector: Option<&LabelSelector>,
    ) -> Result<Vec<K>, Error> {
        let all = self.of_kind::<K>(namespace)?;
        let Some(selector) = selector else {
            return Ok(all);
        };
        // As the API server, which refuses a selector that does not parse, this selects nothing.
        let Ok(selector) = Selector::try_from(selector.clone()) else {
            return Ok(Vec::new());
        };
        let none = BTreeMap::new();
        Ok(all
            .into_iter()
            .filter(|k| selector.matches(k.meta().labels.as_ref().unwrap_or(&none)))
            .collect())
    }
}

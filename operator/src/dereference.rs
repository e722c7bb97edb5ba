//! Reading what a reconcile acts on, each object once and before anything is written: the
//! target Deployment, then [`Live`], the endpoint's children and what decides their retirement
//! (`docs/design/operator.md`). [`children`] reads through [`Reads`]: the API server, or a
//! [`Snapshot`] of manifests for `tether-operator plan`, so both decide alike.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::api::{Api, ListParams};
use kube::core::{Selector, SelectorExt};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::admission;
use crate::error::Error;
use crate::names::{INJECTED_ANNOTATION, Names};
use crate::validate::{Target, render_selector};

/// The live objects one reconcile of a valid target acts on, as read before it writes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Live {
    /// The config ConfigMap.
    pub config_map: Option<ConfigMap>,
    /// The key-ring Secret ([`Names::secret`]), whoever controls it, with its data.
    pub key_ring: Found,
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
    /// The target's pods, listed only when the key ring's decision waits for their reports
    /// (`crate::keys::waits_on_pods`).
    pub key_pods: Option<Vec<Pod>>,
    /// Every PodDisruptionBudget of the namespace (does one of the user's select the pods?).
    pub budgets: Vec<PodDisruptionBudget>,
    /// Our PodDisruptionBudget, whoever owns it.
    pub pdb: Option<PodDisruptionBudget>,
}

/// What the reconcile found of the endpoint's key ring.
#[derive(Clone, Debug, Default)]
pub(crate) enum Found {
    /// The key-ring Secret, controlled by the endpoint.
    Ring(Box<Secret>),
    /// A Secret of the key ring's name that the endpoint does not control.
    NotOwned(Box<Secret>),
    /// No key-ring Secret.
    #[default]
    Missing,
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
/// The target's pods are listed when `key_pods` says the key ring found needs their reports, or
/// when they decide the retirement of the dedicated ServiceAccount; once either way.
///
/// # Errors
/// [`Error::Kube`] when a request fails.
pub(crate) async fn children(
    reads: &impl Reads,
    names: &Names,
    owner: &OwnerReference,
    target: &Target<'_>,
    key_pods: impl FnOnce(&Found) -> bool,
) -> Result<Live, Error> {
    let ns = &names.namespace;
    let config_map = reads.get(ns, &names.config()).await?;
    let key_ring = key_ring(reads, names, owner).await?;
    let services = [
        reads.get(ns, &names.client_service()).await?,
        reads.get(ns, &names.peer_service()).await?,
    ];
    let service_account: Option<ServiceAccount> = reads.get(ns, &names.sidecar_rbac()).await?;
    let retiring = service_account
        .as_ref()
        .is_some_and(|ours| controlled_by(ours, owner))
        && target.users_service_account(names).is_some();
    let reports_needed = key_pods(&key_ring);
    let role: Option<Role> = reads.get(ns, &names.sidecar_rbac()).await?;
    let pods: Vec<Pod> = if retiring || reports_needed {
        let selector = target.deployment.spec.as_ref().map(|s| &s.selector);
        reads.list(ns, selector).await?
    } else {
        Vec::new()
    };
    let pods_run_as_ours = retiring && runs_as(&pods, &names.sidecar_rbac());
    Ok(Live {
        config_map,
        key_ring,
        services,
        service_account,
        pods_run_as_ours,
        key_pods: reports_needed.then_some(pods),
        role,
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

/// The key-ring Secret of the endpoint `names` (controller owner reference `owner`): ours, a
/// Secret of its name someone else controls, or missing. Only the Secret of that name is read.
async fn key_ring(
    reads: &impl Reads,
    names: &Names,
    owner: &OwnerReference,
) -> Result<Found, Error> {
    let Some(secret) = reads
        .get::<Secret>(&names.namespace, &names.secret())
        .await?
    else {
        return Ok(Found::Missing);
    };
    let secret = Box::new(secret);
    Ok(if controlled_by(secret.as_ref(), owner) {
        Found::Ring(secret)
    } else {
        Found::NotOwned(secret)
    })
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

/// Whether one of `pods` runs as ServiceAccount `account`.
fn runs_as(pods: &[Pod], account: &str) -> bool {
    pods.iter().any(|pod| {
        pod.spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref())
            == Some(account)
    })
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

    /// The labels of `namespace` (`None`: no such Namespace).
    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<Option<BTreeMap<String, String>>, Error>;
}

/// The labels of the target's namespace when the admission check needs them (`None` without
/// a read when `deployment` opts in by its own label, [`admission::deployment_opts_in`]).
///
/// # Errors
/// [`Error`] on an API failure.
pub(crate) async fn namespace_labels(
    reads: &impl Reads,
    names: &Names,
    deployment: &Deployment,
) -> Result<Option<BTreeMap<String, String>>, Error> {
    if admission::deployment_opts_in(deployment, names) {
        return Ok(None);
    }
    reads.namespace_labels(&names.namespace).await
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

    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<Option<BTreeMap<String, String>>, Error> {
        let found = Api::<Namespace>::all(self.clone())
            .get_opt(namespace)
            .await?;
        Ok(found.map(|n| n.metadata.labels.unwrap_or_default()))
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

    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<Option<BTreeMap<String, String>>, Error> {
        let found = self.objects.iter().find(|o| {
            o["apiVersion"] == "v1"
                && o["kind"] == "Namespace"
                && o["metadata"]["name"] == namespace
        });
        Ok(found
            .map(|o| serde_json::from_value::<Namespace>(o.clone()))
            .transpose()?
            .map(|n| n.metadata.labels.unwrap_or_default()))
    }
}

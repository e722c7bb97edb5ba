//! The reconcile of one `McpEndpoint`: dereference → admit and validate → plan → apply → status under a
//! finalizer (`mcp.tether.dev/injection`), with the key ring's step (`crate::keys`), Events and
//! the error policy (`docs/design/operator.md`). The decisions are `plan::target` and
//! `plan::decide`, which `tether-operator plan` runs too; here is the I/O around them: the
//! reads from the API server, the pods' key reports, the writes, the status and the Events.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::finalizer::{self, Event};
use kube::{Client, Resource, ResourceExt};
use tether_crds::McpEndpoint;
use tether_crds::spec::KeyRingStatus;

use crate::admission::Policy;
use crate::apply::{self, Written};
use crate::dereference;
use crate::error::Error;
use crate::events::Events;
use crate::fields;
use crate::keys::{self, Asks};
use crate::names::{FINALIZER, Names, OPERATOR};
use crate::plan::{self, Defaults, Rotation};
use crate::reports::{self, HttpReports, KeyReports};
use crate::status::{self, Outcome, PodCounts};
use crate::validate::Target;

/// How often an endpoint is looked at again without any change (pods becoming ready, a
/// conflict the user resolved; a target created later wakes it at once, [`crate::watches`]).
pub const RECHECK: Duration = Duration::from_secs(30);
/// Wait before looking again at a deleted endpoint whose pods still run its sidecar.
pub(crate) const WAIT_RECHECK: Duration = Duration::from_secs(5);
/// Wait before retrying a reconcile that failed on an API error.
pub(crate) const ERROR_BACKOFF: Duration = Duration::from_secs(15);
/// Wait before looking again at an endpoint whose key rotation is under way or waits to start:
/// each step waits for the pods' reports of the step before.
pub const KEY_RECHECK: Duration = Duration::from_secs(10);

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub(crate) client: Client,
    /// Defaults for what specs leave out.
    pub(crate) defaults: Defaults,
    /// Reconciles by result, duration, failures.
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// Publishes Events on endpoints (`events.k8s.io/v1`).
    pub(crate) events: Events,
    /// Asks the sidecars what they loaded of the key ring.
    pub(crate) reports: Arc<dyn KeyReports>,
    /// What endpoints may ask for (`--allowed-sidecar-images`).
    pub(crate) policy: Policy,
}

impl Context {
    /// A context for `client`; Events name `instance` (this replica) as their reporter.
    pub fn new(
        client: Client,
        defaults: Defaults,
        metrics: Arc<crate::metrics::Metrics>,
        instance: Option<String>,
    ) -> Self {
        let reporter = Reporter {
            controller: OPERATOR.to_owned(),
            instance,
        };
        Self {
            events: Events::new(client.clone(), reporter),
            client,
            policy: Policy::for_default_image(&defaults.sidecar_image),
            defaults,
            metrics,
            reports: Arc::new(HttpReports::default()),
        }
    }

    /// This context, allowing what `policy` allows (default: the repository of the default
    /// sidecar image, [`Policy::for_default_image`]).
    #[must_use]
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// This context, asking the sidecars' key reports through `reports` instead of HTTP (tests
    /// answer for pods that do not exist).
    #[must_use]
    pub fn with_reports(mut self, reports: Arc<dyn KeyReports>) -> Self {
        self.reports = reports;
        self
    }

    /// Publishes an Event on `ep` (`reason` PascalCase); a failure is logged, never fatal.
    async fn event(&self, ep: &McpEndpoint, type_: EventType, reason: &str, note: String) {
        let regarding = ep.object_ref(&());
        if let Err(error) = self.events.publish(&regarding, type_, reason, &note).await {
            tracing::warn!(%error, reason, "cannot publish an Event");
        }
    }
}

/// Reconciles `ep` (kube-runtime `Controller` callback).
///
/// # Errors
/// [`Error`] on an API failure; the controller retries after the error policy's delay.
pub async fn reconcile(ep: Arc<McpEndpoint>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = run_finalizer(ep, &ctx).await;
    let outcome = match &result {
        Err(e) if !e.is_wait() => Err(e.metric_label()),
        _ => Ok(()),
    };
    ctx.metrics.observe(outcome, started.elapsed());
    result
}

async fn run_finalizer(ep: Arc<McpEndpoint>, ctx: &Context) -> Result<Action, Error> {
    let namespace = ep.namespace().ok_or(Error::Unnamed)?;
    let api: Api<McpEndpoint> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(ep) = unless_stale(&api, ep).await? else {
        return Ok(Action::await_change());
    };
    finalizer::finalizer(&api, FINALIZER, ep, |event| async {
        match event {
            Event::Apply(ep) => converge(&ep, ctx).await,
            Event::Cleanup(ep) => cleanup(&ep, ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// `ep`, or the API server's copy where the controller's cache may be behind this operator's
/// own last write: when `ep` lacks the finalizer (a reconcile woken by another object's change
/// can run before the watch event of the finalizer just added arrives, and adding it again would
/// fail its guard with 422), and when `ep` is being deleted (the finalizer may be released
/// already, the endpoint gone: removing it again would fail with 404). `None`: the endpoint is
/// gone. A read costs no write, and happens only in these two states.
async fn unless_stale(
    api: &Api<McpEndpoint>,
    ep: Arc<McpEndpoint>,
) -> Result<Option<Arc<McpEndpoint>>, Error> {
    let deleting = ep.meta().deletion_timestamp.is_some();
    if !deleting && ep.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Some(ep));
    }
    Ok(api.get_opt(&ep.name_any()).await?.map(Arc::new))
}

/// Backs off after a failed reconcile (never a hot loop); looks again soon after a wait.
pub(crate) fn error_policy(_ep: Arc<McpEndpoint>, error: &Error, _ctx: Arc<Context>) -> Action {
    if error.is_wait() {
        tracing::info!(%error, "waiting");
        return Action::requeue(WAIT_RECHECK);
    }
    tracing::warn!(%error, reason = error.metric_label(), "reconcile failed; retrying");
    Action::requeue(ERROR_BACKOFF)
}

/// The pipeline for a live endpoint: dereference → validate → plan → apply → status.
async fn converge(ep: &McpEndpoint, ctx: &Context) -> Result<Action, Error> {
    let names = Names::of(ep).ok_or(Error::Unnamed)?;
    let target_name = &ep.spec.target_ref.name;
    let injected = match dereference::target(&ctx.client, &names, target_name).await? {
        None => Injected::kept(ep, Outcome::TargetNotFound(target_name.clone())),
        Some(deployment) => {
            let labels = dereference::namespace_labels(&ctx.client, &names, &deployment).await?;
            match plan::target(ep, &names, &deployment, labels.as_ref(), &ctx.policy) {
                Err(conflict) => Injected::kept(ep, Outcome::Conflict(conflict)),
                Ok(target) => inject(ep, &names, &target, ctx).await?,
            }
        }
    };
    let Injected {
        outcome,
        keys,
        soon,
    } = injected;
    let next = Action::requeue(if soon { KEY_RECHECK } else { RECHECK });
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    if status::update(ep, &outcome, keys.clone(), &now).is_none() {
        return Ok(next);
    }
    // The controller's cache may not hold yet the status this operator wrote a moment ago (a
    // reconcile woken by a Deployment's change runs before the endpoint's own watch event):
    // decide again on the API server's copy, so the same status is never written twice. A copy
    // of another generation is a spec this reconcile did not see: its own reconcile follows.
    let endpoints: Api<McpEndpoint> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let live = endpoints
        .get_opt(&names.endpoint)
        .await?
        .filter(|live| live.metadata.generation == ep.metadata.generation);
    if let Some(update) = live.and_then(|live| status::update(&live, &outcome, keys, &now)) {
        apply::status(&endpoints, &names, &update.status).await?;
        if let Some(degraded) = update.degraded {
            ctx.event(ep, EventType::Warning, &degraded.reason, degraded.message)
                .await;
        }
    }
    Ok(next)
}

/// What [`inject`] did: the outcome, the key ring's status, whether to look again soon.
struct Injected {
    /// The target's pods, or the conflict that stopped the reconcile.
    outcome: Outcome,
    /// `status.keys` to write.
    keys: Option<KeyRingStatus>,
    /// A key rotation is under way or waits: look again after [`KEY_RECHECK`].
    soon: bool,
}

impl Injected {
    /// `outcome`, before the key ring's decision: `ep`'s `status.keys` kept, not soon.
    fn kept(ep: &McpEndpoint, outcome: Outcome) -> Self {
        Self {
            outcome,
            keys: ep.status.as_ref().and_then(|s| s.keys.clone()),
            soon: false,
        }
    }
}

/// Brings the children of `ep` on its valid `target` to the plan and takes the key ring's
/// step; returns the target's pods, or the conflict that stopped it (the key ring's Secret
/// missing or not the endpoint's, a child's name taken, a field of the Deployment another
/// manager manages).
async fn inject(
    ep: &McpEndpoint,
    names: &Names,
    target: &Target<'_>,
    ctx: &Context,
) -> Result<Injected, Error> {
    let owner = ep.controller_owner_ref(&()).ok_or(Error::Unnamed)?;
    let before = ep.status.as_ref().and_then(|s| s.keys.as_ref());
    let waits = |found: &_| keys::waits_on_pods(found, &Asks::of(ep), before);
    let live = dereference::children(&ctx.client, names, &owner, target, waits).await?;
    let reports = match &live.key_pods {
        Some(pods) => Some(reports::gather(ctx.reports.as_ref(), pods, ep.spec.admin.port).await),
        None => None,
    };
    let rotation = Rotation::Take(reports.as_deref());
    let decided = plan::decide(ep, names, &owner, &ctx.defaults, target, &live, rotation)?;
    let decision = match decided {
        Ok(decision) => decision,
        Err(conflict) => return Ok(Injected::kept(ep, Outcome::Conflict(conflict))),
    };
    let written = apply::steps(&ctx.client, names, &decision.steps).await?;
    if !written.objects.is_empty() {
        let note = applied_note(&written);
        ctx.event(ep, EventType::Normal, "Applied", note).await;
    }
    if let Some((reason, note)) = decision.event {
        ctx.metrics.key_step(reason);
        ctx.event(ep, EventType::Normal, reason, note).await;
    }
    let outcome = match written.refused {
        Some(conflict) => Outcome::Conflict(conflict),
        None => Outcome::Applied(PodCounts::of(target.deployment, written.rolled)),
    };
    Ok(Injected {
        outcome,
        keys: decision.keys,
        soon: decision.soon,
    })
}

/// The note of the `Applied` Event: what was written and what happens next.
fn applied_note(written: &Written) -> String {
    let list = written.objects.join(", ");
    if written.rolled {
        format!("applied {list}; the pod template changed, so the pods are replaced")
    } else if written.objects.iter().any(|w| w.starts_with("ConfigMap/")) {
        format!("applied {list}; running sidecars reload the configuration without a restart")
    } else {
        format!("applied {list}")
    }
}

/// Removes the injection from the target, then holds the finalizer until no pod runs the
/// endpoint's sidecar: the children those pods use while they drain (the sidecar's Role and
/// ServiceAccount, the ConfigMap) go with the owner reference, only once the endpoint is gone.
async fn cleanup(ep: &McpEndpoint, ctx: &Context) -> Result<Action, Error> {
    let names = Names::of(ep).ok_or(Error::Unnamed)?;
    let target_name = &ep.spec.target_ref.name;
    let target = dereference::target(&ctx.client, &names, target_name).await?;
    let manager = names.field_manager();
    let applied = |d: &Deployment| fields::applies(&d.metadata, &manager);
    if target.as_ref().is_some_and(applied) {
        let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &names.namespace);
        apply::release(&deployments, &names.namespace, target_name, &manager).await?;
        let note = format!("removed the sidecar from Deployment {target_name:?}; its pods roll");
        ctx.event(ep, EventType::Normal, "InjectionRemoved", note)
            .await;
    }
    let pods = dereference::injected_pods(&ctx.client, &names, target.as_ref()).await?;
    if pods > 0 {
        return Err(Error::PodsStillInjected(pods));
    }
    Ok(Action::await_change())
}

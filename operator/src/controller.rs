//! The reconcile of one `McpEndpoint`: validate → build → apply → status (the pure steps are
//! [`crate::validate`], [`crate::plan`] and [`crate::status`]; this module talks to the API
//! server).
//!
//! - A finalizer ([`FINALIZER`]) is added first; on deletion the injection is removed (a
//!   server-side apply of an empty Deployment body with our field manager drops exactly the
//!   fields we own; the children go with their owner reference) before it is released.
//! - The children are written by [`children::write`]: each read first and applied
//!   (server-side apply, field manager [`FIELD_MANAGER`], forced: the operator owns these fields)
//!   only when the live object lacks something, so a reconcile with nothing to change writes
//!   nothing; the HMAC Secret is created when missing and never written again.
//! - The status is written only when it changed.
//! - A conflict or a missing target is no error: `Degraded` says why and the endpoint is looked
//!   at again after [`RECHECK`]. API errors go to [`error_policy`], which backs off.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{self, Event};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tether_crds::{McpEndpoint, McpEndpointStatus};

use crate::children::{self, apply_params};
use crate::error::Error;
use crate::names::{FIELD_MANAGER, FINALIZER, Names};
use crate::plan::{Defaults, plan};
use crate::status::{Outcome, PodCounts, conditions};
use crate::validate::validate;

/// How often an endpoint is looked at again without any change (pods becoming ready, a
/// conflict the user resolved; a target created later wakes it at once, [`crate::watches`]).
pub const RECHECK: Duration = Duration::from_secs(30);
/// Wait before retrying a reconcile that failed on an API error.
pub const ERROR_BACKOFF: Duration = Duration::from_secs(15);

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Defaults for what specs leave out.
    pub defaults: Defaults,
    /// Reconciles by result, duration, failures.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Publishes Events on endpoints (`events.k8s.io/v1`).
    pub recorder: Recorder,
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
            controller: FIELD_MANAGER.to_owned(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            defaults,
            metrics,
        }
    }

    /// Publishes an Event on `ep` (`reason` PascalCase); a failure is logged, never fatal.
    async fn event(&self, ep: &McpEndpoint, type_: EventType, reason: &str, note: String) {
        let event = KubeEvent {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Reconcile".to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &ep.object_ref(&())).await {
            tracing::warn!(%error, reason, "cannot publish an Event");
        }
    }
}

/// Reconciles `ep` (kube-runtime `Controller` callback).
///
/// # Errors
/// [`Error`] on an API failure; the controller retries after [`error_policy`]'s delay.
pub async fn reconcile(ep: Arc<McpEndpoint>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = run_finalizer(ep, &ctx).await;
    let outcome = result.as_ref().map(|_| ()).map_err(Error::metric_label);
    ctx.metrics.observe(outcome, started.elapsed());
    result
}

async fn run_finalizer(ep: Arc<McpEndpoint>, ctx: &Context) -> Result<Action, Error> {
    let namespace = ep.namespace().ok_or(Error::Unnamed)?;
    let api: Api<McpEndpoint> = Api::namespaced(ctx.client.clone(), &namespace);
    finalizer::finalizer(&api, FINALIZER, ep, |event| async {
        match event {
            Event::Apply(ep) => apply(&ep, ctx).await,
            Event::Cleanup(ep) => cleanup(&ep, ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Backs off after a failed reconcile (never a hot loop).
pub fn error_policy(_ep: Arc<McpEndpoint>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, reason = error.metric_label(), "reconcile failed; retrying");
    Action::requeue(ERROR_BACKOFF)
}

async fn apply(ep: &McpEndpoint, ctx: &Context) -> Result<Action, Error> {
    let names = Names::of(ep).ok_or(Error::Unnamed)?;
    let client = &ctx.client;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &names.namespace);
    let target_name = &ep.spec.target_ref.name;
    let outcome = match deployments.get_opt(target_name).await? {
        None => Outcome::TargetNotFound(target_name.clone()),
        Some(deployment) => match validate(ep, &names, &deployment) {
            Err(conflict) => Outcome::Conflict(conflict),
            Ok(target) => {
                let owner = ep.controller_owner_ref(&()).ok_or(Error::Unnamed)?;
                let plan = plan(ep, &names, &target, &ctx.defaults, &owner);
                let (written, rolled) =
                    children::write(client, &names, &owner, &target, &plan).await?;
                if !written.is_empty() {
                    ctx.event(
                        ep,
                        EventType::Normal,
                        "Applied",
                        children::applied_note(&written, rolled),
                    )
                    .await;
                }
                Outcome::Applied(pod_counts(&deployment, rolled))
            }
        },
    };
    if let Some(degraded) = write_status(ep, &names, &outcome, client).await? {
        ctx.event(ep, EventType::Warning, &degraded.reason, degraded.message)
            .await;
    }
    Ok(Action::requeue(RECHECK))
}

/// Pod counts from the Deployment's status. While the Deployment controller has not seen the
/// newest template (`observedGeneration` behind `generation`, or the template was just changed)
/// no pod is current yet.
fn pod_counts(deployment: &Deployment, rolled: bool) -> PodCounts {
    let status = deployment.status.clone().unwrap_or_default();
    let behind = status.observed_generation < deployment.metadata.generation;
    PodCounts {
        total: status.replicas.unwrap_or(0),
        updated: if rolled || behind {
            0
        } else {
            status.updated_replicas.unwrap_or(0)
        },
        ready: status.ready_replicas.unwrap_or(0),
        draining: status.terminating_replicas.unwrap_or(0),
    }
}

/// Writes the status for `outcome` when it differs from the stored one; returns the `Degraded`
/// condition when it turned `True` (an Event repeats its reason and message).
async fn write_status(
    ep: &McpEndpoint,
    names: &Names,
    outcome: &Outcome,
    client: &Client,
) -> Result<Option<Condition>, Error> {
    let previous = ep.status.clone().unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let counts = match outcome {
        Outcome::Applied(p) => Some(*p),
        _ => None,
    };
    let status = McpEndpointStatus {
        observed_generation: ep.metadata.generation,
        conditions: conditions(outcome, ep.metadata.generation, &previous.conditions, &now),
        pods: counts.map(|p| p.total),
        routable: counts.map(|p| p.ready),
        draining: counts.map(|p| p.draining),
    };
    let degraded = |s: &McpEndpointStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
            .cloned()
    };
    let degraded_now = degraded(&status).filter(|_| degraded(&previous).is_none());
    if status == previous {
        return Ok(None);
    }
    let api: Api<McpEndpoint> = Api::namespaced(client.clone(), &names.namespace);
    let body = json!({
        "apiVersion": tether_crds::API_VERSION,
        "kind": tether_crds::KIND,
        "status": status,
    });
    api.patch_status(&names.endpoint, &apply_params(), &Patch::Apply(&body))
        .await?;
    Ok(degraded_now)
}

/// Removes the injection from the target (its owned children go with the owner reference).
async fn cleanup(ep: &McpEndpoint, ctx: &Context) -> Result<Action, Error> {
    let names = Names::of(ep).ok_or(Error::Unnamed)?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let target = &ep.spec.target_ref.name;
    if deployments.get_opt(target).await?.is_some() {
        let empty: Value = json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": target, "namespace": names.namespace},
        });
        deployments
            .patch(target, &apply_params(), &Patch::Apply(&empty))
            .await?;
        let note = format!("removed the sidecar from Deployment {target:?}; its pods roll");
        ctx.event(ep, EventType::Normal, "InjectionRemoved", note)
            .await;
    }
    Ok(Action::await_change())
}

//! The decision of one reconcile, pure, and the same for the controller (`crate::controller`)
//! and for `tether-operator plan` (`crate::preview`), so the preview cannot drift from what a
//! reconcile does. Each caller only reads before it and writes (or prints) after it, in two
//! turns, as the live children are read on the validated target:
//!
//! 1. [`target`]: admit the endpoint's target Deployment and validate the endpoint on it;
//! 2. the caller reads the live children on that target (the controller, besides, asks the pods
//!    for the key reports a rotation step waits for; the preview asks none: [`Rotation`]);
//! 3. [`decide`]: the key ring's decision (`crate::keys::decide`), the plan, the steps against
//!    the live children, and the check that none of them is taken.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use tether_crds::McpEndpoint;
use tether_crds::keyring::GenerateError;
use tether_crds::spec::KeyRingStatus;

use super::steps::Steps;
use super::{Defaults, keys::step, plan};
use crate::admission::{Policy, admit};
use crate::dereference::{Found, Live};
use crate::keys::{self, Asks};
use crate::names::Names;
use crate::reports::PodReport;
use crate::validate::{Conflict, Target, validate};

/// Which step of the key ring [`decide`] may take.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rotation<'r> {
    /// Whatever step the ring is due (the controller): the pods' reports when a step waits for
    /// them, `None` when they were not asked (then no step that waits for them is taken).
    Take(Option<&'r [PodReport]>),
    /// None on a ring that exists, which is left as it is (the preview, which asks no pod: a
    /// rotation is not previewed); a missing ring is still created, a foreign one a conflict.
    Skip,
}

/// What one reconcile writes, with the key ring's status and Event.
#[derive(Clone, Debug)]
pub(crate) struct Decision<'a> {
    /// Every write and deletion, in the order they are sent.
    pub(crate) steps: Steps<'a>,
    /// `status.keys` after the key ring's step.
    pub(crate) keys: Option<KeyRingStatus>,
    /// The Event of the key ring's step: `(reason, note)`.
    pub(crate) event: Option<(&'static str, String)>,
    /// Whether to look again soon: a rotation is under way or waits.
    pub(crate) soon: bool,
}

/// The target of `ep` (its Deployment `deployment`, in a namespace labelled `namespace_labels`
/// when they were read), admitted by `policy` and validated; or the conflict that stops the
/// reconcile before any child is read.
///
/// # Errors
/// The admission's conflict (`TargetNotOptedIn`, `ImageNotAllowed`), else the validation's.
pub(crate) fn target<'d>(
    ep: &McpEndpoint,
    names: &Names,
    deployment: &'d Deployment,
    namespace_labels: Option<&BTreeMap<String, String>>,
    policy: &Policy,
) -> Result<Target<'d>, Conflict> {
    admit(ep, names, deployment, namespace_labels, policy)?;
    validate(ep, names, deployment)
}

/// What one reconcile of `ep` (controller owner reference `owner`) on its valid `target` writes
/// against the `live` children, with the key ring's step as `rotation` allows: `Ok(Ok(_))` the
/// decision, `Ok(Err(_))` the conflict that writes nothing (the key ring's: `SecretNotOwned`,
/// `SecretMissing`, `SecretInvalid`; a child's name taken: `NameTaken`).
///
/// # Errors
/// [`GenerateError`] when a new key ring's certificates cannot be made (not expected).
pub(crate) fn decide<'a>(
    ep: &McpEndpoint,
    names: &Names,
    owner: &OwnerReference,
    defaults: &Defaults,
    target: &Target<'a>,
    live: &'a Live,
    rotation: Rotation<'_>,
) -> Result<Result<Decision<'a>, Conflict>, GenerateError> {
    let before = ep.status.as_ref().and_then(|s| s.keys.as_ref());
    let secret = names.secret();
    let key_ring = match (rotation, &live.key_ring) {
        (Rotation::Skip, Found::Ring(_)) => keys::Decision::leave(before),
        (rotation, found) => {
            let reports = match rotation {
                Rotation::Take(reports) => reports,
                Rotation::Skip => None,
            };
            let label = format!("{}/{}", names.namespace, names.endpoint);
            keys::decide(found, &Asks::of(ep), before, reports, &secret, &label)?
        }
    };
    if let Some(conflict) = key_ring.conflict {
        return Ok(Err(conflict));
    }
    let key_step = step(names, owner, &live.key_ring, &key_ring.write);
    let steps = plan(ep, names, target, defaults, owner, &secret)
        .steps(names, owner, target, live, key_step);
    if let Err(conflict) = steps.check_taken(owner) {
        return Ok(Err(conflict));
    }
    Ok(Ok(Decision {
        steps,
        keys: key_ring.status,
        event: key_ring.event,
        soon: key_ring.soon,
    }))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use serde_json::json;
    use tether_crds::keyring::Generation;

    use super::*;
    use crate::fixtures::{self, DEPLOYMENT, MINIMAL_ENDPOINT};
    use crate::keys::ROTATE_ANNOTATION;
    use crate::plan::keys::{KeyStep, secret};

    /// The live children of a case, for the endpoint `names` (controller `owner`).
    type LiveOf = fn(&Names, &OwnerReference) -> Live;

    fn nothing(_: &Names, _: &OwnerReference) -> Live {
        Live::default()
    }

    /// The endpoint's own key ring, stable.
    fn a_ring(names: &Names, owner: &OwnerReference) -> Live {
        let generation = Generation::new("tools/weather").expect("a generation");
        Live {
            key_ring: Found::Ring(Box::new(secret(names, owner, &generation))),
            ..Live::default()
        }
    }

    /// The endpoint's Secret holding no key ring.
    fn a_refused_ring(names: &Names, owner: &OwnerReference) -> Live {
        let mut ring = secret(names, owner, &Generation::new("tools/weather").unwrap());
        ring.data = None;
        Live {
            key_ring: Found::Ring(Box::new(ring)),
            ..Live::default()
        }
    }

    /// A Secret of the ring's name that someone else created.
    fn a_foreign_secret(names: &Names, _: &OwnerReference) -> Live {
        let foreign: Secret =
            serde_json::from_value(json!({"metadata": {"name": names.secret()}})).unwrap();
        Live {
            key_ring: Found::NotOwned(Box::new(foreign)),
            ..Live::default()
        }
    }

    /// A ConfigMap of the config's name that someone else created.
    fn a_taken_config_map(names: &Names, _: &OwnerReference) -> Live {
        let theirs: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": names.config()}})).unwrap();
        Live {
            config_map: Some(theirs),
            ..Live::default()
        }
    }

    /// The decision on `deployment` and `live` with `rotation`, in words: the conflict's
    /// reason, or the key ring's step and its Event.
    fn decided(
        rotate: bool,
        deployment: &Deployment,
        live: LiveOf,
        rotation: Rotation<'_>,
    ) -> String {
        let mut ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        if rotate {
            ep.metadata.annotations = Some([(ROTATE_ANNOTATION.to_owned(), "r1".into())].into());
        }
        let names = fixtures::names(&ep);
        let owner = fixtures::owner(&ep);
        let defaults = Defaults::with_image("tether-sidecar:test");
        let policy = Policy::for_default_image(&defaults.sidecar_image);
        let target = match target(&ep, &names, deployment, None, &policy) {
            Ok(target) => target,
            Err(conflict) => return conflict.reason.to_owned(),
        };
        let live = live(&names, &owner);
        let decision = decide(&ep, &names, &owner, &defaults, &target, &live, rotation);
        match decision.expect("certificates") {
            Err(conflict) => conflict.reason.to_owned(),
            Ok(d) => {
                let step = match d.steps.key_ring {
                    KeyStep::Leave => "leave",
                    KeyStep::Create(_) => "create",
                    KeyStep::Patch { .. } => "patch",
                };
                let ring = d.keys.map_or("no status", |_| "status");
                match d.event {
                    Some((reason, _)) => format!("{step}, {ring}, {reason}"),
                    None => format!("{step}, {ring}"),
                }
            }
        }
    }

    #[test]
    fn the_controller_and_the_preview_decide_alike_but_the_preview_takes_no_rotation_step() {
        let ours = fixtures::deployment(DEPLOYMENT);
        let clash = fixtures::deployment_with(|d| {
            d["spec"]["template"]["spec"]["containers"][0]["ports"] =
                json!([{"containerPort": 3000}, {"containerPort": 8080}]);
        });
        let unlabelled = fixtures::deployment_with(|d| d["metadata"]["labels"] = json!({}));
        let controller = Rotation::Take(None);
        let preview = Rotation::Skip;
        #[rustfmt::skip]
        let cases: [(&str, bool, &Deployment, LiveOf, Rotation<'_>, &str); 12] = [
            ("a port the sidecar uses", false, &clash, nothing, controller, "PortConflict"),
            ("the same in the preview", false, &clash, nothing, preview, "PortConflict"),
            ("a target not opted in", false, &unlabelled, nothing, controller, "TargetNotOptedIn"),
            ("a child's name taken", false, &ours, a_taken_config_map, controller, "NameTaken"),
            ("the same in the preview", false, &ours, a_taken_config_map, preview, "NameTaken"),
            ("a new endpoint's key ring", false, &ours, nothing, controller, "create, status"),
            ("the same in the preview", false, &ours, nothing, preview, "create, status"),
            ("a foreign Secret of the ring's name", false, &ours, a_foreign_secret, preview, "SecretNotOwned"),
            ("a rotation asked: staged", true, &ours, a_ring, controller, "patch, status, KeyStaged"),
            ("a rotation asked, no reports: not previewed", true, &ours, a_ring, preview, "leave, no status"),
            ("a ring a sidecar refuses", false, &ours, a_refused_ring, controller, "SecretInvalid"),
            ("the same in the preview: left alone", false, &ours, a_refused_ring, preview, "leave, no status"),
        ];
        for (case, rotate, deployment, live, rotation, expected) in cases {
            assert_eq!(
                decided(rotate, deployment, live, rotation),
                expected,
                "{case}"
            );
        }
    }
}

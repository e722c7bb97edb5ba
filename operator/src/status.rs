//! The status step of the reconcile: the `Ready`, `Progressing` and `Degraded` conditions and
//! the pod counts from what the reconcile saw, and whether they changed
//! (`docs/design/operator.md`, "Status").

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tether_crds::spec::{KeyPhase, KeyRingStatus};
use tether_crds::{McpEndpoint, McpEndpointStatus};

use crate::validate::Conflict;

/// The target's pods as the reconcile counted them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PodCounts {
    /// Pods of the target Deployment.
    pub(crate) total: i32,
    /// Pods of the current pod template (`updatedReplicas`).
    pub(crate) updated: i32,
    /// Pods whose sidecar is ready (they take new sessions).
    pub(crate) ready: i32,
    /// Pods being deleted (their sidecars hand sessions off).
    pub(crate) draining: i32,
}

impl PodCounts {
    /// The counts in `deployment`'s status. While the Deployment controller has not seen the
    /// newest template (`observedGeneration` behind `generation`, or the reconcile just changed
    /// it: `rolled`) no pod is current yet.
    pub(crate) fn of(deployment: &Deployment, rolled: bool) -> Self {
        let status = deployment.status.clone().unwrap_or_default();
        let behind = status.observed_generation < deployment.metadata.generation;
        Self {
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
}

/// What one reconcile found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Everything applied; `pods` of the target.
    Applied(PodCounts),
    /// The target Deployment does not exist.
    TargetNotFound(String),
    /// A [`Conflict`] stopped the reconcile before it wrote anything.
    Conflict(Conflict),
}

/// The conditions for `outcome` at `generation`, `rotation` the message of a key rotation under
/// way, keeping the `lastTransitionTime` of `previous` conditions whose status is unchanged;
/// `now` stamps the others.
pub(crate) fn conditions(
    outcome: &Outcome,
    rotation: Option<&str>,
    generation: Option<i64>,
    previous: &[Condition],
    now: &Time,
) -> Vec<Condition> {
    let (ready, progressing, degraded) = judge(outcome, rotation);
    [
        ("Ready", ready),
        ("Progressing", progressing),
        ("Degraded", degraded),
    ]
    .into_iter()
    .map(|(type_, (status, reason, message))| {
        let status = if status { "True" } else { "False" };
        let kept = previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.last_transition_time.clone());
        Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: generation,
            last_transition_time: kept.unwrap_or_else(|| now.clone()),
        }
    })
    .collect()
}

/// A status to write.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Update {
    /// The new status.
    pub(crate) status: McpEndpointStatus,
    /// The `Degraded` condition, when it just turned `True` (an Event repeats its reason and
    /// message).
    pub(crate) degraded: Option<Condition>,
}

/// The status `outcome` and the key ring's `keys` give `ep` at `now`; `None` when it equals
/// the stored one (nothing to write).
pub(crate) fn update(
    ep: &McpEndpoint,
    outcome: &Outcome,
    keys: Option<KeyRingStatus>,
    now: &Time,
) -> Option<Update> {
    let previous = ep.status.clone().unwrap_or_default();
    let generation = ep.metadata.generation;
    let counts = match outcome {
        Outcome::Applied(p) => Some(*p),
        _ => None,
    };
    let rotation = keys
        .as_ref()
        .filter(|k| k.phase.is_some_and(|p| p != KeyPhase::Stable))
        .map(|k| {
            k.message
                .as_deref()
                .unwrap_or("a key rotation is under way")
        });
    let status = McpEndpointStatus {
        observed_generation: generation,
        conditions: conditions(outcome, rotation, generation, &previous.conditions, now),
        pods: counts.map(|p| p.total),
        routable: counts.map(|p| p.ready),
        draining: counts.map(|p| p.draining),
        keys,
    };
    if status == previous {
        return None;
    }
    let degraded = |s: &McpEndpointStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
            .cloned()
    };
    Some(Update {
        degraded: degraded(&status).filter(|_| degraded(&previous).is_none()),
        status,
    })
}

type Judgement = (bool, &'static str, String);

fn judge(outcome: &Outcome, rotation: Option<&str>) -> (Judgement, Judgement, Judgement) {
    let complete = (
        false,
        "Complete",
        "no rollout under way (origins, protocol versions, buffer and idle timeout reach running sidecars without one)".to_owned(),
    );
    let fine = (
        false,
        "AsExpected",
        "the sidecar is injected as the spec asks".to_owned(),
    );
    match outcome {
        Outcome::Conflict(c) => (
            (false, c.reason, c.message.clone()),
            complete,
            (true, c.reason, c.message.clone()),
        ),
        Outcome::TargetNotFound(name) => {
            let message = format!("Deployment {name:?} not found in the endpoint's namespace");
            (
                (false, "TargetNotFound", message.clone()),
                complete,
                (true, "TargetNotFound", message),
            )
        }
        Outcome::Applied(p) => {
            let rolling = p.updated < p.total;
            let ready = if p.total == 0 {
                (false, "NoPods", "the target has no pods".to_owned())
            } else if rolling {
                (
                    false,
                    "RollingOut",
                    format!("{} of {} pods run the current sidecar", p.updated, p.total),
                )
            } else if p.ready < p.total {
                (
                    false,
                    "PodsNotReady",
                    format!("{} of {} sidecars ready", p.ready, p.total),
                )
            } else {
                (true, "AllPodsReady", format!("{} pods ready", p.total))
            };
            let progressing = if rolling {
                (
                    true,
                    "RollingOut",
                    format!(
                        "{} of {} pods run the current pod template; the others are being replaced (changes to ports, paths, upstream, migration, drain or the sidecar need new pods)",
                        p.updated, p.total
                    ),
                )
            } else if let Some(rotation) = rotation {
                (true, "KeyRotation", rotation.to_owned())
            } else {
                complete
            };
            (ready, progressing, fine)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn pods(total: i32, updated: i32, ready: i32, draining: i32) -> Outcome {
        Outcome::Applied(PodCounts {
            total,
            updated,
            ready,
            draining,
        })
    }

    fn get<'a>(cs: &'a [Condition], t: &str) -> &'a Condition {
        cs.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn a_rollout_then_ready_moves_the_transition_times_only_on_flips() {
        let rolling = pods(3, 1, 3, 1);
        let first = conditions(&rolling, None, Some(2), &[], &at(100));
        assert_eq!(get(&first, "Ready").status, "False");
        assert_eq!(get(&first, "Ready").reason, "RollingOut");
        assert_eq!(get(&first, "Progressing").status, "True");
        assert_eq!(get(&first, "Degraded").status, "False");
        assert!(first.iter().all(|c| c.observed_generation == Some(2)));
        // Still rolling: statuses unchanged, times kept, messages updated.
        let later = pods(3, 2, 3, 1);
        let second = conditions(&later, None, Some(2), &first, &at(200));
        assert!(second.iter().all(|c| c.last_transition_time == at(100)));
        assert!(get(&second, "Progressing").message.starts_with("2 of 3"));
        // Done: Ready and Progressing flip (new time), Degraded keeps its time.
        let done = pods(3, 3, 3, 0);
        let third = conditions(&done, None, Some(2), &second, &at(300));
        assert_eq!(
            (
                get(&third, "Ready").status.as_str(),
                get(&third, "Ready").last_transition_time.clone()
            ),
            ("True", at(300))
        );
        assert_eq!(get(&third, "Progressing").reason, "Complete");
        assert_eq!(get(&third, "Progressing").last_transition_time, at(300));
        assert_eq!(get(&third, "Degraded").last_transition_time, at(100));
    }

    #[test]
    fn conflicts_and_a_missing_target_are_degraded_with_their_reason() {
        let conflict = Outcome::Conflict(Conflict {
            reason: "PreStopConflict",
            message: "container \"server\" already has a preStop hook".into(),
        });
        let cs = conditions(&conflict, None, Some(1), &[], &at(1));
        assert_eq!(
            (
                get(&cs, "Degraded").status.as_str(),
                get(&cs, "Degraded").reason.as_str()
            ),
            ("True", "PreStopConflict")
        );
        assert_eq!(get(&cs, "Ready").status, "False");
        let missing = conditions(
            &Outcome::TargetNotFound("weather".into()),
            None,
            Some(1),
            &[],
            &at(1),
        );
        assert_eq!(get(&missing, "Degraded").reason, "TargetNotFound");
        assert!(get(&missing, "Degraded").message.contains("\"weather\""));
        let none = Outcome::Applied(PodCounts::default());
        assert_eq!(
            get(&conditions(&none, None, None, &[], &at(1)), "Ready").reason,
            "NoPods"
        );
        let unready = pods(2, 2, 1, 0);
        assert_eq!(
            get(&conditions(&unready, None, None, &[], &at(1)), "Ready").reason,
            "PodsNotReady"
        );
    }

    #[test]
    fn a_key_rotation_under_way_is_progressing_until_it_is_retired() {
        let done = pods(3, 3, 3, 0);
        let rotating = conditions(&done, Some("stage: waiting"), Some(1), &[], &at(1));
        let progressing = get(&rotating, "Progressing");
        assert_eq!(
            (progressing.status.as_str(), progressing.reason.as_str()),
            ("True", "KeyRotation")
        );
        assert_eq!(progressing.message, "stage: waiting");
        assert_eq!(get(&rotating, "Ready").status, "True", "still serving");
        // A rollout says so first.
        let rolling = conditions(&pods(3, 1, 3, 1), Some("x"), Some(1), &[], &at(1));
        assert_eq!(get(&rolling, "Progressing").reason, "RollingOut");
    }
}

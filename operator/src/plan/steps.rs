//! The [`Plan`] set against the [`Live`] objects: every write and deletion of one reconcile, in
//! the order they are sent, with the retirements of our PodDisruptionBudget and of our dedicated
//! ServiceAccount (`docs/design/operator.md`, "Plan").

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use super::keys::KeyStep;
use super::network::covering_pdb;
use super::{Plan, rbac};
use crate::dereference::{Live, controlled_by, meta_controlled_by};
use crate::diff::covers;
use crate::names::Names;
use crate::validate::{Conflict, Target, controller_of};

/// A child to server-side apply unless its live object already holds every field of `desired`.
#[derive(Clone, Debug)]
pub(crate) struct Ensure<'a, K, B = K> {
    /// The apply body: only the fields the operator owns.
    pub desired: B,
    /// The object as read, if it exists.
    pub live: Option<&'a K>,
}

impl<K: serde::Serialize, B> Ensure<'_, K, B> {
    /// Whether the live object already holds every field of `body` (the JSON of `desired`):
    /// then nothing is sent ([`covers`]).
    ///
    /// # Errors
    /// When the live object does not serialize (not expected).
    pub(crate) fn covered(&self, body: &serde_json::Value) -> Result<bool, serde_json::Error> {
        match self.live {
            Some(live) => Ok(covers(&serde_json::to_value(live)?, body)),
            None => Ok(false),
        }
    }
}

/// A live child to delete: the endpoint is its controller owner (the only way to build one).
#[derive(Clone, Debug)]
pub(crate) struct Retire<'a, K> {
    live: &'a K,
    reason: String,
}

impl<'a, K: Resource> Retire<'a, K> {
    /// `live`, when it exists and `owner` (the endpoint) controls it; `None` otherwise (someone
    /// else's object is never deleted).
    fn owned(live: Option<&'a K>, owner: &OwnerReference, reason: String) -> Option<Self> {
        live.filter(|l| controlled_by(*l, owner))
            .map(|live| Self { live, reason })
    }

    /// The object as read (deleted only while its UID is unchanged).
    pub(crate) fn live(&self) -> &'a K {
        self.live
    }

    /// Why the plan no longer wants it.
    pub(crate) fn reason(&self) -> &str {
        &self.reason
    }
}

/// What a reconcile does with a child the plan may retire.
#[derive(Clone, Debug)]
pub(crate) enum Step<'a, K> {
    /// Keep it as the plan wants it.
    Ensure(Ensure<'a, K>),
    /// Delete ours.
    Retire(Retire<'a, K>),
    /// Nothing: none of ours exists, or ours stays as it is for now.
    Leave,
}

/// Every write and deletion of one reconcile, in the order they are sent (the injection last:
/// the pods roll only once everything they mount and use exists).
#[derive(Clone, Debug)]
pub(crate) struct Steps<'a> {
    /// The config ConfigMap.
    pub config_map: Ensure<'a, ConfigMap>,
    /// The key-ring Secret: created, or patched by a rotation step (`crate::keys::decide`).
    pub key_ring: KeyStep,
    /// The client Service, then the headless peer Service.
    pub services: [Ensure<'a, Service>; 2],
    /// The sidecar's dedicated ServiceAccount.
    pub service_account: Step<'a, ServiceAccount>,
    /// The sidecar's Role.
    pub role: Ensure<'a, Role>,
    /// The sidecar's RoleBinding (to our retiring ServiceAccount too, while a pod runs with it).
    pub role_binding: Ensure<'a, RoleBinding>,
    /// Our PodDisruptionBudget.
    pub pdb: Step<'a, PodDisruptionBudget>,
    /// The sidecar injection, on the target Deployment.
    pub injection: Ensure<'a, Deployment, serde_json::Value>,
    /// Seconds of `terminationGracePeriodSeconds` the drain needs.
    pub grace_needed: i64,
}

impl Steps<'_> {
    /// Checks that every live child these steps would write is the endpoint's: an object of a
    /// child's name that someone else created, or that another owner controls, is never taken
    /// over (nor garbage-collected with the endpoint). The key-ring Secret is checked before,
    /// with a reason of its own (`SecretNotOwned`, `crate::keys::decide`).
    ///
    /// # Errors
    /// A `NameTaken` [`Conflict`] naming the first such object.
    pub(crate) fn check_taken(&self, owner: &OwnerReference) -> Result<(), Conflict> {
        let [client, peers] = &self.services;
        let mut written: Vec<(&str, Option<&ObjectMeta>)> = vec![
            ("ConfigMap", self.config_map.live.map(|o| &o.metadata)),
            ("Service", client.live.map(|o| &o.metadata)),
            ("Service", peers.live.map(|o| &o.metadata)),
            ("Role", self.role.live.map(|o| &o.metadata)),
            ("RoleBinding", self.role_binding.live.map(|o| &o.metadata)),
        ];
        if let Step::Ensure(e) = &self.service_account {
            written.push(("ServiceAccount", e.live.map(|o| &o.metadata)));
        }
        if let Step::Ensure(e) = &self.pdb {
            written.push(("PodDisruptionBudget", e.live.map(|o| &o.metadata)));
        }
        let foreign = written
            .into_iter()
            .filter_map(|(kind, meta)| meta.map(|m| (kind, m)))
            .find(|(_, meta)| !meta_controlled_by(meta, owner));
        let Some((kind, meta)) = foreign else {
            return Ok(());
        };
        let name = meta.name.as_deref().unwrap_or_default();
        let holder = controller_of(meta);
        Err(Conflict::new(
            "NameTaken",
            format!(
                "{kind}/{name} exists and is not this endpoint's ({holder}); tether never takes over an object it did not create: delete or rename it, or give the McpEndpoint another name"
            ),
        ))
    }
}

impl Plan {
    /// The steps that bring `live` to this plan for the endpoint `names` (controller owner
    /// reference `owner`) on its valid `target`; `key_ring` is what the key ring's decision
    /// writes to its Secret.
    pub(crate) fn steps<'a>(
        self,
        names: &Names,
        owner: &OwnerReference,
        target: &Target<'a>,
        live: &'a Live,
        key_ring: KeyStep,
    ) -> Steps<'a> {
        let Plan {
            injection,
            config_map,
            services: [client, peers],
            service_account,
            role,
            mut role_binding,
            pdb,
            grace_needed,
        } = self;
        let [live_client, live_peers] = &live.services;
        let service_account = match (service_account, target.users_service_account(names)) {
            (Some(desired), _) => Step::Ensure(Ensure {
                desired,
                live: live.service_account.as_ref(),
            }),
            (None, _) if live.pods_run_as_ours => {
                rbac::also_bind(&mut role_binding, &names.sidecar_rbac());
                Step::Leave
            }
            (None, theirs) => {
                let reason = format!(
                    "no pod runs with it; the pods name ServiceAccount {:?}",
                    theirs.unwrap_or_default()
                );
                Retire::owned(live.service_account.as_ref(), owner, reason)
                    .map_or(Step::Leave, Step::Retire)
            }
        };
        let pdb = match covering_pdb(&live.budgets, names, target) {
            None => Step::Ensure(Ensure {
                desired: pdb,
                live: live.pdb.as_ref(),
            }),
            Some(theirs) => {
                let reason = format!("the user's PodDisruptionBudget {theirs:?} covers the pods");
                Retire::owned(live.pdb.as_ref(), owner, reason).map_or(Step::Leave, Step::Retire)
            }
        };
        Steps {
            config_map: Ensure {
                desired: config_map,
                live: live.config_map.as_ref(),
            },
            key_ring,
            services: [
                Ensure {
                    desired: client,
                    live: live_client.as_ref(),
                },
                Ensure {
                    desired: peers,
                    live: live_peers.as_ref(),
                },
            ],
            service_account,
            role: Ensure {
                desired: role,
                live: live.role.as_ref(),
            },
            role_binding: Ensure {
                desired: role_binding,
                live: live.role_binding.as_ref(),
            },
            pdb,
            injection: Ensure {
                desired: injection,
                live: Some(target.deployment),
            },
            grace_needed,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tether_crds::McpEndpoint;

    use super::*;
    use crate::fixtures::{self, DEPLOYMENT, MINIMAL_ENDPOINT};
    use crate::plan::{Defaults, plan};
    use crate::validate::validate;

    /// The steps for `ep` on `deployment` against `live`, writing nothing to the key ring.
    fn steps_for<'a>(ep: &McpEndpoint, deployment: &'a Deployment, live: &'a Live) -> Steps<'a> {
        let names = fixtures::names(ep);
        let owner = fixtures::owner(ep);
        let target = validate(ep, &names, deployment).expect("a valid target");
        let defaults = Defaults::with_image("tether-sidecar:test");
        plan(ep, &names, &target, &defaults, &owner, &names.secret()).steps(
            &names,
            &owner,
            &target,
            live,
            KeyStep::Leave,
        )
    }

    /// A live object named `name`, controlled by `owner_uid`'s endpoint.
    fn owned_by<K: serde::de::DeserializeOwned>(name: &str, owner_uid: &str) -> K {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "tools", "uid": format!("uid-{name}"),
                         "ownerReferences": [{"apiVersion": "mcp.tether.dev/v1alpha1",
                             "kind": "McpEndpoint", "name": "weather", "uid": owner_uid,
                             "controller": true}]},
        }))
        .unwrap()
    }

    fn subjects(steps: &Steps<'_>) -> Vec<String> {
        let binding = &steps.role_binding.desired;
        binding
            .subjects
            .iter()
            .flatten()
            .map(|s| s.name.clone())
            .collect()
    }

    #[test]
    fn the_injection_goes_to_the_target_and_a_foreign_child_is_name_taken() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let deployment = fixtures::deployment(DEPLOYMENT);
        let missing = Live::default();
        let steps = steps_for(&ep, &deployment, &missing);
        assert!(std::ptr::eq(steps.injection.live.unwrap(), &deployment));
        assert!(steps.config_map.live.is_none());
        assert_eq!(steps.check_taken(&fixtures::owner(&ep)), Ok(()));
        let theirs = Live {
            config_map: Some(owned_by("weather-tether", "someone-else")),
            ..Live::default()
        };
        let taken = steps_for(&ep, &deployment, &theirs)
            .check_taken(&fixtures::owner(&ep))
            .unwrap_err();
        assert_eq!(taken.reason, "NameTaken");
        assert!(
            taken.message.starts_with("ConfigMap/weather-tether exists")
                && taken.message.contains("(uid someone-else) controls it"),
            "{}",
            taken.message
        );
    }

    #[test]
    fn a_users_budget_retires_ours_only_when_the_endpoint_controls_it() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let uid = ep.metadata.uid.clone().unwrap();
        let deployment = fixtures::deployment(DEPLOYMENT);
        let theirs: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": "weather-budget"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "weather"}}},
        }))
        .unwrap();
        let ours: PodDisruptionBudget = owned_by("weather-tether", &uid);
        let live = |budgets: Vec<PodDisruptionBudget>, pdb: Option<PodDisruptionBudget>| Live {
            budgets,
            pdb,
            ..Live::default()
        };
        let alone = live(vec![ours.clone()], Some(ours.clone()));
        assert!(matches!(
            steps_for(&ep, &deployment, &alone).pdb,
            Step::Ensure(Ensure { live: Some(_), .. })
        ));
        let covered = live(vec![ours.clone(), theirs.clone()], Some(ours.clone()));
        match steps_for(&ep, &deployment, &covered).pdb {
            Step::Retire(r) => {
                assert_eq!(r.live().metadata.uid.as_deref(), Some("uid-weather-tether"));
                assert!(r.reason().contains("\"weather-budget\""), "{}", r.reason());
            }
            other => panic!("ours is retired, not {other:?}"),
        }
        let foreign: PodDisruptionBudget = owned_by("weather-tether", "someone-else");
        let not_ours = live(vec![theirs.clone()], Some(foreign));
        assert!(matches!(
            steps_for(&ep, &deployment, &not_ours).pdb,
            Step::Leave
        ));
        let gone = live(vec![theirs], None);
        assert!(matches!(
            steps_for(&ep, &deployment, &gone).pdb,
            Step::Leave
        ));
    }

    #[test]
    fn our_service_account_stays_bound_while_a_pod_runs_with_it_then_retires() {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let uid = ep.metadata.uid.clone().unwrap();
        let users = fixtures::deployment_with(|d| {
            d["spec"]["template"]["spec"]["serviceAccountName"] = json!("app-sa");
        });
        let ours: ServiceAccount = owned_by("weather-tether-sidecar", &uid);
        let running = Live {
            service_account: Some(ours.clone()),
            pods_run_as_ours: true,
            ..Live::default()
        };
        let steps = steps_for(&ep, &users, &running);
        assert!(matches!(steps.service_account, Step::Leave));
        assert_eq!(subjects(&steps), ["app-sa", "weather-tether-sidecar"]);
        let idle = Live {
            service_account: Some(ours.clone()),
            ..Live::default()
        };
        let steps = steps_for(&ep, &users, &idle);
        assert!(
            matches!(&steps.service_account, Step::Retire(r) if r.reason().contains("\"app-sa\"")),
            "{:?}",
            steps.service_account
        );
        assert_eq!(subjects(&steps), ["app-sa"]);
        let foreign = Live {
            service_account: Some(owned_by("weather-tether-sidecar", "someone-else")),
            ..Live::default()
        };
        let steps = steps_for(&ep, &users, &foreign);
        assert!(matches!(steps.service_account, Step::Leave));
        assert_eq!(subjects(&steps), ["app-sa"]);
        // Pods naming none get ours, whatever is live.
        let plain = fixtures::deployment(DEPLOYMENT);
        let steps = steps_for(&ep, &plain, &idle);
        assert!(matches!(
            steps.service_account,
            Step::Ensure(Ensure { live: Some(_), .. })
        ));
        assert_eq!(subjects(&steps), ["weather-tether-sidecar"]);
    }
}

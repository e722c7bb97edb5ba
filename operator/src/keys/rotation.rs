//! What one reconcile does with the key ring ([`decide`]): at most one write of the Secret, the
//! `status.keys` it leaves, the Event of the step taken, and whether to look again soon. The
//! order of the rules:
//!
//! 1. A Secret of the ring's name that the endpoint does not control: `SecretNotOwned`.
//! 2. No ring: create one, unless `status.keys.secret` says it existed, which is
//!    `SecretMissing` until a new `mcp.tether.dev/new-key` value asks for a new key.
//! 3. A ring a sidecar would refuse: `SecretInvalid`.
//! 4. Stable: a new `mcp.tether.dev/rotate-key` value stages a new key.
//! 5. Staged: promote once every pod reports the staged key as `next`.
//! 6. Promoted: a new `mcp.tether.dev/retire-previous-key` value retires the previous key at
//!    once; otherwise retire once every pod signs with the current key and reports no session
//!    minted with the previous one.
//!
//! Values present when the ring is created count as handled: only a change asks again.

use tether_crds::keyring::{GenerateError, Generation, KeyReport};
use tether_crds::spec::{KeyPhase, KeyRingStatus};

use super::ring::{Ids, Ring};
use super::{Asks, NEW_KEY_ANNOTATION, RETIRE_ANNOTATION, ROTATE_ANNOTATION, ROTATION_ANNOTATION};
use crate::dereference::Found;
use crate::reports::PodReport;
use crate::validate::{Conflict, controller_of};

/// Pods named in a message about those a step waits for; the others are counted.
const NAMED_PODS: usize = 3;

/// What to write to the key-ring Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// Nothing.
    Leave,
    /// Create the Secret with this ring; `rotation` is its [`ROTATION_ANNOTATION`].
    Create {
        /// The new ring.
        ring: Ring,
        /// The rotation value the ring counts as handled.
        rotation: Option<String>,
    },
    /// Change the live Secret's data to this ring and its [`ROTATION_ANNOTATION`] to `rotation`.
    Update {
        /// The ring after the step.
        ring: Ring,
        /// The rotation value the ring holds after the step.
        rotation: Option<String>,
    },
}

/// What one reconcile does with the key ring.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Decision {
    /// The write of the Secret.
    pub(crate) write: Write,
    /// Why nothing may be written (the endpoint is `Degraded` with its reason).
    pub(crate) conflict: Option<Conflict>,
    /// `status.keys` after the write.
    pub(crate) status: Option<KeyRingStatus>,
    /// The Event of the step taken: `(reason, note)`.
    pub(crate) event: Option<(&'static str, String)>,
    /// Whether to look again soon: a rotation is under way or waits.
    pub(crate) soon: bool,
}

impl Decision {
    /// Nothing written, the status `before` kept, no step taken: the ring is left as it is.
    pub(crate) fn leave(before: Option<&KeyRingStatus>) -> Self {
        Self {
            write: Write::Leave,
            conflict: None,
            status: before.cloned(),
            event: None,
            soon: false,
        }
    }

    /// Nothing written, the status kept: `conflict`.
    fn conflict(conflict: Conflict, before: Option<&KeyRingStatus>) -> Self {
        Self {
            conflict: Some(conflict),
            ..Self::leave(before)
        }
    }
}

/// Whether `ask` is a value other than the one `handled`.
fn asked(ask: Option<&String>, handled: Option<&String>) -> bool {
    ask.is_some() && ask != handled
}

/// Whether [`decide`] needs the pods' reports for `found`, `asks` and the stored `status.keys`
/// `before`: a rotation is staged, or promoted and not retired at once.
pub(crate) fn waits_on_pods(found: &Found, asks: &Asks, before: Option<&KeyRingStatus>) -> bool {
    let Found::Ring(secret) = found else {
        return false;
    };
    let Ok(ring) = Ring::parse(secret.data.as_ref().unwrap_or(&Default::default())) else {
        return false;
    };
    match ring.phase() {
        KeyPhase::Stable => false,
        KeyPhase::Staged => true,
        KeyPhase::Promoted => !asked(
            asks.retire.as_ref(),
            before.and_then(|k| k.retired.as_ref()),
        ),
    }
}

/// What one reconcile does with the endpoint's key ring (module docs): `found` as read, `asks`
/// from the annotations, `before` the stored `status.keys`, `reports` of the target's pods
/// (`None` when they were not asked: then no step that waits for them is taken), `secret` the
/// ring's name and `label` the endpoint's `<namespace>/<name>` for the certificates.
///
/// # Errors
/// [`GenerateError`] when new certificates cannot be made (not expected).
pub(crate) fn decide(
    found: &Found,
    asks: &Asks,
    before: Option<&KeyRingStatus>,
    reports: Option<&[PodReport]>,
    secret: &str,
    label: &str,
) -> Result<Decision, GenerateError> {
    let handled = |f: fn(&KeyRingStatus) -> &Option<String>| before.and_then(|k| f(k).as_ref());
    let new_key_asked = asked(asks.new_key.as_ref(), handled(|k| &k.new_key));
    let retire_asked = asked(asks.retire.as_ref(), handled(|k| &k.retired));
    // A new-key value is handled once seen, whether or not it made a key: one left on the
    // endpoint must not replace a ring deleted later.
    let new_key = asks
        .new_key
        .clone()
        .or_else(|| handled(|k| &k.new_key).cloned());
    let live = match found {
        Found::NotOwned(live) => {
            let message = format!(
                "Secret/{secret} exists and is not this endpoint's ({}); tether never writes a Secret it did not create, and its sidecars mount no other: delete or rename that Secret (docs/guide/key-rotation.md#secretnotowned)",
                controller_of(&live.metadata)
            );
            let conflict = Conflict::new("SecretNotOwned", message);
            return Ok(Decision::conflict(conflict, before));
        }
        Found::Missing => {
            let existed = before.is_some_and(|k| k.secret == secret);
            if existed && !new_key_asked {
                let message = format!(
                    "the key-ring Secret {secret} is gone, and tether never replaces it silently: restore it, or ask for a new key with the annotation mcp.tether.dev/new-key=<a new value> (every session ends; docs/guide/key-rotation.md#the-secret-was-deleted)"
                );
                let conflict = Conflict::new("SecretMissing", message);
                return Ok(Decision::conflict(conflict, before));
            }
            return create(
                existed,
                asks,
                new_key,
                handled(|k| &k.retired),
                secret,
                label,
            );
        }
        Found::Ring(live) => live,
    };
    let ring = match Ring::parse(live.data.as_ref().unwrap_or(&Default::default())) {
        Ok(ring) => ring,
        Err(error) => {
            let message = format!(
                "the key-ring Secret {secret} holds no key ring a sidecar loads ({error}); tether never rewrites it: restore it, or delete it and ask for a new key with mcp.tether.dev/new-key (docs/guide/key-rotation.md#secretinvalid)"
            );
            let conflict = Conflict::new("SecretInvalid", message);
            return Ok(Decision::conflict(conflict, before));
        }
    };
    let rotation = live
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ROTATION_ANNOTATION))
        .cloned();
    let ids = ring.ids();
    let retiring = asks.retire.as_deref().filter(|_| retire_asked);
    let mut retired = handled(|k| &k.retired).cloned();
    let Step {
        after,
        event,
        mut waits,
    } = match ring.phase() {
        KeyPhase::Stable => match asks.rotate.as_deref() {
            Some(token) if asked(asks.rotate.as_ref(), rotation.as_ref()) => {
                stage(&ring, token, label)?
            }
            _ => Step::default(),
        },
        KeyPhase::Staged => promote(&ring, &ids, reports),
        KeyPhase::Promoted => match retiring {
            Some(token) => retire_at_once(&ring, &ids, token),
            None => retire(&ring, &ids, reports),
        },
    };
    // The stage, the only step from a stable ring, records the rotation it starts.
    let rotation = match &after {
        Some(_) if ring.phase() == KeyPhase::Stable => asks.rotate.clone(),
        _ => rotation,
    };
    let changed = after.is_some();
    let ring = after.unwrap_or(ring);
    // A retirement asked is handled once the ring holds no previous key (retired now, or none
    // to retire); while a key is staged, or was promoted just now, it waits.
    match (retiring, ring.phase()) {
        (Some(token), KeyPhase::Staged) => waits.push(format!(
            "{RETIRE_ANNOTATION}={token} waits for the promotion"
        )),
        (Some(token), KeyPhase::Promoted) => waits.push(format!(
            "{RETIRE_ANNOTATION}={token} retires key {} at the next look",
            ids.current
        )),
        (Some(_), KeyPhase::Stable) => retired.clone_from(&asks.retire),
        (None, _) => {}
    }
    let queued = asked(asks.rotate.as_ref(), rotation.as_ref());
    if queued {
        waits.push(format!(
            "{ROTATE_ANNOTATION}={} waits for the rotation under way",
            asks.rotate.as_deref().unwrap_or_default()
        ));
    }
    let soon = ring.phase() != KeyPhase::Stable || queued;
    let message = (!waits.is_empty()).then(|| waits.join("; "));
    let status = status_of(secret, &ring, rotation.clone(), retired, new_key, message);
    let write = if changed {
        Write::Update { ring, rotation }
    } else {
        Write::Leave
    };
    Ok(Decision {
        write,
        conflict: None,
        status: Some(status),
        event,
        soon,
    })
}

/// One step of a rotation, or what it waits for.
#[derive(Default)]
struct Step {
    /// The ring after the step, when one is taken.
    after: Option<Ring>,
    /// Its Event: `(reason, note)`.
    event: Option<(&'static str, String)>,
    /// What the next step waits for.
    waits: Vec<String>,
}

/// Step 1: a new key staged as next, for the rotation `token` (the ring is stable).
fn stage(ring: &Ring, token: &str, label: &str) -> Result<Step, GenerateError> {
    let generation = Generation::new(label)?;
    let next = generation.id();
    let current = ring.ids().current;
    let note = format!(
        "staged key {next} as next ({ROTATE_ANNOTATION}={token}); key {current} still signs. Next: promote key {next} once every pod verifies with it"
    );
    Ok(Step {
        after: Some(ring.stage(&generation)),
        event: Some(("KeyStaged", note)),
        waits: vec![format!(
            "stage: waiting until every pod verifies with key {next}"
        )],
    })
}

/// Step 2: the staged key promoted once every pod of `reports` verifies with it.
fn promote(ring: &Ring, ids: &Ids, reports: Option<&[PodReport]>) -> Step {
    let next = ids.next.clone().unwrap_or_default();
    let current = &ids.current;
    let lagging = lagging(reports, |r| r.next.as_deref() == Some(next.as_str()));
    if !lagging.is_empty() {
        return Step {
            waits: vec![format!(
                "stage: waiting until every pod verifies with key {next}: {}",
                describe(&lagging, reports.map_or(0, <[PodReport]>::len))
            )],
            ..Step::default()
        };
    }
    let note = format!(
        "promoted key {next}: it signs now, and key {current} only verifies. Next: retire key {current} once every pod signs with key {next} and holds no session minted with key {current}"
    );
    Step {
        after: Some(ring.promote()),
        event: Some(("KeyPromoted", note)),
        waits: vec![format!(
            "promote: waiting until every pod signs with key {next} and holds no session minted with key {current}"
        )],
    }
}

/// Step 3: the previous key retired once every pod of `reports` signs with the current key and
/// holds no session minted with the previous one.
fn retire(ring: &Ring, ids: &Ids, reports: Option<&[PodReport]>) -> Step {
    let previous = ids.previous.clone().unwrap_or_default();
    let current = &ids.current;
    let lagging = lagging(reports, |r| {
        r.current == *current && r.sessions.get(&previous).copied().unwrap_or(0) == 0
    });
    if !lagging.is_empty() {
        return Step {
            waits: vec![format!(
                "promote: waiting until every pod signs with key {current} and holds no session minted with key {previous}: {}",
                describe(&lagging, reports.map_or(0, <[PodReport]>::len))
            )],
            ..Step::default()
        };
    }
    let note = format!(
        "retired key {previous}: every pod signs with key {current} and holds no session minted with key {previous}"
    );
    Step {
        after: Some(ring.retire()),
        event: Some(("KeyRetired", note)),
        waits: Vec::new(),
    }
}

/// Step 3 at once, as the retirement `token` asks: sessions minted with the previous key end.
fn retire_at_once(ring: &Ring, ids: &Ids, token: &str) -> Step {
    let previous = ids.previous.clone().unwrap_or_default();
    let note = format!(
        "retired key {previous} at once, as {RETIRE_ANNOTATION}={token} asked: sessions minted with it end, and a pod that has not loaded key {} yet is refused by those that have until it does",
        ids.current
    );
    Step {
        after: Some(ring.retire()),
        event: Some(("KeyRetired", note)),
        waits: Vec::new(),
    }
}

/// The creation of a ring with a new key; `existed` when it replaces a ring that is gone (a new
/// key was asked for). The values of `asks` count as handled.
fn create(
    existed: bool,
    asks: &Asks,
    new_key: Option<String>,
    retired: Option<&String>,
    secret: &str,
    label: &str,
) -> Result<Decision, GenerateError> {
    let generation = Generation::new(label)?;
    let id = generation.id();
    let event = existed.then(|| {
        (
            "NewKey",
            format!(
                "created Secret {secret} with a new key {id}, as {NEW_KEY_ANNOTATION} asked: sessions minted with the lost key end"
            ),
        )
    });
    let ring = Ring::of(&generation);
    let retired = asks.retire.clone().or_else(|| retired.cloned());
    let status = status_of(secret, &ring, asks.rotate.clone(), retired, new_key, None);
    Ok(Decision {
        write: Write::Create {
            ring,
            rotation: asks.rotate.clone(),
        },
        conflict: None,
        status: Some(status),
        event,
        soon: false,
    })
}

/// The `status.keys` of `ring` in Secret `secret`.
fn status_of(
    secret: &str,
    ring: &Ring,
    rotation: Option<String>,
    retired: Option<String>,
    new_key: Option<String>,
    message: Option<String>,
) -> KeyRingStatus {
    let ids = ring.ids();
    KeyRingStatus {
        secret: secret.to_owned(),
        current: Some(ids.current),
        previous: ids.previous,
        next: ids.next,
        phase: Some(ring.phase()),
        rotation,
        retired,
        new_key,
        message,
    }
}

/// The pods of `reports` whose report does not pass `ready`, with why, sorted by name; one
/// placeholder when the reports were not asked.
fn lagging(
    reports: Option<&[PodReport]>,
    ready: impl Fn(&KeyReport) -> bool,
) -> Vec<(String, String)> {
    let Some(reports) = reports else {
        return vec![("every pod".to_owned(), "not asked".to_owned())];
    };
    let mut out: Vec<(String, String)> = reports
        .iter()
        .filter_map(|p| {
            let why = match &p.report {
                Err(why) => why.clone(),
                Ok(r) if ready(r) => return None,
                Ok(r) => describe_report(r),
            };
            Some((p.pod.clone(), why))
        })
        .collect();
    out.sort();
    out
}

/// What a report says, for a message: the keys the pod loaded and its sessions by key.
fn describe_report(r: &KeyReport) -> String {
    let mut parts = vec![format!("signs with {}", r.current)];
    if let Some(next) = &r.next {
        parts.push(format!("next {next}"));
    }
    if let Some(previous) = &r.previous {
        parts.push(format!("previous {previous}"));
    }
    let sessions: Vec<String> = r
        .sessions
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(id, n)| format!("{n} of {id}"))
        .collect();
    if !sessions.is_empty() {
        parts.push(format!("sessions {}", sessions.join(", ")));
    }
    parts.join(", ")
}

/// `lagging` of `total` pods, for a message: how many are ready, then the first few named.
fn describe(lagging: &[(String, String)], total: usize) -> String {
    let named: Vec<String> = lagging
        .iter()
        .take(NAMED_PODS)
        .map(|(pod, why)| format!("{pod} ({why})"))
        .collect();
    let more = lagging.len().saturating_sub(NAMED_PODS);
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "{} of {total} pods do; not yet {}{tail}",
        total.saturating_sub(lagging.len()),
        named.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret;

    use super::*;
    use crate::fixtures::{self, MINIMAL_ENDPOINT};
    use crate::plan::keys::ring_secret;

    const NAME: &str = "weather-tether-keys-6f1c2a9e";

    fn generation() -> Generation {
        Generation::new("tools/weather").unwrap()
    }

    /// The key ring `ring` as its Secret, found.
    fn found(ring: &Ring, rotation: Option<&str>) -> Found {
        let ep = fixtures::endpoint(MINIMAL_ENDPOINT);
        let secret: Secret =
            ring_secret(&fixtures::names(&ep), &fixtures::owner(&ep), ring, rotation);
        Found::Ring(Box::new(secret))
    }

    fn asks(rotate: Option<&str>, retire: Option<&str>, new_key: Option<&str>) -> Asks {
        Asks {
            rotate: rotate.map(str::to_owned),
            retire: retire.map(str::to_owned),
            new_key: new_key.map(str::to_owned),
        }
    }

    fn decide_on(
        found: &Found,
        asks: &Asks,
        before: Option<&KeyRingStatus>,
        reports: Option<&[PodReport]>,
    ) -> Decision {
        decide(found, asks, before, reports, NAME, "tools/weather").unwrap()
    }

    fn key_id_of(ring: &Ring) -> String {
        ring.ids().current
    }

    #[test]
    fn values_present_when_the_ring_is_created_count_as_handled() {
        let d = decide_on(
            &Found::Missing,
            &asks(Some("r"), Some("x"), Some("n")),
            None,
            None,
        );
        let Write::Create { ring, rotation } = &d.write else {
            panic!("{:?}", d.write)
        };
        assert_eq!(rotation.as_deref(), Some("r"));
        let status = d.status.unwrap();
        assert_eq!(status.current.as_deref(), Some(key_id_of(ring).as_str()));
        assert_eq!(
            (
                status.rotation.as_deref(),
                status.retired.as_deref(),
                status.new_key.as_deref()
            ),
            (Some("r"), Some("x"), Some("n"))
        );
        assert_eq!((d.event, d.soon), (None, false));
        // The same values against the ring: nothing to do.
        let d = decide_on(
            &found(ring, Some("r")),
            &asks(Some("r"), Some("x"), Some("n")),
            Some(&status),
            None,
        );
        assert_eq!(d.write, Write::Leave);
        assert_eq!(d.status.as_ref(), Some(&status));
    }

    #[test]
    fn a_step_that_waits_for_the_pods_is_not_taken_without_their_reports() {
        let staged = Ring::of(&generation()).stage(&generation());
        let d = decide_on(&found(&staged, Some("r")), &Asks::default(), None, None);
        assert_eq!(d.write, Write::Leave);
        assert!(d.soon);
        let message = d.status.unwrap().message.unwrap();
        assert!(message.contains("every pod (not asked)"), "{message}");
        let promoted = staged.promote();
        let d = decide_on(&found(&promoted, Some("r")), &Asks::default(), None, None);
        assert_eq!(d.write, Write::Leave);
        // No pod at all: nobody to wait for.
        let d = decide_on(
            &found(&promoted, Some("r")),
            &Asks::default(),
            None,
            Some(&[]),
        );
        assert!(matches!(d.write, Write::Update { .. }));
        assert_eq!(d.event.unwrap().0, "KeyRetired");
    }

    #[test]
    fn the_pods_are_asked_only_while_a_step_waits_for_them() {
        let stable = Ring::of(&generation());
        let staged = stable.stage(&generation());
        let promoted = staged.promote();
        let none = Asks::default();
        assert!(!waits_on_pods(
            &found(&stable, None),
            &asks(Some("r"), None, None),
            None
        ));
        assert!(waits_on_pods(&found(&staged, None), &none, None));
        assert!(waits_on_pods(&found(&promoted, None), &none, None));
        let retire = asks(None, Some("x"), None);
        assert!(
            !waits_on_pods(&found(&promoted, None), &retire, None),
            "retired at once"
        );
        let handled = KeyRingStatus {
            retired: Some("x".into()),
            ..KeyRingStatus::default()
        };
        assert!(waits_on_pods(
            &found(&promoted, None),
            &retire,
            Some(&handled)
        ));
        assert!(!waits_on_pods(&Found::Missing, &none, None));
    }

    #[test]
    fn a_retirement_with_nothing_to_retire_is_handled_and_a_missing_ring_is_never_replaced() {
        let stable = Ring::of(&generation());
        let d = decide_on(
            &found(&stable, None),
            &asks(None, Some("x"), None),
            None,
            None,
        );
        assert_eq!(d.write, Write::Leave);
        let status = d.status.unwrap();
        assert_eq!(status.retired.as_deref(), Some("x"));
        let missing = Found::Missing;
        let d = decide_on(&missing, &asks(None, None, None), Some(&status), None);
        assert_eq!(d.write, Write::Leave);
        assert_eq!(d.conflict.unwrap().reason, "SecretMissing");
        assert_eq!(d.status.as_ref(), Some(&status), "the status is kept");
        // A new key asked for: a fresh one.
        let d = decide_on(&missing, &asks(None, None, Some("n")), Some(&status), None);
        let Write::Create { ring, .. } = d.write else {
            panic!("a new ring")
        };
        assert_ne!(ring.current, stable.current);
        assert_eq!(d.event.unwrap().0, "NewKey");
    }
}

//! The endpoint's key ring against the in-memory API server (`docs/design/peer-trust.md#rotation`): a
//! new endpoint's ring and its certificates, a rotation in three steps that waits for the pods'
//! reports (set by the tests through [`Reports`](crate::support::operator::Reports)), a
//! retirement at once, and the Secret never replaced silently: deleted (`SecretMissing` until
//! restored or a new key is asked for), or of its name but someone else's (`SecretNotOwned`), or
//! broken (`SecretInvalid`). Every reconcile stays within the operator's RBAC rules
//! (`Operator::reconcile` asserts it).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use tether_crds::keyring::{KeyReport, key_id};
use tether_operator::controller::{KEY_RECHECK, RECHECK};

use crate::support::operator::{
    DEPLOY_PATH, EP_PATH, NS, Operator, SECRET_PATH, SECRETS, condition, degraded, deployment,
    endpoint, events, objects, pod_spec, pods_rolled,
};
use crate::support::{Shared, Write, api_with, create_as, delete, json_patch_as, paths, stored};

const PODS: &str = "/api/v1/namespaces/tools/pods";
/// The pods of the target, by name and IP.
const POD_IPS: [(&str, &str); 2] = [("weather-a", "10.0.0.1"), ("weather-b", "10.0.0.2")];

/// A Running pod of the target, carrying the sidecar, its admin port 9901 named.
fn pod(name: &str, ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "weather"}},
        "spec": {
            "initContainers": [{"name": "tether-sidecar", "image": "tether-sidecar:test",
                "restartPolicy": "Always",
                "ports": [{"name": "tether-admin", "containerPort": 9901}]}],
            "containers": [{"name": "server", "image": "srv"}]},
        "status": {"phase": "Running", "podIP": ip}})
}

/// A server holding the endpoint `weather`, its Deployment and its two Running pods, with the
/// operator that reconciled it until nothing moves; the pods report the ring's current key.
async fn settled() -> (Shared, Operator) {
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())]);
    {
        let mut a = api.lock().unwrap();
        for (name, ip) in POD_IPS {
            a.objects.insert(format!("{PODS}/{name}"), pod(name, ip));
        }
    }
    let operator = Operator::new(&api);
    operator.reconcile(EP_PATH).await.0.expect("the injection");
    pods_rolled(&api);
    operator.reconcile(EP_PATH).await.0.expect("the status");
    let current = ids(&api).0;
    report_all(&operator, &report(&current, None, None, &[]));
    operator.assert_quiet(EP_PATH).await;
    (api, operator)
}

/// A key report.
fn report(
    current: &str,
    previous: Option<&str>,
    next: Option<&str>,
    sessions: &[(&str, u64)],
) -> KeyReport {
    KeyReport {
        current: current.to_owned(),
        previous: previous.map(str::to_owned),
        next: next.map(str::to_owned),
        sessions: sessions
            .iter()
            .map(|(id, n)| ((*id).to_owned(), *n))
            .collect(),
    }
}

/// Every pod reports `report`.
fn report_all(operator: &Operator, report: &KeyReport) {
    for (_, ip) in POD_IPS {
        operator.reports().set(ip, report.clone());
    }
}

/// The key-ring Secret's data, decoded.
fn ring(api: &Shared) -> BTreeMap<String, Vec<u8>> {
    let secret: Secret = serde_json::from_value(stored(api, SECRET_PATH)).unwrap();
    secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, ByteString(v))| (k, v))
        .collect()
}

/// The ids of the ring's current, previous and next keys.
fn ids(api: &Shared) -> (String, Option<String>, Option<String>) {
    let ring = ring(api);
    let id = |file: &str| ring.get(file).map(|k| key_id(k));
    (
        id("secret").expect("a current key"),
        id("previous"),
        id("next"),
    )
}

/// The DER of each certificate of the PEM `text`.
fn certificates(text: &[u8]) -> Vec<Vec<u8>> {
    let text = std::str::from_utf8(text).expect("PEM is text");
    text.split("-----BEGIN CERTIFICATE-----")
        .skip(1)
        .map(|block| {
            let body: String = block
                .split("-----END CERTIFICATE-----")
                .next()
                .unwrap()
                .split_whitespace()
                .collect();
            // base64, decoded as a Secret's data is
            serde_json::from_value::<ByteString>(json!(body)).unwrap().0
        })
        .collect()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// The name of the CA of the key with id `id`, which its certificates name as issuer.
fn ca_name(id: &str) -> String {
    format!("tether peer CA tools/weather {id}")
}

/// Sets the annotation `key` of the endpoint to `value`, as `kubectl annotate` does (no new
/// generation).
fn annotate(api: &Shared, key: &str, value: &str) {
    let mut a = api.lock().unwrap();
    let ep = a.objects.get_mut(EP_PATH).unwrap();
    ep["metadata"]["annotations"][key] = json!(value);
}

/// `status.keys` of the endpoint.
fn keys_status(api: &Shared) -> Value {
    stored(api, EP_PATH)["status"]["keys"].clone()
}

/// The reasons of the Events `writes` published.
fn reasons(writes: &[Write]) -> Vec<String> {
    events(writes).into_iter().map(|(_, r, _)| r).collect()
}

/// The one note of an Event of `reason` among `writes`.
fn note(writes: &[Write], reason: &str) -> String {
    let found: Vec<_> = events(writes)
        .into_iter()
        .filter(|(_, r, _)| r == reason)
        .collect();
    assert_eq!(found.len(), 1, "{:?}", events(writes));
    found[0].2.clone()
}

#[tokio::test]
async fn a_new_endpoint_gets_a_key_ring_whose_certificate_chains_to_its_ca() {
    let (api, operator) = settled().await;
    let ring = ring(&api);
    let files: Vec<&str> = ring.keys().map(String::as_str).collect();
    assert_eq!(files, ["ca.crt", "secret", "tls.crt", "tls.key"]);
    assert_eq!(ring["secret"].len(), 64, "32 random bytes as hex");
    assert!(
        ring["secret"].iter().all(u8::is_ascii_hexdigit),
        "no byte a reader would trim"
    );
    let stored_secret = stored(&api, SECRET_PATH);
    assert!(
        stored_secret.get("immutable").is_none(),
        "a rotation rewrites it"
    );
    assert_eq!(
        stored_secret["metadata"]["ownerReferences"][0]["uid"],
        "e-1"
    );
    let id = key_id(&ring["secret"]);
    let [ca] = certificates(&ring["ca.crt"]).try_into().expect("one CA");
    let [leaf] = certificates(&ring["tls.crt"])
        .try_into()
        .expect("one certificate");
    assert!(contains(&ca, &ca_name(&id)), "the CA is the key's");
    assert!(
        contains(&leaf, &ca_name(&id)),
        "the certificate names its CA as issuer"
    );
    assert!(contains(&leaf, "tether-peer") && !contains(&ca, "tether-peer"));
    assert!(contains(&ring["tls.key"], "-----BEGIN PRIVATE KEY-----"));
    assert_eq!(
        keys_status(&api),
        json!({"secret": "weather-tether-keys-e-1", "current": id, "phase": "Stable"})
    );
    // The sidecars read the whole ring from the mounted Secret.
    let pod = pod_spec(&api);
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tether-secret");
    assert_eq!(
        volume.unwrap()["secret"]["secretName"],
        "weather-tether-keys-e-1"
    );
    let env = &pod["initContainers"][0]["env"];
    let var = |name: &str| {
        env.as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .cloned()
    };
    assert_eq!(
        var("TETHER_SECRET_DIR").unwrap()["value"],
        "/etc/tether-secret"
    );
    assert!(var("TETHER_SECRET_FILE").is_none());
    // Without a rotation no pod is asked anything.
    assert!(
        operator.reports().asked().is_empty(),
        "{:?}",
        operator.reports().asked()
    );
}

#[tokio::test]
async fn a_rotation_stages_promotes_and_retires_as_the_pods_report_each_step() {
    let (api, operator) = settled().await;
    let (old, _, _) = ids(&api);
    let before = ring(&api);

    // 1. Asked: the new key is staged as next, its CA joins the bundle.
    annotate(&api, "mcp.tether.dev/rotate-key", "r1");
    let (result, writes) = operator.reconcile(EP_PATH).await;
    assert_eq!(result.unwrap(), Action::requeue(KEY_RECHECK));
    assert_eq!(
        objects(&writes),
        [
            format!("PATCH {SECRET_PATH}"),
            format!("PATCH {EP_PATH}/status")
        ]
    );
    let patch = writes.iter().find(|w| w.path == SECRET_PATH).unwrap();
    assert_eq!(
        patch.body[0]["op"], "test",
        "guarded by the version read: {}",
        patch.body
    );
    let (current, previous, next) = ids(&api);
    let new = next.clone().expect("a staged key");
    assert_eq!((current.as_str(), previous), (old.as_str(), None));
    let staged = ring(&api);
    assert_eq!(certificates(&staged["ca.crt"]).len(), 2);
    assert!(
        staged["ca.crt"].starts_with(&before["ca.crt"]),
        "the old CA stays first"
    );
    assert!(contains(
        &certificates(&staged["next-tls.crt"])[0],
        &ca_name(&new)
    ));
    assert_eq!(
        staged["tls.crt"], before["tls.crt"],
        "the old certificate is still presented"
    );
    assert!(note(&writes, "KeyStaged").contains(&new));
    let status = keys_status(&api);
    assert_eq!(
        (status["phase"].as_str(), status["rotation"].as_str()),
        (Some("Staged"), Some("r1"))
    );
    let progressing = condition(&stored(&api, EP_PATH)["status"], "Progressing");
    assert_eq!(progressing["reason"], "KeyRotation", "{progressing}");

    // Waits while a pod has not loaded the staged key, and says which.
    operator
        .reports()
        .set("10.0.0.1", report(&old, None, Some(&new), &[]));
    let (result, writes) = operator.reconcile(EP_PATH).await;
    assert_eq!(result.unwrap(), Action::requeue(KEY_RECHECK));
    assert_eq!(objects(&writes), [format!("PATCH {EP_PATH}/status")]);
    let message = keys_status(&api)["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("1 of 2 pods do")
            && message.contains(&format!("weather-b (signs with {old})")),
        "{message}"
    );
    let asked: Vec<String> = operator
        .reports()
        .asked()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        asked.ends_with(&["10.0.0.1:9901".to_owned(), "10.0.0.2:9901".to_owned()]),
        "{asked:?}"
    );
    let (_, writes) = operator.reconcile(EP_PATH).await;
    assert_eq!(
        paths(&writes),
        Vec::<String>::new(),
        "a wait writes nothing new"
    );

    // 2. Every pod verifies with it: promoted.
    report_all(&operator, &report(&old, None, Some(&new), &[]));
    let (_, writes) = operator.reconcile(EP_PATH).await;
    assert!(note(&writes, "KeyPromoted").contains(&new));
    assert_eq!(ids(&api), (new.clone(), Some(old.clone()), None));
    let promoted = ring(&api);
    assert_eq!(
        promoted["tls.crt"], staged["next-tls.crt"],
        "its certificate is presented"
    );
    assert_eq!(promoted["tls.key"], staged["next-tls.key"]);
    assert!(!promoted.contains_key("next-tls.crt") && !promoted.contains_key("next-tls.key"));
    assert_eq!(
        certificates(&promoted["ca.crt"]).len(),
        2,
        "the old key still verifies"
    );
    assert_eq!(keys_status(&api)["phase"], "Promoted");

    // Waits while a pod signs with the old key, then while sessions of the old key live.
    operator
        .reports()
        .set("10.0.0.1", report(&new, Some(&old), None, &[]));
    operator
        .reports()
        .set("10.0.0.2", report(&old, None, Some(&new), &[]));
    let (_, writes) = operator.reconcile(EP_PATH).await;
    assert!(!paths(&writes).contains(&format!("PATCH {SECRET_PATH}")));
    report_all(
        &operator,
        &report(&new, Some(&old), None, &[(&old, 3), (&new, 5)]),
    );
    let (_, writes) = operator.reconcile(EP_PATH).await;
    assert!(!paths(&writes).contains(&format!("PATCH {SECRET_PATH}")));
    let message = keys_status(&api)["message"].as_str().unwrap().to_owned();
    assert!(message.contains(&format!("3 of {old}")), "{message}");

    // 3. No session of the old key is left: retired, with its CA.
    report_all(
        &operator,
        &report(&new, Some(&old), None, &[(&old, 0), (&new, 8)]),
    );
    let (result, writes) = operator.reconcile(EP_PATH).await;
    assert_eq!(result.unwrap(), Action::requeue(RECHECK));
    assert!(note(&writes, "KeyRetired").contains(&old));
    assert_eq!(ids(&api), (new.clone(), None, None));
    let [ca] = certificates(&ring(&api)["ca.crt"])
        .try_into()
        .expect("one CA");
    assert!(contains(&ca, &ca_name(&new)) && !contains(&ca, &ca_name(&old)));
    let status = stored(&api, EP_PATH)["status"].clone();
    assert_eq!(
        status["keys"],
        json!({"secret": "weather-tether-keys-e-1", "current": new, "phase": "Stable", "rotation": "r1"})
    );
    assert_eq!(condition(&status, "Progressing")["reason"], "Complete");
    let steps = operator.metrics().encode();
    for step in ["staged", "promoted", "retired"] {
        assert!(
            steps.contains(&format!(
                "tether_operator_key_steps_total{{step=\"{step}\"}} 1"
            )),
            "{steps}"
        );
    }
    // Settled: the same annotation asks nothing more.
    report_all(&operator, &report(&new, None, None, &[]));
    operator.assert_quiet(EP_PATH).await;
}

#[tokio::test]
async fn a_rotation_asked_during_another_waits_for_it() {
    let (api, operator) = settled().await;
    let (k1, _, _) = ids(&api);
    annotate(&api, "mcp.tether.dev/rotate-key", "r1");
    operator.reconcile(EP_PATH).await.0.unwrap();
    let k2 = ids(&api).2.unwrap();
    annotate(&api, "mcp.tether.dev/rotate-key", "r2");
    let (_, writes) = operator.reconcile(EP_PATH).await;
    assert!(!paths(&writes).contains(&format!("PATCH {SECRET_PATH}")));
    assert_eq!(
        ids(&api).2.as_deref(),
        Some(k2.as_str()),
        "the staged key stays"
    );
    let message = keys_status(&api)["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("rotate-key=r2 waits for the rotation under way"),
        "{message}"
    );
    report_all(&operator, &report(&k1, None, Some(&k2), &[]));
    operator.reconcile(EP_PATH).await.0.unwrap();
    report_all(&operator, &report(&k2, Some(&k1), None, &[]));
    let (result, writes) = operator.reconcile(EP_PATH).await;
    assert!(reasons(&writes).contains(&"KeyRetired".to_owned()));
    assert_eq!(
        result.unwrap(),
        Action::requeue(KEY_RECHECK),
        "r2 still waits"
    );
    // The next one starts.
    let (_, writes) = operator.reconcile(EP_PATH).await;
    assert!(reasons(&writes).contains(&"KeyStaged".to_owned()));
    let (current, _, next) = ids(&api);
    assert_eq!(current, k2);
    assert!(next.is_some_and(|k3| k3 != k2 && k3 != k1));
    assert_eq!(keys_status(&api)["rotation"], "r2");
}

#[tokio::test]
async fn retire_previous_key_drops_it_at_once_whatever_sessions_it_minted() {
    let (api, operator) = settled().await;
    let (k1, _, _) = ids(&api);
    // Asked together, as for a leaked key: the retirement waits for the promotion only.
    annotate(&api, "mcp.tether.dev/rotate-key", "leak");
    annotate(&api, "mcp.tether.dev/retire-previous-key", "leak");
    operator.reconcile(EP_PATH).await.0.unwrap();
    let k2 = ids(&api).2.unwrap();
    let message = keys_status(&api)["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("retire-previous-key=leak waits for the promotion"),
        "{message}"
    );
    report_all(&operator, &report(&k1, None, Some(&k2), &[(&k1, 40)]));
    operator.reconcile(EP_PATH).await.0.unwrap();
    assert_eq!(ids(&api), (k2.clone(), Some(k1.clone()), None));
    let (_, writes) = operator.reconcile(EP_PATH).await;
    let retired = note(&writes, "KeyRetired");
    assert!(
        retired.contains("at once") && retired.contains("sessions minted with it end"),
        "{retired}"
    );
    assert_eq!(ids(&api), (k2.clone(), None, None));
    assert_eq!(certificates(&ring(&api)["ca.crt"]).len(), 1);
    assert_eq!(keys_status(&api)["retired"], "leak");
    // Handled: the annotation left in place asks nothing at the next rotation.
    annotate(&api, "mcp.tether.dev/rotate-key", "again");
    operator.reconcile(EP_PATH).await.0.unwrap();
    report_all(
        &operator,
        &report(&k2, None, Some(&ids(&api).2.unwrap()), &[]),
    );
    operator.reconcile(EP_PATH).await.0.unwrap();
    assert!(
        ids(&api).1.is_some(),
        "promoted, the previous key kept while its sessions live"
    );
    report_all(
        &operator,
        &report(&ids(&api).0, Some(&k2), None, &[(&k2, 1)]),
    );
    let (_, writes) = operator.reconcile(EP_PATH).await;
    assert!(!reasons(&writes).contains(&"KeyRetired".to_owned()));
}

#[tokio::test]
async fn a_deleted_key_ring_is_secret_missing_until_restored_or_a_new_key_is_asked() {
    let (api, operator) = settled().await;
    // A new-key value set while the ring exists is handled, and asks nothing later.
    annotate(&api, "mcp.tether.dev/new-key", "n0");
    operator.reconcile(EP_PATH).await.0.unwrap();
    assert_eq!(keys_status(&api)["newKey"], "n0");
    let kept = stored(&api, SECRET_PATH);
    let template = pod_spec(&api);
    delete(&api, SECRET_PATH).unwrap();
    let (result, writes) = operator.reconcile(EP_PATH).await;
    assert_eq!(result.unwrap(), Action::requeue(RECHECK));
    assert_eq!(
        objects(&writes),
        [format!("PATCH {EP_PATH}/status")],
        "no Secret created"
    );
    let (type_, reason, why) = events(&writes).remove(0);
    assert_eq!(
        (type_.as_str(), reason.as_str()),
        ("Warning", "SecretMissing")
    );
    assert!(why.contains("mcp.tether.dev/new-key"), "{why}");
    assert_eq!(degraded(&api, EP_PATH)["reason"], "SecretMissing");
    assert_eq!(
        pod_spec(&api),
        template,
        "the pods keep running as they are"
    );
    let (_, writes) = operator.reconcile(EP_PATH).await;
    assert_eq!(paths(&writes), Vec::<String>::new());

    // Restored (from a backup, say): the ring is the endpoint's again.
    let mut restored = kept.clone();
    for field in [
        "resourceVersion",
        "uid",
        "managedFields",
        "creationTimestamp",
    ] {
        restored["metadata"].as_object_mut().unwrap().remove(field);
    }
    create_as(&api, "kubectl", SECRETS, &restored).unwrap();
    operator.reconcile(EP_PATH).await.0.unwrap();
    assert_eq!(degraded(&api, EP_PATH)["status"], "False");
    assert_eq!(ring(&api)["secret"], ring_key(&kept));

    // Deleted again, then a new key asked for: a new ring, every session ends.
    delete(&api, SECRET_PATH).unwrap();
    operator.reconcile(EP_PATH).await.0.unwrap();
    assert_eq!(degraded(&api, EP_PATH)["reason"], "SecretMissing");
    annotate(&api, "mcp.tether.dev/new-key", "n1");
    let (_, writes) = operator.reconcile(EP_PATH).await;
    assert_eq!(
        objects(&writes),
        [format!("POST {SECRETS}"), format!("PATCH {EP_PATH}/status")]
    );
    assert!(note(&writes, "NewKey").contains("sessions minted with the lost key end"));
    assert_ne!(ring(&api)["secret"], ring_key(&kept));
    assert_eq!(degraded(&api, EP_PATH)["status"], "False");
    assert_eq!(keys_status(&api)["newKey"], "n1");
}

/// The current key of the stored Secret `secret`.
fn ring_key(secret: &Value) -> Vec<u8> {
    let secret: Secret = serde_json::from_value(secret.clone()).unwrap();
    secret.data.unwrap()["secret"].0.clone()
}

#[tokio::test]
async fn a_secret_of_the_rings_name_that_is_not_the_endpoints_is_secret_not_owned() {
    let theirs = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "weather-tether-keys-e-1", "namespace": NS},
        "data": {"secret": ByteString(vec![1; 32])}});
    let api = api_with(&[
        (EP_PATH, endpoint(true)),
        (DEPLOY_PATH, deployment()),
        (SECRET_PATH, theirs),
    ]);
    let before = stored(&api, SECRET_PATH);
    let (result, writes) = Operator::new(&api).reconcile(EP_PATH).await;
    result.expect("a conflict is no error");
    assert_eq!(
        objects(&writes),
        [format!("PATCH {EP_PATH}/status")],
        "nothing else written"
    );
    let condition = degraded(&api, EP_PATH);
    assert_eq!(condition["reason"], "SecretNotOwned", "{condition}");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("it has no controller owner"),
        "{condition}"
    );
    assert_eq!(stored(&api, SECRET_PATH), before);
    assert!(
        pod_spec(&api).get("initContainers").is_none(),
        "no pod mounts it"
    );
}

#[tokio::test]
async fn a_key_ring_a_sidecar_would_refuse_is_secret_invalid_and_never_rewritten() {
    let (api, operator) = settled().await;
    let cut = json!([{"op": "remove", "path": "/data/tls.key"}]);
    json_patch_as(&api, "kubectl-edit", SECRET_PATH, &cut).unwrap();
    let before = stored(&api, SECRET_PATH);
    annotate(&api, "mcp.tether.dev/rotate-key", "r1");
    let (_, writes) = operator.reconcile(EP_PATH).await;
    assert_eq!(objects(&writes), [format!("PATCH {EP_PATH}/status")]);
    let condition = degraded(&api, EP_PATH);
    assert_eq!(condition["reason"], "SecretInvalid", "{condition}");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("tls.key: missing"),
        "{condition}"
    );
    assert_eq!(stored(&api, SECRET_PATH), before);
}

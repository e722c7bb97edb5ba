//! Who may make the operator write (`docs/design/security-model.md`): a Deployment that has not
//! opted in is never written to, an image outside `--allowed-sidecar-images` is never injected,
//! and a namespaced install (`--watch-namespaces`) reconciles its namespaces only, every API call
//! inside the Roles the chart grants there (the server answers 403 outside them).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tether_operator::access::Grant;
use tether_operator::admission::{ImagePattern, NAMESPACE_OPT_IN_LABEL, OPT_IN_LABEL, Policy};
use tether_operator::controller::Context;
use tether_operator::metrics::Metrics;

use crate::support::operator::{
    DEPLOY_PATH, EP_PATH, NS, Operator, assert_degraded_only, defaults, degraded, deployment,
    endpoint, injected, reconcile_once,
};
use crate::support::{Shared, api_with, apply_as, client_of, grant, namespace, paths, stored};

/// The fixtures' Deployment without its opt-in label.
fn not_opted_in() -> Value {
    let mut d = deployment();
    d["metadata"]["labels"] = json!({"app": "weather"});
    d
}

/// The operator's writes to the Deployment `weather` (the server records the clients' writes,
/// not the test's own as a user).
fn deployment_writes(api: &Shared) -> Vec<String> {
    let all = api.lock().unwrap().writes.clone();
    paths(&all)
        .into_iter()
        .filter(|p| p.ends_with(DEPLOY_PATH))
        .collect()
}

#[tokio::test]
async fn a_deployment_that_has_not_opted_in_is_never_written_until_labelled() {
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, not_opted_in())]);
    let (_, writes) = reconcile_once(&api).await;
    assert_degraded_only(&writes, "TargetNotOptedIn");
    assert_eq!(deployment_writes(&api), Vec::<String>::new());
    let message = degraded(&api, EP_PATH)["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message
            .contains("kubectl label deployment weather mcp.tether.dev/endpoint=weather -n tools"),
        "{message}"
    );
    // A label naming another endpoint is no opt-in to this one.
    let mut other = not_opted_in();
    other["metadata"]["labels"][OPT_IN_LABEL] = json!("billing");
    apply_as(&api, "kubectl", DEPLOY_PATH, &other, true).unwrap();
    reconcile_once(&api).await;
    assert!(!injected(&api));
    assert_eq!(deployment_writes(&api), Vec::<String>::new());
    // The user adds the label: the next reconcile injects.
    apply_as(&api, "kubectl", DEPLOY_PATH, &deployment(), true).unwrap();
    reconcile_once(&api).await;
    assert!(injected(&api));
    assert_eq!(degraded(&api, EP_PATH)["status"], "False");
}

#[tokio::test]
async fn a_namespace_label_opts_every_deployment_of_it_in() {
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, not_opted_in())]);
    namespace(&api, NS, json!({NAMESPACE_OPT_IN_LABEL: "disabled"}));
    let (_, writes) = reconcile_once(&api).await;
    assert_degraded_only(&writes, "TargetNotOptedIn");
    namespace(&api, NS, json!({NAMESPACE_OPT_IN_LABEL: "enabled"}));
    reconcile_once(&api).await;
    assert!(injected(&api));
}

#[tokio::test]
async fn an_image_outside_the_allowed_ones_is_never_injected() {
    let mut ep = endpoint(true);
    ep["spec"]["sidecar"] = json!({"image": "registry.example.com/evil/sidecar:1"});
    let api = api_with(&[(EP_PATH, ep), (DEPLOY_PATH, deployment())]);
    let (result, writes) = Operator::new(&api).reconcile(EP_PATH).await;
    result.unwrap();
    assert_degraded_only(&writes, "ImageNotAllowed");
    assert_eq!(deployment_writes(&api), Vec::<String>::new());
    // The installer allows that registry's images: injected, with that image.
    let policy = Policy::new(
        vec![ImagePattern::parse("registry.example.com/*").unwrap()],
        "tether-sidecar:test",
    );
    Operator::allowing(&api, Some(policy))
        .reconcile(EP_PATH)
        .await
        .0
        .unwrap();
    assert!(injected(&api));
    let init = stored(&api, DEPLOY_PATH)["spec"]["template"]["spec"]["initContainers"][0].clone();
    assert_eq!(init["image"], "registry.example.com/evil/sidecar:1");
}

#[tokio::test]
async fn a_namespaced_install_reconciles_its_namespaces_only_within_its_roles() {
    let elsewhere = |path: &str| path.replace("/namespaces/tools/", "/namespaces/elsewhere/");
    let moved = |mut obj: Value| {
        obj["metadata"]["namespace"] = json!("elsewhere");
        obj
    };
    let api = api_with(&[
        (EP_PATH, endpoint(true)),
        (DEPLOY_PATH, deployment()),
        (&elsewhere(EP_PATH), moved(endpoint(true))),
        (&elsewhere(DEPLOY_PATH), moved(deployment())),
    ]);
    grant(&api, Grant::Namespaces(vec![NS.to_owned()]));
    let metrics = Arc::new(Metrics::default());
    let ctx = Arc::new(Context::new(client_of(&api, NS), defaults(), metrics, None));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let watched = [NS.to_owned()];
    let controller = tokio::spawn(async move {
        tether_operator::watches::run(ctx, &watched, async {
            let _ = stopped.await;
        })
        .await;
    });
    let reconciled = || !stored(&api, EP_PATH)["status"]["conditions"].is_null();
    for _ in 0..500 {
        if reconciled() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        reconciled(),
        "the endpoint of the watched namespace is reconciled"
    );
    assert!(injected(&api));
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), controller)
        .await
        .expect("the controller stops")
        .unwrap();
    let a = api.lock().unwrap();
    assert_eq!(
        a.forbidden,
        Vec::<String>::new(),
        "every call inside the Role"
    );
    let asked: Vec<&String> = a.namespaces_asked.iter().collect();
    assert_eq!(asked, [NS], "no call outside the watched namespace");
    assert!(stored_status_is_null(&a.objects[&elsewhere(EP_PATH)]));
    assert!(
        a.writes
            .iter()
            .all(|w| !w.path.contains("/namespaces/elsewhere/"))
    );
}

fn stored_status_is_null(obj: &Value) -> bool {
    obj["status"].is_null()
}

#[tokio::test]
async fn the_server_refuses_a_reconcile_outside_the_watched_namespaces() {
    // The mock's namespaced rules bite: the same reconcile, with the Role only elsewhere.
    let api = api_with(&[(EP_PATH, endpoint(true)), (DEPLOY_PATH, deployment())]);
    grant(&api, Grant::Namespaces(vec!["elsewhere".into()]));
    let client = client_of(&api, NS);
    let metrics = Arc::new(Metrics::default());
    let ctx = Arc::new(Context::new(client, defaults(), metrics, None));
    let ep = serde_json::from_value(stored(&api, EP_PATH)).unwrap();
    let result = tether_operator::controller::reconcile(Arc::new(ep), ctx).await;
    assert!(result.is_err(), "{result:?}");
    let a = api.lock().unwrap();
    assert!(!a.forbidden.is_empty());
    assert!(a.writes.is_empty(), "{:?}", paths(&a.writes));
}

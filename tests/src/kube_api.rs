//! A fake Kubernetes API server for the sidecar's EndpointSlice watch
//! (`docs/design/routing.md#kubernetes-endpointslice-watch`): the tests' in-memory API server
//! (`tether_fake_kube`) over plain HTTP on a loopback address, which a `kube::runtime::watcher`
//! LISTs (`labelSelector`, the list's `resourceVersion`) and WATCHes (`watch=true`,
//! `resourceVersion=R`: the `ADDED` / `MODIFIED` / `DELETED` events after `R`) as a
//! kube-apiserver.
//!
//! The test describes pods ([`PodObject`], [`FakeKube::apply`], [`FakeKube::delete`]); the fake
//! plays the EndpointSlice controller of the Service it was started with, writing the
//! EndpointSlices into the server: the pods its selector matches are its endpoints (conditions
//! `ready` always true, since the peer Service publishes not-ready addresses; `serving` the pod's
//! readiness; `terminating` its deletion), packed [`SLICE_CAPACITY`] to a slice so that a few
//! pods already make several slices, with the ports `tether-peer` and `mcp`.
//!
//! The test controls the answers: [`FakeKube::hold_lists`] keeps every LIST waiting (an API
//! server slow to answer, or not reachable yet) until it is released. A sidecar reaches it with
//! [`FakeKube::slice_watch`]: `--peer-service`, `--namespace` and `KUBECONFIG` naming a
//! kubeconfig whose cluster is `http://<fake>` with no credentials (`kube::Client::try_default`
//! reads `KUBECONFIG` first). The fake stops (every connection with it) when dropped.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_crds::{ENDPOINT_ANNOTATION, MCP_PORT_NAME, PEER_PORT_NAME};
use tether_fake_kube::{ApiServer, Shared, apply_as, serve_http};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::pod::{LISTEN_PORT, PEER_PORT, PodSpec, uid};
use crate::{Result, addr};

/// The port the fake listens on, on an address of its own.
pub const PORT: u16 = 6443;
/// The label a Deployment's ReplicaSet puts on its pods: the revision.
pub const REVISION_LABEL: &str = "pod-template-hash";
/// The label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Endpoints per slice (the EndpointSlice controller packs up to 100; fewer here, so that tests
/// see several slices).
pub const SLICE_CAPACITY: usize = 2;
/// The field manager of the slices, as the EndpointSlice controller writes them.
const CONTROLLER: &str = "endpointslice-controller.k8s.io";

/// A pod, as the fake's EndpointSlice controller sees it.
#[derive(Clone, Debug)]
pub struct PodObject {
    /// `metadata.name`.
    pub name: String,
    /// `status.podIP`; `metadata.uid` is the harness's UID of the pod on it ([`uid`]).
    pub ip: Ipv4Addr,
    /// `metadata.labels` (with [`REVISION_LABEL`], and the injection's
    /// [`ENDPOINT_ANNOTATION`] label for a pod of an endpoint).
    pub labels: BTreeMap<String, String>,
    /// Condition `Ready` is `True` (the endpoint's `serving`).
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set (the endpoint's `terminating`).
    pub terminating: bool,
}

impl PodObject {
    /// A Ready pod of endpoint `endpoint` whose target is Deployment `deployment`, at revision
    /// `hash`, with `labels`: as the operator's injection (its label naming the endpoint) and
    /// the Deployment's ReplicaSet make it.
    pub fn of_endpoint(
        ip: Ipv4Addr,
        endpoint: &str,
        deployment: &str,
        hash: &str,
        labels: &[(&str, &str)],
    ) -> Self {
        let mut pod = Self::stranger(ip, hash, labels);
        pod.name = format!("{deployment}-{hash}-{}", ip.octets()[3]);
        pod.labels
            .insert(ENDPOINT_ANNOTATION.to_owned(), endpoint.to_owned());
        pod
    }

    /// A Ready pod with `labels` (and revision `hash`) that is no pod of an endpoint (no
    /// injection label): another workload that happens to share the Deployment's labels.
    pub fn stranger(ip: Ipv4Addr, hash: &str, labels: &[(&str, &str)]) -> Self {
        let mut labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.insert(REVISION_LABEL.to_owned(), hash.to_owned());
        Self {
            name: format!("stranger-{}", ip.octets()[3]),
            ip,
            labels,
            ready: true,
            terminating: false,
        }
    }

    /// The pod's UID.
    pub fn uid(&self) -> String {
        uid(self.ip)
    }

    /// The pod as an endpoint of an EndpointSlice.
    pub fn endpoint(&self, namespace: &str) -> Value {
        json!({
            "addresses": [self.ip.to_string()],
            "conditions": {"ready": true, "serving": self.ready, "terminating": self.terminating},
            "targetRef": {"kind": "Pod", "namespace": namespace, "name": self.name, "uid": self.uid()},
        })
    }
}

/// The pods the fake's EndpointSlice controller knows.
#[derive(Default)]
struct Pods {
    /// The pods by UID, with their place (pods are packed into slices in the order they came).
    by_uid: BTreeMap<String, (usize, PodObject)>,
    /// Places given so far.
    places: usize,
}

/// A fake kube-apiserver (module docs).
pub struct FakeKube {
    /// Its base URL, `http://ip:port`.
    pub url: String,
    api: Shared,
    namespace: String,
    /// The Service whose slices it makes, and its selector.
    service: String,
    selector: BTreeMap<String, String>,
    pods: Mutex<Pods>,
    kubeconfig: tempfile::NamedTempFile,
    server: JoinHandle<()>,
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeKube {
    /// Starts a fake API server on a fresh loopback address, with the EndpointSlices of
    /// Service `service` of `namespace`, which selects the pods carrying every label of
    /// `selector` (at first none).
    ///
    /// # Errors
    /// [`crate::HarnessError::Io`] when it cannot listen or write its kubeconfig.
    pub async fn start(namespace: &str, service: &str, selector: &[(&str, &str)]) -> Result<Self> {
        let ip = addr::next_ip();
        let listener = TcpListener::bind(SocketAddr::from((ip, PORT))).await?;
        let url = format!("http://{ip}:{PORT}");
        let kubeconfig = tempfile::NamedTempFile::new()?;
        std::fs::write(
            kubeconfig.path(),
            format!(
                "apiVersion: v1\n\
                 kind: Config\n\
                 clusters:\n\
                 - name: fake\n\
                 \x20 cluster: {{server: '{url}'}}\n\
                 users:\n\
                 - name: nobody\n\
                 \x20 user: {{}}\n\
                 contexts:\n\
                 - name: fake\n\
                 \x20 context: {{cluster: fake, user: nobody, namespace: {namespace}}}\n\
                 current-context: fake\n"
            ),
        )?;
        let api = Shared::default();
        let server = tokio::spawn(serve_http(listener, Arc::clone(&api)));
        Ok(Self {
            url,
            api,
            namespace: namespace.to_owned(),
            service: service.to_owned(),
            selector: selector
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            pods: Mutex::default(),
            kubeconfig,
            server,
        })
    }

    /// `spec` with the flags and environment of a sidecar whose membership is a watch of this
    /// fake's Service: `--peer-service <service> --namespace <ns>`, `KUBECONFIG`,
    /// `POD_NAMESPACE`.
    pub fn slice_watch(&self, mut spec: PodSpec) -> PodSpec {
        spec.sidecar_args.extend([
            "--peer-service".to_owned(),
            self.service.clone(),
            "--namespace".to_owned(),
            self.namespace.clone(),
        ]);
        spec.sidecar_env.extend([
            (
                "KUBECONFIG".to_owned(),
                self.kubeconfig.path().display().to_string(),
            ),
            ("POD_NAMESPACE".to_owned(), self.namespace.clone()),
        ]);
        spec
    }

    /// Adds `pod` or replaces the pod of its UID; the slice that holds it changes.
    pub fn apply(&self, pod: &PodObject) {
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        let place = match pods.by_uid.get(&pod.uid()) {
            Some((place, _)) => *place,
            None => {
                pods.places += 1;
                pods.places - 1
            }
        };
        pods.by_uid.insert(pod.uid(), (place, pod.clone()));
        self.publish(&pods, place / SLICE_CAPACITY);
    }

    /// Removes the pod on `ip` (its endpoint leaves its slice). Whether it was there.
    pub fn delete(&self, ip: Ipv4Addr) -> bool {
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((place, _)) = pods.by_uid.remove(&uid(ip)) else {
            return false;
        };
        self.publish(&pods, place / SLICE_CAPACITY);
        true
    }

    /// Makes every LIST wait (`true`) until released (`false`); a LIST already waiting is
    /// answered, with the slices of that moment, once released.
    pub fn hold_lists(&self, hold: bool) {
        self.server().hold_lists(hold);
    }

    /// LIST requests received so far (answered or held).
    pub fn lists(&self) -> u64 {
        self.server().lists
    }

    /// WATCH requests received so far.
    pub fn watches(&self) -> u64 {
        self.server().watches
    }

    /// Polls (every 20 ms, at most `within`) until at least `n` LISTs arrived; whether they did.
    pub async fn wait_for_lists(&self, n: u64, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while self.lists() < n {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Every request received, one line each (method, path and query), for failure messages.
    pub fn requests(&self) -> String {
        self.server().requests.join("\n")
    }

    fn server(&self) -> MutexGuard<'_, ApiServer> {
        self.api.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The path of slice number `slice`.
    fn slice_path(&self, slice: usize) -> String {
        format!(
            "/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices/{}-{slice}",
            self.namespace, self.service
        )
    }

    /// Writes slice number `slice` as `pods` make it now: applied by the EndpointSlice
    /// controller, or deleted when none of its pods is selected.
    ///
    /// # Panics
    /// When the server refuses the slice.
    fn publish(&self, pods: &Pods, slice: usize) {
        let endpoints: Vec<Value> = pods
            .by_uid
            .values()
            .filter(|(place, pod)| {
                place / SLICE_CAPACITY == slice
                    && self
                        .selector
                        .iter()
                        .all(|(k, v)| pod.labels.get(k) == Some(v))
            })
            .map(|(_, pod)| pod.endpoint(&self.namespace))
            .collect();
        let path = self.slice_path(slice);
        if endpoints.is_empty() {
            if self.server().objects.contains_key(&path) {
                tether_fake_kube::delete(&self.api, &path).expect("the slice is deleted");
            }
            return;
        }
        let object = json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": format!("{}-{slice}", self.service),
                "namespace": self.namespace,
                "labels": {
                    SERVICE_NAME_LABEL: self.service,
                    "endpointslice.kubernetes.io/managed-by": CONTROLLER,
                },
            },
            "addressType": "IPv4",
            "ports": [
                {"name": PEER_PORT_NAME, "port": PEER_PORT, "protocol": "TCP"},
                {"name": MCP_PORT_NAME, "port": LISTEN_PORT, "protocol": "TCP"},
            ],
            "endpoints": endpoints,
        });
        apply_as(&self.api, CONTROLLER, &path, &object, true)
            .unwrap_or_else(|status| panic!("the slice {path} is refused: {status}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pods_become_endpoints_of_the_services_slices() {
        let api = FakeKube::start(
            "ns",
            "test-peers",
            &[("app", "x"), (ENDPOINT_ANNOTATION, "test")],
        )
        .await
        .unwrap();
        let ips = [1, 2, 3].map(|n| Ipv4Addr::new(127, 9, 0, n));
        for ip in ips {
            api.apply(&PodObject::of_endpoint(
                ip,
                "test",
                "test",
                "r1",
                &[("app", "x")],
            ));
        }
        let stranger = Ipv4Addr::new(127, 9, 0, 9);
        api.apply(&PodObject::stranger(stranger, "r1", &[("app", "x")]));
        let slices = |api: &FakeKube| -> Vec<Value> {
            let server = api.server();
            (0..3)
                .filter_map(|n| server.objects.get(&api.slice_path(n)).cloned())
                .collect()
        };
        let made = slices(&api);
        assert_eq!(made.len(), 2, "{SLICE_CAPACITY} endpoints a slice");
        let endpoints: Vec<&Value> = made
            .iter()
            .flat_map(|s| s["endpoints"].as_array().unwrap())
            .collect();
        assert_eq!(endpoints.len(), 3, "not the stranger");
        assert_eq!(endpoints[0]["targetRef"]["uid"], uid(ips[0]));
        assert_eq!(endpoints[0]["conditions"]["serving"], true);
        assert_eq!(made[0]["ports"][1]["name"], MCP_PORT_NAME);
        assert_eq!(
            made[0]["metadata"]["labels"][SERVICE_NAME_LABEL],
            "test-peers"
        );

        let mut leaving = PodObject::of_endpoint(ips[2], "test", "test", "r1", &[("app", "x")]);
        leaving.terminating = true;
        api.apply(&leaving);
        assert!(api.delete(ips[2]));
        assert!(!api.delete(ips[2]));
        let kinds: Vec<&str> = api.server().events.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["ADDED", "MODIFIED", "ADDED", "MODIFIED", "DELETED"]);
        assert_eq!(slices(&api).len(), 1);
    }
}

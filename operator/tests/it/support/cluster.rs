//! What the rest of a cluster does that the tests need, over the stored objects: the ports the
//! EndpointSlice controller publishes for a Service, the Pod Security Standards "restricted"
//! checks of a pod spec, and the garbage collector.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{Shared, delete};

/// The port the EndpointSlice controller publishes, for a pod of `pod_template` (a Deployment's
/// `spec.template`), for each port of the Service at `service_path` on a cluster of `version`
/// (major, minor), as Kubernetes' `FindPort` resolves it: a numeric `targetPort` as it is; a
/// named one from the ports of the regular containers, then — from 1.33 on (kubernetes PRs
/// #127976, #128850) — of the restartable init containers (`restartPolicy: Always`), matching
/// name and protocol. Returns `(Service port name, the port or None when it is left out)`.
///
/// # Panics
/// When no Service is stored at `service_path`.
pub fn service_endpoint_ports(
    api: &Shared,
    service_path: &str,
    pod_template: &Value,
    version: (u32, u32),
) -> Vec<(String, Option<i64>)> {
    let service = api.lock().unwrap().objects[service_path].clone();
    let pod = &pod_template["spec"];
    let declared = |list: &str, name: &str, protocol: &str| {
        let containers = pod[list].as_array().into_iter().flatten();
        containers
            .filter(|c| list == "containers" || c["restartPolicy"] == "Always")
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .find(|p| p["name"] == name && p["protocol"].as_str().unwrap_or("TCP") == protocol)
            .and_then(|p| p["containerPort"].as_i64())
    };
    let ports = service["spec"]["ports"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ports
        .iter()
        .map(|port| {
            let protocol = port["protocol"].as_str().unwrap_or("TCP");
            let resolved = match &port["targetPort"] {
                Value::Number(n) => n.as_i64(),
                Value::String(name) => declared("containers", name, protocol).or_else(|| {
                    (version >= (1, 33))
                        .then(|| declared("initContainers", name, protocol))
                        .flatten()
                }),
                _ => port["port"].as_i64(),
            };
            let name = port["name"].as_str().unwrap_or_default().to_owned();
            (name, resolved)
        })
        .collect()
}

/// What the Pod Security Standards "restricted" profile refuses in `pod_spec`, by container
/// name (the pod-level findings under `""`): privileged containers, `allowPrivilegeEscalation`
/// not `false`, `capabilities.drop` without `ALL` or `capabilities.add` beyond
/// `NET_BIND_SERVICE`, `runAsNonRoot` not `true` (container or pod), `runAsUser: 0`, a
/// `seccompProfile.type` (container or pod) other than `RuntimeDefault` or `Localhost`; host
/// namespaces and `hostPath` volumes. Empty when the pod passes.
pub fn restricted_violations(pod_spec: &Value) -> BTreeMap<String, Vec<&'static str>> {
    let pod = &pod_spec["securityContext"];
    let mut found: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    let lists = ["initContainers", "containers", "ephemeralContainers"];
    for c in lists
        .iter()
        .flat_map(|l| pod_spec[*l].as_array().into_iter().flatten())
    {
        let sc = &c["securityContext"];
        let inherited = |field: &str| match &sc[field] {
            Value::Null => &pod[field],
            own => own,
        };
        let caps = |which: &str| -> BTreeSet<&str> {
            let listed = sc["capabilities"][which].as_array().into_iter().flatten();
            listed.filter_map(Value::as_str).collect()
        };
        let seccomp = inherited("seccompProfile")["type"].as_str();
        let checks = [
            (sc["privileged"] == true, "privileged"),
            (
                sc["allowPrivilegeEscalation"] != false,
                "allowPrivilegeEscalation is not false",
            ),
            (!caps("drop").contains("ALL"), "capabilities.drop lacks ALL"),
            (
                caps("add").iter().any(|c| *c != "NET_BIND_SERVICE"),
                "capabilities.add beyond NET_BIND_SERVICE",
            ),
            (
                *inherited("runAsNonRoot") != true,
                "runAsNonRoot is not true",
            ),
            (*inherited("runAsUser") == 0, "runAsUser is 0"),
            (
                !matches!(seccomp, Some("RuntimeDefault" | "Localhost")),
                "seccompProfile.type is not RuntimeDefault or Localhost",
            ),
        ];
        let name = c["name"].as_str().unwrap_or_default().to_owned();
        for (failed, what) in checks {
            if failed {
                found.entry(name.clone()).or_default().push(what);
            }
        }
    }
    let host = ["hostNetwork", "hostPID", "hostIPC"];
    if host.iter().any(|h| pod_spec[*h] == true) {
        found
            .entry(String::new())
            .or_default()
            .push("host namespaces");
    }
    let volumes = pod_spec["volumes"].as_array().into_iter().flatten();
    if volumes.into_iter().any(|v| v.get("hostPath").is_some()) {
        found
            .entry(String::new())
            .or_default()
            .push("hostPath volumes");
    }
    found
}

/// Deletes, as the garbage collector does, every object with owner references none of which
/// names a stored object (by uid); returns their paths.
pub fn collect_garbage(api: &Shared) -> Vec<String> {
    let orphans: Vec<String> = {
        let a = api.lock().unwrap();
        let uids: BTreeSet<&str> = a
            .objects
            .values()
            .filter_map(|o| o["metadata"]["uid"].as_str())
            .collect();
        a.objects
            .iter()
            .filter(|(_, o)| {
                let owners = o["metadata"]["ownerReferences"].as_array();
                owners.is_some_and(|refs| {
                    !refs.is_empty()
                        && refs
                            .iter()
                            .all(|r| !uids.contains(r["uid"].as_str().unwrap_or_default()))
                })
            })
            .map(|(path, _)| path.clone())
            .collect()
    };
    for path in &orphans {
        delete(api, path).unwrap_or_else(|status| panic!("collecting {path}: {status}"));
    }
    orphans
}

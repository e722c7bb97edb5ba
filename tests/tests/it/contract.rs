//! The contract between the operator and the sidecar: what the operator injects
//! into the example Deployment (`examples/k8s/`) is exactly what the sidecar reads — every
//! environment variable is one of its flags, the mounted ConfigMap and Secret are the files it
//! loads, its Kubernetes membership source watches the EndpointSlices of the peer Service, which
//! selects the target's pods (those the injection labelled) on the sidecar's ports, each pod
//! reports its revision, its listeners are the container ports and probes, and the Role grants
//! the watch and nothing of the Pods.

use std::collections::BTreeMap;
use std::path::Path;

use clap::{CommandFactory, Parser};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};
use tether_crds::McpEndpoint;
use tether_operator::names::{CONFIG_KEY, Names, SIDECAR_CONTAINER};
use tether_operator::plan::{Defaults, plan};
use tether_operator::validate::validate;
use tether_sidecar::Cli;
use tether_sidecar::{Config, MembershipConfig};
use tether_tests::repo::read;

const NAMESPACE: &str = "tools";
const POD_IP: &str = "10.1.2.3";
/// The pods' `pod-template-hash` label (the Deployment's ReplicaSet sets it).
const TEMPLATE_HASH: &str = "5d8f7c9b6";

fn example(name: &str) -> String {
    read(format!("examples/k8s/{name}"))
}

/// The value the kubelet gives a downward-API `fieldRef` in this test's pod, whose template
/// annotations are `annotations`.
fn field(path: &str, annotations: &Value) -> String {
    if let Some(key) = path
        .strip_prefix("metadata.annotations['")
        .and_then(|k| k.strip_suffix("']"))
    {
        return annotations[key]
            .as_str()
            .unwrap_or_else(|| panic!("the pods have no annotation {key}"))
            .to_owned();
    }
    match path {
        "status.podIP" => POD_IP.to_owned(),
        "metadata.uid" => "3f0c8a52-pod-uid".to_owned(),
        "metadata.namespace" => NAMESPACE.to_owned(),
        "metadata.labels['pod-template-hash']" => TEMPLATE_HASH.to_owned(),
        other => panic!("the operator uses fieldRef {other}, which this contract does not know"),
    }
}

/// The value the kubelet gives a downward-API `resourceFieldRef` of `container`: its memory
/// limit in bytes (a quantity such as `256Mi`).
fn resource(reference: &Value, container: &Value) -> String {
    assert_eq!(reference["resource"], "limits.memory", "{reference}");
    assert_eq!(reference["containerName"], container["name"]);
    let limit = container["resources"]["limits"]["memory"]
        .as_str()
        .expect("the sidecar has a memory limit");
    let (digits, unit) = limit.split_at(
        limit
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(limit.len()),
    );
    let scale: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => panic!("a memory limit in {other}, which this contract does not know"),
    };
    (digits.parse::<u64>().unwrap() * scale).to_string()
}

/// The sidecar's command line for the injected `container`'s environment: each variable
/// becomes the flag that reads it; every variable must be one.
fn argv(container: &Value, annotations: &Value) -> Vec<String> {
    let command = Cli::command();
    let mut args = vec!["tether-sidecar".to_owned()];
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap();
        let from = &var["valueFrom"];
        let value = match var["value"].as_str() {
            Some(v) => v.to_owned(),
            None if from.get("resourceFieldRef").is_some() => {
                resource(&from["resourceFieldRef"], container)
            }
            None => field(from["fieldRef"]["fieldPath"].as_str().unwrap(), annotations),
        };
        let flag = command
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == name))
            .and_then(|a| a.get_long())
            .unwrap_or_else(|| panic!("the operator sets {name}, which no sidecar flag reads"));
        args.push(format!("--{flag}={value}"));
    }
    args
}

#[test]
fn what_the_operator_injects_is_what_the_sidecar_reads() {
    let deployment: Deployment = yaml_serde::from_str(&example("deployment.yaml")).unwrap();
    let mut ep: McpEndpoint =
        tether_crds::parse_manifest(&example("mcpendpoint-full.yaml")).unwrap();
    ep.metadata.namespace = Some(NAMESPACE.into());
    ep.metadata.uid = Some("endpoint-uid".into());
    let names = Names::of(&ep).unwrap();
    let target = validate(&ep, &names, &deployment).unwrap();
    let owner = OwnerReference::default();
    let plan = plan(
        &ep,
        &names,
        &target,
        &Defaults::with_image("sidecar:test"),
        &owner,
        &names.secret(),
    );
    let pod = &plan.injection["spec"]["template"]["spec"];
    let sidecar = pod["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == SIDECAR_CONTAINER)
        .unwrap();

    // The environment parses as the sidecar's flags.
    let annotations = &plan.injection["spec"]["template"]["metadata"]["annotations"];
    let cli = Cli::try_parse_from(argv(sidecar, annotations))
        .unwrap_or_else(|e| panic!("the sidecar refuses the injected environment: {e}"));
    // Its byte budget follows the container's memory limit: half of it.
    let limit: u64 = resource(
        &json!({"resource": "limits.memory", "containerName": SIDECAR_CONTAINER}),
        sidecar,
    )
    .parse()
    .unwrap();
    assert_eq!(cli.memory_limit, Some(limit));

    // The files it loads are where the volumes are mounted, under the keys the operator writes.
    let mount_of = |volume_key: &str, source: &str| -> String {
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v.get(volume_key).is_some())
            .unwrap_or_else(|| panic!("no {volume_key} volume"));
        assert_eq!(volume[volume_key][source_name(volume_key)], source);
        let mount = sidecar["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume["name"])
            .unwrap();
        mount["mountPath"].as_str().unwrap().to_owned()
    };
    let config_dir = mount_of("configMap", &names.config());
    let secret_dir = mount_of("secret", &names.secret());
    assert_eq!(cli.endpoint, Path::new(&config_dir).join(CONFIG_KEY));
    assert_eq!(cli.secret_dir.as_deref(), Some(Path::new(&secret_dir)));
    assert_eq!(cli.secret_file, None);
    // The key ring the operator writes is one the sidecar loads, whole.
    let generation = tether_crds::keyring::Generation::new("default/test").unwrap();
    let secret = tether_operator::plan::keys::secret(&names, &owner, &generation);
    assert_eq!(secret.metadata.name, Some(names.secret()));
    let ring_dir = tempfile::tempdir().unwrap();
    for (key, value) in secret.data.unwrap() {
        std::fs::write(ring_dir.path().join(key), value.0).unwrap();
    }
    let manifest = plan.config_map.data.as_ref().unwrap()[CONFIG_KEY].clone();

    // The membership watch's in-cluster client finds a token, the cluster CA and the namespace
    // where Kubernetes clients look, from a volume of the sidecar's own (so it works with
    // `automountServiceAccountToken: false`).
    let token = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v.get("projected").is_some())
        .expect("a projected token volume");
    let files: Vec<&str> = token["projected"]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| {
            let single = s["serviceAccountToken"]["path"].as_str();
            let items = s.as_object().unwrap().values().flat_map(|v| {
                v["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|i| i["path"].as_str())
            });
            single.into_iter().chain(items)
        })
        .collect();
    assert_eq!(files, ["token", "ca.crt", "namespace"]);
    let token_mount = sidecar["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == token["name"])
        .expect("the sidecar mounts the token");
    assert_eq!(
        token_mount["mountPath"],
        "/var/run/secrets/kubernetes.io/serviceaccount"
    );

    // With those files in place the sidecar starts with the endpoint's settings and watches
    // the target's pods in the endpoint's namespace.
    let dir = tempfile::tempdir().unwrap();
    let mut local = cli.clone();
    local.endpoint = dir.path().join(CONFIG_KEY);
    local.secret_dir = Some(ring_dir.path().to_owned());
    std::fs::write(&local.endpoint, &manifest).unwrap();
    let cfg = Config::load(&local).unwrap_or_else(|e| panic!("the sidecar cannot start: {e}"));
    assert_eq!(cfg.source.started_with, ep.spec);
    assert!(
        cli.pod_settings.is_some(),
        "the pod's own settings come from its annotation"
    );
    // A sidecar restarted in this pod after the ConfigMap moved on keeps the pod's settings.
    let mut moved = ep.clone();
    moved.spec.listen.port += 1;
    moved.spec.drain.timeout = "17s".parse().unwrap();
    let names_moved = Names::of(&moved).unwrap();
    let newer = tether_operator::plan::config::manifest(&moved, &names_moved);
    std::fs::write(&local.endpoint, newer).unwrap();
    let restarted = Config::load(&local).unwrap();
    assert_eq!(
        restarted.source.started_with.pod_settings(),
        ep.spec.pod_settings()
    );
    assert_eq!(restarted.listen_addr, cfg.listen_addr);
    std::fs::write(&local.endpoint, &manifest).unwrap();
    let MembershipConfig::Kubernetes { namespace, service } = &cfg.membership else {
        panic!("the injected sidecar must use the Kubernetes membership source")
    };
    assert_eq!(namespace, NAMESPACE);
    // It watches the peer Service, which selects the target Deployment's pods that the
    // injection labelled for this endpoint: the labels the pods carry once injected.
    let peers = &plan.services[1];
    assert_eq!(peers.metadata.name.as_ref(), Some(service));
    let mut pod_labels = deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    let injected: BTreeMap<String, String> =
        serde_json::from_value(plan.injection["spec"]["template"]["metadata"]["labels"].clone())
            .unwrap();
    pod_labels.extend(injected);
    let selector = peers.spec.as_ref().unwrap().selector.clone().unwrap();
    assert!(
        selector.len() > 1,
        "the Deployment's labels and the endpoint's"
    );
    for (k, v) in &selector {
        assert_eq!(pod_labels.get(k), Some(v), "the pods lack {k}={v}");
    }
    let match_labels = deployment
        .spec
        .as_ref()
        .unwrap()
        .selector
        .match_labels
        .clone();
    for (k, v) in match_labels.unwrap() {
        assert_eq!(
            selector.get(&k),
            Some(&v),
            "the Service selects less than the Deployment"
        );
    }
    // Each pod reports its revision to its peers.
    assert_eq!(cli.revision.as_deref(), Some(TEMPLATE_HASH));

    // Its listeners are the container ports, the probes and the drain hook's port.
    let port = |name: &str| {
        sidecar["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["containerPort"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(port("tether-mcp"), u64::from(cfg.listen_addr.port()));
    assert_eq!(port("tether-admin"), u64::from(cfg.admin_addr.port()));
    assert_eq!(port("tether-peer"), u64::from(cfg.peer_addr.port()));
    assert_eq!(cfg.listen_addr.ip().to_string(), POD_IP);
    let server = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == target.upstream_container)
        .expect("the injection carries the MCP server's preStop");
    for probe in [
        &sidecar["readinessProbe"],
        &sidecar["livenessProbe"],
        &server["lifecycle"]["preStop"],
    ] {
        assert_eq!(
            probe["httpGet"]["port"].as_u64(),
            Some(u64::from(cfg.admin_addr.port()))
        );
    }
    // The MCP server's preStop only waits for the drain; the sidecar's starts it through the
    // drain socket, which its environment names, in a volume only the sidecar mounts.
    assert_eq!(
        server["lifecycle"]["preStop"]["httpGet"]["path"],
        "/drained"
    );
    let command: Vec<&str> = sidecar["lifecycle"]["preStop"]["exec"]["command"]
        .as_array()
        .expect("an exec preStop on the sidecar")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let [binary, subcommand] = command[..] else {
        panic!("{command:?}")
    };
    assert_eq!(subcommand, "drain");
    let image = read("images/sidecar.Dockerfile");
    assert!(
        image.contains(&format!("ENTRYPOINT [\"{binary}\"]")),
        "the sidecar image has its binary at {binary}"
    );
    let drain_env: Vec<(String, String)> = sidecar["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| {
            Some((
                v["name"].as_str()?.to_owned(),
                v["value"].as_str()?.to_owned(),
            ))
        })
        .collect();
    let socket = drain_env
        .iter()
        .find(|(name, _)| name == "TETHER_DRAIN_SOCKET")
        .map(|(_, value)| Path::new(value).to_owned())
        .expect("the drain subcommand reads the socket from the container's environment");
    let drain = tether_sidecar::DrainCli::try_parse_from([
        "drain",
        "--drain-socket",
        socket.to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(
        drain.drain_socket, cli.drain_socket,
        "both ends use one socket"
    );
    let run_mount = sidecar["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| socket.starts_with(m["mountPath"].as_str().unwrap()))
        .expect("the socket's directory is a volume of the sidecar");
    assert!(
        run_mount["readOnly"] != true,
        "the sidecar creates the socket there"
    );
    let users_template = serde_json::to_value(&deployment).unwrap();
    let containers = [&users_template["spec"]["template"]["spec"], pod]
        .into_iter()
        .flat_map(|spec| spec["containers"].as_array().into_iter().flatten());
    assert!(
        containers
            .flat_map(|c| c["volumeMounts"].as_array().into_iter().flatten())
            .all(|m| m["name"] != run_mount["name"]),
        "no other container mounts the drain socket's volume"
    );

    // Peers find each other's listeners on the peer Service's ports (the EndpointSlices name
    // them), which are the sidecar's.
    let service_port = |name: &str| {
        let ports = peers.spec.as_ref().unwrap().ports.as_ref().unwrap();
        let port = ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("the peer Service has no port {name}"));
        assert_eq!(
            port.target_port,
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port.port))
        );
        u16::try_from(port.port).unwrap()
    };
    assert_eq!(
        service_port(tether_crds::MCP_PORT_NAME),
        cfg.listen_addr.port()
    );
    assert_eq!(
        service_port(tether_crds::PEER_PORT_NAME),
        cfg.peer_addr.port()
    );

    // The Role lets the pods' ServiceAccount watch the EndpointSlices, and read no Pod.
    let rules = plan.role.rules.clone().unwrap();
    assert!(rules.iter().any(|r| {
        r.api_groups.as_deref() == Some(&["discovery.k8s.io".to_owned()])
            && r.resources
                .as_ref()
                .is_some_and(|x| x.contains(&"endpointslices".into()))
            && ["list", "watch"]
                .iter()
                .all(|v| r.verbs.contains(&(*v).to_owned()))
    }));
    assert!(
        rules
            .iter()
            .flat_map(|r| r.resources.iter().flatten())
            .all(|r| r != "pods"),
        "the sidecar reads no pod spec: {rules:?}"
    );
}

/// The field of a volume source naming its object.
fn source_name(volume_key: &str) -> &'static str {
    match volume_key {
        "configMap" => "name",
        _ => "secretName",
    }
}

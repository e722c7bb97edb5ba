//! The endpoints of the peer Service, read from its EndpointSlices
//! (`docs/design/routing.md#kubernetes-endpointslice-watch`).
//!
//! [`SliceSet`] keeps the slices a kube-runtime watcher reported, by slice name; a relist
//! (`Init` … `InitDone`) replaces them all. [`SliceSet::endpoints`] merges them into one
//! [`Endpoint`] per pod (by `targetRef.uid`): a pod listed by two slices at once (the
//! EndpointSlice controller moves it from one to the other) gets the more cautious view of the
//! two — terminating when either says so, serving only when both do.
//!
//! Only slices of this pod's address family are read (`addressType` `IPv4` or `IPv6`, like
//! `--pod-ip`): a dual-stack Service has a slice per family, and sidecars listen on their pod's
//! primary IP.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::{self as discovery, EndpointSlice};
use kube::ResourceExt;
use kube::runtime::watcher::Event;
use tether_crds::{MCP_PORT_NAME, PEER_PORT_NAME};

use super::PeerState;

/// One pod of the peer Service, as its EndpointSlices describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// The pod's UID (`targetRef.uid`).
    pub(crate) uid: String,
    /// The pod's name (`targetRef.name`; the UID when it has none).
    pub(crate) name: String,
    /// The pod's IP (the endpoint's first address).
    pub(crate) ip: IpAddr,
    /// The slice's port named `mcp`: the Service's MCP port.
    pub(crate) mcp_port: Option<u16>,
    /// The slice's port named `tether-peer`: the Service's peer port.
    pub(crate) peer_port: Option<u16>,
    /// Condition `serving`: the pod is Ready (`ready` when `serving` is absent, and true when
    /// both are: the API's reading of an unknown state).
    pub(crate) serving: bool,
    /// Condition `terminating`: the pod is being deleted.
    pub(crate) terminating: bool,
}

impl Endpoint {
    /// The membership state the conditions give (first matching rule): terminating →
    /// [`PeerState::Draining`]; serving → [`PeerState::Routable`]; otherwise
    /// [`PeerState::Draining`] (starting, or not ready). `ready` is no signal of its own: the
    /// peer Service publishes not-ready addresses, so it is true for every endpoint.
    pub(crate) fn state(&self) -> PeerState {
        if !self.terminating && self.serving {
            PeerState::Routable
        } else {
            PeerState::Draining
        }
    }

    /// `self` and `other`, the same pod in two slices, merged cautiously.
    fn merge(mut self, other: &Self) -> Self {
        self.serving &= other.serving;
        self.terminating |= other.terminating;
        self
    }
}

/// The `addressType` of the slices read by a pod whose IP is `ip`.
pub(crate) fn address_type(ip: IpAddr) -> &'static str {
    if ip.is_ipv6() { "IPv6" } else { "IPv4" }
}

/// The endpoints of `slice`: those naming a pod (`targetRef` of kind `Pod` with a UID) with a
/// parseable address. Others (a hand-made endpoint, one without an address yet) cannot be
/// peers.
pub(crate) fn endpoints_of(slice: &EndpointSlice) -> Vec<Endpoint> {
    let port = |name: &str| {
        slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.port?).ok())
            .filter(|p| *p != 0)
    };
    let (mcp_port, peer_port) = (port(MCP_PORT_NAME), port(PEER_PORT_NAME));
    slice
        .endpoints
        .iter()
        .filter_map(|endpoint| {
            let target = endpoint
                .target_ref
                .as_ref()
                .filter(|t| t.kind.as_deref() == Some("Pod"))?;
            let uid = target.uid.as_deref().filter(|u| !u.is_empty())?;
            let ip: IpAddr = endpoint.addresses.first()?.parse().ok()?;
            let conditions = endpoint.conditions.clone().unwrap_or_default();
            Some(Endpoint {
                uid: uid.to_owned(),
                name: target.name.clone().unwrap_or_else(|| uid.to_owned()),
                ip,
                mcp_port,
                peer_port,
                serving: serving(&conditions),
                terminating: conditions.terminating == Some(true),
            })
        })
        .collect()
}

fn serving(conditions: &discovery::EndpointConditions) -> bool {
    conditions.serving.or(conditions.ready).unwrap_or(true)
}

/// The EndpointSlices the watcher has reported (of one address family), by name, with the
/// relist in progress.
#[derive(Debug)]
pub(crate) struct SliceSet {
    address_type: &'static str,
    live: BTreeMap<String, Vec<Endpoint>>,
    /// Slices of the list in progress (`Init` … `InitDone`); replaces `live` on `InitDone`.
    relist: Option<BTreeMap<String, Vec<Endpoint>>>,
    /// A first complete list arrived.
    pub(crate) listed: bool,
}

impl SliceSet {
    /// No slice yet; slices whose `addressType` is not `address_type` are ignored.
    pub(crate) fn new(address_type: &'static str) -> Self {
        Self {
            address_type,
            live: BTreeMap::new(),
            relist: None,
            listed: false,
        }
    }

    /// Applies one watcher event; returns whether the endpoints may have changed.
    pub(crate) fn apply(&mut self, event: Event<EndpointSlice>) -> bool {
        match event {
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            Event::InitApply(slice) => {
                let (name, endpoints) = self.read(&slice);
                self.relist
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name, endpoints);
                false
            }
            Event::InitDone => {
                self.live = self.relist.take().unwrap_or_default();
                self.listed = true;
                true
            }
            Event::Apply(slice) => {
                let (name, endpoints) = self.read(&slice);
                self.live.insert(name, endpoints);
                true
            }
            Event::Delete(slice) => self.live.remove(&slice.name_any()).is_some(),
        }
    }

    /// The slice's name and endpoints (none for another address family).
    fn read(&self, slice: &EndpointSlice) -> (String, Vec<Endpoint>) {
        let endpoints = if slice.address_type == self.address_type {
            endpoints_of(slice)
        } else {
            Vec::new()
        };
        (slice.name_any(), endpoints)
    }

    /// Every pod of the live slices, once each (merged across slices), by UID.
    pub(crate) fn endpoints(&self) -> HashMap<&str, Endpoint> {
        let mut merged: HashMap<&str, Endpoint> = HashMap::new();
        for endpoint in self.live.values().flatten() {
            match merged.get_mut(endpoint.uid.as_str()) {
                Some(seen) => *seen = seen.clone().merge(endpoint),
                None => {
                    merged.insert(&endpoint.uid, endpoint.clone());
                }
            }
        }
        merged
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use serde_json::{Value, json};

    /// An endpoint of a slice as JSON: pod `name` (UID `uid-<name>`) on `10.0.0.<ip>` with the
    /// conditions `serving` and `terminating` (`ready` always true: the peer Service publishes
    /// not-ready addresses).
    pub(crate) fn endpoint_json(name: &str, ip: u8, serving: bool, terminating: bool) -> Value {
        json!({
            "addresses": [format!("10.0.0.{ip}")],
            "conditions": {"ready": true, "serving": serving, "terminating": terminating},
            "targetRef": {"kind": "Pod", "namespace": "ns", "name": name, "uid": format!("uid-{name}")},
        })
    }

    /// Slice `name` of the peer Service with `endpoints`, ports `mcp` 8080 and `tether-peer`
    /// 9090.
    pub(crate) fn slice_json(name: &str, endpoints: Vec<Value>) -> Value {
        json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": name,
                "namespace": "ns",
                "resourceVersion": "1",
                "labels": {"kubernetes.io/service-name": "weather-peers"},
            },
            "addressType": "IPv4",
            "ports": [
                {"name": PEER_PORT_NAME, "port": 9090, "protocol": "TCP"},
                {"name": MCP_PORT_NAME, "port": 8080, "protocol": "TCP"},
            ],
            "endpoints": endpoints,
        })
    }

    pub(crate) fn slice(name: &str, endpoints: Vec<Value>) -> EndpointSlice {
        serde_json::from_value(slice_json(name, endpoints)).unwrap()
    }

    fn state(serving: bool, terminating: bool) -> PeerState {
        endpoints_of(&slice(
            "s",
            vec![endpoint_json("a", 1, serving, terminating)],
        ))[0]
            .state()
    }

    #[test]
    fn conditions_map_to_states() {
        assert_eq!(state(true, false), PeerState::Routable, "Ready");
        assert_eq!(
            state(false, false),
            PeerState::Draining,
            "starting or not ready"
        );
        assert_eq!(
            state(true, true),
            PeerState::Draining,
            "terminating, still ready"
        );
        assert_eq!(state(false, true), PeerState::Draining, "terminating");
        let conditions = |c: Value| {
            let mut e = endpoint_json("a", 1, true, false);
            e["conditions"] = c;
            endpoints_of(&slice("s", vec![e]))[0].state()
        };
        assert_eq!(conditions(json!({})), PeerState::Routable, "unknown: ready");
        assert_eq!(conditions(json!({"ready": false})), PeerState::Draining);
        assert_eq!(conditions(json!({"ready": true})), PeerState::Routable);
        assert_eq!(
            conditions(json!({"ready": true, "serving": false})),
            PeerState::Draining,
            "ready is set for every endpoint of a Service publishing not-ready addresses"
        );
    }

    #[test]
    fn an_endpoint_names_its_pod_address_and_the_slices_ports() {
        let endpoints = endpoints_of(&slice("s", vec![endpoint_json("a", 1, true, false)]));
        assert_eq!(
            endpoints,
            [Endpoint {
                uid: "uid-a".into(),
                name: "a".into(),
                ip: "10.0.0.1".parse().unwrap(),
                mcp_port: Some(8080),
                peer_port: Some(9090),
                serving: true,
                terminating: false,
            }]
        );
        let mut unnamed = slice_json("s", vec![endpoint_json("a", 1, true, false)]);
        unnamed["ports"] = json!([{"port": 8080}]);
        let e = &endpoints_of(&serde_json::from_value(unnamed).unwrap())[0];
        assert_eq!((e.mcp_port, e.peer_port), (None, None));
    }

    #[test]
    fn endpoints_without_a_pod_or_an_address_are_left_out_as_are_other_kinds() {
        let mut no_target = endpoint_json("a", 1, true, false);
        no_target["targetRef"] = Value::Null;
        let mut no_uid = endpoint_json("b", 2, true, false);
        no_uid["targetRef"]["uid"] = json!("");
        let mut no_address = endpoint_json("c", 3, true, false);
        no_address["addresses"] = json!([]);
        let mut bad_address = endpoint_json("d", 4, true, false);
        bad_address["addresses"] = json!(["pod.example"]);
        let mut not_a_pod = endpoint_json("f", 6, true, false);
        not_a_pod["targetRef"]["kind"] = json!("Node");
        let mut no_kind = endpoint_json("g", 7, true, false);
        no_kind["targetRef"]["kind"] = Value::Null;
        let kept = endpoint_json("e", 5, true, false);
        let endpoints = endpoints_of(&slice(
            "s",
            vec![
                no_target,
                no_uid,
                no_address,
                bad_address,
                not_a_pod,
                no_kind,
                kept,
            ],
        ));
        let names: Vec<_> = endpoints.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["e"]);
    }

    #[test]
    fn slices_merge_cautiously_and_a_relist_replaces_them() {
        let mut set = SliceSet::new("IPv4");
        assert!(set.apply(Event::Apply(slice(
            "one",
            vec![
                endpoint_json("a", 1, true, false),
                endpoint_json("b", 2, true, false)
            ]
        ))));
        // `b` moves to slice `two`, which says it started terminating, before `one` drops it.
        assert!(set.apply(Event::Apply(slice(
            "two",
            vec![
                endpoint_json("b", 2, true, true),
                endpoint_json("c", 3, false, false)
            ]
        ))));
        let endpoints = set.endpoints();
        let states: BTreeMap<_, _> = endpoints.iter().map(|(u, e)| (*u, e.state())).collect();
        assert_eq!(
            states,
            BTreeMap::from([
                ("uid-a", PeerState::Routable),
                ("uid-b", PeerState::Draining),
                ("uid-c", PeerState::Draining),
            ])
        );
        // A slice of the other family is not read.
        let mut v6 = slice_json("v6", vec![endpoint_json("d", 4, true, false)]);
        v6["addressType"] = json!("IPv6");
        v6["endpoints"][0]["addresses"] = json!(["fd00::4"]);
        assert!(set.apply(Event::Apply(serde_json::from_value(v6).unwrap())));
        assert_eq!(set.endpoints().len(), 3);

        assert!(!set.apply(Event::Init));
        assert!(!set.apply(Event::InitApply(slice(
            "three",
            vec![endpoint_json("e", 5, true, false)]
        ))));
        assert_eq!(
            set.endpoints().len(),
            3,
            "the old set serves until InitDone"
        );
        assert!(set.apply(Event::InitDone));
        assert!(set.listed);
        let uids: Vec<_> = set.endpoints().into_keys().collect();
        assert_eq!(uids, ["uid-e"]);
        assert!(set.apply(Event::Delete(slice("three", vec![]))));
        assert!(!set.apply(Event::Delete(slice("three", vec![]))));
        assert!(set.endpoints().is_empty());
    }
}

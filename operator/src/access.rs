//! The API access the operator needs, as RBAC rules: the one source of the Helm chart's
//! ClusterRole and leader-election Role (a test compares `charts/tether/templates/`) and of the
//! tests' in-memory API server, which answers 403 to any request these rules do not allow — so
//! an API call added without its rule fails the tests, as it would fail in a cluster.
//!
//! `create` accompanies `patch` for the kinds the operator server-side applies: an apply that
//! creates the object needs both. The operator holds `pods: get, list, watch` itself, which
//! also lets it grant them in the sidecar's Role (RBAC refuses to grant what one does not hold).

use k8s_openapi::api::rbac::v1::PolicyRule;

/// One RBAC rule: `verbs` on `resources` (`kind` plural, `kind/subresource`) of API `group`
/// (`""`: the core group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// The API group.
    pub group: &'static str,
    /// Resources (plural names, subresources as `name/sub`).
    pub resources: &'static [&'static str],
    /// Verbs (`get`, `list`, `watch`, `create`, `patch`, `delete`).
    pub verbs: &'static [&'static str],
}

const READ: &[&str] = &["get", "list", "watch"];
const APPLY: &[&str] = &["get", "list", "watch", "create", "patch"];
const APPLY_DELETE: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];

/// Cluster-wide rules (a ClusterRole): the endpoints, their targets and every child.
pub const CLUSTER: &[Access] = &[
    Access {
        group: "mcp.tether.dev",
        resources: &["mcpendpoints"],
        verbs: &["get", "list", "watch", "patch"],
    },
    Access {
        group: "mcp.tether.dev",
        resources: &["mcpendpoints/status"],
        verbs: &["patch"],
    },
    Access {
        group: "apps",
        resources: &["deployments"],
        verbs: &["get", "list", "watch", "patch"],
    },
    Access {
        group: "",
        resources: &["pods"],
        verbs: READ,
    },
    Access {
        group: "",
        resources: &["configmaps", "services"],
        verbs: APPLY,
    },
    Access {
        group: "",
        resources: &["serviceaccounts"],
        verbs: APPLY_DELETE,
    },
    // Only Secrets of the names the operator gives them are read (no list, no watch: the
    // operator never sees the namespace's other Secrets); `patch` takes a rotation's steps.
    Access {
        group: "",
        resources: &["secrets"],
        verbs: &["get", "create", "patch"],
    },
    Access {
        group: "rbac.authorization.k8s.io",
        resources: &["roles", "rolebindings"],
        verbs: APPLY,
    },
    Access {
        group: "policy",
        resources: &["poddisruptionbudgets"],
        verbs: APPLY_DELETE,
    },
    Access {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
    },
];

/// Rules in the operator's own namespace (a Role): the leader-election Lease.
pub const LEADER_ELECTION: &[Access] = &[Access {
    group: "coordination.k8s.io",
    resources: &["leases"],
    verbs: &["get", "create", "patch"],
}];

/// Whether `rules` allow `verb` on `resource` of `group`.
pub fn allows(rules: &[Access], group: &str, resource: &str, verb: &str) -> bool {
    rules
        .iter()
        .any(|r| r.group == group && r.resources.contains(&resource) && r.verbs.contains(&verb))
}

/// `rules` as Kubernetes `PolicyRule`s, in order.
pub fn policy_rules(rules: &[Access]) -> Vec<PolicyRule> {
    let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    rules
        .iter()
        .map(|r| PolicyRule {
            api_groups: Some(vec![r.group.to_owned()]),
            resources: Some(strings(r.resources)),
            verbs: strings(r.verbs),
            ..PolicyRule::default()
        })
        .collect()
}

/// The RBAC request attributes of an API request: `(group, resource, verb)` from its method,
/// path and query (`/api/v1/…` is the core group; a subresource gives `resource/sub`; a GET of
/// a collection is `list`, or `watch` with `watch=true`). `None` for paths that are not
/// resource requests (discovery, `/version`).
pub fn request_attributes(
    method: &http::Method,
    path: &str,
    query: &str,
) -> Option<(String, String, &'static str)> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        rest => rest,
    };
    let (resource, named) = match rest {
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => return None,
    };
    let watching = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match *method {
        http::Method::GET if watching => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PATCH => "patch",
        http::Method::PUT => "update",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => return None,
    };
    Some((group.to_owned(), resource, verb))
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;

    #[test]
    fn requests_map_to_rbac_attributes() {
        let attrs = |m: &Method, p: &str, q: &str| {
            request_attributes(m, p, q).map(|(g, r, v)| format!("{g}|{r}|{v}"))
        };
        let cases = [
            (
                Method::GET,
                "/api/v1/namespaces/t/pods",
                "",
                Some("|pods|list"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/t/pods",
                "watch=true&x=1",
                Some("|pods|watch"),
            ),
            (Method::GET, "/api/v1/pods", "", Some("|pods|list")),
            (
                Method::GET,
                "/api/v1/namespaces/t/secrets/s",
                "",
                Some("|secrets|get"),
            ),
            (
                Method::PATCH,
                "/apis/mcp.tether.dev/v1alpha1/namespaces/t/mcpendpoints/w/status",
                "",
                Some("mcp.tether.dev|mcpendpoints/status|patch"),
            ),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/t/events",
                "",
                Some("events.k8s.io|events|create"),
            ),
            (
                Method::DELETE,
                "/apis/policy/v1/namespaces/t/poddisruptionbudgets/p",
                "",
                Some("policy|poddisruptionbudgets|delete"),
            ),
            (Method::GET, "/version", "", None),
        ];
        for (method, path, query, expected) in cases {
            assert_eq!(
                attrs(&method, path, query).as_deref(),
                expected,
                "{method} {path}"
            );
        }
    }

    #[test]
    fn the_rules_allow_what_they_list_and_nothing_else() {
        assert!(allows(CLUSTER, "", "secrets", "create"));
        assert!(
            allows(CLUSTER, "", "secrets", "patch"),
            "a rotation patches the key ring"
        );
        for verb in ["list", "watch", "update", "delete"] {
            assert!(
                !allows(CLUSTER, "", "secrets", verb),
                "{verb}: only the endpoint's own Secrets, by name, and none deleted"
            );
        }
        assert!(!allows(CLUSTER, "apps", "deployments", "delete"));
        assert!(allows(
            LEADER_ELECTION,
            "coordination.k8s.io",
            "leases",
            "patch"
        ));
        assert!(!allows(CLUSTER, "coordination.k8s.io", "leases", "get"));
        let rules = policy_rules(CLUSTER);
        assert_eq!(rules.len(), CLUSTER.len());
        assert_eq!(
            rules[0].api_groups.as_deref(),
            Some(&["mcp.tether.dev".to_owned()][..])
        );
    }
}

//! The API access the operator needs, as RBAC rules: the one source of the Helm chart's
//! ClusterRole (or, with `watchNamespaces`, of its Role in each watched namespace) and
//! leader-election Role (a test compares `charts/tether/templates/`), of the sidecars' Role
//! ([`SIDECAR`]), of the tables of `docs/design/security-model.md` ([`markdown_table`]) and of
//! the tests' in-memory API server,
//! which answers 403 to any request these rules do not allow where they are granted
//! ([`Grant`]) — so an API call added without its rule fails the tests, as it would fail in a
//! cluster.
//!
//! `create` accompanies `patch` for the kinds the operator server-side applies: an apply that
//! creates the object needs both. The operator holds `endpointslices: get, list, watch` itself,
//! which lets it grant them in the sidecar's Role (RBAC refuses to grant what one does not hold).

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

/// What a reconcile needs in an endpoint's namespace: the endpoints, their targets, every child
/// and the namespace's labels (its opt-in). Granted by a ClusterRole in every namespace, or by
/// a Role in each namespace of `--watch-namespaces`.
pub const RECONCILE: &[Access] = &[
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
    // Listed only (by the target's selector or the injection's label): the pods' reports
    // during a rotation, the retirement of the dedicated ServiceAccount, the finalizer's wait.
    Access {
        group: "",
        resources: &["pods"],
        verbs: &["list"],
    },
    // Granted on to the sidecars' Role (their membership reads the peer Service's slices).
    Access {
        group: "discovery.k8s.io",
        resources: &["endpointslices"],
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
    // The namespace's own object, for its opt-in label: a Role in a namespace grants `get` of
    // that namespace (the API server takes a Namespace's name as the request's namespace).
    Access {
        group: "",
        resources: &["namespaces"],
        verbs: &["get"],
    },
];

/// The sidecars' Role in an endpoint's namespace, bound to its pods' ServiceAccount: the peer
/// Service's EndpointSlices (membership), and nothing of any pod's spec. The operator holds
/// these rules itself ([`RECONCILE`]): RBAC refuses to grant what one does not hold.
pub const SIDECAR: &[Access] = &[Access {
    group: "discovery.k8s.io",
    resources: &["endpointslices"],
    verbs: READ,
}];

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

/// Where [`RECONCILE`] is granted: cluster-wide (a ClusterRole and its binding) or in each of
/// some namespaces (a Role and RoleBinding in each: `--watch-namespaces`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Grant {
    /// Every namespace, and requests that name none (a list of every namespace's objects).
    #[default]
    Cluster,
    /// Only requests inside these namespaces.
    Namespaces(Vec<String>),
}

impl Grant {
    /// Whether a request with `attributes` is allowed by `rules` granted here.
    pub fn allows(&self, rules: &[Access], attributes: &Attributes) -> bool {
        let inside = match (self, &attributes.namespace) {
            (Self::Cluster, _) => true,
            (Self::Namespaces(granted), Some(ns)) => granted.contains(ns),
            (Self::Namespaces(_), None) => false,
        };
        inside
            && allows(
                rules,
                &attributes.group,
                &attributes.resource,
                attributes.verb,
            )
    }
}

/// The RBAC attributes of an API request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    /// The API group (`""`: the core group).
    pub group: String,
    /// The resource, `resource/subresource` for a subresource.
    pub resource: String,
    /// The verb.
    pub verb: &'static str,
    /// The namespace the request is in: the path's, or a Namespace's own name; `None` for a
    /// request across namespaces.
    pub namespace: Option<String>,
}

/// A Markdown table of `rules`: API group, resources, verbs, one row each.
pub fn markdown_table(rules: &[Access]) -> String {
    let mut out = String::from("| API group | resources | verbs |\n|---|---|---|\n");
    for rule in rules {
        let group = if rule.group.is_empty() {
            "`\"\"` (core)".to_owned()
        } else {
            format!("`{}`", rule.group)
        };
        let list = |items: &[&str]| {
            items
                .iter()
                .map(|i| format!("`{i}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push_str(&format!(
            "| {group} | {} | {} |\n",
            list(rule.resources),
            list(rule.verbs)
        ));
    }
    out
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

/// The RBAC [`Attributes`] of an API request, from its method, path and query (`/api/v1/…` is
/// the core group; a subresource gives `resource/sub`; a GET of a collection is `list`, or
/// `watch` with `watch=true`; `/api/v1/namespaces/NS` is in namespace `NS`, as the API server
/// reads it). `None` for paths that are not resource requests (discovery, `/version`).
pub fn request_attributes(method: &http::Method, path: &str, query: &str) -> Option<Attributes> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(*ns), rest),
        ["namespaces", ns] => (Some(*ns), rest),
        rest => (None, rest),
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
    Some(Attributes {
        group: group.to_owned(),
        resource,
        verb,
        namespace: namespace.map(str::to_owned),
    })
}

/// The page that shows the rules, and its generated tables: `<!-- rbac:NAME -->` … `<!--
/// /rbac:NAME -->` around each.
pub const SECURITY_MODEL: &str = "docs/design/security-model.md";

/// The generated tables of [`SECURITY_MODEL`], by marker name.
pub fn documented_tables() -> [(&'static str, &'static [Access]); 3] {
    [
        ("reconcile", RECONCILE),
        ("leader-election", LEADER_ELECTION),
        ("sidecar", SIDECAR),
    ]
}

/// `page` with the table between each pair of markers of [`documented_tables`] replaced by the
/// one the rules give now; `None` when a marker is missing.
pub fn with_tables(page: &str) -> Option<String> {
    let mut out = page.to_owned();
    for (name, rules) in documented_tables() {
        let open = format!("<!-- rbac:{name} -->\n");
        let close = format!("<!-- /rbac:{name} -->");
        let start = out.find(&open)? + open.len();
        let end = start + out[start..].find(&close)?;
        out.replace_range(start..end, &markdown_table(rules));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;

    #[test]
    fn the_security_models_rbac_tables_are_the_rules() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let page = std::fs::read_to_string(root.join(SECURITY_MODEL)).unwrap();
        let current = with_tables(&page).expect("every rbac marker is on the page");
        if let Err(e) = tether_crds::reference::check_generated(&root, SECURITY_MODEL, &current) {
            panic!("{e}");
        }
        // The check bites: a table that shows other rules is regenerated.
        let edited = page.replace("`patch` |", "`update` |");
        assert!(with_tables(&edited).is_some_and(|t| t != edited && t == page));
    }

    #[test]
    fn requests_map_to_rbac_attributes() {
        let attrs = |m: &Method, p: &str, q: &str| {
            request_attributes(m, p, q).map(|a| {
                let ns = a.namespace.unwrap_or_else(|| "*".into());
                format!("{ns}|{}|{}|{}", a.group, a.resource, a.verb)
            })
        };
        let cases = [
            (
                Method::GET,
                "/api/v1/namespaces/t/pods",
                "",
                Some("t||pods|list"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/t/pods",
                "watch=true&x=1",
                Some("t||pods|watch"),
            ),
            (Method::GET, "/api/v1/pods", "", Some("*||pods|list")),
            (
                Method::GET,
                "/api/v1/namespaces/t",
                "",
                Some("t||namespaces|get"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces",
                "",
                Some("*||namespaces|list"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/t/secrets/s",
                "",
                Some("t||secrets|get"),
            ),
            (
                Method::PATCH,
                "/apis/mcp.tether.dev/v1alpha1/namespaces/t/mcpendpoints/w/status",
                "",
                Some("t|mcp.tether.dev|mcpendpoints/status|patch"),
            ),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/t/events",
                "",
                Some("t|events.k8s.io|events|create"),
            ),
            (
                Method::DELETE,
                "/apis/policy/v1/namespaces/t/poddisruptionbudgets/p",
                "",
                Some("t|policy|poddisruptionbudgets|delete"),
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
        assert!(allows(RECONCILE, "", "secrets", "create"));
        assert!(
            allows(RECONCILE, "", "secrets", "patch"),
            "a rotation patches the key ring"
        );
        for verb in ["list", "watch", "update", "delete"] {
            assert!(
                !allows(RECONCILE, "", "secrets", verb),
                "{verb}: only the endpoint's own Secrets, by name, and none deleted"
            );
        }
        assert!(!allows(RECONCILE, "apps", "deployments", "delete"));
        assert!(allows(
            LEADER_ELECTION,
            "coordination.k8s.io",
            "leases",
            "patch"
        ));
        assert!(!allows(RECONCILE, "coordination.k8s.io", "leases", "get"));
        for rule in SIDECAR {
            for resource in rule.resources {
                for verb in rule.verbs {
                    assert!(
                        allows(RECONCILE, rule.group, resource, verb),
                        "the operator grants the sidecars {verb} {resource} without holding it"
                    );
                }
            }
        }
        assert!(!allows(SIDECAR, "", "pods", "get"), "no pod specs");
        let get = |path: &str| request_attributes(&Method::GET, path, "").unwrap();
        let namespaced = Grant::Namespaces(vec!["t".into()]);
        for grant in [&Grant::Cluster, &namespaced] {
            assert!(grant.allows(RECONCILE, &get("/api/v1/namespaces/t/services/s")));
            assert!(grant.allows(RECONCILE, &get("/api/v1/namespaces/t")));
        }
        for path in [
            "/api/v1/namespaces/u/services/s",
            "/api/v1/services",
            "/api/v1/namespaces/u",
        ] {
            assert!(!namespaced.allows(RECONCILE, &get(path)), "{path}");
        }
        assert!(Grant::Cluster.allows(RECONCILE, &get("/api/v1/services")));
        let table = markdown_table(LEADER_ELECTION);
        assert_eq!(
            table.lines().nth(2),
            Some("| `coordination.k8s.io` | `leases` | `get`, `create`, `patch` |")
        );
        let rules = policy_rules(RECONCILE);
        assert_eq!(rules.len(), RECONCILE.len());
        assert_eq!(
            rules[0].api_groups.as_deref(),
            Some(&["mcp.tether.dev".to_owned()][..])
        );
    }
}
